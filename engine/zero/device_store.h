// The GPU runner's parameters as gradient sync keeps them (ParamStore): the rank's flat
// DeviceParameters on its compute stream, and the state over them (DeviceState: DeviceWhole,
// the runner's own update, until shard() makes it DeviceZero). The runner reads the state and
// the Reducer from here and, after shard(), wires its layers where the state says (its `rewire`).
// Only built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "dist/gradient_ring.h"
#include "dist/param_store.h"
#include "dist/sync_options.h"
#include "engine/zero/device_state.h"
#include "models/device_parameters.h"
#include "runtime/device_buffer.h"

namespace ddp {

// --zero 2 and 3's gradient ring (dist/gradient_ring.h) as the device memory of
// `buckets` (the stage's BucketPlan, which its Reducer reduces; offsets in the stage's flat buffer
// of `param_count`), or none (a stage's gradients in one buffer).
GradientRing device_gradient_ring(const std::vector<Bucket>& buckets, size_t param_count,
                                  const RingLayout& layout);

// What the store is made from: the rank's parameters (`count`), their layers as spans of the
// flat buffers (in order; `stage_layers` of them each of the rank's stages), their buckets,
// whether the gradients go into a ring, and gradient sync's options.
struct DeviceStoreLayout {
  size_t count = 0;
  std::vector<std::pair<size_t, size_t>> layers;
  std::vector<int> stage_layers;
  BucketPlan plan;
  RingLayout ring;
  SyncOptions sync;
};

class DeviceParamStore final : public ParamStore {
 public:
  // Over the rank's buffers `weights` on `stream`; `update` is the whole state's step.
  DeviceParamStore(DeviceStoreLayout layout, DeviceParameters& weights, cudaStream_t stream,
                   DeviceWhole::Update update);

  DeviceState& state() { return *state_; }
  // The Reducer that join() was given (null: no data parallelism).
  Reducer* ddp() const { return ddp_; }
  // Whether this rank logs what it sets up (rank 0, known once the world is), and the data
  // parallelism's line too (the whole model's runner says it).
  void set_lead(bool lead, bool announce) {
    lead_ = lead;
    announce_ = announce;
  }
  // How the host waits for the stream where a copy of the sharded state needs it.
  void set_wait(std::function<void()> wait) { wait_ = std::move(wait); }
  // Called with the new state after shard().
  void set_rewire(std::function<void(DeviceState&)> rewire) { rewire_ = std::move(rewire); }

  // ParamStore.
  const BucketPlan& bucket_plan() const override { return layout_.plan; }
  float* params() override { return weights_.params(); }
  size_t count() const override { return layout_.count; }
  void params_changed() override { weights_.refresh_low_precision(); }
  void join(Reducer& ddp, uint64_t fingerprint, const std::string& description) override;
  const ShardPlan& shard(Reducer& ddp, int level, Communicator* gathers) override;

 private:
  DeviceStoreLayout layout_;
  DeviceParameters& weights_;
  cudaStream_t stream_;
  std::unique_ptr<DeviceState> state_;
  Reducer* ddp_ = nullptr;
  DeviceBuffer<uint16_t> bf16_wire_;  // the gradients on the wire with --grad-reduce bf16
  bool lead_ = true;
  bool announce_ = false;
  std::function<void()> wait_;
  std::function<void(DeviceState&)> rewire_;
};

}  // namespace ddp
