// The schedule executor: runs one pipeline rank's action list (engine/pipeline/schedule.h) for
// one step through the rank's stages (engine/pipeline/stage.h: the MLP's on the CPU or the GPU,
// a LibTorch module's), knowing no model, each action by the stage it names: micro-batches in
// activation slots (plan_slots, a stage's own), transfers to and from the neighbouring stages, the
// loss on the last stage, and the data-parallel gradient reduction started where the list says
// (kReduceGrad: bucket by bucket as the next backward or weight half writes the gradients; with
// several stages a rank, one reduction over all of them, started at the first stage's point and
// ended after the last's).
#pragma once

#include <cstdint>
#include <vector>

#include "dist/ddp.h"
#include "engine/pipeline/schedule.h"
#include "engine/pipeline/stage.h"
#include "engine/telemetry/compute_costs.h"
#include "engine/telemetry/timeline.h"

namespace ddp {

struct StepStats {
  double loss_sum = 0;  // summed over this rank's samples of the step
  int correct = 0;
  int samples = 0;
  int skipped = 0;    // 1 when --on-nonfinite skip-step skipped this step
  double busy_s = 0;  // forward and backward compute of this rank
  double step_s = 0;  // the whole step
  ComputeCosts costs;
};

class ScheduleExecutor {
 public:
  // `actions`: this rank's list for one step (lowered); `stages`: the stages it runs, in order.
  ScheduleExecutor(std::vector<PipelineAction> actions, std::vector<StagePlace> stages);

  // The activation slots the list needs at once in any one stage (a runner allocates that
  // many a stage).
  int slots() const { return slots_; }
  const std::vector<PipelineAction>& actions() const { return actions_; }

  // Runs every action of step `step` (1-based, for the timeline), then waits for this
  // stage's sends and the reduction (on the runner's stream on the GPU). `scale`: the loss
  // weight of one sample (1 / this replica's samples in the step). `ddp` may be null (no
  // data parallelism). The CPU's spans go to `timeline` (the GPU times its own). Adds to
  // `stats` the loss, hits and compute time of the step.
  void run(PipelineRank& runner, Reducer* ddp, TimelineRecorder& timeline, int64_t step,
           float scale, StepStats* stats) const;

 private:
  std::vector<PipelineAction> actions_;
  std::vector<StagePlace> stages_;
  std::vector<int> chunk_;               // chunk_[i]: the chunk (of stages_) that runs action i
  std::vector<int> slot_;                // slot_[i]: its slot in that chunk
  std::vector<int> layer_base_;          // per chunk: its first layer's index among the rank's
  std::vector<ActionKind> unshard_for_;  // unshard_for_[i]: the compute kind a kUnshard is for
  int slots_ = 0;
};

}  // namespace ddp
