// GpuStepHooks: the layer hook, the schedule's end and the busy spans of a GPU step.
#include "engine/runners/gpu_step_hooks.h"

#include <spdlog/spdlog.h>

namespace ddp {

GpuStepHooks::GpuStepHooks(cudaStream_t stream, bool alone, int micro_batches, int stages)
    : stream_(stream), alone_(alone), backwards_a_step_(micro_batches * stages) {
  // Each stage's micro-batches' forward and backward, or backward's two halves.
  if (!alone) busy_ = std::make_unique<DeviceBusySpans>(stream, 3 * micro_batches * stages);
}

void GpuStepHooks::set_up(const Setting& setting) {
  const RunnerOptions& options = *setting.options;
  const StageSpec& spec = *setting.spec;
  ddp_ = setting.ddp;
  // The optimizer overlapped with backward (--overlap-optimizer; else one pass after it):
  // by layer, or with data parallelism by bucket as each one's average is in place (the
  // whole model with --overlap only; a pipeline stage's update would have to wait for each
  // bucket's all-reduce).
  if (options.step.overlap_optimizer && ddp_ && !alone_ && spec.stage == 0)
    spdlog::info(
        "--overlap-optimizer: not with data parallelism in a pipeline; one pass after "
        "the gradients are reduced");
  const bool sharded = setting.state->sharded();
  if (options.step.overlap_optimizer && sharded && setting.lead)
    spdlog::info("--overlap-optimizer: not with --zero; one pass over this rank's pieces");
  if (options.step.overlap_optimizer && setting.several && !ddp_ && spec.rank == 0)
    spdlog::info("--overlap-optimizer: not with several stages a rank; one pass after backward");
  if (options.step.overlap_optimizer && !sharded && !setting.several &&
      (!ddp_ || (alone_ && options.sync.buckets.overlap))) {
    std::vector<ParamSpan> spans;  // one range a layer, offsets into the stage's buffers
    for (int i = spec.first; i < spec.end; ++i)
      spans.push_back(
          {spec.shape.layer(i).weight_offset - spec.param_offset(), spec.shape.layer(i).count()});
    CudaStage* stage = setting.stage;
    const BatchFeeder* feeder = setting.feeder;
    overlapped_ = std::make_unique<OptimizerOverlap>(
        stage->stream(),
        [stage, feeder](size_t offset, size_t count, cudaStream_t stream) {
          stage->optimizer_range(offset, count, feeder->steps(), feeder->counter(), stream);
        },
        ddp_ ? OptimizerOverlap::of_buckets(ddp_->buckets()) : OptimizerOverlap::of_layers(spans),
        ddp_);
  }
  // The whole model's timeline: every layer's backward and bucket (a pipeline stage's is
  // its micro-batches' spans).
  if (options.step.timeline && alone_)
    timeline_ = std::make_unique<GpuTimeline>(stream_, spec.shape.num_layers(),
                                              ddp_ ? ddp_->buckets().size() : 0);
  if (timeline_) {
    GpuTimeline* timeline = timeline_.get();
    setting.state->set_on_gather([timeline](int layer, bool scheduled, Work& gather) {
      timeline->gather_issued(layer, scheduled, gather);
    });
  }
}

void GpuStepHooks::step_begins() {
  if (overlapped_) overlapped_->begin_step();
  if (timeline_) timeline_->step_begins();
  marked_ = 0;
  backwards_ = 0;
}

void GpuStepHooks::weight_grads(
    const std::function<void(int)>& on_layer_done,
    const std::function<void(const std::function<void(int)>&)>& compute) {
  const bool last = ++backwards_ == backwards_a_step_;
  if (!last || !(timeline_ || overlapped_)) {
    compute(on_layer_done);
    return;
  }
  compute([&](int layer) {
    if (on_layer_done) on_layer_done(layer);
    mark_buckets();
    if (timeline_) timeline_->layer_done(layer);
    if (overlapped_) overlapped_->layer_done(layer);
  });
  // Without data parallelism the rest at once (a stage's last gradient, sent next, does
  // not wait for them); with it, once every bucket is issued (end_schedule).
  if (overlapped_ && ddp_ == nullptr) overlapped_->apply_rest();
}

void GpuStepHooks::end_schedule() {
  mark_buckets();
  if (timeline_ && ddp_) timeline_->buckets_issued(*ddp_);
  // The updates joined into the stream; Reducer::finish then has nothing left to wait for.
  if (overlapped_ && ddp_) overlapped_->end_backward();
}

void GpuStepHooks::mark_buckets() {
  if (ddp_ == nullptr) return;
  for (; marked_ < ddp_->issued(); ++marked_)
    if (timeline_) timeline_->bucket_issued(marked_);
}

void GpuStepHooks::add_device_spans(TimelineRecorder& timeline, int64_t step, bool stages) {
  if (timeline_) timeline_->step_ends(timeline, step);
  if (busy_) busy_->add_to(timeline, step, stages);
}

bool GpuStepHooks::last_costs(ComputeCosts* costs) const {
  if (!busy_) return false;
  costs->add(busy_->costs());
  return true;
}

}  // namespace ddp
