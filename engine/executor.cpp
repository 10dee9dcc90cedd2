// ScheduleExecutor: one pass over the action list, each action handed to the runner.
#include "engine/executor.h"

#include <functional>

#include "runtime/error.h"
#include "runtime/timer.h"

namespace ddp {

ScheduleExecutor::ScheduleExecutor(std::vector<PipelineAction> actions, const StageSpec& spec)
    : actions_(std::move(actions)),
      spec_(spec),
      slot_plan_(plan_slots(actions_, spec.micro_batches, peak_live_activations(actions_))) {}

void ScheduleExecutor::run(StageRunner& runner, Ddp* ddp, TimelineRecorder& timeline, int64_t step,
                           float scale, StepStats* stats) const {
  // The host's clock times the CPU's work; the GPU's spans come from its events (the host
  // only enqueues here, or not at all when the step is replayed from its graph).
  const bool gpu = runner.on_gpu();
  auto span = [&](SpanKind kind, int mb, double start) {
    if (!gpu) timeline.add(kind, step, mb, start, timeline.now_us());
  };
  for (const PipelineAction& a : actions_)
    DDP_CHECK(runner.splits_backward() ||
                  (a.kind != ActionKind::kBackwardInput && a.kind != ActionKind::kBackwardWeight),
              "pipeline: {} needs a runner that splits backward into its input and weight "
              "halves; this one computes both at once",
              action_name(a.kind));
  int weight_grads = 0;      // backwards and weight halves so far: later ones accumulate
  bool reduce_next = false;  // the next one completes the gradients: reduce them as written
  // The weight gradients of one backward or weight half, reduced as written where it is the
  // last one of the step.
  auto weight_grad = [&](const std::function<void(const std::function<void(int)>&)>& compute) {
    if (reduce_next) ddp->begin_backward(runner.grads());
    compute(reduce_next ? [ddp](int layer) { ddp->layer_done(layer); }
                        : std::function<void(int)>());
    if (reduce_next) ddp->end_backward();
    reduce_next = false;
    ++weight_grads;
  };
  auto loss = [&](int mb, int slot) {
    if (!spec_.is_last()) return;
    const LossSum sum = runner.loss(mb, slot, scale);
    stats->loss_sum += sum.loss;
    stats->correct += sum.correct;
  };
  for (size_t i = 0; i < actions_.size(); ++i) {
    const PipelineAction& action = actions_[i];
    const int mb = action.micro_batch;
    const int slot = slot_plan_.slot[i];
    const double start = timeline.now_us();
    Stopwatch clock;
    switch (action.kind) {
      case ActionKind::kRecvActivation:
        runner.recv_activation(mb, slot);
        span(SpanKind::kRecv, mb, start);
        break;
      case ActionKind::kForward:
        runner.forward(mb, slot);
        stats->busy_s += clock.seconds();
        span(SpanKind::kForward, mb, start);
        break;
      case ActionKind::kSendActivation:
        runner.send_activation(mb, slot);
        span(SpanKind::kSend, mb, start);
        break;
      case ActionKind::kRecvGradient:
        runner.recv_gradient(mb, slot);
        span(SpanKind::kRecv, mb, start);
        break;
      case ActionKind::kReduceGrad:
        reduce_next = ddp != nullptr;
        break;
      case ActionKind::kBackward:
        loss(mb, slot);
        weight_grad([&](const std::function<void(int)>& on_layer_done) {
          runner.backward(mb, slot, /*accumulate=*/weight_grads > 0, on_layer_done);
        });
        stats->busy_s += clock.seconds();
        span(SpanKind::kBackward, mb, start);
        break;
      case ActionKind::kBackwardInput:
        loss(mb, slot);
        runner.backward_input(mb, slot);
        stats->busy_s += clock.seconds();
        span(SpanKind::kBackwardInput, mb, start);
        break;
      case ActionKind::kBackwardWeight:
        weight_grad([&](const std::function<void(int)>& on_layer_done) {
          runner.backward_weight(mb, slot, /*accumulate=*/weight_grads > 0, on_layer_done);
        });
        stats->busy_s += clock.seconds();
        span(SpanKind::kBackwardWeight, mb, start);
        break;
      case ActionKind::kSendGradient:
        runner.send_gradient(mb, slot);
        span(SpanKind::kSend, mb, start);
        break;
    }
  }
  {
    const double start = timeline.now_us();
    runner.end_schedule();
    if (spec_.stages > 1) span(SpanKind::kSend, -1, start);
  }
  if (ddp != nullptr) {
    const double start = timeline.now_us();
    ddp->finish(runner.stream());
    span(SpanKind::kAllReduce, -1, start);
  }
}

}  // namespace ddp
