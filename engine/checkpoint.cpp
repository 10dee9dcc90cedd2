// Checkpoint files on top of the safetensors writer.
#include "engine/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "models/safetensors.h"
#include "runtime/checksum.h"
#include "runtime/error.h"
#include "runtime/parse.h"

namespace ddp {
namespace {

// Format 2: the CRC covers the metadata too. Format 1 (tensors only) is still read.
constexpr const char* kFormat = "ddp-checkpoint-2";
constexpr const char* kFormatTensorsOnly = "ddp-checkpoint-1";

// CRC-32 over the tensors' names and bytes in name order, then (format 2) every metadata
// entry but the CRC itself, in key order.
uint32_t checksum(const std::map<std::string, std::pair<const void*, size_t>>& tensors,
                  const std::map<std::string, std::string>* metadata) {
  uint32_t crc = 0;
  for (const auto& [name, data] : tensors) {
    crc = crc32_of(name.data(), name.size(), crc);
    crc = crc32_of(data.first, data.second, crc);
  }
  if (metadata != nullptr)
    for (const auto& [key, value] : *metadata) {
      if (key == "crc32") continue;
      crc = crc32_of(key.data(), key.size(), crc);
      crc = crc32_of(value.data(), value.size(), crc);
    }
  return crc;
}

std::string text_of(float value) {
  return fmt::format("{}", value);
}

}  // namespace

std::string checkpoint_path(const std::string& dir) {
  return dir + "/latest.safetensors";
}

void save_checkpoint(const std::string& dir, const MlpShape& shape, const Checkpoint& c, int keep) {
  ::mkdir(dir.c_str(), 0755);
  std::vector<TensorRef> refs = mlp_tensor_refs(shape, c.params.data());
  for (const auto& [name, values] : c.optimizer_state)
    refs.push_back({"optimizer." + name,
                    "F32",
                    {static_cast<int64_t>(values.size())},
                    values.data(),
                    values.size() * sizeof(float)});
  std::sort(refs.begin(), refs.end(),
            [](const TensorRef& a, const TensorRef& b) { return a.name < b.name; });
  std::map<std::string, std::pair<const void*, size_t>> data;
  for (const TensorRef& r : refs)
    data[r.name] = {r.data, r.bytes};
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"layers", shape.to_string()},
      {"step", std::to_string(c.step)},
      {"optimizer", c.optimizer},
      {"optimizer_steps", std::to_string(c.optimizer_steps)},
      {"batch_size", std::to_string(c.batch_size)},
      {"seed", std::to_string(c.settings.seed)},
      {"lr", text_of(c.settings.lr)},
      {"total_steps", std::to_string(c.settings.total_steps)},
      {"lr_schedule", c.settings.lr_schedule},
      {"world_size", std::to_string(c.settings.world_size)}};
  metadata["crc32"] = std::to_string(checksum(data, &metadata));
  if (keep <= 0) {
    write_safetensors(checkpoint_path(dir), refs, metadata);
    return;
  }
  const std::string name = fmt::format("step-{:09d}.safetensors", c.step);
  write_safetensors(dir + "/" + name, refs, metadata);  // complete before latest points at it
  const std::string link = checkpoint_path(dir) + ".link";
  ::unlink(link.c_str());
  DDP_USAGE_CHECK(::symlink(name.c_str(), link.c_str()) == 0 &&
                      std::rename(link.c_str(), checkpoint_path(dir).c_str()) == 0,
                  "--checkpoint-dir {}: cannot point latest.safetensors at {}: {}", dir, name,
                  std::strerror(errno));
  std::vector<std::string> steps;
  if (DIR* folder = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(folder)) {
      const std::string file = entry->d_name;
      if (file.rfind("step-", 0) == 0 && file.size() == name.size() &&
          file.compare(file.size() - 12, 12, ".safetensors") == 0)
        steps.push_back(file);
    }
    ::closedir(folder);
  }
  std::sort(steps.begin(), steps.end());  // zero-padded: name order is step order
  for (size_t i = 0; i + static_cast<size_t>(keep) < steps.size(); ++i)
    ::unlink((dir + "/" + steps[i]).c_str());
}

Checkpoint load_checkpoint(const std::string& path, const MlpShape& shape,
                           const std::string& optimizer, int batch_size,
                           const RunSettings& current) {
  const SafetensorsFile file = read_safetensors(path);
  auto meta = [&](const char* key) {
    const auto found = file.metadata.find(key);
    DDP_USAGE_CHECK(found != file.metadata.end(),
                    "{}: not a ddp checkpoint (no '{}' in its metadata)", path, key);
    return found->second;
  };
  const bool tensors_only = meta("format") == kFormatTensorsOnly;
  DDP_USAGE_CHECK(meta("format") == kFormat || tensors_only,
                  "{}: checkpoint format '{}', expected '{}'", path, meta("format"), kFormat);
  std::map<std::string, std::pair<const void*, size_t>> data;
  for (const auto& [name, tensor] : file.tensors)
    data[name] = {tensor.data.data(), tensor.data.size()};
  const uint32_t crc = checksum(data, tensors_only ? nullptr : &file.metadata);
  DDP_USAGE_CHECK(
      std::to_string(crc) == meta("crc32"),
      "{}: checksum mismatch (stored {}, computed {}): the file was altered or is corrupt; "
      "remove it to start afresh",
      path, meta("crc32"), crc);
  DDP_USAGE_CHECK(meta("layers") == shape.to_string(),
                  "{}: checkpoint of --layers {}, but this run has --layers {}", path,
                  meta("layers"), shape.to_string());
  DDP_USAGE_CHECK(meta("optimizer") == optimizer,
                  "{}: checkpoint of --optimizer {}, but this run has --optimizer {}", path,
                  meta("optimizer"), optimizer);
  DDP_USAGE_CHECK(meta("batch_size") == std::to_string(batch_size),
                  "{}: checkpoint of --batch-size {}, but this run has --batch-size {} (the sample "
                  "stream would differ)",
                  path, meta("batch_size"), batch_size);
  DDP_USAGE_CHECK(meta("seed") == std::to_string(current.seed),
                  "{}: checkpoint of --seed {}, but this run has --seed {} (the sample order "
                  "would differ); resume with --seed {} or start afresh in another "
                  "--checkpoint-dir",
                  path, meta("seed"), current.seed, meta("seed"));
  Checkpoint c;
  // The metadata's CRC has matched, so these were written by save_checkpoint.
  const auto step = parse_number<int64_t>(meta("step"));
  const auto optimizer_steps = parse_number<int64_t>(meta("optimizer_steps"));
  DDP_USAGE_CHECK(step && optimizer_steps && *step >= 0,
                  "{}: step '{}' and optimizer_steps '{}' are not step counts", path, meta("step"),
                  meta("optimizer_steps"));
  c.step = *step;
  c.optimizer_steps = *optimizer_steps;
  c.optimizer = optimizer;
  c.batch_size = batch_size;
  c.settings = current;
  if (!tensors_only) {
    const std::pair<const char*, std::string> now[] = {
        {"lr", text_of(current.lr)},
        {"total_steps", std::to_string(current.total_steps)},
        {"lr_schedule", current.lr_schedule},
        {"world_size", std::to_string(current.world_size)}};
    const char* flag[] = {"--lr", "the total steps (--steps/--epochs)", "--lr-schedule",
                          "the number of ranks"};
    for (size_t i = 0; i < 4; ++i)
      if (meta(now[i].first) != now[i].second)
        c.changed.push_back(fmt::format("{} {} -> {}", flag[i], meta(now[i].first), now[i].second));
  }
  c.params.resize(shape.param_count());
  mlp_params_from(file, path, shape, c.params.data());
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind("optimizer.", 0) != 0) continue;
    DDP_USAGE_CHECK(tensor.dtype == "F32" && tensor.shape.size() == 1 &&
                        static_cast<size_t>(tensor.shape[0]) == shape.param_count(),
                    "{}: optimizer tensor {} has the wrong shape or type", path, name);
    std::vector<float> values(shape.param_count());
    std::memcpy(values.data(), tensor.data.data(), tensor.data.size());
    c.optimizer_state.emplace_back(name.substr(10), std::move(values));
  }
  return c;
}

}  // namespace ddp
