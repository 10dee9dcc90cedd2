// The schedules' oracle on its own and on every schedule: closed forms of the bubble and of
// the live activations for equal unit costs and free transfers, no deadlock under rendezvous
// transfers, and lists that are wrong on purpose (a deadlock, a mismatch, a lost message).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "engine/pipeline/schedule.h"
#include "engine/pipeline/simulate.h"
#include "runtime/error.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace ddp {
namespace {

SimCosts unit_costs() {
  SimCosts costs;
  costs.forward = costs.backward = 1;  // F = B = 1, transfers free
  return costs;
}

TEST(Simulator, GpipeAndOneFOneBHaveTheBubbleOfTheirClosedForm) {
  for (PipelineSchedule schedule :
       {PipelineSchedule::kGpipe, PipelineSchedule::kOneForwardOneBackward})
    for (int stages = 1; stages <= 5; ++stages)
      for (int micro = 1; micro <= 12; ++micro) {
        const SimResult r =
            simulate_schedule(plan_all_ranks(schedule, stages, micro), stages, unit_costs());
        ASSERT_TRUE(r.ok) << r.error;
        const double ideal = (stages - 1.0) / (micro + stages - 1.0);
        EXPECT_NEAR(r.bubble, ideal, 1e-12)
            << schedule_name(schedule) << " P=" << stages << " M=" << micro;
        EXPECT_DOUBLE_EQ(r.step_time, 2.0 * (micro + stages - 1));
        for (double busy : r.busy)
          EXPECT_DOUBLE_EQ(busy, 2.0 * micro);
      }
}

TEST(Simulator, LiveActivationsAreTheScheduleBounds) {
  for (int stages = 1; stages <= 4; ++stages)
    for (int micro = 1; micro <= 9; ++micro) {
      const auto run = [&](PipelineSchedule schedule) {
        const SimResult r =
            simulate_schedule(plan_all_ranks(schedule, stages, micro), stages, unit_costs());
        EXPECT_TRUE(r.ok) << r.error;
        return r.peak_live;
      };
      const auto gpipe = run(PipelineSchedule::kGpipe);
      const auto one_f_one_b = run(PipelineSchedule::kOneForwardOneBackward);
      const auto pairs = run(PipelineSchedule::kPairs);
      for (int s = 0; s < stages; ++s) {
        EXPECT_EQ(gpipe[s], micro);
        EXPECT_EQ(one_f_one_b[s], std::min(stages - s, micro)) << "P=" << stages << " s=" << s;
        EXPECT_EQ(pairs[s], std::min(2, micro));
      }
    }
}

// Every schedule that the flags accept, one lane a flow and a peer direction (Gloo's and
// MPI's point-to-point, the CPU's); the one-chunk ones also with one lane a flow (NCCL's).
TEST(Simulator, EveryScheduleRunsWithoutDeadlockUnderRendezvousTransfers) {
  for (PipelineSchedule schedule : all_schedules())
    for (int stages = 1; stages <= 5; ++stages)
      for (int micro = 1; micro <= 9; ++micro)
        for (int asked : {0, 3}) {
          int chunks = 0;
          try {
            chunks = schedule_chunks(schedule, asked, stages, 3 * stages, micro);
          } catch (const UsageError&) {
            continue;  // refused at start
          }
          for (const bool per_peer : {false, true}) {
            if (chunks > 1 && !per_peer) continue;
            SimCosts costs;
            costs.transfer = 0.25;  // transfers that take time change the timing only
            costs.lane_per_direction = costs.lane_per_peer = per_peer;
            const SimResult r = simulate_plan(schedule, stages, chunks, micro, costs);
            EXPECT_TRUE(r.ok) << schedule_name(schedule) << " P=" << stages << " V=" << chunks
                              << " M=" << micro << ": " << r.error;
            EXPECT_GT(r.step_time, 0);
          }
        }
}

// ZeRO 3's kUnshard and kReshard (add_unshard_reshard) on every schedule's lists: each action
// that reads a stage's parameters (forward, backward, input half; never a weight half) has its
// kUnshard just before the receive and reduction announcement that lead up to it, with nothing
// of another stage between; each stage's kReshard follows its last such action; taken out, the
// list is the one given; and the simulator steps through them as through markers.
TEST(Simulator, ZeroThreesUnshardComesBeforeEachReadsReceiveAndReshardAfterTheLast) {
  const auto reads = [](ActionKind k) {
    return k == ActionKind::kForward || k == ActionKind::kBackward ||
           k == ActionKind::kBackwardInput;
  };
  int checked = 0;
  for (PipelineSchedule schedule : all_schedules())
    for (int stages = 1; stages <= 4; ++stages)
      for (int micro = 1; micro <= 8; ++micro) {
        int chunks = 0;
        try {
          chunks = schedule_chunks(schedule, 0, stages, 3 * stages, micro);
        } catch (const UsageError&) {
          continue;
        }
        const std::vector<std::vector<PipelineAction>> plain =
            plan_all_ranks(schedule, stages, micro, chunks);
        std::vector<std::vector<PipelineAction>> zero3;
        for (const std::vector<PipelineAction>& list : plain) {
          const std::vector<PipelineAction> out = add_unshard_reshard(list);
          const std::string where =
              fmt::format("{} P={} M={}", schedule_name(schedule), stages, micro);
          std::vector<PipelineAction> without;
          std::map<int, size_t> resharded;  // stage -> where
          for (size_t i = 0; i < out.size(); ++i) {
            const PipelineAction& a = out[i];
            if (a.kind == ActionKind::kReshard) {
              EXPECT_TRUE(resharded.emplace(a.stage, i).second) << where;
              continue;
            }
            if (a.kind == ActionKind::kUnshard) continue;
            without.push_back(a);
            EXPECT_EQ(resharded.count(a.stage) > 0 && reads(a.kind), false)
                << where << ": stage " << a.stage << " read after its reshard";
            if (!reads(a.kind)) continue;
            // Back from the action: its own receive or announcement, then its kUnshard, with
            // none of them before it (it heads the run).
            const auto leads_up = [&](size_t k) {
              return out[k].stage == a.stage && (out[k].kind == ActionKind::kReduceGrad ||
                                                 ((out[k].kind == ActionKind::kRecvActivation ||
                                                   out[k].kind == ActionKind::kRecvGradient) &&
                                                  out[k].micro_batch == a.micro_batch));
            };
            size_t j = i;
            while (j > 0 && leads_up(j - 1))
              --j;
            ASSERT_GT(j, 0u) << where;
            EXPECT_EQ(out[j - 1], (PipelineAction{ActionKind::kUnshard, a.micro_batch, a.stage}))
                << where << ": " << action_name(a.kind) << " " << a.micro_batch << " of stage "
                << a.stage;
            EXPECT_FALSE(j >= 2 && leads_up(j - 2))
                << where << ": the kUnshard of " << action_name(a.kind) << " " << a.micro_batch
                << " of stage " << a.stage << " comes after what leads up to it";
            ++checked;
          }
          EXPECT_EQ(without, list) << where;
          int unshards = 0, read_count = 0;
          for (const PipelineAction& a : out) {
            unshards += a.kind == ActionKind::kUnshard;
            read_count += reads(a.kind);
          }
          EXPECT_EQ(unshards, read_count) << where;
          zero3.push_back(out);
        }
        SimCosts costs = unit_costs();
        costs.transfer = 0.25;
        costs.lane_per_direction = costs.lane_per_peer = true;  // every schedule's (above)
        const std::vector<int> rank_of = stage_ranks(schedule, stages, chunks);
        const SimResult a = simulate_schedule(plain, rank_of, costs);
        const SimResult b = simulate_schedule(zero3, rank_of, costs);
        ASSERT_TRUE(a.ok) << a.error;
        ASSERT_TRUE(b.ok) << b.error;
        EXPECT_DOUBLE_EQ(a.step_time, b.step_time);
      }
  EXPECT_GT(checked, 1000);
  // A list given twice is refused.
  const std::vector<PipelineAction> once =
      add_unshard_reshard(plan_rank_schedule(PipelineSchedule::kGpipe, 0, 1, 1, 2));
  EXPECT_THROW(add_unshard_reshard(once), Error);
}

// LibTorch's weight halves may read the parameters (weight_half_reads): then each stage's
// kReshard follows its last action of any compute kind, weight halves included, and nothing else
// moves; without it, the zero-bubble schedules reshard some stage before its last weight half.
TEST(Simulator, ReshardFollowsTheLastWeightHalfWhereWeightHalvesRead) {
  int earlier = 0;
  for (PipelineSchedule schedule : all_schedules())
    for (int stages = 2; stages <= 4; ++stages) {
      const int micro = 2 * stages;
      int chunks = 0;
      try {
        chunks = schedule_chunks(schedule, 0, stages, 3 * stages, micro);
      } catch (const UsageError&) {
        continue;
      }
      for (const std::vector<PipelineAction>& list :
           plan_all_ranks(schedule, stages, micro, chunks)) {
        const std::string where = fmt::format("{} P={}", schedule_name(schedule), stages);
        const std::vector<PipelineAction> out = add_unshard_reshard(list, true);
        const std::vector<PipelineAction> usual = add_unshard_reshard(list);
        std::map<int, size_t> last_compute, reshard;
        for (size_t i = 0; i < out.size(); ++i) {
          const ActionKind k = out[i].kind;
          if (k == ActionKind::kForward || k == ActionKind::kBackward ||
              k == ActionKind::kBackwardInput || k == ActionKind::kBackwardWeight)
            last_compute[out[i].stage] = i;
          if (k == ActionKind::kReshard) reshard[out[i].stage] = i;
        }
        for (const auto& [stage, at] : last_compute)
          EXPECT_EQ(reshard.at(stage), at + 1) << where << " stage " << stage;
        std::vector<PipelineAction> a, b;  // the two without their kReshards
        for (const PipelineAction& x : out)
          if (x.kind != ActionKind::kReshard) a.push_back(x);
        for (const PipelineAction& x : usual)
          if (x.kind != ActionKind::kReshard) b.push_back(x);
        EXPECT_EQ(a, b) << where;
        earlier += out != usual;
      }
    }
  EXPECT_GT(earlier, 0);
}

TEST(Simulator, ListsThatCannotWorkAreNamed) {
  const std::vector<PipelineAction> stage0 = {{ActionKind::kForward, 0, 0},
                                              {ActionKind::kSendActivation, 0, 0},
                                              {ActionKind::kRecvGradient, 0, 0},
                                              {ActionKind::kBackward, 0, 0}};
  const std::vector<PipelineAction> stage1 = {{ActionKind::kRecvActivation, 0, 1},
                                              {ActionKind::kForward, 0, 1},
                                              {ActionKind::kBackward, 0, 1},
                                              {ActionKind::kSendGradient, 0, 1}};
  EXPECT_TRUE(simulate_schedule({stage0, stage1}, 2, unit_costs()).ok);
  // Stage 0 waits for the gradient before it sends the activation: each waits for the other.
  std::vector<PipelineAction> waits_first = stage0;
  std::swap(waits_first[1], waits_first[2]);
  SimResult r = simulate_schedule({waits_first, stage1}, 2, unit_costs());
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock: rank 0 waits at recv_gradient of micro-batch 0"),
            std::string::npos)
      << r.error;
  // Two micro-batches sent in one order and received in the other.
  const auto two = plan_all_ranks(PipelineSchedule::kGpipe, 2, 2);
  std::vector<PipelineAction> swapped = two[1];
  std::swap(swapped[0], swapped[3]);  // recv_activation 1 ... recv_activation 0
  std::swap(swapped[1], swapped[4]);
  r = simulate_schedule({two[0], swapped}, 2, unit_costs());
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("which sends micro-batch 0 for stage 1 first"), std::string::npos)
      << r.error;
  // A send nobody receives.
  std::vector<PipelineAction> extra = stage0;
  extra.push_back({ActionKind::kSendActivation, 1, 0});
  r = simulate_schedule({extra, stage1}, 2, unit_costs());
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("never received"), std::string::npos) << r.error;
  // An action of a stage that another rank runs.
  r = simulate_schedule({stage1, stage0}, 2, unit_costs());
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("which runs on rank"), std::string::npos) << r.error;
}

// Four stages on two ranks (rank 0 runs stages 0 and 2): both micro-batches' sends from
// stage 0 go out before rank 0 receives stage 2's input. With buffered sends that works; with
// rendezvous transfers on one activation lane a rank, rank 0's second send waits for rank 1,
// whose lane is held by its own send to rank 0: a deadlock, which NCCL would have too.
TEST(Simulator, RendezvousTransfersDeadlockWhereBufferedOnesWouldNot) {
  using K = ActionKind;
  const std::vector<PipelineAction> rank0 = {{K::kForward, 0, 0},        {K::kSendActivation, 0, 0},
                                             {K::kForward, 1, 0},        {K::kSendActivation, 1, 0},
                                             {K::kRecvActivation, 0, 2}, {K::kForward, 0, 2},
                                             {K::kRecvActivation, 1, 2}, {K::kForward, 1, 2}};
  const std::vector<PipelineAction> rank1 = {
      {K::kRecvActivation, 0, 1}, {K::kForward, 0, 1}, {K::kSendActivation, 0, 1},
      {K::kRecvActivation, 1, 1}, {K::kForward, 1, 1}, {K::kSendActivation, 1, 1}};
  const SimResult r = simulate_schedule({rank0, rank1}, 3, unit_costs());
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
  // Receiving stage 2's input before the second send resolves it.
  std::vector<PipelineAction> fixed = rank0;
  std::swap(fixed[2], fixed[4]);  // recv (s2, 0) before forward (s0, 1)
  std::swap(fixed[3], fixed[5]);
  const SimResult ok = simulate_schedule({fixed, rank1}, 3, unit_costs());
  EXPECT_TRUE(ok.ok) << ok.error;
}

TEST(Simulator, TransfersAddToTheCriticalPath) {
  // Two stages, one micro-batch: F0 -> t -> F1 B1 -> t -> B0.
  SimCosts costs = unit_costs();
  costs.transfer = 0.5;
  const SimResult r = simulate_schedule(plan_all_ranks(PipelineSchedule::kGpipe, 2, 1), 2, costs);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_DOUBLE_EQ(r.step_time, 1 + 0.5 + 1 + 1 + 0.5 + 1);
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

std::vector<std::vector<PipelineAction>> interleaved(int ranks, int chunks, int micro) {
  std::vector<std::vector<PipelineAction>> all;
  for (int r = 0; r < ranks; ++r)
    all.push_back(
        lower_schedule(plan_interleaved_compute(r, ranks, chunks, micro), ranks * chunks));
  return all;
}

// Interleaved 1F1B (the planner alone: the runners hold one chunk a rank today): every chunk's
// micro-batch forwarded and backwarded once, no deadlock, and the bubble of its closed form
// (P-1)/(V*M+P-1) with unit costs per chunk action; one chunk is plain 1F1B.
TEST(Simulator, InterleavedOneFOneBHasTheBubbleOfItsClosedForm) {
  for (int ranks = 2; ranks <= 4; ++ranks)
    for (int chunks = 1; chunks <= 3; ++chunks)
      for (int micro = ranks; micro <= 3 * ranks; micro += ranks) {
        const auto lists = interleaved(ranks, chunks, micro);
        for (int r = 0; r < ranks; ++r) {
          std::map<std::pair<int, int>, int> forwards, backwards;  // (stage, mb) -> count
          for (const PipelineAction& a : lists[r]) {
            if (a.kind == ActionKind::kForward) ++forwards[{a.stage, a.micro_batch}];
            if (a.kind == ActionKind::kBackward) ++backwards[{a.stage, a.micro_batch}];
          }
          EXPECT_EQ(forwards.size(), static_cast<size_t>(chunks * micro));
          EXPECT_EQ(backwards.size(), static_cast<size_t>(chunks * micro));
          for (const auto& [key, n] : forwards)
            EXPECT_EQ(n, 1);
        }
        // Its chunks' sends and receives share the activation lane: with one lane a flow (ddp's
        // communicators today) a rank's receive queues behind its own unmatched send, so the
        // executor needs them grouped (a lane a direction), as Megatron-LM groups them.
        SimCosts costs = unit_costs();
        if (chunks > 1) {
          const SimResult shared = simulate_schedule(lists, ranks * chunks, costs);
          EXPECT_FALSE(shared.ok) << "P=" << ranks << " V=" << chunks << " M=" << micro;
          EXPECT_NE(shared.error.find("deadlock"), std::string::npos) << shared.error;
        }
        costs.lane_per_direction = true;
        const SimResult sim = simulate_schedule(lists, ranks * chunks, costs);
        ASSERT_TRUE(sim.ok) << "P=" << ranks << " V=" << chunks << " M=" << micro << ": "
                            << sim.error;
        EXPECT_NEAR(sim.bubble, (ranks - 1.0) / (chunks * micro + ranks - 1.0), 1e-12)
            << "P=" << ranks << " V=" << chunks << " M=" << micro;
        if (chunks == 1)
          for (int r = 0; r < ranks; ++r)
            EXPECT_EQ(lists[r],
                      plan_schedule(PipelineSchedule::kOneForwardOneBackward, r, ranks, micro));
      }
  EXPECT_THROW(plan_interleaved_compute(0, 4, 2, 6), UsageError);  // 6 is not a multiple of 4
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// ZB-H1 against 1F1B with F = B = W = 1 (1F1B's whole backward costs B + W = 2), free
// transfers: a stage idles P - 1 units instead of 3 (P - 1), a third (the paper's
// (P - 1)(F + B - W) against (P - 1)(F + B + W)); each micro-batch's B and W once; live
// activations on any stage no more than 1F1B's peak; no deadlock under rendezvous transfers.
TEST(Simulator, ZeroBubbleH1IdlesAThirdOfOneFOneBWithItsMemory) {
  SimCosts costs;
  costs.forward = costs.backward_input = costs.backward_weight = 1;
  costs.backward = 2;
  for (int stages = 2; stages <= 6; ++stages)
    for (int micro = stages; micro <= 3 * stages; ++micro) {
      const auto zb = plan_all_ranks(PipelineSchedule::kZeroBubbleH1, stages, micro);
      const SimResult z = simulate_schedule(zb, stages, costs);
      const SimResult o = simulate_schedule(
          plan_all_ranks(PipelineSchedule::kOneForwardOneBackward, stages, micro), stages, costs);
      ASSERT_TRUE(z.ok && o.ok) << z.error << o.error;
      for (int r = 0; r < stages; ++r) {
        EXPECT_DOUBLE_EQ(z.busy[r], 3.0 * micro);
        EXPECT_DOUBLE_EQ(z.step_time - z.busy[r], stages - 1.0) << "P=" << stages << " r=" << r;
        EXPECT_DOUBLE_EQ(o.step_time - o.busy[r], 3.0 * (stages - 1));
        EXPECT_LE(z.peak_live[r], o.peak_live[0]);  // 1F1B's peak: its first stage's, P
        std::map<std::pair<int, int>, int> count;   // (kind, mb) -> times
        for (const PipelineAction& a : zb[r])
          if (is_compute(a.kind)) ++count[{static_cast<int>(a.kind), a.micro_batch}];
        for (ActionKind kind :
             {ActionKind::kForward, ActionKind::kBackwardInput, ActionKind::kBackwardWeight})
          for (int mb = 0; mb < micro; ++mb)
            EXPECT_EQ((count[{static_cast<int>(kind), mb}]), 1) << action_name(kind) << mb;
        EXPECT_EQ(count.size(), 3u * micro);
      }
      costs.transfer = 0.25;  // slower transfers change the timing, never the outcome
      EXPECT_TRUE(simulate_schedule(zb, stages, costs).ok);
      costs.transfer = 0;
    }
  EXPECT_EQ(std::string(schedule_name(PipelineSchedule::kZeroBubbleH1)), "zb-h1");
  EXPECT_TRUE(splits_backward(PipelineSchedule::kZeroBubbleH1));
  EXPECT_FALSE(splits_backward(PipelineSchedule::kOneForwardOneBackward));
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// ZB-V with F = B = W = 1 per chunk (a chunk is half a ZB-H1 stage, so ZB-H1's costs are 2
// there): every stage's micro-batch forwarded, input- and weight-backwarded once, on the
// rank of its V; no deadlock with rendezvous transfers (a lane a peer and direction, as the
// CPU's backends have them); idle time below ZB-H1's; at most 2P chunk activations held (1F1B's
// peak memory); the middle of the V is handed over on its rank.
TEST(Simulator, ZeroBubbleVIdlesLessThanZeroBubbleH1WithinItsMemory) {
  SimCosts chunk;
  chunk.forward = chunk.backward_input = chunk.backward_weight = 1;
  chunk.lane_per_direction = chunk.lane_per_peer = true;
  SimCosts stage = chunk;
  stage.forward = stage.backward_input = stage.backward_weight = 2;
  for (int ranks = 2; ranks <= 5; ++ranks)
    for (int micro = 1; micro <= 3 * ranks; ++micro) {
      const std::vector<int> placement = stage_ranks(PipelineSchedule::kZeroBubbleV, ranks, 2);
      for (int s = 0; s < ranks; ++s) {
        EXPECT_EQ(placement[s], s);
        EXPECT_EQ(placement[2 * ranks - 1 - s], s);
      }
      const auto lists = plan_all_ranks(PipelineSchedule::kZeroBubbleV, ranks, micro, 2);
      const SimResult v = simulate_schedule(lists, placement, chunk);
      ASSERT_TRUE(v.ok) << "P=" << ranks << " M=" << micro << ": " << v.error;
      const SimResult h1 = simulate_plan(PipelineSchedule::kZeroBubbleH1, ranks, 1, micro, stage);
      ASSERT_TRUE(h1.ok) << h1.error;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_DOUBLE_EQ(v.busy[r], h1.busy[r]);  // the same work
        EXPECT_LE(v.peak_live[r], 2 * ranks);
        std::map<std::tuple<int, int, int>, int> count;  // (kind, stage, mb) -> times
        for (const PipelineAction& a : lists[r])
          if (is_compute(a.kind)) {
            EXPECT_EQ(placement[a.stage], r);
            ++count[{static_cast<int>(a.kind), a.stage, a.micro_batch}];
          }
        EXPECT_EQ(count.size(), 6u * micro);
        for (const auto& [key, n] : count)
          EXPECT_EQ(n, 1);
      }
      if (micro >= ranks) EXPECT_LT(v.step_time, h1.step_time) << "P=" << ranks << " M=" << micro;
    }
  EXPECT_EQ(simulate_plan(PipelineSchedule::kZeroBubbleV, 4, 2, 8, chunk).step_time, 51.0);
}

// The flags' combinations: one line each naming what to give.
TEST(ScheduleChunks, BadCombinationsAreOneLineErrors) {
  EXPECT_EQ(schedule_chunks(PipelineSchedule::kOneForwardOneBackward, 0, 2, 4, 4), 1);
  EXPECT_EQ(schedule_chunks(PipelineSchedule::kInterleaved, 0, 2, 4, 4), 2);
  EXPECT_EQ(schedule_chunks(PipelineSchedule::kInterleaved, 3, 2, 6, 4), 3);
  EXPECT_EQ(schedule_chunks(PipelineSchedule::kZeroBubbleV, 0, 2, 4, 3), 2);
  const auto message = [](PipelineSchedule s, int asked, int ranks, int layers, int micro) {
    try {
      schedule_chunks(s, asked, ranks, layers, micro);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(PipelineSchedule::kOneForwardOneBackward, 2, 2, 4, 4)
                .find("--virtual-stages 2: the 1f1b schedule holds one chunk"),
            std::string::npos);
  EXPECT_NE(message(PipelineSchedule::kZeroBubbleV, 3, 2, 8, 4).find("exactly 2 chunks"),
            std::string::npos);
  EXPECT_NE(message(PipelineSchedule::kInterleaved, 3, 2, 5, 4)
                .find("--pp 2 --virtual-stages 3: 6 stages of layers, but the model has 5"),
            std::string::npos);
  EXPECT_NE(message(PipelineSchedule::kInterleaved, 2, 2, 4, 3)
                .find("--micro-batches 3: the interleaved-1f1b schedule takes micro-batches in "
                      "groups of the 2 pipeline ranks"),
            std::string::npos);
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// --recompute in the simulator as the CPU's stage does it: one working set a stage, so a
// backward of a micro-batch other than the last forwarded first forwards it again. GPipe
// (every forward, then every backward from the first) recomputes every micro-batch but
// with one micro-batch (the last one's outputs are gone by its backward); 1F1B's last stage, which
// backwards each micro-batch right after its forward, recomputes none.
TEST(Simulator, RecomputeForwardsAgainWhatTheWorkingSetDoesNotHold) {
  SimCosts costs;
  costs.forward = 1;
  costs.backward = 2;
  costs.recompute = true;
  for (int stages = 2; stages <= 4; ++stages)
    for (int micro = 1; micro <= 8; ++micro) {
      const SimResult g = simulate_plan(PipelineSchedule::kGpipe, stages, 1, micro, costs);
      ASSERT_TRUE(g.ok) << g.error;
      for (double busy : g.busy)
        EXPECT_DOUBLE_EQ(busy, micro * 3.0 + (micro > 1 ? micro : 0));
      const SimResult o =
          simulate_plan(PipelineSchedule::kOneForwardOneBackward, stages, 1, micro, costs);
      ASSERT_TRUE(o.ok) << o.error;
      EXPECT_DOUBLE_EQ(o.busy[stages - 1], micro * 3.0);
      if (micro > 1) EXPECT_GT(o.busy[0], micro * 3.0);
    }
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// docs/pipeline.md's table of schedules is the simulator's: P = 4 ranks, M = 8 micro-batches, equal
// stages, F = B = W = 1 (a whole backward 2), free transfers, Gloo's lanes; activations in
// units of one stage's micro-batch (a chunk's is 1 / V of it); transfers: what rank 0 sends
// to other ranks in a step.
std::string schedule_row(PipelineSchedule schedule) {
  const int ranks = 4, micro = 8;
  const int chunks = schedule_chunks(schedule, 0, ranks, 64, micro);
  SimCosts costs;
  costs.forward = costs.backward_input = costs.backward_weight = 1;
  costs.backward = 2;
  costs.lane_per_direction = costs.lane_per_peer = true;
  const auto lists = plan_all_ranks(schedule, ranks, micro, chunks);
  const std::vector<int> placement = stage_ranks(schedule, ranks, chunks);
  const SimResult r = simulate_schedule(lists, placement, costs);
  EXPECT_TRUE(r.ok) << r.error;
  int peak = 0;
  for (int p : r.peak_live)
    peak = std::max(peak, p);
  int sends = 0;
  for (const PipelineAction& a : lists[0]) {
    const bool activation = a.kind == ActionKind::kSendActivation;
    if (!activation && a.kind != ActionKind::kSendGradient) continue;
    if (placement[activation ? a.stage + 1 : a.stage - 1] != 0) ++sends;
  }
  std::ostringstream row;
  row << "| `" << schedule_name(schedule) << "` | " << chunks << " | "
      << fmt::format("{:.1f} %", 100 * r.bubble) << " | "
      << fmt::format("{:g}", double(peak) / chunks) << " | " << sends << " |";
  return row.str();
}

// --zero 3's gathers (SimCosts::gather): one rank, GPipe's F0 F1 B0 B1 with F = 1, B = 2. Gathers
// of 0.5 hide behind the compute before them but the first; gathers of 3 set the pace (the lane
// runs one at a time, each issued when the compute before its own begins).
TEST(Simulator, ZeroThreeGathersCostWhatTheComputeBeforeThemDoesNotHide) {
  SimCosts costs;
  costs.forward = 1;
  costs.backward = 2;
  const auto step = [&](double gather, int ahead) {
    costs.gather = gather;
    costs.gather_ahead = ahead;
    const SimResult r = simulate_plan(PipelineSchedule::kGpipe, 1, 1, 2, costs);
    EXPECT_TRUE(r.ok) << r.error;
    return r;
  };
  EXPECT_DOUBLE_EQ(step(0, 1).step_time, 6);
  EXPECT_DOUBLE_EQ(step(0, 1).gather_wait[0], 0);
  EXPECT_DOUBLE_EQ(step(0.5, 1).step_time, 6.5);  // the first gather only
  EXPECT_DOUBLE_EQ(step(0.5, 1).gather_wait[0], 0.5);
  // g0 [0,3] F0 [3,4]; g1 [3,6] F1 [6,7]; g2 [6,9] B0 [9,11]; g3 [9,12] B1 [12,14].
  EXPECT_DOUBLE_EQ(step(3, 1).step_time, 14);
  EXPECT_DOUBLE_EQ(step(3, 1).gather_wait[0], 8);
  EXPECT_DOUBLE_EQ(step(3, 1).busy[0], 6);  // waiting is not compute
}

// Prefetching further (--zero-prefetch) helps where a long compute follows a short one: one
// rank's 1F1B (F B F B ...) with F = 1, B = 4 and gathers of 3: one ahead, each backward waits
// for a gather issued only when the forward before it began; two ahead, it was issued a
// backward earlier. It never makes a step slower, and gathers faster than compute cost only
// the first one.
TEST(Simulator, GatheringTwoAheadHidesWhatOneAheadCannot) {
  SimCosts costs;
  costs.forward = 1;
  costs.backward = 4;
  costs.gather = 3;
  const auto step = [&](int ahead, PipelineSchedule schedule, int ranks, int micro) {
    costs.gather_ahead = ahead;
    const SimResult r = simulate_plan(schedule, ranks, 1, micro, costs);
    EXPECT_TRUE(r.ok) << r.error;
    return r.step_time;
  };
  const double one = step(1, PipelineSchedule::kOneForwardOneBackward, 1, 4);
  const double two = step(2, PipelineSchedule::kOneForwardOneBackward, 1, 4);
  std::printf("1f1b, 1 rank, 4 micro-batches, F 1, B 4, gathers 3: one ahead %.1f, two %.1f\n", one,
              two);
  EXPECT_LT(two, one);
  for (PipelineSchedule schedule :
       {PipelineSchedule::kGpipe, PipelineSchedule::kOneForwardOneBackward})
    for (int ranks = 1; ranks <= 3; ++ranks)
      for (int micro = ranks; micro <= 6; ++micro) {
        costs.gather = 3;
        EXPECT_LE(step(2, schedule, ranks, micro), step(1, schedule, ranks, micro) + 1e-9)
            << schedule_name(schedule) << " " << ranks << " ranks " << micro;
        costs.gather = 0.25;  // under every compute: only each rank's first is exposed
        const double hidden = step(1, schedule, ranks, micro);
        costs.gather = 0;
        EXPECT_LE(hidden, step(1, schedule, ranks, micro) + 0.25 * ranks + 1e-9);
      }
}

TEST(ScheduleTable, ThePipelinePageHoldsTheSimulatorsFigures) {
  const char* page = DOCS_DIR "/pipeline.md";
  std::ifstream in(page);
  ASSERT_TRUE(in.good()) << page;
  std::stringstream text;
  text << in.rdbuf();
  for (PipelineSchedule schedule : all_schedules()) {
    const std::string row = schedule_row(schedule);
    EXPECT_NE(text.str().find(row), std::string::npos) << "docs/pipeline.md lacks the row\n" << row;
  }
}

// The GPU's lanes with several stages a rank (pipeline_lanes): every transfer between two
// ranks of every placement has its lane, one a flow, direction and peer (what the simulator
// checked the schedules under), and no rank uses two lanes of one number, so that lanes of one
// number can share a communicator without one rank's transfers queueing behind each other.
TEST(PipelineLanes, EveryTransferHasALaneOfItsOwnAndNoRankTwoOfOneNumber) {
  for (PipelineSchedule schedule : {PipelineSchedule::kInterleaved, PipelineSchedule::kZeroBubbleV})
    for (int ranks = 2; ranks <= 6; ++ranks)
      for (int chunks = 2; chunks <= 3; ++chunks) {
        if (schedule == PipelineSchedule::kZeroBubbleV && chunks != 2) continue;
        const std::vector<int> placement = stage_ranks(schedule, ranks, chunks);
        const std::map<PipelineLane, int> lanes = pipeline_lanes(placement);
        const std::string where =
            fmt::format("{} P={} V={}", schedule_name(schedule), ranks, chunks);
        size_t transfers = 0;
        for (size_t s = 0; s + 1 < placement.size(); ++s) {
          const int a = placement[s], b = placement[s + 1];
          if (a == b) continue;
          ++transfers;
          EXPECT_EQ(lanes.count(PipelineLane{true, a, b}), 1u) << where << " stage " << s;
          EXPECT_EQ(lanes.count(PipelineLane{false, b, a}), 1u) << where << " stage " << s;
        }
        EXPECT_GT(transfers, 0u) << where;
        std::map<std::pair<int, int>, int> uses;  // (rank, number) -> lanes
        for (const auto& [lane, number] : lanes) {
          EXPECT_GE(number, 0) << where;
          EXPECT_NE(lane.from, lane.to) << where;
          EXPECT_EQ(++uses[std::make_pair(lane.from, number)], 1) << where << " rank " << lane.from;
          EXPECT_EQ(++uses[std::make_pair(lane.to, number)], 1) << where << " rank " << lane.to;
        }
      }
  // Two ranks, two stages each in a loop: both flows both ways, four lanes, four numbers.
  const std::map<PipelineLane, int> two = pipeline_lanes({0, 1, 0, 1});
  EXPECT_EQ(two.size(), 4u);
  std::set<int> numbers;
  for (const auto& [lane, number] : two)
    numbers.insert(number);
  EXPECT_EQ(numbers.size(), 4u);
  EXPECT_TRUE(pipeline_lanes({0, 0}).empty());  // a hand-over in memory needs no lane
}

}  // namespace
}  // namespace ddp
