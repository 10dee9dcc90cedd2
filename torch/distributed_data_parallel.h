// ddp::DistributedDataParallel: data parallelism for a LibTorch torch::nn::Module, as PyTorch's
// DistributedDataParallel does it for Python, over the World of ddp::init() (Gloo or MPI for CPU
// tensors, NCCL for CUDA tensors). The user's loop stays LibTorch's:
//
//   ddp::World world = ddp::init();
//   ddp::DistributedDataParallel model(net, world);   // every rank now holds rank 0's weights
//   torch::optim::SGD optimizer(net->parameters(), 0.01);
//   ...  optimizer.zero_grad(); auto loss = loss_fn(model.forward(x), y);
//        loss.backward(); optimizer.step();          // nothing between them
//
// At construction every rank gets rank 0's parameters and buffers, after a check that the
// ranks' modules have the same parameters and buffers (names, shapes, dtypes), the first
// difference named on every rank. Gradients live in buckets over the parameters in reverse order
// of registration (options: 25 MiB, the first 1 MiB); each parameter's .grad() is a view into
// its bucket's buffer (PyTorch's gradient_as_bucket_view), so nothing is copied. Parameters may
// be float32, float64, bfloat16 or float16, mixed in one module: a bucket holds one dtype and is
// averaged in it (as PyTorch's: bf16 and fp16 sums round to their dtype), the buckets of each
// dtype cut as PyTorch cuts them and reduced in the order backward completes them. A hook on each
// parameter's gradient accumulator marks it ready; a bucket's all-reduce (the average over
// ranks) starts once all of its parameters are, during backward; the autograd engine's final
// callback starts what is left and waits for all of them before backward() returns (CUDA: the
// current stream waits, the host does not). A job of one process reduces nothing: the hooks
// only check that every parameter got its gradient, which stays where LibTorch wrote it.
//
// ZeRO (DistributedDataParallelOptions().zero(1), 2 or 3; PyTorch's ZeroRedundancyOptimizer and
// FSDP's SHARD_GRAD_OP and FULL_SHARD in their memory of state, gradients and parameters between
// steps) on dist/'s sharded state (torch/torch_params.h): at levels 1 and 2 each parameter is owned
// by one rank (whole tensors; each bucket's split into runs of about equal size). After the
// reduction a rank keeps the averaged gradients of its own parameters only, so the user's unchanged
// LibTorch optimizer steps those alone and keeps state for about 1/N of the model (LibTorch's
// optimizers skip a parameter without a gradient); the owners' new values reach every rank by one
// all-gather a bucket before the next forward (forward(), sync_buffers() or gather_parameters()).
// Every level reduce-scatters each bucket (a communication hook keeps the all-reduce), about plain
// DDP's bytes on the wire; ZeRO 2 and 3 free the full gradient buffer between steps. ZeRO 3
// (FSDP's FULL_SHARD) cuts each bucket into equal pieces instead: between steps a parameter is
// this rank's piece of it (1-D, maybe empty) and its gradient the averaged piece, which the
// optimizer steps element-wise; with shard units (torch/shard_unit.h, auto_wrap_min_params) a
// unit at a time is gathered for its forward and again for its backward, and its gradients are
// reduce-scattered and freed as its backward ends, so that the peak is the share and a few units.
// What each level saves at a step's peak (not only between steps): 1 about half the optimizer
// state at 2 ranks (the gradients stay whole); 2 that, the gradients only between steps (the
// buffer is reallocated for each backward); 3 that, the parameters only between steps (the
// whole model is gathered for the step); 3 with units the parameters and gradients during the
// step too. A 1 B-parameter model with AdamW at 2 ranks on an H100: 0.88x, 0.99x, 1.00x and
// 0.52x plain DDP's peak (docs/PERFORMANCE.md). Optimizers that step element-wise only (SGD,
// Adam, AdamW, Adagrad, RMSprop): LBFGS's search over the whole flattened gradient would see a
// rank's share (level 3) and is not supported.
// Every level trains bitwise as plain DistributedDataParallel on as many ranks over the host
// backends (each element summed in rank order) and over NCCL with two ranks; with more, NCCL's
// reduce-scatter sums in another order than its all-reduce.
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dist/ddp.h"
#include "dist/world.h"
#include "torch/comm_hooks.h"

namespace ddp {

// How DistributedDataParallel buckets and reduces (PyTorch's constructor arguments; chained
// setters as LibTorch's options: DistributedDataParallelOptions().bucket_cap_mb(50)).
struct DistributedDataParallelOptions {
  // A bucket's size (MiB), as PyTorch's bucket_cap_mb.
  TORCH_ARG(double, bucket_cap_mb) = 25;
  // The first bucket's (the last parameters'), so that communication starts early.
  TORCH_ARG(double, first_bucket_cap_mb) = 1;
  // A parameter that gets no gradient in a backward has its bucket reduced all the same (its
  // part zero); without it, such a parameter is an error naming it. When forward() returns, the
  // parameters its output does not depend on (a walk of the autograd graph, as PyTorch's) are
  // marked unused as backward starts, so that their buckets hold no other back; a small
  // all-reduce at the end of each backward (and on the GPU the host's wait for it) tells which
  // no rank used.
  TORCH_ARG(bool, find_unused_parameters) = false;
  // The autograd graph is the same every step (PyTorch's static_graph): the first step records
  // which parameters get no gradient (on any rank, once); from the second on they are marked
  // unused as backward starts, with neither the graph walk nor the all-reduce of
  // find_unused_parameters (which it implies). A later step where another parameter gets no
  // gradient, or one of them gets one, is an error naming it.
  TORCH_ARG(bool, static_graph) = false;
  // Rank 0's buffers (running statistics) copied to every rank before each forward
  // (DistributedDataParallel::forward, or sync_buffers() before one's own forward).
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Float32 gradients travel as bfloat16 (half the bytes; PyTorch's bf16_compress_hook, and
  // bitwise ddp's): NCCL, Gloo and MPI.
  TORCH_ARG(bool, reduce_in_bf16) = false;
  // Start each bucket's all-reduce as soon as its gradients are written (else all of them when
  // backward ends; for comparisons).
  TORCH_ARG(bool, overlap) = true;
  // ZeRO (the top of this file): 0 plain, 1 optimizer state sharded, 2 and gradients, 3 and
  // parameters. No effect on a job of one process.
  TORCH_ARG(int, zero) = 0;
  // zero(3), a wrapper made from a Sequential: its children grouped in order into shard units
  // (torch/shard_unit.h) of at least this many parameter elements each (PyTorch FSDP's
  // size_based_auto_wrap_policy; 1: each child with parameters a unit); 0: none but the
  // ddp::ShardUnit modules declared in the model.
  TORCH_ARG(int64_t, auto_wrap_min_params) = 0;
  // zero(3) with units: a unit's gathered parameters freed after its forward and gathered again
  // for its backward (FSDP2's reshard_after_forward); false keeps them from its forward to the
  // end of its backward (one gather a step, more memory).
  TORCH_ARG(bool, reshard_after_forward) = true;
  // zero(3): the float32 parameters gathered as this dtype (torch::kBFloat16 or torch::kHalf)
  // for forward and backward, all-gathered in it (half the bytes), their float32 pieces the
  // master the optimizer steps; the gradients reach them as float32 (FSDP2's
  // MixedPrecisionPolicy(param_dtype); its reduce_dtype bfloat16 is reduce_in_bf16(true)).
  // Unset: as they are. No effect on a job of one process, as zero.
  TORCH_ARG(c10::optional<torch::ScalarType>, param_dtype) = c10::nullopt;
};

// A parameter's part this rank holds between steps (what ddp::Checkpointer saves and loads).
struct ParameterShard {
  std::string name;                         // the module's name for the parameter
  std::vector<int64_t> shape;               // the whole parameter's
  torch::ScalarType dtype = torch::kFloat;  // its dtype
  int64_t offset = 0;                       // the first element here, in the flattened whole
  torch::Tensor values;     // this rank's elements (1-D), its own memory: a load writes them
  torch::Tensor parameter;  // the module's tensor (the key of its optimizer state)
  bool steps = true;        // this rank's optimizer steps these elements (keeps their state)
  bool writes = true;       // this rank writes them to a checkpoint (one of those holding them)
  std::vector<int64_t> state_shape;  // the shape the optimizer steps (and its state has)
};

// What the module's parameters and gradients keep alive on this rank now, in bytes (each
// storage once: a bucket's gradients count as the whole flat buffer they are views of).
struct ShardedMemory {
  size_t parameter_bytes = 0;  // the parameters' storages
  size_t gradient_bytes = 0;   // the gradients' storages (.grad())
  // The last synchronised step's peak (from its forward to the end of its backward) of the
  // parameters' and the gradients' memory ddp holds: with zero(3) this rank's pieces and the
  // units gathered, the gradient buffers allocated and the averaged pieces.
  size_t peak_parameter_bytes = 0;
  size_t peak_gradient_bytes = 0;  // (the gradients' part of that peak)
};

// The bytes of an optimizer's per-parameter state (SGD's momentum, Adam's and AdamW's moments,
// Adagrad's sums, RMSprop's averages): with ZeRO about 1/N of plain data parallelism's.
// UsageError for another optimizer's state.
size_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

// Data parallelism over a LibTorch module (the top of this file).
class DistributedDataParallel {
 public:
  // Any module; forward is the module's own, preceded by sync_buffers(). Collective.
  DistributedDataParallel(torch::nn::Module& module, World& world,
                          const DistributedDataParallelOptions& options = {});
  // Over `group`, a communicator of one's own split from the world's (PyTorch's process_group):
  // the gradients are averaged over its ranks only. Collective over them. ddp::Pipeline wraps
  // each stage so over the same stage's ranks of every replica.
  DistributedDataParallel(torch::nn::Module& module, Communicator& group,
                          const DistributedDataParallelOptions& options = {});
  // A module holder (torch::nn::Linear, TORCH_MODULE(Net)'s Net, torch::nn::Sequential) or a
  // shared_ptr of a module: the same, and forward(args...) calls the module's forward with the
  // buffers synced first (a Sequential's as Tensor -> Tensor: its forward is a template).
  template <typename Holder, typename = decltype(std::declval<Holder&>().ptr())>
  DistributedDataParallel(Holder& module, World& world,
                          const DistributedDataParallelOptions& options = {})
      : DistributedDataParallel(*module.ptr(), world, options) {
    keep_forward(module.ptr());
  }
  // A shared_ptr of a module (std::make_shared<NetImpl>()).
  template <typename Module,
            typename = std::enable_if_t<std::is_base_of_v<torch::nn::Module, Module>>>
  DistributedDataParallel(const std::shared_ptr<Module>& module, World& world,
                          const DistributedDataParallelOptions& options = {})
      : DistributedDataParallel(*module, world, options) {
    keep_forward(module);
  }
  // Removes its hooks from the module's parameters.
  ~DistributedDataParallel();
  // Moves the wrapper (its hooks stay valid).
  DistributedDataParallel(DistributedDataParallel&&) noexcept;
  // Moves the wrapper (its hooks stay valid).
  DistributedDataParallel& operator=(DistributedDataParallel&&) noexcept;

  // sync_buffers(), then the module's forward (made from a holder or shared_ptr whose module
  // has one forward). Returns what it returns (torch::Tensor unless asked otherwise).
  template <typename Return = torch::Tensor, typename... Args>
  Return forward(Args&&... args) {
    sync_buffers();
    Return out = forward_module().template forward<Return>(std::forward<Args>(args)...);
    std::vector<torch::Tensor> tensors;
    collect_tensors(out, tensors);
    if (!tensors.empty()) prepare_for_backward(tensors);
    return out;
  }
  // With find_unused_parameters: the parameters that `outputs` (what the loss is computed from)
  // do not depend on are marked unused when the next backward starts, so that their buckets
  // hold no other back (forward() calls it with the module's output; after a forward of one's
  // own, call it with the outputs). Several calls before one backward: the parameters none of
  // them depends on. Without it, or under no_sync(), nothing to do.
  void prepare_for_backward(const std::vector<torch::Tensor>& outputs);
  // Collective: every rank's buffers become rank 0's (where broadcast_buffers and the module
  // has buffers), and with ZeRO the parameters their owners' (gather_parameters()). Call it
  // before each forward of one's own; forward() does.
  void sync_buffers();
  // Collective, with ZeRO: every rank's module holds the full parameters as their owners
  // updated them (ZeRO 3 until the next synchronised backward ends); before torch::save on
  // rank 0, or an evaluation that does not go through forward(). Without ZeRO nothing to do.
  void gather_parameters();
  // Collective, with shard units (zero(3) over several ranks), after sync_buffers() or
  // forward()'s start of a step (FSDP2's unshard(async_op=True)): every unit's gather issued now
  // (each waited for at the unit's use) and the units kept gathered until reshard() or the end
  // of the next synchronised backward, so that the forwards and backwards in between (a
  // pipeline stage's micro-batches, gradient accumulation) gather each unit once.
  // ddp::Pipeline calls it at the schedule's UNSHARD of a stage. Without units nothing to do.
  void unshard();
  // After a synchronised backward (the gradients averaged), before the optimizer's step: the
  // norm of the whole model's gradient (norm_type p > 0, or INFINITY for the largest element)
  // and every gradient scaled by max_norm / (norm + 1e-6) where that is below 1, as
  // torch::nn::utils::clip_grad_norm_ (PyTorch's semantics) in one process with the whole
  // model. Returns the norm. With ZeRO a rank holds its own parameters' gradients (or its pieces)
  // only: the parts are combined by one small all-reduce (collective then), so that every rank
  // clips by the same factor. LibTorch's own clip_grad_norm_ on the module would take this
  // rank's part for the whole and each rank would clip by its own factor.
  double clip_grad_norm_(double max_norm, double norm_type = 2.0);
  // With shard units (FSDP2's reshard()): every unit's gathered parameters freed (waited for
  // first where a gather is in flight), each gathered again at its next use. ddp::Pipeline
  // calls it at the schedule's RESHARD, after the stage's last use of its parameters in a step.
  void reshard();

  // While the returned guard lives, backward passes accumulate gradients locally (no
  // communication); the first backward after it reduces the sum (gradient accumulation, as
  // PyTorch's no_sync()).
  class NoSync {
   public:
    // Backward passes of `owner` accumulate locally from now on.
    explicit NoSync(DistributedDataParallel& owner);
    // As before the guard.
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& owner_;
    bool was_;
  };
  // A guard (above): `{ auto guard = model.no_sync(); loss.backward(); }`.
  NoSync no_sync() { return NoSync(*this); }

  // The module it wraps.
  torch::nn::Module& module();
  // The buckets, in the order they are reduced (last parameters first); layer i of a Bucket is
  // the parameter parameter_names()[i].
  const std::vector<Bucket>& buckets() const;
  // The names of the parameters that get gradients, in the buckets' order: registration order
  // where they have one dtype; with several, grouped so that each bucket holds one dtype.
  std::vector<std::string> parameter_names() const;
  // Each bucket reduced by `hook` (above) instead of the averaging all-reduce, from the next
  // backward; once a model, between steps (as PyTorch's register_comm_hook).
  void register_comm_hook(TorchCommHook hook);
  // Collective: runs `loop` (this rank's training loop) so that ranks with fewer batches than
  // the others finish together (PyTorch's Join / model.join()): while a rank still trains, each
  // forward() or sync_buffers() tells the others; once `loop` returns, this rank takes part in
  // the others' steps (the buffers' broadcast, each bucket's all-reduce with zeros) until every
  // rank's loop has returned; then every rank gets the parameters and buffers of the rank that
  // trained the most steps. Gradients stay averaged over all ranks (PyTorch's default,
  // divide_by_initial_world_size). Not with ZeRO. Without it, a rank that stops early makes the
  // others' next collective fail naming it.
  void join(const std::function<void()>& loop);
  // The names of the parameters this rank owns with ZeRO (their optimizer state and update);
  // every parameter that gets gradients without it.
  std::vector<std::string> owned_parameter_names() const;
  // What the parameters and gradients hold on this rank now (ShardedMemory).
  ShardedMemory memory() const;
  // Each parameter that gets gradients as this rank holds it between steps (after the
  // optimizer's step): whole without ZeRO and at levels 1 and 2 (there the owner alone steps
  // it), this rank's piece at level 3 (each element on one rank).
  std::vector<ParameterShard> parameter_shards() const;
  // After a load wrote the values of parameter_shards(): the next step's forward starts from
  // them on every rank (level 3 gathers them from the pieces).
  void shards_written();
  // The record of what happened during the steps while asked for (DdpEvent: "layer_done" as each
  // parameter's gradient is ready, "allreduce_issued", "backward_done", "allreduce_waited").
  void record_events(bool on);
  // That record.
  const std::vector<DdpEvent>& events() const;

 private:
  struct Impl;
  friend class TorchStage;  // a pipeline stage ends its synchronised backward itself
  template <typename Module>
  void keep_forward(const std::shared_ptr<Module>& module) {
    if constexpr (std::is_base_of_v<torch::nn::SequentialImpl, Module>)
      keep_sequential_forward(module);
    else if constexpr (has_one_forward<Module>(0))
      set_forward(torch::nn::AnyModule(module));
  }
  void keep_sequential_forward(std::shared_ptr<torch::nn::SequentialImpl> sequential);
  template <typename Module>
  static constexpr bool has_one_forward(decltype(&Module::forward)) {
    return true;
  }
  template <typename Module>
  static constexpr bool has_one_forward(...) {
    return false;
  }
  // The tensors of a forward's output (a tensor, a vector of them, a tuple or pair of these),
  // for prepare_for_backward; nothing from another type.
  template <typename T>
  static void collect_tensors(const T& value, std::vector<torch::Tensor>& tensors) {
    if constexpr (std::is_same_v<T, torch::Tensor>) {
      tensors.push_back(value);
    } else if constexpr (std::is_same_v<T, std::vector<torch::Tensor>>) {
      tensors.insert(tensors.end(), value.begin(), value.end());
    } else if constexpr (is_tuple<T>::value) {
      std::apply([&tensors](const auto&... parts) { (collect_tensors(parts, tensors), ...); },
                 value);
    }
  }
  template <typename T>
  struct is_tuple : std::false_type {};
  template <typename... Ts>
  struct is_tuple<std::tuple<Ts...>> : std::true_type {};
  template <typename A, typename B>
  struct is_tuple<std::pair<A, B>> : std::true_type {};
  void set_forward(torch::nn::AnyModule forward);
  torch::nn::AnyModule& forward_module();

  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
