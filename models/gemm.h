// CPU matrix products: OpenBLAS's CBLAS when it was found at configure time, else a plain
// loop implementation (correct, slow; reported by CMake and `ddptrain --version`).
#pragma once

namespace ddp {

// C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, all row-major; op(X) is X or X^T.
// lda, ldb, ldc are the row strides in elements of A, B, C as stored.
void gemm_cpu(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc);

// Threads used by CPU matrix products (0: the library's default).
void set_cpu_threads(int threads);

// "openblas <version>" or "loops (no BLAS)".
const char* cpu_blas_name();

}  // namespace ddp
