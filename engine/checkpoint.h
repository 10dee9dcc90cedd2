// Checkpoints: weights, optimizer state, step and the run's identity in one safetensors
// file (DIR/latest.safetensors) with a CRC-32 of every tensor's bytes and of the other
// metadata in its metadata.
// Written to a temporary file, flushed and renamed, so the latest checkpoint is always
// complete; loading verifies the checksum, the model and the optimizer and says what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/mlp.h"

namespace ddp {

// What a run was started with besides the model, compared on resume: a changed seed is
// refused (the sample stream and initialisation would differ); the rest may change on
// purpose and is named in a warning.
struct RunSettings {
  uint64_t seed = 0;
  float lr = 0;
  int64_t total_steps = 0;
  std::string lr_schedule;  // "cosine" | "constant"
  int world_size = 1;
};

struct Checkpoint {
  int64_t step = 0;  // optimizer steps done; the sampler resumes at step * batch
  int64_t optimizer_steps = 0;
  std::string optimizer;  // "sgd" | "adamw"
  int batch_size = 0;     // global
  RunSettings settings;
  std::vector<std::string> changed;  // on load: "--lr 0.05 -> 0.01", ... (allowed changes)
  std::vector<float> params;
  std::vector<std::pair<std::string, std::vector<float>>> optimizer_state;
};

std::string checkpoint_path(const std::string& dir);  // DIR/latest.safetensors

// Writes atomically (see above). Only one rank should call it. With keep > 0 the file is
// DIR/step-NNNNNNNNN.safetensors, latest.safetensors becomes a link to it (swapped in
// atomically once the file is complete) and only the newest `keep` step files stay.
void save_checkpoint(const std::string& dir, const MlpShape& shape, const Checkpoint& checkpoint,
                     int keep = 0);

// Reads and verifies (the CRC covers the tensors and the metadata); throws UsageError
// naming the file and the problem (truncated, checksum mismatch, other model, optimizer,
// batch size or seed). Fills `changed` with the settings of `current` that differ.
Checkpoint load_checkpoint(const std::string& path, const MlpShape& shape,
                           const std::string& optimizer, int batch_size,
                           const RunSettings& current);

}  // namespace ddp
