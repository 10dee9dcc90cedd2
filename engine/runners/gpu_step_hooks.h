// GpuStepHooks: what a GPU rank's step does around its compute, apart from the compute: the
// backward's layer hook on the step's last backward (the data-parallel buckets marked, the
// --timeline's spans, the --overlap-optimizer's updates on a side stream), the end of the
// schedule (the rest of the buckets, the side stream joined), and a pipeline stage's busy
// spans with their costs. The runner calls it where its step reaches these points; the
// per-step host state here is what a replayed step still needs (step_begins). Only with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dist/ddp.h"
#include "dist/replica_state.h"
#include "engine/runners/optimizer_overlap.h"
#include "engine/runners/runner_options.h"
#include "engine/runners/stage_runner.h"
#include "engine/telemetry/busy_spans.h"
#include "engine/telemetry/compute_costs.h"
#include "engine/telemetry/gpu_timeline.h"
#include "engine/telemetry/timeline.h"
#include "models/batch_feeder.h"
#include "models/mlp_stage_cuda.h"

namespace ddp {

class GpuStepHooks {
 public:
  // The rank's compute `stream`; `alone`: the whole model (else a pipeline stage, whose
  // forwards and backwards are timed by events); a step's backwards (or weight halves) are
  // `micro_batches` a stage of its `stages`, the last of which gets the layer hook.
  GpuStepHooks(cudaStream_t stream, bool alone, int micro_batches, int stages);

  // Once data parallelism is set up (or not): the overlapped optimizer where it applies (`stage`'s
  // optimizer on ranges, the feeder's scalars) and the whole model's timeline (`ddp`'s buckets,
  // the state's gathers). `several`: several stages on the rank.
  struct Setting {
    const RunnerOptions* options = nullptr;
    const StageSpec* spec = nullptr;
    CudaStage* stage = nullptr;
    const BatchFeeder* feeder = nullptr;
    Reducer* ddp = nullptr;
    ReplicaState* state = nullptr;  // gradient sync's: whole or sharded
    bool several = false;
    bool lead = false;
  };
  void set_up(const Setting& setting);
  OptimizerOverlap* overlapped() const { return overlapped_.get(); }
  bool timeline() const { return timeline_ != nullptr; }

  // Before each step runs, replayed or not.
  void step_begins();
  // The step was captured, or replayed (its spans are the capture's).
  void captured() {
    if (busy_) busy_->captured();
  }
  void replayed() {
    if (busy_) busy_->replayed();
  }
  // Before a chunk of steps, the stream idle: the busy spans' anchor.
  void chunk_begins() {
    if (busy_) busy_->step_begins();
  }
  // A backward or weight half, `compute` with the layer hook it is given: the step's last one
  // gets the hooks (bucket all-reduces, the timeline, the optimizer overlapped on a side stream:
  // each layer updated as soon as backward no longer reads it, its input gradient being
  // enqueued before the next lower layer's hook).
  void weight_grads(const std::function<void(int)>& on_layer_done,
                    const std::function<void(const std::function<void(int)>&)>& compute);
  // The loss is enqueued: the forward's end on the timeline.
  void forward_done() {
    if (timeline_) timeline_->forward_done();
  }
  // After Reducer::end_backward (the executor's): the rest of the buckets issued and marked; the
  // overlapped updates joined into the stream.
  void end_schedule();
  // Around one compute span of a pipeline stage (in stream order).
  void busy_begin(SpanKind kind, int micro, int stage) {
    if (busy_) busy_->begin(kind, micro, stage);
  }
  void busy_end() {
    if (busy_) busy_->end();
  }

  // The step's device spans into `timeline` as step `step`'s (`stages`: name each span's stage).
  void add_device_spans(TimelineRecorder& timeline, int64_t step, bool stages);
  // A pipeline stage's last step's compute, by the events (-1 / false for the whole model,
  // which the host's clock times).
  double last_busy_s() const { return busy_ ? busy_->costs().total_seconds() : -1; }
  bool last_costs(ComputeCosts* costs) const;

 private:
  void mark_buckets();  // the buckets issued since the last call, on the timeline

  cudaStream_t stream_;
  bool alone_;
  int backwards_a_step_;  // the step's backwards; the last gets the hooks
  Reducer* ddp_ = nullptr;
  std::unique_ptr<OptimizerOverlap> overlapped_;
  std::unique_ptr<GpuTimeline> timeline_;  // the whole model's --timeline
  std::unique_ptr<DeviceBusySpans> busy_;  // a pipeline stage's forwards and backwards
  size_t marked_ = 0;                      // buckets of this step marked on the timeline
  int backwards_ = 0;                      // this step's, so far
};

}  // namespace ddp
