// ddp::WrappedModule: the base of the modules declared in place of another (LibTorch's modules
// have no forward hooks, so ddp's per-module behaviour is a wrapper): ddp::ShardUnit and
// ddp::CheckpointWrapper. The wrapped module's parameters, buffers and children are the
// wrapper's under their own names one level up ("block1.fc.weight" as without the wrapper), so
// that a checkpoint of either loads into the other; its forward (Tensor -> Tensor, a
// Sequential's too) is kept to be called by the wrapper's own.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace ddp {

// The base (the top of this file).
class WrappedModule : public torch::nn::Module {
 public:
  // The wrapped module.
  std::shared_ptr<torch::nn::Module> module() const { return module_; }
  // Training or evaluation mode, for the wrapped module too (its own flag, not only its
  // children's).
  void train(bool on = true) override;

 protected:
  // Adopts `module`'s names; `forward` runs it.
  WrappedModule(std::shared_ptr<torch::nn::Module> module, torch::nn::AnyModule forward);
  // The wrapped module's forward.
  torch::Tensor forward_wrapped(torch::Tensor input) { return forward_.forward(std::move(input)); }
  // `module`'s forward as an AnyModule (a Sequential's template forward as Tensor -> Tensor).
  template <typename Module>
  static torch::nn::AnyModule wrap(const std::shared_ptr<Module>& module) {
    if constexpr (std::is_base_of_v<torch::nn::SequentialImpl, Module>)
      return sequential_forward(module);
    else
      return torch::nn::AnyModule(module);
  }

 private:
  static torch::nn::AnyModule sequential_forward(
      std::shared_ptr<torch::nn::SequentialImpl> sequential);

  std::shared_ptr<torch::nn::Module> module_;
  torch::nn::AnyModule forward_;
};

}  // namespace ddp
