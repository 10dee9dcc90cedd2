// FusedMlpStep: one cooperative kernel a training step (fused_mlp.h). Phases, a grid-wide
// barrier after each: each layer's forward (the first reading the batch's rows of the
// training split in place); the loss; each layer's backward (its weight and bias gradients
// and, below the first layer, its input gradient through the ReLU); then the SGD update. A
// phase's products are 32 x 32 output tiles dealt round-robin over the blocks (tensor cores
// through WMMA in tf32 and bf16, float32 FMAs in fp32).
#include "models/fused_mlp.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;
constexpr int kMaxWidth = 1024;

enum Rounding : int { kNone = 0, kTf32 = 1, kBf16 = 2 };

struct Args {
  int layers = 0, batch = 0;
  int widths[kFusedMaxLayers + 1] = {};
  size_t weight[kFusedMaxLayers] = {}, bias[kFusedMaxLayers] = {};
  size_t at[kFusedMaxLayers + 1] = {};  // offsets of each layer's input (and the logits)
  float* act = nullptr;                 // [batch, width] at at[l]
  float* grad = nullptr;                // the loss gradient w.r.t. act, same offsets
  FusedStepIo io;
  size_t count = 0;
  float momentum = 0, weight_decay = 0, grad_scale = 0;
  int rounding = kNone;
};

__device__ __forceinline__ float to_tf32(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
  return __uint_as_float(r);
}
__device__ __forceinline__ float to_bf16(float v) {
  return __bfloat162float(__float2bfloat16(v));
}
// An activation or activation gradient as stored between layers (bf16 with bf16 precision).
__device__ __forceinline__ float stored(float v, int rounding) {
  return rounding == kBf16 ? to_bf16(v) : v;
}

// Element (r, c) of a matrix at p: p[r * rs + c * cs].
// Element (r, c) of a matrix at p: p[r' * rs + c * cs], r' = rows[r] where `rows` is given
// (the batch's samples, read in place from the training split).
struct View {
  const float* p;
  int rs, cs;
  const int32_t* rows = nullptr;
  __device__ float at(int r, int c) const {
    const size_t row = rows != nullptr ? static_cast<size_t>(rows[r]) : static_cast<size_t>(r);
    return p[row * rs + static_cast<size_t>(c) * cs];
  }
};

// Shared memory of one block: the largest layout of the products below.
constexpr int kSmemBytes = 2 * kTile * 36 * 4 + 2 * kTile * 36 * 4;

// The products: C[m, n] = sum over k of A(m, k) B(k, n), each output handed to
// epilogue(m, n, sum), in 32 x 32 tiles dealt to the blocks from `rotate` on (so that two
// products of a phase share the blocks), k in chunks of 32 through shared memory, edges
// padded with zeros. float32: FMAs, each thread 2 x 2 outputs summed over k in order.
template <typename Epilogue>
__device__ void simt_product(int M, int N, int K, View A, View B, int rotate, unsigned char* smem,
                             Epilogue epilogue) {
  auto as = reinterpret_cast<float(*)[kTile + 1]>(smem);  // [k][m]
  auto bs = as + kTile;                                   // [k][n]
  const int tiles_n = (N + kTile - 1) / kTile;
  const int tiles = ((M + kTile - 1) / kTile) * tiles_n;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int first = static_cast<int>((blockIdx.x + gridDim.x - rotate % gridDim.x) % gridDim.x);
  for (int t = first; t < tiles; t += gridDim.x) {
    const int m0 = (t / tiles_n) * kTile, n0 = (t % tiles_n) * kTile;
    float sum[2][2] = {{0, 0}, {0, 0}};
    for (int k0 = 0; k0 < K; k0 += kTile) {
      for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
        const int r = i / kTile, c = i % kTile;  // A: row m0 + r, column k0 + c
        as[c][r] = m0 + r < M && k0 + c < K ? A.at(m0 + r, k0 + c) : 0.0f;
        bs[r][c] = k0 + r < K && n0 + c < N ? B.at(k0 + r, n0 + c) : 0.0f;
      }
      __syncthreads();
#pragma unroll 8
      for (int k = 0; k < kTile; ++k) {
        const float a0 = as[k][2 * ty], a1 = as[k][2 * ty + 1];
        const float b0 = bs[k][2 * tx], b1 = bs[k][2 * tx + 1];
        sum[0][0] = fmaf(a0, b0, sum[0][0]);
        sum[0][1] = fmaf(a0, b1, sum[0][1]);
        sum[1][0] = fmaf(a1, b0, sum[1][0]);
        sum[1][1] = fmaf(a1, b1, sum[1][1]);
      }
      __syncthreads();
    }
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const int m = m0 + 2 * ty + i, n = n0 + 2 * tx + j;
        if (m < M && n < N) epilogue(m, n, sum[i][j]);
      }
  }
}

// tf32 or bf16: tensor cores through WMMA. The eight warps: warp w computes the 16 x 16
// quarter w % 4 of the tile over half w / 4 of each chunk's k; the two halves' sums are added
// (in that order) in the epilogue.
template <bool kBf16Operands, typename Epilogue>
__device__ void mma_product(int M, int N, int K, View A, View B, int rotate, unsigned char* smem,
                            Epilogue epilogue) {
  namespace wmma = nvcuda::wmma;
  using T = typename std::conditional<kBf16Operands, __nv_bfloat16, float>::type;
  constexpr int kLd = kBf16Operands ? 40 : 36;  // a row of a tile in shared memory, in elements
  constexpr int kCld = 36;
  constexpr int kK = kBf16Operands ? 16 : 8;                                 // the k of one WMMA
  T* as = reinterpret_cast<T*>(smem);                                        // [m][k]
  T* bs = as + kTile * kLd;                                                  // [k][n]
  float* cs = reinterpret_cast<float*>(smem + 2 * kTile * kLd * sizeof(T));  // [half][m][n]
  const int warp = threadIdx.x / 32, quarter = warp % 4, half = warp / 4;
  const int qm = (quarter / 2) * 16, qn = (quarter % 2) * 16;
  const int tiles_n = (N + kTile - 1) / kTile;
  const int tiles = ((M + kTile - 1) / kTile) * tiles_n;
  const int first = static_cast<int>((blockIdx.x + gridDim.x - rotate % gridDim.x) % gridDim.x);
  for (int t = first; t < tiles; t += gridDim.x) {
    const int m0 = (t / tiles_n) * kTile, n0 = (t % tiles_n) * kTile;
    wmma::fragment<wmma::accumulator, 16, 16, kK, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k0 = 0; k0 < K; k0 += kTile) {
      for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
        const int r = i / kTile, c = i % kTile;
        const float a = m0 + r < M && k0 + c < K ? A.at(m0 + r, k0 + c) : 0.0f;
        const float b = k0 + r < K && n0 + c < N ? B.at(k0 + r, n0 + c) : 0.0f;
        if constexpr (kBf16Operands) {
          as[r * kLd + c] = __float2bfloat16(a);
          bs[r * kLd + c] = __float2bfloat16(b);
        } else {
          as[r * kLd + c] = to_tf32(a);
          bs[r * kLd + c] = to_tf32(b);
        }
      }
      __syncthreads();
      for (int s = half * (kTile / kK / 2); s < (half + 1) * (kTile / kK / 2); ++s) {
        using Operand =
            typename std::conditional<kBf16Operands, __nv_bfloat16, wmma::precision::tf32>::type;
        wmma::fragment<wmma::matrix_a, 16, 16, kK, Operand, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, kK, Operand, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, as + qm * kLd + s * kK, kLd);
        wmma::load_matrix_sync(fb, bs + s * kK * kLd + qn, kLd);
        if constexpr (!kBf16Operands) {
          for (int e = 0; e < fa.num_elements; ++e)
            fa.x[e] = wmma::__float_to_tf32(fa.x[e]);
          for (int e = 0; e < fb.num_elements; ++e)
            fb.x[e] = wmma::__float_to_tf32(fb.x[e]);
        }
        wmma::mma_sync(acc, fa, fb, acc);
      }
      __syncthreads();
    }
    wmma::store_matrix_sync(cs + half * kTile * kCld + qm * kCld + qn, acc, kCld,
                            wmma::mem_row_major);
    __syncthreads();
    for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
      const int r = i / kTile, c = i % kTile;
      if (m0 + r < M && n0 + c < N)
        epilogue(m0 + r, n0 + c, cs[r * kCld + c] + cs[kTile * kCld + r * kCld + c]);
    }
    __syncthreads();
  }
}

// The product in the step's precision.
template <typename Epilogue>
__device__ void product(int M, int N, int K, View A, View B, int rounding, int rotate,
                        unsigned char* smem, Epilogue epilogue) {
  if (rounding == kTf32)
    mma_product<false>(M, N, K, A, B, rotate, smem, epilogue);
  else if (rounding == kBf16)
    mma_product<true>(M, N, K, A, B, rotate, smem, epilogue);
  else
    simt_product(M, N, K, A, B, rotate, smem, epilogue);
}

__global__ void __launch_bounds__(kThreads) fused_step_kernel(Args a) {
  namespace cg = cooperative_groups;
  cg::grid_group grid = cg::this_grid();
  const int B = a.batch, L = a.layers;
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  __shared__ __align__(128) unsigned char smem[kSmemBytes];

  // The batch: its rows of x, read in place by the first layer's products (rounded as operands).
  const int32_t* samples =
      a.io.indices + (a.io.counter != nullptr ? *a.io.counter * a.io.stride : 0);
  const auto input = [&](int l) {
    return l == 0 ? View{a.io.x, a.widths[0], 1, samples} : View{a.act + a.at[l], a.widths[l], 1};
  };

  // Forward: act[l + 1] = relu(act[l] W^T + b) (the last layer: logits, float32).
  for (int l = 0; l < L; ++l) {
    const int in = a.widths[l], out = a.widths[l + 1];
    const bool hidden = l + 1 < L;
    const float* w = a.io.params + a.weight[l];
    const float* bias = a.io.params + a.bias[l];
    float* y = a.act + a.at[l + 1];
    const int rounding = a.rounding;
    product(B, out, in, input(l), View{w, 1, in}, rounding, 0, smem, [&](int m, int n, float sum) {
      const float b = hidden && rounding == kBf16 ? to_bf16(bias[n]) : bias[n];
      const float v = sum + b;
      y[static_cast<size_t>(m) * out + n] = hidden ? stored(fmaxf(v, 0.0f), rounding) : v;
    });
    grid.sync();
  }

  // Softmax cross-entropy, one warp a sample: the loss gradient (softmax - onehot) / batch.
  {
    const int classes = a.widths[L];
    const int lane = threadIdx.x % 32;
    const int warps = static_cast<int>(threads / 32);
    for (int b = static_cast<int>(thread / 32); b < B; b += warps) {
      const float* z = a.act + a.at[L] + static_cast<size_t>(b) * classes;
      float best = -FLT_MAX;
      int arg = 0;
      for (int j = lane; j < classes; j += 32)
        if (z[j] > best) best = z[j], arg = j;
      for (int s = 16; s > 0; s /= 2) {
        const float other = __shfl_xor_sync(0xffffffffu, best, s);
        const int other_arg = __shfl_xor_sync(0xffffffffu, arg, s);
        if (other > best || (other == best && other_arg < arg)) best = other, arg = other_arg;
      }
      float total = 0;
      for (int j = lane; j < classes; j += 32)
        total += expf(z[j] - best);
      for (int s = 16; s > 0; s /= 2)
        total += __shfl_xor_sync(0xffffffffu, total, s);
      const int label = a.io.y[samples[b]];
      float* g = a.grad + a.at[L] + static_cast<size_t>(b) * classes;
      for (int j = lane; j < classes; j += 32)
        g[j] = stored((expf(z[j] - best) / total - (j == label ? 1.0f : 0.0f)) * a.grad_scale,
                      a.rounding);
      if (lane == 0) {
        atomicAdd(a.io.loss_sum, static_cast<double>(logf(total) - (z[label] - best)));
        if (arg == label) atomicAdd(a.io.correct, 1);
      }
    }
  }
  grid.sync();

  // Backward, last layer first: dW = G^T X and db = column sums of G; below the first layer
  // the input gradient G W through the ReLU of the layer below.
  for (int l = L - 1; l >= 0; --l) {
    const int in = a.widths[l], out = a.widths[l + 1];
    const float* g = a.grad + a.at[l + 1];
    const float* x = a.act + a.at[l];
    float* dw = a.io.grads + a.weight[l];
    float* db = a.io.grads + a.bias[l];
    const int rounding = a.rounding;
    product(out, in, B, View{g, 1, out}, input(l), rounding, 0, smem,
            [&](int m, int n, float sum) { dw[static_cast<size_t>(m) * in + n] = sum; });
    const int dw_tiles = ((out + kTile - 1) / kTile) * ((in + kTile - 1) / kTile);
    if (l > 0) {
      const float* w = a.io.params + a.weight[l];
      float* gx = a.grad + a.at[l];
      product(B, in, out, View{g, out, 1}, View{w, in, 1}, rounding, dw_tiles, smem,
              [&](int m, int n, float sum) {
                const size_t i = static_cast<size_t>(m) * in + n;
                gx[i] = x[i] > 0.0f ? stored(sum, rounding) : 0.0f;
              });
    }
    for (size_t o = thread; o < static_cast<size_t>(out); o += threads) {
      float sum = 0;
      for (int b = 0; b < B; ++b)
        sum += g[static_cast<size_t>(b) * out + o];
      db[o] = sum;
    }
    grid.sync();
  }

  // SGD with momentum and L2 weight decay, as sgd_kernel (cuda_kernels.cu).
  const OptStep step = a.io.steps[a.io.counter != nullptr ? *a.io.counter : 0];
  auto* p16 = static_cast<__nv_bfloat16*>(a.io.params16);
  for (size_t i = thread; i < a.count; i += threads) {
    float p = a.io.params[i];
    float g = a.io.grads[i];
    if (a.weight_decay != 0.0f) g = g + a.weight_decay * p;
    if (a.momentum != 0.0f) {
      const float buf = step.first ? g : a.momentum * a.io.momentum[i] + g;
      a.io.momentum[i] = buf;
      g = buf;
    }
    p = p - step.lr * g;
    a.io.params[i] = p;
    if (p16 != nullptr) p16[i] = __float2bfloat16(p);
  }
}

}  // namespace

bool fused_step_fits(const MlpShape& shape, int batch, const OptimizerConfig& optimizer,
                     std::string* why) {
  std::string reason;
  if (shape.num_layers() > kFusedMaxLayers)
    reason = "more than " + std::to_string(kFusedMaxLayers) + " layers";
  else if (batch < 1 || batch > kMaxWidth)
    reason = "a batch of " + std::to_string(batch) + " (at most " + std::to_string(kMaxWidth) + ")";
  else if (optimizer.kind != OptimizerKind::kSgd)
    reason = "an optimizer other than SGD";
  for (int w : shape.widths())
    if (reason.empty() && w > kMaxWidth)
      reason = "a width of " + std::to_string(w) + " (at most " + std::to_string(kMaxWidth) + ")";
  if (why != nullptr) *why = reason;
  return reason.empty();
}

FusedMlpStep::FusedMlpStep(const MlpShape& shape, int batch, Precision precision,
                           const OptimizerConfig& optimizer)
    : shape_(shape), batch_(batch), precision_(precision), optimizer_(optimizer) {
  std::string why;
  DDP_CHECK(fused_step_fits(shape, batch, optimizer, &why), "the fused step does not take {}", why);
  size_t total = 0;
  for (int w : shape.widths())
    total += static_cast<size_t>(batch) * w;
  activations_ = DeviceBuffer<float>(total, MemoryCategory::kActivations);
  gradients_ = DeviceBuffer<float>(total, MemoryCategory::kActivations);
  int device = 0, sms = 0, per_sm = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  DDP_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fused_step_kernel, kThreads, 0));
  DDP_CHECK(per_sm > 0, "the fused step's kernel fits no SM");
  // The widest phase's tiles, at most one block an SM (more would only wait at the barriers).
  int tiles = 1;
  const auto tiles_of = [](int m, int n) {
    return ((m + kTile - 1) / kTile) * ((n + kTile - 1) / kTile);
  };
  for (int l = 0; l < shape.num_layers(); ++l) {
    const int in = shape.widths()[l], out = shape.widths()[l + 1];
    tiles = std::max(
        {tiles, tiles_of(batch, out), tiles_of(out, in) + (l > 0 ? tiles_of(batch, in) : 0)});
  }
  blocks_ = std::min(tiles, sms);
}

void FusedMlpStep::run(const FusedStepIo& io, cudaStream_t stream) const {
  Args a;
  a.layers = shape_.num_layers();
  a.batch = batch_;
  size_t at = 0;
  for (int l = 0; l <= a.layers; ++l) {
    a.widths[l] = shape_.widths()[l];
    a.at[l] = at;
    at += static_cast<size_t>(batch_) * a.widths[l];
  }
  for (int l = 0; l < a.layers; ++l) {
    a.weight[l] = shape_.layer(l).weight_offset;
    a.bias[l] = shape_.layer(l).bias_offset;
  }
  a.act = activations_.data();
  a.grad = gradients_.data();
  a.io = io;
  a.count = shape_.param_count();
  a.momentum = optimizer_.momentum;
  a.weight_decay = optimizer_.weight_decay;
  a.grad_scale = 1.0f / static_cast<float>(batch_);
  a.rounding = precision_ == Precision::kTf32   ? kTf32
               : precision_ == Precision::kBf16 ? kBf16
                                                : kNone;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks_));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute cooperative = {};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  DDP_CUDA_CHECK(cudaLaunchKernelEx(&config, fused_step_kernel, a));
}

}  // namespace ddp
