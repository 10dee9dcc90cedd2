// Pipeline parallelism, the pure parts: which layers each stage owns (balanced by cost, or
// as the user gives them) and the order of a stage's actions for one step under every
// schedule (GPipe, 1F1B, pairs, ZB-H1, interleaved 1F1B, ZB-V). Schedules are plain lists, tested
// on their own (every micro-batch forwarded and backwarded once, sends matching receives, no
// deadlock, bounded live activations); the trainer runs them (engine/loop/trainer.cpp). The rank
// layout of dp x pp.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace ddp {

enum class PipelineSchedule {
  kGpipe,
  kOneForwardOneBackward,
  kPairs,
  kZeroBubbleH1,
  kInterleaved,
  kZeroBubbleV
};
const char* schedule_name(PipelineSchedule schedule);
// The schedule a --schedule name means; nullopt for an unknown name.
std::optional<PipelineSchedule> schedule_from_name(const std::string& name);
// "gpipe, 1f1b, ...": the names --schedule takes.
std::string schedule_names();
// Every schedule, in --help's order.
std::vector<PipelineSchedule> all_schedules();
// Whether the schedule splits backward into its input and weight halves (the runner must too).
bool splits_backward(PipelineSchedule schedule);

// What a front end calls the schedule's choices, for the errors the schedule library raises in
// its own words: ddptrain's flags (the defaults) or ddp::Pipeline's options.
struct ScheduleNames {
  std::string schedule = "--schedule";            // the schedule's name
  std::string ranks = "--pp";                     // the pipeline's ranks
  std::string chunks = "--virtual-stages";        // chunks of layers (stages) a rank
  std::string micro_batches = "--micro-batches";  // micro-batches a step
  std::string layers = "layers";                  // what a stage holds
  std::string model = "the model";                // what holds them
};

// How many chunks of layers (virtual stages) a rank holds under `schedule` when the user
// asked for `asked` (0: not given): 1 for the one-chunk schedules, `asked` (2 when not given)
// for interleaved-1f1b, 2 for zb-v. Throws UsageError naming the choices as `names` does for a
// combination that cannot run: chunks asked of a one-chunk schedule, zb-v with other than 2,
// fewer layers than ranks x chunks, micro-batches not a multiple of the ranks where the schedule
// takes them in groups of P. Pure.
int schedule_chunks(PipelineSchedule schedule, int asked, int ranks, int layers, int micro_batches,
                    const ScheduleNames& names = {});
// Where the P x V stages go: stage s runs on pipeline rank stage_ranks(...)[s]. In a loop
// (s mod P: every schedule but zb-v) or in a V (zb-v: rank r holds stages r and 2P - 1 - r, so
// the middle and the ends of the model meet on one rank). Pure.
std::vector<int> stage_ranks(PipelineSchedule schedule, int ranks, int chunks);

// One flow between two pipeline ranks in one direction: a lane of its own, so that its
// transfers complete in order and wait for nothing else (the simulator's lane a flow,
// direction and peer).
struct PipelineLane {
  bool activations;  // else gradients
  int from, to;      // pipeline ranks
  bool operator<(const PipelineLane& o) const {
    return std::tie(activations, from, to) < std::tie(o.activations, o.from, o.to);
  }
};
// The lanes of stages placed by `stage_rank` (a transfer between two stages of one rank is
// none), each with a number such that no rank has two lanes of one number: the lanes of one
// number can share a communicator, every rank using it for one lane at most. Numbered
// greedily in a fixed order, the same on every rank. Pure.
std::map<PipelineLane, int> pipeline_lanes(const std::vector<int>& stage_rank);

// What one stage does for one micro-batch. A planner writes the compute actions only
// (forward; backward, or its two halves); lower_schedule adds the transfers and the point
// where the data-parallel gradient reduction starts.
enum class ActionKind {
  kRecvActivation,  // from the previous stage (stage > 0)
  kForward,
  kSendActivation,  // to the next stage (not the last stage)
  kRecvGradient,    // from the next stage (not the last stage)
  kBackward,        // the input and weight gradients together
  kSendGradient,    // to the previous stage (stage > 0)
  kBackwardInput,   // the input gradient alone (what the previous stage waits for)
  kBackwardWeight,  // the weight gradient alone (may fill a bubble later)
  kReduceGrad,      // the next backward completes this stage's gradients: reduce them over
                    // the data-parallel group as it writes them
  kUnshard,         // --zero 3: the parameters the stage's next forward, backward or input half
                    // reads first start gathering (before the receive that action waits for)
  kReshard,         // --zero 3: the stage reads no more parameters this step: what it still
                    // holds gathered is let go
};
const char* action_name(ActionKind kind);
// Forward, backward and its halves: what a stage computes (the rest is communication).
bool is_compute(ActionKind kind);
// The actions that move a micro-batch's activations or gradients between stages.
bool is_transfer(ActionKind kind);

struct PipelineAction {
  ActionKind kind;
  int micro_batch;
  int stage = 0;  // the stage index it belongs to (several per rank with interleaving)
  bool operator==(const PipelineAction& other) const {
    return kind == other.kind && micro_batch == other.micro_batch && stage == other.stage;
  }
};

// The compute actions of stage `stage` of `stages` for one step of `micro_batches`, in the
// order the stage runs them. GPipe: every forward, then every backward. 1F1B (as
// Megatron-LM's non-interleaved schedule): stages - stage - 1 warm-up forwards, then one
// forward one backward, then the remaining backwards, so that a stage holds the activations
// of at most `stages - stage` micro-batches. Pairs (a small schedule, the example of adding
// one): micro-batches two at a time, both forwards then both backwards. ZB-H1 (Qi et al.,
// "Zero Bubble Pipeline Parallelism", ICLR 2024): each backward split into its input half B,
// which the previous stage waits for, and its weight half W; 1F1B's order of forwards and
// Bs, with stage s running each W s micro-batches late and its last s + 1 Ws at the end, so
// that the gradient crosses a stage in B's time and the Ws fill the tail: with F = B = W a
// stage idles P - 1 units a step against 1F1B's 3 (P - 1), and holds at most P micro-batches
// (1F1B's peak, on its first stage). Pure.
std::vector<PipelineAction> plan_compute(PipelineSchedule schedule, int stage, int stages,
                                         int micro_batches);
// Interleaved 1F1B (Megatron-LM's schedule with virtual stages): rank `rank` of `ranks` owns
// `chunks` chunks of layers, stage indices rank, rank + ranks, ... of ranks x chunks stages;
// micro-batches go through in groups of `ranks`, each group through every chunk in turn,
// with Megatron's warm-up of (ranks - rank - 1) x 2 + (chunks - 1) x ranks forwards. Needs
// micro_batches to be a multiple of ranks (UsageError otherwise). The compute actions of
// that rank, over all its chunks, in its order; lower them with ranks x chunks stages. Pure.
std::vector<PipelineAction> plan_interleaved_compute(int rank, int ranks, int chunks,
                                                     int micro_batches);
// ZB-V (Qi et al., the V-shaped zero-bubble schedule): two chunks a rank in a V, backward in
// halves, planned by list scheduling with unit costs (F = B = W): each rank, whenever free,
// runs an input half whose gradient has arrived, else a forward whose input has arrived
// while it holds fewer than 2P chunk activations (1F1B's peak memory), else a pending weight
// half; the oldest micro-batch first, then the later stage. Its lists, every rank's. Pure.
std::vector<std::vector<PipelineAction>> plan_zb_v_compute(int ranks, int micro_batches);

// The compute actions of pipeline rank `rank` of `ranks` holding `chunks` chunks, for any
// schedule (one-chunk schedules: the rank's stage is its index). Pure.
std::vector<PipelineAction> plan_rank_compute(PipelineSchedule schedule, int rank, int ranks,
                                              int chunks, int micro_batches);

// Adds to a stage's compute actions what connects them (as torch.distributed.pipelining's
// _add_send_recv): before a forward on a stage after the first, the receive of its input;
// after it, on a stage before the last, the send of its output; around a backward (or its
// input half) likewise the gradient's receive and send; and kReduceGrad before the action
// that last writes the stage's weight gradients. Pure.
// A transfer between two stages of one rank (zb-v's middle) stays in the list: the runner
// hands it over in memory. `stage_rank[s]`: the rank of stage s.
std::vector<PipelineAction> lower_schedule(const std::vector<PipelineAction>& compute, int stages);
std::vector<PipelineAction> lower_schedule(const std::vector<PipelineAction>& compute,
                                           const std::vector<int>& stage_rank);
// ZeRO 3's gathers as actions of a lowered list (torch.distributed.pipelining's UNSHARD and
// RESHARD, at the granularity of the parameters' first use): before each action that reads a
// stage's parameters (forward, backward, input half; a weight half reads none), kUnshard of that
// stage and micro-batch, ahead of the receive and the reduction's announcement that lead up to
// the action, so that the gather runs while the rank waits for the message; after a stage's
// last such action, kReshard of it. The stage gathers the rest of a pass's layers as it reaches
// them. `weight_half_reads`: a weight half reads the parameters too (LibTorch's, whose autograd
// nodes, layer norm's among them, may read a weight computing another's gradient), so the
// kReshard follows the stage's last weight half where that comes later. Pure.
std::vector<PipelineAction> add_unshard_reshard(const std::vector<PipelineAction>& lowered,
                                                bool weight_half_reads = false);
// lower_schedule(plan_compute(...)): what a stage's executor runs. Pure.
std::vector<PipelineAction> plan_schedule(PipelineSchedule schedule, int stage, int stages,
                                          int micro_batches);
// lower_schedule(plan_rank_compute(...), stage_ranks(...)): what a rank's executor runs. Pure.
std::vector<PipelineAction> plan_rank_schedule(PipelineSchedule schedule, int rank, int ranks,
                                               int chunks, int micro_batches);

// The most micro-batches whose activations a stage holds at once (forwarded, and their
// weight gradients not yet computed) under `actions`. Pure.
int peak_live_activations(const std::vector<PipelineAction>& actions);

// The activation slot each action of one stage's schedule uses, and where slots come free.
// A micro-batch takes a slot when its input arrives (its receive, or its forward on the
// first stage) and gives it back after its last action: its gradient's send (an
// asynchronous send, the GPU's, still reads the slot until then), its backward on the
// first stage, or its weight half where that comes later. Throws ddp::Error when `slots`
// are too few for the schedule. Pure.
struct SlotPlan {
  std::vector<int> slot;       // slot[i]: the slot action i works on
  std::vector<bool> releases;  // releases[i]: after action i, its micro-batch's slot is free
  int peak = 0;                // the most slots held at once
};
SlotPlan plan_slots(const std::vector<PipelineAction>& actions, int micro_batches, int slots);

// Contiguous stages of layers: stage s owns layers [bounds[s], bounds[s + 1]).
// Balanced by cost: the split of `layer_costs` (e.g. FLOPs) into `stages` contiguous parts
// whose largest part is smallest; every stage gets at least one layer. Pure.
std::vector<int> partition_by_cost(const std::vector<double>& layer_costs, int stages);
// With several stages a rank (stage s on rank stage_rank[s]): the contiguous stages whose
// largest rank total is smallest, what a rank computes being the sum of its stages; found by
// a bounded search from partition_by_cost's split (the best within the bound). Pure.
std::vector<int> partition_for_ranks(const std::vector<double>& layer_costs,
                                     const std::vector<int>& stage_rank);
// "--partition 0-2,3-5" for `layers` layers: contiguous, covering every layer once, in
// order; throws UsageError naming the flag and what is wrong.
std::vector<int> parse_partition(const std::string& text, int layers);

// Where a rank sits in a dp x pp job. Ranks of one stage are consecutive (rank = stage *
// replicas + replica, Megatron-LM's order), so that the data-parallel all-reduce, the
// heavier traffic, stays among neighbouring ranks; a replica's stages are `replicas` apart.
// With several chunks a rank (interleaved-1f1b, zb-v) the P pipeline ranks hold P x V stages
// of layers, stage s on pipeline rank stage_rank[s]; `stage` is then this rank's place in the
// pipeline (its index in the pipeline group), not one of the stages.
struct PipelineLayout {
  int stages = 1;    // pp: pipeline ranks
  int replicas = 1;  // dp
  int stage = 0;     // this rank's place in the pipeline
  int replica = 0;
  std::vector<int> bounds;      // stage s owns layers [bounds[s], bounds[s + 1])
  std::vector<int> stage_rank;  // stage s runs on pipeline rank stage_rank[s]
  int rank_of(int stage_index, int replica_index) const {
    return stage_index * replicas + replica_index;
  }
  int chunks() const { return static_cast<int>(stage_rank.size()) / stages; }
  // The stages that pipeline rank `pipe_rank` runs, in stage order.
  std::vector<int> stages_of(int pipe_rank) const;
};

// Where `rank` sits in a job of `world` ranks run as `stages` pipeline ranks times
// world / stages replicas, in PipelineLayout's order (rank = stage * replicas + replica): its
// stages, replicas, stage and replica (no bounds, no stage_rank). ddptrain and ddp::Pipeline
// place ranks alike. Throws UsageError when the world is not a multiple of the stage count,
// naming --pp and the world size. Pure.
PipelineLayout place_in_job(int world, int rank, int stages);

// The layout of `rank` in a world of `world` ranks split into `stages` pipeline ranks over the
// layer bounds `bounds` of the stages placed by `stage_rank` (empty: one stage a rank).
// Throws UsageError when the world is not a multiple of the stage count, naming --pp and the
// world size. Pure.
PipelineLayout plan_layout(int world, int rank, int stages, std::vector<int> bounds,
                           std::vector<int> stage_rank = {});

// "stage 0: layers 0-1 on ranks 0,1; stage 1: layers 2 on ranks 2,3" for the log. Pure.
std::string describe_layout(const PipelineLayout& layout);

// The fraction of a step a stage idles in an ideal pipeline of equal stages with free
// communication: (P - 1) / (M + P - 1).
double ideal_bubble(int stages, int micro_batches);

}  // namespace ddp
