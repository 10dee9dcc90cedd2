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

// Another way to compute a product: its plan, and the kernel run after it (none: the plan
// does it all).
struct ProductAlternative {
  std::unique_ptr<LtMatmul>* plan = nullptr;
  std::function<void()> extra;
};

// One product autotuning may change: its plan and the alternatives (the product without its
// fused epilogue, plus the kernel that then does the epilogue's work). Choosing alternative k
// swaps the plan with alternatives[k]'s.
struct TunableProduct {
  std::unique_ptr<LtMatmul>* plan = nullptr;
  std::vector<ProductAlternative> alternatives;
  // The product (an index into the tuned list) that may read this one's ReLU mask through
  // CUBLASLT_EPILOGUE_DRELU, or -1. This product's alternatives keep no mask: they are tried
  // only where that product, as tuned, reads none, and tuned after it.
  int mask_reader = -1;
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
