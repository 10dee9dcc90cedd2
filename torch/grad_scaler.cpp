// ddp::GradScaler: the scale, the agreed inf/NaN check and the update.
#include "torch/grad_scaler.h"

#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/error.h"
#include "torch/device_staging.h"

namespace ddp {

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), scale_(static_cast<float>(options.init_scale())) {
  DDP_USAGE_CHECK(options.init_scale() > 0 && std::isfinite(options.init_scale()),
                  "GradScalerOptions::init_scale {}: expected a positive finite value",
                  options.init_scale());
  DDP_USAGE_CHECK(options.growth_factor() > 1.0,
                  "GradScalerOptions::growth_factor {}: expected more than 1.0",
                  options.growth_factor());
  DDP_USAGE_CHECK(options.backoff_factor() > 0 && options.backoff_factor() < 1.0,
                  "GradScalerOptions::backoff_factor {}: expected between 0 and 1",
                  options.backoff_factor());
  DDP_USAGE_CHECK(options.growth_interval() > 0,
                  "GradScalerOptions::growth_interval {}: expected a positive count",
                  options.growth_interval());
}

GradScaler::GradScaler(Communicator& ranks, GradScalerOptions options) : GradScaler(options) {
  ranks_ = &ranks;
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) const {
  if (!is_enabled()) return outputs;
  return outputs * static_cast<double>(scale_);
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) return;
  PerOptimizer& state = this_step_[&optimizer];
  DDP_USAGE_CHECK(!state.unscaled,
                  "GradScaler::unscale_ was already called on this optimizer since the last "
                  "update(); call it once a step, before step()");
  torch::NoGradGuard no_grad;
  // The float32 reciprocal, as PyTorch's (scale.double().reciprocal().float()).
  const auto inverse = static_cast<float>(1.0 / static_cast<double>(scale_));
  int32_t found = 0;
  torch::Device device = torch::kCPU;
  for (const auto& group : optimizer.param_groups())
    for (const torch::Tensor& p : group.params()) {
      device = p.device();
      const torch::Tensor& g = p.grad();
      if (!g.defined()) continue;
      DDP_USAGE_CHECK(g.scalar_type() != torch::kHalf,
                      "GradScaler::unscale_: float16 gradients (as PyTorch, which refuses to "
                      "unscale them): keep the parameters float32 and autocast the forward");
      g.mul_(inverse);
      if (found == 0 && !torch::isfinite(g).all().item<bool>()) found = 1;
    }
  if (ranks_ != nullptr && ranks_->size() > 1) {
    torch::Tensor scratch;
    found = all_reduce_values(*ranks_, {found}, ReduceOp::kMax, torch_staging(device, scratch))[0];
  }
  state.unscaled = true;
  state.found_inf = found != 0;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) {
    optimizer.step();
    return true;
  }
  if (!this_step_[&optimizer].unscaled) unscale_(optimizer);
  if (this_step_[&optimizer].found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!is_enabled()) return;
  bool found_inf = false;
  for (const auto& [optimizer, state] : this_step_)
    found_inf = found_inf || state.found_inf;
  DDP_USAGE_CHECK(!this_step_.empty(),
                  "GradScaler::update before any unscale_ or step since the last update: call "
                  "step(optimizer) first");
  this_step_.clear();
  // PyTorch's _amp_update_scale_, in float32.
  if (found_inf) {
    scale_ *= static_cast<float>(options_.backoff_factor());
    growth_tracker_ = 0;
    return;
  }
  const int64_t successful = growth_tracker_ + 1;
  if (successful == options_.growth_interval()) {
    const float grown = scale_ * static_cast<float>(options_.growth_factor());
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  } else {
    growth_tracker_ = successful;
  }
}

void GradScaler::update(double new_scale) {
  if (!is_enabled()) return;
  DDP_USAGE_CHECK(new_scale > 0 && std::isfinite(new_scale),
                  "GradScaler::update({}): expected a positive finite scale", new_scale);
  this_step_.clear();
  scale_ = static_cast<float>(new_scale);
}

double GradScaler::get_scale() const {
  return is_enabled() ? static_cast<double>(scale_) : 1.0;
}

std::map<std::string, double> GradScaler::state_dict() const {
  if (!is_enabled()) return {};
  return {{"scale", static_cast<double>(scale_)},
          {"growth_factor", options_.growth_factor()},
          {"backoff_factor", options_.backoff_factor()},
          {"growth_interval", static_cast<double>(options_.growth_interval())},
          {"_growth_tracker", static_cast<double>(growth_tracker_)}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  DDP_USAGE_CHECK(is_enabled(), "GradScaler::load_state_dict on a disabled scaler");
  DDP_USAGE_CHECK(!state.empty(),
                  "GradScaler::load_state_dict: the state is empty (saved by a disabled "
                  "scaler?)");
  const auto at = [&state](const char* key) {
    const auto found = state.find(key);
    DDP_USAGE_CHECK(found != state.end(), "GradScaler::load_state_dict: no '{}' in the state", key);
    return found->second;
  };
  scale_ = static_cast<float>(at("scale"));
  options_.growth_factor(at("growth_factor"));
  options_.backoff_factor(at("backoff_factor"));
  options_.growth_interval(static_cast<int64_t>(at("growth_interval")));
  growth_tracker_ = static_cast<int64_t>(at("_growth_tracker"));
}

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler) {
  for (const auto& [key, value] : scaler.state_dict())
    archive.write(key, torch::tensor(value, torch::kFloat64));
  return archive;
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler) {
  std::map<std::string, double> state;
  for (const char* key :
       {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}) {
    torch::Tensor value;
    DDP_USAGE_CHECK(archive.try_read(key, value),
                    "GradScaler: the archive has no '{}' (not a GradScaler's state)", key);
    state[key] = value.item<double>();
  }
  scaler.load_state_dict(state);
  return archive;
}

}  // namespace ddp
