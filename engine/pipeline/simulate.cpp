// simulate_schedule: a loop that moves every rank as far as it can, then matches the heads of
// the lanes, until every rank is done or nothing can move.
#include "engine/pipeline/simulate.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

namespace ddp {
namespace {

struct LaneOp {
  bool send = false;
  int peer = 0;   // the other rank
  int stage = 0;  // the stage index that receives (its message's identity with mb)
  int micro_batch = 0;
  double posted = 0;
};

struct Lane {
  std::deque<LaneOp> ops;  // posted and not yet completed, in order
  double free_at = 0;      // when its last operation completed
};

struct Rank {
  size_t next = 0;  // the next action
  double clock = 0;
  double busy = 0;
  int live = 0, peak = 0;
  // By (kind, peer): kind activations 0 and 1, gradients 2 and 3 (lane_of); peer -1 unless
  // a lane a peer.
  std::map<std::pair<int, int>, Lane> lanes;
  const LaneOp* waiting = nullptr;  // the receive this rank is blocked on (in its lane)
  // --zero 3 (SimCosts::gather): when each compute action so far began, when its gather lane
  // is free, and how long compute waited for gathers.
  std::vector<double> began;
  double gather_free = 0, first_reach = 0, gather_wait = 0;
};

// Rank `me` reaches a compute action: its gather (issued `ahead` compute actions earlier, or
// as the rank reached its first) done on the gather lane first. Returns when it may begin.
double after_gather(Rank& me, double gather, int ahead) {
  const size_t k = me.began.size();
  if (k == 0) me.first_reach = me.clock;
  const double issued = k >= static_cast<size_t>(ahead) ? me.began[k - ahead] : me.first_reach;
  const double done = std::max(issued, me.gather_free) + gather;
  me.gather_free = done;
  const double begin = std::max(me.clock, done);
  me.gather_wait += begin - me.clock;
  me.began.push_back(begin);
  return begin;
}

bool is_activation(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kRecvActivation;
}

}  // namespace

SimResult simulate_schedule(const std::vector<std::vector<PipelineAction>>& lists, int stages,
                            const SimCosts& costs) {
  const int n = static_cast<int>(lists.size());
  if (n == 0 || stages < n) {
    SimResult result;
    result.error = fmt::format("{} ranks for {} stages", n, stages);
    return result;
  }
  std::vector<int> stage_rank(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s)
    stage_rank[s] = s % n;
  return simulate_schedule(lists, stage_rank, costs);
}

SimResult simulate_schedule(const std::vector<std::vector<PipelineAction>>& lists,
                            const std::vector<int>& stage_rank, const SimCosts& costs) {
  return simulate_schedule(lists, stage_rank, std::vector<SimCosts>(lists.size(), costs));
}

SimResult simulate_schedule(const std::vector<std::vector<PipelineAction>>& lists,
                            const std::vector<int>& stage_rank,
                            const std::vector<SimCosts>& rank_costs) {
  SimResult result;
  const int n = static_cast<int>(lists.size());
  const int stages = static_cast<int>(stage_rank.size());
  if (n == 0 || stages < n || rank_costs.size() != lists.size()) {
    result.error = fmt::format("{} ranks for {} stages", n, stages);
    return result;
  }
  const auto rank_of = [&](int stage) { return stage_rank[stage]; };
  const bool lane_per_direction = rank_costs[0].lane_per_direction;
  // The lane of a flow's sends or receives: one a flow, or one a flow and direction.
  const bool lane_per_peer = rank_costs[0].lane_per_peer;
  const auto lane_of = [&](bool activations, bool send, int peer) {
    return std::pair<int, int>((activations ? 0 : 2) + (lane_per_direction && !send ? 1 : 0),
                               lane_per_peer ? peer : -1);
  };
  std::vector<Rank> ranks(static_cast<size_t>(n));
  std::vector<int> working_of(static_cast<size_t>(stages), -1);  // recompute: per stage
  // Hand-overs between two stages of one rank: (receiving stage, micro-batch, activation).
  std::set<std::tuple<int, int, bool>> handed_over;
  const auto cost_of = [&](int r, ActionKind kind) {
    const SimCosts& costs = rank_costs[r];
    switch (kind) {
      case ActionKind::kForward:
        return costs.forward;
      case ActionKind::kBackward:
        return costs.backward;
      case ActionKind::kBackwardInput:
        return costs.backward_input;
      case ActionKind::kBackwardWeight:
        return costs.backward_weight;
      default:
        return 0.0;
    }
  };
  for (bool moved = true; moved;) {
    moved = false;
    // Every rank runs until it must wait for a message.
    for (int r = 0; r < n; ++r) {
      Rank& me = ranks[r];
      while (me.next < lists[r].size()) {
        const PipelineAction& a = lists[r][me.next];
        if (a.stage < 0 || a.stage >= stages || rank_of(a.stage) != r) {
          result.error = fmt::format("rank {}: {} of stage {}, which runs on rank {}", r,
                                     action_name(a.kind), a.stage, rank_of(a.stage));
          return result;
        }
        if (me.waiting != nullptr) break;  // until its message arrives (below)
        if (is_compute(a.kind)) {
          double cost = cost_of(r, a.kind);
          int& working = working_of[a.stage];
          if (a.kind != ActionKind::kForward && rank_costs[r].recompute && working != a.micro_batch)
            cost += rank_costs[r].forward;  // forwarded again from its input
          working = a.micro_batch;
          if (rank_costs[r].gather > 0)
            me.clock =
                after_gather(me, rank_costs[r].gather, std::max(1, rank_costs[r].gather_ahead));
          me.clock += cost;
          me.busy += cost;
          if (a.kind == ActionKind::kForward) me.peak = std::max(me.peak, ++me.live);
          if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --me.live;
        } else if (is_transfer(a.kind)) {
          const bool send =
              a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGradient;
          const bool forward_flow = is_activation(a.kind);
          // The message belongs to the stage that receives it.
          const int to_stage = send ? (forward_flow ? a.stage + 1 : a.stage - 1) : a.stage;
          const int from_stage = send ? a.stage : (forward_flow ? a.stage - 1 : a.stage + 1);
          if (to_stage < 0 || to_stage >= stages || from_stage < 0 || from_stage >= stages) {
            result.error = fmt::format("rank {}: {} of micro-batch {} on stage {} has no peer", r,
                                       action_name(a.kind), a.micro_batch, a.stage);
            return result;
          }
          if (rank_of(send ? to_stage : from_stage) == r) {
            // A hand-over in memory between two stages of this rank.
            const std::tuple<int, int, bool> message{to_stage, a.micro_batch, forward_flow};
            if (send) {
              handed_over.insert(message);
            } else if (handed_over.erase(message) == 0) {
              result.error = fmt::format(
                  "rank {}: {} of micro-batch {} for stage {} from its own stage {} before that "
                  "stage sent it",
                  r, action_name(a.kind), a.micro_batch, a.stage, from_stage);
              return result;
            }
            ++me.next;
            moved = true;
            continue;
          }
          Lane& lane = me.lanes[lane_of(forward_flow, send, rank_of(send ? to_stage : from_stage))];
          lane.ops.push_back(
              {send, rank_of(send ? to_stage : from_stage), to_stage, a.micro_batch, me.clock});
          if (!send) {
            me.waiting = &lane.ops.back();
            moved = true;
            continue;  // ++next once it has arrived
          }
        }
        ++me.next;
        moved = true;
      }
    }
    // Messages move where a send heads its lane and the matching receive heads the peer's.
    for (int r = 0; r < n; ++r)
      for (auto& [key, lane] : ranks[r].lanes) {
        if (lane.ops.empty() || !lane.ops.front().send) continue;
        LaneOp& send = lane.ops.front();
        Lane& theirs = ranks[send.peer].lanes[lane_of(key.first < 2, false, r)];
        if (theirs.ops.empty() || theirs.ops.front().send) continue;
        LaneOp& recv = theirs.ops.front();
        if (recv.peer != r) continue;  // it waits for another rank first
        if (recv.micro_batch != send.micro_batch || recv.stage != send.stage) {
          result.error = fmt::format(
              "rank {} receives micro-batch {} for stage {} from rank {}, which sends "
              "micro-batch {} for stage {} first",
              send.peer, recv.micro_batch, recv.stage, r, send.micro_batch, send.stage);
          return result;
        }
        const double at = std::max({send.posted, recv.posted, lane.free_at, theirs.free_at}) +
                          rank_costs[r].transfer;
        lane.free_at = theirs.free_at = at;
        // Every receive blocks its rank as it is posted: that rank goes on now.
        Rank& receiver = ranks[send.peer];
        receiver.clock = std::max(receiver.clock, at);
        receiver.waiting = nullptr;
        ++receiver.next;
        lane.ops.pop_front();
        theirs.ops.pop_front();
        moved = true;
      }
  }
  for (int r = 0; r < n; ++r) {
    Rank& me = ranks[r];
    if (me.next < lists[r].size()) {
      const PipelineAction& a = lists[r][me.next];
      result.error = fmt::format("deadlock: rank {} waits at {} of micro-batch {} (stage {})", r,
                                 action_name(a.kind), a.micro_batch, a.stage);
      return result;
    }
    for (const auto& [key, lane] : me.lanes)
      if (!lane.ops.empty()) {
        result.error = fmt::format(
            "rank {}: its send of micro-batch {} to rank {} is never "
            "received",
            r, lane.ops.front().micro_batch, lane.ops.front().peer);
        return result;
      }
  }
  for (int r = 0; r < n; ++r) {
    const Rank& me = ranks[r];
    double end = me.clock;
    for (const auto& [key, lane] : me.lanes)
      end = std::max(end, lane.free_at);
    result.step_time = std::max(result.step_time, end);
    result.busy.push_back(me.busy);
    result.peak_live.push_back(me.peak);
    result.gather_wait.push_back(me.gather_wait);
  }
  double idle = 0;
  for (double b : result.busy)
    idle += result.step_time > 0 ? 1 - b / result.step_time : 0;
  result.bubble = idle / n;
  result.ok = true;
  return result;
}

std::vector<std::vector<PipelineAction>> plan_all_ranks(PipelineSchedule schedule, int ranks,
                                                        int micro_batches, int chunks) {
  std::vector<std::vector<PipelineAction>> all;
  for (int r = 0; r < ranks; ++r)
    all.push_back(plan_rank_schedule(schedule, r, ranks, chunks, micro_batches));
  return all;
}

SimResult simulate_plan(PipelineSchedule schedule, int ranks, int chunks, int micro_batches,
                        const SimCosts& costs) {
  return simulate_schedule(plan_all_ranks(schedule, ranks, micro_batches, chunks),
                           stage_ranks(schedule, ranks, chunks), costs);
}

}  // namespace ddp
