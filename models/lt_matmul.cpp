// LtMatmul: descriptors, layouts and the heuristic's candidates for one product.
#include "models/lt_matmul.h"

namespace ddp {

const char* lt_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS_?";
  }
}

namespace {

uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0)
    align /= 2;
  return align;
}

}  // namespace

LtMatmul::LtMatmul(cublasLtHandle_t handle, const MatmulSpec& spec, size_t workspace_bytes)
    : handle_(handle), spec_(spec) {
  DDP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, spec.compute, CUDA_R_32F));
  const cublasOperation_t ta = spec.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = spec.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set(CUBLASLT_MATMUL_DESC_TRANSB, tb);
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, spec.epilogue);
  if (spec.sm_count > 0) set(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, int32_t{spec.sm_count});
  if (spec.bias != nullptr) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, spec.bias);
  if (spec.aux != nullptr) {
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, spec.aux);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, spec.aux_ld);
  }
  const int64_t a_rows = spec.trans_a ? spec.k : spec.m, a_cols = spec.trans_a ? spec.m : spec.k;
  const int64_t b_rows = spec.trans_b ? spec.n : spec.k, b_cols = spec.trans_b ? spec.k : spec.n;
  DDP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, spec.a_type, a_rows, a_cols, spec.lda));
  DDP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, spec.b_type, b_rows, b_cols, spec.ldb));
  DDP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_, spec.d_type, spec.m, spec.n, spec.ldd));
  cublasLtMatmulPreference_t pref = nullptr;
  DDP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  const uint32_t align_a = alignment_of(spec.a), align_b = alignment_of(spec.b),
                 align_d = alignment_of(spec.d);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                       sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                       sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                       sizeof(align_d));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                       sizeof(align_d));
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_, b_, d_, d_, pref,
                                                               kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  available_ = status == CUBLAS_STATUS_SUCCESS && found > 0;
  for (int i = 0; available_ && i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algos_.push_back(results[i].algo);
  available_ = !algos_.empty();
}

std::unique_ptr<LtMatmul> make_plan(cublasLtHandle_t handle, MatmulSpec spec, size_t ws, bool fused,
                                    cublasLtEpilogue_t plain_epilogue) {
  if (fused) {
    auto plan = std::make_unique<LtMatmul>(handle, spec, ws);
    if (plan->available()) return plan;
  }
  spec.epilogue = plain_epilogue;
  if (plain_epilogue == CUBLASLT_EPILOGUE_DEFAULT) spec.bias = nullptr;
  spec.aux = nullptr;
  auto plan = std::make_unique<LtMatmul>(handle, spec, ws);
  DDP_CHECK(plan->available(), "cuBLASLt has no algorithm for a {}x{}x{} product", spec.m, spec.n,
            spec.k);
  return plan;
}

MatmulSpec linear_forward_spec(const LinearProducts& p, const void* weight, const void* input,
                               void* output, void* bias, void* aux, int64_t aux_ld) {
  MatmulSpec f;
  f.trans_a = true;
  f.m = p.out, f.n = p.batch, f.k = p.in;
  f.lda = p.in, f.ldb = p.in, f.ldd = p.out;
  f.a_type = p.act_type, f.b_type = p.act_type, f.d_type = p.hidden ? p.act_type : CUDA_R_32F;
  f.compute = p.compute;
  f.a = weight, f.b = input, f.d = output;
  f.bias = bias;
  f.epilogue = p.hidden ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
  f.aux = p.hidden ? aux : nullptr;
  f.aux_ld = aux_ld;
  f.sm_count = p.sm_count;
  return f;
}

MatmulSpec linear_weight_grad_spec(const LinearProducts& p, const void* input,
                                   const void* grad_output, void* grad_weight, void* grad_bias) {
  MatmulSpec w;
  w.trans_b = true;
  w.m = p.in, w.n = p.out, w.k = p.batch;
  w.lda = p.in, w.ldb = p.out, w.ldd = p.in;
  w.a_type = p.act_type, w.b_type = p.act_type, w.d_type = CUDA_R_32F;
  w.compute = p.compute;
  w.a = input, w.b = grad_output, w.d = grad_weight;
  w.bias = grad_bias;
  w.epilogue = CUBLASLT_EPILOGUE_BGRADB;
  w.sm_count = p.sm_count;
  return w;
}

MatmulSpec linear_input_grad_spec(const LinearProducts& p, const void* weight,
                                  const void* grad_output, void* grad_input, void* below_aux,
                                  int64_t below_aux_ld) {
  MatmulSpec x;
  x.m = p.in, x.n = p.batch, x.k = p.out;
  x.lda = p.in, x.ldb = p.out, x.ldd = p.in;
  x.a_type = p.act_type, x.b_type = p.act_type, x.d_type = p.act_type;
  x.compute = p.compute;
  x.a = weight, x.b = grad_output, x.d = grad_input;
  if (below_aux != nullptr) {
    x.epilogue = CUBLASLT_EPILOGUE_DRELU;
    x.aux = below_aux;
    x.aux_ld = below_aux_ld;
  }
  x.sm_count = p.sm_count;
  return x;
}

}  // namespace ddp
