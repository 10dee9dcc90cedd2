// ddp::Pipeline: a Sequential's stages as engine/pipeline's PipelineStage, the transfers
// between them, and the executor run over them once a step.
#include "torch/pipeline.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>
#include <utility>

#include <spdlog/spdlog.h>

#include "engine/pipeline/executor.h"
#include "engine/pipeline/schedule.h"
#include "engine/pipeline/simulate.h"
#include "engine/telemetry/timeline.h"
#include "runtime/error.h"
#include "runtime/timer.h"
#include "torch/comm_hooks.h"

#if DDP_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp {

namespace {

// "[8, 64] float"
std::string shape_of(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d)
    s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "] " + std::string(c10::toString(t.scalar_type()));
}

// The current CUDA stream of `device`, or null (the CPU).
void* stream_of(const torch::Device& device) {
#if DDP_TORCH_CUDA
  if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
  (void)device;
  return nullptr;
}

// What travels ahead of a flow's first message (the first step): the dtype and the shape.
constexpr int kHeaderWords = 8;  // dtype, dimensions, up to 6 sizes
constexpr int kMaxDims = kHeaderWords - 2;

}  // namespace

// The messages between this rank's stages and the others' (and, between two stages of this
// rank, the hand-over in memory), as the executor's actions post them.
class PipelineTransfers {
 public:
  // `lanes`: (activations?, from rank, to rank) -> its communicator.
  PipelineTransfers(std::map<std::tuple<bool, int, int>, Communicator*> lanes,
                    std::vector<int> stage_rank, int rank)
      : lanes_(std::move(lanes)), stage_rank_(std::move(stage_rank)), rank_(rank) {}

  // Micro-batch `micro`'s tensor from stage `from` to stage `to` (activations or gradients).
  void send(bool activation, int from, int to, int micro, const torch::Tensor& tensor) {
    const torch::Tensor t = tensor.detach().contiguous();
    const Key key{activation, from, micro};
    if (stage_rank_[to] == rank_) {
      handed_[key] = t;
      return;
    }
    Communicator& lane = *lanes_.at({activation, rank_, stage_rank_[to]});
    const ComputeStreamGuard on_stream(lane, stream_of(t));
    auto& cache = evaluating_ ? evaluation_sent_ : sent_;
    auto known = cache.find(key);
    if (known == cache.end()) {  // the first step (or an evaluation): the shape goes first
      DDP_USAGE_CHECK(t.dim() <= kMaxDims,
                      "ddp::Pipeline: stage {} sends a tensor of {} dimensions "
                      "(at most {})",
                      from, t.dim(), kMaxDims);
      std::vector<int64_t> words(kHeaderWords, 0);
      words[0] = static_cast<int64_t>(t.scalar_type());
      words[1] = t.dim();
      for (int64_t d = 0; d < t.dim(); ++d)
        words[2 + d] = t.size(d);
      torch::Tensor header = torch::tensor(words, torch::kInt64).to(t.device());
      post_send(lane, header, stage_rank_[to]);
      cache[key] = {t.sizes().vec(), t.scalar_type()};
    } else {
      DDP_USAGE_CHECK(
          known->second.first == t.sizes().vec() && known->second.second == t.scalar_type(),
          "ddp::Pipeline: stage {} sends {} of micro-batch {} to stage {}, but the "
          "first step sent {}: a pipeline's shapes stay those of its first step "
          "(make a new Pipeline for others)",
          from, shape_of(t), micro, to,
          shape_of(torch::empty(known->second.first,
                                torch::TensorOptions().dtype(known->second.second))));
    }
    post_send(lane, t, stage_rank_[to]);
  }

  // Micro-batch `micro`'s tensor sent by stage `from` to stage `to`, on `device`.
  torch::Tensor receive(bool activation, int from, int to, int micro, const torch::Device& device) {
    const Key key{activation, from, micro};
    if (stage_rank_[from] == rank_) {
      const auto it = handed_.find(key);
      DDP_CHECK(it != handed_.end(),
                "ddp::Pipeline: stage {} has not handed stage {} the {} of "
                "micro-batch {}",
                from, to, activation ? "activation" : "gradient", micro);
      torch::Tensor t = it->second;
      handed_.erase(it);
      return t;
    }
    Communicator& lane = *lanes_.at({activation, stage_rank_[from], rank_});
    const ComputeStreamGuard on_stream(lane, ddp::stream_of(device));
    const int peer = stage_rank_[from];
    auto& cache = evaluating_ ? evaluation_received_ : received_;
    auto known = cache.find(key);
    if (known == cache.end()) {
      torch::Tensor header =
          torch::zeros({kHeaderWords}, torch::TensorOptions().dtype(torch::kInt64).device(device));
      post_receive(lane, header, peer, device);
      const torch::Tensor words = header.cpu();
      const auto* w = words.data_ptr<int64_t>();
      std::vector<int64_t> sizes(w + 2, w + 2 + w[1]);
      known = cache.emplace(key, std::make_pair(sizes, static_cast<torch::ScalarType>(w[0]))).first;
    }
    torch::Tensor t = torch::empty(
        known->second.first, torch::TensorOptions().dtype(known->second.second).device(device));
    post_receive(lane, t, peer, device);
    return t;
  }

  // Evaluation's transfers (on) until it ends (off): every message's shape goes with it, as
  // an evaluation's micro-batches need not be a step's.
  void set_evaluating(bool on) {
    evaluating_ = on;
    evaluation_sent_.clear();
    evaluation_received_.clear();
  }

  // The step's end: every send done (CPU: waited for; CUDA: the current stream waits).
  void end_step() {
    for (auto& [work, tensor, lane] : sending_) {
      if (tensor.is_cuda())
        work->then_on(stream_of(tensor));
      else
        work->wait(lane->timeout());
    }
    sending_.clear();
    DDP_CHECK(handed_.empty(),
              "ddp::Pipeline: {} hand-overs between this rank's stages were "
              "never taken",
              handed_.size());
  }

 private:
  using Key = std::tuple<bool, int, int>;  // activations?, from stage, micro-batch

  static void* stream_of(const torch::Device& device) {
#if DDP_TORCH_CUDA
    if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
    (void)device;
    return nullptr;
  }
  static void* stream_of(const torch::Tensor& t) {
    return stream_of(t.device());
  }

  void post_send(Communicator& lane, const torch::Tensor& t, int peer) {
    check_device(lane, t);
    sending_.push_back({lane.isend(t.data_ptr(), static_cast<size_t>(t.numel()),
                                   collective_type_or_int(t.scalar_type()), peer),
                        t, &lane});
  }
  void post_receive(Communicator& lane, torch::Tensor& t, int peer, const torch::Device& device) {
    check_device(lane, t);
    std::unique_ptr<Work> work = lane.irecv(t.data_ptr(), static_cast<size_t>(t.numel()),
                                            collective_type_or_int(t.scalar_type()), peer);
    if (device.is_cuda())
      work->then_on(ddp::stream_of(device));
    else
      work->wait(lane.timeout());
  }
  static void check_device(Communicator& lane, const torch::Tensor& t) {
    DDP_USAGE_CHECK(t.is_cuda() == lane.device_buffers(),
                    "ddp::Pipeline: a {} tensor, but the world's communicator ({}) carries {} "
                    "tensors; give the module the device ddp::init bound",
                    t.device().str(), lane.backend(), lane.device_buffers() ? "CUDA" : "CPU");
  }
  static DataType collective_type_or_int(torch::ScalarType type) {
    if (type == torch::kInt64) return DataType::kInt64;
    if (type == torch::kInt32) return DataType::kInt32;
    return collective_type(type);
  }

  struct Sending {
    std::unique_ptr<Work> work;
    torch::Tensor tensor;  // kept until the send is done
    Communicator* lane;
  };
  std::map<std::tuple<bool, int, int>, Communicator*> lanes_;
  std::vector<int> stage_rank_;
  int rank_;
  std::map<Key, torch::Tensor> handed_;
  std::map<Key, std::pair<std::vector<int64_t>, torch::ScalarType>> sent_, received_;
  bool evaluating_ = false;
  std::map<Key, std::pair<std::vector<int64_t>, torch::ScalarType>> evaluation_sent_,
      evaluation_received_;
  std::vector<Sending> sending_;
};

// One stage: its modules (the user's), its slots' tensors, and what the executor asks of it.
class TorchStage final : public PipelineStage {
 public:
  // What a step gives every stage: the micro-batches of the input (first stage) and target
  // (last stage), and the loss function.
  struct StepData {
    std::vector<torch::Tensor> inputs, targets;
    const Pipeline::LossFn* loss = nullptr;
    torch::Tensor loss_sum;  // the last stage's, sum over samples
  };

  // `replicas`: the stage's data-parallel group (null: none), over which its gradients are
  // averaged once its `micro_batches` weight gradients of a step are in.
  TorchStage(int stage, int stages, int first_module, std::vector<torch::nn::AnyModule> modules,
             bool recompute, PipelineTransfers& transfers, StepData& step, Communicator* replicas,
             int micro_batches)
      : stage_(stage),
        stages_(stages),
        first_module_(first_module),
        modules_(std::move(modules)),
        recompute_(recompute),
        transfers_(transfers),
        step_(step),
        replicas_(replicas),
        micro_batches_(micro_batches) {}

  // The step's end: the gradients' averages waited for and put back (CUDA: the current stream
  // waits for them).
  void finish_reduction() {
    weight_passes_ = 0;
    for (Reduction& r : reducing_) {
      if (r.flat.is_cuda())
        r.work->then_on(stream_of(r.flat.device()));
      else
        r.work->wait(replicas_->timeout());
      int64_t at = 0;
      torch::NoGradGuard no_grad;
      for (torch::Tensor& g : r.grads) {
        g.copy_(r.flat.narrow(0, at, g.numel()).view_as(g));
        at += g.numel();
      }
    }
    reducing_.clear();
  }

  int first_module() const { return first_module_; }
  int module_count() const { return static_cast<int>(modules_.size()); }
  void set_slots(int slots) { slots_.assign(static_cast<size_t>(slots), Slot{}); }
  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> all;
    for (const torch::nn::AnyModule& m : modules_)
      for (const torch::Tensor& p : m.ptr()->parameters())
        all.push_back(p);
    return all;
  }

  void recv_activation(int micro, int slot) override {
    slots_[slot].input = transfers_.receive(true, stage_ - 1, stage_, micro, device());
  }
  void forward(int micro, int slot) override {
    Slot& s = slots_[slot];
    if (stage_ == 0) s.input = step_.inputs.at(static_cast<size_t>(micro));
    if (recompute_) {
      torch::NoGradGuard no_grad;
      s.outputs = {run(s.input, micro).back()};  // the output alone, for the send
      s.recomputed = false;
      return;
    }
    forward_with_grad(s, micro);
  }
  // Where its modules' parameters are (the first stage's input's device where it has none).
  torch::Device device() const {
    for (const torch::nn::AnyModule& m : modules_) {
      const auto params = m.ptr()->parameters();
      if (!params.empty()) return params.front().device();
    }
    return step_.inputs.empty() ? torch::Device(torch::kCPU) : step_.inputs.front().device();
  }

  // Evaluation: micro-batch `micro` (its `input` on the first stage) through the stage without
  // gradients, received from the stage before and sent on; returns the output.
  torch::Tensor evaluate(int micro, const torch::Tensor& input) {
    const torch::Tensor x =
        stage_ == 0 ? input : transfers_.receive(true, stage_ - 1, stage_, micro, device());
    torch::Tensor out = run(x, micro).back();
    if (stage_ < stages_ - 1) transfers_.send(true, stage_, stage_ + 1, micro, out);
    return out;
  }

  void send_activation(int micro, int slot) override {
    transfers_.send(true, stage_, stage_ + 1, micro, slots_[slot].outputs.back());
    if (recompute_) slots_[slot].outputs.clear();
  }
  void recv_gradient(int micro, int slot) override {
    slots_[slot].grad_out = transfers_.receive(false, stage_ + 1, stage_, micro, device());
  }
  LossSum loss(int micro, int slot, float grad_scale) override {
    Slot& s = slots_[slot];
    ready_for_backward(s, micro);
    const torch::Tensor& target = step_.targets.at(static_cast<size_t>(micro));
    const torch::Tensor l = (*step_.loss)(s.outputs.back(), target);
    DDP_USAGE_CHECK(l.numel() == 1,
                    "ddp::Pipeline: the loss function returned {} values, not "
                    "one (the mean over the micro-batch)",
                    shape_of(l));
    const double samples = static_cast<double>(target.size(0));
    // The micro-batch's share of the batch's mean: its mean times its samples over the batch's.
    s.root = l.reshape({}) * (samples * grad_scale);
    const torch::Tensor sum = l.detach().reshape({}).to(torch::kFloat64) * samples;
    step_.loss_sum = step_.loss_sum.defined() ? step_.loss_sum + sum : sum;
    return {};  // kept on the device, in step_.loss_sum
  }
  void backward(int micro, int slot, bool accumulate,
                const std::function<void(int)>& on_layer_done) override {
    (void)accumulate;  // LibTorch's .grad() adds up, as backward() does
    Slot& s = slots_[slot];
    ready_for_backward(s, micro);
    if (stage_ == stages_ - 1)
      torch::autograd::backward({s.root});
    else
      torch::autograd::backward({s.outputs.back()}, {s.grad_out});
    for (int i = module_count() - 1; on_layer_done && i >= 0; --i)
      on_layer_done(i);
    release(s, stage_ > 0 && s.input.requires_grad() ? s.input.grad() : torch::Tensor());
    weight_pass_done();
  }
  bool splits_backward() const override { return true; }
  void backward_input(int micro, int slot) override {
    // The gradients of the stage's input and of every module's input (and, on the last stage,
    // its output), the graph kept for the weight half.
    Slot& s = slots_[slot];
    ready_for_backward(s, micro);
    const bool last = stage_ == stages_ - 1;
    std::vector<torch::Tensor> wrt;
    std::vector<int> index;  // which of inputs_ (0: the stage's input, i: module i-1's output)
    const int points = module_count() + (last ? 1 : 0);  // the activations before each module
    for (int i = 0; i < points; ++i) {
      const torch::Tensor& a = i == 0 ? s.input : s.outputs[static_cast<size_t>(i - 1)];
      if (a.defined() && a.requires_grad()) {
        wrt.push_back(a);
        index.push_back(i);
      }
    }
    s.grads.assign(static_cast<size_t>(module_count() + 1), torch::Tensor());
    if (!last) s.grads.back() = s.grad_out;
    if (!wrt.empty()) {
      const std::vector<torch::Tensor> g =
          last ? torch::autograd::grad({s.root}, wrt, {}, /*retain_graph=*/true,
                                       /*create_graph=*/false, /*allow_unused=*/true)
               : torch::autograd::grad({s.outputs.back()}, wrt, {s.grad_out},
                                       /*retain_graph=*/true, false, true);
      for (size_t k = 0; k < g.size(); ++k)
        s.grads[static_cast<size_t>(index[k])] = g[k];
    }
    if (stage_ > 0) s.input_grad = s.grads[0];
  }
  void backward_weight(int micro, int slot, bool accumulate,
                       const std::function<void(int)>& on_layer_done) override {
    (void)micro, (void)accumulate;
    Slot& s = slots_[slot];
    // Each module's parameters from its output's gradient, last module first; the graph freed
    // as it goes (a module's part is not needed by the ones before it).
    for (int i = module_count() - 1; i >= 0; --i) {
      std::vector<torch::Tensor> params;
      for (const torch::Tensor& p : modules_[static_cast<size_t>(i)].ptr()->parameters())
        if (p.requires_grad()) params.push_back(p);
      const torch::Tensor& out = s.outputs[static_cast<size_t>(i)];
      const torch::Tensor& g = s.grads[static_cast<size_t>(i + 1)];
      if (!params.empty() && out.requires_grad() && g.defined())
        torch::autograd::backward({out}, {g}, /*retain_graph=*/true, /*create_graph=*/false,
                                  params);
      if (on_layer_done) on_layer_done(i);
    }
    release(s, s.input_grad);
    weight_pass_done();
  }
  void send_gradient(int micro, int slot) override {
    Slot& s = slots_[slot];
    DDP_CHECK(s.input_grad.defined(),
              "ddp::Pipeline: stage {} has no gradient of its input for "
              "micro-batch {} (does its first module use its input?)",
              stage_, micro);
    transfers_.send(false, stage_, stage_ - 1, micro, s.input_grad);
    s.input_grad = torch::Tensor();
    if (!s.grads.empty()) s.grads.front() = torch::Tensor();
  }

 private:
  struct Slot {
    torch::Tensor input;                 // the stage's input (received: a leaf needing its grad)
    std::vector<torch::Tensor> outputs;  // each module's output (recomputed: the last alone)
    bool recomputed = true;              // outputs hold the graph for backward
    torch::Tensor grad_out;              // the gradient of the output (not the last stage)
    torch::Tensor root;                  // the last stage's scaled loss
    std::vector<torch::Tensor> grads;    // split backward: each activation's gradient
    torch::Tensor input_grad;            // what send_gradient sends
  };

  // Every module in turn, each output kept; a module that refuses its input is named with the
  // input's shape and where it came from.
  std::vector<torch::Tensor> run(const torch::Tensor& input, int micro) {
    std::vector<torch::Tensor> outputs;
    torch::Tensor x = input;
    for (size_t i = 0; i < modules_.size(); ++i) {
      try {
        x = modules_[i].forward(x);
      } catch (const c10::Error& e) {
        const std::string first_line =
            std::string(e.what_without_backtrace())
                .substr(0, std::string(e.what_without_backtrace()).find('\n'));
        throw UsageError(fmt::format(
            "ddp::Pipeline: module {} (stage {}'s {}) refused its input {} of micro-batch {}{}: "
            "{}",
            first_module_ + static_cast<int>(i), stage_, i == 0 ? "first" : "next", shape_of(x),
            micro,
            i > 0 ? std::string(", module ") + std::to_string(first_module_ + i - 1) + "'s output"
            : stage_ > 0 ? ", received from stage " + std::to_string(stage_ - 1)
                         : std::string(", the step's input"),
            first_line));
      }
      outputs.push_back(x);
    }
    return outputs;
  }
  void forward_with_grad(Slot& s, int micro) {
    // A received activation of floats is a leaf whose gradient the stage before waits for.
    if (stage_ > 0 && s.input.is_floating_point()) s.input = s.input.detach().requires_grad_(true);
    s.outputs = run(s.input, micro);
    s.recomputed = true;
  }
  // With recomputation: the forward again, with gradients, before the first backward action.
  void ready_for_backward(Slot& s, int micro) {
    if (!s.recomputed) forward_with_grad(s, micro);
  }
  // The micro-batch's backward done: every tensor let go (its graph with them) but the input's
  // gradient `keep`, which send_gradient sends.
  static void release(Slot& s, torch::Tensor keep) {
    s = Slot{};
    s.input_grad = std::move(keep);
  }

  // One weight gradient of the step's micro-batches written; after the last, the stage's
  // gradients start on their way to their average over the replicas (the rest of the schedule
  // runs meanwhile), one flat copy a dtype.
  void weight_pass_done() {
    if (++weight_passes_ < micro_batches_ || replicas_ == nullptr || replicas_->size() == 1) return;
    std::map<torch::ScalarType, Reduction> by_dtype;
    for (const torch::Tensor& p : parameters()) {
      if (!p.requires_grad()) continue;
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);  // unused: its part zero
      by_dtype[p.scalar_type()].grads.push_back(p.grad());
    }
    for (auto& [dtype, r] : by_dtype) {
      std::vector<torch::Tensor> flat;
      for (const torch::Tensor& g : r.grads)
        flat.push_back(g.reshape({-1}));
      r.flat = torch::cat(flat);
      const ComputeStreamGuard on_stream(*replicas_, stream_of(r.flat.device()));
      r.work = replicas_->all_reduce_async(r.flat.data_ptr(), static_cast<size_t>(r.flat.numel()),
                                           collective_type(dtype), ReduceOp::kAverage);
      reducing_.push_back(std::move(r));
    }
  }

  struct Reduction {
    std::vector<torch::Tensor> grads;  // the parameters' .grad(), in order
    torch::Tensor flat;                // their copy, averaged in place
    std::unique_ptr<Work> work;
  };

  int stage_, stages_, first_module_;
  std::vector<torch::nn::AnyModule> modules_;
  bool recompute_;
  PipelineTransfers& transfers_;
  StepData& step_;
  Communicator* replicas_;
  int micro_batches_;
  int weight_passes_ = 0;  // of this step
  std::vector<Reduction> reducing_;
  std::vector<Slot> slots_;
};

class Pipeline::Impl final : public PipelineRank {
 public:
  // `owned`: the communicators made for it (kept as long as it is).
  Impl(torch::nn::Sequential model, Communicator& group, Communicator* replicas,
       const PipelineOptions& options, std::vector<std::unique_ptr<Communicator>> owned)
      : model_(std::move(model)),
        group_(group),
        replicas_(replicas),
        options_(options),
        owned_(std::move(owned)) {
    const int ranks = group.size();
    const int rank = group.rank();
    const auto schedule = schedule_from_name(options.schedule());
    DDP_USAGE_CHECK(schedule.has_value(),
                    "PipelineOptions::schedule '{}': expected gpipe, 1f1b, interleaved-1f1b, zb-h1 "
                    "or zb-v",
                    options.schedule());
    DDP_USAGE_CHECK(*schedule != PipelineSchedule::kPairs,
                    "PipelineOptions::schedule 'pairs': ddptrain's test schedule; expected gpipe, "
                    "1f1b, interleaved-1f1b, zb-h1 or zb-v");
    schedule_ = *schedule;
    const int modules = static_cast<int>(model_->size());
    const int m = options.micro_batches();
    DDP_USAGE_CHECK(m >= 1, "PipelineOptions::micro_batches {}: expected 1 or more", m);
    const int asked = options.stages_per_rank();
    if (schedule_ == PipelineSchedule::kZeroBubbleV)
      DDP_USAGE_CHECK(asked == 0 || asked == 2,
                      "PipelineOptions::stages_per_rank {}: zb-v runs exactly 2 stages a rank (its "
                      "V); give 2 or leave it out",
                      asked);
    else if (schedule_ != PipelineSchedule::kInterleaved)
      DDP_USAGE_CHECK(asked <= 1,
                      "PipelineOptions::stages_per_rank {}: the {} schedule runs one stage a rank; "
                      "give schedule interleaved-1f1b or zb-v for more",
                      asked, options.schedule());
    DDP_USAGE_CHECK(asked >= 0, "PipelineOptions::stages_per_rank {}: expected 0 or more", asked);
    if (schedule_ == PipelineSchedule::kInterleaved)
      DDP_USAGE_CHECK(ranks == 1 || m % ranks == 0,
                      "PipelineOptions::micro_batches {}: interleaved-1f1b takes micro-batches in "
                      "groups of the {} pipeline ranks; give a multiple of {}",
                      m, ranks, ranks);
    chunks_ = schedule_chunks(schedule_, asked, ranks, std::max(modules, ranks * 2), m);
    const int stages = ranks * chunks_;
    DDP_USAGE_CHECK(modules >= stages,
                    "ddp::Pipeline: {} stages ({} ranks x {} a rank) but the Sequential has {} "
                    "modules (each stage holds at least one)",
                    stages, ranks, chunks_, modules);
    // The stages' modules.
    std::vector<int> balance = options.balance();
    if (balance.empty())
      for (int s = 0; s < stages; ++s)
        balance.push_back(modules / stages + (s < modules % stages ? 1 : 0));
    DDP_USAGE_CHECK(static_cast<int>(balance.size()) == stages,
                    "PipelineOptions::balance: {} entries for {} stages ({} ranks x {} a rank)",
                    balance.size(), stages, ranks, chunks_);
    for (int b : balance)
      DDP_USAGE_CHECK(b >= 1, "PipelineOptions::balance: a stage of {} modules (at least 1)", b);
    DDP_USAGE_CHECK(std::accumulate(balance.begin(), balance.end(), 0) == modules,
                    "PipelineOptions::balance: {} modules in all, but the Sequential has {}",
                    std::accumulate(balance.begin(), balance.end(), 0), modules);
    bounds_.push_back(0);
    for (int b : balance)
      bounds_.push_back(bounds_.back() + b);
    stage_rank_ = stage_ranks(schedule_, ranks, chunks_);
    // A communicator a flow, direction and peer (the simulator's lanes), split from the group
    // the same way on every rank.
    const std::map<PipelineLane, int> lanes = pipeline_lanes(stage_rank_);
    int numbers = 0;
    for (const auto& [lane, number] : lanes)
      numbers = std::max(numbers, number + 1);
    for (int k = 0; k < numbers; ++k)
      lane_comms_.push_back(group.split(0, rank));
    std::map<std::tuple<bool, int, int>, Communicator*> by_flow;
    for (const auto& [lane, number] : lanes)
      by_flow[{lane.activations, lane.from, lane.to}] =
          lane_comms_[static_cast<size_t>(number)].get();
    transfers_ = std::make_unique<PipelineTransfers>(std::move(by_flow), stage_rank_, rank);
    // This rank's stages, in order, and the executor over them.
    std::vector<StagePlace> places;
    for (int s = 0; s < stages; ++s) {
      if (stage_rank_[static_cast<size_t>(s)] != rank) continue;
      std::vector<torch::nn::AnyModule> mine;
      for (int i = bounds_[s]; i < bounds_[s + 1]; ++i)
        mine.push_back(*(model_->begin() + i));
      stages_.push_back(std::make_unique<TorchStage>(s, stages, bounds_[s], std::move(mine),
                                                     options.recompute(), *transfers_, data_,
                                                     replicas_, m));
      places.push_back({s, stages, m, bounds_[s + 1] - bounds_[s]});
      stage_index_.push_back(s);
    }
    executor_ = std::make_unique<ScheduleExecutor>(
        plan_rank_schedule(schedule_, rank, ranks, chunks_, m), places);
    for (auto& s : stages_)
      s->set_slots(executor_->slots());
    if (rank == 0 && replica() == 0) spdlog::info("{}", describe());
  }

  // PipelineRank
  bool on_gpu() const override { return false; }  // the host's clock times the actions
  PipelineStage& chunk(int c) override { return *stages_.at(static_cast<size_t>(c)); }
  float* grads() override { return nullptr; }  // no data-parallel reducer here
  void* stream() override { return nullptr; }
  void end_schedule() override {
    transfers_->end_step();
    for (auto& s : stages_)
      s->finish_reduction();
  }

  torch::Tensor step(const torch::Tensor& input, const torch::Tensor& target, const LossFn& loss) {
    const int m = options_.micro_batches();
    data_ = {};
    data_.loss = &loss;
    int64_t batch = 0;
    if (has_first()) {
      DDP_USAGE_CHECK(input.defined() && input.dim() >= 1 && input.size(0) >= m,
                      "ddp::Pipeline::step: the input ({}) must have at least micro_batches {} "
                      "samples along dimension 0",
                      input.defined() ? shape_of(input) : "undefined", m);
      data_.inputs = input.tensor_split(m, 0);
    }
    if (has_last()) {
      DDP_USAGE_CHECK(target.defined() && target.dim() >= 1 && target.size(0) >= m,
                      "ddp::Pipeline::step: the target ({}) must have at least micro_batches {} "
                      "samples along dimension 0",
                      target.defined() ? shape_of(target) : "undefined", m);
      data_.targets = target.tensor_split(m, 0);
      batch = target.size(0);
    }
    StepStats stats;
    Stopwatch clock;
    executor_->run(*this, nullptr, timeline_, steps_ + 1,
                   batch > 0 ? static_cast<float>(1.0 / static_cast<double>(batch)) : 0.0f, &stats);
    ++steps_;
    torch::Tensor mean;
    if (has_last()) mean = (data_.loss_sum / static_cast<double>(batch)).to(torch::kFloat32);
    data_ = {};
    if (steps_ == 2) {
      step_s_ = clock.seconds();
      if (group_.rank() == 0 && replica() == 0) spdlog::info("ddp::Pipeline: {}", report());
    }
    return mean;
  }

  torch::Tensor forward(const torch::Tensor& input) {
    torch::NoGradGuard no_grad;
    const int m = options_.micro_batches();
    std::vector<torch::Tensor> inputs;
    if (has_first()) {
      DDP_USAGE_CHECK(input.defined() && input.dim() >= 1 && input.size(0) >= 1,
                      "ddp::Pipeline::forward: the input ({}) has no samples along dimension 0",
                      input.defined() ? shape_of(input) : "undefined");
      inputs = input.tensor_split(std::min<int64_t>(m, input.size(0)), 0);
    }
    // The micro-batch count, from the first stage's rank (its input's samples may be fewer
    // than micro_batches).
    const int chunks = has_first() ? static_cast<int>(inputs.size()) : 0;
    int count = chunks;
    {
      torch::Tensor n = torch::tensor({static_cast<int32_t>(count)}, torch::kInt32);
      const bool device = group_.device_buffers();
      if (device) n = n.to(stages_.front()->device());
      group_.all_reduce(n.data_ptr(), 1, DataType::kInt32, ReduceOp::kMax);
      count = n.cpu().item<int32_t>();
    }
    // Each micro-batch through this rank's stages in order (a stage waits only for a lower
    // stage of the same micro-batch or an earlier micro-batch: no cycle); sends not waited for.
    transfers_->set_evaluating(true);
    std::vector<torch::Tensor> outputs;
    for (int micro = 0; micro < count; ++micro)
      for (auto& stage : stages_) {
        torch::Tensor out = stage->evaluate(
            micro, has_first() ? inputs[static_cast<size_t>(micro)] : torch::Tensor());
        if (stage.get() == stages_.back().get() && has_last()) outputs.push_back(out);
      }
    transfers_->end_step();
    transfers_->set_evaluating(false);
    return has_last() ? torch::cat(outputs) : torch::Tensor();
  }

  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> all;
    for (const auto& s : stages_)
      for (const torch::Tensor& p : s->parameters())
        all.push_back(p);
    return all;
  }
  const std::vector<int>& stages() const { return stage_index_; }
  int replica() const { return replicas_ ? replicas_->rank() : 0; }
  int replicas() const { return replicas_ ? replicas_->size() : 1; }
  bool has_first() const { return stage_index_.front() == 0; }
  bool has_last() const { return stage_index_.back() == static_cast<int>(stage_rank_.size()) - 1; }

  std::string describe() const {
    std::string cut;
    for (size_t s = 0; s + 1 < bounds_.size(); ++s)
      cut += fmt::format("{}{}", s ? ", " : "",
                         bounds_[s + 1] - bounds_[s] == 1
                             ? std::to_string(bounds_[s])
                             : fmt::format("{}-{}", bounds_[s], bounds_[s + 1] - 1));
    std::string mine;
    for (size_t k = 0; k < stage_index_.size(); ++k)
      mine += fmt::format("{}{}",
                          k == 0                         ? ""
                          : k + 1 == stage_index_.size() ? " and "
                                                         : ", ",
                          stage_index_[k]);
    return fmt::format(
        "{} over {} ranks, {} stages (modules {}), {} micro-batches{}{}; rank {} runs stage{} {}",
        schedule_name(schedule_), group_.size(), stage_rank_.size(), cut, options_.micro_batches(),
        options_.recompute() ? ", recomputing activations" : "",
        replicas() > 1 ? fmt::format("; {} replicas (data parallel)", replicas()) : "",
        group_.rank(), stage_index_.size() > 1 ? "s" : "", mine);
  }

  std::string report() const {
    SimCosts costs;
    costs.forward = 2;
    costs.backward = 4;
    costs.backward_input = 2;
    costs.backward_weight = 2;
    costs.lane_per_direction = true;
    costs.lane_per_peer = true;
    costs.recompute = options_.recompute();
    const SimResult sim =
        simulate_plan(schedule_, group_.size(), chunks_, options_.micro_batches(), costs);
    std::string line =
        sim.ok ? fmt::format("the simulator's bubble {:.1f} % (unit costs, F = B = 2 W)",
                             100.0 * sim.bubble)
               : "the simulator refused the schedule: " + sim.error;
    if (step_s_ > 0) line += fmt::format("; step {:.1f} ms (the second, measured)", 1e3 * step_s_);
    return line;
  }

 private:
  torch::nn::Sequential model_;
  Communicator& group_;
  Communicator* replicas_;
  PipelineOptions options_;
  std::vector<std::unique_ptr<Communicator>> owned_;
  PipelineSchedule schedule_ = PipelineSchedule::kOneForwardOneBackward;
  int chunks_ = 1;
  std::vector<int> bounds_;      // stage s holds modules [bounds_[s], bounds_[s + 1])
  std::vector<int> stage_rank_;  // stage s runs on pipeline rank stage_rank_[s]
  std::vector<std::unique_ptr<Communicator>> lane_comms_;
  std::unique_ptr<PipelineTransfers> transfers_;
  TorchStage::StepData data_;
  std::vector<std::unique_ptr<TorchStage>> stages_;
  std::vector<int> stage_index_;
  std::unique_ptr<ScheduleExecutor> executor_;
  TimelineRecorder timeline_{false};
  int64_t steps_ = 0;
  double step_s_ = 0;
};

Pipeline::Pipeline(torch::nn::Sequential model, World& world, const PipelineOptions& options) {
  const int replicas = options.data_parallel();
  Communicator& comm = world.comm();
  DDP_USAGE_CHECK(replicas >= 1 && comm.size() % replicas == 0,
                  "PipelineOptions::data_parallel {}: expected a divisor of the world's {} ranks",
                  replicas, comm.size());
  if (replicas == 1) {
    impl_ = std::make_unique<Impl>(std::move(model), comm, nullptr, options,
                                   std::vector<std::unique_ptr<Communicator>>{});
    return;
  }
  // Rank r: pipeline rank r % P of replica r / P (a replica's ranks side by side).
  const int pipe_ranks = comm.size() / replicas;
  std::vector<std::unique_ptr<Communicator>> owned;
  owned.push_back(comm.split(comm.rank() / pipe_ranks, comm.rank() % pipe_ranks));
  owned.push_back(comm.split(comm.rank() % pipe_ranks, comm.rank() / pipe_ranks));
  Communicator& group = *owned[0];
  Communicator* dp = owned[1].get();
  impl_ = std::make_unique<Impl>(std::move(model), group, dp, options, std::move(owned));
}

Pipeline::Pipeline(torch::nn::Sequential model, Communicator& group, Communicator* replicas,
                   const PipelineOptions& options)
    : impl_(std::make_unique<Impl>(std::move(model), group, replicas, options,
                                   std::vector<std::unique_ptr<Communicator>>{})) {}

Pipeline::~Pipeline() = default;

torch::Tensor Pipeline::step(const torch::Tensor& input, const torch::Tensor& target,
                             const LossFn& loss) {
  return impl_->step(input, target, loss);
}

torch::Tensor Pipeline::forward(const torch::Tensor& input) {
  return impl_->forward(input);
}

std::vector<torch::Tensor> Pipeline::parameters() const {
  return impl_->parameters();
}

std::vector<int> Pipeline::stages() const {
  return impl_->stages();
}

int Pipeline::replica() const {
  return impl_->replica();
}

int Pipeline::replicas() const {
  return impl_->replicas();
}

bool Pipeline::has_first() const {
  return impl_->has_first();
}

bool Pipeline::has_last() const {
  return impl_->has_last();
}

std::string Pipeline::describe() const {
  return impl_->describe();
}

std::string Pipeline::report() const {
  return impl_->report();
}

}  // namespace ddp
