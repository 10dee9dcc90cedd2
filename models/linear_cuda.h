// One Linear layer of a GPU stage (CudaStage), a ReLU after it unless it is the model's last:
// its slice of the stage's flat parameters, its outputs (and ReLU masks) for each slot, and
// per slot and batch size the cuBLASLt plans of its three products: the forward with bias
// (and ReLU with its mask as the aux output) fused into the epilogue, the weight gradient
// with the bias gradient (BGRADB), the input gradient with the ReLU derivative of the layer
// below (DRELU, from that layer's mask). forward, backward_weight and backward_input are
// separate calls, so that a stage runs backward whole or in its two halves. What a new layer
// type on the GPU is: a class like this one, and its line where CudaStage lists its layers.
// Only built with CUDA. Every call is on the stage's stream unless stated.
#pragma once

#include <cublasLt.h>

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "models/device_parameters.h"
#include "models/lt_matmul.h"
#include "models/mlp.h"
#include "models/plan_tuner.h"
#include "models/precision.h"
#include "runtime/device_buffer.h"

namespace ddp {

// What every layer of a stage shares.
struct CudaLayerContext {
  cublasLtHandle_t lt = nullptr;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  DeviceParameters* weights = nullptr;  // the stage's flat buffers
  size_t base = 0;                      // the stage's first parameter in the model's layout
  Precision precision = Precision::kFp32;
  bool fused = true;  // cuBLASLt's fused epilogues (else plain products + our kernels)
  bool sync_debug = false;
  int product_sms = 0;  // MatmulSpec::sm_count of every product (0: all SMs)
};

class CudaLinear {
 public:
  // Layer `index` of the model, `slice`; `hidden`: a ReLU follows (its output in the
  // activation type, else float32 logits); outputs for `slots` micro-batches of at most
  // max_batch samples. `one_output`: every slot's plans write one output (and ReLU mask),
  // the working set of --recompute, valid for the slot forwarded last.
  CudaLinear(int index, const LayerSlice& slice, bool hidden, int slots, int max_batch,
             const CudaLayerContext& context, bool one_output = false);

  // Where a slot's tensors that the layer does not own are (fixed for the stage's life).
  struct Wiring {
    const void* input = nullptr;  // [batch, in] in the activation type
    void* grad_output = nullptr;  // w.r.t. its pre-activation: masked by the layer above
    void* grad_input = nullptr;   // its input gradient (null: the model's first layer)
    // The layer below in this stage, whose ReLU derivative backward_input applies to
    // grad_input (fused where its forward kept the mask); null: grad_input is sent as is.
    const CudaLinear* below = nullptr;
    bool keep_mask = true;  // forward keeps the ReLU mask (for the layer above's DRELU)
  };
  void wire(int slot, const Wiring& wiring) { wiring_.at(slot) = wiring; }

  const LayerSlice& slice() const { return slice_; }
  bool hidden() const { return hidden_; }
  void* output(int slot) const { return outputs_[buffer(slot)].data(); }
  // init_params(shape, seed)'s values of this layer (bitwise the host's), made on the device.
  void init_on_device(uint64_t seed) const;

  // The plans of slot `slot` at `batch` (once; below's first); `alternatives`: also the
  // products without their fused epilogues, for autotuning.
  void build(int slot, int batch, bool alternatives);
  bool built(int slot, int batch) const { return plans_.count({slot, batch}) > 0; }
  // Every plan dropped (the parameters moved: placed layers' slots); built again on use.
  void clear_plans() { plans_.clear(); }
  void forward(int slot, int batch) const;
  // Where products run: a stream and a cuBLASLt workspace of its own.
  struct Lane {
    cudaStream_t stream = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
  };
  // Weight and bias gradients over (or, with `accumulate`, added to) the stage's gradients,
  // on `lane` (null: the stage's stream and workspace); a bias gradient not fused into the
  // product on `bias_lane` (null: `lane`).
  void backward_weight(int slot, int batch, bool accumulate, const Lane* lane = nullptr,
                       const Lane* bias_lane = nullptr) const;
  // The input gradient, with the layer below's ReLU derivative.
  void backward_input(int slot, int batch) const;

  // Autotuning's products of slot `slot` at `batch` (built with alternatives).
  void tunables(int slot, int batch, std::vector<TunableProduct>* products);
  // Its products at (slot, batch) and how many use fused epilogues.
  void count_fused(int slot, int batch, int* fused, int* total) const;
  // Its outputs of every slot set to `value`.
  void fill(float value) const;

 private:
  struct Plans {
    std::unique_ptr<LtMatmul> forward, dw, dw_accumulate, dx;
    // Autotune's alternatives: the products without their fused bias gradient or ReLU
    // derivative, and the forward keeping no ReLU mask (ReLU in the epilogue, or bias alone
    // and ReLU in our kernel).
    std::unique_ptr<LtMatmul> dw_plain, dx_plain, forward_no_mask, forward_bias;
  };
  const Plans& plans(int slot, int batch) const { return plans_.at({slot, batch}); }
  bool keeps_mask(int slot, int batch) const;
  void after(const char* op, cudaStream_t stream = nullptr) const;  // null: the stage's
  void relu_in_place(int slot, int batch) const;
  bool bf16() const { return context_.precision == Precision::kBf16; }
  float* grad_bias() const;
  size_t buffer(int slot) const { return outputs_.size() == 1 ? 0 : static_cast<size_t>(slot); }
  void* mask(int slot) const { return masks_[buffer(slot)].data(); }

  int index_;
  LayerSlice slice_;
  bool hidden_;
  CudaLayerContext context_;
  int64_t mask_ld_;
  std::vector<DeviceBuffer<char>> outputs_, masks_;  // by slot, or one for every slot
  std::vector<Wiring> wiring_;                       // by slot
  std::map<std::pair<int, int>, Plans> plans_;       // by (slot, batch)
  int forward_tunable_ = -1;  // the forward's index in the list tunables() last filled
};

}  // namespace ddp
