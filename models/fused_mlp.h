// The whole training step of a small MLP in one kernel (issue 33): every layer's forward
// (the batch's rows read in place), the softmax cross-entropy, every layer's backward and the
// SGD update, one cooperative launch whose blocks meet at a grid-wide barrier between phases,
// so that a step of a model that fits on chip pays one launch instead of about twenty
// kernels' launch gaps and tails. The products round their operands as the cuBLASLt path
// does (tf32 and bf16 on tensor cores through WMMA, float32 accumulation; bf16 activations
// and their gradients stored in bf16; fp32 as float32 FMAs), so it keeps that path's
// arithmetic contract within the tolerances the GPU tests use against the CPU; sums run in a
// fixed order (no atomics on parameters or gradients), so a step is deterministic. Only built
// with CUDA. ddptrain uses it with --fused-step, after checking it against the usual step.
// Written while no GPU was lent: its tests (FusedStep.* in tests/cuda/test_cuda_mlp.cpp,
// GpuRun.FusedStep* in test_cuda_dist.cpp) and ddp_fused_mlp_bench are still to run on one;
// the phases' index arithmetic was checked on the host against CpuMlp (gradients within
// 1.4e-7 of its).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "models/mlp.h"
#include "models/optimizer.h"
#include "models/precision.h"
#include "runtime/device_buffer.h"

namespace ddp {

// Whether `shape` and `batch` fit the fused step (at most kFusedMaxLayers layers, every width
// and the batch at most 1024, SGD); if not, why, in `why`.
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
  // Throws ddp::Error when fused_step_fits says no.
  FusedMlpStep(const MlpShape& shape, int batch, Precision precision,
               const OptimizerConfig& optimizer);
  // One training step on `stream` (capturable in a CUDA graph): the loss gradient scaled by
  // 1 / batch, as the whole model's step.
  void run(const FusedStepIo& io, cudaStream_t stream) const;
  // Blocks of the cooperative grid (one per SM that can hold one, at most the tiles' need).
  int blocks() const { return blocks_; }

 private:
  MlpShape shape_;
  int batch_;
  Precision precision_;
  OptimizerConfig optimizer_;
  DeviceBuffer<float> activations_;  // every layer's input and the logits, [batch, width] each
  DeviceBuffer<float> gradients_;    // the loss gradient w.r.t. each of them
  int blocks_ = 0;
};

}  // namespace ddp
