// ddp::ShardUnit: a part of a LibTorch model whose parameters ddp::DistributedDataParallel with
// zero(3) shards as one unit (PyTorch FSDP2's fully_shard on a submodule, which is Python-only):
// gathered just before its forward (the next unit's gather started meanwhile), freed after it,
// gathered again as its backward starts, its gradients reduce-scattered as soon as that backward
// ends and freed once they are, so that a rank holds its 1/N of the model plus a few units at
// the peak. Declared in place of the module it wraps (LibTorch's modules have no forward hooks),
// with the wrapped module's parameters and buffers under their own names, so that a checkpoint
// of either loads into the other:
//
//   struct NetImpl : torch::nn::Module {
//     ddp::ShardUnit block1{register_module("block1", ddp::ShardUnit(Block(256)))};  // was Block
//   };
//
// Any module holder or shared_ptr of a module with one forward taking and returning a Tensor.
// Outside a wrapper with zero(3) on several ranks (one process, another level) it is the wrapped
// module's forward and nothing else. A Sequential's children become units without it
// (DistributedDataParallelOptions::auto_wrap_min_params). Units may nest: a parameter belongs to
// the innermost; what no unit holds is one more unit, gathered for the whole step.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>

#include "torch/wrapped_module.h"

namespace ddp {

// What runs a unit's forward with its gathers and frees around it (DistributedDataParallel's).
class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  // Unit `unit`'s forward, `forward`, with its parameters gathered.
  virtual torch::Tensor run_unit(size_t unit, const std::function<torch::Tensor()>& forward) = 0;
};

// The module (the top of this file).
class ShardUnitImpl : public WrappedModule {
 public:
  // Wraps `module` (a holder: torch::nn::Linear, TORCH_MODULE(Block)'s Block, a Sequential).
  template <typename Holder, typename = decltype(std::declval<Holder&>().ptr())>
  explicit ShardUnitImpl(Holder module) : WrappedModule(module.ptr(), wrap(module.ptr())) {}
  // Wraps a shared_ptr of a module.
  template <typename Module,
            typename = std::enable_if_t<std::is_base_of_v<torch::nn::Module, Module>>>
  explicit ShardUnitImpl(std::shared_ptr<Module> module) : WrappedModule(module, wrap(module)) {}

  // The wrapped module's forward, with the unit's gathers and frees around it under a wrapper
  // with zero(3).
  torch::Tensor forward(torch::Tensor input);
  // Set by DistributedDataParallel (null: plain forward) with this unit's number.
  void set_runner(UnitRunner* runner, size_t unit) {
    runner_ = runner;
    unit_ = unit;
  }

 private:
  UnitRunner* runner_ = nullptr;
  size_t unit_ = 0;
};

// The module holder (as torch::nn::Linear for LinearImpl).
TORCH_MODULE(ShardUnit);

}  // namespace ddp
