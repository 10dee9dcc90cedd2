// ScheduleExecutor: one pass over the action list, each action handed to the runner.
#include "engine/executor.h"

#include <functional>

#include "runtime/error.h"
#include "runtime/timer.h"

namespace ddp {

ScheduleExecutor::ScheduleExecutor(std::vector<PipelineAction> actions, const StageSpec& spec)
    : actions_(std::move(actions)),
      spec_(spec),
      slot_plan_(plan_slots(actions_, spec.is_first(), spec.micro_batches,
                            peak_live_activations(actions_))) {
  for (const PipelineAction& a : actions_)
    DDP_CHECK(a.kind != ActionKind::kBackwardInput && a.kind != ActionKind::kBackwardWeight,
              "pipeline: {} needs a runner that splits backward into its input and weight "
              "halves; the MLP's runners compute both at once (use a schedule with whole "
              "backwards)",
              action_name(a.kind));
}

void ScheduleExecutor::run(StageRunner& runner, Ddp* ddp, TimelineRecorder& timeline, int64_t step,
                           float scale, StepStats* stats) const {
  // The host's clock times the CPU's work; the GPU's spans come from its events (the host
  // only enqueues here, or not at all when the step is replayed from its graph).
  const bool gpu = runner.on_gpu();
  auto span = [&](SpanKind kind, int mb, double start) {
    if (!gpu) timeline.add(kind, step, mb, start, timeline.now_us());
  };
  int backwards = 0;
  bool reduce_next = false;  // the next backward completes the gradients: reduce as written
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
      case ActionKind::kBackward: {
        if (spec_.is_last()) {
          const LossSum sum = runner.loss(mb, slot, scale);
          stats->loss_sum += sum.loss;
          stats->correct += sum.correct;
        }
        if (reduce_next) ddp->begin_backward(runner.grads());
        runner.backward(mb, slot, /*accumulate=*/backwards > 0,
                        reduce_next ? [ddp](int layer) { ddp->layer_done(layer); }
                                    : std::function<void(int)>());
        if (reduce_next) ddp->end_backward();
        reduce_next = false;
        ++backwards;
        stats->busy_s += clock.seconds();
        span(SpanKind::kBackward, mb, start);
        break;
      }
      case ActionKind::kSendGradient:
        runner.send_gradient(mb, slot);
        span(SpanKind::kSend, mb, start);
        break;
      case ActionKind::kBackwardInput:
      case ActionKind::kBackwardWeight:
        break;  // refused at construction
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
