// Schedules as action lists, and the layer partition.
#include "engine/pipeline/schedule.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <numeric>
#include <tuple>

#include "runtime/error.h"
#include "runtime/parse.h"

namespace ddp {

namespace {

// A planner writes the compute actions of pipeline rank `rank` of `ranks` holding `chunks`
// chunks (one-chunk schedules: the stage is the rank, chunks is 1).
using Planner = void (*)(std::vector<PipelineAction>* out, int rank, int ranks, int chunks,
                         int micro);

void forward(std::vector<PipelineAction>* out, int stage, int mb) {
  out->push_back({ActionKind::kForward, mb, stage});
}
void backward(std::vector<PipelineAction>* out, int stage, int mb) {
  out->push_back({ActionKind::kBackward, mb, stage});
}

void plan_gpipe(std::vector<PipelineAction>* out, int stage, int, int, int micro) {
  for (int mb = 0; mb < micro; ++mb)
    forward(out, stage, mb);
  for (int mb = 0; mb < micro; ++mb)
    backward(out, stage, mb);
}

// Warm-up, steady one-forward-one-backward, cool-down.
void plan_1f1b(std::vector<PipelineAction>* out, int stage, int stages, int, int micro) {
  const int warmup = std::min(stages - stage - 1, micro);
  for (int mb = 0; mb < warmup; ++mb)
    forward(out, stage, mb);
  const int steady = micro - warmup;
  for (int i = 0; i < steady; ++i) {
    forward(out, stage, warmup + i);
    backward(out, stage, i);
  }
  for (int mb = steady; mb < micro; ++mb)
    backward(out, stage, mb);
}

// 1F1B's order of forwards and input halves B; stage s holds back the weight halves W of
// its last s micro-batches, each done after a later B, so that the last stage runs its Bs
// early (the gradient reaches the first stage sooner) and every stage ends on s + 1 Ws that
// fill what would be its tail bubble. A stage holds at most P micro-batches (1F1B's peak).
void plan_zb_h1(std::vector<PipelineAction>* out, int stage, int stages, int, int micro) {
  const int warmup = std::min(stages - stage - 1, micro);
  for (int mb = 0; mb < warmup; ++mb)
    forward(out, stage, mb);
  int next_w = 0;  // the oldest micro-batch whose W is still to do
  const auto input_half = [&](int mb) {
    out->push_back({ActionKind::kBackwardInput, mb, stage});
    if (mb + 1 - next_w > stage) out->push_back({ActionKind::kBackwardWeight, next_w++, stage});
  };
  const int steady = micro - warmup;
  for (int i = 0; i < steady; ++i) {
    forward(out, stage, warmup + i);
    input_half(i);
  }
  for (int mb = steady; mb < micro; ++mb)
    input_half(mb);
  while (next_w < micro)
    out->push_back({ActionKind::kBackwardWeight, next_w++, stage});
}

void plan_pairs(std::vector<PipelineAction>* out, int stage, int, int, int micro) {
  for (int first = 0; first < micro; first += 2) {
    const int end = std::min(first + 2, micro);
    for (int mb = first; mb < end; ++mb)
      forward(out, stage, mb);
    for (int mb = first; mb < end; ++mb)
      backward(out, stage, mb);
  }
}

void plan_interleaved(std::vector<PipelineAction>* out, int rank, int ranks, int chunks,
                      int micro) {
  *out = plan_interleaved_compute(rank, ranks, chunks, micro);
}

void plan_zb_v(std::vector<PipelineAction>* out, int rank, int ranks, int, int micro) {
  *out = plan_zb_v_compute(ranks, micro)[rank];
}

enum class Chunks { kOne, kAsked, kTwo };  // how many a rank holds

struct ScheduleEntry {
  PipelineSchedule schedule;
  const char* name;
  Planner plan;
  bool splits_backward;
  Chunks chunks;
  bool v_shape;          // stages placed in a V (else in a loop)
  bool groups_of_ranks;  // micro-batches in groups of P: M must be a multiple of P
};
// Every schedule: adding one is its planner and a line here.
constexpr ScheduleEntry kSchedules[] = {
    {PipelineSchedule::kGpipe, "gpipe", plan_gpipe, false, Chunks::kOne, false, false},
    {PipelineSchedule::kOneForwardOneBackward, "1f1b", plan_1f1b, false, Chunks::kOne, false,
     false},
    {PipelineSchedule::kPairs, "pairs", plan_pairs, false, Chunks::kOne, false, false},
    {PipelineSchedule::kZeroBubbleH1, "zb-h1", plan_zb_h1, true, Chunks::kOne, false, false},
    {PipelineSchedule::kInterleaved, "interleaved-1f1b", plan_interleaved, false, Chunks::kAsked,
     false, true},
    {PipelineSchedule::kZeroBubbleV, "zb-v", plan_zb_v, true, Chunks::kTwo, true, false},
};

const ScheduleEntry& entry_of(PipelineSchedule schedule) {
  for (const ScheduleEntry& e : kSchedules)
    if (e.schedule == schedule) return e;
  DDP_CHECK(false, "pipeline schedule {} has no planner", static_cast<int>(schedule));
  return kSchedules[0];  // not reached
}

}  // namespace

const char* schedule_name(PipelineSchedule schedule) {
  return entry_of(schedule).name;
}

std::optional<PipelineSchedule> schedule_from_name(const std::string& name) {
  for (const ScheduleEntry& e : kSchedules)
    if (name == e.name) return e.schedule;
  return std::nullopt;
}

std::vector<PipelineSchedule> all_schedules() {
  std::vector<PipelineSchedule> all;
  for (const ScheduleEntry& e : kSchedules)
    all.push_back(e.schedule);
  return all;
}

bool splits_backward(PipelineSchedule schedule) {
  return entry_of(schedule).splits_backward;
}

int schedule_chunks(PipelineSchedule schedule, int asked, int ranks, int layers, int micro_batches,
                    const ScheduleNames& names) {
  const ScheduleEntry& e = entry_of(schedule);
  int chunks = 1;
  switch (e.chunks) {
    case Chunks::kOne:
      DDP_USAGE_CHECK(asked <= 1,
                      "{} {}: the {} schedule holds one chunk of {} a rank; give {} "
                      "interleaved-1f1b or zb-v for more",
                      names.chunks, asked, e.name, names.layers, names.schedule);
      break;
    case Chunks::kAsked:
      chunks = asked == 0 ? 2 : asked;
      DDP_USAGE_CHECK(chunks >= 1, "{} {}: expected 1 or more", names.chunks, asked);
      break;
    case Chunks::kTwo:
      DDP_USAGE_CHECK(asked == 0 || asked == 2,
                      "{} {}: zb-v holds exactly 2 chunks a rank (its V); give 2 or leave it out",
                      names.chunks, asked);
      chunks = 2;
      break;
  }
  DDP_USAGE_CHECK(ranks * chunks <= layers,
                  "{} {} {} {}: {} stages of {}, but {} has {} {} (each stage holds at least "
                  "one; give fewer stages or more {})",
                  names.ranks, ranks, names.chunks, chunks, ranks * chunks, names.layers,
                  names.model, layers, names.layers, names.layers);
  DDP_USAGE_CHECK(!e.groups_of_ranks || ranks == 1 || micro_batches % ranks == 0,
                  "{} {}: the {} schedule takes micro-batches in groups of the {} "
                  "pipeline ranks; give a multiple of {}",
                  names.micro_batches, micro_batches, e.name, ranks, ranks);
  return chunks;
}

std::vector<int> stage_ranks(PipelineSchedule schedule, int ranks, int chunks) {
  std::vector<int> rank_of(static_cast<size_t>(ranks) * chunks);
  const bool v = entry_of(schedule).v_shape;
  for (int s = 0; s < ranks * chunks; ++s)
    rank_of[s] = v ? ((s / ranks) % 2 == 0 ? s % ranks : ranks - 1 - s % ranks) : s % ranks;
  return rank_of;
}

std::map<PipelineLane, int> pipeline_lanes(const std::vector<int>& stage_rank) {
  std::map<PipelineLane, int> lanes;
  for (size_t s = 0; s + 1 < stage_rank.size(); ++s) {
    const int a = stage_rank[s], b = stage_rank[s + 1];
    if (a == b) continue;  // a hand-over in memory
    lanes.emplace(PipelineLane{true, a, b}, -1);
    lanes.emplace(PipelineLane{false, b, a}, -1);
  }
  // Each lane the lowest number that neither of its ranks uses yet.
  std::map<int, std::vector<int>> used;  // rank -> numbers
  for (auto& [lane, number] : lanes) {
    std::vector<int>& a = used[lane.from];
    std::vector<int>& b = used[lane.to];
    number = 0;
    while (std::find(a.begin(), a.end(), number) != a.end() ||
           std::find(b.begin(), b.end(), number) != b.end())
      ++number;
    a.push_back(number);
    b.push_back(number);
  }
  return lanes;
}

std::string schedule_names() {
  std::string names;
  const size_t n = std::size(kSchedules);
  for (size_t i = 0; i < n; ++i)
    names += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + kSchedules[i].name;
  return names;
}

const char* action_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::kRecvActivation:
      return "recv_activation";
    case ActionKind::kForward:
      return "forward";
    case ActionKind::kSendActivation:
      return "send_activation";
    case ActionKind::kRecvGradient:
      return "recv_gradient";
    case ActionKind::kBackward:
      return "backward";
    case ActionKind::kSendGradient:
      return "send_gradient";
    case ActionKind::kBackwardInput:
      return "backward_input";
    case ActionKind::kBackwardWeight:
      return "backward_weight";
    case ActionKind::kReduceGrad:
      return "reduce_grad";
    case ActionKind::kUnshard:
      return "unshard";
    case ActionKind::kReshard:
      return "reshard";
  }
  return "?";
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight;
}

bool is_transfer(ActionKind kind) {
  return kind == ActionKind::kRecvActivation || kind == ActionKind::kSendActivation ||
         kind == ActionKind::kRecvGradient || kind == ActionKind::kSendGradient;
}

std::vector<PipelineAction> plan_compute(PipelineSchedule schedule, int stage, int stages,
                                         int micro_batches) {
  return plan_rank_compute(schedule, stage, stages, 1, micro_batches);
}

std::vector<PipelineAction> plan_rank_compute(PipelineSchedule schedule, int rank, int ranks,
                                              int chunks, int micro_batches) {
  DDP_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && micro_batches >= 1 && chunks >= 1,
            "plan_rank_compute: rank {} of {} with {} chunks and {} micro-batches", rank, ranks,
            chunks, micro_batches);
  const ScheduleEntry& e = entry_of(schedule);
  DDP_CHECK(e.chunks != Chunks::kOne || chunks == 1, "{}: one chunk a rank, not {}", e.name,
            chunks);
  std::vector<PipelineAction> actions;
  e.plan(&actions, rank, ranks, chunks, micro_batches);
  return actions;
}

std::vector<std::vector<PipelineAction>> plan_zb_v_compute(int ranks, int micro) {
  const int stages = 2 * ranks;
  const std::vector<int> rank_of = stage_ranks(PipelineSchedule::kZeroBubbleV, ranks, 2);
  const int cap = 2 * ranks;
  // Per stage: forwards and input halves done, and when each ended (unit costs); the weight
  // halves still to do, oldest first.
  std::vector<int> forwards(stages, 0), inputs(stages, 0), weights(stages, 0);
  std::vector<std::vector<int>> forward_end(stages, std::vector<int>(micro, -1));
  std::vector<std::vector<int>> input_end = forward_end;
  std::vector<int> held(ranks, 0), free_at(ranks, 0);
  std::vector<std::vector<PipelineAction>> lists(ranks);
  const size_t total = static_cast<size_t>(3) * stages * micro;
  size_t planned = 0;
  for (int t = 0; planned < total; ++t) {
    DDP_CHECK(t < 100 * (static_cast<int>(total) + stages), "zb-v planner made no progress");
    for (int r = 0; r < ranks; ++r) {
      if (free_at[r] > t) continue;
      // The best of the rank's ready actions: input half, then forward, then weight half;
      // among them the oldest micro-batch, then the later stage.
      int best_kind = 3, best_mb = micro, best_stage = -1;
      const auto consider = [&](int kind, int mb, int stage) {
        if (std::tie(kind, mb) < std::tie(best_kind, best_mb) ||
            (kind == best_kind && mb == best_mb && stage > best_stage)) {
          best_kind = kind, best_mb = mb, best_stage = stage;
        }
      };
      for (int s = 0; s < stages; ++s) {
        if (rank_of[s] != r) continue;
        const int b = inputs[s];
        const bool gradient_here =
            b < forwards[s] &&
            (s == stages - 1 ? forward_end[s][b] >= 0 && forward_end[s][b] <= t
                             : input_end[s + 1][b] >= 0 && input_end[s + 1][b] <= t);
        if (gradient_here) consider(0, b, s);
        const int f = forwards[s];
        const bool input_here =
            f < micro && held[r] < cap &&
            (s == 0 || (forward_end[s - 1][f] >= 0 && forward_end[s - 1][f] <= t));
        if (input_here) consider(1, f, s);
        if (weights[s] < inputs[s]) consider(2, weights[s], s);
      }
      if (best_stage < 0) continue;  // idle this unit
      const int s = best_stage;
      if (best_kind == 0) {
        lists[r].push_back({ActionKind::kBackwardInput, best_mb, s});
        input_end[s][best_mb] = t + 1;
        ++inputs[s];
      } else if (best_kind == 1) {
        lists[r].push_back({ActionKind::kForward, best_mb, s});
        forward_end[s][best_mb] = t + 1;
        ++forwards[s];
        ++held[r];
      } else {
        lists[r].push_back({ActionKind::kBackwardWeight, best_mb, s});
        ++weights[s];
        --held[r];
      }
      free_at[r] = t + 1;
      ++planned;
    }
  }
  return lists;
}

std::vector<PipelineAction> plan_interleaved_compute(int rank, int ranks, int chunks,
                                                     int micro_batches) {
  DDP_USAGE_CHECK(ranks >= 1 && chunks >= 1 && rank >= 0 && rank < ranks,
                  "interleaved schedule: rank {} of {} with {} chunks", rank, ranks, chunks);
  DDP_USAGE_CHECK(micro_batches >= 1 && micro_batches % ranks == 0,
                  "--micro-batches {}: the interleaved schedule takes micro-batches in groups of "
                  "the {} pipeline ranks; give a multiple of {}",
                  micro_batches, ranks, ranks);
  const int group = ranks * chunks;  // virtual steps of one group of micro-batches
  const int total = micro_batches * chunks;
  // Virtual step k: which chunk (backwards run the chunks in reverse) and which micro-batch.
  const auto chunk_of = [&](int k, bool forward) {
    const int chunk = (k % group) / ranks;
    return forward ? chunk : chunks - 1 - chunk;
  };
  const auto micro_of = [&](int k) { return (k / group) * ranks + k % ranks; };
  const auto action = [&](int k, bool forward) {
    return PipelineAction{forward ? ActionKind::kForward : ActionKind::kBackward, micro_of(k),
                          chunk_of(k, forward) * ranks + rank};
  };
  const int warmup = chunks == 1 ? std::min(ranks - rank - 1, total)
                                 : std::min((ranks - rank - 1) * 2 + (chunks - 1) * ranks, total);
  std::vector<PipelineAction> actions;
  for (int k = 0; k < warmup; ++k)
    actions.push_back(action(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    actions.push_back(action(warmup + k, true));
    actions.push_back(action(k, false));
  }
  for (int k = total - warmup; k < total; ++k)
    actions.push_back(action(k, false));
  return actions;
}

std::vector<PipelineAction> lower_schedule(const std::vector<PipelineAction>& compute, int stages) {
  std::vector<int> rank_of(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s)
    rank_of[s] = s;
  return lower_schedule(compute, rank_of);
}

std::vector<PipelineAction> lower_schedule(const std::vector<PipelineAction>& compute,
                                           const std::vector<int>& stage_rank) {
  const int stages = static_cast<int>(stage_rank.size());
  // Per stage index: the last action that writes its weight gradients (a backward or the
  // weight half), before which the reduction is announced.
  std::vector<size_t> last_weight_grad(static_cast<size_t>(stages), compute.size());
  for (size_t i = 0; i < compute.size(); ++i) {
    const PipelineAction& a = compute[i];
    DDP_CHECK(is_compute(a.kind) && a.stage >= 0 && a.stage < stages,
              "lower_schedule: {} of stage {} (of {}) is not a planner's action",
              action_name(a.kind), a.stage, stages);
    if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight)
      last_weight_grad[a.stage] = i;
  }
  std::vector<PipelineAction> out;
  for (size_t i = 0; i < compute.size(); ++i) {
    const PipelineAction& a = compute[i];
    const bool first = a.stage == 0, last = a.stage + 1 == stages;
    const bool input_grad = a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput;
    if (a.kind == ActionKind::kForward && !first)
      out.push_back({ActionKind::kRecvActivation, a.micro_batch, a.stage});
    if (input_grad && !last) out.push_back({ActionKind::kRecvGradient, a.micro_batch, a.stage});
    if (last_weight_grad[a.stage] == i) out.push_back({ActionKind::kReduceGrad, -1, a.stage});
    out.push_back(a);
    if (a.kind == ActionKind::kForward && !last)
      out.push_back({ActionKind::kSendActivation, a.micro_batch, a.stage});
    if (input_grad && !first) out.push_back({ActionKind::kSendGradient, a.micro_batch, a.stage});
  }
  return out;
}

std::vector<PipelineAction> add_unshard_reshard(const std::vector<PipelineAction>& lowered,
                                                bool weight_half_reads) {
  const auto reads_params = [](ActionKind kind) {
    return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
           kind == ActionKind::kBackwardInput;
  };
  const auto last_use = [&](ActionKind kind) {
    return reads_params(kind) || (weight_half_reads && kind == ActionKind::kBackwardWeight);
  };
  std::map<int, size_t> last_read;  // per stage: its last action that reads its parameters
  for (size_t i = 0; i < lowered.size(); ++i) {
    const PipelineAction& a = lowered[i];
    DDP_CHECK(a.kind != ActionKind::kUnshard && a.kind != ActionKind::kReshard,
              "add_unshard_reshard: the list has its {} already", action_name(a.kind));
    if (last_use(a.kind)) last_read[a.stage] = i;
  }
  // Where each action's kUnshard goes: before the run of its own stage's receives and
  // reduction announcements that lead up to it (one a place: a walk stops at any compute).
  std::vector<std::optional<PipelineAction>> before(lowered.size());
  for (size_t i = 0; i < lowered.size(); ++i) {
    const PipelineAction& a = lowered[i];
    if (!reads_params(a.kind)) continue;
    size_t at = i;
    while (at > 0) {
      const PipelineAction& p = lowered[at - 1];
      const bool leads_up =
          p.stage == a.stage &&
          (p.kind == ActionKind::kReduceGrad ||
           ((p.kind == ActionKind::kRecvActivation || p.kind == ActionKind::kRecvGradient) &&
            p.micro_batch == a.micro_batch));
      if (!leads_up) break;
      --at;
    }
    before[at] = PipelineAction{ActionKind::kUnshard, a.micro_batch, a.stage};
  }
  std::vector<PipelineAction> out;
  for (size_t i = 0; i < lowered.size(); ++i) {
    if (before[i]) out.push_back(*before[i]);
    out.push_back(lowered[i]);
    const PipelineAction& a = lowered[i];
    if (last_use(a.kind) && last_read.at(a.stage) == i)
      out.push_back({ActionKind::kReshard, -1, a.stage});
  }
  return out;
}

std::vector<PipelineAction> plan_schedule(PipelineSchedule schedule, int stage, int stages,
                                          int micro_batches) {
  return lower_schedule(plan_compute(schedule, stage, stages, micro_batches), stages);
}

std::vector<PipelineAction> plan_rank_schedule(PipelineSchedule schedule, int rank, int ranks,
                                               int chunks, int micro_batches) {
  return lower_schedule(plan_rank_compute(schedule, rank, ranks, chunks, micro_batches),
                        stage_ranks(schedule, ranks, chunks));
}

int peak_live_activations(const std::vector<PipelineAction>& actions) {
  int live = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    if (a.kind == ActionKind::kForward) peak = std::max(peak, ++live);
    if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --live;
  }
  return peak;
}

std::vector<int> partition_by_cost(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  DDP_USAGE_CHECK(stages >= 1 && stages <= n,
                  "--pp {}: expected 1 to {} (one stage holds at least one of the {} layers)",
                  stages, n, n);
  // best[s][i]: the smallest possible largest stage cost for layers [0, i) in s stages.
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + costs[i];
  const double inf = 1e300;
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int i = s; i <= n; ++i)
      for (int j = s - 1; j < i; ++j) {
        const double worst = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (worst < best[s][i]) {
          best[s][i] = worst;
          cut[s][i] = j;
        }
      }
  std::vector<int> bounds(stages + 1, n);
  for (int s = stages, i = n; s >= 1; --s) {
    bounds[s] = i;
    i = cut[s][i];
    bounds[s - 1] = i;
  }
  return bounds;
}

std::vector<int> partition_for_ranks(const std::vector<double>& costs,
                                     const std::vector<int>& stage_rank) {
  const int stages = static_cast<int>(stage_rank.size());
  const int n = static_cast<int>(costs.size());
  std::vector<int> best = partition_by_cost(costs, stages);
  const int ranks = *std::max_element(stage_rank.begin(), stage_rank.end()) + 1;
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + costs[i];
  const auto worst_of = [&](const std::vector<int>& bounds) {
    std::vector<double> load(ranks, 0);
    for (int s = 0; s < stages; ++s)
      load[stage_rank[s]] += prefix[bounds[s + 1]] - prefix[bounds[s]];
    return *std::max_element(load.begin(), load.end());
  };
  double best_worst = worst_of(best);
  std::vector<int> bounds(stages + 1, 0);
  bounds[stages] = n;
  std::vector<double> load(ranks, 0);
  int64_t budget = 2000000;  // search nodes; the best so far stands when it runs out
  // Stage s starts at bounds[s]; choose where it ends, leaving a layer for each later stage.
  std::function<void(int)> search = [&](int s) {
    if (--budget < 0) return;
    if (s == stages - 1) {
      const double last = load[stage_rank[s]] + prefix[n] - prefix[bounds[s]];
      double worst = last;
      for (int r = 0; r < ranks; ++r)
        if (r != stage_rank[s]) worst = std::max(worst, load[r]);
      if (worst < best_worst) {
        best_worst = worst;
        best = bounds;
      }
      return;
    }
    for (int end = bounds[s] + 1; end <= n - (stages - 1 - s); ++end) {
      const double add = prefix[end] - prefix[bounds[s]];
      if (load[stage_rank[s]] + add >= best_worst) break;  // only grows with `end`
      load[stage_rank[s]] += add;
      bounds[s + 1] = end;
      search(s + 1);
      load[stage_rank[s]] -= add;
    }
  };
  search(0);
  return best;
}

std::vector<int> parse_partition(const std::string& text, int layers) {
  std::vector<int> bounds = {0};
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = text.find(',', at);
    const std::string part =
        text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const size_t dash = part.find('-');
    const std::optional<int> first = parse_number<int>(std::string_view(part).substr(0, dash));
    const std::optional<int> last =
        dash == std::string::npos ? first
                                  : parse_number<int>(std::string_view(part).substr(dash + 1));
    DDP_USAGE_CHECK(first && last, "--partition {}: '{}' is not FIRST-LAST", text, part);
    DDP_USAGE_CHECK(*first == bounds.back() && *last >= *first,
                    "--partition {}: stage {} should start at layer {} (stages are contiguous, "
                    "in order)",
                    text, bounds.size() - 1, bounds.back());
    bounds.push_back(*last + 1);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  DDP_USAGE_CHECK(bounds.back() == layers,
                  "--partition {}: covers layers 0 to {}, but the model has {} layers (0 to {})",
                  text, bounds.back() - 1, layers, layers - 1);
  return bounds;
}

SlotPlan plan_slots(const std::vector<PipelineAction>& actions, int micro_batches, int slots) {
  SlotPlan plan;
  std::vector<int> slot_of(static_cast<size_t>(micro_batches), -1);
  std::vector<size_t> last_of(static_cast<size_t>(micro_batches), actions.size());
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind != ActionKind::kReduceGrad && actions[i].micro_batch >= 0 &&
        actions[i].micro_batch < micro_batches)
      last_of[actions[i].micro_batch] = i;
  std::vector<int> free_slots;
  for (int s = slots - 1; s >= 0; --s)
    free_slots.push_back(s);
  for (size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& action = actions[i];
    const int mb = action.micro_batch;
    if (action.kind == ActionKind::kReduceGrad) {  // no micro-batch of its own
      plan.slot.push_back(-1);
      plan.releases.push_back(false);
      continue;
    }
    DDP_CHECK(mb >= 0 && mb < micro_batches, "pipeline: micro-batch {} of {}", mb, micro_batches);
    if ((action.kind == ActionKind::kRecvActivation || action.kind == ActionKind::kForward) &&
        slot_of[mb] < 0) {
      DDP_CHECK(!free_slots.empty(), "pipeline: no free activation slot for micro-batch {}", mb);
      slot_of[mb] = free_slots.back();
      free_slots.pop_back();
      plan.peak = std::max(plan.peak, slots - static_cast<int>(free_slots.size()));
    }
    plan.slot.push_back(slot_of[mb]);
    const bool done = last_of[mb] == i;
    plan.releases.push_back(done);
    if (done) {
      free_slots.push_back(slot_of[mb]);
      slot_of[mb] = -1;
    }
  }
  return plan;
}

PipelineLayout place_in_job(int world, int rank, int stages) {
  if (stages < 1 || world % stages != 0) {
    const int below = stages >= 1 ? world / stages * stages : 0;
    const std::string fix = below == 0 ? fmt::format("start {} ranks, or a multiple of it", stages)
                                       : fmt::format("start {} or {} ranks", below, below + stages);
    throw UsageError(fmt::format(
        "--pp {}: the world of {} rank{} is not a multiple of the stage count (world = dp x pp; "
        "{})",
        stages, world, world == 1 ? "" : "s", fix));
  }
  PipelineLayout layout;
  layout.stages = stages;
  layout.replicas = world / stages;
  layout.stage = rank / layout.replicas;
  layout.replica = rank % layout.replicas;
  return layout;
}

PipelineLayout plan_layout(int world, int rank, int stages, std::vector<int> bounds,
                           std::vector<int> stage_rank) {
  PipelineLayout layout = place_in_job(world, rank, stages);
  if (stage_rank.empty())
    for (int s = 0; s < stages; ++s)
      stage_rank.push_back(s);
  DDP_CHECK(bounds.size() == stage_rank.size() + 1 && stage_rank.size() % stages == 0,
            "{} layer bounds for {} stages on {} ranks", bounds.size(), stage_rank.size(), stages);
  layout.stage_rank = std::move(stage_rank);
  layout.bounds = std::move(bounds);
  return layout;
}

std::vector<int> PipelineLayout::stages_of(int pipe_rank) const {
  std::vector<int> mine;
  for (size_t s = 0; s < stage_rank.size(); ++s)
    if (stage_rank[s] == pipe_rank) mine.push_back(static_cast<int>(s));
  return mine;
}

std::string describe_layout(const PipelineLayout& layout) {
  std::string text;
  for (int s = 0; s < static_cast<int>(layout.stage_rank.size()); ++s) {
    const int first = layout.bounds[s];
    const int last = layout.bounds[s + 1] - 1;
    text += (s ? "; " : "") + std::string("stage ") + std::to_string(s) + ": layers " +
            std::to_string(first) + (last > first ? "-" + std::to_string(last) : "") +
            (layout.replicas > 1 ? " on ranks " : " on rank ");
    for (int d = 0; d < layout.replicas; ++d)
      text += (d ? "," : "") + std::to_string(layout.rank_of(layout.stage_rank[s], d));
  }
  return text;
}

double ideal_bubble(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace ddp
