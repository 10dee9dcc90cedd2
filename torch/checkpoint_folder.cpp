// The sharded checkpoint's folder: files, index, commit, reader.
#include "torch/checkpoint_folder.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"

// LibTorch's own CRC-32 (zlib's polynomial; header-only, used here alone): ddp::torch links no
// zlib. Last, as it defines byte-order macros.
#include <caffe2/serialize/crc_alt.h>

namespace ddp {
namespace checkpoint_folder {

namespace fs = std::filesystem;

std::string dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat:
      return "F32";
    case torch::kDouble:
      return "F64";
    case torch::kHalf:
      return "F16";
    case torch::kBFloat16:
      return "BF16";
    case torch::kLong:
      return "I64";
    case torch::kInt:
      return "I32";
    case torch::kShort:
      return "I16";
    case torch::kChar:
      return "I8";
    case torch::kByte:
      return "U8";
    case torch::kBool:
      return "BOOL";
    default:
      break;
  }
  throw UsageError(fmt::format("ddp::Checkpointer: a tensor of dtype {} (not a safetensors one)",
                               c10::toString(dtype)));
}

torch::ScalarType dtype_from(const std::string& name) {
  static const std::map<std::string, torch::ScalarType> known = {
      {"F32", torch::kFloat},     {"F64", torch::kDouble}, {"F16", torch::kHalf},
      {"BF16", torch::kBFloat16}, {"I64", torch::kLong},   {"I32", torch::kInt},
      {"I16", torch::kShort},     {"I8", torch::kChar},    {"U8", torch::kByte},
      {"BOOL", torch::kBool}};
  const auto it = known.find(name);
  DDP_USAGE_CHECK(it != known.end(), "ddp::Checkpointer: unknown dtype {} in the index", name);
  return it->second;
}

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape)
    n *= d;
  return n;
}

// A line to stderr (ddp::torch has no logger of its own: LibTorch's fmt shadows spdlog's).
void say(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
}

std::string step_folder(int64_t step) {
  return fmt::format("step-{:09d}", step);
}

std::string rank_file(int rank, int ranks) {
  return fmt::format("rank-{:05d}-of-{:05d}.safetensors", rank, ranks);
}

// Writes `path` whole and durably: a temporary file, fsync, rename.
void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  DDP_USAGE_CHECK(out != nullptr, "{}: cannot create ({})", tmp, std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), out) == text.size();
  ok = ok && std::fflush(out) == 0 && ::fsync(::fileno(out)) == 0;
  ok = std::fclose(out) == 0 && ok;
  if (!ok) {
    const int error = errno;
    std::remove(tmp.c_str());
    throw UsageError(fmt::format("{}: write failed ({}; disk full?)", tmp, std::strerror(error)));
  }
  DDP_USAGE_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "{}: cannot rename {} over it: {}",
                  path, tmp, std::strerror(errno));
}

void sync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DDP_USAGE_CHECK(in, "{}: cannot open ({})", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// This rank's file and its description (the pieces' keys, places and CRC-32s).
nlohmann::json write_rank(const std::string& folder, const Snapshot& s) {
  const std::string file = rank_file(s.rank, s.ranks);
  std::vector<TensorRef> refs;
  std::vector<std::string> keys;
  nlohmann::json pieces = nlohmann::json::array();
  for (const Part& part : s.parts) {
    const bool whole = part.offset == 0 && part.values.numel() == elements(part.shape);
    keys.push_back(whole ? part.name : fmt::format("{}@{}", part.name, part.offset));
    const size_t bytes = static_cast<size_t>(part.values.numel()) * part.values.element_size();
    refs.push_back({keys.back(), dtype_name(part.dtype),
                    whole ? part.shape : std::vector<int64_t>{part.values.numel()},
                    part.values.data_ptr(), bytes});
    pieces.push_back({{"name", part.name},
                      {"key", keys.back()},
                      {"dtype", dtype_name(part.dtype)},
                      {"shape", part.shape},
                      {"offset", part.offset},
                      {"numel", part.values.numel()},
                      {"crc32", crc32_fast(part.values.data_ptr(), bytes)}});
  }
  write_safetensors(folder + "/" + file, refs);
  nlohmann::json description = {{"file", file}, {"pieces", pieces}};
  if (s.rank == 0) {
    description["step"] = s.step;
    description["optimizer"] = s.optimizer;
    description["values"] = s.values;
  }
  write_text(fmt::format("{}/rank-{:05d}.json", folder, s.rank), description.dump());
  return description;
}

// Rank 0: the index from every rank's description, the folder renamed into place, `latest`
// replaced, the oldest beyond `keep` removed.
void commit(const std::string& dir, const std::string& folder, int ranks, int keep) {
  nlohmann::json index = {{"format", kFormat}, {"version", kVersion}, {"world_size", ranks}};
  nlohmann::json tensors = nlohmann::json::object(), weight_map = nlohmann::json::object();
  int64_t step = 0;
  for (int r = 0; r < ranks; ++r) {
    const nlohmann::json d =
        nlohmann::json::parse(read_text(fmt::format("{}/rank-{:05d}.json", folder, r)));
    if (r == 0) {
      step = d.at("step").get<int64_t>();
      index["step"] = step;
      index["optimizer"] = d.at("optimizer");
      index["metadata"] = d.at("values");
    }
    const std::string file = d.at("file").get<std::string>();
    for (const nlohmann::json& p : d.at("pieces")) {
      const std::string name = p.at("name").get<std::string>();
      nlohmann::json& t = tensors[name];
      if (t.is_null())
        t = {{"dtype", p.at("dtype")},
             {"shape", p.at("shape")},
             {"pieces", nlohmann::json::array()}};
      t["pieces"].push_back({{"file", file},
                             {"key", p.at("key")},
                             {"offset", p.at("offset")},
                             {"numel", p.at("numel")},
                             {"crc32", p.at("crc32")}});
      if (p.at("key") == name && name.rfind("optimizer.", 0) != 0 && name.rfind("extra.", 0) != 0)
        weight_map[name] = file;
    }
  }
  // Every tensor's pieces cover it exactly once.
  for (auto& [name, t] : tensors.items()) {
    auto& pieces = t["pieces"];
    std::sort(pieces.begin(), pieces.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a.at("offset").get<int64_t>() < b.at("offset").get<int64_t>();
    });
    int64_t at = 0;
    for (const nlohmann::json& p : pieces) {
      DDP_CHECK(p.at("offset").get<int64_t>() == at,
                "ddp::Checkpointer: tensor {}'s pieces leave a gap or overlap at element {}", name,
                at);
      at += p.at("numel").get<int64_t>();
    }
    DDP_CHECK(at == elements(t.at("shape").get<std::vector<int64_t>>()),
              "ddp::Checkpointer: tensor {}'s pieces hold {} of its elements", name, at);
  }
  index["tensors"] = tensors;
  index["weight_map"] = weight_map;
  write_text(folder + "/index.json", index.dump(1));
  for (int r = 0; r < ranks; ++r)  // their content is in the index now
    fs::remove(fmt::format("{}/rank-{:05d}.json", folder, r));
  sync_folder(folder);
  const fs::path final_path = fs::path(dir) / step_folder(step);
  if (fs::exists(final_path)) {  // the same step saved again: the older one goes
    const fs::path old = fs::path(dir) / ("." + step_folder(step) + ".old");
    fs::remove_all(old);
    fs::rename(final_path, old);
    fs::rename(folder, final_path);
    fs::remove_all(old);
  } else {
    fs::rename(folder, final_path);
  }
  sync_folder(dir);
  write_text(dir + "/latest", step_folder(step) + "\n");
  sync_folder(dir);
  // The newest `keep` stay.
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0 && name.size() == 14)
      complete.emplace_back(std::stoll(name.substr(5)), e.path());
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < complete.size(); ++i)
    if (complete[i].first != step) fs::remove_all(complete[i].second);
}

// A folder's index, checked.
nlohmann::json read_index(const std::string& folder) {
  const std::string path = folder + "/index.json";
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: not a checkpoint index ({})", path, e.what()));
  }
  DDP_USAGE_CHECK(index.value("format", "") == kFormat && index.value("version", 0) == kVersion,
                  "{}: not a ddp sharded checkpoint of version {} (format '{}', version {})", path,
                  kVersion, index.value("format", ""), index.value("version", 0));
  return index;
}

// The folder to load: `latest`'s, else the newest complete step folder; empty where none.
std::string newest_checkpoint(const std::string& dir) {
  std::ifstream latest(dir + "/latest");
  std::string name;
  if (latest && std::getline(latest, name) && !name.empty() &&
      fs::exists(fs::path(dir) / name / "index.json"))
    return (fs::path(dir) / name).string();
  std::vector<std::string> complete;
  if (fs::is_directory(dir))
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind("step-", 0) == 0 && fs::exists(e.path() / "index.json"))
        complete.push_back(e.path().string());
    }
  std::sort(complete.begin(), complete.end());
  if (!complete.empty() && !name.empty())
    say(fmt::format("ddp::Checkpointer: {}/latest names {}, which is not complete: loading {}", dir,
                    name, complete.back()));
  return complete.empty() ? std::string() : complete.back();
}

// Reads elements [offset, offset + count) of tensor `name` from the folder's pieces into `out`
// (a host tensor of `count` elements of the tensor's dtype), each piece read whole and checked.

void PieceReader::read(const std::string& name, int64_t offset, const torch::Tensor& out) {
  const int64_t count = out.numel(), end = offset + count;
  const size_t item = out.element_size();
  for (const nlohmann::json& p : tensors_.at(name).at("pieces")) {
    const int64_t from = p.at("offset").get<int64_t>(), n = p.at("numel").get<int64_t>();
    const int64_t lo = std::max(offset, from), hi = std::min(end, from + n);
    if (lo >= hi) continue;
    const std::string path = folder_ + "/" + p.at("file").get<std::string>();
    const std::string key = p.at("key").get<std::string>();
    auto& places = places_[path];
    if (places.empty()) places = read_safetensors_places(path);
    const auto place = places.find(key);
    DDP_USAGE_CHECK(place != places.end(), "{}: has no tensor {} (the index names it)", path, key);
    DDP_USAGE_CHECK(place->second.end - place->second.begin == static_cast<uint64_t>(n) * item,
                    "{}: tensor {} holds {} bytes, the index says {} elements of {}", path, key,
                    place->second.end - place->second.begin, n, item);
    std::vector<char> bytes(static_cast<size_t>(n) * item);
    read_file_range(path, place->second.begin, bytes.size(), bytes.data());
    DDP_USAGE_CHECK(crc32_fast(bytes.data(), bytes.size()) == p.at("crc32").get<uint32_t>(),
                    "{}: tensor {}'s bytes do not match their checksum (a damaged file)", path,
                    key);
    std::memcpy(static_cast<char*>(out.data_ptr()) + (lo - offset) * item,
                bytes.data() + (lo - from) * item, static_cast<size_t>(hi - lo) * item);
  }
}

}  // namespace checkpoint_folder
}  // namespace ddp
