// ddp::GradScaler: loss scaling for float16 training (torch.amp.GradScaler's semantics and names,
// which LibTorch lacks), with the skip agreed by every rank: a step whose gradients hold an inf
// or a NaN on any rank (under ZeRO a rank holds only its own share of them, in a pipeline only
// its stages') is skipped on every rank, so that the replicas never part.
//
//   ddp::GradScaler scaler(world.comm());                      // or GradScaler() alone
//   ...  optimizer.zero_grad();
//   {
//     ddp::Autocast autocast(torch::kCUDA, torch::kHalf);
//     loss = loss_fn(model.forward(x), y);
//   }
//   scaler.scale(loss).backward();
//   scaler.unscale_(optimizer);                                // optional: before clipping
//   model.clip_grad_norm_(1.0);
//   scaler.step(optimizer);                                    // skipped where any rank overflowed
//   scaler.update();
//
// torch::save(scaler, path) and torch::load(scaler, path) keep its state (the scale, the growth
// tracker and the options), as state_dict() / load_state_dict() in Python.
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace ddp {

class Communicator;

// torch.amp.GradScaler's constructor arguments and defaults.
struct GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;     // 2^16
  TORCH_ARG(double, growth_factor) = 2.0;      // the scale times this after growth_interval
  TORCH_ARG(double, backoff_factor) = 0.5;     // the scale times this after a step with inf/NaN
  TORCH_ARG(int64_t, growth_interval) = 2000;  // steps without inf/NaN before it grows
  // false: scale() returns the loss, step() steps, update() does nothing (one flag to turn
  // mixed precision off).
  TORCH_ARG(bool, enabled) = true;
};

// The scaler (the top of this file).
class GradScaler {
 public:
  // One process: the inf/NaN check is this process's.
  explicit GradScaler(GradScalerOptions options = {});
  // Every rank of `ranks` (the job's: world.comm()) agrees on each step's inf/NaN check by one
  // all-reduce of a flag; unscale_() (or step() where it unscales) is then collective over it.
  explicit GradScaler(Communicator& ranks, GradScalerOptions options = {});

  // The loss times the scale (its dtype kept).
  torch::Tensor scale(const torch::Tensor& outputs) const;
  // The optimizer's gradients divided by the scale (times its float32 reciprocal, as
  // PyTorch's), and whether any rank found an inf or a NaN among its own; at most once an
  // optimizer between update()s (a second call is an error naming it). Float16 gradients are
  // refused, as PyTorch does: keep the parameters float32 and autocast the forward.
  void unscale_(torch::optim::Optimizer& optimizer);
  // optimizer.step() unless a rank found an inf or a NaN this step (unscaling first where
  // unscale_ was not called); returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // The scale for the next step: times backoff_factor where this step was skipped, times
  // growth_factor after growth_interval steps in a row that were not (where the result is
  // finite); float32 arithmetic, as PyTorch's.
  void update();
  // The scale set to `new_scale` instead.
  void update(double new_scale);

  // The current scale (1.0 when disabled).
  double get_scale() const;
  // The steps in a row without inf/NaN since the scale last changed.
  int64_t growth_tracker() const { return growth_tracker_; }
  // Whether it scales (GradScalerOptions::enabled).
  bool is_enabled() const { return options_.enabled(); }
  // Its options (the loaded ones after load_state_dict).
  const GradScalerOptions& options() const { return options_; }

  // Python's state_dict(): "scale", "growth_factor", "backoff_factor", "growth_interval",
  // "_growth_tracker" (empty when disabled).
  std::map<std::string, double> state_dict() const;
  // Python's load_state_dict(): the state_dict()'s values taken back (a missing key is an error
  // naming it).
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  struct PerOptimizer {
    bool unscaled = false;
    bool found_inf = false;
  };
  GradScalerOptions options_;
  Communicator* ranks_ = nullptr;
  float scale_;
  int64_t growth_tracker_ = 0;
  std::map<const torch::optim::Optimizer*, PerOptimizer> this_step_;
};

// torch::save(scaler, path): its state_dict() into the archive.
torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler);
// torch::load(scaler, path): its state from the archive (a key missing: an error naming it).
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler);

}  // namespace ddp
