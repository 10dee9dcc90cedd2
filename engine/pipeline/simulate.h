// The schedules' oracle: runs every pipeline rank's lowered action list together with a cost
// for each action and returns the step time, each rank's busy time, the bubble and each
// rank's peak of live activations, or the deadlock or mismatch that stopped it. Pure.
//
// What it models is what the executor has: a rank runs its actions in order; a send is
// posted without blocking the rank, a receive blocks it until its message has arrived.
// Transfers are rendezvous (unbuffered, as NCCL's): a message moves once both its send and
// its receive are posted. By default each rank has one lane for activations and one for
// gradients; SimCosts adds a lane a direction and a peer, as the runners have (a lane a flow:
// StageLinks::lanes). The operations of a lane complete in the order they were posted, so a send
// nobody receives holds up its lane. A rank's step ends when its last action is done and its sends
// have completed (the executor waits for them).
#pragma once

#include <string>
#include <vector>

#include "engine/pipeline/schedule.h"

namespace ddp {

struct SimCosts {
  double forward = 1;
  double backward = 2;         // input and weight gradients together
  double backward_input = 1;   // the input half alone
  double backward_weight = 1;  // the weight half alone
  double transfer = 0;         // one activation or gradient between neighbouring ranks
  // false: one lane a rank for activations and one for gradients, each carrying that rank's
  // sends and receives in order (the schedules' strictest check); true: a lane for each
  // direction too, so that a rank's receive never queues behind its own send (grouped
  // send/recv, as Megatron-LM's interleaved schedule needs).
  bool lane_per_direction = false;
  // true: a lane a peer too (with lane_per_direction: a rank's sends to one peer wait only for
  // each other), as Gloo's and MPI's point-to-point operations, which the CPU runs on.
  bool lane_per_peer = false;
  // --recompute: a stage keeps one working set of layer outputs, of the micro-batch forwarded
  // last; a backward, input half or weight half of another micro-batch forwards it again
  // first (a forward's cost), as the CPU's stage does.
  bool recompute = false;
  // --zero 3: the stage's parameters are gathered over its data-parallel group before each
  // compute action reads them, `gather` each (its layers' gathers as one span), on a lane of
  // the rank's own that runs one gather at a time; a gather is issued when the compute
  // action `gather_ahead` before its own begins (--zero-prefetch; the first ones as the rank
  // reaches its first compute), so a rank waits only for what the compute before it does not
  // hide. 0: no gathers (ZeRO 0 to 2).
  double gather = 0;
  int gather_ahead = 1;
};

struct SimResult {
  bool ok = false;
  std::string error;                // why not ok: deadlock (who waits for what) or mismatch
  double step_time = 0;             // the slowest rank's
  std::vector<double> busy;         // per rank: compute time
  std::vector<int> peak_live;       // per rank: most micro-batches forwarded, not yet backwarded
  double bubble = 0;                // mean over ranks of idle / step_time
  std::vector<double> gather_wait;  // per rank: time its compute waited for gathers (--zero 3)
};

// `ranks[r]`: the actions of pipeline rank r for one step; stage index s runs on rank
// s % ranks.size() (one stage a rank, or interleaved chunks). `stages`: the stage indices.
SimResult simulate_schedule(const std::vector<std::vector<PipelineAction>>& ranks, int stages,
                            const SimCosts& costs);
// The same with stage s on rank stage_rank[s] (zb-v's V). A transfer between two stages of
// one rank is a hand-over in memory: free, and its receive must come after its send.
SimResult simulate_schedule(const std::vector<std::vector<PipelineAction>>& ranks,
                            const std::vector<int>& stage_rank, const SimCosts& costs);
// Per-rank costs (measured ones: stages differ); costs[r] for rank r, its transfer for the
// messages it sends.
SimResult simulate_schedule(const std::vector<std::vector<PipelineAction>>& ranks,
                            const std::vector<int>& stage_rank, const std::vector<SimCosts>& costs);

// Every rank's list of `schedule` for `ranks` pipeline ranks of `chunks` chunks each (one-chunk
// schedules: 1) and `micro_batches`; simulate them with stage_ranks(schedule, ranks, chunks).
std::vector<std::vector<PipelineAction>> plan_all_ranks(PipelineSchedule schedule, int ranks,
                                                        int micro_batches, int chunks = 1);
// plan_all_ranks and simulate_schedule together.
SimResult simulate_plan(PipelineSchedule schedule, int ranks, int chunks, int micro_batches,
                        const SimCosts& costs);

}  // namespace ddp
