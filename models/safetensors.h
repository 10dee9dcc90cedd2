// Safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length, a JSON header naming each tensor's dtype, shape and byte range, then the
// data. Readable by PyTorch (safetensors.torch.load_file) and Hugging Face tools.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "models/mlp.h"

namespace ddp {

struct TensorRef {  // a tensor to write, not owned
  std::string name;
  std::string dtype;  // "F32", "I64", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

struct Tensor {  // a tensor read from a file
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<char> data;
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Writes to `path` + ".tmp", flushes, then renames over `path`, so that a crash never
// leaves a half-written file under the final name.
void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads and validates the whole file; throws UsageError naming the file and the problem.
// `metadata_only`: reads the header alone and returns its metadata (no tensors).
SafetensorsFile read_safetensors(const std::string& path, bool metadata_only = false);

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
