// ddp::Pipeline's stage (torch/pipeline.h): a run of the user's modules as engine/pipeline's
// PipelineStage, its micro-batches' tensors in the executor's slots, backward whole or in the
// zero-bubble schedules' two halves, and the average of its gradients over the replicas (a
// ddp::DistributedDataParallel of the stage's modules over them: its buckets, hooks and bf16).
// Internal to torch/pipeline.cpp.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/error.h"
#include "torch/clip_grad.h"
#include "torch/comm_hooks.h"
#include "torch/ddp_impl.h"
#include "torch/distributed_data_parallel.h"

#if DDP_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <fmt/format.h>

#include "engine/pipeline/stage.h"
#include "torch/pipeline.h"
#include "torch/pipeline_transfers.h"

namespace ddp {

// A stage's modules as one module, under their names in the whole Sequential ("3.weight"): what
// its data-parallel wrapper wraps.
struct StageModulesImpl : torch::nn::Module {
  StageModulesImpl(int first, const std::vector<torch::nn::AnyModule>& modules) {
    for (size_t i = 0; i < modules.size(); ++i)
      register_module(std::to_string(first + static_cast<int>(i)), modules[i].ptr());
  }
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
  // averaged by a DistributedDataParallel of its modules with `data_parallel` (collective over
  // the replicas: the wrapper gives them replica 0's parameters): the micro-batches' backwards
  // but the step's last under no_sync, the last one's buckets going out as its gradients are
  // written, while the schedule goes on, and waited for at the step's end.
  TorchStage(int stage, int stages, int first_module, std::vector<torch::nn::AnyModule> modules,
             bool recompute, PipelineTransfers& transfers, StepData& step, Communicator* replicas,
             int micro_batches, const DistributedDataParallelOptions& data_parallel)
      : stage_(stage),
        stages_(stages),
        first_module_(first_module),
        modules_(std::move(modules)),
        recompute_(recompute),
        transfers_(transfers),
        step_(step),
        micro_batches_(micro_batches) {
    bool trains = false;
    for (const torch::Tensor& p : parameters())
      trains = trains || p.requires_grad();
    if (replicas == nullptr || replicas->size() == 1 || !trains) return;
    stage_module_ = std::make_shared<StageModulesImpl>(first_module_, modules_);
    replicated_ =
        std::make_unique<DistributedDataParallel>(*stage_module_, *replicas, data_parallel);
    replicated_->impl_->manual_end = true;
  }

  // The stage's data-parallel wrapper (null: no replicas, or nothing to train).
  DistributedDataParallel* replicated() { return replicated_.get(); }

  // A step begins (collective over the replicas): the wrapper's sync_buffers(), as before a
  // forward of one's own.
  void begin_step() {
    if (replicated_) replicated_->sync_buffers();
  }

  // An evaluation begins (collective over the replicas): under ZeRO the owners' parameters
  // gathered (gather_parameters()), as before a forward of one's own.
  void begin_evaluation() {
    if (replicated_) replicated_->gather_parameters();
  }

  // The step's end: the last backward's reduction ended and waited for (CUDA: the current
  // stream waits for it), the averages in each parameter's .grad().
  void finish_reduction() {
    weight_passes_ = 0;
    if (!replicated_) return;
    DistributedDataParallel::Impl& impl = *replicated_->impl_;
    impl.no_sync = false;
    // No parameter got a gradient in the last backward: its end names them.
    if (!impl.in_backward) impl.begin_backward();
    impl.end_backward();
  }

  // This stage's part of the gradient norm (Pipeline::clip_grad_norm_): its parameters'
  // gradients, combined over its replicas where ZeRO shards them among the replicas
  // (collective over the replicas then; each replica of a plain stage holds them all).
  double norm_part(double norm_type) const {
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : parameters())
      grads.push_back(p.grad());
    const double part = gradient_norm_part(grads, norm_type);
    if (!replicated_ || !replicated_->impl_->shards) return part;
    return replicated_->impl_->norm_parts(part, norm_type);
  }

  int first_module() const { return first_module_; }
  int module_count() const { return static_cast<int>(modules_.size()); }
  // Module i's own module (of the model's module first_module() + i).
  torch::nn::Module& module(int i) const { return *modules_[static_cast<size_t>(i)].ptr(); }
  void set_slots(int slots) { slots_.assign(static_cast<size_t>(slots), Slot{}); }
  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> all;
    for (const torch::nn::AnyModule& m : modules_)
      for (const torch::Tensor& p : m.ptr()->parameters())
        all.push_back(p);
    return all;
  }

  // The schedule's UNSHARD and RESHARD (add_unshard_reshard, where the stage's wrapper has
  // shard units): the stage's units gathered once for the step's micro-batches, freed after the
  // stage's last use of its parameters (as torchtitan's FSDP under pipelining, which keeps them
  // between micro-batches: gathering at each use would send each unit 2 x micro-batches times).
  void unshard(ActionKind, int, int) override {
    if (replicated_) replicated_->unshard();
  }
  void reshard() override {
    if (replicated_) replicated_->reshard();
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
    reduce_this_pass();
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
    reduce_this_pass();
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
  // The step's weight passes counted: the last one's gradients are reduced (its buckets go out
  // as its gradients are written), the others accumulate under no_sync.
  void reduce_this_pass() {
    if (replicated_) replicated_->impl_->no_sync = weight_passes_ + 1 < micro_batches_;
  }
  void weight_pass_done() { ++weight_passes_; }

  int stage_, stages_, first_module_;
  std::vector<torch::nn::AnyModule> modules_;
  bool recompute_;
  PipelineTransfers& transfers_;
  StepData& step_;
  int micro_batches_;
  int weight_passes_ = 0;                           // of this step
  std::shared_ptr<StageModulesImpl> stage_module_;  // what replicated_ wraps (outlives it)
  std::unique_ptr<DistributedDataParallel> replicated_;
  std::vector<Slot> slots_;
};

}  // namespace ddp
