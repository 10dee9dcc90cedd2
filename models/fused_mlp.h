// The whole training step of a small MLP in one kernel (issue 33): every layer's forward
// (the batch's rows read in place; the softmax cross-entropy in the last layer's epilogue),
// every layer's backward and the SGD update (each layer's in the phase after its backward),
// one cooperative launch whose blocks meet at a grid-wide barrier between phases (2L - 1 for
// L layers), so that a step of a model that fits on chip pays one launch instead of about
// twenty kernels' launch gaps and tails. The products round their operands as the cuBLASLt
// path does (tf32 and bf16 on tensor cores through WMMA, float32 accumulation; bf16
// activations and their gradients stored in bf16; fp32 as float32 FMAs), so it keeps that
// path's arithmetic contract within the tolerances the GPU tests use against the CPU; sums
// run in a fixed order (products split along k are summed in split order, no atomics on
// parameters or gradients), so a step is deterministic. Only built with CUDA. ddptrain checks
// it against the usual step at start and uses it with --fused-step, or with --autotune where
// it is also faster.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/mlp.h"
#include "models/optimizer.h"
#include "models/precision.h"
#include "runtime/device_buffer.h"

namespace ddp {

// Whether `shape` and `batch` fit the fused step (at most kFusedMaxLayers layers, every width
// and the batch at most 1024, at most 32 classes, SGD); if not, why, in `why`.
constexpr int kFusedMaxLayers = 8;
bool fused_step_fits(const MlpShape& shape, int batch, const OptimizerConfig& optimizer,
                     std::string* why);

// What one step reads and writes, all device pointers. The batch: rows
// indices[*counter * stride + i] of x[n, dim] and y[n] (counter null: offset 0); the flat
// parameters, gradients (overwritten) and momentum in MlpShape's layout, params16 the bf16
// copy (null: none) kept equal to bf16(params); the optimizer's scalars steps[*counter];
// the loss sum and hits added to *loss_sum and *correct.
struct FusedStepIo {
  const float* x = nullptr;
  const int32_t* y = nullptr;
  const int32_t* indices = nullptr;
  const int* counter = nullptr;
  int stride = 0;
  float* params = nullptr;
  float* grads = nullptr;
  float* momentum = nullptr;
  void* params16 = nullptr;
  const OptStep* steps = nullptr;
  double* loss_sum = nullptr;
  int* correct = nullptr;
};

class FusedMlpStep {
 public:
  // Throws ddp::Error when fused_step_fits says no. `blocks`: of the grid (0: two an SM where
  // they fit, else one; at most what the GPU holds at once).
  FusedMlpStep(const MlpShape& shape, int batch, Precision precision,
               const OptimizerConfig& optimizer, int blocks = 0);
  ~FusedMlpStep();
  FusedMlpStep(const FusedMlpStep&) = delete;
  FusedMlpStep& operator=(const FusedMlpStep&) = delete;
  // One training step on `stream` (capturable in a CUDA graph): the loss gradient scaled by
  // 1 / batch, as the whole model's step.
  void run(const FusedStepIo& io, cudaStream_t stream) const;
  // Blocks of the cooperative grid.
  int blocks() const { return blocks_; }
  // The grids worth timing on this GPU in `precision`: one, two and three blocks an SM, as many
  // of them as it holds at once.
  static std::vector<int> grids(Precision precision);
  // The most ways a product of the step is split along k.
  int most_splits() const { return splits_; }
  // Diagnostics: where `trace` is not null, each later run writes there (device memory,
  // trace_size() values, nanoseconds of the GPU's global timer) each phase's start in block 0,
  // then for each phase each block's end of its work (trace[2L + phase * blocks() + block]).
  void trace_phases(unsigned long long* trace) { trace_ = trace; }
  size_t trace_size() const {
    return 2 * static_cast<size_t>(shape_.num_layers()) * (1 + static_cast<size_t>(blocks_));
  }

 private:
  MlpShape shape_;
  int batch_;
  Precision precision_;
  OptimizerConfig optimizer_;
  DeviceBuffer<float> activations_;  // every layer's input and the logits, [batch, width] each
  DeviceBuffer<float> gradients_;    // the loss gradient w.r.t. each of them
  DeviceBuffer<float> scratch_;      // partial sums of the products split along k
  DeviceBuffer<int> counters_;       // their splits arrived, one a tile (zero between steps)
  struct Plan;                       // the launch's arguments but the step's io (fused_mlp.cu)
  std::unique_ptr<Plan> plan_;
  int blocks_ = 0, splits_ = 1;
  unsigned long long* trace_ = nullptr;
};

}  // namespace ddp
