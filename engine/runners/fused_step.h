// The fused whole step as a step strategy (--fused-step, --autotune): where one GPU's whole
// model fits one kernel (models/fused_mlp.h), the trial that decides once at set-up whether it
// replaces the usual step (both run on one batch from the current weights, timed, and their
// updates compared within fused_step_tolerance; --autotune keeps its choice), and the step it
// then runs instead of the schedule executor's actions. GPU only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "engine/runners/runner_options.h"
#include "engine/runners/stage_runner.h"
#include "models/batch_feeder.h"
#include "models/fused_mlp.h"
#include "models/mlp_stage_cuda.h"

namespace ddp {

// The fused step is used only where one step's update (relative L2 distance over the whole
// flat buffer) agrees with the usual step's within this: about the usual step's own distance
// from the CPU's in each precision, so that choosing it never moves a run further from the
// reference than the usual step already is. fp32: products summed in another order, 1e-4 over
// a whole update; tf32: 10-bit mantissa products, 3e-2; bf16: 8-bit, 6e-2.
double fused_step_tolerance(Precision precision);

// What the trial reads, runs and puts back: the whole model's one stage, its buffers and feeder.
struct FusedStepSetting {
  const RunnerOptions* options = nullptr;
  const StageSpec* spec = nullptr;  // the whole model (stage 0 of 1)
  CudaStage* stage = nullptr;
  BatchFeeder* feeder = nullptr;
  cudaStream_t stream = nullptr;
  int64_t optimizer_steps = 0;  // the optimizer's next step
  int64_t train_rows = 0;       // the training split's samples (the trial's batch is its first)
  bool lead = true;             // this rank logs
  // What rules it out: anything but one GPU's whole model with one batch a step, host staging,
  // the optimizer overlapped with backward, the per-layer timeline.
  bool whole_model = true;
  bool data_parallel = false;
  bool overlapped = false;
  bool timeline = false;
};

class FusedStep {
 public:
  // The strategy where --fused-step or --autotune ask for it and the trial accepts it (its
  // update agrees with the usual step's, and it is faster, unless --fused-step=force), else
  // null; the log says which (with both steps' times) or why not (with --autotune alone, only
  // once the trial ran).
  static std::unique_ptr<FusedStep> choose(const FusedStepSetting& setting);

  // One training step on the stream: the feeder's current step's samples gathered, forwarded,
  // backwarded and the weights updated, then the feeder at its next step.
  void run();

 private:
  FusedStep(std::unique_ptr<FusedMlpStep> kernel, const FusedStepIo& io, BatchFeeder* feeder,
            cudaStream_t stream)
      : kernel_(std::move(kernel)), io_(io), feeder_(feeder), stream_(stream) {}

  std::unique_ptr<FusedMlpStep> kernel_;
  FusedStepIo io_;
  BatchFeeder* feeder_;
  cudaStream_t stream_;
};

}  // namespace ddp
