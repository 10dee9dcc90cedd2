// A LibTorch program for the shard units' tests (test_libtorch_units.cpp): a Sequential of an
// embedding, a (depthwise) convolution block and K equal residual blocks (layer norm, linear), a
// pooling and a linear head, trained S steps on a fixed data set, the global batch split over the
// ranks or taken whole by one process.
//   unit_worker --single [--blocks K] [--dim D] [--steps S] [--adamw] [--out FILE]
//   ddprun ... unit_worker [--zero L] [--units | --auto-wrap N] [--keep-after-forward] [...]
// --units: the blocks declared as ddp::ShardUnit(Block) in the Sequential (every other one
// from a shared_ptr of BlockImpl); --auto-wrap N:
// DistributedDataParallelOptions().auto_wrap_min_params(N); --keep-after-forward:
// reshard_after_forward(false); --peak: each rank prints, over steps 2 on, the most the CPU
// allocator (counted here) held above what it held when the step's forward began, what ddp held
// then (model.memory()), the model's and one block's parameter bytes and its optimizer state;
// --batch B: the global batch; --bf16-params: param_dtype(torch::kBFloat16); --bf16-reduce:
// reduce_in_bf16(true); --events: each rank prints its units' events of the last step in order
// ("rank R unit events gather_issued:U forward:U ..."); --clip MAX [--norm-type P|inf]: each
// step's gradients clipped (model.clip_grad_norm_, alone LibTorch's own; --libtorch-clip:
// LibTorch's own under the wrapper too), "rank R step S norm N" printed; --scaler: the loss
// scaled by a ddp::GradScaler (init_scale 1024, growth_interval 2; over the world's ranks),
// "rank R step S scale X stepped 0|1" printed after each update, --overflow S,S,...: an inf
// written into rank --overflow-rank's (0) first gradient after those steps' backward,
// --first-step K: the steps numbered from K, --save-scaler / --load-scaler FILE: its state;
// --checkpoint: every block's forward through ddp::checkpoint (three ways in turn: the loop that
// builds the Sequential); --dropout P:
// a dropout in each block; --bucket-mb M:
// bucket_cap_mb(M); --cuda: the model and data on the GPU (NCCL; --peak then reads the CUDA caching
// allocator's counters of this process). Rank 0 writes the trained parameters (after
// gather_parameters(), safetensors as float32) to --out.
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <torch/version.h>
#if UNIT_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <ddp/torch.h>
#include "models/safetensors.h"

namespace {

constexpr int64_t kVocabulary = 16, kTokens = 4, kClasses = 4;

// c10::Allocator::allocate is const up to LibTorch 2.2, not from 2.3 on.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define kAllocateConst
#else
#define kAllocateConst const
#endif

// Every CPU allocation counted (current and peak bytes), the default allocator underneath
// (whose context is its data, so that raw_allocate, which LibTorch's kernels call, works too).
class CountingAllocator final : public c10::Allocator {
 public:
  static CountingAllocator& install() {
    static CountingAllocator counting(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&counting, /*priority=*/100);
    return counting;
  }
  c10::DataPtr allocate(size_t bytes) kAllocateConst override {
    c10::DataPtr inner = base_->allocate(bytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;
    TORCH_CHECK(inner.get_context() == data && inner.get_deleter() == base_->raw_deleter(),
                "CountingAllocator: the default allocator's pointers are not their context");
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[data] = bytes;
    }
    const size_t now = current_ += bytes;
    size_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
#if TORCH_VERSION_MAJOR >= 2
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
  size_t current() const {
    return current_;
  }
  size_t peak() const {
    return peak_;
  }
  void reset_peak() {
    peak_ = current_.load();
  }

 private:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {
    base_deleter_ = base->raw_deleter();
  }
  static void release(void* data) {
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto found = sizes_.find(data);
      if (found != sizes_.end()) bytes = found->second, sizes_.erase(found);
    }
    current_ -= bytes;
    base_deleter_(data);
  }
  c10::Allocator* base_;
  static inline c10::DeleterFnPtr base_deleter_ = nullptr;
  static inline std::mutex mutex_;
  static inline std::unordered_map<void*, size_t> sizes_;
  static inline std::atomic<size_t> current_{0}, peak_{0};
};

// The bytes the CUDA caching allocator hands out now and at most since the last reset (the
// aggregate of its pools: what `torch.cuda.max_memory_allocated()` reports).
struct CudaCounters {
  static size_t current() { return stat().current; }
  static size_t peak() { return stat().peak; }
  static void reset_peak() {
#if UNIT_TORCH_CUDA
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
#endif
  }
  struct Stat {
    size_t current = 0, peak = 0;
  };
  static Stat stat() {
#if UNIT_TORCH_CUDA
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    const auto& all = stats.allocated_bytes[0];  // index 0: StatType::AGGREGATE
    return {static_cast<size_t>(all.current), static_cast<size_t>(all.peak)};
#else
    return {};
#endif
  }
};

struct ConvBlockImpl : torch::nn::Module {
  explicit ConvBlockImpl(int64_t dim)
      : conv(register_module(
            "conv",
            torch::nn::Conv1d(torch::nn::Conv1dOptions(dim, dim, 3).padding(1).groups(dim)))) {}
  torch::Tensor forward(torch::Tensor x) {  // (B, T, D)
    return x + torch::relu(conv(x.transpose(1, 2))).transpose(1, 2);
  }
  torch::nn::Conv1d conv;
};
TORCH_MODULE(ConvBlock);

// --dropout P: a dropout after the tanh; checkpointed: its body through ddp::checkpoint (the
// general form, its parameters named), as a user writes it inside a module's forward.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim, double dropout = 0, bool checkpointed = false)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc(register_module("fc", torch::nn::Linear(dim, dim))),
        drop(register_module("drop", torch::nn::Dropout(dropout))),
        checkpointed(checkpointed) {}
  torch::Tensor forward(torch::Tensor x) {
    if (!checkpointed) return body(x);
    return ddp::checkpoint(
        [this](const torch::autograd::variable_list& in) {
          return torch::autograd::variable_list{body(in[0])};
        },
        {x}, parameters())[0];
  }
  torch::Tensor body(const torch::Tensor& x) { return x + drop(torch::tanh(fc(norm(x)))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc;
  torch::nn::Dropout drop;
  bool checkpointed;
};
TORCH_MODULE(Block);

// A module whose forward is ddp::checkpoint(inner, x) (the module form), in a Sequential: a
// Block, or a ddp::ShardUnit (then the recompute runs the unit's forward, gathering it again).
// Its child is named "ckpt", left out of the names written to --out.
template <typename Inner>
struct CheckpointedImpl : torch::nn::Module {
  explicit CheckpointedImpl(Inner inner) : inner(register_module("ckpt", std::move(inner))) {}
  torch::Tensor forward(torch::Tensor x) { return ddp::checkpoint(inner, x); }
  Inner inner;
};
template <typename Inner>
std::shared_ptr<CheckpointedImpl<Inner>> checkpointed(Inner inner) {
  return std::make_shared<CheckpointedImpl<Inner>>(std::move(inner));
}

struct PoolImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x.mean(1); }
};
TORCH_MODULE(Pool);

struct Args {
  bool single = false, units = false, adamw = false, peak = false, keep = false;
  bool bf16_params = false, bf16_reduce = false, cuda = false, events = false;
  int zero = 0, steps = 4, blocks = 6;
  int64_t dim = 16, batch = 12, auto_wrap = 0;
  double bucket_mb = 0;            // 0: the options' default
  double clip = 0, norm_type = 2;  // --clip MAX [--norm-type P|inf]
  bool libtorch_clip = false;
  bool checkpoint = false;     // --checkpoint: each block through ddp::checkpoint
  std::string checkpoint_dir;  // --checkpoint-dir DIR: ddp::Checkpointer's folder
  std::vector<int> save_at;    // --save-at S,S,...: saved after those steps
  bool async_save = false, resume = false, save_logits = false;
  int die_at_save = -1, die_rank = 1;  // --die-at-save S [--die-rank R]: killed instead of saving
  bool sigterm_after_save = false;     // --sigterm-after-save: SIGTERM to itself after a save
  bool keep_staging = false;           // --keep-staging: CheckpointerOptions::keep_staging
  double dropout = 0;                  // --dropout P: in each block
  bool scaler = false;        // --scaler: a ddp::GradScaler (init_scale 1024, growth_interval 2)
  std::vector<int> overflow;  // --overflow S,S,...: steps whose gradients get an inf
  int overflow_rank = 0, first_step = 0;
  std::string save_scaler, load_scaler;
  std::string out;
};

}  // namespace

int main(int argc, char** argv) {
  CountingAllocator& counting = CountingAllocator::install();
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const auto value = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (f == "--single")
      a.single = true;
    else if (f == "--units")
      a.units = true;
    else if (f == "--adamw")
      a.adamw = true;
    else if (f == "--peak")
      a.peak = true;
    else if (f == "--keep-after-forward")
      a.keep = true;
    else if (f == "--bf16-params")
      a.bf16_params = true;
    else if (f == "--bf16-reduce")
      a.bf16_reduce = true;
    else if (f == "--cuda")
      a.cuda = true;
    else if (f == "--events")
      a.events = true;
    else if (f == "--zero")
      a.zero = std::stoi(value());
    else if (f == "--steps")
      a.steps = std::stoi(value());
    else if (f == "--blocks")
      a.blocks = std::stoi(value());
    else if (f == "--dim")
      a.dim = std::stoll(value());
    else if (f == "--batch")
      a.batch = std::stoll(value());
    else if (f == "--clip")
      a.clip = std::stod(value());
    else if (f == "--norm-type")
      a.norm_type = std::stod(value());  // "inf" reads as infinity
    else if (f == "--libtorch-clip")
      a.libtorch_clip = true;
    else if (f == "--checkpoint")
      a.checkpoint = true;
    else if (f == "--checkpoint-dir")
      a.checkpoint_dir = value();
    else if (f == "--save-at") {
      std::stringstream list(value());
      for (std::string step; std::getline(list, step, ',');)
        a.save_at.push_back(std::stoi(step));
    } else if (f == "--async-save")
      a.async_save = true;
    else if (f == "--resume")
      a.resume = true;
    else if (f == "--die-at-save")
      a.die_at_save = std::stoi(value());
    else if (f == "--keep-staging")
      a.keep_staging = true;
    else if (f == "--sigterm-after-save")
      a.sigterm_after_save = true;
    else if (f == "--die-rank")
      a.die_rank = std::stoi(value());
    else if (f == "--save-logits")
      a.save_logits = true;
    else if (f == "--dropout")
      a.dropout = std::stod(value());
    else if (f == "--scaler")
      a.scaler = true;
    else if (f == "--overflow") {
      std::stringstream steps(value());
      for (std::string step; std::getline(steps, step, ',');)
        a.overflow.push_back(std::stoi(step));
    } else if (f == "--overflow-rank")
      a.overflow_rank = std::stoi(value());
    else if (f == "--first-step")
      a.first_step = std::stoi(value());
    else if (f == "--save-scaler")
      a.save_scaler = value();
    else if (f == "--load-scaler")
      a.load_scaler = value();
    else if (f == "--bucket-mb")
      a.bucket_mb = std::stod(value());
    else if (f == "--auto-wrap")
      a.auto_wrap = std::stoll(value());
    else if (f == "--out")
      a.out = value();
    else {
      std::fprintf(stderr, "unit_worker: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  if (a.cuda && !UNIT_TORCH_CUDA) {
    std::fprintf(stderr, "unit_worker: --cuda: this LibTorch has no CUDA\n");
    return 2;
  }
  std::unique_ptr<ddp::World> world;
  int rank = 0, ranks = 1;
  if (!a.single) {
    ddp::InitOptions init;
    init.bind_gpu = a.cuda;
    world = std::make_unique<ddp::World>(ddp::init(init));
    rank = world->rank();
    ranks = world->size();
  }
  torch::manual_seed(1234 + rank);  // each rank its own: the construction's broadcast must work
  torch::nn::Sequential net;
  net->push_back(torch::nn::Embedding(kVocabulary, a.dim));
  net->push_back(ConvBlock(a.dim));
  for (int b = 0; b < a.blocks; ++b) {
    // --checkpoint: ddp::checkpoint in three ways in turn: from inside the block's forward, the
    // block declared as a ddp::CheckpointWrapper (inside its unit with --units), and the module
    // form from a module around it (around its unit with --units).
    const int kind = a.checkpoint ? b % 3 : -1;
    Block block(a.dim, a.dropout, kind == 0);
    if (!a.units && kind == 1)
      net->push_back(ddp::CheckpointWrapper(block));
    else if (!a.units && kind == 2)
      net->push_back(checkpointed(block));
    else if (!a.units)
      net->push_back(block);
    else if (kind == 1)
      net->push_back(ddp::ShardUnit(ddp::CheckpointWrapper(block)));
    else if (kind == 2)
      net->push_back(checkpointed(ddp::ShardUnit(block)));
    else if (b % 2 == 0)  // a holder, and a shared_ptr of the module: both as users write
      net->push_back(ddp::ShardUnit(block));
    else
      net->push_back(ddp::ShardUnit(block.ptr()));
  }
  net->push_back(Pool());
  net->push_back(torch::nn::Linear(a.dim, kClasses));
  // The parameters' bytes, whole (before the wrapper shards them), and one block's.
  size_t model_bytes = 0, block_bytes = 0;
  for (const torch::Tensor& p : net->parameters())
    model_bytes += static_cast<size_t>(p.numel()) * p.element_size();
  for (const torch::Tensor& p : net[2]->parameters())
    block_bytes += static_cast<size_t>(p.numel()) * p.element_size();
  const torch::Device device = a.cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  net->to(device);
  torch::manual_seed(99);  // the data: every rank alike
  const torch::Tensor tokens = torch::randint(kVocabulary, {a.batch, kTokens}).to(device);
  const torch::Tensor labels = torch::randint(kClasses, {a.batch}).to(device);
  std::unique_ptr<ddp::DistributedDataParallel> model;
  if (world) {
    ddp::DistributedDataParallelOptions options;
    options.zero(a.zero).auto_wrap_min_params(a.auto_wrap).reshard_after_forward(!a.keep);
    if (a.bf16_params) options.param_dtype(torch::kBFloat16);
    if (a.bucket_mb > 0) options.bucket_cap_mb(a.bucket_mb);
    options.reduce_in_bf16(a.bf16_reduce);
    model = std::make_unique<ddp::DistributedDataParallel>(net, *world, options);
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (a.adamw)
    optimizer = std::make_unique<torch::optim::AdamW>(
        net->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.01));
  else
    optimizer = std::make_unique<torch::optim::SGD>(net->parameters(),
                                                    torch::optim::SGDOptions(0.05).momentum(0.9));
  const int64_t share = a.batch / ranks;
  const torch::Tensor x = tokens.narrow(0, share * rank, share);
  const torch::Tensor y = labels.narrow(0, share * rank, share);
  std::unique_ptr<ddp::GradScaler> scaler;
  if (a.scaler) {
    const auto options = ddp::GradScalerOptions().init_scale(1024).growth_interval(2);
    scaler = world ? std::make_unique<ddp::GradScaler>(world->comm(), options)
                   : std::make_unique<ddp::GradScaler>(options);
    if (!a.load_scaler.empty()) torch::load(*scaler, a.load_scaler);
  }
  // The CPU's counting allocator, or the CUDA caching allocator's counters with --cuda.
  const auto current = [&] { return a.cuda ? CudaCounters::current() : counting.current(); };
  const auto peak = [&] { return a.cuda ? CudaCounters::peak() : counting.peak(); };
  const auto reset_peak = [&] { a.cuda ? CudaCounters::reset_peak() : counting.reset_peak(); };
  size_t window = 0, held = 0, ledger = 0, most = 0;
  // --checkpoint-dir: the program's checkpoints (a world of one process with --single).
  std::unique_ptr<ddp::World> alone;
  if (!a.checkpoint_dir.empty() && !world) alone = std::make_unique<ddp::World>(ddp::init());
  std::unique_ptr<ddp::Checkpointer> checkpoints;
  if (!a.checkpoint_dir.empty())
    checkpoints = std::make_unique<ddp::Checkpointer>(
        world ? *world : *alone, a.checkpoint_dir,
        ddp::CheckpointerOptions().keep_staging(a.keep_staging));
  int first = 0;
  if (checkpoints && a.resume) {
    const auto loaded =
        model ? checkpoints->load(*model, *optimizer) : checkpoints->load(*net, *optimizer);
    if (loaded) first = static_cast<int>(loaded->step) + 1;
    std::printf("rank %d resumed at step %d\n", rank, first);
  }
  // Each step's time from its start to its optimizer's end (the device synchronised), over the
  // steps after the first: with --peak, their mean.
  double timed_s = 0;
  int timed = 0;
  const auto sync = [&] {
    if (a.cuda) torch::cuda::synchronize();
  };
  for (int step = first; step < a.steps; ++step) {
    sync();
    const auto began = std::chrono::steady_clock::now();
    optimizer->zero_grad();
    const size_t start = current();
    if (step > 0 && model) {
      const ddp::ShardedMemory now = model->memory();
      held = std::max(held, now.parameter_bytes + now.gradient_bytes);
    }
    if (a.events && model && step + 1 == a.steps) model->record_events(true);  // the last step
    reset_peak();
    const torch::Tensor out = model ? model->forward(x) : net->forward(x);
    const torch::Tensor loss = torch::nn::functional::cross_entropy(out.to(torch::kFloat32), y);
    (scaler ? scaler->scale(loss) : loss).backward();
    const int at = a.first_step + step;
    if (std::count(a.overflow.begin(), a.overflow.end(), at) > 0 && rank == a.overflow_rank) {
      torch::NoGradGuard no_grad;  // this rank alone overflows: an inf in its own gradients
      for (const torch::Tensor& p : net->parameters())
        if (p.grad().defined() && p.grad().numel() > 0) {
          p.grad().view(-1)[0] = std::numeric_limits<float>::infinity();
          break;
        }
    }
    if (a.clip > 0) {
      const double norm = model && !a.libtorch_clip ? model->clip_grad_norm_(a.clip, a.norm_type)
                                                    : torch::nn::utils::clip_grad_norm_(
                                                          net->parameters(), a.clip, a.norm_type);
      std::printf("rank %d step %d norm %.12g\n", rank, step, norm);
    }
    if (step > 0) window = std::max(window, peak() - start);
    if (step > 0 && model) {
      const ddp::ShardedMemory now = model->memory();
      ledger = std::max(ledger, now.peak_parameter_bytes + now.peak_gradient_bytes);
    }
    if (scaler) {
      const bool stepped = scaler->step(*optimizer);
      scaler->update();
      std::printf("rank %d step %d scale %g stepped %d\n", rank, at, scaler->get_scale(),
                  stepped ? 1 : 0);
    } else {
      optimizer->step();
    }
    if (step > 0) most = std::max(most, peak());  // the optimizer's step included
    sync();
    if (step > 0) {
      timed_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      ++timed;
    }
    if (step == a.die_at_save && rank == a.die_rank) std::raise(SIGKILL);  // a rank dies mid-save
    if (checkpoints && std::count(a.save_at.begin(), a.save_at.end(), step) > 0) {
      ddp::CheckpointExtras extras;
      extras.values["trained_by"] = "unit_worker";
      if (a.save_logits) {  // the model's output on the batch, for a reader's own forward
        torch::NoGradGuard no_grad;
        extras.tensors["tokens"] = tokens.cpu();
        extras.tensors["logits"] = net->forward(tokens).cpu();
      }
      if (a.async_save)
        model ? checkpoints->async_save(step, *model, *optimizer, extras)
              : checkpoints->async_save(step, *net, *optimizer, extras);
      else
        model ? checkpoints->save(step, *model, *optimizer, extras)
              : checkpoints->save(step, *net, *optimizer, extras);
      std::printf("rank %d saved step %d (blocked %.3f s)\n", rank, step,
                  checkpoints->last_blocked_s());
      std::fflush(stdout);
      if (a.sigterm_after_save) std::raise(SIGTERM);  // as a scheduler's preemption would
    }
  }
  if (checkpoints) checkpoints->wait();
  if (scaler && !a.save_scaler.empty()) torch::save(*scaler, a.save_scaler);
  if (a.peak)
    std::printf(
        "rank %d window %zu held %zu ledger %zu model %zu block %zu optimizer %zu process %zu "
        "step_ms %.3f\n",
        rank, window, held, ledger, model_bytes, block_bytes,
        ddp::optimizer_state_bytes(*optimizer), most, timed > 0 ? 1e3 * timed_s / timed : 0.0);
  if (a.events && model) {  // the units' events of the last step, in order
    std::string line;
    for (const ddp::DdpEvent& e : model->events())
      if (e.what.rfind("unit_", 0) == 0)
        line += " " + e.what.substr(5) + ":" + std::to_string(e.layer);
    std::printf("rank %d unit events%s\n", rank, line.c_str());
  }
  // What this rank's collectives put on its links (bus bytes, nccl-tests' count).
  if (world)
    std::printf("rank %d traffic %llu\n", rank,
                static_cast<unsigned long long>(world->comm().bus_bytes()));
  if (model) model->gather_parameters();
  if (!a.out.empty() && rank == 0) {
    std::vector<torch::Tensor> keep;
    std::vector<ddp::TensorRef> refs;
    std::deque<std::string> names;
    for (const auto& p : net->named_parameters()) {
      keep.push_back(p.value().detach().to(torch::kCPU, torch::kFloat32).contiguous());
      const torch::Tensor& t = keep.back();
      std::string name = p.key();  // --checkpoint's wrappers left out
      for (size_t at = name.find(".ckpt."); at != std::string::npos; at = name.find(".ckpt."))
        name.erase(at, 5);
      names.push_back(name);
      refs.push_back({names.back(), "F32", std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                      t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size()});
    }
    ddp::write_safetensors(a.out, refs);
  }
  std::printf("rank %d of %d trained %d steps\n", rank, ranks, a.steps);
  return 0;
}
