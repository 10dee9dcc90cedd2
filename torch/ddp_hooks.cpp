// DistributedDataParallel's hooks on each parameter's gradient: on its accumulator (when the
// gradient is written), on the tensor itself (finding the accumulator torch::load replaced), and
// the refusal of a second backward in one step.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cstdio>

#include "runtime/error.h"
#include "torch/ddp_impl.h"

namespace ddp {

// Each parameter's .grad() a view of its bucket, and a hook on its gradient accumulator that
// tells when its gradient is written.
void DistributedDataParallel::Impl::point_grads_at_buckets() {
  for (size_t i = 0; i < params.size(); ++i) {
    attach(i);
    watch_for_replacement(i);
  }
}

namespace {

// A hook on a parameter's gradient itself (not on its accumulator): LibTorch keeps it in the
// tensor's autograd metadata, which torch::load's set_ leaves in place, and every gradient
// accumulator of the tensor, the one made after a load too, calls it before it writes .grad().
class ReplacementWatch : public torch::autograd::FunctionPreHook {
 public:
  ReplacementWatch(std::shared_ptr<std::function<void(size_t)>> owner, size_t index)
      : owner_(std::move(owner)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (*owner_) (*owner_)(index_);
    return grads;
  }

 private:
  std::shared_ptr<std::function<void(size_t)>> owner_;
  size_t index_;
};

}  // namespace

// The parameter's accumulator can be replaced (torch::load) where nothing of the wrapper runs
// before the next backward (a forward of one's own, no sync_buffers(): a module without buffers
// may): its own gradient hook finds the new accumulator as it starts to run. Every parameter's
// hook moves to its new accumulator then; the running one's post hooks were looked up before it
// ran in LibTorch 1.13's engine (2.x looks after the tensor's hooks), so there its gradient is
// reduced at the end of backward (reattached).
void DistributedDataParallel::Impl::watch_for_replacement(size_t index) {
  // A unique_ptr: LibTorch 2.x takes one, 1.13 a shared_ptr made from it.
  torch::autograd::impl::add_hook(params[index].tensor,
                                  std::make_unique<ReplacementWatch>(alive, index));
}

void DistributedDataParallel::Impl::watch_hit(size_t index) {
  if (hooked(params[index])) return;
  if (!in_backward && !no_sync)
    begin_backward();  // re-attaches, this backward's (reattached), and ends it
  else
    reattach_replaced();
}

// ZeRO re-set parameter `index`'s tensor (a view into its owner's flat tensor, or empty):
// LibTorch gave it a new gradient accumulator, which gets the hook.
void DistributedDataParallel::Impl::moved(size_t index) {
  Param& p = params[index];
  if (!p.accumulator) return;  // not hooked yet (construction)
  p.accumulator->del_post_hook(p.hook);
  attach(index);
}

// A hook on the parameter's gradient accumulator (the autograd node that writes its .grad()).
void DistributedDataParallel::Impl::attach(size_t index) {
  Param& p = params[index];
  p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
  DDP_CHECK(p.accumulator != nullptr, "parameter '{}' has no gradient accumulator", p.name);
  p.hook = p.accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [this, index](const torch::autograd::variable_list& outputs,
                    const torch::autograd::variable_list&) {
        on_gradient(index);
        return outputs;
      }));
}

// torch::load(module, file) replaces each parameter's data with Tensor::set_, and LibTorch then
// drops the parameter's gradient accumulator: the hooks on the old one would never fire again
// and the ranks would train apart with no message. A parameter whose accumulator is not the one
// hooked gets the hook on its new one (same shape, dtype and device, or it is refused: its
// slot in the buckets would be wrong). Comparing the owners of the weak and the strong pointer
// takes no lock, so this runs before every forward.
void DistributedDataParallel::Impl::reattach_replaced() {
  std::vector<std::string> moved;
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = params[i];
    if (hooked(p)) continue;
    DDP_USAGE_CHECK(p.tensor.sizes() == torch::IntArrayRef(p.sizes) &&
                        p.tensor.scalar_type() == p.dtype && p.tensor.device() == device,
                    "ddp::DistributedDataParallel: parameter '{}' was replaced by a tensor of "
                    "another shape, dtype or device ({}) since the wrapper was made; load "
                    "(torch::load) a model of the same layout, or construct the wrapper after it",
                    p.name, describe(p.tensor));
    p.accumulator->del_post_hook(p.hook);
    attach(i);
    if (shards) shards->take_back(i);  // the loaded values into its owner's flat tensor
    p.reattached = in_backward;
    moved.push_back(p.name);
  }
  if (moved.empty()) return;
  std::fprintf(stderr,
               "ddp::DistributedDataParallel: %zu parameter(s) (first '%s') got new tensors since "
               "the wrapper was made (torch::load does this): their gradients are reduced from "
               "now on; every rank must load the same values, as they are not broadcast again\n",
               moved.size(), moved[0].c_str());
}

// Whether the parameter's gradient accumulator is the one its hook is on.
bool DistributedDataParallel::Impl::hooked(const Param& p) const {
  const auto* meta = torch::autograd::impl::get_autograd_meta(p.tensor);
  return meta != nullptr && !meta->grad_accumulator_.owner_before(p.accumulator) &&
         !p.accumulator.owner_before(meta->grad_accumulator_) && !meta->grad_accumulator_.expired();
}

// A backward that starts after a synchronised one with neither a forward through the wrapper
// (forward(), sync_buffers()) nor an update of any parameter (optimizer.step()) in between is a
// second backward of one step: its all-reduces would pair with the other ranks' next step
// and the replicas would part from then on (PyTorch: "mark a variable ready only once").
void DistributedDataParallel::Impl::refuse_a_second_backward(size_t index) const {
  if (!backward_done || forward_seen) return;
  // An optimizer step changes the parameters, though not always their version (LibTorch
  // 1.13's SGD steps .data()); zero_grad() changes or drops the gradients. Parameter `index`'s
  // own gradient was just accumulated, by this backward.
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    if (p.tensor._version() != p.version) return;
    if (i == index) continue;
    const torch::Tensor& grad = p.tensor.grad();
    if ((grad.defined() ? grad.unsafeGetTensorImpl() : nullptr) != p.grad ||
        (grad.defined() && grad._version() != p.grad_version))
      return;
  }
  throw UsageError(fmt::format(
      "ddp::DistributedDataParallel: parameter '{}' got a second gradient in one step: a second "
      "backward ran after the synchronised one with no forward and no optimizer step in between; "
      "its all-reduce would pair with the other ranks' next step. Sum the losses and call "
      "backward once, or run the earlier backwards under model.no_sync()",
      params[index].name));
}

}  // namespace ddp
