// Schedules as action lists, and the layer partition.
#include "engine/pipeline/schedule.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "runtime/error.h"
#include "runtime/parse.h"

namespace ddp {

const char* schedule_name(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kGpipe ? "gpipe" : "1f1b";
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
  }
  return "?";
}

namespace {

void forward(std::vector<PipelineAction>* out, int stage, int stages, int mb) {
  if (stage > 0) out->push_back({ActionKind::kRecvActivation, mb});
  out->push_back({ActionKind::kForward, mb});
  if (stage + 1 < stages) out->push_back({ActionKind::kSendActivation, mb});
}

void backward(std::vector<PipelineAction>* out, int stage, int stages, int mb) {
  if (stage + 1 < stages) out->push_back({ActionKind::kRecvGradient, mb});
  out->push_back({ActionKind::kBackward, mb});
  if (stage > 0) out->push_back({ActionKind::kSendGradient, mb});
}

}  // namespace

std::vector<PipelineAction> plan_schedule(PipelineSchedule schedule, int stage, int stages,
                                          int micro_batches) {
  DDP_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1,
            "plan_schedule: stage {} of {} with {} micro-batches", stage, stages, micro_batches);
  std::vector<PipelineAction> actions;
  if (schedule == PipelineSchedule::kGpipe) {
    for (int mb = 0; mb < micro_batches; ++mb)
      forward(&actions, stage, stages, mb);
    for (int mb = 0; mb < micro_batches; ++mb)
      backward(&actions, stage, stages, mb);
    return actions;
  }
  // 1F1B: warm-up, steady one-forward-one-backward, cool-down.
  const int warmup = std::min(stages - stage - 1, micro_batches);
  for (int mb = 0; mb < warmup; ++mb)
    forward(&actions, stage, stages, mb);
  const int steady = micro_batches - warmup;
  for (int i = 0; i < steady; ++i) {
    forward(&actions, stage, stages, warmup + i);
    backward(&actions, stage, stages, i);
  }
  for (int mb = steady; mb < micro_batches; ++mb)
    backward(&actions, stage, stages, mb);
  return actions;
}

int peak_live_activations(const std::vector<PipelineAction>& actions) {
  int live = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    if (a.kind == ActionKind::kForward) peak = std::max(peak, ++live);
    if (a.kind == ActionKind::kBackward) --live;
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

SlotPlan plan_slots(const std::vector<PipelineAction>& actions, bool first_stage, int micro_batches,
                    int slots) {
  SlotPlan plan;
  std::vector<int> slot_of(static_cast<size_t>(micro_batches), -1);
  std::vector<int> free_slots;
  for (int s = slots - 1; s >= 0; --s)
    free_slots.push_back(s);
  for (const PipelineAction& action : actions) {
    const int mb = action.micro_batch;
    DDP_CHECK(mb >= 0 && mb < micro_batches, "pipeline: micro-batch {} of {}", mb, micro_batches);
    if ((action.kind == ActionKind::kRecvActivation || action.kind == ActionKind::kForward) &&
        slot_of[mb] < 0) {
      DDP_CHECK(!free_slots.empty(), "pipeline: no free activation slot for micro-batch {}", mb);
      slot_of[mb] = free_slots.back();
      free_slots.pop_back();
      plan.peak = std::max(plan.peak, slots - static_cast<int>(free_slots.size()));
    }
    plan.slot.push_back(slot_of[mb]);
    const bool sent_on = action.kind == ActionKind::kSendGradient ||
                         (action.kind == ActionKind::kBackward && first_stage);
    plan.releases.push_back(sent_on);
    if (sent_on) {
      free_slots.push_back(slot_of[mb]);
      slot_of[mb] = -1;
    }
  }
  return plan;
}

PipelineLayout plan_layout(int world, int rank, int stages, std::vector<int> bounds) {
  if (stages < 1 || world % stages != 0) {
    const int below = stages >= 1 ? world / stages * stages : 0;
    const std::string fix = below == 0 ? fmt::format("start {} ranks, or a multiple of it", stages)
                                       : fmt::format("start {} or {} ranks", below, below + stages);
    throw UsageError(fmt::format(
        "--pp {}: the world of {} rank{} is not a multiple of the stage count (world = dp x pp; "
        "{})",
        stages, world, world == 1 ? "" : "s", fix));
  }
  DDP_CHECK(static_cast<int>(bounds.size()) == stages + 1, "{} layer bounds for {} stages",
            bounds.size(), stages);
  PipelineLayout layout;
  layout.stages = stages;
  layout.replicas = world / stages;
  layout.stage = rank / layout.replicas;
  layout.replica = rank % layout.replicas;
  layout.bounds = std::move(bounds);
  return layout;
}

std::string describe_layout(const PipelineLayout& layout) {
  std::string text;
  for (int s = 0; s < layout.stages; ++s) {
    const int first = layout.bounds[s];
    const int last = layout.bounds[s + 1] - 1;
    text += (s ? "; " : "") + std::string("stage ") + std::to_string(s) + ": layers " +
            std::to_string(first) + (last > first ? "-" + std::to_string(last) : "") +
            (layout.replicas > 1 ? " on ranks " : " on rank ");
    for (int d = 0; d < layout.replicas; ++d)
      text += (d ? "," : "") + std::to_string(layout.rank_of(s, d));
  }
  return text;
}

double ideal_bubble(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace ddp
