// CPU reference ops: matrix products through gemm_cpu, the rest as plain loops.
#include "models/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "models/gemm.h"

namespace ddp {

void linear_forward_cpu(const float* x, const float* w, const float* b, float* y, int batch, int in,
                        int out, bool relu) {
  for (int i = 0; i < batch; ++i)
    std::copy(b, b + out, y + static_cast<size_t>(i) * out);
  gemm_cpu(false, true, batch, out, in, 1.0f, x, in, w, in, 1.0f, y, out);
  if (relu) {
    const size_t count = static_cast<size_t>(batch) * out;
    for (size_t i = 0; i < count; ++i)
      y[i] = std::max(y[i], 0.0f);
  }
}

void relu_backward_cpu(const float* y, float* dy, size_t count) {
  for (size_t i = 0; i < count; ++i)
    dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void linear_weight_grad_cpu(const float* x, const float* dy, float* dw, float* db, int batch,
                            int in, int out, bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  gemm_cpu(true, false, out, in, batch, 1.0f, dy, out, x, in, beta, dw, in);
  if (!accumulate) std::fill(db, db + out, 0.0f);
  for (int i = 0; i < batch; ++i) {
    const float* row = dy + static_cast<size_t>(i) * out;
    for (int j = 0; j < out; ++j)
      db[j] += row[j];
  }
}

void linear_input_grad_cpu(const float* w, const float* dy, float* dx, int batch, int in, int out) {
  gemm_cpu(false, false, batch, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

void linear_backward_cpu(const float* x, const float* w, const float* dy, float* dx, float* dw,
                         float* db, int batch, int in, int out, bool accumulate) {
  linear_weight_grad_cpu(x, dy, dw, db, batch, in, out, accumulate);
  if (dx != nullptr) linear_input_grad_cpu(w, dy, dx, batch, in, out);
}

LossSum softmax_xent_cpu(const float* logits, const int32_t* labels, int batch, int classes,
                         float grad_scale, float* dlogits) {
  LossSum sum;
  for (int i = 0; i < batch; ++i) {
    const float* row = logits + static_cast<size_t>(i) * classes;
    const int label = labels[i];
    int arg_max = 0;
    for (int j = 1; j < classes; ++j)
      if (row[j] > row[arg_max]) arg_max = j;
    const float max_logit = row[arg_max];
    double total = 0;
    for (int j = 0; j < classes; ++j)
      total += std::exp(static_cast<double>(row[j] - max_logit));
    const double log_total = std::log(total);
    sum.loss += log_total - static_cast<double>(row[label] - max_logit);
    sum.correct += arg_max == label ? 1 : 0;
    if (dlogits != nullptr) {
      float* grad = dlogits + static_cast<size_t>(i) * classes;
      for (int j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(row[j] - max_logit) - log_total);
        grad[j] = static_cast<float>(p - (j == label ? 1.0 : 0.0)) * grad_scale;
      }
    }
  }
  return sum;
}

bool any_nonfinite(const float* values, size_t count) {
  uint32_t nonfinite = 0;
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof(bits));
    nonfinite |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  return nonfinite != 0;
}

}  // namespace ddp
