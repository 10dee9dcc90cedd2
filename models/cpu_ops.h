// CPU reference ops of the MLP: the specification the GPU kernels are tested against.
// All tensors are row-major float32; sizes are in elements.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/loss_sum.h"

namespace ddp {

// y[batch, out] = x[batch, in] * w[out, in]^T + b[out]; then max(y, 0) when `relu`.
void linear_forward_cpu(const float* x, const float* w, const float* b, float* y, int batch, int in,
                        int out, bool relu);

// dy[i] = 0 where y[i] <= 0 (y is the ReLU output), in place; `count` elements.
void relu_backward_cpu(const float* y, float* dy, size_t count);

// The weight and bias gradients alone (linear_backward_cpu's first half, as the zero-bubble
// schedules run it apart): dw[out, in] (+)= dy^T x, db[out] (+)= sum over the batch of dy.
void linear_weight_grad_cpu(const float* x, const float* dy, float* dw, float* db, int batch,
                            int in, int out, bool accumulate);
// The input gradient alone (its second half): dx[batch, in] = dy w.
void linear_input_grad_cpu(const float* w, const float* dy, float* dx, int batch, int in, int out);
// Given dy[batch, out]: dw[out, in] (+)= dy^T x, db[out] (+)= sum over the batch of dy,
// and dx[batch, in] = dy w when dx is not null. With `accumulate`, dw and db are added to
// (gradient accumulation); otherwise they are overwritten.
void linear_backward_cpu(const float* x, const float* w, const float* dy, float* dx, float* dw,
                         float* db, int batch, int in, int out, bool accumulate);

// Softmax cross-entropy over logits[batch, classes] and labels[batch] (0 <= label < classes).
// Writes dlogits = (softmax - one_hot(label)) * grad_scale (grad_scale = 1/batch for a batch
// mean) when dlogits is not null. Returns the loss summed over the batch, not averaged.
LossSum softmax_xent_cpu(const float* logits, const int32_t* labels, int batch, int classes,
                         float grad_scale, float* dlogits);

// Whether any of values[0, count) is NaN or +-Inf (its exponent bits all set). An OR over
// the buffer that vectorises: no sum to overflow on large finite values, no float chain.
bool any_nonfinite(const float* values, size_t count);

}  // namespace ddp
