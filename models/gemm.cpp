// gemm_cpu through CBLAS, or through loops ordered so that the compiler vectorises them.
#include "models/gemm.h"

#include <vector>

#if DDP_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace ddp {

#if DDP_HAVE_OPENBLAS

void gemm_cpu(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void set_cpu_threads(int threads) {
  if (threads > 0) openblas_set_num_threads(threads);
}

const char* cpu_blas_name() {
  return "openblas";
}

#else

void gemm_cpu(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc) {
  // Materialise op(B) as [k, n] row-major so the inner loop runs over contiguous memory.
  std::vector<float> b_kn(static_cast<size_t>(k) * n);
  for (int p = 0; p < k; ++p)
    for (int j = 0; j < n; ++j)
      b_kn[static_cast<size_t>(p) * n + j] =
          trans_b ? b[static_cast<size_t>(j) * ldb + p] : b[static_cast<size_t>(p) * ldb + j];
  std::vector<float> row(n);
  for (int i = 0; i < m; ++i) {
    std::fill(row.begin(), row.end(), 0.0f);
    for (int p = 0; p < k; ++p) {
      const float a_ip =
          trans_a ? a[static_cast<size_t>(p) * lda + i] : a[static_cast<size_t>(i) * lda + p];
      const float* b_row = &b_kn[static_cast<size_t>(p) * n];
      for (int j = 0; j < n; ++j)
        row[j] += a_ip * b_row[j];
    }
    float* c_row = c + static_cast<size_t>(i) * ldc;
    for (int j = 0; j < n; ++j)
      c_row[j] = alpha * row[j] + (beta == 0.0f ? 0.0f : beta * c_row[j]);
  }
}

void set_cpu_threads(int) {}

const char* cpu_blas_name() {
  return "loops (no BLAS)";
}

#endif

}  // namespace ddp
