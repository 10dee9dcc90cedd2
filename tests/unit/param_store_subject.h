// The three parameter stores' common test subject (test_param_stores.cpp): the same two layers
// (6 and 2 float32 parameters, a Linear(3, 2)'s weight and bias), a bucket a layer, over a
// group of one rank. LibTorch's subject is compiled apart (test_param_stores_torch.cpp), so that
// LibTorch's headers (a wheel's bundled fmt) never meet spdlog's in one translation unit.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "dist/buckets.h"
#include "dist/param_store.h"
#include "dist/sharded_state.h"
#include "runtime/process_env.h"

namespace ddp {
namespace store_test {

constexpr size_t kCount = 8;
inline const std::vector<ParamSpan> kLayers = {{0, 6}, {6, 2}};

inline std::vector<float> counting(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = from + static_cast<float>(i);
  return v;
}

// A bucket a layer, the last first.
inline BucketPlan two_buckets() {
  return {{{6, 2, 1, 1}, {0, 6, 0, 0}}, 2, true};
}

inline std::unique_ptr<Communicator> one_rank(bool gpu) {
  ProcessEnv env;
  CommConfig config;
  config.gpu = gpu;
  return make_communicator(config, env, nullptr);
}

// A store sharded at a level: its sharded state, its memory, and the parameters as its model
// reads them now (the flat layout).
class Subject {
 public:
  virtual ~Subject() = default;
  virtual ShardedState& state() = 0;
  virtual ParamStore& store() = 0;
  virtual std::vector<float> model_reads() = 0;
};

// LibTorch's TorchParams over a Linear(3, 2) at `level` (test_param_stores_torch.cpp).
std::unique_ptr<Subject> make_torch_subject(int level);

}  // namespace store_test
}  // namespace ddp
