// ShardUnit: the wrapped module's forward through the wrapper's runner.
#include "torch/shard_unit.h"

namespace ddp {

torch::Tensor ShardUnitImpl::forward(torch::Tensor input) {
  if (runner_ == nullptr) return forward_wrapped(std::move(input));
  return runner_->run_unit(unit_, [this, &input] { return forward_wrapped(std::move(input)); });
}

}  // namespace ddp
