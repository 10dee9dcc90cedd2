// The schedule executor over stages that are no model at all (engine/pipeline/stage.h): what
// it asks of each stage, in what order and with which slots, for the schedules' lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "engine/pipeline/executor.h"
#include "engine/pipeline/schedule.h"
#include "engine/telemetry/timeline.h"

namespace ddp {
namespace {

// A stage that records each call as "stage:kind:micro" and checks its slot against what the
// executor planned: a micro-batch keeps its slot from forward to its last backward half.
class RecordingStage final : public PipelineStage {
 public:
  RecordingStage(int stage, int slots, std::vector<std::string>* log)
      : stage_(stage), slots_(slots), log_(log) {}
  void recv_activation(int micro, int slot) override { note("recv_act", micro, slot); }
  void forward(int micro, int slot) override {
    note("fwd", micro, slot);
    slot_of_[micro] = slot;
  }
  void send_activation(int micro, int slot) override { note("send_act", micro, slot); }
  void recv_gradient(int micro, int slot) override { note("recv_grad", micro, slot); }
  LossSum loss(int micro, int slot, float grad_scale) override {
    note("loss", micro, slot);
    return {grad_scale * (micro + 1), 1};
  }
  void backward(int micro, int slot, bool accumulate,
                const std::function<void(int)>& on_layer_done) override {
    note(accumulate ? "bwd+" : "bwd", micro, slot);
    EXPECT_FALSE(on_layer_done) << "no reducer: nothing to tell";
  }
  bool splits_backward() const override { return true; }
  void backward_input(int micro, int slot) override { note("bwd_in", micro, slot); }
  void backward_weight(int micro, int slot, bool accumulate,
                       const std::function<void(int)>& on_layer_done) override {
    note(accumulate ? "bwd_w+" : "bwd_w", micro, slot);
    EXPECT_FALSE(on_layer_done);
  }
  void send_gradient(int micro, int slot) override { note("send_grad", micro, slot); }
  void unshard(ActionKind kind, int micro, int slot) override {
    // Its slot is the action's it gathers for (checked there).
    log_->push_back(std::to_string(stage_) + ":unshard_" + action_name(kind) + ":" +
                    std::to_string(micro) + "@" + std::to_string(slot));
  }
  void reshard() override { log_->push_back(std::to_string(stage_) + ":reshard"); }

 private:
  void note(const char* kind, int micro, int slot) {
    EXPECT_GE(slot, 0);
    EXPECT_LT(slot, slots_) << kind << " of micro-batch " << micro;
    const auto held = slot_of_.find(micro);
    if (held != slot_of_.end() && std::string(kind) != "fwd")
      EXPECT_EQ(slot, held->second) << kind << " of micro-batch " << micro << " moved slots";
    log_->push_back(std::to_string(stage_) + ":" + kind + ":" + std::to_string(micro));
  }
  int stage_, slots_;
  std::vector<std::string>* log_;
  std::map<int, int> slot_of_;
};

class RecordingRank final : public PipelineRank {
 public:
  explicit RecordingRank(std::vector<RecordingStage*> stages) : stages_(std::move(stages)) {}
  bool on_gpu() const override { return false; }
  PipelineStage& chunk(int c) override { return *stages_.at(c); }
  float* grads() override { return nullptr; }
  void* stream() override { return nullptr; }
  void end_schedule() override { ++ends; }
  int ends = 0;

 private:
  std::vector<RecordingStage*> stages_;
};

// Runs rank `rank`'s list of `schedule` (ranks pipeline ranks, `chunks` stages each, M
// micro-batches) over recording stages; returns what they were asked, in order.
// With `zero3`, the list carries ZeRO 3's kUnshard and kReshard.
std::vector<std::string> run(PipelineSchedule schedule, int rank, int ranks, int chunks, int m,
                             StepStats* stats, bool zero3 = false) {
  std::vector<StagePlace> places;
  std::vector<PipelineAction> actions = plan_rank_schedule(schedule, rank, ranks, chunks, m);
  if (zero3) actions = add_unshard_reshard(actions);
  std::vector<int> stage_of_chunk;  // the rank's stages, in order
  for (const PipelineAction& a : actions)
    if (std::find(stage_of_chunk.begin(), stage_of_chunk.end(), a.stage) == stage_of_chunk.end())
      stage_of_chunk.push_back(a.stage);
  std::sort(stage_of_chunk.begin(), stage_of_chunk.end());
  for (int s : stage_of_chunk)
    places.push_back({s, ranks * chunks, m, 2});
  ScheduleExecutor executor(actions, places);
  std::vector<std::string> log;
  std::vector<RecordingStage> stages;
  stages.reserve(places.size());
  for (const StagePlace& p : places)
    stages.emplace_back(p.stage, executor.slots(), &log);
  std::vector<RecordingStage*> pointers;
  for (RecordingStage& s : stages)
    pointers.push_back(&s);
  RecordingRank rank_ops(pointers);
  TimelineRecorder timeline(false);
  executor.run(rank_ops, nullptr, timeline, 1, 0.5f, stats);
  EXPECT_EQ(rank_ops.ends, 1);
  return log;
}

TEST(ScheduleExecutor, RunsTheListOverStagesThatAreNoModel) {
  // 1F1B, the last of two pipeline ranks, 3 micro-batches: each forward after its input,
  // the loss before its backward, then the gradient sent back; accumulate after the first.
  StepStats stats;
  const std::vector<std::string> log =
      run(PipelineSchedule::kOneForwardOneBackward, 1, 2, 1, 3, &stats);
  const std::vector<std::string> want = {
      "1:recv_act:0", "1:fwd:0", "1:loss:0", "1:bwd:0",  "1:send_grad:0",
      "1:recv_act:1", "1:fwd:1", "1:loss:1", "1:bwd+:1", "1:send_grad:1",
      "1:recv_act:2", "1:fwd:2", "1:loss:2", "1:bwd+:2", "1:send_grad:2"};
  EXPECT_EQ(log, want);
  EXPECT_DOUBLE_EQ(stats.loss_sum, 0.5 * (1 + 2 + 3));  // the stage's sums, as it gave them
  EXPECT_EQ(stats.correct, 3);
}

TEST(ScheduleExecutor, ZeroThreesUnshardGathersForTheNextReadBeforeItsReceive) {
  // As above, with --zero 3: each forward's gather asked before its input's receive, each
  // backward's before its loss (in the backward's slot), the stage let go right after its last
  // read (before that backward's send).
  StepStats stats;
  const std::vector<std::string> log =
      run(PipelineSchedule::kOneForwardOneBackward, 1, 2, 1, 2, &stats, /*zero3=*/true);
  const std::vector<std::string> want = {"1:unshard_forward:0@0",
                                         "1:recv_act:0",
                                         "1:fwd:0",
                                         "1:unshard_backward:0@0",
                                         "1:loss:0",
                                         "1:bwd:0",
                                         "1:send_grad:0",
                                         "1:unshard_forward:1@0",
                                         "1:recv_act:1",
                                         "1:fwd:1",
                                         "1:unshard_backward:1@0",
                                         "1:loss:1",
                                         "1:bwd+:1",
                                         "1:reshard",
                                         "1:send_grad:1"};
  EXPECT_EQ(log, want);
  // ZB-H1's first stage: input halves are gathered for, weight halves read no parameters.
  const std::vector<std::string> zb =
      run(PipelineSchedule::kZeroBubbleH1, 0, 2, 1, 3, &stats, /*zero3=*/true);
  int unshards = 0;
  for (size_t i = 0; i < zb.size(); ++i) {
    if (zb[i].find(":unshard_") == std::string::npos) continue;
    ++unshards;
    EXPECT_EQ(zb[i].find("backward_weight"), std::string::npos) << zb[i];
    if (zb[i].find("unshard_backward_input") != std::string::npos)
      EXPECT_EQ(zb[i + 1].substr(0, 12), "0:recv_grad:") << i;
  }
  EXPECT_EQ(unshards, 6);  // three forwards and three input halves
  // Let go after the last input half: only weight halves come after it.
  const auto reshard = std::find(zb.begin(), zb.end(), "0:reshard");
  ASSERT_NE(reshard, zb.end());
  ASSERT_NE(reshard + 1, zb.end());
  for (auto it = reshard + 1; it != zb.end(); ++it)
    EXPECT_NE(it->find(":bwd_w"), std::string::npos) << *it;
}

TEST(ScheduleExecutor, GivesTheLossOnlyOnTheLastStageAndSplitsBackwardForZeroBubble) {
  // ZB-V: two stages a rank in a V; rank 0 holds stages 0 and 3 of 4 (the last: the loss).
  StepStats stats;
  const std::vector<std::string> log = run(PipelineSchedule::kZeroBubbleV, 0, 2, 2, 4, &stats);
  int losses = 0, inputs = 0, weights = 0, forwards = 0;
  for (const std::string& entry : log) {
    if (entry.find(":loss:") != std::string::npos) {
      ++losses;
      EXPECT_EQ(entry.substr(0, 2), "3:") << entry;
    }
    inputs += entry.find(":bwd_in:") != std::string::npos;
    weights += entry.find(":bwd_w") != std::string::npos;
    forwards += entry.find(":fwd:") != std::string::npos;
  }
  EXPECT_EQ(losses, 4);
  EXPECT_EQ(forwards, 8);  // 4 micro-batches through each of the rank's two stages
  EXPECT_EQ(inputs, 8);
  EXPECT_EQ(weights, 8);
  EXPECT_EQ(stats.correct, 4);
}

TEST(ScheduleExecutor, RefusesARankWithoutStages) {
  EXPECT_THROW(ScheduleExecutor({}, {}), std::exception);
}

}  // namespace
}  // namespace ddp
