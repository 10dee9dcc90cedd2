// Pipeline schedules and partitions, alone: every micro-batch forwarded and backwarded once
// per stage, sends matching receives across stages, no deadlock when sends are posted
// asynchronously and receives wait, 1F1B's live activations bounded by the stage count.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "engine/pipeline/schedule.h"
#include "engine/telemetry/timeline.h"
#include "runtime/error.h"

namespace ddp {
namespace {

using Channel = std::tuple<int, int, ActionKind>;  // from stage, to stage, what flows

// Runs every stage's actions together: a send is posted at once, a receive waits for the
// next message of its channel, which must be for the same micro-batch. Returns false on a
// deadlock (no stage can move) or a mismatch.
bool simulate(PipelineSchedule schedule, int stages, int micro_batches, std::string* why) {
  std::vector<std::vector<PipelineAction>> plans;
  for (int s = 0; s < stages; ++s)
    plans.push_back(plan_schedule(schedule, s, stages, micro_batches));
  std::vector<size_t> next(stages, 0);
  std::map<Channel, std::deque<int>> in_flight;
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < stages; ++s) {
      while (next[s] < plans[s].size()) {
        const PipelineAction& a = plans[s][next[s]];
        if (a.kind == ActionKind::kSendActivation)
          in_flight[{s, s + 1, ActionKind::kSendActivation}].push_back(a.micro_batch);
        else if (a.kind == ActionKind::kSendGradient)
          in_flight[{s, s - 1, ActionKind::kSendGradient}].push_back(a.micro_batch);
        else if (a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kRecvGradient) {
          const bool activation = a.kind == ActionKind::kRecvActivation;
          auto& queue =
              in_flight[{activation ? s - 1 : s + 1, s,
                         activation ? ActionKind::kSendActivation : ActionKind::kSendGradient}];
          if (queue.empty()) break;  // waits
          if (queue.front() != a.micro_batch) {
            *why = "stage " + std::to_string(s) + " expected micro-batch " +
                   std::to_string(a.micro_batch) + " but got " + std::to_string(queue.front());
            return false;
          }
          queue.pop_front();
        }
        ++next[s];
        moved = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s)
    if (next[s] != plans[s].size()) {
      *why = "deadlock: stage " + std::to_string(s) + " waits at action " + std::to_string(next[s]);
      return false;
    }
  for (const auto& [channel, queue] : in_flight)
    if (!queue.empty()) {
      *why = "a message was never received";
      return false;
    }
  return true;
}

TEST(PipelineSchedule, EveryStageForwardsAndBackwardsEachMicroBatchOnceInOrder) {
  for (PipelineSchedule schedule :
       {PipelineSchedule::kGpipe, PipelineSchedule::kOneForwardOneBackward})
    for (int stages = 1; stages <= 4; ++stages)
      for (int micro = 1; micro <= 8; ++micro)
        for (int stage = 0; stage < stages; ++stage) {
          const auto actions = plan_schedule(schedule, stage, stages, micro);
          std::vector<int> forwarded(micro, -1), backwarded(micro, -1);
          int sends = 0, receives = 0;
          for (size_t i = 0; i < actions.size(); ++i) {
            const PipelineAction& a = actions[i];
            if (a.kind == ActionKind::kForward) {
              EXPECT_EQ(forwarded[a.micro_batch], -1);
              forwarded[a.micro_batch] = static_cast<int>(i);
            }
            if (a.kind == ActionKind::kBackward) {
              EXPECT_EQ(backwarded[a.micro_batch], -1);
              EXPECT_GE(forwarded[a.micro_batch], 0) << "backward before forward";
              backwarded[a.micro_batch] = static_cast<int>(i);
            }
            sends += a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGradient;
            receives +=
                a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kRecvGradient;
          }
          for (int mb = 0; mb < micro; ++mb) {
            EXPECT_GE(forwarded[mb], 0) << schedule_name(schedule) << " mb " << mb;
            EXPECT_GE(backwarded[mb], 0) << schedule_name(schedule) << " mb " << mb;
          }
          const int neighbours = (stage > 0) + (stage + 1 < stages);
          EXPECT_EQ(sends, neighbours * micro);
          EXPECT_EQ(receives, neighbours * micro);
        }
}

TEST(PipelineSchedule, SendsMatchReceivesWithoutDeadlock) {
  for (PipelineSchedule schedule :
       {PipelineSchedule::kGpipe, PipelineSchedule::kOneForwardOneBackward})
    for (int stages = 1; stages <= 5; ++stages)
      for (int micro = 1; micro <= 9; ++micro) {
        std::string why;
        EXPECT_TRUE(simulate(schedule, stages, micro, &why))
            << schedule_name(schedule) << " P=" << stages << " M=" << micro << ": " << why;
      }
}

TEST(PipelineSchedule, OneFOneBHoldsAtMostTheStageCountOfActivationsGpipeHoldsAll) {
  for (int stages = 1; stages <= 4; ++stages)
    for (int micro = 1; micro <= 16; ++micro)
      for (int stage = 0; stage < stages; ++stage) {
        EXPECT_LE(peak_live_activations(plan_schedule(PipelineSchedule::kOneForwardOneBackward,
                                                      stage, stages, micro)),
                  std::min(stages - stage, micro));
        EXPECT_EQ(
            peak_live_activations(plan_schedule(PipelineSchedule::kGpipe, stage, stages, micro)),
            micro);
      }
  // The shape Megatron-LM documents: stage 0 of 4 with 8 micro-batches warms up with 3.
  const auto first = plan_schedule(PipelineSchedule::kOneForwardOneBackward, 0, 4, 8);
  EXPECT_EQ(first[0], (PipelineAction{ActionKind::kForward, 0}));
  EXPECT_EQ(first[6], (PipelineAction{ActionKind::kForward, 3}));   // 4th forward, then
  EXPECT_EQ(first[9], (PipelineAction{ActionKind::kBackward, 0}));  // the first backward
}

// Interleaved 1F1B's order of every rank, action by action, against Megatron-LM's
// forward_backward_pipelining_with_interleaving written out independently: (P - r - 1) x 2 +
// (V - 1) x P warm-up forwards, then one forward one backward, then the cool-down backwards;
// the k-th forward is micro-batch (k / (P V)) P + k % P of chunk (k % (P V)) / P, the k-th
// backward the same micro-batch of the chunks in reverse.
TEST(PipelineSchedule, InterleavedFollowsMegatronsOrderOnEveryRank) {
  for (const auto& [ranks, chunks, micro] : std::vector<std::tuple<int, int, int>>{
           {2, 2, 4}, {4, 2, 8}, {4, 3, 8}, {3, 2, 3}, {2, 3, 6}}) {
    for (int rank = 0; rank < ranks; ++rank) {
      const int total = micro * chunks;
      const int warmup = std::min(total, (ranks - rank - 1) * 2 + (chunks - 1) * ranks);
      const auto action = [&](int k, bool forward) {
        const int in_group = k % (ranks * chunks);
        int chunk = in_group / ranks;
        if (!forward) chunk = chunks - chunk - 1;
        const int mb = (k / (ranks * chunks)) * ranks + k % ranks;
        return PipelineAction{forward ? ActionKind::kForward : ActionKind::kBackward, mb,
                              chunk * ranks + rank};
      };
      std::vector<PipelineAction> megatron;
      for (int k = 0; k < warmup; ++k)
        megatron.push_back(action(k, true));
      for (int k = 0; k < total - warmup; ++k) {
        megatron.push_back(action(k + warmup, true));
        megatron.push_back(action(k, false));
      }
      for (int k = total - warmup; k < total; ++k)
        megatron.push_back(action(k, false));
      const std::vector<PipelineAction> ours = plan_interleaved_compute(rank, ranks, chunks, micro);
      ASSERT_EQ(ours.size(), megatron.size())
          << "P " << ranks << " V " << chunks << " rank " << rank;
      for (size_t i = 0; i < ours.size(); ++i)
        EXPECT_TRUE(ours[i] == megatron[i])
            << "P " << ranks << " V " << chunks << " M " << micro << " rank " << rank << ", action "
            << i << ": " << action_name(ours[i].kind) << " mb " << ours[i].micro_batch << " stage "
            << ours[i].stage << ", Megatron: " << action_name(megatron[i].kind) << " mb "
            << megatron[i].micro_batch << " stage " << megatron[i].stage;
    }
  }
}

TEST(PipelinePartition, BalancedByCostAndAsGiven) {
  EXPECT_EQ(partition_by_cost({1, 1, 1, 1}, 2), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(partition_by_cost({4, 1, 1, 1, 1}, 2), (std::vector<int>{0, 1, 5}));
  EXPECT_EQ(partition_by_cost({1, 2, 3, 4, 5, 6}, 3), (std::vector<int>{0, 3, 5, 6}));
  EXPECT_EQ(partition_by_cost({5}, 1), (std::vector<int>{0, 1}));
  EXPECT_THROW(partition_by_cost({1, 1}, 3), UsageError);
  EXPECT_EQ(parse_partition("0-2,3-5", 6), (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(parse_partition("0,1-3", 4), (std::vector<int>{0, 1, 4}));
  auto error = [](const std::string& text, int layers) {
    try {
      parse_partition(text, layers);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("0-2,4-5", 6).find("stage 1 should start at layer 3"), std::string::npos);
  EXPECT_NE(error("0-2", 6).find("covers layers 0 to 2, but the model has 6 layers"),
            std::string::npos);
  EXPECT_NE(error("a-b", 6).find("'a-b' is not FIRST-LAST"), std::string::npos);
  EXPECT_NE(error("0-2,3-x", 6).find("'3-x' is not FIRST-LAST"), std::string::npos);
}

TEST(PipelineLayout, RanksOfAStageAreConsecutive) {
  const std::vector<int> bounds = {0, 2, 4};
  // dp 2 x pp 2: ranks 0,1 hold stage 0, ranks 2,3 stage 1.
  for (int rank = 0; rank < 4; ++rank) {
    const PipelineLayout layout = plan_layout(4, rank, 2, bounds);
    EXPECT_EQ(layout.replicas, 2);
    EXPECT_EQ(layout.stage, rank / 2);
    EXPECT_EQ(layout.replica, rank % 2);
    EXPECT_EQ(layout.rank_of(layout.stage, layout.replica), rank);
  }
  EXPECT_EQ(describe_layout(plan_layout(4, 0, 2, bounds)),
            "stage 0: layers 0-1 on ranks 0,1; stage 1: layers 2-3 on ranks 2,3");
  EXPECT_EQ(describe_layout(plan_layout(2, 1, 2, {0, 1, 3})),
            "stage 0: layers 0 on rank 0; stage 1: layers 1-2 on rank 1");
  try {
    plan_layout(6, 0, 4, {0, 1, 2, 3, 4});
    ADD_FAILURE() << "a world of 6 split into 4 stages was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--pp 4: the world of 6 ranks is not a multiple of the "
                                         "stage count (world = dp x pp; start 4 or 8 ranks)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_DOUBLE_EQ(ideal_bubble(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(ideal_bubble(1, 8), 0.0);
}

TEST(Timeline, ChromeTraceHasATrackPerRankAndSpansFromTheEarliest) {
  TimelineRecorder off;
  off.add(SpanKind::kForward, 1, 0, 10, 20);
  EXPECT_TRUE(off.spans().empty());
  TimelineRecorder bounded(true, 2);
  for (int i = 0; i < 3; ++i)
    bounded.add(SpanKind::kBackward, 1, i, 100 + i, 101 + i);
  EXPECT_EQ(bounded.spans().size(), 2u);
  EXPECT_EQ(bounded.dropped(), 1u);
  const std::vector<std::vector<Span>> spans = {
      {{SpanKind::kForward, 3, 1, 1000.0, 1250.0}},
      {{SpanKind::kRecv, 3, 1, 1100.0, 1300.0}, {SpanKind::kAllReduce, 3, -1, 1400.0, 1500.0}}};
  const nlohmann::json trace =
      nlohmann::json::parse(chrome_trace_json(spans, {"rank 0 (stage 0)", "rank 1 (stage 1)"}));
  std::vector<nlohmann::json> bars;
  std::map<int, std::string> names;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") bars.push_back(e);
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
  }
  EXPECT_EQ(names[1], "rank 1 (stage 1)");
  ASSERT_EQ(bars.size(), 3u);
  EXPECT_EQ(bars[0]["name"], "forward 1");
  EXPECT_EQ(bars[0]["ts"], 0.0);  // from the earliest span, in microseconds
  EXPECT_EQ(bars[0]["dur"], 250.0);
  EXPECT_EQ(bars[1]["tid"], 1);
  EXPECT_EQ(bars[1]["ts"], 100.0);
  EXPECT_EQ(bars[2]["name"], "all-reduce");
  EXPECT_EQ(bars[2]["cat"], "all-reduce");
  EXPECT_EQ(bars[2]["args"]["step"], 3);
}

// The GPU's communication runs beside its work: lane 1 spans get a track of their own per
// rank (after the ranks' tracks), named after the rank; packing keeps every field.
TEST(Timeline, CommunicationLaneHasItsOwnTrackAndSurvivesPacking) {
  const std::vector<std::vector<Span>> spans = {{{SpanKind::kLayerBackward, 2, 3, 10.0, 20.0, 0},
                                                 {SpanKind::kBucketAllReduce, 2, 1, 15.0, 40.0, 1}},
                                                {{SpanKind::kLayerBackward, 2, 3, 11.0, 21.0, 0}}};
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace_json(spans, {"r0", "r1"}));
  std::map<int, std::string> names;
  std::map<std::string, int> tid_of;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "X")
      tid_of[e["name"].get<std::string>() + "@" + std::to_string(int(e["ts"]))] = e["tid"];
  }
  EXPECT_EQ(names.size(), 3u);  // r0, r1, and r0's communication (r1 has none)
  EXPECT_EQ(names[2], "r0 communication");
  EXPECT_EQ(tid_of["all-reduce bucket 1@5"], 2);
  EXPECT_EQ(tid_of["backward layer 3@0"], 0);
  EXPECT_EQ(tid_of["backward layer 3@1"], 1);
  const std::vector<Span> back = unpack_spans(pack_spans(spans[0]));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].kind, SpanKind::kBucketAllReduce);
  EXPECT_EQ(back[1].micro_batch, 1);
  EXPECT_EQ(back[1].lane, 1);
  EXPECT_EQ(back[1].end_us, 40.0);
}

// --zero 3's gathers (lane 2) get a third track per rank, after its communication track, in
// the order compute, communication, gathers.
TEST(Timeline, GathersLaneHasATrackOfItsOwnAfterTheCommunications) {
  const std::vector<std::vector<Span>> spans = {
      {{SpanKind::kForward, 1, -1, 10.0, 20.0, 0}, {SpanKind::kGather, 1, 2, 12.0, 14.0, 2}},
      {{SpanKind::kGather, 1, 0, 11.0, 13.0, 2},
       {SpanKind::kBucketAllReduce, 1, 0, 15.0, 30.0, 1}}};
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace_json(spans, {"r0", "r1"}));
  std::map<int, std::string> names;
  std::map<int, int> order;
  std::map<std::string, int> tid_of;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "thread_sort_index")
      order[e["tid"]] = e["args"]["sort_index"];
    if (e["ph"] == "X") tid_of[e["name"].get<std::string>()] = e["tid"];
  }
  EXPECT_EQ(names[4], "r0 gathers");
  EXPECT_EQ(names[5], "r1 gathers");
  EXPECT_EQ(names[3], "r1 communication");
  EXPECT_EQ(names.count(2), 0u);  // r0 has no communication
  EXPECT_EQ(tid_of["gather layer 2"], 4);
  EXPECT_EQ(tid_of["gather layer 0"], 5);
  EXPECT_LT(order[0], order[4]);
  EXPECT_LT(order[4], order[1]);
  EXPECT_LT(order[3], order[5]);
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// Several stages a rank: the split balances what each rank holds (the sum of its stages),
// which balancing each stage does not in a V. The benchmark's model (784-wide input, six
// 1024 x 1024 layers, a 10-wide output, in M multiply-adds): by stage, rank 0 gets 2.8 and
// rank 1 4.0; by rank, the best split of all (checked against every split).
TEST(PipelinePartition, SeveralStagesARankBalanceTheRanks) {
  const std::vector<double> costs = {0.8, 1.05, 1.05, 1.05, 1.05, 1.05, 1.05, 0.01};
  const std::vector<int> v = stage_ranks(PipelineSchedule::kZeroBubbleV, 2, 2);  // 0 1 1 0
  const auto load = [&](const std::vector<int>& b) {
    std::vector<double> per_rank(2, 0);
    for (int s = 0; s < 4; ++s)
      for (int i = b[s]; i < b[s + 1]; ++i)
        per_rank[v[s]] += costs[i];
    return std::max(per_rank[0], per_rank[1]);
  };
  double best = 1e9;
  for (int a = 1; a < 8; ++a)
    for (int b = a + 1; b < 8; ++b)
      for (int c = b + 1; c < 8; ++c)
        best = std::min(best, load({0, a, b, c, 8}));
  const std::vector<int> by_stage = partition_by_cost(costs, 4);
  const std::vector<int> by_rank = partition_for_ranks(costs, v);
  ASSERT_EQ(by_rank.size(), 5u);
  EXPECT_EQ(by_rank.front(), 0);
  EXPECT_EQ(by_rank.back(), 8);
  for (int s = 0; s < 4; ++s)
    EXPECT_LT(by_rank[s], by_rank[s + 1]);  // every stage holds a layer
  EXPECT_DOUBLE_EQ(load(by_rank), best);
  EXPECT_LT(load(by_rank), load(by_stage));
  // One stage a rank: the stage balance itself.
  EXPECT_EQ(partition_for_ranks(costs, {0, 1}), partition_by_cost(costs, 2));
}

}  // namespace
}  // namespace ddp
