// What a run checks, loads and makes before its trainer starts: the data set and whether the
// model fits it, the rank layout of dp x pp, whether every output can be written, the memory
// the flags ask for against what the machine has, and the rank groups' communicators
// (collective). (A stage's gradient sync: GradSync, dist/grad_sync.h.)
#pragma once

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "dist/ddp.h"
#include "engine/config.h"
#include "engine/pipeline/schedule.h"
#include "engine/runners/stage_runner.h"
#include "models/dataset.h"
#include "models/mlp.h"

namespace ddp {

// The runners' options out of the flags (sync_options() and the step's and runner's own), once:
// here rather than in engine/config.h, which stays below the runners it configures.
RunnerOptions runner_options(const TrainConfig& config);

// Checks before any training that every output this rank will write can be written:
// --save-weights and --metrics (their folder exists and takes a new file; an existing file
// is not touched), --checkpoint-dir (created if missing, and writable). Throws UsageError
// naming the flag and the path.
void check_outputs_writable(const TrainConfig& config);

// What a rank of this run holds, estimated from its flags before anything is allocated.
struct MemoryNeed {
  double model_bytes = 0;       // parameters, gradients, optimizer state (+ bf16 copy)
  double activation_bytes = 0;  // activations and their gradients
  double data_bytes = 0;        // the data set in memory (synthetic; files are sized as read)
  double total() const { return model_bytes + activation_bytes + data_bytes; }
};
MemoryNeed estimate_memory(const TrainConfig& config);
// Throws UsageError (exit 2) when `need` exceeds `available` bytes (0: unknown, not
// checked), naming the flag of the largest part, the bytes and `where` ("this machine").
void check_memory_fits(const TrainConfig& config, const MemoryNeed& need, double available,
                       const std::string& where);
// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
double available_host_bytes();

// Samples per data-parallel replica per micro-batch (--micro-batches with a pipeline, else
// --accumulate); throws UsageError naming the flags when the global batch does not divide.
int local_batch_of(const TrainConfig& config, int micro_batches, int replicas);
// How a step is cut for every stage: the model's shape, the micro-batches, this replica's
// samples of one (local_batch_of) and the largest chunk forwarded at once (evaluation).
StageSpec stage_cut(const TrainConfig& config, int replicas);
// The communicators of this rank's layout, split from the world (collective over it, in
// the same order on every rank), and host views of the device ones (bookkeeping).
struct RankGroups {
  Communicator* world = nullptr;
  std::unique_ptr<Communicator> pipe;  // this replica's stages (pp > 1)
  std::unique_ptr<Communicator> grad;  // the same ranks again, for gradients (GPU, chunks > 1)
  std::unique_ptr<Communicator> dp;    // this stage's replicas (pp > 1, dp > 1)
  // The same replicas again for --zero 3's layer gathers on the GPU (dp > 1), so that they
  // never queue behind the reduce-scatters on NCCL's stream (Reducer::set_gather_comm).
  std::unique_ptr<Communicator> gathers;
  std::unique_ptr<Communicator> host_world, host_pipe;  // where the others are NCCL's
  // Several stages a rank on the GPU: the pipeline's lanes (pipeline_lanes), those of one
  // number on one communicator of the replica's stages.
  std::vector<std::unique_ptr<Communicator>> lane_comms;
  std::map<std::tuple<bool, int, int>, Communicator*> lanes;
  // Activations forward on `pipe`, gradients back on `grad` where there is one; the lanes.
  StageLinks links() const {
    StageLinks l;
    l.activations = pipe.get();
    l.gradients = grad ? grad.get() : pipe.get();
    l.lanes = lanes;
    return l;
  }
  Communicator* replicas() const { return dp ? dp.get() : world; }
  Communicator* host() const { return host_world ? host_world.get() : world; }
  Communicator* host_pipeline() const { return host_pipe ? host_pipe.get() : pipe.get(); }
  // Aborts every one of them (a stalled GPU step).
  std::function<void()> abort_all() const;
};
RankGroups make_rank_groups(Communicator* world, const PipelineLayout& layout, bool gpu,
                            bool layer_gathers = false);

// --check-replicas: throws (naming the replica and the stage) when this stage's replicas
// hold different weights after step `step` (collective over `replicas`).
void check_replicas_agree(Communicator& replicas, const float* params, size_t count, int64_t step,
                          const PipelineLayout& layout);

// Throws NonFiniteError when a logging window of `steps` steps up to `step` skipped more
// (--on-nonfinite skip-step) than --max-skipped-steps allows (default: a tenth of the window).
void check_skipped_steps(const TrainConfig& config, int64_t skipped, int64_t steps, int64_t step);

// The whole model as stage 0 of 1 with one activation slot (no pipeline), cut as stage_cut:
// the stage a GPU runner made before the trainer holds.
StageSpec whole_model_spec(const TrainConfig& config, int replicas);

// Loads the dataset that `config` names (fashion, npy or synthetic).
Dataset load_dataset(const TrainConfig& config);

// Throws UsageError naming --layers when the model's input width or class count does not
// fit the data.
void check_model_fits_data(const MlpShape& shape, const TrainConfig& config, const Dataset& data);

// The rank layout of `world` ranks for this rank: stages (--pp, --partition or balanced by
// FLOPs), replicas (--dp, checked against world / pp). Throws UsageError naming the flags.
PipelineLayout layout_of(const TrainConfig& config, int world, int rank);

}  // namespace ddp
