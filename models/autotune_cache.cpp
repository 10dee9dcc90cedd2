#include "models/autotune_cache.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ddp {
namespace {

nlohmann::json read_all(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  nlohmann::json all = nlohmann::json::parse(in, nullptr, false);
  return all.is_object() ? all : nlohmann::json::object();  // unreadable: start afresh
}

}  // namespace

std::string autotune_cache_path(const std::string& cache_dir) {
  return cache_dir.empty() ? std::string() : cache_dir + "/autotune.json";
}

std::optional<std::vector<int>> load_autotune(const std::string& path, const std::string& key) {
  if (path.empty()) return std::nullopt;
  const nlohmann::json all = read_all(path);
  const auto found = all.find(key);
  if (found == all.end() || !found->is_array()) return std::nullopt;
  std::vector<int> choices;
  for (const auto& value : *found) {
    if (!value.is_number_integer()) return std::nullopt;
    choices.push_back(value.get<int>());
  }
  return choices;
}

std::string save_autotune(const std::string& path, const std::string& key,
                          const std::vector<int>& choices) {
  if (path.empty()) return "no cache folder (set DDP_CACHE_DIR, XDG_CACHE_HOME or HOME)";
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  if (error) return fmt::format("{}: {}", path, error.message());
  nlohmann::json all = read_all(path);
  all[key] = choices;
  const std::string temporary = fmt::format("{}.{}.tmp", path, static_cast<long>(getpid()));
  {
    std::ofstream out(temporary);
    out << all.dump(1) << "\n";
    if (!out.good()) {
      std::filesystem::remove(temporary, error);
      return fmt::format("{}: could not write", temporary);
    }
  }
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    return fmt::format("{}: {}", path, error.message());
  }
  return "";
}

}  // namespace ddp
