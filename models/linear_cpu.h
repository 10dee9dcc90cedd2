// One Linear layer of a CPU stage (CpuStage), a ReLU after it unless it is the model's last:
// its slice of the stage's flat parameters and gradients, and its products on host buffers
// that the stage keeps per slot (the reference ops of cpu_ops.h). The forward, the ReLU
// derivative, the weight and the input gradients are separate calls, so that a stage runs
// backward whole or in its two halves. What a new layer type on the CPU is: a class like
// this one, and its line where CpuStage lists its layers.
#pragma once

#include "models/mlp.h"

namespace ddp {

// Where a layer's parameters are when the stage does not hold them (its owner's: the engine's
// gradient sync gathers them for each use and drops them after). acquire(layer) returns the
// layer's weight then its bias (LayerSlice's order), valid until release(layer).
class LayerParams {
 public:
  virtual ~LayerParams() = default;
  // Layer `layer`'s parameters (the model's layer index), until release(layer).
  virtual const float* acquire(int layer) = 0;
  // The caller is done with acquire(layer)'s pointer.
  virtual void release(int layer) = 0;
};

class CpuLinear {
 public:
  // Layer `slice` of the model; its parameters and gradients at slice offsets - `base` in
  // the stage's buffers `params` and `grads`; `hidden`: a ReLU follows.
  CpuLinear(const LayerSlice& slice, bool hidden, float* params, float* grads, size_t base);

  const LayerSlice& slice() const { return slice_; }
  bool hidden() const { return hidden_; }
  // y[batch, out] = relu(x w^T + b) (hidden) or x w^T + b.
  void forward(const float* x, float* y, int batch) const;
  // dy (w.r.t. its output) made w.r.t. its pre-activation, in place: zero where y <= 0.
  void activation_backward(const float* y, float* dy, int batch) const;
  // From dy w.r.t. its pre-activation: the weight and bias gradients over (or, with
  // `accumulate`, added to) the stage's, and dx (null: not wanted), in one pass or apart.
  void backward(const float* x, const float* dy, float* dx, int batch, bool accumulate) const;
  void backward_weight(const float* x, const float* dy, int batch, bool accumulate) const;
  void backward_input(const float* dy, float* dx, int batch) const;
  // From now on the parameters come from `source` (model layer index `layer`) for each use
  // that reads them (forward, the input gradient); the gradients stay where they were.
  void set_source(LayerParams* source, int layer) {
    source_ = source;
    layer_ = layer;
  }
  // From now on the weight and bias gradients are written at `weight` and `bias` (a gradient
  // ring's slot, where its owner keeps them).
  void set_grads(float* weight, float* bias) {
    grad_weight_ = weight;
    grad_bias_ = bias;
  }

 private:
  // The weight (the bias after it) for one use, and the end of that use.
  const float* acquire() const { return source_ ? source_->acquire(layer_) : weight_; }
  void release() const {
    if (source_) source_->release(layer_);
  }

  LayerSlice slice_;
  bool hidden_;
  float* weight_;
  float* bias_;
  float* grad_weight_;
  float* grad_bias_;
  LayerParams* source_ = nullptr;
  int layer_ = -1;
};

}  // namespace ddp
