// ddp::checkpoint: activation checkpointing for LibTorch (torch.utils.checkpoint's non-reentrant
// semantics, which LibTorch lacks): a block's forward runs without keeping its activations, and
// its backward runs the forward again to have them, trading compute for memory.
//
//   struct BlockImpl : torch::nn::Module { ... torch::Tensor forward(torch::Tensor x); };
//   TORCH_MODULE(Block);
//   ...  in the model's forward:
//   for (auto& block : blocks) x = ddp::checkpoint(block, x);   // instead of block->forward(x)
//
// or a module declared in place of the block (PyTorch's checkpoint_wrapper), its parameters
// under their own names:
//
//   torch::nn::Sequential net(..., ddp::CheckpointWrapper(Block(256)), ...);
//   ddp::ShardUnit(ddp::CheckpointWrapper(Block(256)))    // with shard units: inside the unit
//
// or, for any function of tensors, with every parameter it reads that needs a gradient:
//
//   auto out = ddp::checkpoint([&](const torch::autograd::variable_list& in) {
//     return torch::autograd::variable_list{mlp->forward(torch::gelu(in[0]) + in[1])};
//   }, {x, skip}, mlp->parameters());
//
// Each call keeps only its inputs (and the random number generators' states); the outputs are
// the same values as without it, and backward gives the same gradients: the recompute runs with
// the CPU's and the inputs' CUDA devices' generators put back where they were at the forward (a
// dropout inside draws the same mask) and under the forward's autocast state. The parameters'
// gradients reach them once, through the one backward the program runs, so that
// ddp::DistributedDataParallel's hooks see each gradient ready once (plain, ZeRO, shard units:
// a unit inside is gathered again for the recompute) and ddp::Pipeline's split backward works.
//
// Not supported (as with PyTorch's reentrant variant): a second-order gradient through it
// (create_graph), and a tensor that needs a gradient read by the function from outside without
// being among its inputs or parameters: a parameter read so is refused by name and shape at the
// backward; a non-leaf tensor read so is found on the CPU and refused; pass it as an input.
#pragma once

#include <torch/arg.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "torch/wrapped_module.h"

namespace ddp {

// torch.utils.checkpoint's options that apply here.
struct CheckpointOptions {
  // The generators put back for the recompute (PyTorch's preserve_rng_state): false saves
  // their state's copy and restore when the function draws no random numbers.
  TORCH_ARG(bool, preserve_rng_state) = true;
};

// A checkpointed function: its outputs (tensors) from its inputs.
using CheckpointedFunction =
    std::function<torch::autograd::variable_list(const torch::autograd::variable_list&)>;

// fn(inputs) without its activations kept (the top of this file). `parameters`: every tensor
// fn reads besides its inputs that needs a gradient (a module's parameters()).
torch::autograd::variable_list checkpoint(CheckpointedFunction fn,
                                          const torch::autograd::variable_list& inputs,
                                          const std::vector<torch::Tensor>& parameters,
                                          const CheckpointOptions& options = {});

namespace detail {

// Whether this thread is running a checkpointed function again in a backward: a shard unit
// inside is then kept gathered after its forward, as its backward follows at once.
bool recomputing();

// Used by checkpoint(module, inputs...): module->forward(in[0], in[1], ...).
template <typename Holder, size_t... I>
torch::autograd::variable_list call_forward(const Holder& module,
                                            const torch::autograd::variable_list& in,
                                            std::index_sequence<I...>) {
  return {torch::Tensor(module.ptr()->forward(in[I]...))};
}

}  // namespace detail

// module->forward(inputs...) without its activations kept, for a module holder (a
// TORCH_MODULE, a Sequential, ...) whose forward takes tensors and returns one; its
// parameters are the module's. The holder is copied (it shares the module) for the recompute.
template <typename Holder, typename... Tensors,
          typename = std::enable_if_t<(std::is_convertible_v<Tensors, torch::Tensor> && ...)>>
torch::Tensor checkpoint(const Holder& module, const Tensors&... inputs) {
  static_assert(sizeof...(Tensors) > 0, "ddp::checkpoint(module, inputs...): no input given");
  CheckpointedFunction fn = [module](const torch::autograd::variable_list& in) {
    return detail::call_forward(module, in, std::index_sequence_for<Tensors...>{});
  };
  return checkpoint(std::move(fn), {torch::Tensor(inputs)...}, module.ptr()->parameters())[0];
}

// A module whose forward is the wrapped module's through ddp::checkpoint (PyTorch's
// checkpoint_wrapper), declared in place of it: its parameters, buffers and children under their
// own names. Inside a ddp::ShardUnit, not around one (the unit would not be found: wrap the
// other way round, or call ddp::checkpoint(unit, x) in the forward).
class CheckpointWrapperImpl : public WrappedModule {
 public:
  // Wraps `module` (a holder: TORCH_MODULE(Block)'s Block, a Sequential, torch::nn::Linear).
  template <typename Holder, typename = decltype(std::declval<Holder&>().ptr())>
  explicit CheckpointWrapperImpl(Holder module, CheckpointOptions options = {})
      : WrappedModule(module.ptr(), wrap(module.ptr())), options_(options) {
    refuse_a_unit();
  }
  // Wraps a shared_ptr of a module.
  template <typename Module,
            typename = std::enable_if_t<std::is_base_of_v<torch::nn::Module, Module>>>
  explicit CheckpointWrapperImpl(std::shared_ptr<Module> module, CheckpointOptions options = {})
      : WrappedModule(module, wrap(module)), options_(options) {
    refuse_a_unit();
  }
  // The wrapped module's forward, its activations not kept.
  torch::Tensor forward(torch::Tensor input);

 private:
  void refuse_a_unit() const;
  CheckpointOptions options_;
};

// The module holder (as torch::nn::Linear for LinearImpl).
TORCH_MODULE(CheckpointWrapper);

}  // namespace ddp
