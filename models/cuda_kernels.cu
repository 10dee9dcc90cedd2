// The MLP's elementwise, reduction and optimizer kernels.
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "models/cuda_kernels.h"
#include "models/rng.h"
#include "runtime/cuda_check.h"

namespace ddp {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t count) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535u * 8 ? (blocks == 0 ? 1 : blocks) : 65535u * 8);
}

__device__ float load(const void* p, size_t i, bool bf16) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
              : static_cast<const float*>(p)[i];
}
__device__ void store(void* p, size_t i, float v, bool bf16) {
  if (bf16)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
  else
    static_cast<float*>(p)[i] = v;
}

__global__ void gather_kernel(const float* x, const int32_t* y, int dim, const int32_t* indices,
                              const int* counter, int stride, int batch, void* x_out, bool bf16,
                              int32_t* y_out) {
  const size_t offset = counter ? static_cast<size_t>(*counter) * stride : 0;
  const int row = blockIdx.x;
  const int32_t src = indices[offset + row];
  if (threadIdx.x == 0 && y_out != nullptr) y_out[row] = y[src];
  if (x_out == nullptr) return;
  const float* in = x + static_cast<size_t>(src) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x)
    store(x_out, static_cast<size_t>(row) * dim + d, in[d], bf16);
}

// As gather_kernel for rows of a multiple of 4 values: 16-byte loads, each thread's loads all
// issued before its stores (the row's latency paid once, not once a value).
template <bool kBf16>
__global__ void gather_rows4_kernel(const float4* __restrict__ x, const int32_t* y, int dim4,
                                    const int32_t* indices, const int* counter, int stride,
                                    void* __restrict__ x_out, int32_t* y_out) {
  constexpr int kUnroll = 4;
  const size_t offset = counter ? static_cast<size_t>(*counter) * stride : 0;
  const int row = blockIdx.x;
  const int32_t src = indices[offset + row];
  if (threadIdx.x == 0 && y_out != nullptr) y_out[row] = y[src];
  const float4* in = x + static_cast<size_t>(src) * dim4;
  const size_t out_row = static_cast<size_t>(row) * dim4;
  for (int base = threadIdx.x; base < dim4; base += kUnroll * blockDim.x) {
    float4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int d = base + u * blockDim.x;
      if (d < dim4) v[u] = __ldg(in + d);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int d = base + u * blockDim.x;
      if (d >= dim4) continue;
      if (kBf16) {
        // Each value rounded to nearest even, as __float2bfloat16 does.
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v[u].x, v[u].y);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(v[u].z, v[u].w);
        uint2 packed;
        packed.x = *reinterpret_cast<const uint32_t*>(&lo);
        packed.y = *reinterpret_cast<const uint32_t*>(&hi);
        static_cast<uint2*>(x_out)[out_row + d] = packed;
      } else {
        static_cast<float4*>(x_out)[out_row + d] = v[u];
      }
    }
  }
}

// One block per row; classes spread over the block's threads.
__global__ void softmax_xent_kernel(const float* logits, const int32_t* labels, int classes,
                                    float grad_scale, void* dlogits, bool bf16, double* loss_sum,
                                    int* correct) {
  __shared__ float s_max[kThreads];
  __shared__ int s_arg[kThreads];
  __shared__ float s_sum[kThreads];
  const int row = blockIdx.x;
  const float* z = logits + static_cast<size_t>(row) * classes;
  float best = -FLT_MAX;
  int arg = 0;
  for (int j = threadIdx.x; j < classes; j += blockDim.x)
    if (z[j] > best) best = z[j], arg = j;
  s_max[threadIdx.x] = best;
  s_arg[threadIdx.x] = arg;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float other = s_max[threadIdx.x + stride];
      const int other_arg = s_arg[threadIdx.x + stride];
      if (other > s_max[threadIdx.x] ||
          (other == s_max[threadIdx.x] && other_arg < s_arg[threadIdx.x]))
        s_max[threadIdx.x] = other, s_arg[threadIdx.x] = other_arg;
    }
    __syncthreads();
  }
  const float max_z = s_max[0];
  const int arg_max = s_arg[0];
  float sum = 0;
  for (int j = threadIdx.x; j < classes; j += blockDim.x)
    sum += expf(z[j] - max_z);
  __syncthreads();
  s_sum[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s_sum[threadIdx.x] += s_sum[threadIdx.x + stride];
    __syncthreads();
  }
  const float log_total = logf(s_sum[0]);
  const int label = labels[row];
  if (threadIdx.x == 0) {
    atomicAdd(loss_sum, static_cast<double>(log_total - (z[label] - max_z)));
    if (arg_max == label) atomicAdd(correct, 1);
  }
  if (dlogits != nullptr) {
    for (int j = threadIdx.x; j < classes; j += blockDim.x) {
      const float p = expf(z[j] - max_z - log_total);
      store(dlogits, static_cast<size_t>(row) * classes + j,
            (p - (j == label ? 1.0f : 0.0f)) * grad_scale, bf16);
    }
  }
}

__global__ void relu_mask_kernel(void* dz, const void* act, size_t count, bool bf16) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    if (load(act, i, bf16) <= 0.0f) store(dz, i, 0.0f, bf16);
}

// One block per output column j; threads stride over the batch rows.
__global__ void bias_grad_kernel(const void* dz, int batch, int out, bool bf16, float* db,
                                 bool accumulate) {
  __shared__ float s[kThreads];
  const int j = blockIdx.x;
  float sum = 0;
  for (int b = threadIdx.x; b < batch; b += blockDim.x)
    sum += load(dz, static_cast<size_t>(b) * out + j, bf16);
  s[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[j] = accumulate ? db[j] + s[0] : s[0];
}

__global__ void sgd_kernel(float* params, const float* grads, float* momentum_buf,
                           __nv_bfloat16* p16, size_t count, const OptStep* steps,
                           const int* counter, float momentum, float weight_decay) {
  const OptStep step = steps[counter ? *counter : 0];
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float p = params[i];
    float g = grads[i];
    if (weight_decay != 0.0f) g = g + weight_decay * p;
    if (momentum != 0.0f) {
      const float buf = step.first ? g : momentum * momentum_buf[i] + g;
      momentum_buf[i] = buf;
      g = buf;
    }
    p = p - step.lr * g;
    params[i] = p;
    if (p16 != nullptr) p16[i] = __float2bfloat16(p);
  }
}

__global__ void adamw_kernel(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                             __nv_bfloat16* p16, size_t count, const OptStep* steps,
                             const int* counter, float beta1, float beta2, float eps,
                             float weight_decay) {
  const OptStep step = steps[counter ? *counter : 0];
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float p = params[i] * (1.0f - step.lr * weight_decay);
    const float g = grads[i];
    float m = exp_avg[i];
    m += (1.0f - beta1) * (g - m);
    const float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = sqrtf(v) / step.bc2_sqrt + eps;
    p -= step.step_size * (m / denom);
    params[i] = p;
    if (p16 != nullptr) p16[i] = __float2bfloat16(p);
  }
}

__global__ void to_bf16_kernel(const float* in, __nv_bfloat16* out, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(in[i]);
}

__global__ void to_float_kernel(const __nv_bfloat16* in, float* out, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

__global__ void increment_kernel(int* counter) {
  *counter += 1;
}

__global__ void counter_uniform_kernel(float* out, size_t count, uint64_t key, uint64_t first_index,
                                       float low, float high) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = counter_uniform(key, first_index + i, low, high);
}

__global__ void fill_kernel(void* data, size_t count, bool bf16, float value) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    store(data, i, value, bf16);
}

}  // namespace

void launch_gather_batch(const float* x, const int32_t* y, int dim, const int32_t* indices,
                         const int* counter, int stride, int batch, void* x_out, bool bf16,
                         int32_t* y_out, cudaStream_t stream) {
  if (batch == 0) return;
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(x_out) % (bf16 ? 8 : 16) == 0;
  if (x_out != nullptr && dim % 4 == 0 && aligned) {
    const int dim4 = dim / 4;
    const int threads = std::min(kThreads, (dim4 + 31) / 32 * 32);
    const auto* x4 = reinterpret_cast<const float4*>(x);
    if (bf16)
      gather_rows4_kernel<true>
          <<<batch, threads, 0, stream>>>(x4, y, dim4, indices, counter, stride, x_out, y_out);
    else
      gather_rows4_kernel<false>
          <<<batch, threads, 0, stream>>>(x4, y, dim4, indices, counter, stride, x_out, y_out);
  } else {
    gather_kernel<<<batch, 128, 0, stream>>>(x, y, dim, indices, counter, stride, batch, x_out,
                                             bf16, y_out);
  }
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_softmax_xent(const float* logits, const int32_t* labels, int batch, int classes,
                         float grad_scale, void* dlogits, bool bf16, double* loss_sum, int* correct,
                         cudaStream_t stream) {
  if (batch == 0) return;
  const int threads = classes <= 32 ? 32 : classes <= 128 ? 128 : kThreads;
  softmax_xent_kernel<<<batch, threads, 0, stream>>>(logits, labels, classes, grad_scale, dlogits,
                                                     bf16, loss_sum, correct);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_relu_mask(void* dz, const void* act, size_t count, bool bf16, cudaStream_t stream) {
  relu_mask_kernel<<<blocks_for(count), kThreads, 0, stream>>>(dz, act, count, bf16);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_bias_grad(const void* dz, int batch, int out, bool bf16, float* db, bool accumulate,
                      cudaStream_t stream) {
  bias_grad_kernel<<<out, kThreads, 0, stream>>>(dz, batch, out, bf16, db, accumulate);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_sgd(float* params, const float* grads, float* momentum_buf, void* p16, size_t count,
                const OptStep* steps, const int* counter, float momentum, float weight_decay,
                cudaStream_t stream) {
  sgd_kernel<<<blocks_for(count), kThreads, 0, stream>>>(params, grads, momentum_buf,
                                                         static_cast<__nv_bfloat16*>(p16), count,
                                                         steps, counter, momentum, weight_decay);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, void* p16,
                  size_t count, const OptStep* steps, const int* counter, float beta1, float beta2,
                  float eps, float weight_decay, cudaStream_t stream) {
  adamw_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
      params, grads, exp_avg, exp_avg_sq, static_cast<__nv_bfloat16*>(p16), count, steps, counter,
      beta1, beta2, eps, weight_decay);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_to_bf16(const float* in, void* out, size_t count, cudaStream_t stream) {
  to_bf16_kernel<<<blocks_for(count), kThreads, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out),
                                                             count);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_to_float(const void* in_bf16, float* out, size_t count, cudaStream_t stream) {
  to_float_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(in_bf16), out, count);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_increment(int* counter, cudaStream_t stream) {
  increment_kernel<<<1, 1, 0, stream>>>(counter);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_counter_uniform(float* out, size_t count, uint64_t key, uint64_t first_index, float low,
                            float high, cudaStream_t stream) {
  if (count == 0) return;
  counter_uniform_kernel<<<blocks_for(count), kThreads, 0, stream>>>(out, count, key, first_index,
                                                                     low, high);
  DDP_CUDA_CHECK_LAUNCH();
}

void launch_fill(void* data, size_t count, bool bf16, float value, cudaStream_t stream) {
  fill_kernel<<<blocks_for(count), kThreads, 0, stream>>>(data, count, bf16, value);
  DDP_CUDA_CHECK_LAUNCH();
}

}  // namespace ddp
