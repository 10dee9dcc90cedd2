// What gradient sync decides about a GPU replica's state, as one interface with its strategies
// (the GPU's HostState, engine/zero/host_state.h): how the optimizer updates the rank's flat
// buffers, the host copies of the parameters and optimizer state, and the gathers a step or an
// evaluation needs before a layer's use. Whole (DeviceWhole: one replica, or plain data
// parallelism) or sharded over the data-parallel group (DeviceZero, engine/zero/zero_device.h:
// --zero 1, 2, 3). The GPU runner owns the buffers and the stream and supplies its update.
// Only built with CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "models/device_parameters.h"
#include "models/optimizer.h"

namespace ddp {

class DeviceState {
 public:
  virtual ~DeviceState() = default;

  // Whether the state is sharded over the replicas (the overlapped optimizer is not).
  virtual bool sharded() const = 0;
  // The step's update on the stream (the feeder's scalars), after the gradients are reduced.
  virtual void step(const OptStep* steps, const int* counter) = 0;
  // Every gather still pending waited for by the stream: at a step's start and before its
  // update, so that every step, the captured one too, gathers alike.
  virtual void forget_gathers() = 0;
  // Evaluation: this replica forwarded `mine` chunks of `chunk` of its share of `samples`
  // over `replicas`; the gathers it owes the replica with the most, made.
  virtual void match_evaluation(int64_t samples, int64_t replicas, int64_t mine, int chunk) = 0;
  // Each layer gather as it is issued (the GPU timeline's; `scheduled`: by the schedule's
  // kUnshard, else at a use).
  virtual void set_on_gather(
      std::function<void(int layer, bool scheduled, Work& gather)> on_gather) = 0;
  // Whether a layer's parameters are gathered before each use (the runner then calls
  // use_layer before the stream reads layer `layer` of the rank, `next` being the pass's next
  // layer or -1); the whole state keeps every layer where it is read.
  virtual bool gathers_layers() const { return false; }
  virtual void use_layer(int layer, int next) { (void)layer, (void)next; }
  // Where layers are gathered: the schedule's kUnshard, layer `layer` (which a pass reads
  // first) on its way now; and its kReshard, layers [first, end) let go.
  virtual void prefetch_layer(int layer) { (void)layer; }
  virtual void release_layers(int first, int end) { (void)first, (void)end; }

  // Host copies (collectives over the group where sharded; the stream synchronised): the whole
  // parameters (`count`, the rank's flat layout) and optimizer state; and both set from whole
  // host copies.
  virtual std::vector<float> params(size_t count) = 0;
  virtual void set_params(const float* host) = 0;
  virtual NamedState optimizer_state(size_t count) = 0;
  virtual void set_optimizer_state(const NamedState& state) = 0;
  // Where the update runs, as the start-up line says it ("after backward").
  virtual std::string describe_update(size_t count) const = 0;
};

// The whole state in the rank's flat buffers `weights`, updated by the runner's `update`.
class DeviceWhole final : public DeviceState {
 public:
  using Update = std::function<void(const OptStep* steps, const int* counter)>;
  DeviceWhole(DeviceParameters& weights, Update update)
      : weights_(weights), update_(std::move(update)) {}

  bool sharded() const override { return false; }
  void step(const OptStep* steps, const int* counter) override { update_(steps, counter); }
  // Every layer is where it is read: nothing to gather.
  void forget_gathers() override {}
  void match_evaluation(int64_t samples, int64_t replicas, int64_t mine, int chunk) override;
  void set_on_gather(std::function<void(int, bool, Work&)> on_gather) override { (void)on_gather; }
  std::vector<float> params(size_t count) override;
  void set_params(const float* host) override { weights_.set(host); }
  NamedState optimizer_state(size_t count) override;
  void set_optimizer_state(const NamedState& state) override {
    weights_.set_optimizer_state(state);
  }
  std::string describe_update(size_t count) const override;

 private:
  DeviceParameters& weights_;
  Update update_;
};

}  // namespace ddp
