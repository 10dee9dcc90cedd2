// Autotuning results kept between runs, so that a run of the same model on the same GPU
// starts without timing every cuBLASLt candidate again (seconds for large layers). One JSON
// file, an object from a key that names everything the choice depends on (GPU, cuBLASLt
// version, shapes, precision) to the choices; written whole and renamed into place, so that
// ranks that write at once leave one complete file.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddp {

// The cache file in `cache_dir` (ProcessEnv::cache_dir): cache_dir/autotune.json; empty
// when cache_dir is.
std::string autotune_cache_path(const std::string& cache_dir);

// The choices stored under `key` in the file at `path`, if it has them.
std::optional<std::vector<int>> load_autotune(const std::string& path, const std::string& key);

// Stores the choices under `key` (keeping the others) in the file at `path`, making its
// folder. Returns an empty string, or why it could not be written (the caller warns; the
// run goes on).
std::string save_autotune(const std::string& path, const std::string& key,
                          const std::vector<int>& choices);

}  // namespace ddp
