// Optimizers over flat buffers, following torch.optim.SGD and torch.optim.AdamW's update
// rules exactly (same order of operations), and the learning-rate schedule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/state_pieces.h"  // NamedState, OptimizerPiece (Optimizer::step_pieces)

namespace ddp {

enum class OptimizerKind { kSgd, kAdamW };

// "sgd" or "adamw": --optimizer's words, and a checkpoint's.
const char* optimizer_name(OptimizerKind kind);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float momentum = 0.9f;      // SGD
  float weight_decay = 0.0f;  // SGD: L2 added to the gradient; AdamW: decoupled
  float beta1 = 0.9f;         // AdamW
  float beta2 = 0.999f;
  float eps = 1e-8f;
};

// Per-step optimizer scalars, precomputed on the host for a chunk of steps and indexed on
// the device by the step counter, so that a captured graph replays with new values.
struct OptStep {
  float lr = 0;
  float step_size = 0;  // AdamW: lr / (1 - beta1^t)
  float bc2_sqrt = 1;   // AdamW: sqrt(1 - beta2^t)
  int first = 0;        // SGD: the first step initialises the momentum buffer
};

// The scalars of the optimizer's step `step` (0-based: the updates made before it) at
// learning rate lr: every GPU runner's, from the optimizer's own count (after a resume it
// may differ from the training step, where steps were skipped).
OptStep optimizer_scalars(const OptimizerConfig& config, float lr, int64_t step);

// Optimizer state for `count` parameters; step() updates params in place from grads.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of params[count] from grads[count] with learning rate lr.
  virtual void step(float* params, const float* grads, size_t count, float lr) = 0;
  // One update (one step of the count) of the pieces of `params` (a sharded state: its rank's
  // pieces of the whole buffer); elementwise, so bitwise step() over the same elements.
  virtual void step_pieces(float* params, const std::vector<OptimizerPiece>& pieces, float lr) = 0;
  // Named state buffers (for checkpoints): SGD "momentum", AdamW "exp_avg", "exp_avg_sq".
  virtual std::vector<std::pair<std::string, std::vector<float>*>> state() = 0;
  // The floats of that state.
  virtual size_t state_floats() const = 0;
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 protected:
  int64_t steps_ = 0;
};

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, size_t count);

// torch.optim.SGD, dampening 0, no Nesterov: g += wd*p; buf = g (first step) or
// momentum*buf + g; p -= lr*buf (or p -= lr*g without momentum).
void sgd_update(float* params, const float* grads, float* momentum_buf, size_t count, float lr,
                float momentum, float weight_decay, bool first_step);

// torch.optim.AdamW (amsgrad off): p *= 1 - lr*wd; m += (1-b1)*(g - m);
// v = b2*v + (1-b2)*g*g; p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). t counts from 1.
void adamw_update(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                  size_t count, float lr, float beta1, float beta2, float eps, float weight_decay,
                  int64_t t);

enum class LrSchedule { kConstant, kCosine };

// Learning rate at step (0-based) of total_steps: linear warm-up from lr/warmup to lr over
// warmup_steps, then constant, or cosine decay to 0 at total_steps.
float lr_at(int64_t step, int64_t total_steps, float base_lr, LrSchedule schedule,
            int64_t warmup_steps);

}  // namespace ddp
