// WrappedModule: the wrapped module's names adopted, its forward kept.
#include "torch/wrapped_module.h"

namespace ddp {

namespace {

// A Sequential's forward is a template: run as Tensor -> Tensor.
struct SequentialRun : torch::nn::Module {
  explicit SequentialRun(std::shared_ptr<torch::nn::SequentialImpl> sequential)
      : sequential(std::move(sequential)) {}
  torch::Tensor forward(torch::Tensor input) { return sequential->forward(std::move(input)); }
  std::shared_ptr<torch::nn::SequentialImpl> sequential;
};

}  // namespace

torch::nn::AnyModule WrappedModule::sequential_forward(
    std::shared_ptr<torch::nn::SequentialImpl> sequential) {
  return torch::nn::AnyModule(std::make_shared<SequentialRun>(std::move(sequential)));
}

WrappedModule::WrappedModule(std::shared_ptr<torch::nn::Module> module,
                             torch::nn::AnyModule forward)
    : module_(std::move(module)), forward_(std::move(forward)) {
  // The wrapped module's own names, one level up: "block1.fc.weight" as without the wrapper.
  for (const auto& p : module_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : module_->named_buffers(/*recurse=*/false))
    register_buffer(b.key(), b.value());
  for (const auto& c : module_->named_children())
    register_module(c.key(), c.value());
}

void WrappedModule::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);
}

}  // namespace ddp
