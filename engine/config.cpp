// ddptrain's command line through cxxopts; defaults come from TrainConfig's initialisers.
#include "engine/config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <cxxopts.hpp>

#include "models/gemm.h"
#include "models/mlp.h"
#include "runtime/error.h"
#include "runtime/flag_hint.h"
#include "runtime/parse.h"

namespace ddp {
namespace {

constexpr double kMaxBucketMb = 1 << 20;  // 1 TiB

template <typename T>
std::string text(const T& value) {
  return fmt::format("{}", value);
}

// "A-B" or "A" (steps, 1-based, A <= B) of --profile-steps; throws UsageError naming the flag.
std::pair<int64_t, int64_t> parse_step_range(const std::string& v) {
  const size_t dash = v.find('-');
  const auto first = parse_number<int64_t>(std::string_view(v).substr(0, dash));
  const auto last = dash == std::string::npos
                        ? first
                        : parse_number<int64_t>(std::string_view(v).substr(dash + 1));
  DDP_USAGE_CHECK(first && last && *first >= 1 && *last >= *first,
                  "--profile-steps {}: expected steps A-B with 1 <= A <= B, like 20-30, or one "
                  "step",
                  v);
  return {*first, *last};
}

}  // namespace

const char* device_name(Device device) {
  return device == Device::kCuda ? "cuda" : "cpu";
}

const char* data_name(DataSource data) {
  return data == DataSource::kFashion ? "fashion" : data == DataSource::kNpy ? "npy" : "synthetic";
}

const char* on_nonfinite_name(OnNonfinite policy) {
  return policy == OnNonfinite::kSkipStep ? "skip-step" : "stop";
}

const char* grad_reduce_name(GradReduce reduce) {
  return reduce == GradReduce::kBf16 ? "bf16" : "fp32";
}

SyncOptions sync_options(const TrainConfig& config) {
  SyncOptions options;
  options.zero = config.zero;
  options.buckets = DdpOptions{config.bucket_mb, config.first_bucket_mb, config.overlap};
  options.bf16_grads = config.grad_reduce == GradReduce::kBf16;
  options.symmetric_memory = config.nccl_symmetric;
  options.zero_prefetch = config.zero_prefetch;
  return options;
}

const char* schedule_name(LrSchedule schedule) {
  return schedule == LrSchedule::kCosine ? "cosine" : "constant";
}

namespace {

// A float as the double its shortest decimal form names (0.05f -> 0.05, not 0.0500000007).
double shortest(float value) {
  return std::stod(fmt::format("{}", value));
}

// One flag: its name and help, the text of its default (from TrainConfig's initialisers;
// none for flags without a value or without a default), how a given value sets the config,
// and how the config records it in the metrics' first record. One table of these gives the
// parser, --help and config_json, so that none of them can leave a flag out.
struct Flag {
  std::string name;  // without the dashes
  std::string help;
  bool takes_value = true;
  std::function<std::string(const TrainConfig&)> shown;  // the default's text; null: none
  std::function<void(TrainConfig&, const std::string&)> set;
  std::string key;  // config_json's key: the name, or the setting a "no-" switch clears
  std::function<nlohmann::json(const TrainConfig&)> record;
  std::string implicit = "";  // the value of "--flag" given alone, where the value may be left out
};

template <typename T>
T parse_value(const std::string& name, const std::string& value) {
  const std::optional<T> parsed = parse_number<T>(value);
  DDP_USAGE_CHECK(parsed.has_value(), "--{} {}: expected {}", name, value,
                  std::is_floating_point_v<T> ? "a number"
                  : std::is_unsigned_v<T>     ? "a non-negative integer"
                                              : "an integer");
  return *parsed;
}

// A number stored in the config through `field` (a pointer into it).
template <typename T>
Flag number_flag(const std::string& name, const std::string& help, T TrainConfig::*field) {
  return {
      name,
      help,
      true,
      [field](const TrainConfig& c) { return text(c.*field); },
      [name, field](TrainConfig& c, const std::string& v) { c.*field = parse_value<T>(name, v); },
      name,
      [field](const TrainConfig& c) {
        if constexpr (std::is_same_v<T, float>)
          return nlohmann::json(shortest(c.*field));
        else
          return nlohmann::json(c.*field);
      }};
}

// A path or text without a default ("" when not given).
Flag text_flag(const std::string& name, const std::string& help, std::string TrainConfig::*field) {
  return {name,
          help,
          true,
          nullptr,
          [field](TrainConfig& c, const std::string& v) { c.*field = v; },
          name,
          [field](const TrainConfig& c) { return nlohmann::json(c.*field); }};
}

// A switch: given, it sets `field` to `when_given`; recorded under `key`.
Flag switch_flag(const std::string& name, const std::string& help, bool TrainConfig::*field,
                 bool when_given, const std::string& key) {
  return {name,
          help,
          false,
          nullptr,
          [field, when_given](TrainConfig& c, const std::string&) { c.*field = when_given; },
          key,
          [field](const TrainConfig& c) { return nlohmann::json(c.*field); }};
}

// One of named values: "--precision fp64: expected fp32, tf32 or bf16".
template <typename E>
Flag choice_flag(const std::string& name, const std::string& help, E TrainConfig::*field,
                 std::vector<std::pair<std::string, E>> values) {
  const auto name_of = [values](E value) {
    for (const auto& [text, v] : values)
      if (v == value) return text;
    return std::string("?");
  };
  return {name,
          help,
          true,
          [field, name_of](const TrainConfig& c) { return name_of(c.*field); },
          [name, field, values](TrainConfig& c, const std::string& v) {
            std::string allowed;
            for (size_t i = 0; i < values.size(); ++i) {
              if (v == values[i].first) {
                c.*field = values[i].second;
                return;
              }
              allowed += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + values[i].first;
            }
            throw UsageError(fmt::format("--{} {}: expected {}", name, v, allowed));
          },
          name,
          [field, name_of](const TrainConfig& c) { return nlohmann::json(name_of(c.*field)); }};
}

std::vector<std::pair<std::string, PipelineSchedule>> schedule_choices() {
  std::vector<std::pair<std::string, PipelineSchedule>> choices;
  for (PipelineSchedule s : all_schedules())
    choices.emplace_back(schedule_name(s), s);
  return choices;
}

// Every flag of ddptrain, in --help's order.
const std::vector<Flag>& flags() {
  using C = TrainConfig;
  static const std::vector<Flag> table = [] {
    std::vector<Flag> f;
    f.push_back(text_flag("layers", "layer widths: input,hidden...,classes", &C::layers));
    f.back().shown = [](const C& c) { return c.layers; };
    f.push_back(choice_flag<DataSource>("data", "dataset: fashion | synthetic | npy", &C::data,
                                        {{"fashion", DataSource::kFashion},
                                         {"synthetic", DataSource::kSynthetic},
                                         {"npy", DataSource::kNpy}}));
    f.push_back(text_flag(
        "data-dir",
        "folder of the dataset's files (fashion: IDX .gz; npy: train_x.npy, train_y.npy, ...)",
        &C::data_dir));
    f.push_back(number_flag("synthetic-samples",
                            "training samples of --data synthetic (the test set is a fifth of it)",
                            &C::synthetic_samples));
    f.push_back(number_flag("batch-size", "global batch size (samples per step over all ranks)",
                            &C::batch_size));
    f.push_back(number_flag("epochs", "passes over the training set", &C::epochs));
    f.push_back(number_flag("steps", "train this many steps instead of --epochs", &C::steps));
    f.back().shown = nullptr;
    f.push_back(number_flag("lr", "peak learning rate", &C::lr));
    f.push_back(choice_flag<LrSchedule>(
        "lr-schedule", "constant | cosine", &C::lr_schedule,
        {{"constant", LrSchedule::kConstant}, {"cosine", LrSchedule::kCosine}}));
    f.push_back(number_flag("warmup-steps", "linear warm-up steps", &C::warmup_steps));
    f.push_back(
        {"optimizer", "sgd | adamw", true,
         [](const C& c) { return std::string(optimizer_name(c.optimizer.kind)); },
         [](C& c, const std::string& v) {
           DDP_USAGE_CHECK(v == "sgd" || v == "adamw", "--optimizer {}: expected sgd or adamw", v);
           c.optimizer.kind = v == "adamw" ? OptimizerKind::kAdamW : OptimizerKind::kSgd;
         },
         "optimizer", [](const C& c) { return nlohmann::json(optimizer_name(c.optimizer.kind)); }});
    f.push_back(
        {"momentum", "SGD momentum", true, [](const C& c) { return text(c.optimizer.momentum); },
         [](C& c, const std::string& v) {
           // Checked before float32 rounding: 0.9999999999 would become 1.
           const double momentum = parse_value<double>("momentum", v);
           DDP_USAGE_CHECK(momentum >= 0 && momentum < 1,
                           "--momentum {}: expected a value in [0, 1)", v);
           DDP_USAGE_CHECK(static_cast<float>(momentum) < 1,
                           "--momentum {}: rounds to 1 in float32; expected a value in "
                           "[0, 1) that float32 can tell from 1 (at most 0.99999994)",
                           v);
           c.optimizer.momentum = static_cast<float>(momentum);
         },
         "momentum", [](const C& c) { return nlohmann::json(shortest(c.optimizer.momentum)); }});
    f.push_back({"weight-decay",
                 "weight decay (default: 0 for sgd, 0.01 for adamw, as in torch.optim)", true,
                 nullptr,
                 [](C& c, const std::string& v) {
                   c.optimizer.weight_decay = parse_value<float>("weight-decay", v);
                 },
                 "weight-decay",
                 [](const C& c) { return nlohmann::json(shortest(c.optimizer.weight_decay)); }});
    f.push_back(
        number_flag("seed", "seed of initialisation, shuffling and synthetic data", &C::seed));
    f.push_back(
        switch_flag("no-shuffle", "take samples in file order", &C::shuffle, false, "shuffle"));
    f.push_back(
        text_flag("init-weights", "start from these weights (.safetensors)", &C::init_weights));
    f.push_back(
        text_flag("save-weights", "write the final weights here (.safetensors)", &C::save_weights));
    f.push_back(text_flag("metrics",
                          "write one JSON object per logged step and one at the end (.jsonl)",
                          &C::metrics));
    f.push_back(choice_flag<Device>("device", "cpu or cuda", &C::device,
                                    {{"cpu", Device::kCpu}, {"cuda", Device::kCuda}}));
    f.push_back(choice_flag<Precision>(
        "precision",
        "cuda: fp32 (exact float32), tf32 (TF32 tensor cores) or bf16 (bf16 products, float32 "
        "master weights)",
        &C::precision,
        {{"fp32", Precision::kFp32}, {"tf32", Precision::kTf32}, {"bf16", Precision::kBf16}}));
    f.push_back(switch_flag("no-cuda-graph",
                            "cuda: launch every kernel instead of replaying the captured step",
                            &C::cuda_graph, false, "cuda-graph"));
    f.push_back(
        switch_flag("no-fused-epilogues",
                    "cuda: plain matrix products plus our own bias/ReLU kernels (for comparison)",
                    &C::fused_epilogues, false, "fused-epilogues"));
    f.push_back(switch_flag("sync-debug",
                            "cuda: synchronise after every kernel and name the op that failed",
                            &C::sync_debug, true, "sync-debug"));
    f.push_back(switch_flag(
        "autotune",
        "cuda: at start, time cuBLASLt's candidate algorithms and the fused epilogues against "
        "plain products, and on one GPU the whole step as one kernel (--fused-step) against the "
        "usual step, and keep the fastest (results may differ in the last bits from a run "
        "without)",
        &C::autotune, true, "autotune"));
    f.push_back(switch_flag(
        "stage-from-host",
        "cuda: keep the training set on the host and copy batches ahead through pinned memory "
        "(automatic when it does not fit in half the free device memory)",
        &C::stage_from_host, true, "stage-from-host"));
    f.push_back(
        switch_flag("no-gpu-monitor",
                    "cuda: do not sample the GPU (utilization, memory, power, clocks) through NVML",
                    &C::gpu_monitor, false, "gpu-monitor"));
    f.push_back(number_flag("init-retries",
                            "cuda: retry a failed device start-up this many times, with back-off",
                            &C::init_retries));
    f.push_back(number_flag("threads", "CPU threads for matrix products (0: the BLAS default)",
                            &C::threads));
    f.push_back(number_flag("log-every", "log progress every N steps", &C::log_every));
    f.push_back(number_flag("eval-every",
                            "test-split loss and accuracy every N steps (0: at the end only)",
                            &C::eval_every));
    f.push_back(switch_flag("quiet", "print only the configuration and the result", &C::quiet, true,
                            "quiet"));
    f.push_back(choice_flag<Backend>(
        "backend",
        "collectives: auto (nccl on GPUs, gloo on CPUs, mpi under mpirun), nccl, gloo or mpi",
        &C::backend,
        {{"auto", Backend::kAuto},
         {"nccl", Backend::kNccl},
         {"gloo", Backend::kGloo},
         {"mpi", Backend::kMpi}}));
    f.push_back(number_flag("timeout",
                            "seconds a collective may take before the job stops with its name",
                            &C::timeout));
    f.push_back(number_flag("bucket-mb", "gradient bucket size in MiB", &C::bucket_mb));
    f.push_back(number_flag("first-bucket-mb", "size of the first bucket (the last layers) in MiB",
                            &C::first_bucket_mb));
    f.push_back(switch_flag("no-overlap", "all-reduce after backward instead of during it",
                            &C::overlap, false, "overlap"));
    f.push_back(switch_flag(
        "overlap-optimizer",
        "cuda: the optimizer on each range of parameters as soon as backward (and its "
        "all-reduce) is done with it, on a side stream, instead of one pass after backward",
        &C::overlap_optimizer, true, "overlap-optimizer"));
    f.push_back(number_flag("product-sms",
                            "cuda: the SMs each matrix product may use (cuBLASLt's SM count "
                            "target), the others left to the optimizer of --overlap-optimizer "
                            "beside them; 0: all",
                            &C::product_sms));
    f.push_back(choice_flag<WeightGradStream>(
        "weight-grad-stream",
        "cuda: each layer's weight gradient on a second stream beside its input gradient (the "
        "same gradients): auto (where the products are too small to fill the GPU), on, off",
        &C::weight_grad_stream,
        {{"auto", WeightGradStream::kAuto},
         {"on", WeightGradStream::kOn},
         {"off", WeightGradStream::kOff}}));
    f.push_back(
        {"fused-step",
         "cuda, one GPU: the whole training step as one kernel where the model fits (at "
         "most 8 layers, widths and batch at most 1024, at most 32 classes, SGD, one "
         "micro-batch), checked at start against the usual step on one batch (both "
         "timed) and used where it agrees and is faster; --fused-step=force also where "
         "slower",
         true, nullptr,
         [](C& c, const std::string& v) {
           DDP_USAGE_CHECK(v == "faster" || v == "force",
                           "--fused-step={}: expected force, or no value (the fused step "
                           "where it is faster)",
                           v);
           c.fused_step = true;
           c.fused_step_force = v == "force";
         },
         "fused-step",
         [](const C& c) {
           return nlohmann::json(!c.fused_step ? "off" : c.fused_step_force ? "force" : "faster");
         },
         "faster"});
    f.push_back(choice_flag<GradReduce>(
        "grad-reduce",
        "gradients on the wire: fp32, or bf16 (half the bytes, each rounded before the sum)",
        &C::grad_reduce, {{"fp32", GradReduce::kFp32}, {"bf16", GradReduce::kBf16}}));
    f.push_back(switch_flag(
        "nccl-symmetric",
        "cuda: the gradients (and --grad-reduce bf16's wire copy) in NCCL memory registered as a "
        "symmetric window, so that NCCL may reduce them with its symmetric kernels (GPUs of one "
        "host over NVLink; each average a sum, then scaled)",
        &C::nccl_symmetric, true, "nccl-symmetric"));
    f.push_back(number_flag(
        "accumulate", "micro-batches per optimizer step (gradient accumulation)", &C::accumulate));
    f.push_back(number_flag("pp",
                            "pipeline stages: the layers split into this many contiguous stages, "
                            "one a rank (world = dp x pp)",
                            &C::pp));
    f.push_back(
        number_flag("micro-batches",
                    "micro-batches a step with --pp (0: 4 x pp); gradients accumulate over them",
                    &C::micro_batches));
    f.push_back(choice_flag<PipelineSchedule>("schedule", "pipeline schedule: " + schedule_names(),
                                              &C::schedule, schedule_choices()));
    f.push_back(number_flag("virtual-stages",
                            "chunks of layers a pipeline rank holds (interleaved-1f1b: 0 means 2; "
                            "zb-v: 2; the others: 1)",
                            &C::virtual_stages));
    f.push_back(number_flag("zero",
                            "ZeRO over the data-parallel group: 1 shards the optimizer state, 2 "
                            "the gradients too, 3 the parameters too; 0: off",
                            &C::zero));
    f.push_back(number_flag("zero-prefetch",
                            "--zero 3 on the GPU: layers gathered ahead of the one in use (each "
                            "one more holds one more layer's gather slot)",
                            &C::zero_prefetch));
    f.push_back(switch_flag("recompute",
                            "activation checkpointing: a stage keeps only each micro-batch's "
                            "input and forwards it again just before its backward",
                            &C::recompute, true, "recompute"));
    f.push_back(number_flag(
        "dp", "data-parallel replicas (0: the world's size / --pp); checked against the world",
        &C::dp));
    f.push_back(text_flag("partition",
                          "layers of each stage, like 0-1,2-3 (default: balanced by FLOPs)",
                          &C::partition));
    f.back().set = [](C& c, const std::string& v) {
      DDP_USAGE_CHECK(!v.empty(),
                      "--partition '': expected the layers of each stage, like 0-1,2-3 (leave "
                      "the flag out for a partition balanced by FLOPs)");
      c.partition = v;
    };
    f.push_back(text_flag("timeline",
                          "write a Chrome trace (Perfetto) of every rank's forward, backward, "
                          "send, recv and all-reduce to FILE (.json)",
                          &C::timeline));
    f.push_back(text_flag("profile-steps",
                          "cuda: a CUDA profiler's capture range, steps A-B (1-based, or one "
                          "step A): cudaProfilerStart before step A, cudaProfilerStop after step "
                          "B; run under ncu or nsys capturing the profiler API's range "
                          "(scripts/profile-step.sh does)",
                          &C::profile_steps));
    f.back().set = [](C& c, const std::string& v) {
      const auto [first, last] = parse_step_range(v);
      c.profile_steps = v;
      c.profile_first = first;
      c.profile_last = last;
    };
    f.push_back(switch_flag(
        "check-replicas", "after every step, check that every rank holds bitwise the same weights",
        &C::check_replicas, true, "check-replicas"));
    f.push_back(choice_flag<OnNonfinite>(
        "on-nonfinite",
        "a NaN/Inf gradient or loss: stop (exit 1, nothing written) or skip-step (CPU)",
        &C::on_nonfinite, {{"stop", OnNonfinite::kStop}, {"skip-step", OnNonfinite::kSkipStep}}));
    f.push_back(number_flag("max-skipped-steps",
                            "with --on-nonfinite skip-step: stop (exit 1) when a logging window "
                            "skips more steps than this (-1: a tenth of --log-every)",
                            &C::max_skipped_steps));
    f.push_back(text_flag("checkpoint-dir", "write checkpoints to DIR/latest.safetensors",
                          &C::checkpoint_dir));
    f.push_back(number_flag("checkpoint-every", "steps between checkpoints (0: at the end only)",
                            &C::checkpoint_every));
    f.push_back(number_flag("keep-checkpoints",
                            "keep the newest K step-numbered checkpoints, latest linking to the "
                            "newest (0: one latest.safetensors)",
                            &C::keep_checkpoints));
    f.push_back(switch_flag("resume", "start from DIR/latest.safetensors when it exists",
                            &C::resume, true, "resume"));
    f.push_back(switch_flag("fresh",
                            "start afresh in a --checkpoint-dir that holds an earlier run's "
                            "checkpoints: they are moved into DIR/earlier-N/ first",
                            &C::fresh, true, "fresh"));
    f.push_back(
        number_flag("fail-at-step",
                    "testing restarts: exit with an error when step N starts (first attempt only)",
                    &C::fail_at_step));
    f.push_back(number_flag("step-delay-ms",
                            "testing launchers: sleep N milliseconds before each step, so that a "
                            "job lasts long enough to be disturbed",
                            &C::step_delay_ms));
    return f;
  }();
  return table;
}

}  // namespace

bool parse_train_args(int argc, char** argv, TrainConfig* config) {
  TrainConfig& c = *config;
  const TrainConfig d;
  cxxopts::Options options("ddptrain",
                           "Train an MLP, alone or as one rank of a ddprun/mpirun job.");
  auto add = options.add_options();
  for (const Flag& flag : flags()) {
    if (!flag.takes_value)
      add(flag.name, flag.help);
    else if (!flag.implicit.empty())
      add(flag.name, flag.help, cxxopts::value<std::string>()->implicit_value(flag.implicit));
    else if (flag.shown)
      add(flag.name, flag.help, cxxopts::value<std::string>()->default_value(flag.shown(d)));
    else
      add(flag.name, flag.help, cxxopts::value<std::string>());
  }
  add("version", "print the version and the parts this build has");
  add("h,help", "print this help");
  // An unknown flag is named with the one it most likely meant.
  std::vector<std::string> known;
  for (const cxxopts::HelpOptionDetails& o : options.group_help("").options)
    known.insert(known.end(), o.l.begin(), o.l.end());
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() <= 2 || arg.compare(0, 2, "--") != 0) continue;
    const std::string name = arg.substr(2, arg.find('=') - 2);
    const std::string hint = did_you_mean(name, known);
    DDP_USAGE_CHECK(std::find(known.begin(), known.end(), name) != known.end(),
                    "--{}: no such flag{} (see ddptrain --help)", name,
                    hint.empty() ? "" : ";" + hint);
    // A flag whose value is optional takes it only after '=' (ddptrain has no other arguments).
    for (const Flag& flag : flags())
      if (!flag.implicit.empty() && arg == "--" + flag.name && i + 1 < argc &&
          argv[i + 1][0] != '-')
        throw UsageError(fmt::format("--{} {}: write --{}={} (its value follows '=')", name,
                                     argv[i + 1], name, argv[i + 1]));
  }
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
    for (const Flag& flag : flags())
      if (result.count(flag.name))
        flag.set(c, flag.takes_value ? result[flag.name].as<std::string>() : std::string());
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see ddptrain --help)", e.what()));
  }
  // What depends on more than one flag.
  if (!result.count("data-dir") && c.data == DataSource::kNpy) c.data_dir.clear();
  if (result.count("steps")) {
    DDP_USAGE_CHECK(!result.count("epochs"), "--steps and --epochs: give one or the other");
    DDP_USAGE_CHECK(c.steps > 0, "--steps {}: expected a positive number of steps", c.steps);
  }
  if (!result.count("weight-decay"))  // torch.optim's defaults
    c.optimizer.weight_decay = c.optimizer.kind == OptimizerKind::kAdamW ? 0.01f : 0.0f;
  validate(c);
  return true;
}

std::vector<std::string> flag_names() {
  std::vector<std::string> names;
  for (const Flag& flag : flags())
    names.push_back(flag.name);
  return names;
}

void validate(const TrainConfig& c) {
  parse_layers(c.layers);  // throws with the flag on a malformed list
  DDP_USAGE_CHECK(c.data != DataSource::kNpy || !c.data_dir.empty(),
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
  DDP_USAGE_CHECK(c.product_sms >= 0 && c.product_sms <= 4096,
                  "--product-sms {}: expected 0 (all SMs) or a count of SMs, at most 4096",
                  c.product_sms);
  DDP_USAGE_CHECK(c.product_sms == 0 || c.device == Device::kCuda,
                  "--product-sms: the GPU's products only; use --device cuda");
  DDP_USAGE_CHECK(c.weight_grad_stream == WeightGradStream::kAuto || c.device == Device::kCuda,
                  "--weight-grad-stream: the GPU's backward only; use --device cuda");
  DDP_USAGE_CHECK(!c.fused_step || c.device == Device::kCuda,
                  "--fused-step: the GPU's step only; use --device cuda");
  DDP_USAGE_CHECK(!c.check_replicas || c.device == Device::kCpu,
                  "--check-replicas: runs on the CPU path only so far");
  DDP_USAGE_CHECK(c.on_nonfinite == OnNonfinite::kStop || c.device == Device::kCpu,
                  "--on-nonfinite {}: runs on the CPU path only so far (the GPU path stops)",
                  on_nonfinite_name(c.on_nonfinite));
  DDP_USAGE_CHECK(c.profile_steps.empty() || c.device == Device::kCuda,
                  "--profile-steps {}: a CUDA profiler's capture range; use --device cuda",
                  c.profile_steps);
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
  DDP_USAGE_CHECK(c.step_delay_ms >= 0 && c.step_delay_ms <= 60000,
                  "--step-delay-ms {}: expected 0 to 60000", c.step_delay_ms);
  DDP_USAGE_CHECK(c.zero >= 0 && c.zero <= 3,
                  "--zero {}: expected 0 (off), 1 (optimizer state sharded), 2 (gradients too) or "
                  "3 (parameters too)",
                  c.zero);
  DDP_USAGE_CHECK(!c.nccl_symmetric || (c.device == Device::kCuda && c.backend != Backend::kGloo &&
                                        c.backend != Backend::kMpi),
                  "--nccl-symmetric: NCCL's windows hold GPU gradients; use --device cuda with "
                  "--backend nccl (or auto)");
  DDP_USAGE_CHECK(!c.nccl_symmetric || c.zero == 0,
                  "--nccl-symmetric with --zero {}: ZeRO reduce-scatters into pieces outside the "
                  "window (its sum would not be averaged); drop one of them",
                  c.zero);
  DDP_USAGE_CHECK(c.zero_prefetch >= 1 && c.zero_prefetch <= 8,
                  "--zero-prefetch {}: expected 1 to 8 layers ahead", c.zero_prefetch);
  DDP_USAGE_CHECK(c.zero_prefetch == 1 || (c.zero == 3 && c.device == Device::kCuda),
                  "--zero-prefetch {}: gathers ahead with --zero 3 on the GPU only (the CPU "
                  "gathers each layer as it is used); add --zero 3 --device cuda or drop it",
                  c.zero_prefetch);
  DDP_USAGE_CHECK(c.zero < 3 || !c.check_replicas,
                  "--check-replicas with --zero 3: each replica holds its own piece of the "
                  "parameters, so there is nothing to compare; drop one of them");
  const int micro = micro_batches_of(c);
  DDP_USAGE_CHECK(c.pp > 1 || c.virtual_stages == 0,
                  "--virtual-stages {}: chunks of a pipeline; they need --pp 2 or more",
                  c.virtual_stages);
  const int chunks =
      c.pp > 1 ? schedule_chunks(c.schedule, c.virtual_stages, c.pp, shape.num_layers(), micro) : 1;
  if (!c.partition.empty()) {
    const std::vector<int> bounds = parse_partition(c.partition, shape.num_layers());
    DDP_USAGE_CHECK(
        static_cast<int>(bounds.size()) - 1 == c.pp * chunks,
        "--partition {}: names {} stages but --pp is {}{}", c.partition, bounds.size() - 1, c.pp,
        chunks > 1 ? fmt::format(" with {} chunks a rank ({} stages)", chunks, c.pp * chunks)
                   : std::string());
  }
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
  DDP_USAGE_CHECK(!c.fresh || !c.checkpoint_dir.empty(), "--fresh: needs --checkpoint-dir");
  DDP_USAGE_CHECK(!c.fresh || !c.resume,
                  "--fresh and --resume: give one (continue the earlier run, or start afresh)");
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

nlohmann::json config_json(const TrainConfig& c) {
  nlohmann::json record = nlohmann::json::object();
  for (const Flag& flag : flags())
    record[flag.key] = flag.record(c);
  return record;
}

std::vector<std::string> flags_that_must_match(const TrainConfig& c) {
  // What one rank may set for itself: how it prints, starts its device or uses its threads, the
  // faults and delays a test injects into one rank, and the files it reads or writes alone
  // (srun job scripts give --save-weights and --metrics to rank 0 only). A checkpoint folder or
  // a timeline may be another path on another node, but whether it is given may not (both
  // gather from every rank). Everything else changes the model, the data or the collectives
  // (--log-every: the loss is averaged over the ranks at each log step).
  static const std::set<std::string> kPerRank = {
      "sync-debug",   "autotune",      "stage-from-host", "init-retries",       "threads",
      "quiet",        "timeout",       "product-sms",     "weight-grad-stream", "profile-steps",
      "fail-at-step", "step-delay-ms", "data-dir",        "init-weights",       "save-weights",
      "metrics"};
  static const std::set<std::string> kPaths = {"checkpoint-dir", "timeline"};
  std::vector<std::string> lines;
  for (const Flag& flag : flags()) {
    if (kPerRank.count(flag.name)) continue;
    const nlohmann::json value = flag.record(c);
    if (kPaths.count(flag.name))
      lines.push_back(fmt::format(
          "--{} {}", flag.name,
          value.is_string() && value.get<std::string>().empty() ? "not given" : "given"));
    else
      lines.push_back(fmt::format("--{} {}", flag.name, value.dump()));
  }
  return lines;
}

std::vector<std::string> describe(const TrainConfig& c) {
  std::vector<std::string> lines;
  lines.push_back(fmt::format(
      "model      mlp {} on {}{}", c.layers, device_name(c.device),
      c.device == Device::kCuda
          ? fmt::format(" ({}{}{})", precision_name(c.precision),
                        c.cuda_graph ? ", CUDA graph" : "", c.sync_debug ? ", sync-debug" : "")
          : ""));
  const bool synthetic = c.data == DataSource::kSynthetic;
  lines.push_back(fmt::format("data       {}{}{}", data_name(c.data), synthetic ? "" : " from ",
                              synthetic ? "" : c.data_dir));
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
