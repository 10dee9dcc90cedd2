// CudaLinear's products (row-major tensors read by cuBLASLt as column-major transposes):
// with Y[B,out], X[B,in], W[out,in] (all row-major):
//   forward  Y^T[out,B]  = W^T'[in,out]^T * X^T[in,B]           (A = W, transposed)
//   dW       dW^T[in,out] = X^T[in,B] * (dZ^T[out,B])^T          (bias grad: BGRADB over B)
//   dX       dX^T[in,B]  = W^T'[in,out] * dZ^T[out,B]            (DRELU with the layer below's
//   mask)
#include "models/linear_cuda.h"

#include <cmath>

#include "models/cuda_kernels.h"
#include "models/rng.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

CudaLinear::CudaLinear(int index, const LayerSlice& slice, bool hidden, int slots, int max_batch,
                       const CudaLayerContext& context, bool one_output)
    : index_(index),
      slice_(slice),
      hidden_(hidden),
      context_(context),
      mask_ld_(round_up(slice.out, 128)),
      wiring_(slots) {
  const size_t rows = static_cast<size_t>(max_batch);
  const size_t act_bytes = bf16() ? 2 : 4;
  for (int s = 0; s < (one_output ? 1 : slots); ++s) {
    outputs_.emplace_back(rows * slice.out * (hidden ? act_bytes : 4),
                          MemoryCategory::kActivations);
    masks_.emplace_back(hidden ? static_cast<size_t>(mask_ld_ / 8) * rows : 0,
                        MemoryCategory::kActivations);
  }
}

void CudaLinear::after(const char* op, cudaStream_t stream) const {
  if (!context_.sync_debug) return;
  const cudaError_t error = cudaStreamSynchronize(stream ? stream : context_.stream);
  DDP_CHECK(error == cudaSuccess, "--sync-debug: {} failed: {} ({})", op, cudaGetErrorName(error),
            cudaGetErrorString(error));
}

void CudaLinear::init_on_device(uint64_t seed) const {
  const uint64_t key = mix_seed(seed, static_cast<uint64_t>(index_));  // as init_params
  const float bound = 1.0f / std::sqrt(static_cast<float>(slice_.in));
  const size_t weights = static_cast<size_t>(slice_.in) * slice_.out;
  const DeviceParameters& p = *context_.weights;
  launch_counter_uniform(p.param_at(slice_.weight_offset - context_.base), weights, key, 0, -bound,
                         bound, context_.stream);
  launch_counter_uniform(p.param_at(slice_.bias_offset - context_.base), slice_.out, key, weights,
                         -bound, bound, context_.stream);
}

float* CudaLinear::grad_bias() const {
  return context_.weights->grad_at(slice_.bias_offset - context_.base);
}

bool CudaLinear::keeps_mask(int slot, int batch) const {
  return plans(slot, batch).forward->epilogue() == CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
}

void CudaLinear::build(int slot, int batch, bool alternatives) {
  if (built(slot, batch)) return;
  const Wiring& io = wiring_.at(slot);
  DDP_CHECK(io.input != nullptr && io.grad_output != nullptr,
            "the {}x{} layer's slot {} is not wired", slice_.in, slice_.out, slot);
  DeviceParameters& weights = *context_.weights;
  const ProductTypes types = product_types(context_.precision);
  const size_t ws = context_.workspace_bytes;
  const bool fused = context_.fused;
  const size_t base = context_.base;
  auto alternative = [&](const MatmulSpec& spec) {
    return alternatives ? make_plan(context_.lt, spec, ws, false, CUBLASLT_EPILOGUE_DEFAULT)
                        : nullptr;
  };
  void* weight = weights.for_products(slice_.weight_offset - base);
  const LinearProducts p{slice_.in, slice_.out,          batch, types.act, types.compute,
                         hidden_,   context_.product_sms};
  Plans plans;
  const MatmulSpec f =
      linear_forward_spec(p, weight, io.input, output(slot),
                          hidden_ ? weights.for_products(slice_.bias_offset - base)
                                  : static_cast<void*>(weights.param_at(slice_.bias_offset - base)),
                          hidden_ ? mask(slot) : nullptr, mask_ld_);
  plans.forward = make_plan(context_.lt, f, ws, hidden_ && fused && io.keep_mask,
                            hidden_ ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS);
  if (alternatives && plans.forward->epilogue() == CUBLASLT_EPILOGUE_RELU_AUX_BIAS) {
    // Where the layer above takes the plain input gradient, the mask is written for nothing.
    plans.forward_no_mask = make_plan(context_.lt, f, ws, false, CUBLASLT_EPILOGUE_RELU_BIAS);
    plans.forward_bias = make_plan(context_.lt, f, ws, false, CUBLASLT_EPILOGUE_BIAS);
  }

  const MatmulSpec w = linear_weight_grad_spec(
      p, io.input, io.grad_output, weights.grad_at(slice_.weight_offset - base), grad_bias());
  plans.dw = make_plan(context_.lt, w, ws, fused, CUBLASLT_EPILOGUE_DEFAULT);
  plans.dw_plain = alternative(w);
  // Accumulation adds the product (beta = 1); the bias gradient is then our kernel's.
  MatmulSpec wa = w;
  wa.beta = 1.0f;
  plans.dw_accumulate = make_plan(context_.lt, wa, ws, false, CUBLASLT_EPILOGUE_DEFAULT);

  if (io.grad_input != nullptr) {
    if (io.below != nullptr) {
      // The layer below's ReLU derivative, fused when its forward wrote the mask.
      const bool below_has_mask = io.below->keeps_mask(slot, batch);
      const MatmulSpec x = linear_input_grad_spec(p, weight, io.grad_output, io.grad_input,
                                                  io.below->mask(slot), io.below->mask_ld_);
      plans.dx = make_plan(context_.lt, x, ws, fused && below_has_mask, CUBLASLT_EPILOGUE_DEFAULT);
      plans.dx_plain = alternative(x);
    } else {
      // For the previous stage, which masks it.
      const MatmulSpec x =
          linear_input_grad_spec(p, weight, io.grad_output, io.grad_input, nullptr, 0);
      plans.dx = make_plan(context_.lt, x, ws, false, CUBLASLT_EPILOGUE_DEFAULT);
    }
  }
  plans_.emplace(std::make_pair(slot, batch), std::move(plans));
}

void CudaLinear::forward(int slot, int batch) const {
  const LtMatmul& f = *plans(slot, batch).forward;
  f.run(context_.workspace, context_.workspace_bytes, context_.stream);
  after("forward matmul");
  if (hidden_ && f.epilogue() == CUBLASLT_EPILOGUE_BIAS) relu_in_place(slot, batch);
}

void CudaLinear::relu_in_place(int slot, int batch) const {
  // The mask kernel on the output itself: every value not above zero becomes zero.
  launch_relu_mask(output(slot), output(slot), static_cast<size_t>(batch) * slice_.out, bf16(),
                   context_.stream);
  after("ReLU");
}

void CudaLinear::backward_weight(int slot, int batch, bool accumulate, const Lane* lane,
                                 const Lane* bias_lane) const {
  const Lane on =
      lane ? *lane : Lane{context_.stream, context_.workspace, context_.workspace_bytes};
  const cudaStream_t bias_on = bias_lane ? bias_lane->stream : on.stream;
  const Plans& p = plans(slot, batch);
  const LtMatmul& dw = accumulate ? *p.dw_accumulate : *p.dw;
  const bool bias_kernel = dw.epilogue() != CUBLASLT_EPILOGUE_BGRADB;
  auto bias_gradient = [&] {
    launch_bias_grad(wiring_[slot].grad_output, batch, slice_.out, bf16(), grad_bias(), accumulate,
                     bias_on);
    after("bias gradient", bias_on);
  };
  // On a stream of its own the bias gradient goes first, to run beside the product.
  if (bias_kernel && bias_on != on.stream) bias_gradient();
  dw.run(on.workspace, on.workspace_bytes, on.stream);
  after("weight-gradient matmul", on.stream);
  if (bias_kernel && bias_on == on.stream) bias_gradient();
}

void CudaLinear::backward_input(int slot, int batch) const {
  const Plans& p = plans(slot, batch);
  if (!p.dx) return;
  p.dx->run(context_.workspace, context_.workspace_bytes, context_.stream);
  after("input-gradient matmul");
  const Wiring& io = wiring_[slot];
  if (io.below != nullptr && p.dx->epilogue() != CUBLASLT_EPILOGUE_DRELU) {
    launch_relu_mask(io.grad_input, io.below->output(slot),
                     static_cast<size_t>(batch) * io.below->slice_.out, bf16(), context_.stream);
    after("ReLU mask");
  }
}

void CudaLinear::tunables(int slot, int batch, std::vector<TunableProduct>* products) {
  Plans& p = plans_.at({slot, batch});
  const Wiring io = wiring_[slot];
  // Forward: ReLU with its mask in the epilogue, against no mask (where the layer above does
  // not read it): ReLU in the epilogue, or the bias alone and our ReLU after.
  forward_tunable_ = static_cast<int>(products->size());
  TunableProduct forward{&p.forward, {}, -1};
  if (p.forward_no_mask) forward.alternatives.push_back({&p.forward_no_mask, nullptr});
  if (p.forward_bias)
    forward.alternatives.push_back(
        {&p.forward_bias, [this, slot, batch] { relu_in_place(slot, batch); }});
  products->push_back(std::move(forward));
  // Weight gradient: the fused bias gradient (BGRADB) against the plain product + our kernel.
  TunableProduct dw{&p.dw, {}, -1};
  if (p.dw->epilogue() == CUBLASLT_EPILOGUE_BGRADB && p.dw_plain)
    dw.alternatives.push_back({&p.dw_plain, [this, io, batch] {
                                 launch_bias_grad(io.grad_output, batch, slice_.out, bf16(),
                                                  grad_bias(), false, context_.stream);
                               }});
  products->push_back(std::move(dw));
  if (!p.dx) return;
  // Input gradient: the fused ReLU derivative (DRELU) against the plain product + our mask.
  TunableProduct dx{&p.dx, {}, -1};
  if (p.dx->epilogue() == CUBLASLT_EPILOGUE_DRELU && p.dx_plain)
    dx.alternatives.push_back({&p.dx_plain, [this, io, slot, batch] {
                                 launch_relu_mask(io.grad_input, io.below->output(slot),
                                                  static_cast<size_t>(batch) * io.below->slice_.out,
                                                  bf16(), context_.stream);
                               }});
  // The layer below's forward may drop its mask only where this product does not read it.
  if (io.below != nullptr && io.below->forward_tunable_ >= 0 &&
      static_cast<size_t>(io.below->forward_tunable_) < products->size())
    (*products)[static_cast<size_t>(io.below->forward_tunable_)].mask_reader =
        static_cast<int>(products->size());
  products->push_back(std::move(dx));
}

void CudaLinear::count_fused(int slot, int batch, int* fused, int* total) const {
  const Plans& p = plans(slot, batch);
  for (const auto* plan : {&p.forward, &p.dw, &p.dx}) {
    if (!*plan) continue;
    ++*total;
    const auto e = (*plan)->epilogue();
    // A hidden layer's forward with the bias alone has its ReLU in our kernel.
    *fused += e == CUBLASLT_EPILOGUE_RELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_BGRADB ||
              e == CUBLASLT_EPILOGUE_DRELU || e == CUBLASLT_EPILOGUE_RELU_BIAS ||
              (e == CUBLASLT_EPILOGUE_BIAS && !hidden_);
  }
}

void CudaLinear::fill(float value) const {
  const bool low = hidden_ && bf16();  // the logits are float32
  for (const auto& out : outputs_)
    launch_fill(out.data(), out.bytes() / (low ? 2 : 4), low, value, context_.stream);
}

}  // namespace ddp
