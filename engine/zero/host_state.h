// What gradient sync decides about a CPU replica's state, as one interface with its strategies:
// where the parameters and the gradients live, how the optimizer updates them, and their host
// copies. Whole (HostWhole: one replica, or plain data parallelism whose all-reduce leaves
// every replica the whole averaged gradients) or sharded over the data-parallel group
// (HostZero, engine/zero/zero_host.h: --zero 1, 2, 3). The CPU runner owns the flat buffers
// and the model; it asks the state where backward writes and where layers read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/linear_cpu.h"
#include "models/optimizer.h"

namespace ddp {

class HostState {
 public:
  virtual ~HostState() = default;

  // The optimizer over what the strategy updates (every parameter, or this rank's pieces).
  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }

  // Where backward writes the gradient of element `offset` of the flat layout, where the
  // strategy keeps them apart from the runner's buffer (empty: in the buffer).
  virtual std::function<float*(size_t offset)> gradient_home() = 0;
  // Where the layers read their parameters for each use, where the strategy keeps them apart
  // (null: the runner's buffer).
  virtual LayerParams* layer_params() = 0;

  // Whether a gradient the strategy keeps apart from the runner's buffer is NaN or Inf.
  virtual bool kept_grads_nonfinite() const = 0;
  // The step's update at `lr`, after the gradients are reduced.
  virtual void step(float lr) = 0;

  // Host copies (collectives over the group where sharded): the whole parameters (`count`,
  // the rank's flat layout) and the optimizer's state; and both set from whole copies.
  virtual std::vector<float> params(size_t count) = 0;
  virtual void set_params(const float* host) = 0;
  virtual NamedState optimizer_state(size_t count) = 0;
  virtual void set_optimizer_state(const NamedState& state) = 0;
  // Around an evaluation (collective where sharded: every layer gathered once, for all of it).
  virtual void begin_evaluation(size_t count) = 0;
  virtual void end_evaluation() = 0;

  // What it holds, as the runner's memory report says it (`size` formats floats), and the
  // floats it holds beyond the runner's buffers: parameters, gradients.
  virtual std::string memory_report(size_t count,
                                    const std::function<std::string(size_t)>& size) const = 0;
  virtual size_t param_floats() const = 0;
  virtual size_t grad_floats() const = 0;

 protected:
  explicit HostState(std::unique_ptr<Optimizer> optimizer) : optimizer_(std::move(optimizer)) {}
  void set_optimizer(std::unique_ptr<Optimizer> optimizer) { optimizer_ = std::move(optimizer); }
  std::unique_ptr<Optimizer> optimizer_;
};

// The whole state in the runner's buffers `params` and `grads` (kept by the caller), updated by
// `optimizer` over every parameter.
class HostWhole final : public HostState {
 public:
  HostWhole(std::vector<float>& params, std::vector<float>& grads,
            std::unique_ptr<Optimizer> optimizer)
      : HostState(std::move(optimizer)), params_(params), grads_(grads) {}

  std::function<float*(size_t)> gradient_home() override { return {}; }
  LayerParams* layer_params() override { return nullptr; }
  bool kept_grads_nonfinite() const override { return false; }  // it keeps none apart
  void step(float lr) override;
  std::vector<float> params(size_t count) override;
  void set_params(const float* host) override;
  NamedState optimizer_state(size_t count) override;
  void set_optimizer_state(const NamedState& state) override;
  void begin_evaluation(size_t count) override { (void)count; }  // read where they are
  void end_evaluation() override {}
  std::string memory_report(size_t count,
                            const std::function<std::string(size_t)>& size) const override;
  size_t param_floats() const override { return 0; }
  size_t grad_floats() const override { return 0; }

 private:
  std::vector<float>& params_;
  std::vector<float>& grads_;
};

}  // namespace ddp
