// The MLP on the CPU: flat parameter and gradient buffers, activations sized for a maximum
// batch, forward and backward through the reference ops.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/cpu_ops.h"
#include "models/mlp.h"

namespace ddp {

class CpuMlp {
 public:
  CpuMlp(MlpShape shape, int max_batch);

  const MlpShape& shape() const { return shape_; }
  int max_batch() const { return max_batch_; }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  // Output of layer i from the last forward() ([batch, layer(i).out], after its ReLU).
  const float* activation(int i) const { return activations_[i].data(); }

  // Runs the layers on x[batch, input_width]; returns logits[batch, classes], valid until
  // the next call. batch <= max_batch.
  const float* forward(const float* x, int batch);

  // After forward() on the same batch: softmax cross-entropy against labels, then backward.
  // Gradients are the loss gradients scaled by grad_scale (1/batch: the batch mean), written
  // over grads() or, with `accumulate`, added to them. Returns the summed loss and hits.
  // `on_layer_done(i)`, when given, is called as soon as layer i's gradients are written
  // (layers last to first), so that their all-reduce can start.
  LossSum backward(const int32_t* labels, int batch, float grad_scale, bool accumulate = false,
                   const std::function<void(int)>& on_layer_done = {});

 private:
  MlpShape shape_;
  int max_batch_;
  std::vector<float> params_;
  std::vector<float> grads_;
  const float* input_ = nullptr;
  std::vector<std::vector<float>> activations_;  // output of layer i, [max_batch, out]
  std::vector<float> grad_a_;                    // [max_batch, max_width]
  std::vector<float> grad_b_;
};

}  // namespace ddp
