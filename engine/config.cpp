// ddptrain's command line through cxxopts; defaults come from TrainConfig's initialisers.
#include "engine/config.h"

#include <cmath>
#include <iostream>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <cxxopts.hpp>

#include "models/gemm.h"
#include "models/mlp.h"
#include "runtime/error.h"
#include "runtime/parse.h"

namespace ddp {
namespace {

constexpr double kMaxBucketMb = 1 << 20;  // 1 TiB

template <typename T>
std::string text(const T& value) {
  return fmt::format("{}", value);
}

// Numbers are declared as strings in cxxopts and converted here, so that a bad value is
// reported with its flag ("--batch-size abc: expected an integer").
template <typename T>
T number(const cxxopts::ParseResult& result, const std::string& name) {
  const std::string value = result[name].as<std::string>();
  const std::optional<T> parsed = parse_number<T>(value);
  DDP_USAGE_CHECK(parsed.has_value(), "--{} {}: expected {}", name, value,
                  std::is_floating_point_v<T> ? "a number"
                  : std::is_unsigned_v<T>     ? "a non-negative integer"
                                              : "an integer");
  return *parsed;
}

// One of a flag's named values, or UsageError listing them: "--precision fp64: expected
// fp32, tf32 or bf16".
template <typename E>
E choice(const cxxopts::ParseResult& result, const std::string& name,
         const std::vector<std::pair<const char*, E>>& values) {
  const std::string value = result[name].as<std::string>();
  std::string allowed;
  for (size_t i = 0; i < values.size(); ++i) {
    if (value == values[i].first) return values[i].second;
    allowed += (i == 0                   ? ""
                : i + 1 == values.size() ? " or "
                                         : ", ") +
               std::string(values[i].first);
  }
  throw UsageError(fmt::format("--{} {}: expected {}", name, value, allowed));
}

const char* optimizer_name(OptimizerKind kind) {
  return kind == OptimizerKind::kAdamW ? "adamw" : "sgd";
}

}  // namespace

const char* device_name(Device device) {
  return device == Device::kCuda ? "cuda" : "cpu";
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kNccl:
      return "nccl";
    case Backend::kGloo:
      return "gloo";
    case Backend::kMpi:
      return "mpi";
  }
  return "?";
}

const char* on_nonfinite_name(OnNonfinite policy) {
  return policy == OnNonfinite::kSkipStep ? "skip-step" : "stop";
}

const char* grad_reduce_name(GradReduce reduce) {
  return reduce == GradReduce::kBf16 ? "bf16" : "fp32";
}

const char* schedule_name(LrSchedule schedule) {
  return schedule == LrSchedule::kCosine ? "cosine" : "constant";
}

bool parse_train_args(int argc, char** argv, TrainConfig* config) {
  TrainConfig& c = *config;
  const TrainConfig d;
  cxxopts::Options options("ddptrain",
                           "Train an MLP, alone or as one rank of a ddprun/mpirun job.");
  // clang-format off
  options.add_options()
    ("layers", "layer widths: input,hidden...,classes", cxxopts::value<std::string>()->default_value(d.layers))
    ("data", "dataset: fashion | synthetic | npy", cxxopts::value<std::string>()->default_value(d.data))
    ("data-dir", "folder of the dataset's files (fashion: IDX .gz; npy: train_x.npy, train_y.npy, ...)",
        cxxopts::value<std::string>())
    ("synthetic-samples", "training samples of --data synthetic (the test set is a fifth of it)",
        cxxopts::value<std::string>()->default_value(text(d.synthetic_samples)))
    ("batch-size", "global batch size (samples per step over all ranks)", cxxopts::value<std::string>()->default_value(text(d.batch_size)))
    ("epochs", "passes over the training set", cxxopts::value<std::string>()->default_value(text(d.epochs)))
    ("steps", "train this many steps instead of --epochs", cxxopts::value<std::string>())
    ("lr", "peak learning rate", cxxopts::value<std::string>()->default_value(text(d.lr)))
    ("lr-schedule", "constant | cosine", cxxopts::value<std::string>()->default_value(schedule_name(d.lr_schedule)))
    ("warmup-steps", "linear warm-up steps", cxxopts::value<std::string>()->default_value(text(d.warmup_steps)))
    ("optimizer", "sgd | adamw", cxxopts::value<std::string>()->default_value(optimizer_name(d.optimizer.kind)))
    ("momentum", "SGD momentum", cxxopts::value<std::string>()->default_value(text(d.optimizer.momentum)))
    ("weight-decay", "weight decay (default: 0 for sgd, 0.01 for adamw, as in torch.optim)", cxxopts::value<std::string>())
    ("seed", "seed of initialisation, shuffling and synthetic data", cxxopts::value<std::string>()->default_value(text(d.seed)))
    ("no-shuffle", "take samples in file order")
    ("init-weights", "start from these weights (.safetensors)", cxxopts::value<std::string>())
    ("save-weights", "write the final weights here (.safetensors)", cxxopts::value<std::string>())
    ("metrics", "write one JSON object per logged step and one at the end (.jsonl)", cxxopts::value<std::string>())
    ("device", "cpu or cuda", cxxopts::value<std::string>()->default_value(device_name(d.device)))
    ("precision", "cuda: fp32 (exact float32), tf32 (TF32 tensor cores) or bf16 (bf16 products, float32 master weights)",
        cxxopts::value<std::string>()->default_value(precision_name(d.precision)))
    ("no-cuda-graph", "cuda: launch every kernel instead of replaying the captured step")
    ("no-fused-epilogues", "cuda: plain matrix products plus our own bias/ReLU kernels (for comparison)")
    ("sync-debug", "cuda: synchronise after every kernel and name the op that failed")
    ("autotune", "cuda: at start, time cuBLASLt's candidate algorithms and the fused epilogues against plain "
        "products and keep the fastest (results may differ in the last bits from a run without)")
    ("stage-from-host", "cuda: keep the training set on the host and copy batches ahead through pinned memory "
        "(automatic when it does not fit in half the free device memory)")
    ("no-gpu-monitor", "cuda: do not sample the GPU (utilization, memory, power, clocks) through NVML")
    ("init-retries", "cuda: retry a failed device start-up this many times, with back-off",
        cxxopts::value<std::string>()->default_value(text(d.init_retries)))
    ("threads", "CPU threads for matrix products (0: the BLAS default)", cxxopts::value<std::string>()->default_value(text(d.threads)))
    ("log-every", "log progress every N steps", cxxopts::value<std::string>()->default_value(text(d.log_every)))
    ("eval-every", "test-split loss and accuracy every N steps (0: at the end only)",
        cxxopts::value<std::string>()->default_value(text(d.eval_every)))
    ("quiet", "print only the configuration and the result")
    ("backend", "collectives: auto (nccl on GPUs, gloo on CPUs, mpi under mpirun), nccl, gloo or mpi",
        cxxopts::value<std::string>()->default_value(backend_name(d.backend)))
    ("timeout", "seconds a collective may take before the job stops with its name",
        cxxopts::value<std::string>()->default_value(text(d.timeout)))
    ("bucket-mb", "gradient bucket size in MiB", cxxopts::value<std::string>()->default_value(text(d.bucket_mb)))
    ("first-bucket-mb", "size of the first bucket (the last layers) in MiB",
        cxxopts::value<std::string>()->default_value(text(d.first_bucket_mb)))
    ("no-overlap", "all-reduce after backward instead of during it")
    ("overlap-optimizer", "cuda: the optimizer on each range of parameters as soon as backward "
        "(and its all-reduce) is done with it, on a side stream, instead of one pass after backward")
    ("grad-reduce", "gradients on the wire: fp32, or bf16 (half the bytes, rounded; GPU with NCCL)",
        cxxopts::value<std::string>()->default_value(grad_reduce_name(d.grad_reduce)))
    ("accumulate", "micro-batches per optimizer step (gradient accumulation)",
        cxxopts::value<std::string>()->default_value(text(d.accumulate)))
    ("pp", "pipeline stages: the layers split into this many contiguous stages, one a rank "
        "(world = dp x pp)", cxxopts::value<std::string>()->default_value(text(d.pp)))
    ("micro-batches", "micro-batches a step with --pp (0: 4 x pp); gradients accumulate over them",
        cxxopts::value<std::string>()->default_value(text(d.micro_batches)))
    ("schedule", "pipeline schedule: " + schedule_names(), cxxopts::value<std::string>()->default_value(schedule_name(d.schedule)))
    ("dp", "data-parallel replicas (0: the world's size / --pp); checked against the world",
        cxxopts::value<std::string>()->default_value(text(d.dp)))
    ("partition", "layers of each stage, like 0-1,2-3 (default: balanced by FLOPs)", cxxopts::value<std::string>())
    ("timeline", "write a Chrome trace (Perfetto) of every rank's forward, backward, send, recv and "
        "all-reduce to FILE (.json)", cxxopts::value<std::string>())
    ("check-replicas", "after every step, check that every rank holds bitwise the same weights")
    ("on-nonfinite", "a NaN/Inf gradient or loss: stop (exit 1, nothing written) or skip-step (CPU)",
        cxxopts::value<std::string>()->default_value(on_nonfinite_name(d.on_nonfinite)))
    ("max-skipped-steps", "with --on-nonfinite skip-step: stop (exit 1) when a logging window skips more "
        "steps than this (-1: a tenth of --log-every)", cxxopts::value<std::string>()->default_value(text(d.max_skipped_steps)))
    ("checkpoint-dir", "write checkpoints to DIR/latest.safetensors", cxxopts::value<std::string>())
    ("checkpoint-every", "steps between checkpoints (0: at the end only)",
        cxxopts::value<std::string>()->default_value(text(d.checkpoint_every)))
    ("keep-checkpoints", "keep the newest K step-numbered checkpoints, latest linking to the "
        "newest (0: one latest.safetensors)",
        cxxopts::value<std::string>()->default_value(text(d.keep_checkpoints)))
    ("resume", "start from DIR/latest.safetensors when it exists")
    ("fail-at-step", "testing restarts: exit with an error when step N starts (first attempt only)",
        cxxopts::value<std::string>()->default_value("0"))
    ("version", "print the version and the parts this build has")
    ("h,help", "print this help");
  // clang-format on
  cxxopts::ParseResult result;
  try {
    result = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see ddptrain --help)", e.what()));
  }
  if (!result.unmatched().empty())
    throw UsageError(
        fmt::format("unexpected argument '{}' (see ddptrain --help)", result.unmatched().front()));
  if (result.count("help")) {
    std::cout << options.help() << std::endl;
    return false;
  }
  if (result.count("version")) {
    std::cout << fmt::format("ddptrain {} (cuda {}, nccl {}, mpi {}, gloo {}, cpu blas: {})\n",
                             DDP_VERSION, DDP_HAVE_CUDA ? "yes" : "no",
                             DDP_HAVE_NCCL ? "yes" : "no", DDP_HAVE_MPI ? "yes" : "no",
                             DDP_HAVE_GLOO ? "yes" : "no", cpu_blas_name());
    return false;
  }
  try {
    c.layers = result["layers"].as<std::string>();
    c.data = result["data"].as<std::string>();
    if (result.count("data-dir"))
      c.data_dir = result["data-dir"].as<std::string>();
    else if (c.data == "npy")
      c.data_dir.clear();
    c.synthetic_samples = number<int64_t>(result, "synthetic-samples");
    c.batch_size = number<int>(result, "batch-size");
    c.epochs = number<int>(result, "epochs");
    if (result.count("steps")) {
      DDP_USAGE_CHECK(!result.count("epochs"), "--steps and --epochs: give one or the other");
      c.steps = number<int64_t>(result, "steps");
      DDP_USAGE_CHECK(c.steps > 0, "--steps {}: expected a positive number of steps", c.steps);
    }
    c.lr = number<float>(result, "lr");
    const std::string schedule = result["lr-schedule"].as<std::string>();
    DDP_USAGE_CHECK(schedule == "constant" || schedule == "cosine",
                    "--lr-schedule {}: expected constant or cosine", schedule);
    c.lr_schedule = schedule == "cosine" ? LrSchedule::kCosine : LrSchedule::kConstant;
    c.warmup_steps = number<int64_t>(result, "warmup-steps");
    const std::string optimizer = result["optimizer"].as<std::string>();
    DDP_USAGE_CHECK(optimizer == "sgd" || optimizer == "adamw",
                    "--optimizer {}: expected sgd or adamw", optimizer);
    c.optimizer.kind = optimizer == "adamw" ? OptimizerKind::kAdamW : OptimizerKind::kSgd;
    {
      // Checked before float32 rounding: 0.9999999999 would become 1 and be reported so.
      const double momentum = number<double>(result, "momentum");
      const std::string given = result["momentum"].as<std::string>();
      DDP_USAGE_CHECK(momentum >= 0 && momentum < 1, "--momentum {}: expected a value in [0, 1)",
                      given);
      DDP_USAGE_CHECK(static_cast<float>(momentum) < 1,
                      "--momentum {}: rounds to 1 in float32; expected a value in [0, 1) that "
                      "float32 can tell from 1 (at most 0.99999994)",
                      given);
      c.optimizer.momentum = static_cast<float>(momentum);
    }
    c.optimizer.weight_decay = result.count("weight-decay") ? number<float>(result, "weight-decay")
                               : c.optimizer.kind == OptimizerKind::kAdamW ? 0.01f
                                                                           : 0.0f;
    c.seed = number<uint64_t>(result, "seed");
    c.shuffle = result.count("no-shuffle") == 0;
    if (result.count("init-weights")) c.init_weights = result["init-weights"].as<std::string>();
    if (result.count("save-weights")) c.save_weights = result["save-weights"].as<std::string>();
    if (result.count("metrics")) c.metrics = result["metrics"].as<std::string>();
    c.device = choice<Device>(result, "device", {{"cpu", Device::kCpu}, {"cuda", Device::kCuda}});
    c.precision = choice<Precision>(
        result, "precision",
        {{"fp32", Precision::kFp32}, {"tf32", Precision::kTf32}, {"bf16", Precision::kBf16}});
    c.cuda_graph = result.count("no-cuda-graph") == 0;
    c.fused_epilogues = result.count("no-fused-epilogues") == 0;
    c.sync_debug = result.count("sync-debug") > 0;
    c.stage_from_host = result.count("stage-from-host") > 0;
    c.autotune = result.count("autotune") > 0;
    c.gpu_monitor = result.count("no-gpu-monitor") == 0;
    c.init_retries = number<int>(result, "init-retries");
    c.threads = number<int>(result, "threads");
    c.log_every = number<int>(result, "log-every");
    c.eval_every = number<int64_t>(result, "eval-every");
    c.quiet = result.count("quiet") > 0;
    c.backend = choice<Backend>(result, "backend",
                                {{"auto", Backend::kAuto},
                                 {"nccl", Backend::kNccl},
                                 {"gloo", Backend::kGloo},
                                 {"mpi", Backend::kMpi}});
    c.timeout = number<double>(result, "timeout");
    c.bucket_mb = number<double>(result, "bucket-mb");
    c.first_bucket_mb = number<double>(result, "first-bucket-mb");
    c.overlap = result.count("no-overlap") == 0;
    c.overlap_optimizer = result.count("overlap-optimizer") > 0;
    c.grad_reduce = choice<GradReduce>(result, "grad-reduce",
                                       {{"fp32", GradReduce::kFp32}, {"bf16", GradReduce::kBf16}});
    c.accumulate = number<int>(result, "accumulate");
    c.pp = number<int>(result, "pp");
    c.micro_batches = number<int>(result, "micro-batches");
    const std::string pipeline = result["schedule"].as<std::string>();
    const std::optional<PipelineSchedule> schedule_given = schedule_from_name(pipeline);
    DDP_USAGE_CHECK(schedule_given.has_value(), "--schedule {}: expected {}", pipeline,
                    schedule_names());
    c.schedule = *schedule_given;
    c.dp = number<int>(result, "dp");
    if (result.count("partition")) {
      c.partition = result["partition"].as<std::string>();
      DDP_USAGE_CHECK(!c.partition.empty(),
                      "--partition '': expected the layers of each stage, like 0-1,2-3 (leave "
                      "the flag out for a partition balanced by FLOPs)");
    }
    if (result.count("timeline")) c.timeline = result["timeline"].as<std::string>();
    c.check_replicas = result.count("check-replicas") > 0;
    c.on_nonfinite =
        choice<OnNonfinite>(result, "on-nonfinite",
                            {{"stop", OnNonfinite::kStop}, {"skip-step", OnNonfinite::kSkipStep}});
    c.max_skipped_steps = number<int64_t>(result, "max-skipped-steps");
    if (result.count("checkpoint-dir"))
      c.checkpoint_dir = result["checkpoint-dir"].as<std::string>();
    c.checkpoint_every = number<int64_t>(result, "checkpoint-every");
    c.resume = result.count("resume") > 0;
    c.keep_checkpoints = number<int>(result, "keep-checkpoints");
    c.fail_at_step = number<int64_t>(result, "fail-at-step");
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see ddptrain --help)", e.what()));
  }
  validate(c);
  return true;
}

void validate(const TrainConfig& c) {
  parse_layers(c.layers);  // throws with the flag on a malformed list
  DDP_USAGE_CHECK(c.data == "fashion" || c.data == "synthetic" || c.data == "npy",
                  "--data {}: expected fashion, synthetic or npy", c.data);
  DDP_USAGE_CHECK(c.data != "npy" || !c.data_dir.empty(),
                  "--data npy: --data-dir is required (a folder with train_x.npy and train_y.npy)");
  DDP_USAGE_CHECK(c.synthetic_samples >= 1, "--synthetic-samples {}: expected at least 1",
                  c.synthetic_samples);
  DDP_USAGE_CHECK(c.batch_size >= 1 && c.batch_size <= (1 << 20),
                  "--batch-size {}: expected 1 to 1048576", c.batch_size);
  DDP_USAGE_CHECK(c.epochs >= 1, "--epochs {}: expected at least 1", c.epochs);
  DDP_USAGE_CHECK(c.lr > 0 && std::isfinite(c.lr), "--lr {}: expected a positive number", c.lr);
  DDP_USAGE_CHECK(c.warmup_steps >= 0, "--warmup-steps {}: expected 0 or more", c.warmup_steps);
  DDP_USAGE_CHECK(c.optimizer.momentum >= 0 && c.optimizer.momentum < 1,
                  "--momentum {}: expected a value in [0, 1)", c.optimizer.momentum);
  DDP_USAGE_CHECK(std::isfinite(c.optimizer.weight_decay) && c.optimizer.weight_decay >= 0,
                  "--weight-decay {}: expected a finite number, 0 or more",
                  c.optimizer.weight_decay);
  DDP_USAGE_CHECK(c.device == Device::kCuda || c.precision == Precision::kFp32,
                  "--precision {}: the CPU trains in fp32 only; use --device cuda",
                  precision_name(c.precision));
  DDP_USAGE_CHECK(c.device == Device::kCuda || c.grad_reduce == GradReduce::kFp32,
                  "--grad-reduce {}: the CPU reduces gradients in fp32 only; use --device cuda",
                  grad_reduce_name(c.grad_reduce));
  DDP_USAGE_CHECK(c.init_retries >= 0 && c.init_retries <= 100,
                  "--init-retries {}: expected 0 to 100", c.init_retries);
  DDP_USAGE_CHECK(c.threads >= 0 && c.threads <= 1024, "--threads {}: expected 0 to 1024",
                  c.threads);
  DDP_USAGE_CHECK(c.log_every >= 1, "--log-every {}: expected at least 1", c.log_every);
  DDP_USAGE_CHECK(c.eval_every >= 0, "--eval-every {}: expected 0 or more", c.eval_every);
  // Gloo and NCCL turn the timeout into milliseconds in 32 or 64 bits: a week is plenty.
  DDP_USAGE_CHECK(std::isfinite(c.timeout) && c.timeout >= 0.1 && c.timeout <= 604800,
                  "--timeout {}: expected 0.1 to 604800 seconds (a week)", c.timeout);
  // A bucket is a byte count in size_t: past 1 TiB the conversion is meaningless.
  for (const auto& [flag, mb] : {std::pair<const char*, double>{"--bucket-mb", c.bucket_mb},
                                 {"--first-bucket-mb", c.first_bucket_mb}})
    DDP_USAGE_CHECK(std::isfinite(mb) && mb > 0 && mb <= kMaxBucketMb,
                    "{} {}: expected a size in MiB above 0, at most {}", flag, mb, kMaxBucketMb);
  DDP_USAGE_CHECK(c.accumulate >= 1 && c.accumulate <= 1024, "--accumulate {}: expected 1 to 1024",
                  c.accumulate);
  const MlpShape shape = parse_layers(c.layers);
  DDP_USAGE_CHECK(c.pp >= 1 && c.pp <= shape.num_layers(),
                  "--pp {}: expected 1 to {} (the number of layers of --layers {})", c.pp,
                  shape.num_layers(), c.layers);
  DDP_USAGE_CHECK(c.dp >= 0 && c.dp <= 65536, "--dp {}: expected 0 (the world / --pp) to 65536",
                  c.dp);
  DDP_USAGE_CHECK(c.micro_batches >= 0 && c.micro_batches <= 1024,
                  "--micro-batches {}: expected 0 (4 x --pp) to 1024", c.micro_batches);
  DDP_USAGE_CHECK(c.pp > 1 || (c.micro_batches <= 1 && c.partition.empty()),
                  "--micro-batches and --partition split a pipeline: they need --pp 2 or more "
                  "(gradient accumulation without a pipeline is --accumulate)");
  DDP_USAGE_CHECK(c.pp == 1 || c.accumulate == 1,
                  "--accumulate {} with --pp {}: a pipeline accumulates over --micro-batches; "
                  "give that instead",
                  c.accumulate, c.pp);
  if (!c.partition.empty()) {
    const std::vector<int> bounds = parse_partition(c.partition, shape.num_layers());
    DDP_USAGE_CHECK(static_cast<int>(bounds.size()) - 1 == c.pp,
                    "--partition {}: names {} stages but --pp is {}", c.partition,
                    bounds.size() - 1, c.pp);
  }
  const int micro = micro_batches_of(c);
  DDP_USAGE_CHECK(c.pp == 1 || c.batch_size % micro == 0,
                  "--batch-size {}: does not divide into {} micro-batches (--micro-batches{})",
                  c.batch_size, micro, c.micro_batches == 0 ? " 0 means 4 x --pp" : "");
  DDP_USAGE_CHECK(c.max_skipped_steps >= -1,
                  "--max-skipped-steps {}: expected -1 (a tenth of "
                  "--log-every) or a number of steps",
                  c.max_skipped_steps);
  DDP_USAGE_CHECK(c.checkpoint_every >= 0, "--checkpoint-every {}: expected 0 or more",
                  c.checkpoint_every);
  DDP_USAGE_CHECK(!c.resume || !c.checkpoint_dir.empty(), "--resume: needs --checkpoint-dir");
  DDP_USAGE_CHECK(c.keep_checkpoints >= 0 && c.keep_checkpoints <= 100000,
                  "--keep-checkpoints {}: expected 0 to 100000", c.keep_checkpoints);
  DDP_USAGE_CHECK(c.keep_checkpoints == 0 || !c.checkpoint_dir.empty(),
                  "--keep-checkpoints: needs --checkpoint-dir");
  DDP_USAGE_CHECK(c.checkpoint_every == 0 || !c.checkpoint_dir.empty(),
                  "--checkpoint-every: needs --checkpoint-dir");
}

int micro_batches_of(const TrainConfig& c) {
  if (c.pp == 1) return c.accumulate;
  return c.micro_batches > 0 ? c.micro_batches : 4 * c.pp;
}

namespace {
// A float as the double its shortest decimal form names (0.05f -> 0.05, not 0.0500000007).
double shortest(float value) {
  return std::stod(fmt::format("{}", value));
}
}  // namespace

nlohmann::json config_json(const TrainConfig& c) {
  return {{"layers", c.layers},
          {"data", c.data},
          {"data-dir", c.data_dir},
          {"synthetic-samples", c.synthetic_samples},
          {"batch-size", c.batch_size},
          {"epochs", c.epochs},
          {"steps", c.steps},
          {"lr", shortest(c.lr)},
          {"lr-schedule", schedule_name(c.lr_schedule)},
          {"warmup-steps", c.warmup_steps},
          {"optimizer", optimizer_name(c.optimizer.kind)},
          {"momentum", shortest(c.optimizer.momentum)},
          {"weight-decay", shortest(c.optimizer.weight_decay)},
          {"seed", c.seed},
          {"shuffle", c.shuffle},
          {"init-weights", c.init_weights},
          {"device", device_name(c.device)},
          {"precision", precision_name(c.precision)},
          {"cuda-graph", c.cuda_graph},
          {"fused-epilogues", c.fused_epilogues},
          {"autotune", c.autotune},
          {"stage-from-host", c.stage_from_host},
          {"gpu-monitor", c.gpu_monitor},
          {"threads", c.threads},
          {"log-every", c.log_every},
          {"eval-every", c.eval_every},
          {"backend", backend_name(c.backend)},
          {"timeout", c.timeout},
          {"bucket-mb", c.bucket_mb},
          {"first-bucket-mb", c.first_bucket_mb},
          {"overlap", c.overlap},
          {"grad-reduce", grad_reduce_name(c.grad_reduce)},
          {"overlap-optimizer", c.overlap_optimizer},
          {"accumulate", c.accumulate},
          {"pp", c.pp},
          {"dp", c.dp},
          {"micro-batches", c.micro_batches},
          {"schedule", schedule_name(c.schedule)},
          {"partition", c.partition},
          {"timeline", c.timeline},
          {"on-nonfinite", on_nonfinite_name(c.on_nonfinite)},
          {"max-skipped-steps", c.max_skipped_steps},
          {"checkpoint-dir", c.checkpoint_dir},
          {"checkpoint-every", c.checkpoint_every},
          {"keep-checkpoints", c.keep_checkpoints},
          {"resume", c.resume}};
}

std::vector<std::string> describe(const TrainConfig& c) {
  std::vector<std::string> lines;
  lines.push_back(fmt::format(
      "model      mlp {} on {}{}", c.layers, device_name(c.device),
      c.device == Device::kCuda
          ? fmt::format(" ({}{}{})", precision_name(c.precision),
                        c.cuda_graph ? ", CUDA graph" : "", c.sync_debug ? ", sync-debug" : "")
          : ""));
  lines.push_back(fmt::format("data       {}{}{}", c.data, c.data == "synthetic" ? "" : " from ",
                              c.data == "synthetic" ? "" : c.data_dir));
  lines.push_back(fmt::format(
      "schedule   batch {} {}, lr {} {} (warm-up {}), seed {}{}", c.batch_size,
      c.steps > 0 ? fmt::format("for {} steps", c.steps) : fmt::format("for {} epochs", c.epochs),
      c.lr, schedule_name(c.lr_schedule), c.warmup_steps, c.seed, c.shuffle ? "" : ", no shuffle"));
  if (c.optimizer.kind == OptimizerKind::kSgd)
    lines.push_back(fmt::format("optimizer  sgd momentum {} weight decay {}", c.optimizer.momentum,
                                c.optimizer.weight_decay));
  else
    lines.push_back(fmt::format("optimizer  adamw betas ({}, {}) eps {} weight decay {}",
                                c.optimizer.beta1, c.optimizer.beta2, c.optimizer.eps,
                                c.optimizer.weight_decay));
  return lines;
}

}  // namespace ddp
