// Pipeline parallelism, the pure parts: which layers each stage owns (balanced by cost, or
// as the user gives them) and the order of a stage's actions for one step under GPipe or
// 1F1B. Schedules are plain lists, tested on their own (every micro-batch forwarded and
// backwarded once, sends matching receives, no deadlock, bounded live activations); the
// executor that runs them on CPU and GPU is not built yet.
#pragma once

#include <string>
#include <vector>

namespace ddp {

enum class PipelineSchedule { kGpipe, kOneForwardOneBackward };
const char* schedule_name(PipelineSchedule schedule);

enum class ActionKind {
  kRecvActivation,  // from the previous stage (stage > 0)
  kForward,
  kSendActivation,  // to the next stage (not the last stage)
  kRecvGradient,    // from the next stage (not the last stage)
  kBackward,
  kSendGradient,  // to the previous stage (stage > 0)
};
const char* action_name(ActionKind kind);

struct PipelineAction {
  ActionKind kind;
  int micro_batch;
  bool operator==(const PipelineAction& other) const {
    return kind == other.kind && micro_batch == other.micro_batch;
  }
};

// Stage `stage` (0-based) of `stages`, `micro_batches` per step. GPipe: every forward, then
// every backward. 1F1B (as Megatron-LM's non-interleaved schedule): stages - stage - 1
// warm-up forwards, then one forward one backward, then the remaining backwards, so that a
// stage holds the activations of at most `stages - stage` micro-batches. Pure.
std::vector<PipelineAction> plan_schedule(PipelineSchedule schedule, int stage, int stages,
                                          int micro_batches);

// The most micro-batches whose activations a stage holds at once (forwarded, not yet
// backwarded) under `actions`. Pure.
int peak_live_activations(const std::vector<PipelineAction>& actions);

// Contiguous stages of layers: stage s owns layers [bounds[s], bounds[s + 1]).
// Balanced by cost: the split of `layer_costs` (e.g. FLOPs) into `stages` contiguous parts
// whose largest part is smallest; every stage gets at least one layer. Pure.
std::vector<int> partition_by_cost(const std::vector<double>& layer_costs, int stages);
// "--partition 0-2,3-5" for `layers` layers: contiguous, covering every layer once, in
// order; throws UsageError naming the flag and what is wrong.
std::vector<int> parse_partition(const std::string& text, int layers);

}  // namespace ddp
