// The MLP on the CPU. A stage is a contiguous range of layers [first, end) that owns its
// parameters and gradients (one flat buffer each, in the model's layout) and keeps the
// activations of several micro-batches at once (slots), so that a pipeline can forward
// several micro-batches before it backwards the first. The whole MLP is the one-stage case;
// the loss (softmax cross-entropy, cpu_ops.h) is separate and used by the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/cpu_ops.h"
#include "models/linear_cpu.h"
#include "models/mlp.h"

namespace ddp {

// Layers [first, end) of the MLP on the CPU (above): a pipeline stage, or the whole model.
class CpuStage : public StageLayers {
 public:
  // Layers [first, end) of `shape`, micro-batches of at most max_batch samples, activations
  // for `slots` micro-batches in flight. 0 <= first < end <= shape.num_layers(). `params` and
  // `grads` (param_count() floats each, outliving the stage) hold its parameters and
  // gradients where a caller keeps several stages in one buffer; null: its own.
  // `recompute` (activation checkpointing): a slot keeps only its input; the layers' outputs
  // live in one working set, of the slot forwarded last, and are forwarded again from the
  // input (bitwise the same) when a backward, a weight half or output() needs another slot's.
  CpuStage(MlpShape shape, int first, int end, int max_batch, int slots = 1,
           float* params = nullptr, float* grads = nullptr, bool recompute = false);
  CpuStage(const CpuStage&) = delete;  // its buffers may be its own: a copy would share them
  CpuStage& operator=(const CpuStage&) = delete;
  // Moves the stage, its buffers with it.
  CpuStage(CpuStage&&) = default;

  // The most samples a micro-batch has.
  int max_batch() const { return max_batch_; }
  // Micro-batches whose activations it holds at once.
  int slots() const { return static_cast<int>(inputs_.size()); }
  // Its flat parameters (param_count() floats, the model's layout from its first layer).
  float* params() { return params_; }
  // The same, read-only.
  const float* params() const { return params_; }
  // Its flat gradients, laid out as params().
  float* grads() { return grads_; }
  // The same, read-only.
  const float* grads() const { return grads_; }

  // Output of layer i (first_layer() <= i < end_layer()) from the slot's last forward().
  const float* activation(int slot, int i) { return working(slot)[i - first_].data(); }
  // The stage's output of the slot's last forward (recomputed where needed).
  const float* output(int slot) { return working(slot).back().data(); }
  // Bytes of the layers' outputs it keeps: every slot's, or (recompute) one working set.
  size_t activation_bytes() const;
  // Forwards run again for backward (recompute) so far.
  int64_t recomputed() const { return recomputed_; }
  // From now on every layer reads its parameters from `source` for each use, not from
  // params(), which may then be freed by its owner.
  void set_params_source(LayerParams* source);
  // From now on every layer writes its gradients at grad_at(offset) for its parameters'
  // offsets in the stage's flat layout (a gradient ring's slots), not in grads().
  void set_grads(const std::function<float*(size_t offset)>& grad_at);

  // Runs the stage's layers on x[batch, in_width()] into slot `slot`; returns the output
  // [batch, out_width()] (after its ReLU unless this is the last layer), valid until the
  // slot is forwarded again. `x` must stay valid until backward() of the same slot.
  const float* forward(const float* x, int batch, int slot = 0);

  // After forward() of `slot`: given dy[batch, out_width()], the loss gradient w.r.t. this
  // stage's output (overwritten), writes the parameter gradients over grads() or, with
  // `accumulate`, adds them (micro-batches). Returns the gradient w.r.t. the input
  // [batch, in_width()], valid until the next backward(), or null for the first stage.
  // `on_layer_done(i)` (i counted from this stage's first layer) is called as soon as that
  // layer's gradients are written, last layer first, so that their all-reduce can start.
  const float* backward(float* dy, int batch, int slot, bool accumulate = false,
                        const std::function<void(int)>& on_layer_done = {});

  // backward() in two halves, bitwise the same gradients (zero-bubble schedules).
  // backward_input: the input gradient as backward() returns it (dy is read, not changed),
  // keeping each layer's output gradient in the slot; backward_weight: then the parameter
  // gradients from them, as backward() writes them. The slot is forwarded again only after.
  const float* backward_input(const float* dy, int batch, int slot);
  // The second half: the parameter gradients of the slot whose input half ran, as backward()
  // writes them (and calls on_layer_done).
  void backward_weight(int slot, bool accumulate = false,
                       const std::function<void(int)>& on_layer_done = {});

 private:
  int max_batch_;
  const CpuLinear& layer(int i) const { return layers_[i - first_]; }

  std::vector<float> own_params_, own_grads_;  // when not given
  float* params_;
  float* grads_;
  std::vector<CpuLinear> layers_;     // [first, end), over params_ and grads_
  std::vector<const float*> inputs_;  // a slot's input
  std::vector<std::vector<std::vector<float>>> activations_;  // [slot][layer - first]
  // The slot's layer outputs: its own set, or the working set forwarded again from the input.
  std::vector<std::vector<float>>& working(int slot);
  void run_layers(const float* x, int batch, std::vector<std::vector<float>>& out);
  bool recompute_ = false;
  int working_slot_ = -1;      // recompute: the slot whose outputs the working set holds
  std::vector<int> batch_of_;  // [slot]: its batch (recompute)
  int64_t recomputed_ = 0;
  // backward_input's output gradients (ReLU applied) for backward_weight, made on first use.
  std::vector<std::vector<std::vector<float>>> output_grads_;  // [slot][layer - first]
  std::vector<int> split_batch_;                               // [slot]: its batch
  std::vector<float> grad_a_;                                  // [max_batch, max_width]
  std::vector<float> grad_b_;
};

// The whole MLP with its loss: the one-stage case, as the CPU reference.
class CpuMlp {
 public:
  // `shape`'s model for batches of at most max_batch samples; its parameters are zero until
  // set (init_params into params()).
  CpuMlp(MlpShape shape, int max_batch);

  // The model's shape.
  const MlpShape& shape() const { return stage_.shape(); }
  // The most samples a batch has.
  int max_batch() const { return stage_.max_batch(); }
  // The flat parameters (shape().param_count() floats, mlp.h's layout).
  float* params() { return stage_.params(); }
  // The same, read-only.
  const float* params() const { return stage_.params(); }
  // The flat gradients, laid out as params().
  float* grads() { return stage_.grads(); }
  // The same, read-only.
  const float* grads() const { return stage_.grads(); }
  // Output of layer i from the last forward() ([batch, layer(i).out], after its ReLU).
  const float* activation(int i) { return stage_.activation(0, i); }

  // Runs the layers on x[batch, input_width]; returns logits[batch, classes], valid until
  // the next call. batch <= max_batch.
  const float* forward(const float* x, int batch);

  // After forward() on the same batch: softmax cross-entropy against labels, then backward.
  // Gradients are the loss gradients scaled by grad_scale (1/batch: the batch mean), written
  // over grads() or, with `accumulate`, added to them. Returns the summed loss and hits.
  LossSum backward(const int32_t* labels, int batch, float grad_scale, bool accumulate = false,
                   const std::function<void(int)>& on_layer_done = {});

 private:
  CpuStage stage_;
  std::vector<float> dlogits_;
  const float* logits_ = nullptr;
};

}  // namespace ddp
