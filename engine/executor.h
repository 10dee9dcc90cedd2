// The schedule executor: runs one stage's action list (engine/pipeline/schedule.h) for one
// step on the CPU or the GPU through the stage's StageRunner: micro-batches in activation
// slots (plan_slots), transfers to and from the neighbouring stages, the loss on the last
// stage, and the data-parallel gradient reduction started where the list says (kReduceGrad:
// bucket by bucket as the next backward writes the gradients).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/ddp.h"
#include "engine/pipeline/schedule.h"
#include "engine/stage_runner.h"
#include "engine/timeline.h"

namespace ddp {

struct StepStats {
  double loss_sum = 0;  // summed over this rank's samples of the step
  int correct = 0;
  int samples = 0;
  int skipped = 0;    // 1 when --on-nonfinite skip-step skipped this step
  double busy_s = 0;  // forward and backward compute of this rank
  double step_s = 0;  // the whole step
};

class ScheduleExecutor {
 public:
  // `actions`: this stage's list for one step (lowered); `spec`: the stage it runs.
  ScheduleExecutor(std::vector<PipelineAction> actions, const StageSpec& spec);

  // The activation slots the list needs at once (a runner allocates that many).
  int slots() const { return slot_plan_.peak; }
  const std::vector<PipelineAction>& actions() const { return actions_; }

  // Runs every action of step `step` (1-based, for the timeline), then waits for this
  // stage's sends and the reduction (on the runner's stream on the GPU). `scale`: the loss
  // weight of one sample (1 / this replica's samples in the step). `ddp` may be null (no
  // data parallelism). The CPU's spans go to `timeline` (the GPU times its own). Adds to
  // `stats` the loss, hits and compute time of the step.
  void run(StageRunner& runner, Ddp* ddp, TimelineRecorder& timeline, int64_t step, float scale,
           StepStats* stats) const;

 private:
  std::vector<PipelineAction> actions_;
  StageSpec spec_;
  SlotPlan slot_plan_;
};

}  // namespace ddp
