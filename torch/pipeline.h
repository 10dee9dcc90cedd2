// ddp::Pipeline: pipeline parallelism for a LibTorch torch::nn::Sequential, on ddp's schedules
// (GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V: engine/pipeline's tables, lowering and
// executor, the ones ddptrain runs), as torch.distributed.pipelining does it for Python. The
// user's loop and optimizer stay LibTorch's:
//
//   ddp::World world = ddp::init();                       // one process a pipeline rank
//   ddp::Pipeline pipe(seq, world, ddp::PipelineOptions().micro_batches(8).schedule("zb-v"));
//   torch::optim::SGD optimizer(pipe.parameters(), 0.01);  // this rank's stages' parameters
//   ...  optimizer.zero_grad();
//        torch::Tensor loss = pipe.step(x, y, loss_fn);    // x read on the first stage's rank,
//        optimizer.step();                                 // y on the last's; the mean loss there
//
// The model's modules are cut into P x V stages in order (PipelineOptions::balance, else as
// evenly as their count allows), P being the group's ranks and V the stages a rank (interleaved
// 1F1B: 2 unless asked; ZB-V: 2, in a V; else 1). Each rank keeps its stages' modules (the user's
// own, not copies: their parameters are the ones the optimizer steps); the other stages'
// parameters are freed there at construction (empty tensors), so that a whole-model forward or
// torch::save on one rank fails at first use rather than using weights nobody trains. step() cuts
// the batch into micro-batches along dimension 0 (Tensor::tensor_split), runs the rank's action
// list of the schedule, and leaves in each parameter's .grad() the gradient of the batch's mean
// loss (loss_fn's mean over a micro-batch weighted by its samples), added to what .grad() held, as
// backward() does: zero them between steps as usual. Activations and their gradients travel
// between ranks over ddp's point-to-point operations (Gloo or MPI for CPU tensors, NCCL for
// CUDA ones), a communicator a flow, direction and peer; their shapes and dtypes go with the
// first step's messages and are kept (a later step whose shapes differ is an error naming the
// stage and both shapes). The zero-bubble schedules split each backward in two with LibTorch's
// autograd, as pipelining's stage_backward_input and stage_backward_weight: the input half
// differentiates the stage's output by its input and every module's input, the weight half
// then each module's parameters from its output's gradient (within one child module, the
// gradients of its inner activations are computed again in the weight half).
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "dist/world.h"
#include "torch/comm_hooks.h"
#include "torch/distributed_data_parallel.h"

namespace ddp {

// How the pipeline is cut and scheduled (chained setters as LibTorch's options).
struct PipelineOptions {
  // gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-v (ddptrain's --schedule names).
  TORCH_ARG(std::string, schedule) = "1f1b";
  // Micro-batches a step (the batch is cut into as many along dimension 0).
  TORCH_ARG(int, micro_batches) = 4;
  // Stages a rank: 0 for the schedule's own (interleaved-1f1b: 2, zb-v: 2, else 1).
  TORCH_ARG(int, stages_per_rank) = 0;
  // Modules in each stage, in order (P x V entries, each at least 1, summing to the model's);
  // empty: as even as the count allows, the first stages taking one more.
  TORCH_ARG(std::vector<int>, balance) = {};
  // Keep only each stage's input between a micro-batch's forward and backward, and forward it
  // again with gradients right before its backward (activation recomputation).
  TORCH_ARG(bool, recompute) = false;
  // Replicas of the whole pipeline (dp x pp, the World's ranks being dp x P): world rank r is
  // pipeline rank r / D of replica r % D (ddptrain's order: a stage's replicas side by side, so
  // that their all-reduce stays among neighbouring ranks). Each replica steps on its own batch;
  // each stage is wrapped by a ddp::DistributedDataParallel over its replicas (the same stage's
  // ranks of every replica), which gives them replica 0's parameters at construction and averages
  // the gradients: the step's micro-batches accumulate under no_sync, and the last one's backward
  // sends its buckets out as its gradients are written, while the schedule goes on, waited for
  // at the step's end.
  TORCH_ARG(int, data_parallel) = 1;
  // The stages' wrappers' options (bucket caps, reduce_in_bf16, find_unused_parameters,
  // static_graph, zero; broadcast_buffers is off unless asked, as the pipeline's buffers stay
  // each replica's). With zero(N) each stage is sharded over its replicas as DDP's ZeRO does
  // (bitwise the same weights, the optimizer state a share); the parameters are gathered at
  // each step's start and before forward(), which is then collective over the replicas too.
  TORCH_ARG(DistributedDataParallelOptions,
            data_parallel_options) = DistributedDataParallelOptions().broadcast_buffers(false);
};

// Pipeline parallelism over a Sequential (the top of this file).
class Pipeline {
 public:
  // The loss of a micro-batch: the mean over its samples of the last module's `output` against
  // `target` (torch::nn::functional::cross_entropy, mse_loss, ...).
  using LossFn =
      std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

  // Every rank of `world` a pipeline rank, or with data_parallel(D) D pipelines of world / D
  // ranks each (collective: it makes the pipeline's communicators). UsageError for options
  // that do not fit the model or the world.
  Pipeline(torch::nn::Sequential model, World& world, const PipelineOptions& options = {});
  // The pipeline over `group`'s ranks, its stages' gradients averaged over `replicas` (null: one
  // replica; else the same stage's ranks of every replica, in replica order).
  Pipeline(torch::nn::Sequential model, Communicator& group, Communicator* replicas,
           const PipelineOptions& options = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // One training step (collective over the pipeline): `input` (the whole batch; read on the
  // first stage's rank, any tensor elsewhere) and `target` (read on the last stage's rank).
  // Returns the batch's mean loss on the last stage's rank (a 0-dim tensor on the model's
  // device, not waited for), an undefined tensor on the others.
  torch::Tensor step(const torch::Tensor& input, const torch::Tensor& target, const LossFn& loss);

  // Evaluation (collective over the pipeline): `input` (read on the first stage's rank) through
  // every stage without gradients, in micro_batches pieces; returns the model's output on the
  // last stage's rank, an undefined tensor on the others. The modules' train/eval mode is the
  // user's (model->eval()).
  torch::Tensor forward(const torch::Tensor& input);

  // A communication hook for every stage's data-parallel buckets on this rank (as
  // DistributedDataParallel::register_comm_hook; before the first step): bf16_compress_comm_hook()
  // and the others. A stateful hook (PowerSGD) takes one stage a rank. No effect without replicas.
  void register_comm_hook(TorchCommHook hook);
  // Records what the stages' data-parallel wrappers do (DistributedDataParallel::record_events).
  void record_events(bool on);
  // Each wrapped stage's record on this rank, in stage order (none without replicas).
  std::vector<std::vector<DdpEvent>> events() const;
  // After step(), before the optimizer's: the norm of the whole model's gradient (every stage
  // counted once, its replicas' ZeRO shares combined) and every stage's gradients scaled by
  // max_norm / (norm + 1e-6) where that is below 1, as torch::nn::utils::clip_grad_norm_ on the
  // whole model in one process (collective over the pipeline and its replicas). Returns the
  // norm on every rank. LibTorch's own on parameters() would take this rank's stages for the
  // model.
  double clip_grad_norm_(double max_norm, double norm_type = 2.0);
  // The parameters of this rank's stages (for its optimizer), in the model's order.
  std::vector<torch::Tensor> parameters() const;
  // Each parameter of this rank's stages that gets gradients as it holds it between steps
  // (ddp::Checkpointer saves and loads these), under the whole model's names: as a replicated
  // stage's wrapper holds it (DistributedDataParallel::parameter_shards()), else whole.
  std::vector<ParameterShard> parameter_shards() const;
  // The other tensors of this rank's stages (buffers, parameters without gradients) under the
  // whole model's names.
  std::vector<std::pair<std::string, torch::Tensor>> other_tensors() const;
  // After a load wrote the values of parameter_shards(): each replicated stage's next step
  // starts from them (DistributedDataParallel::shards_written()).
  void shards_written();
  // What this rank's stages keep alive (DistributedDataParallel::memory() summed over its
  // wrapped stages; an unwrapped stage's parameter bytes), the last step's peak included.
  ShardedMemory memory() const;
  // The stage indices this rank runs, in order.
  std::vector<int> stages() const;
  // Whether this rank runs the first stage (it reads step()'s input).
  bool has_first() const;
  // Whether this rank runs the last stage (it reads step()'s target and returns the loss).
  bool has_last() const;
  // This rank's replica (its index among data_parallel()'s): the replica's share of the data is
  // its to give to step().
  int replica() const;
  // How many replicas of the pipeline there are (data_parallel()).
  int replicas() const;
  // "zb-v over 2 ranks, 4 stages (modules 0-2, 3-4, 5-6, 7-8), 8 micro-batches; rank 0 runs
  // stages 0 and 3".
  std::string describe() const;
  // The simulator's prediction for this pipeline (unit costs, F = B = 2 W) and, once a second
  // step has run, the measured step time: "the simulator's bubble 12.5 %; step 34.1 ms".
  // Logged once by the pipeline's rank 0 after its second step.
  std::string report() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
