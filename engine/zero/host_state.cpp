// HostWhole: a CPU replica's whole state in the runner's buffers.
#include "engine/zero/host_state.h"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

namespace ddp {

void HostWhole::step(float lr) {
  optimizer_->step(params_.data(), grads_.data(), params_.size(), lr);
}

std::vector<float> HostWhole::params(size_t count) {
  (void)count;  // the buffer's
  return params_;
}

void HostWhole::set_params(const float* host) {
  std::copy_n(host, params_.size(), params_.begin());
}

NamedState HostWhole::optimizer_state(size_t count) {
  (void)count;  // the optimizer's own
  NamedState state;
  for (const auto& [name, buffer] : optimizer_->state())
    state.emplace_back(name, *buffer);
  return state;
}

void HostWhole::set_optimizer_state(const NamedState& state) {
  for (auto& [name, buffer] : optimizer_->state())
    for (const auto& [saved_name, values] : state)
      if (saved_name == name) *buffer = values;
}

std::string HostWhole::memory_report(size_t count,
                                     const std::function<std::string(size_t)>& size) const {
  (void)count;  // the buffers'
  return fmt::format("parameters {}, gradients {}, optimizer state {}", size(params_.size()),
                     size(grads_.size()), size(optimizer_->state_floats()));
}

}  // namespace ddp
