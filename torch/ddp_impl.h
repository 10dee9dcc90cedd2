// The state of a ddp::DistributedDataParallel (its Impl) and the helpers its parts share:
// distributed_data_parallel.cpp (construction, the autograd hooks, the end of backward),
// ddp_buckets.cpp (the buckets, their buffers and reduction, and their rebuild from the order
// gradients arrive in), ddp_units.cpp (zero(3)'s shard units) and ddp_join.cpp (uneven inputs).
// Internal: not installed.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <array>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dist/agreement.h"
#include "runtime/error.h"
#include "torch/distributed_data_parallel.h"
#include "torch/shard_unit.h"
#include "torch/torch_params.h"

namespace ddp {

// "[8, 1, 3, 3] Float" (for the layout check's names).
inline std::string describe(const torch::Tensor& tensor) {
  std::ostringstream out;
  out << tensor.sizes() << ' ' << tensor.scalar_type();
  return out.str();
}

// The tensors' bytes, one after the other, as 32-bit words (padded), in one tensor on their
// device.
inline torch::Tensor packed(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> bytes;
  for (const torch::Tensor& t : tensors)
    bytes.push_back(t.detach().contiguous().reshape(-1).view(torch::kUInt8));
  torch::Tensor flat = torch::cat(bytes);
  const int64_t padded = (flat.numel() + 3) / 4 * 4;
  if (padded != flat.numel())
    flat = torch::cat({flat, torch::zeros({padded - flat.numel()}, flat.options())});
  return flat;
}

// The strides of a contiguous tensor of `sizes`.
inline std::vector<int64_t> dense_strides(torch::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;)
    strides[i - 1] = strides[i] * std::max<int64_t>(sizes[i], 1);
  return strides;
}

// packed()'s bytes back into the tensors.
inline void unpack(const torch::Tensor& flat, const std::vector<torch::Tensor>& tensors) {
  int64_t at = 0;
  for (const torch::Tensor& t : tensors) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    t.detach().copy_(flat.narrow(0, at, bytes).view(t.scalar_type()).view(t.sizes()));
    at += bytes;
  }
}

// The collectives' element type of parameter `name`'s dtype, or a UsageError naming it.
inline DataType wire_type(torch::ScalarType dtype, const std::string& name) {
  try {
    return collective_type(dtype);
  } catch (const UsageError& e) {
    throw UsageError(
        fmt::format("ddp::DistributedDataParallel: parameter '{}': {}; "
                    "module->to(torch::kFloat32) for example",
                    name, e.what()));
  }
}

struct DistributedDataParallel::Impl final : UnitRunner {
  // Buffer kinds: a unit's number times this, plus the dtype (ScalarType).
  static constexpr int kUnitKinds = 256;
  // A parameter that gets gradients: its slot in its dtype's gradient buffer and its hook.
  struct Param {
    std::string name;
    torch::Tensor tensor;
    std::vector<int64_t> sizes;  // its shape (with ZeRO 3 the tensor is empty between steps)
    // Its elements (of `sizes`: the tensor's own may be none, ZeRO 3).
    int64_t numel() const {
      int64_t n = 1;
      for (const int64_t size : sizes)
        n *= size;
      return n;
    }
    torch::ScalarType dtype = torch::kFloat32;
    size_t buffer = 0;   // its dtype's (and unit's) GradBuffer
    size_t unit = 0;     // zero(3) over several ranks: its shard unit
    int64_t offset = 0;  // where its gradient starts there (elements)
    torch::Tensor view;  // its part of that buffer, its shape (its .grad())
    std::shared_ptr<torch::autograd::Node> accumulator;
    uintptr_t hook = 0;
    bool ready = false;         // its gradient is written this backward
    bool reattached = false;    // its hook moved to a new accumulator during this backward
    bool early_unused = false;  // marked unused as this backward started
    uint32_t version = 0;       // the tensor's version when the last synchronised backward ended
    const c10::TensorImpl* grad = nullptr;  // and its gradient's tensor (null: none)
    uint32_t grad_version = 0;              // and that one's version
  };

  // The gradients of one dtype's parameters, one flat tensor in the reducer's order, so that
  // a bucket (one dtype) is a range of it.
  struct GradBuffer {
    torch::ScalarType dtype = torch::kFloat32;
    size_t unit = 0;     // the shard unit whose parameters' gradients it holds
    int64_t count = 0;   // its elements
    torch::Tensor flat;  // (ZeRO 2, 3: during backward only)
    torch::Tensor bf16;  // units with reduce_in_bf16: its gradients on the wire, with them
  };

  // A shard unit (zero(3) over several ranks; torch/shard_unit.h): its parameters, each
  // dtype's buffer of them, its gathers and its gradients' life in a step.
  struct Unit {
    std::vector<size_t> params;
    std::vector<size_t> buckets;                   // its buckets (its buffers')
    std::vector<std::unique_ptr<Work>> gathering;  // its gather in flight (prefetched)
    size_t waiting = 0;                            // its parameters not yet ready this backward
    bool reducing = false;   // every one is: its buckets go out, its gradients are freed after
    bool has_grads = false;  // its gradient buffers are allocated
  };

  Impl(torch::nn::Module& module, Communicator& comm,
       const DistributedDataParallelOptions& options);
  ~Impl() override;
  torch::Tensor run_unit(size_t unit, const std::function<torch::Tensor()>& forward) override;
  void assign_units();
  void gather_unit(size_t unit, bool wait);
  // Collective: the ranks' parts of a gradient norm combined (summed, or the largest).
  double norm_parts(double part, double norm_type);
  void unshard();  // DistributedDataParallel::unshard and reshard
  void reshard();
  void note(const char* what, size_t unit);  // an event of unit `unit`, where recorded
  void before_backward_of(size_t unit);
  void unit_grads(size_t unit);
  void free_unit_grads(size_t unit);
  void free_reduced_grads(size_t keep_from);
  void unit_ready(size_t unit);
  void gather_for_forward();
  void sample_memory();
  void check_and_copy_rank0s_state(
      const std::vector<std::pair<std::string, torch::Tensor>>& all,
      const std::vector<std::pair<std::string, torch::Tensor>>& buffers);
  void make_reducer();
  GroupedBuckets plan(const std::vector<size_t>& arrival) const;
  void use_plan(GroupedBuckets planned);
  void plan_rebuild();
  void rebuild_buckets();
  std::unique_ptr<Work> run_user_hook(const GradBucket& bucket);
  std::vector<GradMemory> grad_memory() const;
  void make_grad_buffers();
  void point_grads_at_buckets();
  void make_views();
  void make_view(Param& param);
  void pad_buckets(GroupedBuckets& planned);
  void moved(size_t index);
  void gather_parameters();
  void keep_own_gradients();
  void broadcast(const std::vector<torch::Tensor>& tensors, int root = 0);
  void join(const std::function<void()>& loop);
  std::vector<int32_t> join_all_reduce(int32_t active, int32_t sync);
  std::vector<int32_t> agree(std::vector<int32_t> values, ReduceOp op);
  void shadow_backward();
  void take_last_joiners_model();
  void sync_buffers();
  void* stream() const;
  void on_gradient(size_t index);
  void begin_backward();
  void end_backward();
  void reduce_at_end();
  void mark_unused(size_t index);
  void prepare_for_backward(const std::vector<torch::Tensor>& outputs);
  void mark_step_end();
  void point_grad_at_view(Param& param);
  void attach(size_t index);
  void reattach_replaced();
  bool hooked(const Param& param) const;
  void watch_for_replacement(size_t index);
  void watch_hit(size_t index);
  void refuse_a_second_backward(size_t index) const;
  std::vector<std::string> settings() const;
  void agree_on_hook();

  torch::nn::Module& module;
  Communicator& comm;
  DistributedDataParallelOptions options;
  torch::Device device = torch::kCPU;
  std::vector<Param> params;  // those that get gradients, in registration order
  std::vector<torch::Tensor> buffers;
  std::vector<GradBuffer> grad_buffers;  // one a dtype
  std::vector<size_t>
      param_of;  // the reducer's layer j is params[param_of[j]] (plan_grouped_buckets)
  std::vector<size_t> layer_of;   // and params[i] its layer layer_of[i]
  TorchCommHook hook;             // register_comm_hook's, or none
  bool hook_agreed = false;       // the ranks compared their hooks (the first backward)
  torch::Tensor bf16_scratch;     // reduce_in_bf16's (the float32 buffer's gradients as bf16)
  std::vector<size_t> arrival;    // the parameters in the order the first step made them ready
  bool arrival_recorded = false;  // the first synchronised backward has ended
  std::unique_ptr<GroupedBuckets> pending_plan;  // rebuilt buckets, used from the next step
  bool recording_events = false;                 // record_events(), kept over a rebuild
  std::vector<char> predicted_unused;            // prepare_for_backward's, for the next backward
  std::vector<int32_t> used;        // this backward: 0 for a parameter with no gradient at all
  std::vector<char> used_anywhere;  // the last all-reduce of `used`: some rank had a gradient
  bool static_recorded = false;     // static_graph: the first step is over
  std::vector<char> static_unused;  // and the parameters it left without gradient here
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<TorchParams> shards;  // with ZeRO on more than one rank
  // zero(3) over several ranks: the ShardUnits', then auto_wrap_min_params' groups of the
  // Sequential's children, then the root (what no unit holds), each numbered as the buffers
  // are (kind unit x kUnitKinds + dtype); empty otherwise.
  std::vector<Unit> units;
  std::vector<ShardUnitImpl*> unit_modules;  // each ShardUnit, set to run through this Impl
  std::vector<int> child_unit;  // auto-wrap: each child of the Sequential's unit (-1: none)
  size_t root_unit = static_cast<size_t>(-1);  // the root's unit (none: every parameter in one)
  std::vector<std::array<int64_t, 3>> pads;    // each bucket's tail (buffer, offset, count)
  bool keep_gathered = false;    // gather_parameters(): every unit kept until backward ends
  ShardedMemory peak;            // this step's so far (sample_memory)
  size_t param_bytes = 0;        // the parameters' bytes, whole
  ShardedMemory last_peak;       // the last step's
  torch::Tensor device_scratch;  // the layout check's messages over NCCL
  torch::nn::AnyModule forward;
  // What the parameters' own hooks (watch_for_replacement) call: watch_hit while this Impl
  // lives, nothing after (LibTorch has no way to remove a tensor's hook).
  std::shared_ptr<std::function<void(size_t)>> alive =
      std::make_shared<std::function<void(size_t)>>([this](size_t i) { watch_hit(i); });
  int sync_batch_norms = 0;  // the module's ddp::SyncBatchNorm layers
  bool no_sync = false;
  // The owner ends each synchronised backward (end_backward()) instead of the autograd engine's
  // final callback: a pipeline stage, whose weight half is several backward calls and whose
  // reduction is waited for at the step's end, while the schedule goes on.
  bool manual_end = false;
  bool in_backward = false;
  bool buffers_synced = false;  // since the last synchronised backward
  bool forward_seen = false;    // forward() or sync_buffers() since the last synchronised backward
  bool backward_done = false;   // a synchronised backward has ended (versions are recorded)
  bool joining = false;         // inside join(): each forward tells the joined ranks
  bool join_notified = false;   // this step's forward did (join())
  int64_t steps_joined = 0;     // the forwards this rank told them of (join())
};

}  // namespace ddp
