// One pipeline stage of a GPU runner's rank (GpuChunk): its CudaStage and its transfers to the
// neighbouring stages, as the schedule executor drives them (PipelineStage), each action on the
// rank's stream, timed by the rank's step hooks.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/pipeline/stage.h"
#include "engine/runners/gpu_step_hooks.h"
#include "engine/runners/stage_runner.h"
#include "engine/runners/stage_transfers.h"
#include "models/batch_feeder.h"
#include "models/mlp_stage_cuda.h"
#include "runtime/cuda_check.h"

namespace ddp {

// What a rank's stages share, owned by the runner and filled once it has made them (after the
// stages): the step hooks (busy spans, the layer hook of backward), the feeder of each
// micro-batch's samples and labels, and whether backward runs in two halves (zero-bubble).
struct GpuChunkShared {
  GpuStepHooks* hooks = nullptr;
  BatchFeeder* feeder = nullptr;
  bool split = false;
};

// One stage of the rank: its CudaStage and its transfers (runners/stage_transfers.h: to another
// rank over the lane of that flow and peer, or to a neighbouring stage of this rank through a
// hand-over buffer a micro-batch), all in the stream's order.
class GpuChunk final : public PipelineStage {
 public:
  GpuChunk(const GpuChunkShared& rank, const StageSpec& spec, std::unique_ptr<CudaStage> stage)
      : rank_(rank),
        spec_(spec),
        stage_(std::move(stage)),
        transfers_(spec, device_memory(*stage_),
                   stage_->bf16() ? DataType::kBFloat16 : DataType::kFloat32) {}
  CudaStage& stage() const { return *stage_; }
  const StageSpec& spec() const { return spec_; }
  // The stages of this rank just before and after this one (null: another rank's, or none).
  void set_neighbours(GpuChunk* before, GpuChunk* after) {
    before_ = before;
    after_ = after;
    transfers_.set_neighbours(before ? &before->transfers_ : nullptr,
                              after ? &after->transfers_ : nullptr);
  }
  void attach(const StageLinks& links) { transfers_.attach(links); }

  void recv_activation(int micro, int slot) override;
  void forward(int micro, int slot) override;
  void send_activation(int micro, int slot) override;
  void recv_gradient(int micro, int slot) override;
  LossSum loss(int micro, int slot, float grad_scale) override;
  void backward(int micro, int slot, bool accumulate,
                const std::function<void(int)>& on_layer_done) override;
  bool splits_backward() const override;
  void backward_input(int micro, int slot) override;
  void backward_weight(int micro, int slot, bool accumulate,
                       const std::function<void(int)>& on_layer_done) override;
  void send_gradient(int micro, int slot) override;
  // --zero 3 (the runner sets them where the state gathers layers): `prefetch(layer)` starts
  // the gather of the stage's layer `layer` (the stage's numbering) and `release()` lets its
  // layers go; the schedule's kUnshard and kReshard call them.
  void set_gathers(std::function<void(int layer)> prefetch, std::function<void()> release) {
    prefetch_ = std::move(prefetch);
    release_ = std::move(release);
  }
  void unshard(ActionKind kind, int micro, int slot) override;
  void reshard() override;
  // Where its transfers go: "activations from rank 0 on world0/split6c0, ..., to stage 2
  // in memory".
  std::string describe_links() const { return transfers_.describe(); }
  // The stream waits for every send of the step.
  void wait_sends() { transfers_.end_step(); }
  // Evaluation of `n` samples in slot 0: the input from `x` (the first stage), the stage
  // before on this rank or its rank; the output to the next stage's rank, or (last stage) the
  // evaluation sums of `labels`.
  void evaluate(const float* x, const int32_t* labels, int n);

 private:
  // The device's memory for the transfers: hand-over buffers of activations' memory, copies
  // and waits on the stage's stream.
  static MemoryPort device_memory(const CudaStage& stage) {
    MemoryPort memory;
    memory.allocate = [](size_t bytes) -> std::shared_ptr<void> {
      const auto buffer = std::make_shared<DeviceBuffer<char>>(bytes, MemoryCategory::kActivations);
      return std::shared_ptr<void>(buffer, buffer->data());
    };
    cudaStream_t stream = stage.stream();
    memory.copy = [stream](void* to, const void* from, size_t bytes) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream));
    };
    memory.clear = [stream](void* dst, size_t bytes) {
      DDP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream));
    };
    memory.stream = stream;
    return memory;
  }
  void copy(void* to, const void* from, size_t bytes) const {
    DDP_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stage_->stream()));
  }

  const GpuChunkShared& rank_;
  StageSpec spec_;
  std::unique_ptr<CudaStage> stage_;
  GpuChunk* before_ = nullptr;  // the stages before and after, when this rank's (evaluation)
  GpuChunk* after_ = nullptr;
  StageTransfers transfers_;
  std::function<void(int)> prefetch_;  // --zero 3: the schedule's gathers
  std::function<void()> release_;
};

// Each of the rank's stages knows the stages just before and after it on the rank (null:
// another rank's, or none).
void link_neighbours(std::vector<std::unique_ptr<GpuChunk>>& chunks);

}  // namespace ddp
