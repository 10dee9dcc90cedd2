// A LibTorch program with ddp::Pipeline, as a user writes one (ddp::init, the Sequential, the
// user's optimizer over pipe.parameters()), for the pipeline tests: K steps of a seeded model of
// several kinds of layer (linear, layer norm, GELU, tanh, a residual-free MLP of 9 modules) on
// seeded data, then each rank's parameters (named as in the Sequential) to --out.RANK (the
// safetensors the tests compare), and the mean loss of every step printed by the last stage.
// --reference: the same steps in one process without a pipeline (the whole batch at once).
// --checkpoint: each Linear through ddp::checkpoint (a ddp::CheckpointWrapper in its place).
// --scaler: the loss scaled by a ddp::GradScaler (init_scale 1024, growth_interval 2; over every
// rank of the world, one process's own with --reference) through the loss function, "rank R
// step S scale X stepped 0|1" printed after each update; --overflow S,S,...: an inf written into
// the first gradient this rank holds after those steps' backward, on rank --overflow-rank's
// alone (0; with --reference the process's).
// --checkpoint-dir DIR [--save-at S] [--resume]: a ddp::Checkpointer's save after step S, its
// newest checkpoint loaded first (with --reference: the model without a pipeline).
// --clip MAX [--norm-type P|inf]: each step's gradients clipped (pipe.clip_grad_norm_, with
// --reference LibTorch's own), "rank R step S norm N" printed.
// --data-parallel D: D replicas of the pipeline, each on its share of the global batch (replica 0
// writes the files). --bad-shape: the fourth module takes 24 features instead of 32 (a stage that
// refuses its input, mid-step). With replicas: --bucket-kb N (the stages' wrappers' bucket cap),
// --reduce-in-bf16, --zero N [--units: each Linear a ddp::ShardUnit] (and --memory: each rank
// prints its optimizer state and parameter bytes after the last step), --hook bf16|allreduce (a
// comm hook on every stage's buckets),
// --events (each rank prints whether its stages' first bucket went out before their last gradient
// and, with shard units, how often a unit's gather was issued a step
// was written: the reduction overlapping the step's last backward).
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "models/safetensors.h"
#include "tests/support/rank_flags.h"
#include "torch/checkpoint.h"
#include "torch/grad_scaler.h"
#include "torch/pipeline.h"
#include "torch/shard_unit.h"
#include "torch/sharded_checkpoint.h"

namespace {

struct Args {
  std::string schedule = "1f1b", optimizer = "sgd", out;
  int micro_batches = 4, stages_per_rank = 0, steps = 3, batch = 24, data_parallel = 1;
  std::vector<int> balance;
  bool recompute = false, reference = false, bad_shape = false, checkpoint = false;
  bool scaler = false;         // --scaler: a ddp::GradScaler (init_scale 1024, growth_interval 2)
  std::vector<int> overflow;   // --overflow S,S,...: steps whose gradients get an inf
  int overflow_rank = 0;       // --overflow-rank R: whose (the last rank's with -1)
  std::string checkpoint_dir;  // --checkpoint-dir DIR: a ddp::Checkpointer's folder
  int save_at = -1;            // --save-at S: saved after step S
  bool resume = false;         // --resume: its newest checkpoint loaded first
  bool cuda = false;
  double bucket_kb = 0;  // 0: the options' default
  bool reduce_in_bf16 = false, events = false, whole_model = false, memory = false;
  int zero = 0;
  bool units = false;  // --units: each Linear a ddp::ShardUnit
  std::string hook;
  double clip = 0, norm_type = 2;  // --clip MAX [--norm-type P|inf]
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw ddp::UsageError(f + " needs a value");
      return std::string(argv[++i]);
    };
    if (f == "--schedule")
      a.schedule = value();
    else if (f == "--optimizer")
      a.optimizer = value();
    else if (f == "--out")
      a.out = value();
    else if (f == "--micro-batches")
      a.micro_batches = std::stoi(value());
    else if (f == "--stages-per-rank")
      a.stages_per_rank = std::stoi(value());
    else if (f == "--steps")
      a.steps = std::stoi(value());
    else if (f == "--batch")
      a.batch = std::stoi(value());
    else if (f == "--data-parallel")
      a.data_parallel = std::stoi(value());
    else if (f == "--bucket-kb")
      a.bucket_kb = std::stod(value());
    else if (f == "--reduce-in-bf16")
      a.reduce_in_bf16 = true;
    else if (f == "--events")
      a.events = true;
    else if (f == "--whole-model")
      a.whole_model = true;
    else if (f == "--memory")
      a.memory = true;
    else if (f == "--zero")
      a.zero = std::stoi(value());
    else if (f == "--units")
      a.units = true;
    else if (f == "--hook")
      a.hook = value();
    else if (f == "--balance") {
      const std::string list = value();
      a.balance.clear();  // the last --balance given
      for (size_t at = 0; at < list.size();) {
        const size_t comma = list.find(',', at);
        a.balance.push_back(std::stoi(list.substr(at, comma - at)));
        at = comma == std::string::npos ? list.size() : comma + 1;
      }
    } else if (f == "--recompute")
      a.recompute = true;
    else if (f == "--checkpoint")
      a.checkpoint = true;
    else if (f == "--checkpoint-dir")
      a.checkpoint_dir = value();
    else if (f == "--save-at")
      a.save_at = std::stoi(value());
    else if (f == "--resume")
      a.resume = true;
    else if (f == "--scaler")
      a.scaler = true;
    else if (f == "--overflow") {
      std::stringstream list(value());
      for (std::string step; std::getline(list, step, ',');)
        a.overflow.push_back(std::stoi(step));
    } else if (f == "--overflow-rank")
      a.overflow_rank = std::stoi(value());
    else if (f == "--reference")
      a.reference = true;
    else if (f == "--clip")
      a.clip = std::stod(value());
    else if (f == "--norm-type")
      a.norm_type = std::stod(value());
    else if (f == "--bad-shape")
      a.bad_shape = true;
    else if (f == "--cuda")
      a.cuda = true;
    else
      throw ddp::UsageError("unknown flag " + f);
  }
  return a;
}

torch::nn::Sequential make_model(bool bad_shape, bool units, bool checkpoint) {
  torch::manual_seed(7);
  // --units: each Linear a shard unit (ddp::ShardUnit in its place, the same names);
  // --checkpoint: each Linear a ddp::CheckpointWrapper (inside its unit with --units).
  const auto linear = [units, checkpoint](int64_t in, int64_t out) {
    torch::nn::Linear made(in, out);
    if (checkpoint && units)
      return torch::nn::AnyModule(ddp::ShardUnit(ddp::CheckpointWrapper(made)));
    if (checkpoint) return torch::nn::AnyModule(ddp::CheckpointWrapper(made));
    return units ? torch::nn::AnyModule(ddp::ShardUnit(made)) : torch::nn::AnyModule(made);
  };
  torch::nn::Sequential model;
  model->push_back(linear(16, 32));
  model->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
  model->push_back(torch::nn::GELU());
  model->push_back(linear(bad_shape ? 24 : 32, 32));
  model->push_back(torch::nn::Tanh());
  model->push_back(linear(32, 32));
  model->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
  model->push_back(torch::nn::GELU());
  model->push_back(linear(32, 8));
  return model;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        std::vector<torch::Tensor> params) {
  if (name == "sgd")
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  if (name == "adamw")
    return std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  throw ddp::UsageError("--optimizer " + name + ": expected sgd or adamw");
}

// The parameters of `mine` (named as in the model) and, where defined, the model's `output` on
// the evaluation batch.
void save(const std::string& path, const torch::nn::Sequential& model,
          const std::vector<torch::Tensor>& mine, const torch::Tensor& output) {
  std::vector<torch::Tensor> keep;
  std::vector<ddp::TensorRef> refs;
  if (output.defined()) {
    keep.push_back(output.detach().cpu().to(torch::kFloat32).contiguous());
    refs.push_back({"output", "F32", keep.back().sizes().vec(), keep.back().data_ptr(),
                    static_cast<size_t>(keep.back().numel()) * sizeof(float)});
  }
  for (const auto& item : model->named_parameters()) {
    bool held = false;
    for (const torch::Tensor& p : mine)
      held = held || p.is_same(item.value());
    if (!held) continue;
    keep.push_back(item.value().detach().cpu().to(torch::kFloat32).contiguous());
    const torch::Tensor& t = keep.back();
    refs.push_back({item.key(), "F32", std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                    t.data_ptr(), static_cast<size_t>(t.numel()) * sizeof(float)});
  }
  ddp::write_safetensors(path, refs);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> words;  // --rank1-flags: rank 1's own options
  std::vector<char*> line = ddp::with_rank1_flags(argc, argv, words);
  try {
    const Args args = parse(static_cast<int>(line.size()), line.data());
    const torch::Device device = args.cuda ? torch::Device(torch::kCUDA) : torch::kCPU;
    // ddp::init binds the GPU before anything else touches CUDA (one process alone: none to bind).
    std::unique_ptr<ddp::World> world;
    if (!args.reference) {
      ddp::InitOptions init;
      init.bind_gpu = args.cuda;  // NCCL for CUDA tensors
      world = std::make_unique<ddp::World>(ddp::init(init));
    }
    torch::nn::Sequential model = make_model(args.bad_shape, args.units, args.checkpoint);
    model->to(device);
    std::unique_ptr<ddp::GradScaler> scaler;
    if (args.scaler) {
      const auto options = ddp::GradScalerOptions().init_scale(1024).growth_interval(2);
      scaler = world ? std::make_unique<ddp::GradScaler>(world->comm(), options)
                     : std::make_unique<ddp::GradScaler>(options);
    }
    // With a scaler, as a user writes it: the loss scaled in the loss function (the pipeline
    // runs the backward of each micro-batch's loss itself).
    const auto loss_fn = [&scaler](const torch::Tensor& out, const torch::Tensor& target) {
      const torch::Tensor loss = torch::nn::functional::cross_entropy(out, target);
      return scaler ? scaler->scale(loss) : loss;
    };
    const int rank = world ? world->rank() : 0;
    // --overflow: an inf in this rank's first gradient after the steps named.
    const auto overflow = [&](int step, const std::vector<torch::Tensor>& params) {
      if (std::count(args.overflow.begin(), args.overflow.end(), step) == 0 ||
          rank != args.overflow_rank)
        return;
      torch::NoGradGuard no_grad;
      for (const torch::Tensor& p : params)
        if (p.grad().defined() && p.grad().numel() > 0) {
          p.grad().view(-1)[0] = std::numeric_limits<float>::infinity();
          return;
        }
    };
    // The optimizer's step, through the scaler where there is one.
    const auto optimizer_step = [&](torch::optim::Optimizer& optimizer, int step) {
      if (!scaler) {
        optimizer.step();
        return;
      }
      const bool stepped = scaler->step(optimizer);
      scaler->update();
      std::printf("rank %d step %d scale %g stepped %d\n", rank, step, scaler->get_scale(),
                  stepped ? 1 : 0);
    };
    // Every step's batch, the same on every rank.
    auto batch = [&](int step) {
      torch::manual_seed(1000 + step);
      return std::make_pair(torch::randn({args.batch, 16}).to(device),
                            torch::randint(0, 8, {args.batch}).to(device));
    };
    // 10 samples the training never saw, for forward(): fewer than some runs' micro-batches.
    auto evaluation_batch = [&] {
      torch::manual_seed(99);
      return torch::randn({10, 16}).to(device);
    };
    // --checkpoint-dir: the program's checkpoints (a world of one process with --reference).
    if (!world && !args.checkpoint_dir.empty()) world = std::make_unique<ddp::World>(ddp::init());
    std::unique_ptr<ddp::Checkpointer> checkpoints;
    if (!args.checkpoint_dir.empty())
      checkpoints = std::make_unique<ddp::Checkpointer>(*world, args.checkpoint_dir);
    // Loads (--resume) or saves (--save-at) through `checkpoints` (pipe or model): the first
    // step to run.
    const auto resume = [&](auto& what, torch::optim::Optimizer& optimizer) {
      if (!checkpoints || !args.resume) return 0;
      const auto loaded = checkpoints->load(what, optimizer);
      std::printf("rank %d resumed at step %d\n", rank, loaded ? int(loaded->step) + 1 : 0);
      return loaded ? static_cast<int>(loaded->step) + 1 : 0;
    };
    const auto maybe_save = [&](auto& what, torch::optim::Optimizer& optimizer, int step) {
      if (checkpoints && step == args.save_at) checkpoints->save(step, what, optimizer);
    };
    if (args.reference) {
      auto optimizer = make_optimizer(args.optimizer, model->parameters());
      for (int step = resume(*model, *optimizer); step < args.steps; ++step) {
        const auto [x, y] = batch(step);
        optimizer->zero_grad();
        const torch::Tensor loss = loss_fn(model->forward(x), y);
        loss.backward();
        overflow(step, model->parameters());
        if (args.clip > 0)
          std::printf(
              "rank 0 step %d norm %.12g\n", step,
              torch::nn::utils::clip_grad_norm_(model->parameters(), args.clip, args.norm_type));
        optimizer_step(*optimizer, step);
        maybe_save(*model, *optimizer, step);
        std::printf("step %d loss %.6f\n", step, loss.item<double>());
      }
      torch::NoGradGuard no_grad;
      if (!args.out.empty())
        save(args.out + ".0", model, model->parameters(), model->forward(evaluation_batch()));
      return 0;
    }
    ddp::DistributedDataParallelOptions dp_options = ddp::PipelineOptions()
                                                         .data_parallel_options()
                                                         .reduce_in_bf16(args.reduce_in_bf16)
                                                         .zero(args.zero);
    if (args.bucket_kb > 0)
      dp_options.bucket_cap_mb(args.bucket_kb / 1024).first_bucket_cap_mb(args.bucket_kb / 1024);
    ddp::Pipeline pipe(model, *world,
                       ddp::PipelineOptions()
                           .schedule(args.schedule)
                           .micro_batches(args.micro_batches)
                           .stages_per_rank(args.stages_per_rank)
                           .balance(args.balance)
                           .recompute(args.recompute)
                           .data_parallel(args.data_parallel)
                           .data_parallel_options(dp_options));
    if (args.whole_model) {  // what this rank holds of the model, and its whole forward
      int held = 0;
      for (const torch::Tensor& p : model->parameters())
        held += p.numel() > 0 ? 1 : 0;
      std::printf("rank %d holds %d parameter tensors of the model's %zu\n", world->rank(), held,
                  model->parameters().size());
      try {
        torch::NoGradGuard no_grad;
        model->forward(evaluation_batch());
        std::printf("rank %d whole-model forward ran\n", world->rank());
      } catch (const c10::Error&) {
        std::printf("rank %d whole-model forward failed\n", world->rank());
      }
      return 0;
    }
    if (args.hook == "bf16") pipe.register_comm_hook(ddp::bf16_compress_comm_hook());
    if (args.hook == "allreduce") pipe.register_comm_hook(ddp::allreduce_comm_hook());
    if (args.events) pipe.record_events(true);
    auto optimizer = make_optimizer(args.optimizer, pipe.parameters());
    for (int step = resume(pipe, *optimizer); step < args.steps; ++step) {
      const auto [x, y] = batch(step);  // the global batch; this replica's share of it
      optimizer->zero_grad();
      const torch::Tensor loss =
          pipe.step(x.tensor_split(pipe.replicas())[pipe.replica()],
                    y.tensor_split(pipe.replicas())[pipe.replica()], loss_fn);
      overflow(step, pipe.parameters());
      if (args.clip > 0)
        std::printf("rank %d step %d norm %.12g\n", world->rank(), step,
                    pipe.clip_grad_norm_(args.clip, args.norm_type));
      optimizer_step(*optimizer, step);
      maybe_save(pipe, *optimizer, step);
      if (pipe.has_last() && pipe.replica() == 0)
        std::printf("step %d loss %.6f\n", step, loss.item<double>());
    }
    std::printf("rank %d report: %s\n", world->rank(), pipe.report().c_str());
    if (args.zero > 0 || args.memory) {  // what this rank keeps between steps
      size_t held = 0;
      for (const torch::Tensor& p : pipe.parameters())
        held += static_cast<size_t>(p.numel()) * p.element_size();
      std::printf("rank %d peak parameters %zu bytes\n", world->rank(),
                  pipe.memory().peak_parameter_bytes);
      std::printf("rank %d keeps optimizer state %zu bytes, parameters %zu bytes\n", world->rank(),
                  ddp::optimizer_state_bytes(*optimizer), held);
    }
    if (args.events) {
      // Per stage: in the last step's events (after the one before's backward_done), a bucket
      // issued before the last parameter's gradient was written: the buckets went out during
      // the step's last backward.
      for (const std::vector<ddp::DdpEvent>& events : pipe.events()) {
        std::vector<size_t> ends;  // each step's backward_done
        for (size_t k = 0; k < events.size(); ++k)
          if (events[k].what == "backward_done") ends.push_back(k);
        const size_t begin = ends.size() >= 2 ? ends[ends.size() - 2] + 1 : 0;
        size_t first_issued = events.size(), last_done = 0;
        for (size_t k = begin; k < events.size(); ++k) {
          if (events[k].what == "allreduce_issued" && first_issued == events.size())
            first_issued = k;
          if (events[k].what == "layer_done") last_done = k;
        }
        std::printf("rank %d overlap %s\n", world->rank(), first_issued < last_done ? "yes" : "no");
        // Shard units: how often each unit's gather was issued over the steps, the most and the
        // fewest a step.
        std::map<int, int> gathers;
        for (const ddp::DdpEvent& e : events)
          if (e.what == "unit_gather_issued") ++gathers[e.layer];
        if (gathers.empty()) continue;
        int most = 0, fewest = 1 << 30;
        for (const auto& [unit, n] : gathers)
          most = std::max(most, n), fewest = std::min(fewest, n);
        std::printf("rank %d unit gathers a step: most %g fewest %g\n", world->rank(),
                    static_cast<double>(most) / args.steps,
                    static_cast<double>(fewest) / args.steps);
      }
    }
    // The evaluation batch through the pipeline (every replica: collective over its pipeline).
    const torch::Tensor output = pipe.forward(evaluation_batch());
    // The replicas hold the same weights: replica 0's ranks write, each under its place in the
    // pipeline (its first stage: stage s < P runs on pipeline rank s under every schedule).
    if (!args.out.empty() && pipe.replica() == 0)
      save(args.out + "." + std::to_string(pipe.stages().front()), model, pipe.parameters(),
           output);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_worker: %s\n", e.what());
    return 1;
  }
}
