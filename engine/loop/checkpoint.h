// Checkpoints: weights, optimizer state, step and the run's identity in one safetensors
// file (DIR/latest.safetensors) with a CRC-32 of every tensor's bytes and of the other
// metadata in its metadata.
// Written to a temporary file, flushed and renamed, so the latest checkpoint is always
// complete; loading verifies the checksum, the model and the optimizer and says what is wrong.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "models/mlp.h"
#include "models/optimizer.h"

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
  // The sample stream: a change is refused like the seed's.
  std::string data;               // "fashion" | "synthetic" | "npy"
  int64_t synthetic_samples = 0;  // 0 unless --data synthetic
  bool shuffle = true;
  // May change on purpose: named in the warning.
  std::string data_dir;
  float momentum = 0;
  float weight_decay = 0;
  int64_t warmup_steps = 0;
};

struct Checkpoint {
  int64_t step = 0;  // optimizer steps done; the sampler resumes at step * batch
  int64_t optimizer_steps = 0;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  int batch_size = 0;  // global
  RunSettings settings;
  std::vector<std::string> changed;  // on load: "--lr 0.05 -> 0.01", ... (allowed changes)
  std::vector<float> params;
  std::vector<std::pair<std::string, std::vector<float>>> optimizer_state;
};

std::string checkpoint_path(const std::string& dir);  // DIR/latest.safetensors

// Writes atomically (see above). Only one rank should call it. With keep > 0 the file is
// DIR/step-NNNNNNNNN.safetensors, latest.safetensors becomes a link to it (swapped in
// atomically once the file is complete) and `keep` step files stay (prune_checkpoints).
void save_checkpoint(const std::string& dir, const MlpShape& shape, const Checkpoint& checkpoint,
                     int keep = 0);

// Writes checkpoints with save_checkpoint on a thread of its own, one at a time (rank 0's):
// training waits for the model's gather, not for the disk. The next write(), wait() and the
// destructor wait for the one in flight. The file is replaced only once complete, as
// save_checkpoint does, so a process killed meanwhile leaves the previous checkpoint.
class CheckpointWriter {
 public:
  CheckpointWriter() = default;
  ~CheckpointWriter();  // waits; a failed write is logged
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the write in flight (throwing its failure), then writes `checkpoint` on the
  // thread. `blocked_s`, the time training waited for this checkpoint (its gather), is logged
  // with the write's own: "checkpoint at step N written to PATH (B s blocked, W s written)".
  void write(const std::string& dir, const MlpShape& shape, Checkpoint checkpoint, int keep,
             double blocked_s);
  // Waits for the write in flight; throws what it threw (the failure is reported once).
  void wait();
  bool busy() const { return thread_.joinable(); }

 private:
  std::thread thread_;
  std::exception_ptr error_;
};

// The step of a "step-N.safetensors" name (any number of digits), or nullopt.
std::optional<int64_t> step_of_checkpoint_file(const std::string& file);
// Which of `files` (names in a checkpoint folder) go when the checkpoint of `current_step`
// has just been written and `keep` are to stay: never the current one (latest points at it);
// of the rest, this run's newest earlier steps stay and files of later steps (an earlier
// run's) go first. Names that are not step files are never listed. Pure.
std::vector<std::string> checkpoints_to_prune(const std::vector<std::string>& files,
                                              int64_t current_step, int keep);
void prune_checkpoints(const std::string& dir, int64_t current_step, int keep);

// DIR/latest.safetensors when it is a checkpoint file (or a link to one); nullopt when there
// is none. Throws UsageError, without opening it, when it is a dangling link, a link loop, a
// FIFO, a folder or another non-regular file (a FIFO would block a reader forever).
std::optional<std::string> find_latest_checkpoint(const std::string& dir);

// The files --resume may start from, in the order to try them: DIR/latest.safetensors (where
// find_latest_checkpoint finds one), then the step files newest first (a latest that is
// corrupt or missing falls back on the newest intact step file --keep-checkpoints kept).
std::vector<std::string> resume_candidates(const std::string& dir);

// Reads and verifies (the CRC covers the tensors and the metadata); throws UsageError
// naming the file and the problem (truncated, checksum mismatch, other model, optimizer,
// batch size or seed). Fills `changed` with the settings of `current` that differ.
Checkpoint load_checkpoint(const std::string& path, const MlpShape& shape, OptimizerKind optimizer,
                           int batch_size, const RunSettings& current);

// Readies a --checkpoint-dir before the run starts; rank 0 calls it, holding the folder's lock.
// Unfinished files of a job that died (`*.safetensors.tmp`, the link being swapped in) are
// removed. Then, unless `resume`: a folder that holds checkpoints (`latest` or step files) of
// any earlier run is refused (UsageError naming that run's step, --layers and --seed, and
// what to give), since training afresh there would replace and prune them; with `fresh` its
// checkpoint files are moved into DIR/earlier-K/ (the first K free) instead, nothing deleted.
void prepare_checkpoint_dir(const std::string& dir, const MlpShape& shape, uint64_t seed,
                            bool resume, bool fresh);

// DIR/.ddp-lock, held (flock) for the lifetime of the object, with the holder's host and pid
// in it: a second job on the same folder fails at start with a UsageError naming the
// holder; a lock left by a job that died is taken over with a warning. Rank 0 holds it.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace ddp
