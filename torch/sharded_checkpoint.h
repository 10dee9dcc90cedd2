// ddp::Checkpointer: sharded checkpoints for LibTorch programs (PyTorch's
// torch.distributed.checkpoint, DCP, which is Python-only): every rank writes its own pieces of
// the model, the optimizer's state and the user's extras to a safetensors file of its own, in
// parallel, and one index (index.json) says where each tensor's pieces lie; a load reads, on each
// rank, only the pieces of the elements that rank holds in its own layout (any world size, ZeRO
// level or shard units: resharding), the optimizer's state included.
//
//   ddp::Checkpointer checkpoints(world, "ckpt");              // a folder shared by the ranks
//   if (auto loaded = checkpoints.load(model, optimizer))      // the newest complete one
//     first_step = loaded->step + 1;
//   for (step = first_step; ...) {
//     ... optimizer.step();
//     if (step % 100 == 0) checkpoints.async_save(step, model, optimizer);  // blocks for a copy
//   }
//   checkpoints.wait();                                        // the last save committed
//
// The folder: step-000000100/ (index.json and rank-00000-of-00002.safetensors, ...) for each
// complete checkpoint, `latest` naming the newest. A checkpoint becomes visible only complete: its
// files are written into .step-000000100.tmp/, every rank's checked by rank 0 (each piece's
// CRC-32 in the index), then the folder renamed and `latest` replaced by a rename; the previous
// stays until then, `keep` of them stay after. A partial one (a rank killed, a disk full) is
// never loaded, and the next save removes it. A save in flight is waited for by the next save,
// by wait() and the destructor, and by SIGTERM or SIGINT (its handler says so, waits, then lets
// the signal end the process as before). Whole tensors are stored under their own names
// and listed in the index's "weight_map" (Hugging Face's model.safetensors.index.json), so that
// a checkpoint saved without ZeRO level 3 loads into Python with the safetensors package;
// scripts/consolidate-checkpoint.py joins the pieces into one model.safetensors in any case.
//
// Saved: the parameters that get gradients (as DistributedDataParallel::parameter_shards() holds
// them), the module's other parameters and buffers (rank 0's), the optimizer's per-parameter
// state (SGD's momentum, Adam's and AdamW's step and moments) under "optimizer.<parameter>.<what>",
// and the extras ("extra.<name>" tensors, rank 0's; string values in the index). The optimizer's
// options (learning rate, ...) are the program's: construct it as before and load.
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace ddp {

class DistributedDataParallel;
class Pipeline;
class World;

// The checkpointer's options.
struct CheckpointerOptions {
  // Complete checkpoints kept (the newest); older ones are removed after a save commits.
  TORCH_ARG(int, keep) = 2;
  // How long rank 0 waits for every rank's files before it gives the save up (seconds).
  TORCH_ARG(double, timeout_s) = 600;
  // The host copies (pinned for GPU tensors) kept from one save to the next and copied into
  // again (PyTorch DCP's cache_staged_state_dict): a save then allocates nothing, at the cost
  // of a host copy of this rank's state held between saves.
  TORCH_ARG(bool, keep_staging) = false;
};

// A program's own state saved with the model: tensors (rank 0's, whole) and values.
struct CheckpointExtras {
  std::map<std::string, torch::Tensor> tensors;  // "extra.<name>" in the files
  std::map<std::string, std::string> values;     // in the index's metadata
};

// What load() found and loaded.
struct LoadedCheckpoint {
  int64_t step = 0;         // the step it was saved at
  std::string path;         // its folder
  CheckpointExtras extras;  // the program's own (tensors on the CPU)
};

// The checkpointer (the top of this file). One a folder; every call collective over the world.
class Checkpointer {
 public:
  // Checkpoints in `dir` (created where missing) for the ranks of `world`.
  Checkpointer(World& world, std::string dir, CheckpointerOptions options = {});
  // Waits for a save in flight (its failure logged, not thrown).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective: `model`'s parameters, `optimizer`'s state and `extras` as checkpoint `step`;
  // returns once it is complete and visible (a ddp::Error naming what failed otherwise; the
  // previous checkpoint stays).
  void save(int64_t step, DistributedDataParallel& model, torch::optim::Optimizer& optimizer,
            const CheckpointExtras& extras = {});
  // The same for a module trained without the wrapper (one process, or every rank the same
  // values): its tensors split among the ranks to write.
  void save(int64_t step, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
            const CheckpointExtras& extras = {});
  // The same for a ddp::Pipeline: each rank its stages' parameters (as their replicas' wrappers
  // hold them), under the whole model's names, so that a pipeline's checkpoint loads into
  // DistributedDataParallel or one process and back.
  void save(int64_t step, Pipeline& pipe, torch::optim::Optimizer& optimizer,
            const CheckpointExtras& extras = {});
  // Collective: as save(), returning once the state is copied to host memory (pinned for GPU
  // tensors); a thread of this process writes the files and commits them meanwhile. A save
  // still in flight is waited for first (at most one in flight).
  void async_save(int64_t step, DistributedDataParallel& model, torch::optim::Optimizer& optimizer,
                  const CheckpointExtras& extras = {});
  // async_save() for a module trained without the wrapper.
  void async_save(int64_t step, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                  const CheckpointExtras& extras = {});
  // async_save() for a ddp::Pipeline.
  void async_save(int64_t step, Pipeline& pipe, torch::optim::Optimizer& optimizer,
                  const CheckpointExtras& extras = {});
  // Waits for the save in flight, if any; a ddp::Error naming what failed.
  void wait();

  // Collective: the newest complete checkpoint of the folder loaded into `model` (its layout
  // now: any world size, ZeRO level or units) and `optimizer` (constructed over the model's
  // parameters, before its first step); nullopt when the folder holds none. A checkpoint of
  // another model (a name, shape or dtype that differs) or optimizer is refused by name.
  std::optional<LoadedCheckpoint> load(DistributedDataParallel& model,
                                       torch::optim::Optimizer& optimizer);
  // load() into a module trained without the wrapper.
  std::optional<LoadedCheckpoint> load(torch::nn::Module& module,
                                       torch::optim::Optimizer& optimizer);

  // load() into a ddp::Pipeline (its optimizer over pipe.parameters()).
  std::optional<LoadedCheckpoint> load(Pipeline& pipe, torch::optim::Optimizer& optimizer);

  // The last save's seconds: training blocked (async_save(): the copy to host memory; save():
  // all of it), and written (from the copy to the commit).
  double last_blocked_s() const;
  // See last_blocked_s().
  double last_written_s() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
