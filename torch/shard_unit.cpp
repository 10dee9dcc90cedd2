// ShardUnit: the wrapped module's parameters, buffers and children under their own names, and
// its forward through the wrapper's runner.
#include "torch/shard_unit.h"

#include <torch/nn/modules/container/sequential.h>

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

torch::nn::AnyModule ShardUnitImpl::sequential_forward(
    std::shared_ptr<torch::nn::SequentialImpl> sequential) {
  return torch::nn::AnyModule(std::make_shared<SequentialRun>(std::move(sequential)));
}

ShardUnitImpl::ShardUnitImpl(std::shared_ptr<torch::nn::Module> module,
                             torch::nn::AnyModule forward)
    : module_(std::move(module)), forward_(std::move(forward)) {
  // The wrapped module's own names, one level up: "block1.fc.weight" as without the unit.
  for (const auto& p : module_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : module_->named_buffers(/*recurse=*/false))
    register_buffer(b.key(), b.value());
  for (const auto& c : module_->named_children())
    register_module(c.key(), c.value());
}

void ShardUnitImpl::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);
}

torch::Tensor ShardUnitImpl::forward(torch::Tensor input) {
  if (runner_ == nullptr) return forward_.forward(std::move(input));
  return runner_->run_unit(unit_, [this, &input] { return forward_.forward(std::move(input)); });
}

}  // namespace ddp
