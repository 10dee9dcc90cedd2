// The MLP's weights as a safetensors file (runtime/safetensors.h: the format's reader and
// writer).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/mlp.h"
#include "runtime/safetensors.h"

namespace ddp {

// The MLP's tensors: layers.{i}.weight [out, in] and layers.{i}.bias [out], F32.
std::vector<TensorRef> mlp_tensor_refs(const MlpShape& shape, const float* params);
void save_mlp_weights(const std::string& path, const MlpShape& shape, const float* params);
// Fills params[shape.param_count()] from `path`; every tensor must be present with the
// exact shape and dtype F32, and no other layers.* tensor may be there.
void load_mlp_weights(const std::string& path, const MlpShape& shape, float* params);
// Copies the MLP's tensors out of an already-read file (same checks as load_mlp_weights).
void mlp_params_from(const SafetensorsFile& file, const std::string& path, const MlpShape& shape,
                     float* params);

}  // namespace ddp
