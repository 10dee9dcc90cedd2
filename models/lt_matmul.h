// One cuBLASLt matrix product with its descriptors and candidate algorithms, chosen once
// for fixed shapes, types, epilogue and pointers (the plans of CudaStage).
// Only built with CUDA.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "models/precision.h"
#include "runtime/error.h"

namespace ddp {

// cublasGetStatusString lives in libcublas; cuBLASLt alone needs its own names.
const char* lt_status_name(cublasStatus_t status);

#define DDP_CUBLAS_CHECK(statement)                                            \
  do {                                                                         \
    const cublasStatus_t ddp_status_ = (statement);                            \
    DDP_CHECK(ddp_status_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt error {} in {}", \
              ::ddp::lt_status_name(ddp_status_), #statement);                 \
  } while (0)

inline int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

struct MatmulSpec {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  cudaDataType_t a_type = CUDA_R_32F, b_type = CUDA_R_32F, d_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  void* bias = nullptr;  // bias (forward) or bias gradient (BGRAD)
  void* aux = nullptr;
  int64_t aux_ld = 0;
  float beta = 0.0f;
  // The SMs the product may use (cuBLASLt's SM_COUNT_TARGET), so that a kernel on another
  // stream (the overlapped optimizer) runs beside it; 0: all.
  int sm_count = 0;
};

// Owns a cuBLASLt handle: created with the object, destroyed with it (after the plans made
// from it, when it is declared before them). Move-only.
class LtHandle {
 public:
  LtHandle() { DDP_CUBLAS_CHECK(cublasLtCreate(&handle_)); }
  ~LtHandle() {
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }
  LtHandle(LtHandle&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  LtHandle& operator=(LtHandle&&) = delete;
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  operator cublasLtHandle_t() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

// One matrix product with fixed pointers: descriptors and algorithm chosen once.
class LtMatmul {
 public:
  LtMatmul(cublasLtHandle_t handle, const MatmulSpec& spec, size_t workspace_bytes);
  ~LtMatmul() {
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (b_) cublasLtMatrixLayoutDestroy(b_);
    if (d_) cublasLtMatrixLayoutDestroy(d_);
    if (desc_) cublasLtMatmulDescDestroy(desc_);
  }
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  bool available() const { return available_; }
  cublasLtEpilogue_t epilogue() const { return spec_.epilogue; }
  // The heuristic's candidates, best first; run() uses the selected one (the first unless
  // autotuning chose another).
  size_t candidates() const { return algos_.size(); }
  void select(size_t index) { chosen_ = index; }

  void run(void* workspace, size_t workspace_bytes, cudaStream_t stream) const {
    const float alpha = 1.0f;
    DDP_CUBLAS_CHECK(cublasLtMatmul(handle_, desc_, &alpha, spec_.a, a_, spec_.b, b_, &spec_.beta,
                                    spec_.d, d_, spec_.d, d_, &algos_[chosen_], workspace,
                                    workspace_bytes, stream));
  }
  const MatmulSpec& spec() const { return spec_; }

 private:
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attribute, const T& value) {
    DDP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, attribute, &value, sizeof(value)));
  }

  cublasLtHandle_t handle_;
  MatmulSpec spec_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  static constexpr int kCandidates = 4;
  std::vector<cublasLtMatmulAlgo_t> algos_;
  size_t chosen_ = 0;
  bool available_ = false;
};

// What the products of `precision` read and compute in: bf16 or float32 activations; TF32
// tensor cores for tf32, float32 arithmetic otherwise.
struct ProductTypes {
  cudaDataType_t act = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};
inline ProductTypes product_types(Precision precision) {
  return {precision == Precision::kBf16 ? CUDA_R_16BF : CUDA_R_32F,
          precision == Precision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
}

// The three products of one Linear layer (weights [out, in] row-major, activations
// [batch, width]), as CudaStage builds them.
struct LinearProducts {
  int64_t in = 0, out = 0, batch = 0;
  cudaDataType_t act_type = CUDA_R_32F;  // activations and their gradients (bf16 or float32)
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  bool hidden = true;  // a ReLU follows (its output in act_type; else float32 logits)
  int sm_count = 0;    // MatmulSpec::sm_count of its products
};
// output = relu(weight x input + bias) (hidden; the ReLU mask into `aux`, its leading
// dimension aux_ld) or weight x input + bias (the last layer, float32).
MatmulSpec linear_forward_spec(const LinearProducts& p, const void* weight, const void* input,
                               void* output, void* bias, void* aux, int64_t aux_ld);
// grad_weight = grad_output^T x input and grad_bias = its column sums (BGRADB).
MatmulSpec linear_weight_grad_spec(const LinearProducts& p, const void* input,
                                   const void* grad_output, void* grad_weight, void* grad_bias);
// grad_input = weight^T x grad_output, with the layer below's ReLU derivative (DRELU, its
// mask `below_aux`) when `below_aux` is not null.
MatmulSpec linear_input_grad_spec(const LinearProducts& p, const void* weight,
                                  const void* grad_output, void* grad_input, void* below_aux,
                                  int64_t below_aux_ld);

// Builds the fused plan and, when cuBLASLt has no algorithm for it (or `fused` is false),
// the plain one with `plain_epilogue`; throws when neither has an algorithm.
std::unique_ptr<LtMatmul> make_plan(cublasLtHandle_t handle, MatmulSpec spec, size_t ws, bool fused,
                                    cublasLtEpilogue_t plain_epilogue);

}  // namespace ddp
