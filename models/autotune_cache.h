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

// $DDP_CACHE_DIR, else $XDG_CACHE_HOME/ddp, else $HOME/.cache/ddp; then /autotune.json.
// Empty when none of them is set.
std::string autotune_cache_path();

// The choices stored under `key`, if the file has them.
std::optional<std::vector<int>> load_autotune(const std::string& key);

// Stores the choices under `key` (keeping the others). Returns an empty string, or why the
// file could not be written (the caller warns; the run goes on).
std::string save_autotune(const std::string& key, const std::vector<int>& choices);

}  // namespace ddp
