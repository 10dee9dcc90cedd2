// SGD and AdamW updates (float32 arithmetic in torch's order) and the LR schedule.
#include "models/optimizer.h"

#include <cmath>

namespace ddp {

const char* optimizer_name(OptimizerKind kind) {
  return kind == OptimizerKind::kAdamW ? "adamw" : "sgd";
}

OptStep optimizer_scalars(const OptimizerConfig& config, float lr, int64_t step) {
  OptStep s;
  s.lr = lr;
  s.first = step == 0;
  const double t = static_cast<double>(step + 1);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(config.beta1), t)));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(config.beta2), t)));
  return s;
}

void sgd_update(float* params, const float* grads, float* momentum_buf, size_t count, float lr,
                float momentum, float weight_decay, bool first_step) {
  for (size_t i = 0; i < count; ++i) {
    float g = grads[i];
    if (weight_decay != 0.0f) g = g + weight_decay * params[i];
    if (momentum != 0.0f) {
      momentum_buf[i] = first_step ? g : momentum * momentum_buf[i] + g;
      g = momentum_buf[i];
    }
    params[i] = params[i] - lr * g;
  }
}

void adamw_update(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                  size_t count, float lr, float beta1, float beta2, float eps, float weight_decay,
                  int64_t t) {
  // Bias corrections in double, as torch computes these Python scalars.
  const double bias_correction1 =
      1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bias_correction2 =
      1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  for (size_t i = 0; i < count; ++i) {
    params[i] *= 1.0f - lr * weight_decay;
    const float g = grads[i];
    exp_avg[i] += (1.0f - beta1) * (g - exp_avg[i]);  // torch's lerp_
    exp_avg_sq[i] = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
    const float denom = std::sqrt(exp_avg_sq[i]) / bias_correction2_sqrt + eps;
    params[i] -= step_size * (exp_avg[i] / denom);
  }
}

namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerConfig& config, size_t count)
      : config_(config), momentum_(config.momentum != 0.0f ? count : 0) {}
  void step(float* params, const float* grads, size_t count, float lr) override {
    sgd_update(params, grads, momentum_.data(), count, lr, config_.momentum, config_.weight_decay,
               steps_ == 0);
    ++steps_;
  }
  void step_pieces(float* params, const std::vector<OptimizerPiece>& pieces, float lr) override {
    for (const OptimizerPiece& p : pieces)
      sgd_update(params + p.offset, p.grads,
                 momentum_.empty() ? nullptr : momentum_.data() + p.state_offset, p.count, lr,
                 config_.momentum, config_.weight_decay, steps_ == 0);
    ++steps_;
  }
  std::vector<std::pair<std::string, std::vector<float>*>> state() override {
    if (momentum_.empty()) return {};
    return {{"momentum", &momentum_}};
  }
  size_t state_floats() const override { return momentum_.size(); }

 private:
  OptimizerConfig config_;
  std::vector<float> momentum_;
};

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerConfig& config, size_t count)
      : config_(config), exp_avg_(count), exp_avg_sq_(count) {}
  void step(float* params, const float* grads, size_t count, float lr) override {
    ++steps_;
    adamw_update(params, grads, exp_avg_.data(), exp_avg_sq_.data(), count, lr, config_.beta1,
                 config_.beta2, config_.eps, config_.weight_decay, steps_);
  }
  void step_pieces(float* params, const std::vector<OptimizerPiece>& pieces, float lr) override {
    ++steps_;
    for (const OptimizerPiece& p : pieces)
      adamw_update(params + p.offset, p.grads, exp_avg_.data() + p.state_offset,
                   exp_avg_sq_.data() + p.state_offset, p.count, lr, config_.beta1, config_.beta2,
                   config_.eps, config_.weight_decay, steps_);
  }
  std::vector<std::pair<std::string, std::vector<float>*>> state() override {
    return {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
  }
  size_t state_floats() const override { return exp_avg_.size() + exp_avg_sq_.size(); }

 private:
  OptimizerConfig config_;
  std::vector<float> exp_avg_;
  std::vector<float> exp_avg_sq_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, size_t count) {
  if (config.kind == OptimizerKind::kAdamW) return std::make_unique<AdamW>(config, count);
  return std::make_unique<Sgd>(config, count);
}

float lr_at(int64_t step, int64_t total_steps, float base_lr, LrSchedule schedule,
            int64_t warmup_steps) {
  if (step < warmup_steps)
    return base_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  if (schedule == LrSchedule::kConstant) return base_lr;
  const int64_t span = total_steps - warmup_steps;
  if (span <= 0) return base_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(span);
  return static_cast<float>(base_lr * 0.5 * (1.0 + std::cos(3.141592653589793 * progress)));
}

}  // namespace ddp
