// A LibTorch program for ddp::DistributedDataParallel's tests: a model of several kinds of layer
// (an embedding, a convolution, layer norm, linear layers) trained K steps with SGD on a fixed
// data set, one global batch a step split over the ranks, or by one process alone.
//   torch_worker --single [--steps K] [--accumulate A] [--out FILE]
//   ddprun ... torch_worker [--steps K] [--accumulate A] [--out FILE] [--init FILE]
//       [--cuda] [--bf16] [--unused [--find-unused]] [--differ] [--events] [--batchnorm]
//       [--own-forward [--no-sync-buffers]] [--bucket-kb N] [--sparse] [--reference-forward]
//       [--load FILE] [--second-backward RANK] [--unused-on-rank RANK] [--no-broadcast-buffers]
//       [--threads N] [--wrap-twice] [--zero LEVEL] [--adamw] [--memory] [--save-full FILE]
//       [--deep K] [--hook average|sum|twice|bf16|fp16|powersgd] [--syncbn] [--short-rank R
//       [--join]]
//       [--data-steps D] [--loss] [--powersgd-rank R] [--powersgd-start S]
//       [--powersgd-min-rate X] [--powersgd-no-error-feedback] [--dtypes] [--autocast]
//       [--grads-out FILE] [--stem K] [--static-graph] [--regularize-spare]
//       [--spare-from-step S] [--spare-until-step S] [--keep-stream] [--two-forwards]
//       [--pair-forward] [--parallel-stems] [--reverse-stems-on-rank R] [--step-every S]
//   torch_worker --single --short-rank R --ranks N   (one process as that job with --join)
//   torch_worker --check-load FILE --out FILE [--deep K]  (a plain module loads --save-full's)
//   torch_worker --save-start FILE   (a model of another seed, torch::save'd, for --load)
// --load: torch::load of the whole model after wrapping it and making the optimizer (as resume
// code does); --second-backward: that rank runs a second backward in step 1; --unused-on-rank:
// the spare layer (--unused) adds to the loss on every rank but that one; --zero: ZeRO 1-3;
// --adamw: AdamW instead of SGD with momentum; --memory: each rank prints its optimizer state's,
// parameters' and gradients' bytes after the last step; --save-full: rank 0 torch::save's the
// module after gather_parameters() (a checkpoint for a plain module); --deep K: K residual
// linear blocks more (a model whose parameters several ranks can share evenly); --stem K: K
// linear layers on the embeddings, registered last (their gradients arrive last);
// --static-graph: DistributedDataParallelOptions::static_graph; --regularize-spare: the loss adds
// the spare layer's squared weights (a gradient from outside forward); --spare-from-step S: the
// spare layer (--unused) joins the forward from step S; --spare-until-step S: leaves it at S;
// --keep-stream (CUDA): the world communicator's compute stream set to a stream of this program
// before wrapping, and whether it is still that one after training printed; --two-forwards:
// each share in two halves through model.forward, the spare layer (--unused) in the first only;
// --pair-forward: the wrapper made from a module whose forward returns (logits, a copy);
// --parallel-stems: the --stem layers side by side on the embeddings (summed in index order);
// --reverse-stems-on-rank R: and made in reverse order on rank R, so that its gradients arrive
// in another order than the others'; --step-every S: zero_grad and the optimizer's step every S
// steps only (synchronised backwards accumulating, as the first step's rebuild moves them);
// --hook: a communication hook (the built-in average, bf16 or fp16 compression, a hook of one's own
// that sums and divides and counts its calls, two hooks registered, or PowerSGD with the
// --powersgd-* options); --data-steps D: D steps' batches run in turn (a data set the model can
// fit);
// --loss: each rank prints the loss over the data set before and after training; --syncbn:
// ddp::SyncBatchNorm where --batchnorm puts LibTorch's BatchNorm1d (the same names).
// --dtypes: the embedding in bfloat16, the layer norm's parameters in float16 and the last layer
// in float64 (the forward casts around them); --autocast: each forward under LibTorch's autocast
// to bfloat16; --grads-out: rank 0 writes the first step's gradients (as float32) there. Rank 0
// writes the trained parameters (safetensors, registration order, as float32) to --out (every rank
// where it holds RANK); --init writes the starting parameters (rank 0's, after the broadcast) and
// the data set, for PyTorch's Python DDP to start from. Each rank starts from its own seed, so the
// runs equal one process only if the construction's broadcast works.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <ddp/torch.h>
#if WORKER_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif
#include "models/safetensors.h"
#include "tests/support/rank_flags.h"

namespace {

constexpr int64_t kVocabulary = 16, kTokens = 6, kClasses = 4, kGlobalBatch = 12;

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t hidden, bool unused, bool batchnorm, bool sparse, int deep = 0,
          bool syncbn = false, int stem = 0)
      : embed(register_module(
            "embed",
            torch::nn::Embedding(torch::nn::EmbeddingOptions(kVocabulary, 8).sparse(sparse)))),
        conv(register_module("conv",
                             torch::nn::Conv1d(torch::nn::Conv1dOptions(8, 12, 3).padding(1)))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({12})))),
        fc1(register_module("fc1", torch::nn::Linear(kTokens * 12, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, kClasses))) {
    if (unused) spare = register_module("spare", torch::nn::Linear(hidden, hidden));
    if (batchnorm) bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    if (syncbn) sbn = register_module("bn", ddp::SyncBatchNorm(hidden));
    for (int i = 0; i < deep; ++i)
      blocks.push_back(
          register_module("block" + std::to_string(i), torch::nn::Linear(hidden, hidden)));
    for (int i = 0; i < stem; ++i)  // registered last, used first
      stems.push_back(register_module("stem" + std::to_string(i), torch::nn::Linear(8, 8)));
  }
  // --dtypes: the embedding bfloat16, the norm's parameters float16, fc2 float64.
  void mix_dtypes() {
    mixed = true;
    embed->to(torch::kBFloat16);
    norm->to(torch::kFloat16);
    fc2->to(torch::kFloat64);
  }
  torch::Tensor forward(torch::Tensor tokens) {
    torch::Tensor x = embed(tokens).to(torch::kFloat32);  // (B, T, 8)
    if (parallel_stems) {  // side by side, made in `reverse_stems` order, summed in index order
      std::vector<torch::Tensor> outs(stems.size());
      for (size_t k = 0; k < stems.size(); ++k) {
        const size_t i = reverse_stems ? stems.size() - 1 - k : k;
        outs[i] = torch::relu(stems[i](x));
      }
      for (const torch::Tensor& out : outs)
        x = x + out;
    } else {
      for (torch::nn::Linear& stem : stems)
        x = x + torch::relu(stem(x));
    }
    x = torch::relu(conv(x.transpose(1, 2))).transpose(1, 2);  // (B, T, 12)
    if (mixed)
      x = torch::layer_norm(x, {12}, norm->weight.to(torch::kFloat32),
                            norm->bias.to(torch::kFloat32))
              .flatten(1);
    else  // float32 (a no-op but under autocast: LibTorch 1.13's CPU layer norm takes one dtype)
      x = norm(x.to(torch::kFloat32)).flatten(1);
    x = torch::relu(fc1(x));
    if (!bn.is_empty()) x = bn(x);
    if (!sbn.is_empty()) x = sbn(x);
    if (use_spare && !spare.is_empty()) x = x + 0.1 * torch::tanh(spare(x));
    for (torch::nn::Linear& block : blocks)
      x = x + torch::relu(block(x));
    if (mixed) return fc2(x.to(torch::kFloat64)).to(torch::kFloat32);
    return fc2(x);
  }
  bool use_spare = false;
  bool mixed = false;
  bool parallel_stems = false, reverse_stems = false;
  torch::nn::Embedding embed;
  torch::nn::Conv1d conv;
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
  torch::nn::Linear spare{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  ddp::SyncBatchNorm sbn{nullptr};
  std::vector<torch::nn::Linear> blocks, stems;
};
TORCH_MODULE(Net);

// --pair-forward: the model under a module whose forward returns a pair (the logits and a
// detached copy), as a model with an auxiliary output.
struct PairImpl : torch::nn::Module {
  explicit PairImpl(Net inner) : net(register_module("net", inner)) {}
  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor tokens) {
    torch::Tensor logits = net->forward(tokens);
    return {logits, logits.detach()};
  }
  Net net;
};
TORCH_MODULE(Pair);

struct Args {
  bool single = false, cuda = false, bf16 = false, unused = false, find_unused = false,
       differ = false, events = false, batchnorm = false, own_forward = false, sparse = false,
       reference_forward = false, no_sync_buffers = false, no_broadcast_buffers = false,
       wrap_twice = false, adamw = false, memory = false, syncbn = false, dtypes = false,
       autocast = false;
  bool parallel_stems = false;  // --parallel-stems: the stems side by side
  int reverse_stems_rank = -1;  // --reverse-stems-on-rank R (so its gradients arrive reversed)
  int step_every = 1;           // --step-every S: the optimizer steps (and zeroes) every S steps
  int deep = 0, stem = 0, short_rank = -1;  // --short-rank: that rank has two batches fewer
  int ranks = 0;  // --ranks: with --single and --short-rank, the job it emulates
  bool join = false;
  int steps = 5, accumulate = 1, second_backward = -1, unused_on_rank = -1, threads = 0, zero = 0;
  bool static_graph = false, regularize_spare = false, keep_stream = false, two_forwards = false,
       pair_forward = false;
  int spare_from_step = -1;   // --spare-from-step S: the spare layer joins the forward at step S
  int spare_until_step = -1;  // --spare-until-step S: it is in the forward until step S
  int data_steps = 0;         // --data-steps D: the data set of D steps' batches, run in turn
  bool loss = false;          // --loss: the loss over the data set before and after training
  int powersgd_rank = 1, powersgd_start = 2;
  double powersgd_min_rate = 2;
  bool powersgd_no_error_feedback = false;
  double bucket_kb = 0;
  std::string out, init, load, save_start, save_full, check_load, hook, grads_out;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) throw ddp::UsageError(f + " needs a value");
      return std::string(argv[++i]);
    };
    if (f == "--single")
      a.single = true;
    else if (f == "--cuda")
      a.cuda = true;
    else if (f == "--bf16")
      a.bf16 = true;
    else if (f == "--unused")
      a.unused = true;
    else if (f == "--find-unused")
      a.find_unused = true;
    else if (f == "--differ")
      a.differ = true;
    else if (f == "--events")
      a.events = true;
    else if (f == "--reference-forward")
      a.reference_forward = true;
    else if (f == "--adamw")
      a.adamw = true;
    else if (f == "--join")
      a.join = true;
    else if (f == "--ranks")
      a.ranks = std::stoi(value());
    else if (f == "--short-rank")
      a.short_rank = std::stoi(value());
    else if (f == "--syncbn")
      a.syncbn = true;
    else if (f == "--hook")
      a.hook = value();
    else if (f == "--data-steps")
      a.data_steps = std::stoi(value());
    else if (f == "--loss")
      a.loss = true;
    else if (f == "--dtypes")
      a.dtypes = true;
    else if (f == "--autocast")
      a.autocast = true;
    else if (f == "--grads-out")
      a.grads_out = value();
    else if (f == "--powersgd-rank")
      a.powersgd_rank = std::stoi(value());
    else if (f == "--powersgd-start")
      a.powersgd_start = std::stoi(value());
    else if (f == "--powersgd-min-rate")
      a.powersgd_min_rate = std::stod(value());
    else if (f == "--powersgd-no-error-feedback")
      a.powersgd_no_error_feedback = true;
    else if (f == "--deep")
      a.deep = std::stoi(value());
    else if (f == "--pair-forward")
      a.pair_forward = true;
    else if (f == "--two-forwards")
      a.two_forwards = true;
    else if (f == "--keep-stream")
      a.keep_stream = true;
    else if (f == "--static-graph")
      a.static_graph = true;
    else if (f == "--regularize-spare")
      a.regularize_spare = true;
    else if (f == "--spare-from-step")
      a.spare_from_step = std::stoi(value());
    else if (f == "--spare-until-step")
      a.spare_until_step = std::stoi(value());
    else if (f == "--stem")
      a.stem = std::stoi(value());
    else if (f == "--parallel-stems")
      a.parallel_stems = true;
    else if (f == "--reverse-stems-on-rank")
      a.reverse_stems_rank = std::stoi(value());
    else if (f == "--step-every")
      a.step_every = std::stoi(value());
    else if (f == "--check-load")
      a.check_load = value();
    else if (f == "--memory")
      a.memory = true;
    else if (f == "--zero")
      a.zero = std::stoi(value());
    else if (f == "--save-full")
      a.save_full = value();
    else if (f == "--wrap-twice")
      a.wrap_twice = true;
    else if (f == "--sparse")
      a.sparse = true;
    else if (f == "--batchnorm")
      a.batchnorm = true;
    else if (f == "--own-forward")
      a.own_forward = true;
    else if (f == "--no-sync-buffers")
      a.no_sync_buffers = true;
    else if (f == "--steps")
      a.steps = std::stoi(value());
    else if (f == "--accumulate")
      a.accumulate = std::stoi(value());
    else if (f == "--bucket-kb")
      a.bucket_kb = std::stod(value());
    else if (f == "--out")
      a.out = value();
    else if (f == "--init")
      a.init = value();
    else if (f == "--no-broadcast-buffers")
      a.no_broadcast_buffers = true;
    else if (f == "--threads")
      a.threads = std::stoi(value());
    else if (f == "--load")
      a.load = value();
    else if (f == "--save-start")
      a.save_start = value();
    else if (f == "--second-backward")
      a.second_backward = std::stoi(value());
    else if (f == "--unused-on-rank")
      a.unused_on_rank = std::stoi(value());
    else
      throw ddp::UsageError("unknown flag " + f);
  }
  return a;
}

// The named tensors as safetensors (floating point as float32, int64 as it is), on the CPU.
void save(const std::string& path,
          const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  std::vector<torch::Tensor> keep;
  std::vector<ddp::TensorRef> refs;
  for (const auto& [name, tensor] : named) {
    const torch::Tensor cpu = tensor.detach().cpu();
    keep.push_back((cpu.is_floating_point() ? cpu.to(torch::kFloat32) : cpu).contiguous());
    const torch::Tensor& t = keep.back();
    refs.push_back({name, t.scalar_type() == torch::kInt64 ? "I64" : "F32",
                    std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), t.data_ptr(),
                    static_cast<size_t>(t.numel()) * t.element_size()});
  }
  ddp::write_safetensors(path, refs);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> words;  // --rank1-flags: rank 1's own options
  std::vector<char*> line = ddp::with_rank1_flags(argc, argv, words);
  const Args args = parse(static_cast<int>(line.size()), line.data());
  if (!args.save_start.empty()) {
    torch::manual_seed(99);
    Net other(32, args.unused, args.batchnorm, args.sparse, args.deep);
    torch::save(other, args.save_start);
    return 0;
  }
  // The data set: the same on every rank (one seed), kGlobalBatch samples a step.
  const int64_t batch = kGlobalBatch * args.accumulate;
  torch::manual_seed(1234);
  const int data_steps = args.data_steps > 0 ? args.data_steps : args.steps;
  const torch::Tensor tokens =
      torch::randint(kVocabulary, {batch * data_steps, kTokens}, torch::kLong);
  const torch::Tensor labels = torch::randint(kClasses, {batch * data_steps}, torch::kLong);

  if (args.threads > 0) at::set_num_threads(args.threads);  // as LibTorch on a larger machine
  std::unique_ptr<ddp::World> world;
  int rank = 0, ranks = 1;
  if (!args.single) {
    ddp::InitOptions init;
    init.bind_gpu = args.cuda;
    world = std::make_unique<ddp::World>(ddp::init(init));
    rank = world->rank();
    ranks = world->size();
  }
  const torch::Device device = args.cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  void* user_stream = nullptr;  // --keep-stream
#if WORKER_TORCH_CUDA
  if (args.keep_stream && args.cuda && world) {
    user_stream = c10::cuda::getStreamFromPool().stream();
    world->comm().set_compute_stream(user_stream);
  }
#endif
  at::globalContext().setAllowTF32CuDNN(false);  // fp32 convolutions, comparable with the CPU's
  torch::manual_seed(7 + rank);  // each rank its own start: the broadcast makes them rank 0's
  Net net(args.differ && rank == 1 ? 33 : 32, args.unused, args.batchnorm, args.sparse, args.deep,
          args.syncbn, args.stem);
  net->parallel_stems = args.parallel_stems || args.reverse_stems_rank >= 0;
  net->reverse_stems = rank == args.reverse_stems_rank && !args.single;
  if (!args.check_load.empty()) {  // a plain module loads what a ZeRO run saved, then --out
    torch::load(net, args.check_load);
    std::vector<std::pair<std::string, torch::Tensor>> state;
    for (const auto& p : net->named_parameters())
      state.emplace_back(p.key(), p.value());
    save(args.out, state);
    return 0;
  }
  if (args.dtypes) net->mix_dtypes();
  net->to(device);

  std::unique_ptr<ddp::DistributedDataParallel> model;
  Pair pair{nullptr};
  int hook_calls = 0;
  std::shared_ptr<ddp::PowerSGDState> powersgd;
  // The mean loss over the whole data set (every rank alike), without gradients.
  const auto data_loss = [&] {
    torch::NoGradGuard no_grad;
    return torch::nn::functional::cross_entropy(net->forward(tokens.to(device)), labels.to(device))
        .item<double>();
  };
  if (world) {
    ddp::DistributedDataParallelOptions options;
    options.find_unused_parameters(args.find_unused)
        .static_graph(args.static_graph)
        .reduce_in_bf16(args.bf16)
        .broadcast_buffers(!args.no_broadcast_buffers)
        .zero(args.zero);
    // Each rank's own running statistics: the construction's broadcast makes them rank 0's.
    if (args.batchnorm) net->bn->running_mean.add_(static_cast<double>(rank));
    if (args.syncbn) net->sbn->running_mean.add_(static_cast<double>(rank));
    if (args.bucket_kb > 0)
      options.bucket_cap_mb(args.bucket_kb / 1024).first_bucket_cap_mb(args.bucket_kb / 1024);
    if (args.own_forward || args.reference_forward)  // made from the module itself
      model = std::make_unique<ddp::DistributedDataParallel>(*net, *world, options);
    else
      model = std::make_unique<ddp::DistributedDataParallel>(net, *world, options);
    if (args.pair_forward) {
      model.reset();
      pair = Pair(net);
      model = std::make_unique<ddp::DistributedDataParallel>(pair, *world, options);
    }
    if (args.wrap_twice) ddp::DistributedDataParallel again(net, *world, options);
    if (args.hook == "average" || args.hook == "twice")
      model->register_comm_hook(ddp::allreduce_comm_hook());
    if (args.hook == "twice") model->register_comm_hook(ddp::allreduce_comm_hook());
    if (args.hook == "bf16") model->register_comm_hook(ddp::bf16_compress_comm_hook());
    if (args.hook == "fp16") model->register_comm_hook(ddp::fp16_compress_comm_hook());
    if (args.hook == "powersgd") {
      powersgd = std::make_shared<ddp::PowerSGDState>(
          ddp::PowerSGDOptions()
              .matrix_approximation_rank(args.powersgd_rank)
              .start_powerSGD_iter(args.powersgd_start)
              .min_compression_rate(args.powersgd_min_rate)
              .use_error_feedback(!args.powersgd_no_error_feedback));
      model->register_comm_hook(ddp::powersgd_comm_hook(powersgd));
    }
    if (args.hook == "sum")  // one's own: the sum, divided here, done when it returns
      model->register_comm_hook(
          [&hook_calls](ddp::Communicator& comm, ddp::TorchGradBucket& bucket) {
            comm.all_reduce(bucket.buffer.data_ptr(), static_cast<size_t>(bucket.buffer.numel()),
                            ddp::collective_type(bucket.buffer.scalar_type()), ddp::ReduceOp::kSum);
            bucket.buffer.div_(comm.size());
            ++hook_calls;
            return std::unique_ptr<ddp::Work>();
          });
  }
  const double start_loss = args.loss ? data_loss() : 0;  // rank 0's weights, after the wrapper
  if (args.batchnorm)
    std::printf("rank %d start running_mean %.9g\n", rank,
                net->bn->running_mean.cpu().sum().item<double>());
  if (args.syncbn)
    std::printf("rank %d start running_mean %.9g\n", rank,
                net->sbn->running_mean.cpu().sum().item<double>());
  if (!args.init.empty() && rank == 0) {
    auto named = net->named_parameters();
    std::vector<std::pair<std::string, torch::Tensor>> state;
    for (const auto& p : named)
      state.emplace_back(p.key(), p.value());
    state.emplace_back("data.tokens", tokens);
    state.emplace_back("data.labels", labels);
    save(args.init, state);
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (args.adamw)
    optimizer = std::make_unique<torch::optim::AdamW>(
        net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.01));
  else
    optimizer = std::make_unique<torch::optim::SGD>(net->parameters(),
                                                    torch::optim::SGDOptions(0.1).momentum(0.9));
  if (!args.load.empty()) {
    torch::load(net, args.load);
    net->to(device);
  }
  net->use_spare = args.unused_on_rank >= 0 && rank != args.unused_on_rank;

  // This rank's share of each micro-batch.
  const int64_t share = kGlobalBatch / ranks;
  const int my_steps = rank == args.short_rank && !args.single ? args.steps - 2 : args.steps;
  const auto train = [&] {
    for (int step = 0; step < my_steps; ++step) {
      if (model && args.events && step == 1) model->record_events(true);
      if (step == args.spare_from_step) net->use_spare = true;
      if (args.spare_until_step >= 0) net->use_spare = step < args.spare_until_step;
      if (step % args.step_every == 0) optimizer->zero_grad();
      for (int micro = 0; micro < args.accumulate; ++micro) {
        const int64_t first =
            ((step % data_steps) * args.accumulate + micro) * kGlobalBatch + rank * share;
        torch::Tensor x = tokens.narrow(0, first, share).to(device);
        torch::Tensor y = labels.narrow(0, first, share).to(device);
        // One process emulating a job whose rank --short-rank has run out (its last two steps):
        // that rank's share left out, the loss still over the whole global batch (as the
        // average over every rank, the joined one's zeros included).
        const bool emulate = args.single && args.short_rank >= 0 && step >= args.steps - 2;
        if (emulate) {
          const int64_t part = kGlobalBatch / args.ranks;
          std::vector<int64_t> keep;
          for (int64_t i = 0; i < kGlobalBatch; ++i)
            if (i / part != args.short_rank) keep.push_back(i);
          const torch::Tensor index = torch::tensor(keep, torch::kLong).to(device);
          x = x.index_select(0, index);
          y = y.index_select(0, index);
        }
        const auto run = [&] {
          torch::Tensor logits;
          std::optional<ddp::Autocast> autocast;  // --autocast: the forward under it
          if (args.autocast) autocast.emplace(device.type(), torch::kBFloat16);
          if (!model) {
            logits = net->forward(x);
          } else if (args.own_forward) {
            if (!args.no_sync_buffers) model->sync_buffers();
            logits = net->forward(x);
          } else if (args.pair_forward) {
            logits = std::get<0>(model->forward<std::tuple<torch::Tensor, torch::Tensor>>(x));
          } else if (args.two_forwards) {
            const int64_t half = x.size(0) / 2;
            net->use_spare = true;
            torch::Tensor first = model->forward(x.narrow(0, 0, half));
            net->use_spare = false;
            logits = torch::cat({first, model->forward(x.narrow(0, half, x.size(0) - half))});
          } else {
            logits = model->forward(x);
          }
          if (args.autocast) {
            autocast.reset();
            logits = logits.to(torch::kFloat32);
          }
          torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y) / args.accumulate;
          if (emulate) loss = loss * static_cast<double>(x.size(0)) / kGlobalBatch;
          if (args.regularize_spare) loss = loss + 1e-3 * net->spare->weight.pow(2).sum();
          if (step == 1 && rank == args.second_backward) {
            loss.backward({}, /*retain_graph=*/true);
            std::printf("rank %d: a second backward in step 1\n", rank);
          }
          loss.backward();
        };
        if (model && micro + 1 < args.accumulate) {
          auto guard = model->no_sync();
          run();
        } else {
          run();
        }
      }
      if (step == 0 && rank == 0 && !args.grads_out.empty()) {
        std::vector<std::pair<std::string, torch::Tensor>> grads;
        for (const auto& p : net->named_parameters())
          grads.emplace_back(p.key(), p.value().grad());
        save(args.grads_out, grads);
      }
      if ((step + 1) % args.step_every == 0) optimizer->step();
      if (model && args.events && step == 1) {
        model->record_events(false);
        if (rank == 0) {
          std::string line = "events:";
          for (const ddp::DdpEvent& e : model->events())
            line += " " + e.what + (e.bucket >= 0 ? ":" + std::to_string(e.bucket) : "") +
                    (e.what == "layer_done" ? ":" + model->parameter_names()[e.layer] : "");
          std::printf("%s\nbuckets: %zu\n", line.c_str(), model->buckets().size());
        }
      }
    }
  };
  if (model && args.join)
    model->join(train);
  else
    train();
  if (args.memory && model) {
    const ddp::ShardedMemory held = model->memory();
    std::printf("rank %d memory optimizer %zu parameters %zu gradients %zu owned %zu\n", rank,
                ddp::optimizer_state_bytes(*optimizer), held.parameter_bytes, held.gradient_bytes,
                model->owned_parameter_names().size());
    // What this rank's collectives put on its links (bus bytes, nccl-tests' count).
    std::printf("rank %d traffic %llu\n", rank,
                static_cast<unsigned long long>(world->comm().bus_bytes()));
  }
  if (model) model->gather_parameters();  // ZeRO: the owners' last updates on every rank
  if (!args.save_full.empty() && rank == 0) torch::save(net, args.save_full);
  if (args.batchnorm || args.syncbn) {  // rank 0's, as the next forward would see them
    if (model) model->sync_buffers();
    const torch::Tensor mean = args.syncbn ? net->sbn->running_mean : net->bn->running_mean;
    const torch::Tensor var = args.syncbn ? net->sbn->running_var : net->bn->running_var;
    const torch::Tensor batches =
        args.syncbn ? net->sbn->num_batches_tracked : net->bn->num_batches_tracked;
    std::printf("rank %d running_mean %.9g %.9g batches %lld\n", rank,
                mean.cpu().sum().item<double>(), var.cpu().sum().item<double>(),
                static_cast<long long>(batches.cpu().item<int64_t>()));
  }
  // "RANK" in --out: every rank writes its own file (the replicas compared).
  const size_t rank_at = args.out.find("RANK");
  if (!args.out.empty() && (rank == 0 || rank_at != std::string::npos)) {
    std::vector<std::pair<std::string, torch::Tensor>> state;
    for (const auto& p : net->named_parameters())
      state.emplace_back(p.key(), p.value());
    save(rank_at == std::string::npos
             ? args.out
             : args.out.substr(0, rank_at) + std::to_string(rank) + args.out.substr(rank_at + 4),
         state);
  }
  if (args.autocast) {  // ddp::Autocast nested: the outer one still on, then off again
    const torch::Tensor a = torch::ones({2, 2}, device);
    bool outer_on = false;
    {
      ddp::Autocast outer(device.type());
      { ddp::Autocast inner(device.type()); }
      outer_on = torch::mm(a, a).scalar_type() == torch::kBFloat16;
    }
    const bool off = torch::mm(a, a).scalar_type() == torch::kFloat32;
    std::printf("rank %d autocast guard: %s\n", rank, outer_on && off ? "restores" : "broken");
  }
  if (!args.hook.empty()) std::printf("rank %d hook calls %d\n", rank, hook_calls);
  if (user_stream)
    std::printf("rank %d compute stream kept: %s\n", rank,
                world->comm().compute_stream() == user_stream ? "yes" : "no");
  if (powersgd)
    std::printf("rank %d powersgd sent %lld of %lld elements\n", rank,
                static_cast<long long>(powersgd->elements_after_compression()),
                static_cast<long long>(powersgd->elements_before_compression()));
  if (args.loss) std::printf("rank %d loss %.9g -> %.9g\n", rank, start_loss, data_loss());
  std::printf("rank %d of %d trained %d steps (threads %d)\n", rank, ranks, args.steps,
              at::get_num_threads());
  return 0;
}
