// Helpers for tests that compare trained weights: reading an MLP's safetensors file and
// the largest element-wise difference relative to the largest magnitude.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "models/mlp.h"
#include "models/safetensors.h"
#include "tests/support/margins.h"

namespace ddp {

inline std::vector<float> load_weights(const std::string& path, const std::string& layers) {
  const MlpShape shape = parse_layers(layers);
  std::vector<float> params(shape.param_count());
  load_mlp_weights(path, shape, params.data());
  return params;
}

// max |a - b| / max |b|.
inline double max_relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, double(std::fabs(b[i])));
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
  }
  return reported_error(diff / scale);
}

}  // namespace ddp
