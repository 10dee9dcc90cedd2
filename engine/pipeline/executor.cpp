// ScheduleExecutor: one pass over the action list, each action handed to the runner.
#include "engine/pipeline/executor.h"

#include <functional>

#include "runtime/error.h"
#include "runtime/timer.h"

namespace ddp {

namespace {

// The timeline's name for an action's span.
SpanKind span_of(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return SpanKind::kForward;
    case ActionKind::kBackward:
      return SpanKind::kBackward;
    case ActionKind::kBackwardInput:
      return SpanKind::kBackwardInput;
    case ActionKind::kBackwardWeight:
      return SpanKind::kBackwardWeight;
    case ActionKind::kRecvActivation:
    case ActionKind::kRecvGradient:
      return SpanKind::kRecv;
    default:
      return SpanKind::kSend;
  }
}

}  // namespace

ScheduleExecutor::ScheduleExecutor(std::vector<PipelineAction> actions,
                                   std::vector<StagePlace> stages)
    : actions_(std::move(actions)), stages_(std::move(stages)) {
  DDP_CHECK(!stages_.empty(), "pipeline: a rank with no stage");
  const int chunks = static_cast<int>(stages_.size());
  int layers = 0;
  for (const StagePlace& c : stages_) {
    layer_base_.push_back(layers);
    layers += c.layers;
  }
  // Each stage's actions planned for slots on their own.
  chunk_.assign(actions_.size(), -1);
  slot_.assign(actions_.size(), -1);
  int last_reduced = chunks;  // the reductions' points come later stages first
  for (int c = 0; c < chunks; ++c) {
    std::vector<PipelineAction> mine;
    std::vector<size_t> at;
    for (size_t i = 0; i < actions_.size(); ++i) {
      if (actions_[i].stage != stages_[c].stage) continue;
      chunk_[i] = c;
      // ZeRO 3's gathers hold no activations: their slot is their compute action's (below).
      if (actions_[i].kind == ActionKind::kUnshard || actions_[i].kind == ActionKind::kReshard)
        continue;
      mine.push_back(actions_[i]);
      at.push_back(i);
    }
    const SlotPlan plan = plan_slots(mine, stages_[c].micro_batches, peak_live_activations(mine));
    for (size_t k = 0; k < at.size(); ++k)
      slot_[at[k]] = plan.slot[k];
    slots_ = std::max(slots_, plan.peak);
  }
  // Each kUnshard: the kind and slot of the compute action it gathers for, its stage's next
  // that reads the parameters.
  unshard_for_.assign(actions_.size(), ActionKind::kForward);
  for (size_t i = 0; i < actions_.size(); ++i) {
    if (actions_[i].kind != ActionKind::kUnshard) continue;
    size_t j = i + 1;
    while (j < actions_.size() && !(actions_[j].stage == actions_[i].stage &&
                                    actions_[j].micro_batch == actions_[i].micro_batch &&
                                    (actions_[j].kind == ActionKind::kForward ||
                                     actions_[j].kind == ActionKind::kBackward ||
                                     actions_[j].kind == ActionKind::kBackwardInput)))
      ++j;
    DDP_CHECK(j < actions_.size(), "pipeline: unshard of stage {} micro-batch {} before nothing",
              actions_[i].stage, actions_[i].micro_batch);
    unshard_for_[i] = actions_[j].kind;
    slot_[i] = slot_[j];
  }
  for (size_t i = 0; i < actions_.size(); ++i) {
    DDP_CHECK(chunk_[i] >= 0, "pipeline: {} of stage {} is not a stage of this rank",
              action_name(actions_[i].kind), actions_[i].stage);
    if (actions_[i].kind != ActionKind::kReduceGrad) continue;
    DDP_CHECK(chunk_[i] < last_reduced,
              "pipeline: stage {}'s gradients would be complete before a later stage's; the "
              "data-parallel buckets need them last layers first",
              actions_[i].stage);
    last_reduced = chunk_[i];
  }
}

void ScheduleExecutor::run(PipelineRank& runner, Reducer* ddp, TimelineRecorder& timeline,
                           int64_t step, float scale, StepStats* stats) const {
  // The host's clock times the CPU's work; the GPU's spans come from its events (the host
  // only enqueues here, or not at all when the step is replayed from its graph).
  const bool gpu = runner.on_gpu();
  const bool several = stages_.size() > 1;
  int stage = -1;  // of the action being run, where the rank has several
  auto span = [&](SpanKind kind, int mb, double start) {
    if (!gpu) timeline.add(kind, step, mb, start, timeline.now_us(), 0, stage);
  };
  const int chunks = static_cast<int>(stages_.size());
  std::vector<int> weight_grads(chunks, 0);  // per stage, backwards and weight halves so far
  bool reduce_next = false;  // the next one completes its stage's gradients: reduce as written
  int reductions_left = 0;   // stages whose gradients are not yet complete
  for (const PipelineAction& a : actions_)
    if (a.kind == ActionKind::kReduceGrad && ddp != nullptr) ++reductions_left;
  bool reducing = false;
  // The weight gradients of one backward or weight half of chunk c, reduced as written where
  // it is that stage's last one of the step.
  auto weight_grad = [&](int c,
                         const std::function<void(const std::function<void(int)>&)>& compute) {
    if (reduce_next && !reducing) {
      ddp->begin_backward(runner.grads());
      reducing = true;
    }
    const int base = layer_base_[c];
    compute(reduce_next ? [ddp, base](int layer) { ddp->layer_done(base + layer); }
                        : std::function<void(int)>());
    if (reduce_next && --reductions_left == 0) ddp->end_backward();
    reduce_next = false;
    ++weight_grads[c];
  };
  auto compute_done = [&](ActionKind kind, double seconds) {
    stats->busy_s += seconds;
    if (!gpu)
      stats->costs.add(span_of(kind), seconds);  // the GPU's host clock times only enqueueing
  };
  auto loss = [&](PipelineStage& ops, int c, int mb, int slot) {
    if (!stages_[c].is_last()) return;
    const LossSum sum = ops.loss(mb, slot, scale);
    stats->loss_sum += sum.loss;
    stats->correct += sum.correct;
  };
  for (size_t i = 0; i < actions_.size(); ++i) {
    const PipelineAction& action = actions_[i];
    const int mb = action.micro_batch;
    const int c = chunk_[i];
    const int slot = slot_[i];
    PipelineStage& ops = runner.chunk(c);
    stage = several ? action.stage : -1;
    const double start = timeline.now_us();
    Stopwatch clock;
    switch (action.kind) {
      case ActionKind::kRecvActivation:
        ops.recv_activation(mb, slot);
        break;
      case ActionKind::kForward:
        ops.forward(mb, slot);
        break;
      case ActionKind::kSendActivation:
        ops.send_activation(mb, slot);
        break;
      case ActionKind::kRecvGradient:
        ops.recv_gradient(mb, slot);
        break;
      case ActionKind::kReduceGrad:
        reduce_next = ddp != nullptr;
        continue;  // no span, no compute
      case ActionKind::kUnshard:
        ops.unshard(unshard_for_[i], mb, slot);
        continue;  // the gather's own span is the stage's to record
      case ActionKind::kReshard:
        ops.reshard();
        continue;
      case ActionKind::kBackward:
        loss(ops, c, mb, slot);
        weight_grad(c, [&](const std::function<void(int)>& on_layer_done) {
          ops.backward(mb, slot, /*accumulate=*/weight_grads[c] > 0, on_layer_done);
        });
        break;
      case ActionKind::kBackwardInput:
        loss(ops, c, mb, slot);
        ops.backward_input(mb, slot);
        break;
      case ActionKind::kBackwardWeight:
        weight_grad(c, [&](const std::function<void(int)>& on_layer_done) {
          ops.backward_weight(mb, slot, /*accumulate=*/weight_grads[c] > 0, on_layer_done);
        });
        break;
      case ActionKind::kSendGradient:
        ops.send_gradient(mb, slot);
        break;
    }
    if (is_compute(action.kind)) compute_done(action.kind, clock.seconds());
    span(span_of(action.kind), mb, start);
  }
  stage = -1;
  {
    const double start = timeline.now_us();
    runner.end_schedule();
    if (stages_[0].stages > 1) span(SpanKind::kSend, -1, start);
  }
  if (ddp != nullptr) {
    const double start = timeline.now_us();
    ddp->finish(runner.stream());
    span(SpanKind::kAllReduce, -1, start);
  }
}

}  // namespace ddp
