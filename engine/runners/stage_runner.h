// What the trainer asks of the device that runs its pipeline stage: per micro-batch the
// stage's forward, loss and backward (activations kept in slots), the transfers to its
// neighbouring stages, the optimizer, and host copies of its weights for checkpoints. The
// trainer's one schedule executor (Trainer::run_schedule) drives either runner: the CPU one
// (CpuStage, OpenBLAS, Gloo or MPI), the GPU pipeline stage's (CudaStage, cuBLASLt, NCCL, the
// step captured in a CUDA graph) or, without a pipeline, the whole model's on the GPU (one
// CudaStage of every layer, fed chunks of steps by a BatchFeeder).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/param_store.h"
#include "engine/pipeline/schedule.h"
#include "engine/pipeline/stage.h"
#include "engine/runners/runner_options.h"
#include "engine/telemetry/compute_costs.h"
#include "engine/telemetry/timeline.h"
#include "models/cpu_ops.h"
#include "models/dataset.h"
#include "models/mlp.h"
#include "models/optimizer.h"
#include "runtime/error.h"

namespace ddp {

class Reducer;

// Which layers a stage runs and how a step is cut.
struct StageSpec {
  MlpShape shape;
  int first = 0;  // layers [first, end)
  int end = 0;
  int stage = 0;  // index in the pipeline, and how many stages it has
  int stages = 1;
  int rank = 0;        // the pipeline rank that runs it (its index in the pipeline group)
  int prev_rank = -1;  // the pipeline ranks of the stages before and after it (-1: none)
  int next_rank = -1;
  int micro_batches = 1;  // per step
  int batch = 0;          // samples of one micro-batch on this replica
  int max_batch = 0;      // the largest chunk forwarded at once (evaluation)
  int slots = 1;          // micro-batches whose activations are held at once
  int replicas = 1;       // the stage's data-parallel group
  bool is_first() const { return first == 0; }
  bool is_last() const { return end == shape.num_layers(); }
  int in_width() const { return shape.widths()[first]; }
  int out_width() const { return shape.widths()[end]; }
  size_t param_offset() const { return shape.params_offset(first); }
  size_t param_count() const { return shape.params_count(first, end); }
};

// The stages one pipeline rank runs: one, or several (interleaved-1f1b, zb-v) in stage order.
// The rank's flat parameters are their slices of the model's, one after the other.
struct RankStages {
  std::vector<StageSpec> chunks;
  const MlpShape& shape() const { return chunks.front().shape; }
  bool has_first() const { return chunks.front().is_first(); }
  bool has_last() const { return chunks.back().is_last(); }
  size_t param_count() const;
  // Where chunk c's parameters start in the rank's flat buffer.
  size_t offset_of(int chunk) const;
  // The rank's parameters out of the whole model's flat buffer, and back into it.
  std::vector<float> take(const float* whole) const;
  void put(const float* mine, float* whole) const;
  // Index i of the rank's buffer in the model's flat buffer.
  size_t model_index(size_t i) const;
  // Every layer's weights and bias as a span (offset, count) of the rank's buffer, in stage
  // order (the data-parallel buckets' layers).
  std::vector<std::pair<size_t, size_t>> layer_spans() const;
  uint64_t fingerprint() const;  // the shape and the layers held
  // Each stage's place, as the schedule executor takes them.
  std::vector<StagePlace> places() const;
};

// The stages pipeline rank `pipe_rank` runs under `layout`, each cut as `cut` says (its
// shape, micro-batches, batch, max_batch and slots; the rest is filled in). Pure.
RankStages rank_stages(const PipelineLayout& layout, int pipe_rank, const StageSpec& cut);

// The whole model's first weights, as one process makes them: read from `init_weights`
// (--init-weights) where given, else seeded initialisation; a weight that is not finite is a
// UsageError naming the file and index.
std::vector<float> initial_weights(const std::string& init_weights, uint64_t seed,
                                   const MlpShape& shape);

// The buckets of the rank's stages' data parallelism, planned once from their layers and the
// sync options (a bucket a layer where layers are gathered): what the runner's gradient ring,
// the stages' Reducer and the sharded state's pieces are all cut from
// (ReplicaStore::bucket_plan()).
BucketPlan stage_bucket_plan(const RankStages& stages, const SyncOptions& sync);

// The neighbours a stage talks to: activations go forward on `activations`, gradients back
// on `gradients` (the same communicator on the CPU; two on the GPU, so that NCCL's queue of
// forward transfers never waits behind a backward one). Null without a pipeline.
// With several stages a rank on the GPU, each flow between two pipeline ranks in each
// direction has a lane of its own (`lanes`): NCCL completes a communicator's transfers in the
// order they were posted, and a rank's receive must not queue behind its own send to a rank
// that is not yet receiving (the simulator's rendezvous model, a lane a flow, direction and
// peer, which every schedule is checked under).
struct StageLinks {
  Communicator* activations = nullptr;
  Communicator* gradients = nullptr;
  // (activations?, from pipeline rank, to pipeline rank) -> its communicator
  std::map<std::tuple<bool, int, int>, Communicator*> lanes;
  // Where one flow's messages from `from` to `to` travel: their lane, else the flow's.
  Communicator* lane(bool activation, int from, int to) const {
    const auto it = lanes.find({activation, from, to});
    if (it != lanes.end()) return it->second;
    return activation ? activations : gradients;
  }
};

// How a runner carries out a step: the schedule's actions one by one (the CPU; the GPU's
// pipeline stages and accumulation), or the fused step (the whole model on one GPU, where it
// applies); eagerly, or captured once and replayed from a CUDA graph.
struct StepStrategy {
  bool fused = false;
  bool graph = false;
  // "schedule, eager", "fused step, CUDA graph", ...
  std::string name() const {
    return std::string(fused ? "fused step" : "schedule") + (graph ? ", CUDA graph" : ", eager");
  }
};

// The MLP's stages of one pipeline rank on the CPU or the GPU: the executor's PipelineRank
// (on_gpu, chunk, grads, stream, end_schedule) and what the trainer asks besides.
class StageRunner : public PipelineRank {
 public:
  // The stages' parameters as gradient sync sets them up and keeps them (GradSync): their
  // buckets, memory, model check and state, whole or sharded. Its gradients:
  // PipelineRank::grads().
  virtual ReplicaStore& param_store() = 0;
  // Host copies of the stage's parameters and optimizer state (its slice of the model).
  virtual std::vector<float> get_params() = 0;
  virtual void set_params(const float* host) = 0;
  virtual NamedState optimizer_state() = 0;
  virtual void set_optimizer_state(const NamedState& state, int64_t steps) = 0;
  virtual int64_t optimizer_steps() const = 0;

  // Steps: begin_steps with this replica's samples of the next `steps` steps (each step's
  // micro-batches in turn, batch samples each) and their learning rates, the first of them
  // being step `first_step` (0-based); `steps` is at most steps_ahead(), and 1 unless a
  // runner takes more (the whole model on one GPU uploads a chunk at once and waits for the
  // device once per chunk). Then, for each step, inside run_step's `enqueue`: the schedule's
  // actions, end_schedule() and optimizer_step().
  virtual int steps_ahead() const = 0;
  virtual void begin_steps(const int32_t* indices, const float* lrs, int64_t first_step,
                           int steps) = 0;
  // The most micro-batches whose activations the runner held at once (forwarded, their
  // weight gradients not yet written) in any step so far, as it counted them; -1 where it
  // does not count (the GPU's: its slots are the schedule's plan).
  virtual int peak_held_activations() const = 0;
  // The most bytes of layer outputs it held at once for the micro-batches in flight (with
  // --recompute: their inputs and one working set), as it counted them; -1 where not counted.
  virtual int64_t peak_activation_bytes() const = 0;
  // Whether any gradient is NaN or Inf (host runners; the GPU stops on the loss instead).
  virtual bool grads_nonfinite() = 0;
  virtual void optimizer_step() = 0;
  // Runs `enqueue` (the CPU: at once). The GPU: the first step eagerly, the second captured
  // in a CUDA graph, later ones replayed from it without calling `enqueue`; then waits for
  // the step, bounded by --timeout.
  virtual void run_step(int64_t step, const std::function<void()>& enqueue) = 0;
  // How a step runs, decided when the first one begins (StepStrategy): the schedule's actions
  // or the fused step, and whether replayed from a CUDA graph.
  virtual StepStrategy step_strategy() const = 0;
  // The device's compute time (forwards and backwards) of the last step, in seconds, or -1
  // when the host's clock measured it (the CPU).
  virtual double last_busy_s() const = 0;
  // The same by kind, added to `costs`; false where the host's clock measured them (the CPU).
  virtual bool last_costs(ComputeCosts* costs) const = 0;
  // The device's spans of the last step (forwards and backwards, from its events) into
  // `timeline`; the CPU's are the host's, recorded by the trainer.
  virtual void add_device_spans(TimelineRecorder& timeline, int64_t step) = 0;
  // A runner made before the data and the communicators were ready (the GPU's) takes them
  // here, from the trainer's constructor; the CPU's took them when made. `world` names a
  // stuck step in messages; `abort_all` aborts every communicator of the job when a step
  // stalls past --timeout.
  virtual void attach(const Dataset& data, StageLinks links, Communicator* world,
                      std::function<void()> abort_all) = 0;
  // Sets the initial weights itself (the GPU makes them on the device, bitwise the host's,
  // or reads --init-weights while it builds) and returns true; false: the trainer makes
  // them on the host and calls set_params().
  virtual bool initial_params() = 0;
  // --profile-steps: opens (true) or closes a CUDA profiler capture range once the work
  // before it is done. The GPU's only (validate() refuses the flag elsewhere).
  virtual void profile(bool on) = 0;
  // What the device holds, for the log and the metrics' "memory" record (empty on the CPU).
  virtual std::string memory_report() const = 0;
  virtual int64_t held_bytes() const = 0;
  // The same by kind ("parameters", "gradients", "optimizer state", ...), bytes.
  virtual std::vector<std::pair<std::string, int64_t>> held_by_kind() const = 0;
  // Training loss sums kept on the device since the last call (the CPU keeps none).
  virtual LossSum take_loss() = 0;
  // Loss sum and hits over samples [begin, end) of `split`, forwarded through the pipeline
  // in chunks of max_batch: the last stage's sums, zero on the others.
  virtual LossSum evaluate(const Split& split, int64_t begin, int64_t end) = 0;
};

std::unique_ptr<StageRunner> make_cpu_runner(const RankStages& stages, const RunnerOptions& options,
                                             const Dataset& data, StageLinks links);
// The GPU runner of a rank's stages on this process's GPU, for every layout (without a
// pipeline the whole model, stage 0 of 1, with chunks of steps, host staging, autotuned plans
// and the per-layer GPU timeline): a CudaStage a stage (several sharing the rank's stream and
// flat buffers), fed by a BatchFeeder, the step captured in a CUDA graph, the optimizer
// overlapped with backward when asked. Made before the data and the communicators are ready
// (the whole model's plans and autotuning run while they load and start); the trainer
// attaches them. Only with CUDA (else a UsageError that says so).
std::unique_ptr<StageRunner> make_gpu_runner(const RankStages& stages,
                                             const RunnerOptions& options);

}  // namespace ddp
