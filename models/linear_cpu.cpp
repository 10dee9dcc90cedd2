#include "models/linear_cpu.h"

#include "models/cpu_ops.h"

namespace ddp {

CpuLinear::CpuLinear(const LayerSlice& slice, bool hidden, float* params, float* grads, size_t base)
    : slice_(slice),
      hidden_(hidden),
      weight_(params + (slice.weight_offset - base)),
      bias_(params + (slice.bias_offset - base)),
      grad_weight_(grads + (slice.weight_offset - base)),
      grad_bias_(grads + (slice.bias_offset - base)) {}

void CpuLinear::forward(const float* x, float* y, int batch) const {
  const float* w = acquire();
  const size_t weights = static_cast<size_t>(slice_.in) * slice_.out;
  linear_forward_cpu(x, w, source_ ? w + weights : bias_, y, batch, slice_.in, slice_.out, hidden_);
  release();
}

void CpuLinear::activation_backward(const float* y, float* dy, int batch) const {
  if (hidden_) relu_backward_cpu(y, dy, static_cast<size_t>(batch) * slice_.out);
}

void CpuLinear::backward(const float* x, const float* dy, float* dx, int batch,
                         bool accumulate) const {
  if (dx == nullptr) {  // the weights are not read
    backward_weight(x, dy, batch, accumulate);
    return;
  }
  linear_backward_cpu(x, acquire(), dy, dx, grad_weight_, grad_bias_, batch, slice_.in, slice_.out,
                      accumulate);
  release();
}

void CpuLinear::backward_weight(const float* x, const float* dy, int batch, bool accumulate) const {
  linear_weight_grad_cpu(x, dy, grad_weight_, grad_bias_, batch, slice_.in, slice_.out, accumulate);
}

void CpuLinear::backward_input(const float* dy, float* dx, int batch) const {
  linear_input_grad_cpu(acquire(), dy, dx, batch, slice_.in, slice_.out);
  release();
}

}  // namespace ddp
