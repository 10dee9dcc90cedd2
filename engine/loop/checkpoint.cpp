// Checkpoint files on top of the safetensors writer.
#include "engine/loop/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "models/safetensors.h"
#include "runtime/checksum.h"
#include "runtime/error.h"
#include "runtime/parse.h"

namespace ddp {
namespace {

std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* folder = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(folder))
      files.push_back(entry->d_name);
    ::closedir(folder);
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool ends_with(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() &&
         text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

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
      {"optimizer", optimizer_name(c.optimizer)},
      {"optimizer_steps", std::to_string(c.optimizer_steps)},
      {"batch_size", std::to_string(c.batch_size)},
      {"seed", std::to_string(c.settings.seed)},
      {"lr", text_of(c.settings.lr)},
      {"total_steps", std::to_string(c.settings.total_steps)},
      {"lr_schedule", c.settings.lr_schedule},
      {"world_size", std::to_string(c.settings.world_size)},
      {"data", c.settings.data},
      {"synthetic_samples", std::to_string(c.settings.synthetic_samples)},
      {"shuffle", c.settings.shuffle ? "true" : "false"},
      {"data_dir", c.settings.data_dir},
      {"momentum", text_of(c.settings.momentum)},
      {"weight_decay", text_of(c.settings.weight_decay)},
      {"warmup_steps", std::to_string(c.settings.warmup_steps)}};
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
  prune_checkpoints(dir, c.step, keep);
}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();  // a failure was said when it happened
}

void CheckpointWriter::write(const std::string& dir, const MlpShape& shape, Checkpoint checkpoint,
                             int keep, double blocked_s) {
  wait();
  thread_ = std::thread([this, dir, shape, keep, blocked_s, c = std::move(checkpoint)] {
    try {
      const auto start = std::chrono::steady_clock::now();
      save_checkpoint(dir, shape, c, keep);
      const double written =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      spdlog::info("checkpoint at step {} written to {} ({:.2f} s blocked, {:.2f} s written)",
                   c.step, checkpoint_path(dir), blocked_s, written);
    } catch (const std::exception& e) {
      // Said at once (training goes on meanwhile); the run stops at the next wait.
      spdlog::warn("the checkpoint of step {} could not be written (the previous one is kept): {}",
                   c.step, e.what());
      error_ = std::current_exception();
    }
  });
}

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::optional<int64_t> step_of_checkpoint_file(const std::string& file) {
  constexpr const char* kPrefix = "step-";
  constexpr const char* kSuffix = ".safetensors";
  const size_t prefix = std::strlen(kPrefix), suffix = std::strlen(kSuffix);
  if (file.size() <= prefix + suffix || file.rfind(kPrefix, 0) != 0 ||
      file.compare(file.size() - suffix, suffix, kSuffix) != 0)
    return std::nullopt;
  const std::string digits = file.substr(prefix, file.size() - prefix - suffix);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return parse_number<int64_t>(digits);
}

std::vector<std::string> checkpoints_to_prune(const std::vector<std::string>& files,
                                              int64_t current_step, int keep) {
  // The one just written (latest points at it) is always kept. Of the others, those of
  // this run's past (step below the current one) are the ones worth keeping, newest first;
  // files of a later step were left by an earlier run and are pruned first.
  std::vector<std::pair<int64_t, std::string>> others;
  for (const std::string& file : files) {
    const std::optional<int64_t> step = step_of_checkpoint_file(file);
    if (step && *step != current_step) others.emplace_back(*step, file);
  }
  std::sort(others.begin(), others.end(), [&](const auto& a, const auto& b) {
    const bool a_past = a.first < current_step, b_past = b.first < current_step;
    if (a_past != b_past) return a_past;  // this run's past first
    return a.first > b.first;             // then newest first
  });
  std::vector<std::string> pruned;
  for (size_t i = static_cast<size_t>(std::max(keep - 1, 0)); i < others.size(); ++i)
    pruned.push_back(others[i].second);
  return pruned;
}

void prune_checkpoints(const std::string& dir, int64_t current_step, int keep) {
  for (const std::string& file : checkpoints_to_prune(files_of(dir), current_step, keep))
    ::unlink((dir + "/" + file).c_str());
}

std::optional<std::string> find_latest_checkpoint(const std::string& dir) {
  const std::string path = checkpoint_path(dir);
  struct stat entry {};
  if (::lstat(path.c_str(), &entry) != 0) return std::nullopt;  // no checkpoint yet
  struct stat target {};
  if (::stat(path.c_str(), &target) != 0) {
    const int error = errno;
    throw UsageError(fmt::format(
        "--checkpoint-dir {}: latest.safetensors is {} ({}); expected a checkpoint file: "
        "give --fresh instead of --resume to start afresh (keeping it aside)",
        dir, error == ELOOP ? "a symbolic link loop" : "a dangling symbolic link",
        std::strerror(error)));
  }
  DDP_USAGE_CHECK(S_ISREG(target.st_mode),
                  "--checkpoint-dir {}: latest.safetensors is {}; expected a checkpoint file: "
                  "give --fresh instead of --resume to start afresh (keeping it aside)",
                  dir,
                  S_ISDIR(target.st_mode)    ? "a folder"
                  : S_ISFIFO(target.st_mode) ? "a FIFO"
                                             : "not a regular file");
  return path;
}

std::vector<std::string> resume_candidates(const std::string& dir) {
  std::vector<std::string> paths;
  std::string target;  // the step file latest links to, named as itself
  if (const std::optional<std::string> latest = find_latest_checkpoint(dir)) {
    char link[4096];
    const ssize_t n = ::readlink(latest->c_str(), link, sizeof(link) - 1);
    if (n > 0) target.assign(link, static_cast<size_t>(n));
    const bool step_file = step_of_checkpoint_file(target).has_value();
    paths.push_back(step_file ? dir + "/" + target : *latest);
    if (!step_file) target.clear();
  }
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const std::string& file : files_of(dir))
    if (const std::optional<int64_t> step = step_of_checkpoint_file(file))
      if (file != target) steps.emplace_back(*step, file);
  std::sort(steps.rbegin(), steps.rend());
  for (const auto& [step, file] : steps)
    paths.push_back(dir + "/" + file);
  return paths;
}

Checkpoint load_checkpoint(const std::string& path, const MlpShape& shape, OptimizerKind optimizer,
                           int batch_size, const RunSettings& current) {
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
      "give --fresh instead of --resume to start afresh (keeping it aside)",
      path, meta("crc32"), crc);
  DDP_USAGE_CHECK(meta("layers") == shape.to_string(),
                  "{}: checkpoint of --layers {}, but this run has --layers {}", path,
                  meta("layers"), shape.to_string());
  DDP_USAGE_CHECK(meta("optimizer") == optimizer_name(optimizer),
                  "{}: checkpoint of --optimizer {}, but this run has --optimizer {}", path,
                  meta("optimizer"), optimizer_name(optimizer));
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
  // Checkpoints written before a setting was recorded do not have its key: not compared.
  const auto recorded = [&](const char* key) { return file.metadata.count(key) > 0; };
  struct Setting {
    const char* key;
    std::string now;
    const char* flag;
  };
  const Setting stream[] = {
      {"data", current.data, "--data"},
      {"synthetic_samples", std::to_string(current.synthetic_samples), "--synthetic-samples"},
      {"shuffle", current.shuffle ? "true" : "false", "shuffle (--no-shuffle)"}};
  for (const Setting& s : stream)
    DDP_USAGE_CHECK(!recorded(s.key) || meta(s.key) == s.now,
                    "{}: checkpoint of {} {}, but this run has {} (the sample stream would "
                    "differ); resume with the checkpoint's value or start afresh in another "
                    "--checkpoint-dir",
                    path, s.flag, meta(s.key), s.now);
  if (!tensors_only) {
    const Setting allowed[] = {
        {"lr", text_of(current.lr), "--lr"},
        {"total_steps", std::to_string(current.total_steps), "the total steps (--steps/--epochs)"},
        {"lr_schedule", current.lr_schedule, "--lr-schedule"},
        {"world_size", std::to_string(current.world_size), "the number of ranks"},
        {"data_dir", current.data_dir, "--data-dir"},
        {"momentum", text_of(current.momentum), "--momentum"},
        {"weight_decay", text_of(current.weight_decay), "--weight-decay"},
        {"warmup_steps", std::to_string(current.warmup_steps), "--warmup-steps"}};
    for (const Setting& s : allowed)
      if (recorded(s.key) && meta(s.key) != s.now)
        c.changed.push_back(fmt::format("{} {} -> {}", s.flag, meta(s.key), s.now));
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

void prepare_checkpoint_dir(const std::string& dir, const MlpShape& shape, uint64_t seed,
                            bool resume, bool fresh) {
  if (dir.empty()) return;
  const std::string latest_name = "latest.safetensors";
  std::vector<std::string> earlier;  // the checkpoint files an earlier run left
  int unfinished = 0;
  for (const std::string& file : files_of(dir)) {
    // The lock is ours: a temporary file of ours (step-N or latest .safetensors.tmp) is a
    // write that a dead job never finished. A user's own file.safetensors.tmp is not ours.
    const std::string written =
        ends_with(file, ".tmp") ? file.substr(0, file.size() - 4) : std::string();
    if ((!written.empty() && (written == latest_name || step_of_checkpoint_file(written))) ||
        file == latest_name + ".link") {
      unfinished += ::unlink((dir + "/" + file).c_str()) == 0 ? 1 : 0;
      continue;
    }
    if (file == latest_name || step_of_checkpoint_file(file)) earlier.push_back(file);
  }
  if (unfinished > 0)
    spdlog::warn(
        "--checkpoint-dir {}: removed {} unfinished checkpoint file{} of a job that died "
        "while writing",
        dir, unfinished, unfinished == 1 ? "" : "s");
  if (resume || earlier.empty()) return;
  if (!fresh) {
    std::string run = "an earlier run (step files only)";
    const std::optional<std::string> latest = find_latest_checkpoint(dir);
    bool other = false;
    if (latest) {
      const SafetensorsFile file = read_safetensors(*latest, /*metadata_only=*/true);
      const auto meta = [&](const char* key) {
        const auto found = file.metadata.find(key);
        return found == file.metadata.end() ? std::string("?") : found->second;
      };
      other = meta("layers") != shape.to_string() || meta("seed") != std::to_string(seed);
      run = fmt::format(
          "{} at step {} (--layers {} --seed {}{})",
          other ? "the checkpoint of another run" : "an earlier run's checkpoint", meta("step"),
          meta("layers"), meta("seed"),
          other ? fmt::format(", this run: --layers {} --seed {}", shape.to_string(), seed) : "");
    }
    throw UsageError(fmt::format(
        "--checkpoint-dir {}: holds {}; give --resume to continue {}, --fresh to start afresh "
        "(its files are moved into {}/earlier-N/), or another --checkpoint-dir (nothing was "
        "overwritten)",
        dir, run, other ? "that run" : "it", dir));
  }
  std::string aside;
  for (int k = 1;; ++k) {
    aside = fmt::format("{}/earlier-{}", dir, k);
    if (::mkdir(aside.c_str(), 0755) == 0) break;
    DDP_USAGE_CHECK(errno == EEXIST && k < 100000, "--fresh: cannot create {} ({})", aside,
                    std::strerror(errno));
  }
  for (const std::string& file : earlier)
    DDP_USAGE_CHECK(std::rename((dir + "/" + file).c_str(), (aside + "/" + file).c_str()) == 0,
                    "--fresh: cannot move {}/{} into {} ({})", dir, file, aside,
                    std::strerror(errno));
  spdlog::warn("--fresh: the earlier run's {} checkpoint file{} moved into {}/", earlier.size(),
               earlier.size() == 1 ? "" : "s", aside);
}

namespace {
std::string this_host() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}
}  // namespace

CheckpointDirLock::CheckpointDirLock(const std::string& dir) : path_(dir + "/.ddp-lock") {
  DDP_USAGE_CHECK(::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST,
                  "--checkpoint-dir {}: cannot create it ({})", dir, std::strerror(errno));
  std::string holder;
  for (int attempt = 0;; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    DDP_USAGE_CHECK(fd_ >= 0, "--checkpoint-dir {}: cannot create the lock file {} ({})", dir,
                    path_, std::strerror(errno));
    char text[512] = {};
    const ssize_t n = ::pread(fd_, text, sizeof(text) - 1, 0);
    holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
    // flock is released by the kernel when its holder dies, however it dies: a lock that
    // cannot be taken belongs to a live job; one that can, but names a holder, is stale.
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      fd_ = -1;
      throw UsageError(fmt::format(
          "--checkpoint-dir {}: in use by a running job ({}); two jobs writing one folder would "
          "overwrite each other's checkpoints: give this one another --checkpoint-dir",
          dir, holder.empty() ? "lock " + path_ : "held by " + holder));
    }
    // The holder may have removed the file between our open and our flock: that lock is on
    // a name nobody else sees; take the one at the path instead.
    struct stat held {
    }, named{};
    if ((::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 &&
         held.st_ino == named.st_ino) ||
        attempt == 10)
      break;
    ::close(fd_);
  }
  if (!holder.empty())
    spdlog::warn("--checkpoint-dir {}: taking over a stale lock (held by {}, no longer running)",
                 dir, holder);
  const std::string mine = fmt::format("host {} pid {}", this_host(), ::getpid());
  (void)!::ftruncate(fd_, 0);
  (void)!::pwrite(fd_, mine.data(), mine.size(), 0);
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still held, so that no other job's lock is removed
  ::close(fd_);
}

}  // namespace ddp
