// A pipeline stage as the schedule executor (engine/pipeline/executor.h) drives it, knowing no
// model: per micro-batch its transfers, forward, loss and backward (whole, or in the two halves
// of the zero-bubble schedules), its activations kept in the slots the executor plans. The MLP's
// CPU and GPU stages implement it (engine/runners), and so does a LibTorch module's
// (torch/pipeline.h); where a stage's activations come from and what shape they have is the
// stage's own business.
#pragma once

#include <functional>

#include "engine/pipeline/schedule.h"
#include "runtime/loss_sum.h"

namespace ddp {

// Where a stage sits in the pipeline and what a step asks of it.
struct StagePlace {
  int stage = 0;          // its index in the pipeline
  int stages = 1;         // how many stages the pipeline has
  int micro_batches = 1;  // per step
  int layers = 1;         // the data-parallel buckets' layers it holds (Reducer::layer_done's)
  bool is_last() const { return stage == stages - 1; }
};

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  virtual void recv_activation(int micro, int slot) = 0;
  virtual void forward(int micro, int slot) = 0;
  virtual void send_activation(int micro, int slot) = 0;
  virtual void recv_gradient(int micro, int slot) = 0;
  // Last stage: the loss of the micro-batch and its gradient (scaled by `grad_scale`, a
  // sample's weight in the step's loss) for backward. A stage whose sums stay on its device
  // returns zeros and hands them over later.
  virtual LossSum loss(int micro, int slot, float grad_scale) = 0;
  // Backward of the micro-batch: the weight gradients written (or, with `accumulate`, added),
  // `on_layer_done(layer)` called (where not empty) as each layer's are complete, last layer
  // first, and the input gradient kept for send_gradient.
  virtual void backward(int micro, int slot, bool accumulate,
                        const std::function<void(int)>& on_layer_done) = 0;
  // The two halves of backward, for the zero-bubble schedules, where splits_backward():
  // backward_input (after loss() on the last stage) computes the gradient that
  // send_gradient sends and keeps what backward_weight needs; backward_weight then writes
  // (or, with `accumulate`, adds) the weight gradients, calling on_layer_done as backward.
  virtual bool splits_backward() const = 0;
  virtual void backward_input(int micro, int slot) = 0;
  virtual void backward_weight(int micro, int slot, bool accumulate,
                               const std::function<void(int)>& on_layer_done) = 0;
  virtual void send_gradient(int micro, int slot) = 0;
  // --zero 3's schedule actions (add_unshard_reshard): the parameters that the stage's coming
  // `kind` (a forward, backward or input half) of micro-batch `micro` in `slot` reads first
  // start gathering; and the stage reads no more parameters this step, so what it holds
  // gathered is let go. A stage whose parameters are always in place, or whose gathers are the
  // host's own blocking collectives at each use (the CPU's: nothing could run beside them), has
  // nothing to start early or let go.
  virtual void unshard(ActionKind kind, int micro, int slot) {
    (void)kind, (void)micro, (void)slot;
  }
  virtual void reshard() {}
};

// What one pipeline rank gives the executor: its stages (one, or several for the interleaved
// and V schedules, in stage order), where the data-parallel reducer finds their gradients, and
// the end of a step's transfers.
class PipelineRank {
 public:
  virtual ~PipelineRank() = default;
  // Whether the stages run on a GPU (their spans are then timed by the device, not the host).
  virtual bool on_gpu() const = 0;
  // The rank's stage `c` (of the executor's places, in order).
  virtual PipelineStage& chunk(int c) = 0;
  // The rank's flat gradients, where the data-parallel reducer takes them (host or device).
  virtual float* grads() = 0;
  // The stream that the reducer's finish makes wait (GPU), or null.
  virtual void* stream() = 0;
  // Every send of the step complete (host: waited; GPU: the stream waits for them).
  virtual void end_schedule() = 0;
};

}  // namespace ddp
