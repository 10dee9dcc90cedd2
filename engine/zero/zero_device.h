// ZeRO (--zero 1, 2, 3) on the GPU over a Reducer's group: the home of the sharded state
// (ShardedState, dist/sharded_state.h: the pieces, the update's protocol, the host copies)
// in device memory on the compute stream, with what is the device's own: the memory of its
// padded buckets and (2, 3) gradient ring, the update's kernels over this rank's pieces, and the
// gathers of level 3 before each use of a layer (the decisions LayerGathers makes, carried out on
// the gathers' own communicator, Reducer::gather_comm, so that a gather never queues behind a
// reduce-scatter). The runner supplies the rank's flat buffers and compute stream and calls it
// where the step reaches these points; models/ only holds the memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/gradient_ring.h"
#include "dist/layer_gathers.h"
#include "dist/sharded_buckets.h"
#include "dist/sharded_state.h"
#include "engine/zero/device_state.h"
#include "models/device_parameters.h"
#include "models/optimizer.h"
#include "runtime/device_buffer.h"

namespace ddp {

class DeviceZero final : public DeviceState, private ShardHome {
 public:
  // Shards `ddp`'s state at `layout.zero`'s level (--zero 3's gathers on `gathers`, null: the
  // Reducer's communicator) over the rank's buffers `weights` (its layers
  // as spans `layers` of them, in order, `stage_layers` of them a stage of the rank; its ring
  // made from `layout`) on `stream`; level 3 gathers up to `ahead` layers ahead of the one in
  // use (--zero-prefetch). `lead` logs what it holds.
  DeviceZero(Reducer& ddp, const RingLayout& layout, DeviceParameters& weights,
             const std::vector<std::pair<size_t, size_t>>& layers,
             const std::vector<int>& stage_layers, int ahead, Communicator* gathers,
             cudaStream_t stream, bool lead);
  // Each layer gather as it is issued (the GPU timeline's), or none.
  void set_on_gather(
      std::function<void(int layer, bool scheduled, Work& gather)> on_gather) override {
    on_gather_ = std::move(on_gather);
  }
  // How the host waits for the stream where a copy needs it (the runner's: bounded by
  // --timeout when there are peers); cudaStreamSynchronize until set.
  void set_wait(std::function<void()> wait) { wait_ = std::move(wait); }

  int level() const { return state_->level(); }
  const ShardPlan& plan() const { return state_->plan(); }
  // --zero 3: the parameters are this rank's pieces and two gather slots.
  bool gathers_layers() const override { return level() == 3; }

  // --zero 3, before the stream reads the rank's layer `layer`: its parameters gathered into
  // their slot and, `next` >= 0 being the pass's next layer, the next `ahead` layers of the
  // pass in its stage (on in the same direction) on their way into the others.
  void use_layer(int layer, int next) override;
  // --zero 3, the schedule's kUnshard and kReshard (LayerGathers::prefetch, release).
  void prefetch_layer(int layer) override;
  void release_layers(int first, int end) override;
  // Every gather still pending waited for by the stream, what the slots hold forgotten: at a
  // step's start and before its update, so every step, the captured one too, gathers alike.
  void forget_gathers() override;
  // --zero 3, evaluation: the replicas' shares of `samples` (Trainer::evaluate_shards) may take
  // one chunk of `chunk` samples more or less, and every chunk's forward gathers every layer
  // (collectives over the data-parallel group of `replicas`); this replica, having forwarded
  // `mine` chunks, gathers as a forward would for the chunks it lacks against the replica with
  // the most.
  void match_evaluation(int64_t samples, int64_t replicas, int64_t mine, int chunk) override;

  // The step's update on the stream: this rank's pieces from their averaged gradients, then
  // (1, 2) every rank's pieces gathered into the whole parameters and their bf16 copy.
  void step(const OptStep* steps, const int* counter) override;
  bool sharded() const override { return true; }
  // "after backward, on this rank's 1234 of 2468 parameters".
  std::string describe_update(size_t count) const override;

  // Host copies (collectives over the group; the stream synchronised): the whole parameters
  // (`count`, the rank's flat layout), and this rank's pieces set from a whole host copy.
  std::vector<float> params(size_t count) override;
  void set_params(const float* host) override;
  NamedState optimizer_state(size_t count) override;
  void set_optimizer_state(const NamedState& state) override;

 private:
  // ShardHome: the rank's DeviceParameters and device memory on the stream.
  const MemoryPort* memory() const override { return &memory_; }
  const RingSlots* ring() const override { return ring_.slots > 0 ? &ring_ : nullptr; }
  std::vector<GradMemory> param_memory() override {
    return {{weights_.params(), DataType::kFloat32}};
  }
  void* stream() override { return stream_; }
  std::shared_ptr<void> allocate(size_t bytes, bool pieces) override;
  std::vector<float> to_host(const float* src, size_t floats) override;
  void from_host(float* dst, const float* host, size_t floats) override;
  std::vector<float> whole_params() override;
  void set_whole_params(const float* host) override { weights_.set(host); }
  void settle() override { forget_gathers(); }
  void params_gathered() override { weights_.to_low_precision(stream_); }

  // The gathers of `chunks` more forwards of the rank's stages.
  void gather_as_forwards(int64_t chunks);
  // `scheduled`: the schedule's kUnshard asked for them (the timeline says so).
  void carry_out(const std::vector<LayerGathers::Action>& actions, bool scheduled = false);
  void wait();

  DeviceParameters& weights_;
  cudaStream_t stream_;
  std::function<void()> wait_;
  std::function<void(int, bool, Work&)> on_gather_;
  MemoryPort memory_;  // the buckets' device memory (padded copies, pieces) and copies
  RingSlots ring_;     // the gradient ring's slots, or none
  std::unique_ptr<ShardedState> state_;           // the pieces, their update, the host copies
  std::vector<size_t> bucket_of_layer_;           // --zero 3: the rank's layer i -> its bucket
  std::vector<int> stage_of_layer_;               // and -> its stage among the rank's
  std::vector<std::unique_ptr<Work>> gathering_;  // by layer: its gather, until waited for
  std::unique_ptr<LayerGathers> gathers_;         // which to gather and wait for, when
};

}  // namespace ddp
