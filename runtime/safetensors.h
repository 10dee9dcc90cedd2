// Safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length, a JSON header naming each tensor's dtype, shape and byte range, then the
// data. Readable by PyTorch (safetensors.torch.load_file) and Hugging Face tools. The MLP's
// weights in this format: models/safetensors.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

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

// Where a tensor lies in a safetensors file: its dtype, shape and absolute byte range.
struct TensorPlace {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // bytes from the file's start
};

// The header alone (validated as read_safetensors does): each tensor's place, so that a reader
// takes only the bytes it needs (read_file_range).
std::map<std::string, TensorPlace> read_safetensors_places(const std::string& path);

// `bytes` bytes of `path` from `offset` into `out`; UsageError naming the file where it is
// shorter or unreadable.
void read_file_range(const std::string& path, uint64_t offset, uint64_t bytes, void* out);

// The bytes of one element of a safetensors dtype ("F32": 4), 0 for an unknown one.
size_t safetensors_dtype_bytes(const std::string& dtype);

// A shape as messages write it: "[2, 3]".
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace ddp
