// CpuMlp: forward stores every layer's output; backward walks the layers last to first,
// ping-ponging between two gradient buffers.
#include "models/mlp_cpu.h"

#include "runtime/error.h"

namespace ddp {

CpuMlp::CpuMlp(MlpShape shape, int max_batch)
    : shape_(std::move(shape)),
      max_batch_(max_batch),
      params_(shape_.param_count()),
      grads_(shape_.param_count()),
      grad_a_(static_cast<size_t>(max_batch) * shape_.max_width()),
      grad_b_(static_cast<size_t>(max_batch) * shape_.max_width()) {
  for (int i = 0; i < shape_.num_layers(); ++i)
    activations_.emplace_back(static_cast<size_t>(max_batch) * shape_.layer(i).out);
}

const float* CpuMlp::forward(const float* x, int batch) {
  DDP_CHECK(batch > 0 && batch <= max_batch_, "batch {} outside [1, {}]", batch, max_batch_);
  input_ = x;
  const float* in = x;
  for (int i = 0; i < shape_.num_layers(); ++i) {
    const LayerSlice& layer = shape_.layer(i);
    const bool relu = i + 1 < shape_.num_layers();
    linear_forward_cpu(in, params_.data() + layer.weight_offset, params_.data() + layer.bias_offset,
                       activations_[i].data(), batch, layer.in, layer.out, relu);
    in = activations_[i].data();
  }
  return in;
}

LossSum CpuMlp::backward(const int32_t* labels, int batch, float grad_scale, bool accumulate,
                         const std::function<void(int)>& on_layer_done) {
  DDP_CHECK(input_ != nullptr, "backward() called before forward()");
  const int last = shape_.num_layers() - 1;
  float* dy = grad_a_.data();
  float* dx = grad_b_.data();
  const LossSum sum = softmax_xent_cpu(activations_[last].data(), labels, batch,
                                       shape_.num_classes(), grad_scale, dy);
  for (int i = last; i >= 0; --i) {
    const LayerSlice& layer = shape_.layer(i);
    if (i < last)
      relu_backward_cpu(activations_[i].data(), dy, static_cast<size_t>(batch) * layer.out);
    const float* x = i == 0 ? input_ : activations_[i - 1].data();
    linear_backward_cpu(x, params_.data() + layer.weight_offset, dy, i == 0 ? nullptr : dx,
                        grads_.data() + layer.weight_offset, grads_.data() + layer.bias_offset,
                        batch, layer.in, layer.out, accumulate);
    if (on_layer_done) on_layer_done(i);
    std::swap(dy, dx);
  }
  return sum;
}

}  // namespace ddp
