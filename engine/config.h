// ddptrain's configuration: one plain struct with every default in one place, the cxxopts
// parser that fills it (its --help is generated from the same table), and validate().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "collectives/backend.h"
#include "dist/sync_options.h"
#include "engine/pipeline/schedule.h"
#include "models/mlp.h"
#include "models/optimizer.h"
#include "models/precision.h"

namespace ddp {

enum class Device { kCpu, kCuda };
enum class DataSource { kFashion, kSynthetic, kNpy };
// A non-finite gradient (after the all-reduce, so every rank decides alike) or window loss:
// stop ends the run (exit 1) before any checkpoint or weights are written; skip-step leaves
// the weights and optimizer state of that step unchanged (CPU path).
enum class OnNonfinite { kStop, kSkipStep };
// What the gradient all-reduce sends: float32, or bfloat16 (half the bytes, rounded; the
// optimizer still sees float32 gradients). GPU with NCCL only.
enum class GradReduce { kFp32, kBf16 };
// The names the flags take ("cuda", "nccl", "skip-step").
const char* device_name(Device device);
const char* data_name(DataSource data);  // "fashion", "synthetic", "npy": --data's words
const char* on_nonfinite_name(OnNonfinite policy);
const char* grad_reduce_name(GradReduce reduce);

struct TrainConfig {
  std::string layers = "784,512,512,10";
  DataSource data = DataSource::kFashion;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t synthetic_samples = 20000;
  int batch_size = 128;  // global batch
  int epochs = 20;
  int64_t steps = 0;  // > 0: train this many steps instead of --epochs
  float lr = 0.05f;
  LrSchedule lr_schedule = LrSchedule::kCosine;
  int64_t warmup_steps = 0;
  OptimizerConfig optimizer;  // kind, momentum, weight decay, betas, eps
  uint64_t seed = 0;
  bool shuffle = true;
  std::string init_weights;
  std::string save_weights;
  std::string metrics;
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;  // cuda
  bool cuda_graph = true;
  bool fused_epilogues = true;
  bool sync_debug = false;
  bool stage_from_host = false;  // cuda: keep the training set on the host
  bool autotune = false;         // cuda: time the candidate algorithms at start
  bool gpu_monitor = true;       // cuda: sample the GPU through NVML on a background thread
  int init_retries = 0;
  int threads = 0;  // CPU matrix-product threads; 0: the library's default
  int log_every = 100;
  int64_t eval_every = 0;  // > 0: test loss and accuracy every N steps
  bool quiet = false;
  // Data parallelism (under ddprun, mpirun or srun).
  Backend backend = Backend::kAuto;
  double timeout = 300;  // seconds a collective may take
  double bucket_mb = 25;
  double first_bucket_mb = 1;
  bool overlap = true;
  GradReduce grad_reduce = GradReduce::kFp32;
  bool nccl_symmetric = false;     // GPU: gradients in NCCL memory registered as a window
  std::string cache_dir;           // from the environment (ProcessEnv::cache_dir), not a flag
  bool overlap_optimizer = false;  // GPU: each parameter range updated as backward finishes it
  int product_sms = 0;             // GPU: the SMs each matrix product may use (0: all)
  // GPU: each layer's weight gradient beside its input gradient on a second stream.
  WeightGradStream weight_grad_stream = WeightGradStream::kAuto;
  bool fused_step = false;        // GPU, one GPU: the whole step as one kernel where it pays
  bool fused_step_force = false;  // --fused-step=force: also where it is slower
  int accumulate = 1;             // micro-steps per optimizer step
  // Pipeline parallelism: the world is dp x pp ranks (rank = stage * dp + replica).
  int pp = 1;             // pipeline stages
  int dp = 0;             // data-parallel replicas; 0: world / pp (checked against the world)
  int micro_batches = 0;  // per step and pipeline; 0: 4 x pp (with pp > 1)
  PipelineSchedule schedule = PipelineSchedule::kOneForwardOneBackward;
  int virtual_stages = 0;  // chunks a pipeline rank holds (0: the schedule's own number)
  bool recompute = false;  // keep a micro-batch's input only; forward it again for backward
  int zero = 0;           // ZeRO: 1 shards the optimizer state, 2 the gradients too (data parallel)
  int zero_prefetch = 1;  // --zero 3 on the GPU: layers gathered ahead of the one in use
  std::string partition;  // "0-1,2-3": layers of each stage; empty: balanced by FLOPs
  std::string timeline;   // Chrome trace of every rank's forward/backward/send/recv/all-reduce
  std::string profile_steps;  // "A-B": Nsight Systems' capture range, steps A to B (1-based)
  int64_t profile_first = 0;  // parsed from profile_steps; 0: no capture range
  int64_t profile_last = 0;
  bool check_replicas = false;  // compare every rank's weights after every step
  OnNonfinite on_nonfinite = OnNonfinite::kStop;
  int64_t max_skipped_steps = -1;  // skip-step: most skipped steps a window; -1: --log-every / 10
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // steps; 0: only at the end when a directory is given
  int keep_checkpoints = 0;      // > 0: step-numbered files, the newest K kept
  bool resume = false;
  bool fresh = false;  // without --resume: move an earlier run's checkpoints aside, not refuse
  // Faults for the tests, carried out by engine/setup/faults.h's hook, not by the loop:
  int64_t fail_at_step = 0;   // fail when this step starts, first attempt only
  int64_t step_delay_ms = 0;  // sleep this long before each step (launcher tests)
  int restart_count = 0;      // set from the launcher's environment, not a flag
  double start_time_ms = 0;   // ddprun's start, else this process's (wall clock ms); not a flag
};

// Gradient sync's options out of the flags (--zero, --bucket-mb, --first-bucket-mb, --overlap,
// --grad-reduce, --zero-prefetch).
SyncOptions sync_options(const TrainConfig& config);

// Parses argv into a config. Returns false when --help or --version was printed (the
// caller exits 0). Throws UsageError naming the flag on unknown flags or bad values.
bool parse_train_args(int argc, char** argv, TrainConfig* config);

// "cosine" or "constant", as --lr-schedule takes it.
const char* schedule_name(LrSchedule schedule);

// Micro-batches of one step: --micro-batches (4 x --pp when 0) with a pipeline, else
// --accumulate.
int micro_batches_of(const TrainConfig& config);

// Rejects values that cannot work, naming the flag, the value and what is allowed.
void validate(const TrainConfig& config);

// Every setting by its flag name (without the dashes; a "no-" switch by the setting it
// clears), for the metrics' first record. Made from the same table as the parser.
nlohmann::json config_json(const TrainConfig& config);

// The flags every rank of a job must be given alike, as "--name value" lines (config_json's
// values): all but a rank's own diagnostics, threads and injected faults (--threads, --timeout,
// --fail-at-step, ...); a path (--data-dir, --checkpoint-dir, ...) as given or not. The trainer
// compares them across ranks at set-up (check_same_settings).
std::vector<std::string> flags_that_must_match(const TrainConfig& config);
// Every flag ddptrain takes (without the dashes), in --help's order; not help and version.
std::vector<std::string> flag_names();

// One line per setting, for the start of a run's log.
std::vector<std::string> describe(const TrainConfig& config);

}  // namespace ddp
