// Safetensors reader and writer on top of nlohmann::json.
#include "runtime/safetensors.h"

#include <sys/stat.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace ddp {
namespace {

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16") return 2;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  return 0;
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const TensorRef& t : tensors) {
    const size_t item = dtype_bytes(t.dtype);
    DDP_CHECK(item != 0, "unknown safetensors dtype {}", t.dtype);
    size_t count = 1;
    for (int64_t d : t.shape)
      count *= static_cast<size_t>(d);
    DDP_CHECK(count * item == t.bytes, "tensor {}: shape {} needs {} bytes, given {}", t.name,
              shape_text(t.shape), count * item, t.bytes);
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0)
    text += ' ';  // keeps the data 8-byte aligned
  // Written to a temporary file, flushed to disk, then renamed over the final name: a crash
  // leaves either the old file or the complete new one.
  const std::string tmp = path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  DDP_USAGE_CHECK(out != nullptr,
                  "{}: cannot create ({}; check the directory exists and is writable)", tmp,
                  std::strerror(errno));
  const uint64_t len = text.size();
  char len_bytes[8];
  for (int i = 0; i < 8; ++i)
    len_bytes[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  bool ok = std::fwrite(len_bytes, 1, 8, out) == 8 &&
            std::fwrite(text.data(), 1, text.size(), out) == text.size();
  for (const TensorRef& t : tensors)
    ok = ok && std::fwrite(t.data, 1, t.bytes, out) == t.bytes;
  ok = ok && std::fflush(out) == 0 && ::fsync(::fileno(out)) == 0;
  ok = std::fclose(out) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw UsageError(fmt::format("{}: write failed ({}; disk full?)", tmp, std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(tmp.c_str());  // no stray temporary file next to the one that stays
    throw UsageError(
        fmt::format("{}: cannot rename {} over it: {}", path, tmp, std::strerror(error)));
  }
}

namespace {

// The header of `path`: its JSON, the file's size and the header's length.
nlohmann::json read_header(const std::string& path, std::ifstream& in, uint64_t* file_size,
                           uint64_t* header_len) {
  struct stat info {};
  DDP_USAGE_CHECK(::stat(path.c_str(), &info) == 0, "{}: cannot open safetensors file ({})", path,
                  std::strerror(errno));
  DDP_USAGE_CHECK(S_ISREG(info.st_mode),
                  "{}: is not a regular file (a folder?); expected a "
                  "safetensors file",
                  path);
  in.open(path, std::ios::binary | std::ios::ate);
  DDP_USAGE_CHECK(in, "{}: cannot open safetensors file", path);
  *file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  DDP_USAGE_CHECK(*file_size >= 8, "{}: truncated safetensors file ({} bytes)", path, *file_size);
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  *header_len = 0;
  for (int i = 0; i < 8; ++i)
    *header_len |= static_cast<uint64_t>(len_bytes[i]) << (8 * i);
  DDP_USAGE_CHECK(*header_len <= *file_size - 8 && *header_len < (100u << 20),
                  "{}: not a safetensors file (header length {} but file has {} bytes)", path,
                  *header_len, *file_size);
  std::string text(*header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(*header_len));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: malformed safetensors header: {}", path, e.what()));
  }
  DDP_USAGE_CHECK(header.is_object(), "{}: safetensors header is not a JSON object", path);
  return header;
}

// A tensor's entry of the header, checked against the data's size (bytes after the header).
TensorPlace place_of(const std::string& path, const std::string& name, const nlohmann::json& entry,
                     uint64_t data_size) {
  try {
    TensorPlace place;
    place.dtype = entry.at("dtype").get<std::string>();
    place.shape = entry.at("shape").get<std::vector<int64_t>>();
    const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
    DDP_USAGE_CHECK(offsets.size() == 2 && offsets[0] <= offsets[1] && offsets[1] <= data_size,
                    "{}: tensor {} has data offsets outside the file's {} data bytes", path, name,
                    data_size);
    const size_t item = dtype_bytes(place.dtype);
    DDP_USAGE_CHECK(item != 0, "{}: tensor {} has unknown dtype {}", path, name, place.dtype);
    uint64_t count = 1;
    for (int64_t d : place.shape) {
      DDP_USAGE_CHECK(d >= 0, "{}: tensor {} has a negative dimension", path, name);
      count *= static_cast<uint64_t>(d);
    }
    DDP_USAGE_CHECK(count * item == offsets[1] - offsets[0],
                    "{}: tensor {} of shape {} {} needs {} bytes, its offsets span {}", path, name,
                    place.dtype, shape_text(place.shape), count * item, offsets[1] - offsets[0]);
    place.begin = offsets[0];
    place.end = offsets[1];
    return place;
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: malformed entry for tensor {}: {}", path, name, e.what()));
  }
}

}  // namespace

size_t safetensors_dtype_bytes(const std::string& dtype) {
  return dtype_bytes(dtype);
}

std::map<std::string, TensorPlace> read_safetensors_places(const std::string& path) {
  std::ifstream in;
  uint64_t file_size = 0, header_len = 0;
  const nlohmann::json header = read_header(path, in, &file_size, &header_len);
  std::map<std::string, TensorPlace> places;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    TensorPlace place = place_of(path, name, entry, file_size - 8 - header_len);
    place.begin += 8 + header_len;
    place.end += 8 + header_len;
    places.emplace(name, std::move(place));
  }
  return places;
}

void read_file_range(const std::string& path, uint64_t offset, uint64_t bytes, void* out) {
  std::ifstream in(path, std::ios::binary);
  DDP_USAGE_CHECK(in, "{}: cannot open ({})", path, std::strerror(errno));
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(bytes));
  DDP_USAGE_CHECK(in.gcount() == static_cast<std::streamsize>(bytes),
                  "{}: {} bytes at {} could not be read (the file is shorter: truncated?)", path,
                  bytes, offset);
}

SafetensorsFile read_safetensors(const std::string& path, bool metadata_only) {
  std::ifstream in;
  uint64_t file_size = 0, header_len = 0;
  const nlohmann::json header = read_header(path, in, &file_size, &header_len);
  if (metadata_only) {
    SafetensorsFile file;
    if (header.contains("__metadata__") && header["__metadata__"].is_object())
      for (const auto& [key, value] : header["__metadata__"].items())
        file.metadata[key] = value.is_string() ? value.get<std::string>() : value.dump();
    return file;
  }
  const uint64_t data_size = file_size - 8 - header_len;
  std::vector<char> data(data_size);
  in.read(data.data(), static_cast<std::streamsize>(data_size));
  DDP_USAGE_CHECK(in.gcount() == static_cast<std::streamsize>(data_size), "{}: read failed", path);

  SafetensorsFile file;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      DDP_USAGE_CHECK(entry.is_object(), "{}: __metadata__ is not an object", path);
      for (const auto& [key, value] : entry.items())
        file.metadata[key] = value.is_string() ? value.get<std::string>() : value.dump();
      continue;
    }
    const TensorPlace place = place_of(path, name, entry, data_size);
    Tensor tensor;
    tensor.dtype = place.dtype;
    tensor.shape = place.shape;
    tensor.data.assign(data.begin() + static_cast<std::ptrdiff_t>(place.begin),
                       data.begin() + static_cast<std::ptrdiff_t>(place.end));
    file.tensors.emplace(name, std::move(tensor));
  }
  return file;
}

}  // namespace ddp
