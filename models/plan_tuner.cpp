// The tuner: each candidate timed over 5 runs after 2 warm-up runs, with CUDA events.
#include "models/plan_tuner.h"

#include <fmt/format.h>

#include "models/autotune_cache.h"
#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"

namespace ddp {

namespace {

float time_ms(const std::function<void()>& work, cudaStream_t stream) {
  CudaEvent start(true), stop(true);
  for (int i = 0; i < 2; ++i)
    work();
  DDP_CUDA_CHECK(cudaEventRecord(start.get(), stream));
  constexpr int kRepeats = 5;
  for (int i = 0; i < kRepeats; ++i)
    work();
  DDP_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
  DDP_CUDA_CHECK(cudaEventSynchronize(stop.get()));
  float ms = 0;
  DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms / kRepeats;
}

std::string full_key(const std::string& key) {
  int device = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return fmt::format("{} sm_{}{} cublasLt {} | {}", prop.name, prop.major, prop.minor,
                     cublasLtGetVersion(), key);
}

// The plan that `pick` chooses for `product` (0: its own, k: alternative k - 1).
const std::unique_ptr<LtMatmul>& chosen(const TunableProduct& product, int pick) {
  return pick == 0 ? *product.plan : *product.alternatives[static_cast<size_t>(pick - 1)].plan;
}

// Applies cached choices (per product: which plan, and its candidate); false, changing
// nothing, when they do not fit these plans, or would drop a mask that a product reads.
bool apply(const std::vector<TunableProduct>& products, const std::vector<int>& choices) {
  if (choices.size() != 2 * products.size()) return false;
  for (size_t i = 0; i < products.size(); ++i) {
    const int pick = choices[2 * i];
    if (pick < 0 || static_cast<size_t>(pick) > products[i].alternatives.size()) return false;
    const auto& plan = chosen(products[i], pick);
    if (!plan || choices[2 * i + 1] < 0 ||
        static_cast<size_t>(choices[2 * i + 1]) >= plan->candidates())
      return false;
  }
  for (size_t i = 0; i < products.size(); ++i) {
    const int reader = products[i].mask_reader;
    if (choices[2 * i] == 0 || reader < 0) continue;
    if (static_cast<size_t>(reader) >= products.size() ||
        chosen(products[reader], choices[2 * reader])->epilogue() == CUBLASLT_EPILOGUE_DRELU)
      return false;
  }
  for (size_t i = 0; i < products.size(); ++i) {
    const int pick = choices[2 * i];
    if (pick != 0) std::swap(*products[i].plan, *products[i].alternatives[pick - 1].plan);
    (*products[i].plan)->select(static_cast<size_t>(choices[2 * i + 1]));
  }
  return true;
}

}  // namespace

TuneResult tune_products(const std::vector<TunableProduct>& products, const std::string& key,
                         const std::string& cache, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream) {
  TuneResult result;
  const std::string stored_key = full_key(key);
  if (const auto cached = load_autotune(cache, stored_key); cached && apply(products, *cached)) {
    result.cached = true;
    return result;
  }
  // Every candidate of a plan timed (with the kernel that completes it); the fastest kept.
  auto tune = [&](LtMatmul& plan, const std::function<void()>& extra) {
    size_t best = 0;
    float best_ms = 1e30f;
    for (size_t c = 0; c < plan.candidates(); ++c) {
      plan.select(c);
      const float ms = time_ms(
          [&] {
            plan.run(workspace, workspace_bytes, stream);
            if (extra) extra();
          },
          stream);
      if (ms < best_ms) best_ms = ms, best = c;
    }
    plan.select(best);
    return std::make_pair(best_ms, static_cast<int>(best));
  };
  std::vector<int> choices(2 * products.size(), 0);
  auto tune_product = [&](size_t i) {
    const TunableProduct& product = products[i];
    auto best = tune(**product.plan, nullptr);
    int pick = 0;
    const int reader = product.mask_reader;
    const bool mask_unread =
        reader < 0 || (*products[reader].plan)->epilogue() != CUBLASLT_EPILOGUE_DRELU;
    for (size_t k = 0; mask_unread && k < product.alternatives.size(); ++k) {
      const auto timed = tune(**product.alternatives[k].plan, product.alternatives[k].extra);
      if (timed.first < best.first) best = timed, pick = static_cast<int>(k) + 1;
    }
    if (pick != 0) std::swap(*product.plan, *product.alternatives[pick - 1].plan);
    choices[2 * i] = pick;
    choices[2 * i + 1] = best.second;
  };
  // The mask readers' choices first: they decide whether a mask may be dropped.
  for (size_t i = 0; i < products.size(); ++i)
    if (products[i].mask_reader < 0) tune_product(i);
  for (size_t i = 0; i < products.size(); ++i)
    if (products[i].mask_reader >= 0) tune_product(i);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
  result.save_error = save_autotune(cache, stored_key, choices);
  return result;
}

}  // namespace ddp
