// FusedMlpStep: one cooperative kernel a training step (fused_mlp.h). Phases, a grid-wide
// barrier between them: each layer's forward (the first reading the batch's rows of the
// training split in place; the last with the softmax cross-entropy in its epilogue), then each
// layer's backward, last layer first (its weight gradient, below the first layer its input
// gradient through the ReLU, its bias gradient and bias update); the SGD update of a layer's
// weights runs in the phase after its backward (its input gradient reads them), the first
// layer's in its weight gradient's epilogue. 2L phases, 2L - 1 barriers for L layers.
// A phase's products are 32 x 32 output tiles, split along k where the tiles alone would leave
// blocks idle (a split's partial sums go to scratch; the last split to arrive sums them in
// split order, so the result does not depend on timing), dealt round-robin over the blocks;
// k runs in chunks of 32 through a five-stage cp.async pipeline in shared memory. tf32 and
// bf16 on tensor cores through WMMA (m16n16k8 tf32; bf16 operands rounded to bf16 first, which
// tf32 holds exactly), float32 FMAs in fp32.
#include "models/fused_mlp.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;
constexpr int kLd = 36;  // a row of a staged 32 x 32 block in shared memory, in floats
constexpr int kStages = 5;
constexpr int kBlockFloats = kTile * kLd;
constexpr int kPer = kTile * kTile / kThreads;  // a tile's elements a thread
constexpr int kMaxWidth = 1024;
constexpr int kMaxClasses = 32;
constexpr int kMaxSplits = 32;

enum Rounding : int { kNone = 0, kTf32 = 1, kBf16 = 2 };
enum Kind : int { kForward = 0, kForwardLoss = 1, kWeightGrad = 2, kInputGrad = 3 };

// One product of a phase: C[M, N] over K, in tiles of 32 x 32, each split `splits` ways
// along k (partials in scratch, arrivals counted in counters, one a tile).
struct Product {
  int kind = 0, layer = 0, M = 0, N = 0, K = 0, splits = 1;
  float* scratch = nullptr;
  int* counters = nullptr;
  __host__ __device__ int tiles_n() const { return (N + kTile - 1) / kTile; }
  __host__ __device__ int tiles() const { return ((M + kTile - 1) / kTile) * tiles_n(); }
};

struct Args {
  int layers = 0, batch = 0;
  int widths[kFusedMaxLayers + 1] = {};
  size_t weight[kFusedMaxLayers] = {}, bias[kFusedMaxLayers] = {};
  size_t at[kFusedMaxLayers + 1] = {};  // offsets of each layer's input (and the logits)
  float* act = nullptr;                 // [batch, width] at at[l]
  float* grad = nullptr;                // the loss gradient w.r.t. act, same offsets
  // Phase p < layers: layer p's forward; phase layers + i: layer layers - 1 - i's backward
  // (its weight gradient, then its input gradient when it has one).
  Product products[2 * kFusedMaxLayers][2];
  FusedStepIo io;
  float momentum = 0, weight_decay = 0, grad_scale = 0;
  unsigned long long* trace = nullptr;  // FusedMlpStep::trace_phases
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
template <int R>
__device__ __forceinline__ float stored(float v) {
  return R == kBf16 ? to_bf16(v) : v;
}

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void copy16(float* to, const float* from, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(to)), "l"(from),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy4(float* to, const float* from, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(to)), "l"(from),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// A matrix operand in global memory as [outer][inner], inner contiguous: element (o, i) at
// p[row(o) * ld + i], row(o) = rows[o] where `rows` is given (the batch's samples, read in
// place from the training split), else o.
struct Operand {
  const float* p;
  int ld;
  const int32_t* rows = nullptr;
};

// Stages the 32 x 32 block of `op` at (o0, i0) into `to` ([32][kLd]), zeros at or past
// (o_end, i_end): one 16-byte copy a thread where the operand's rows are 16-byte aligned,
// else four 4-byte ones.
__device__ __forceinline__ void stage(float* to, const Operand& op, int o0, int i0, int o_end,
                                      int i_end) {
  const int o = threadIdx.x / 8, i = (threadIdx.x % 8) * 4;
  const bool row_ok = o0 + o < o_end;
  const size_t row = !row_ok              ? 0
                     : op.rows != nullptr ? static_cast<size_t>(op.rows[o0 + o])
                                          : static_cast<size_t>(o0 + o);
  const float* from = op.p + row * op.ld + i0 + i;
  float* dst = to + o * kLd + i;
  const bool aligned = (reinterpret_cast<uintptr_t>(op.p) % 16 == 0) && op.ld % 4 == 0;
  if (aligned && (i0 + i + 4 <= i_end || !row_ok || i0 + i >= i_end)) {
    const bool valid = row_ok && i0 + i < i_end;
    copy16(dst, valid ? from : op.p, valid);
  } else {
    for (int e = 0; e < 4; ++e) {
      const bool valid = row_ok && i0 + i + e < i_end;
      copy4(dst + e, valid ? from + e : op.p, valid);
    }
  }
}

// The staged operands' layouts: A (m, k) row-major is [m][k] (inner k), column-major [k][m];
// B (k, n) row-major is [k][n] (inner n), column-major [n][k].
template <bool kARow>
__device__ __forceinline__ float a_at(const float* s, int m, int k) {
  return kARow ? s[m * kLd + k] : s[k * kLd + m];
}
template <bool kBRow>
__device__ __forceinline__ float b_at(const float* s, int k, int n) {
  return kBRow ? s[k * kLd + n] : s[n * kLd + k];
}

// Shared memory of one block: the stages, reused after a tile's k loop for its sums.
struct Smem {
  float stages[kStages][2][kBlockFloats];
  int last;
};

// Tile `tile`, split `split` of product P = A B (A: M x K, B: K x N, in the layouts above),
// its sums handed to finish(m0, n0, sums) as a [32][kLd] block in shared memory once complete
// (by this block, or by the block that completes the last split).
template <int R, bool kARow, bool kBRow, typename Finish>
__device__ void product_tile(const Product& P, int tile, int split, const Operand& A,
                             const Operand& B, Smem& sm, Finish finish) {
  namespace wmma = nvcuda::wmma;
  const int m0 = (tile / P.tiles_n()) * kTile, n0 = (tile % P.tiles_n()) * kTile;
  const int chunks = (P.K + kTile - 1) / kTile;
  const int c_begin = split * chunks / P.splits, c_end = (split + 1) * chunks / P.splits;
  const int k_end = min(P.K, c_end * kTile);
  const int count = c_end - c_begin;
  const auto load = [&](int c) {
    const int k0 = (c_begin + c) * kTile;
    float* as = sm.stages[c % kStages][0];
    float* bs = sm.stages[c % kStages][1];
    if (kARow)
      stage(as, A, m0, k0, P.M, k_end);
    else
      stage(as, A, k0, m0, k_end, P.M);
    if (kBRow)
      stage(bs, B, k0, n0, k_end, P.N);
    else
      stage(bs, B, n0, k0, P.N, k_end);
  };
  const int warp = threadIdx.x / 32, quarter = warp % 4, half = warp / 4;
  const int qm = (quarter / 2) * 16, qn = (quarter % 2) * 16;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  float sum[2][2] = {{0, 0}, {0, 0}};
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < count) load(c);
    commit();
  }
  for (int c = 0; c < count; ++c) {
    wait_copies<kStages - 2>();
    __syncthreads();
    if (c + kStages - 1 < count) load(c + kStages - 1);
    commit();
    const float* as = sm.stages[c % kStages][0];
    const float* bs = sm.stages[c % kStages][1];
    if constexpr (R == kNone) {
#pragma unroll 8
      for (int k = 0; k < kTile; ++k) {
        const float a0 = a_at<kARow>(as, 2 * ty, k), a1 = a_at<kARow>(as, 2 * ty + 1, k);
        const float b0 = b_at<kBRow>(bs, k, 2 * tx), b1 = b_at<kBRow>(bs, k, 2 * tx + 1);
        sum[0][0] = fmaf(a0, b0, sum[0][0]);
        sum[0][1] = fmaf(a0, b1, sum[0][1]);
        sum[1][0] = fmaf(a1, b0, sum[1][0]);
        sum[1][1] = fmaf(a1, b1, sum[1][1]);
      }
    } else {
      using ALayout = typename std::conditional<kARow, wmma::row_major, wmma::col_major>::type;
      using BLayout = typename std::conditional<kBRow, wmma::row_major, wmma::col_major>::type;
#pragma unroll
      for (int s = half * 2; s < half * 2 + 2; ++s) {
        wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, ALayout> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, BLayout> fb;
        wmma::load_matrix_sync(fa, kARow ? as + qm * kLd + s * 8 : as + s * 8 * kLd + qm, kLd);
        wmma::load_matrix_sync(fb, kBRow ? bs + s * 8 * kLd + qn : bs + qn * kLd + s * 8, kLd);
        for (int e = 0; e < fa.num_elements; ++e)
          fa.x[e] = R == kBf16 ? to_bf16(fa.x[e]) : to_tf32(fa.x[e]);
        for (int e = 0; e < fb.num_elements; ++e)
          fb.x[e] = R == kBf16 ? to_bf16(fb.x[e]) : to_tf32(fb.x[e]);
        wmma::mma_sync(acc, fa, fb, acc);
      }
    }
  }
  wait_copies<0>();
  __syncthreads();
  // This split's sums in stages[0][0] (tensor cores: the two k-halves in [0][0] and [0][1]).
  float* sums = sm.stages[0][0];
  if constexpr (R == kNone) {
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        sums[(2 * ty + i) * kLd + 2 * tx + j] = sum[i][j];
  } else {
    wmma::store_matrix_sync(sm.stages[0][half] + qm * kLd + qn, acc, kLd, wmma::mem_row_major);
  }
  __syncthreads();
  float* out = sm.stages[1][0];
  if (P.splits == 1) {
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, c = e % kTile;
      out[r * kLd + c] =
          R == kNone ? sums[r * kLd + c] : sums[r * kLd + c] + sm.stages[0][1][r * kLd + c];
    }
  } else {
    float* mine = P.scratch + (static_cast<size_t>(tile) * P.splits + split) * kTile * kTile;
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, c = e % kTile;
      mine[e] = R == kNone ? sums[r * kLd + c] : sums[r * kLd + c] + sm.stages[0][1][r * kLd + c];
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) sm.last = atomicAdd(&P.counters[tile], 1) == P.splits - 1;
    __syncthreads();
    if (!sm.last) return;
    __threadfence();
    // The splits' partials in split order; the loads of four splits in flight at once.
    const float* all = P.scratch + static_cast<size_t>(tile) * P.splits * kTile * kTile;
    float total[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      total[j] = __ldcg(all + threadIdx.x + j * kThreads);
#pragma unroll 4
    for (int s = 1; s < P.splits; ++s) {
      float part[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        part[j] = __ldcg(all + static_cast<size_t>(s) * kTile * kTile + threadIdx.x + j * kThreads);
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        total[j] += part[j];
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = threadIdx.x + j * kThreads;
      out[(e / kTile) * kLd + e % kTile] = total[j];
    }
    if (threadIdx.x == 0) P.counters[tile] = 0;  // every split has arrived: ready for the next step
  }
  __syncthreads();
  finish(m0, n0, out);
  __syncthreads();
}

// SGD with momentum and L2 weight decay, as sgd_kernel (cuda_kernels.cu), on the parameters
// i[j] where ok[j], with gradients g[j] (kLoad: read from the gradients first): every load
// issued before the first store, so that N parameters cost one round trip to memory.
template <int N, bool kLoad>
__device__ __forceinline__ void sgd(const Args& a, const OptStep& step, const size_t (&i)[N],
                                    float (&g)[N], const bool (&ok)[N]) {
  float p[N], m[N];
  const bool old = a.momentum != 0.0f && !step.first;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (kLoad) g[j] = ok[j] ? a.io.grads[i[j]] : 0.0f;
    p[j] = ok[j] ? a.io.params[i[j]] : 0.0f;
    m[j] = ok[j] && old ? a.io.momentum[i[j]] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (!ok[j]) continue;
    float d = g[j];
    if (a.weight_decay != 0.0f) d = d + a.weight_decay * p[j];
    if (a.momentum != 0.0f) {
      const float buf = old ? a.momentum * m[j] + d : d;
      a.io.momentum[i[j]] = buf;
      d = buf;
    }
    const float q = p[j] - step.lr * d;
    a.io.params[i[j]] = q;
    if (a.io.params16 != nullptr)
      static_cast<__nv_bfloat16*>(a.io.params16)[i[j]] = __float2bfloat16(q);
  }
}

template <int R>
__global__ void __launch_bounds__(kThreads) fused_step_kernel(Args a) {
  namespace cg = cooperative_groups;
  cg::grid_group grid = cg::this_grid();
  const int B = a.batch, L = a.layers;
  const size_t thread = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  const int lane = threadIdx.x % 32;
  const size_t warp = thread / 32, warps = threads / 32;
  __shared__ __align__(128) Smem sm;

  const int32_t* samples =
      a.io.indices + (a.io.counter != nullptr ? *a.io.counter * a.io.stride : 0);
  const OptStep step = a.io.steps[a.io.counter != nullptr ? *a.io.counter : 0];
  // Layer l's input as [batch][width] (the first layer's: the batch's rows of x).
  const auto input = [&](int l) {
    return l == 0 ? Operand{a.io.x, a.widths[0], samples} : Operand{a.act + a.at[l], a.widths[l]};
  };

  // --trace (ddp_fused_mlp_bench): each phase's start in block 0 and each block's end of it.
  const auto stamp = [&](size_t at) {
    if (a.trace == nullptr || threadIdx.x != 0) return;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    a.trace[at] = now;
  };
  const size_t ends = 2 * static_cast<size_t>(L);  // trace[ends + phase * grid + block]
  for (int phase = 0; phase < 2 * L; ++phase) {
    if (phase > 0) {
      stamp(ends + static_cast<size_t>(phase - 1) * gridDim.x + blockIdx.x);
      grid.sync();
    }
    if (blockIdx.x == 0) stamp(phase);
    const Product* ps = a.products[phase];
    const int n_products = phase >= L && ps[0].layer > 0 ? 2 : 1;
    int items = 0;
    for (int p = 0; p < n_products; ++p)
      items += ps[p].tiles() * ps[p].splits;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      int p = 0, rest = item;
      if (n_products == 2 && rest >= ps[0].tiles() * ps[0].splits)
        rest -= ps[0].tiles() * ps[0].splits, p = 1;
      const Product& P = ps[p];
      const int tile = rest / P.splits, split = rest % P.splits;
      const int l = P.layer, in = a.widths[l], out = a.widths[l + 1];
      const float* w = a.io.params + a.weight[l];
      const float* bias = a.io.params + a.bias[l];
      if (P.kind == kForward) {
        // act[l + 1] = relu(act[l] W^T + b): A = act[l] [b][in], B (k = in, n = out) = W [out][in].
        float* y = a.act + a.at[l + 1];
        product_tile<R, true, false>(
            P, tile, split, input(l), Operand{w, in}, sm, [&](int m0, int n0, const float* s) {
              // A thread's elements: column c, rows r + 8 j.
              const int c = threadIdx.x % kTile, r = threadIdx.x / kTile, n = n0 + c;
              if (n >= out) return;
              const float b = R == kBf16 ? to_bf16(bias[n]) : bias[n];
#pragma unroll
              for (int j = 0; j < kPer; ++j)
                if (m0 + r + 8 * j < B)
                  y[static_cast<size_t>(m0 + r + 8 * j) * out + n] =
                      stored<R>(fmaxf(s[(r + 8 * j) * kLd + c] + b, 0.0f));
            });
      } else if (P.kind == kForwardLoss) {
        // The logits (float32) and, one warp a sample, the softmax cross-entropy's gradient
        // (softmax - onehot) / batch; every class is in the tile (at most 32).
        float* g = a.grad + a.at[L];
        product_tile<R, true, false>(
            P, tile, split, input(l), Operand{w, in}, sm, [&](int m0, int, const float* s) {
              // A warp's rows: r + 8 j (their labels and the biases read first, at once).
              const int r0 = threadIdx.x / 32;
              const bool has = lane < out;
              const float b = has ? bias[lane] : 0.0f;
              int labels[kPer];
#pragma unroll
              for (int j = 0; j < kPer; ++j)
                labels[j] = m0 + r0 + 8 * j < B ? a.io.y[samples[m0 + r0 + 8 * j]] : 0;
#pragma unroll
              for (int j = 0; j < kPer; ++j) {
                const int r = r0 + 8 * j, m = m0 + r;
                if (m >= B) break;
                const float z = has ? s[r * kLd + lane] + b : -FLT_MAX;
                float best = z;
                int arg = has ? lane : INT32_MAX;
                for (int d = 16; d > 0; d /= 2) {
                  const float other = __shfl_xor_sync(0xffffffffu, best, d);
                  const int other_arg = __shfl_xor_sync(0xffffffffu, arg, d);
                  if (other > best || (other == best && other_arg < arg))
                    best = other, arg = other_arg;
                }
                float total = has ? expf(z - best) : 0.0f;
                for (int d = 16; d > 0; d /= 2)
                  total += __shfl_xor_sync(0xffffffffu, total, d);
                const int label = labels[j];
                const float zl = __shfl_sync(0xffffffffu, z, label);
                if (has)
                  g[static_cast<size_t>(m) * out + lane] = stored<R>(
                      (expf(z - best) / total - (lane == label ? 1.0f : 0.0f)) * a.grad_scale);
                if (lane == 0) {
                  atomicAdd(a.io.loss_sum, static_cast<double>(logf(total) - (zl - best)));
                  if (arg == label) atomicAdd(a.io.correct, 1);
                }
              }
            });
      } else if (P.kind == kWeightGrad) {
        // dW = G^T X: A (m = out, k = b) = G [b][out], B (k = b, n = in) = X [b][in]. The
        // first layer's weights are updated here (nothing else in this phase reads them).
        float* dw = a.io.grads + a.weight[l];
        const size_t base = a.weight[l];
        product_tile<R, false, true>(P, tile, split, Operand{a.grad + a.at[l + 1], out}, input(l),
                                     sm, [&](int m0, int n0, const float* s) {
                                       const int c = threadIdx.x % kTile, r = threadIdx.x / kTile;
                                       size_t i[kPer];
                                       float v[kPer];
                                       bool ok[kPer];
#pragma unroll
                                       for (int j = 0; j < kPer; ++j) {
                                         const int m = m0 + r + 8 * j, n = n0 + c;
                                         ok[j] = m < out && n < in;
                                         i[j] = base + static_cast<size_t>(m) * in + n;
                                         v[j] = s[(r + 8 * j) * kLd + c];
                                         if (ok[j]) dw[i[j] - base] = v[j];
                                       }
                                       if (l == 0) sgd<kPer, false>(a, step, i, v, ok);
                                     });
      } else {
        // The input gradient G W through the ReLU below: A = G [b][out], B (k = out, n = in) = W.
        const float* x = a.act + a.at[l];
        float* gx = a.grad + a.at[l];
        product_tile<R, true, true>(
            P, tile, split, Operand{a.grad + a.at[l + 1], out}, Operand{w, in}, sm,
            [&](int m0, int n0, const float* s) {
              const int c = threadIdx.x % kTile, r = threadIdx.x / kTile, n = n0 + c;
              if (n >= in) return;
              float below[kPer];
#pragma unroll
              for (int j = 0; j < kPer; ++j)
                below[j] =
                    m0 + r + 8 * j < B ? x[static_cast<size_t>(m0 + r + 8 * j) * in + n] : 0.0f;
#pragma unroll
              for (int j = 0; j < kPer; ++j)
                if (m0 + r + 8 * j < B)
                  gx[static_cast<size_t>(m0 + r + 8 * j) * in + n] =
                      below[j] > 0.0f ? stored<R>(s[(r + 8 * j) * kLd + c]) : 0.0f;
            });
      }
    }
    if (phase < L) continue;
    // Backward of layer l: its bias gradient (column sums of G, one warp a column, in a fixed
    // order) and bias update; the weights of the layer above, whose gradient the last phase made.
    const int l = ps[0].layer, out = a.widths[l + 1];
    const float* g = a.grad + a.at[l + 1];
    for (size_t o = warp; o < static_cast<size_t>(out); o += warps) {
      float total = 0;
#pragma unroll 4
      for (int b = lane; b < B; b += 32)
        total += g[static_cast<size_t>(b) * out + o];
      for (int d = 16; d > 0; d /= 2)
        total += __shfl_xor_sync(0xffffffffu, total, d);
      if (lane == 0) {
        size_t i[1] = {a.bias[l] + o};
        float v[1] = {total};
        bool ok[1] = {true};
        a.io.grads[i[0]] = total;
        sgd<1, false>(a, step, i, v, ok);
      }
    }
    if (l + 1 < L) {
      const size_t first = a.weight[l + 1];
      const size_t count = static_cast<size_t>(a.widths[l + 2]) * a.widths[l + 1];
      // Four parameters a thread at once, a warp's 128 in a row.
      for (size_t at = (thread / 32) * 32 * kPer + lane; at < count; at += threads * kPer) {
        size_t i[kPer];
        float v[kPer];
        bool ok[kPer];
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          ok[j] = at + 32 * j < count;
          i[j] = first + at + 32 * j;
        }
        sgd<kPer, true>(a, step, i, v, ok);
      }
    }
  }
  stamp(ends + static_cast<size_t>(2 * L - 1) * gridDim.x + blockIdx.x);
}

// The blocks' work in a phase dealt round-robin in product order (the products' tiles and
// splits), a split's cost its chunks plus, for the last to arrive, the sum of the partials (one
// chunk's time for every eight splits, rounded up): the busiest block's.
int busiest(const std::vector<Product>& products, int blocks) {
  std::vector<int> load(blocks, 0);
  int item = 0;
  for (const Product& p : products) {
    const int chunks = (p.K + kTile - 1) / kTile;
    for (int t = 0; t < p.tiles(); ++t)
      for (int s = 0; s < p.splits; ++s, ++item)
        load[item % blocks] += (s + 1) * chunks / p.splits - s * chunks / p.splits +
                               (p.splits > 1 ? 1 + p.splits / 8 : 0);
  }
  return *std::max_element(load.begin(), load.end());
}

// Splits along k for a phase's products while that shortens the busiest block's work, the
// product with the longest items first.
void plan_splits(std::vector<Product>& products, int blocks) {
  const auto longest_first = [](std::vector<Product>& ps) {
    std::stable_sort(ps.begin(), ps.end(), [](const Product& x, const Product& y) {
      return (x.K + kTile - 1) / kTile / x.splits > (y.K + kTile - 1) / kTile / y.splits;
    });
  };
  longest_first(products);
  for (;;) {
    int best = busiest(products, blocks);
    std::vector<Product> chosen;
    for (size_t p = 0; p < products.size(); ++p) {
      if (products[p].splits >= (products[p].K + kTile - 1) / kTile ||
          products[p].splits >= kMaxSplits)
        continue;
      std::vector<Product> trial = products;
      ++trial[p].splits;
      longest_first(trial);
      const int load = busiest(trial, blocks);
      if (load < best) best = load, chosen = trial;
    }
    if (chosen.empty()) return;
    products = chosen;
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
  else if (shape.num_classes() > kMaxClasses)
    reason = std::to_string(shape.num_classes()) + " classes (at most " +
             std::to_string(kMaxClasses) + ")";
  for (int w : shape.widths())
    if (reason.empty() && w > kMaxWidth)
      reason = "a width of " + std::to_string(w) + " (at most " + std::to_string(kMaxWidth) + ")";
  if (why != nullptr) *why = reason;
  return reason.empty();
}

// Everything a launch passes but the step's inputs and outputs.
struct FusedMlpStep::Plan {
  Args args;
  void (*kernel)(Args) = nullptr;
};

FusedMlpStep::FusedMlpStep(const MlpShape& shape, int batch, Precision precision,
                           const OptimizerConfig& optimizer, int blocks)
    : shape_(shape), batch_(batch), precision_(precision), optimizer_(optimizer) {
  std::string why;
  DDP_CHECK(fused_step_fits(shape, batch, optimizer, &why), "the fused step does not take {}", why);
  plan_ = std::make_unique<Plan>();
  Args& a = plan_->args;
  a.layers = shape.num_layers();
  a.batch = batch;
  // Each layer's activations from a 16-byte boundary, so that whole rows copy 16 bytes at once.
  size_t at = 0;
  for (int l = 0; l <= a.layers; ++l) {
    a.widths[l] = shape.widths()[l];
    a.at[l] = at;
    at += (static_cast<size_t>(batch) * a.widths[l] + 3) / 4 * 4;
  }
  for (int l = 0; l < a.layers; ++l) {
    a.weight[l] = shape.layer(l).weight_offset;
    a.bias[l] = shape.layer(l).bias_offset;
  }
  activations_ = DeviceBuffer<float>(at, MemoryCategory::kActivations);
  gradients_ = DeviceBuffer<float>(at, MemoryCategory::kActivations);
  a.act = activations_.data();
  a.grad = gradients_.data();
  a.momentum = optimizer.momentum;
  a.weight_decay = optimizer.weight_decay;
  a.grad_scale = 1.0f / static_cast<float>(batch);
  plan_->kernel = precision == Precision::kTf32   ? fused_step_kernel<kTf32>
                  : precision == Precision::kBf16 ? fused_step_kernel<kBf16>
                                                  : fused_step_kernel<kNone>;

  int device = 0, sms = 0, per_sm = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  DDP_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, plan_->kernel, kThreads, 0));
  DDP_CHECK(per_sm > 0, "the fused step's kernel fits no SM");
  DDP_CHECK(blocks >= 0 && blocks <= sms * per_sm,
            "the fused step's grid: {} blocks asked, this GPU holds at most {}", blocks,
            sms * per_sm);
  blocks_ = blocks > 0 ? blocks : sms * std::min(per_sm, 2);

  // The phases' products and their splits; scratch for the split products' partial sums.
  std::vector<std::vector<Product>> phases;
  const auto make = [&](int kind, int l, int m, int n, int k) {
    Product p;
    p.kind = kind, p.layer = l, p.M = m, p.N = n, p.K = k;
    return p;
  };
  for (int l = 0; l < a.layers; ++l)
    phases.push_back(
        {make(l + 1 < a.layers ? kForward : kForwardLoss, l, batch, a.widths[l + 1], a.widths[l])});
  for (int l = a.layers - 1; l >= 0; --l) {
    phases.push_back({make(kWeightGrad, l, a.widths[l + 1], a.widths[l], batch)});
    if (l > 0) phases.back().push_back(make(kInputGrad, l, batch, a.widths[l], a.widths[l + 1]));
  }
  size_t scratch = 0, counters = 0;
  for (auto& products : phases) {
    plan_splits(products, blocks_);
    for (const Product& p : products) {
      if (p.splits > 1) scratch += static_cast<size_t>(p.tiles()) * p.splits * kTile * kTile;
      counters += p.tiles();
    }
  }
  scratch_ = DeviceBuffer<float>(std::max<size_t>(scratch, 1), MemoryCategory::kActivations);
  counters_ = DeviceBuffer<int>(std::max<size_t>(counters, 1), MemoryCategory::kOther);
  DDP_CUDA_CHECK(cudaMemset(counters_.data(), 0, counters_.bytes()));
  scratch = counters = 0;
  for (size_t phase = 0; phase < phases.size(); ++phase)
    for (size_t p = 0; p < phases[phase].size(); ++p) {
      Product q = phases[phase][p];
      q.scratch = scratch_.data() + scratch;
      q.counters = counters_.data() + counters;
      if (q.splits > 1) scratch += static_cast<size_t>(q.tiles()) * q.splits * kTile * kTile;
      counters += q.tiles();
      a.products[phase][p] = q;
      splits_ = std::max(splits_, q.splits);
    }
}

FusedMlpStep::~FusedMlpStep() = default;

std::vector<int> FusedMlpStep::grids(Precision precision) {
  const auto kernel = precision == Precision::kTf32   ? fused_step_kernel<kTf32>
                      : precision == Precision::kBf16 ? fused_step_kernel<kBf16>
                                                      : fused_step_kernel<kNone>;
  int device = 0, sms = 0, per_sm = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  DDP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  std::vector<int> grids;
  for (int per = 1; per <= std::min(per_sm, 3); ++per)
    grids.push_back(per * sms);
  return grids;
}

void FusedMlpStep::run(const FusedStepIo& io, cudaStream_t stream) const {
  Args a = plan_->args;
  a.io = io;
  a.trace = trace_;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks_));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute cooperative = {};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  DDP_CUDA_CHECK(cudaLaunchKernelEx(&config, plan_->kernel, a));
}

}  // namespace ddp
