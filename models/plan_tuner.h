// Autotuning of a stage's cuBLASLt products (--autotune): every candidate algorithm of every
// product timed on the GPU, and where a product has a plain alternative (the product without
// its fused epilogue, plus the kernel that then does the epilogue's work), that one too; the
// fastest kept. The choices are kept between runs in the autotune cache (autotune_cache.h)
// under a key that names everything they depend on. Only built with CUDA.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/lt_matmul.h"

namespace ddp {

// One product autotuning may change: its plan and, where there is one, the alternative with
// the kernel that completes it. Choosing the alternative swaps the two plans.
struct TunableProduct {
  std::unique_ptr<LtMatmul>* plan = nullptr;
  std::unique_ptr<LtMatmul>* plain = nullptr;  // null: no alternative
  std::function<void()> plain_extra;           // after the plain product
};

struct TuneResult {
  bool cached = false;     // the choices came from the cache
  std::string save_error;  // why they could not be stored there (empty: stored, or cached)
};

// Tunes `products` (real values in every buffer they read: the caller fills them) with
// `workspace` on `stream`; `key` names the products and their options (the GPU and
// cuBLASLt's version are added here); `cache` is the file (empty: not kept).
TuneResult tune_products(const std::vector<TunableProduct>& products, const std::string& key,
                         const std::string& cache, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);

}  // namespace ddp
