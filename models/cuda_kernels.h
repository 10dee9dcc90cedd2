// Host launchers of the MLP's own CUDA kernels (the matrix products go through cuBLASLt in
// mlp_cuda.cpp). Every launcher is asynchronous on `stream` and checks the launch error.
// Activation buffers are float32, or bfloat16 where `bf16` is set. Counts are elements.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "models/optimizer.h"

namespace ddp {

// x_out[i, :] = x[indices[*counter * stride + i], :], y_out[i] = y[same] for i < batch;
// counter may be null (offset 0). `stride` is the samples of one step (batch, or the
// micro-batches' sum with gradient accumulation, `indices` then pointing at a micro-batch's
// first index). x_out is float or bf16. Either output may be null (not gathered; its input
// may then be null too: a pipeline's last stage needs only the labels).
void launch_gather_batch(const float* x, const int32_t* y, int dim, const int32_t* indices,
                         const int* counter, int stride, int batch, void* x_out, bool bf16,
                         int32_t* y_out, cudaStream_t stream);

// One block per row: softmax cross-entropy of logits[batch, classes] (float). Adds the summed
// loss to *loss_sum and the hits to *correct; writes dlogits = (softmax - onehot) * grad_scale
// when dlogits is not null (float or bf16).
void launch_softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                         float grad_scale, void* dlogits, bool bf16, double* loss_sum, int* correct,
                         cudaStream_t stream);

// dz[i] = 0 where act[i] <= 0 (fallback when cuBLASLt has no DRELU epilogue for a shape).
void launch_relu_mask(void* dz, const void* act, size_t count, bool bf16, cudaStream_t stream);
// db[j] (+)= sum over rows of dz[batch, out] (fallback for the BGRADB epilogue).
void launch_bias_grad(const void* dz, int batch, int out, bool bf16, float* db, bool accumulate,
                      cudaStream_t stream);

// torch.optim.SGD over flat buffers; writes a bf16 copy of the parameters when p16 is set.
void launch_sgd(float* params, const float* grads, float* momentum_buf, void* p16, size_t count,
                const OptStep* steps, const int* counter, float momentum, float weight_decay,
                cudaStream_t stream);
// torch.optim.AdamW over flat buffers; bf16 copy as above.
void launch_adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, void* p16,
                  size_t count, const OptStep* steps, const int* counter, float beta1, float beta2,
                  float eps, float weight_decay, cudaStream_t stream);

void launch_to_bf16(const float* in, void* out, size_t count, cudaStream_t stream);
void launch_to_float(const void* in_bf16, float* out, size_t count, cudaStream_t stream);
void launch_increment(int* counter, cudaStream_t stream);
// Fills with a value (to poison outputs in tests). bf16 buffers get the bf16 of value.
void launch_fill(void* data, size_t count, bool bf16, float value, cudaStream_t stream);
// out[i] = counter_uniform(key, first_index + i, low, high) (models/rng.h), as on the host.
void launch_counter_uniform(float* out, size_t count, uint64_t key, uint64_t first_index, float low,
                            float high, cudaStream_t stream);

}  // namespace ddp
