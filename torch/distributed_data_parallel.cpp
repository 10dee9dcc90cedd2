// DistributedDataParallel: the module's parameters and buffers, the gradient buckets as views,
// the hooks on the gradient accumulators and the end of backward.
#include "torch/distributed_data_parallel.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cstdio>
#include <mutex>
#include <set>
#include <sstream>

#include "runtime/error.h"
#include "torch/param_shards.h"
#include "torch/sync_batch_norm.h"

#if DDP_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp {

namespace {

// "[8, 1, 3, 3] Float" (for the layout check's names).
std::string describe(const torch::Tensor& tensor) {
  std::ostringstream out;
  out << tensor.sizes() << ' ' << tensor.scalar_type();
  return out.str();
}

// The tensors' bytes, one after the other, as 32-bit words (padded), in one tensor on their
// device.
torch::Tensor packed(const std::vector<torch::Tensor>& tensors) {
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
std::vector<int64_t> dense_strides(torch::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;)
    strides[i - 1] = strides[i] * std::max<int64_t>(sizes[i], 1);
  return strides;
}

// packed()'s bytes back into the tensors.
void unpack(const torch::Tensor& flat, const std::vector<torch::Tensor>& tensors) {
  int64_t at = 0;
  for (const torch::Tensor& t : tensors) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    t.detach().copy_(flat.narrow(0, at, bytes).view(t.scalar_type()).view(t.sizes()));
    at += bytes;
  }
}

// The collectives' element type of parameter `name`'s dtype, or a UsageError naming it.
DataType wire_type(torch::ScalarType dtype, const std::string& name) {
  try {
    return collective_type(dtype);
  } catch (const UsageError& e) {
    throw UsageError(
        fmt::format("ddp::DistributedDataParallel: parameter '{}': {}; "
                    "module->to(torch::kFloat32) for example",
                    name, e.what()));
  }
}

// The parameters some wrapper holds now (their TensorImpl, which torch::load's set_ keeps),
// so that a second wrapper of one module is refused by name rather than failing later.
std::mutex wrapped_mutex;
std::set<const c10::TensorImpl*>& wrapped() {
  static std::set<const c10::TensorImpl*> held;
  return held;
}

}  // namespace

struct DistributedDataParallel::Impl {
  // A parameter that gets gradients: its slot in its dtype's gradient buffer and its hook.
  struct Param {
    std::string name;
    torch::Tensor tensor;
    std::vector<int64_t> sizes;  // its shape (with ZeRO 3 it is empty between steps)
    torch::ScalarType dtype = torch::kFloat32;
    size_t buffer = 0;   // its dtype's GradBuffer
    int64_t offset = 0;  // where its gradient starts there (elements)
    torch::Tensor view;  // its part of that buffer, its shape (its .grad())
    std::shared_ptr<torch::autograd::Node> accumulator;
    uintptr_t hook = 0;
    bool ready = false;       // its gradient is written this backward
    bool reattached = false;  // its hook moved to a new accumulator during this backward
    uint32_t version = 0;     // the tensor's version when the last synchronised backward ended
    const c10::TensorImpl* grad = nullptr;  // and its gradient's tensor (null: none)
    uint32_t grad_version = 0;              // and that one's version
  };

  // The gradients of one dtype's parameters, one flat tensor in the reducer's order, so that
  // a bucket (one dtype) is a range of it.
  struct GradBuffer {
    torch::ScalarType dtype = torch::kFloat32;
    int64_t count = 0;   // its elements
    torch::Tensor flat;  // (ZeRO 2, 3: during backward only)
  };
  // A bucket's range of its buffer.
  struct BucketSlice {
    size_t buffer = 0;
    int64_t offset = 0, count = 0;
  };

  Impl(torch::nn::Module& module, World& world, const DistributedDataParallelOptions& options);
  ~Impl();
  void check_and_copy_rank0s_state(
      const std::vector<std::pair<std::string, torch::Tensor>>& all,
      const std::vector<std::pair<std::string, torch::Tensor>>& buffers);
  void make_reducer();
  std::unique_ptr<Work> reduce_bucket(size_t bucket);
  void make_grad_buffers();
  void point_grads_at_buckets();
  void make_views();
  void moved(size_t index);
  void gather_parameters();
  void keep_own_gradients();
  void broadcast(const std::vector<torch::Tensor>& tensors, int root = 0);
  void join(const std::function<void()>& loop);
  std::vector<int32_t> join_all_reduce(int32_t active, int32_t sync);
  void shadow_backward();
  void take_last_joiners_model();
  void sync_buffers();
  void* stream() const;
  void on_gradient(size_t index);
  void begin_backward();
  void end_backward();
  void reduce_at_end();
  void mark_step_end();
  void point_grad_at_view(Param& param);
  void attach(size_t index);
  void reattach_replaced();
  void refuse_a_second_backward(size_t index) const;

  torch::nn::Module& module;
  Communicator& comm;
  DistributedDataParallelOptions options;
  torch::Device device = torch::kCPU;
  std::vector<Param> params;  // those that get gradients, in registration order
  std::vector<torch::Tensor> buffers;
  std::vector<GradBuffer> grad_buffers;  // one a dtype
  std::vector<BucketSlice> slices;       // each bucket's
  std::vector<size_t>
      param_of;  // the reducer's layer j is params[param_of[j]] (plan_grouped_buckets)
  std::vector<size_t> layer_of;  // and params[i] its layer layer_of[i]
  TorchCommHook hook;            // register_comm_hook's, or none
  torch::Tensor bf16_scratch;    // reduce_in_bf16's (the float32 buffer's gradients as bf16)
  std::unique_ptr<Ddp> reducer;
  std::unique_ptr<ParamShards> shards;  // with ZeRO on more than one rank
  torch::Tensor device_scratch;         // the layout check's messages over NCCL
  torch::nn::AnyModule forward;
  bool no_sync = false;
  bool in_backward = false;
  bool buffers_synced = false;  // since the last synchronised backward
  bool forward_seen = false;    // forward() or sync_buffers() since the last synchronised backward
  bool backward_done = false;   // a synchronised backward has ended (versions are recorded)
  bool joining = false;         // inside join(): each forward tells the joined ranks
  bool join_notified = false;   // this step's forward did (join())
  int64_t steps_joined = 0;     // the forwards this rank told them of (join())
};

DistributedDataParallel::Impl::Impl(torch::nn::Module& module_, World& world,
                                    const DistributedDataParallelOptions& options_)
    : module(module_), comm(world.comm()), options(options_) {
  const auto named = module.named_parameters(/*recurse=*/true);
  const auto named_buffers = module.named_buffers(/*recurse=*/true);
  DDP_USAGE_CHECK(named.size() > 0,
                  "ddp::DistributedDataParallel: the module has no parameters (nothing to train)");
  device = named[0].value().device();
  std::vector<std::pair<std::string, torch::Tensor>> all, bufs;
  for (const auto& p : named)
    all.emplace_back(p.key(), p.value());
  for (const auto& b : named_buffers)
    bufs.emplace_back(b.key(), b.value());
  for (const auto& [name, tensor] : all) {
    DDP_USAGE_CHECK(tensor.device() == device,
                    "ddp::DistributedDataParallel: parameter '{}' is on {} where '{}' is on {}; "
                    "one module on one device per process",
                    name, tensor.device().str(), all[0].first, device.str());
    if (tensor.requires_grad()) wire_type(tensor.scalar_type(), name);
  }
  DDP_USAGE_CHECK(device.is_cuda() == comm.device_buffers(),
                  "ddp::DistributedDataParallel: the module is on {} but the world communicator "
                  "({}) takes {} tensors; {}",
                  device.str(), comm.backend(), comm.device_buffers() ? "CUDA" : "CPU",
                  comm.device_buffers()
                      ? "move the module to the GPU (module->to(torch::kCUDA))"
                      : "for CUDA tensors call ddp::init with InitOptions::bind_gpu (NCCL)");
  DDP_USAGE_CHECK(options.zero() >= 0 && options.zero() <= 3,
                  "ddp::DistributedDataParallelOptions().zero({}): expected 0 (plain), 1 "
                  "(optimizer state sharded), 2 (and gradients) or 3 (and parameters)",
                  options.zero());
  for (const auto& [name, tensor] : all)
    if (tensor.requires_grad())
      params.push_back({name, tensor,
                        std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end()),
                        tensor.scalar_type()});
  {
    std::lock_guard<std::mutex> lock(wrapped_mutex);
    for (const Param& p : params)
      DDP_USAGE_CHECK(!wrapped().count(p.tensor.unsafeGetTensorImpl()),
                      "ddp::DistributedDataParallel: parameter '{}' is already wrapped by another "
                      "ddp::DistributedDataParallel that is alive; wrap a module once and train "
                      "through that wrapper (two would each reduce every gradient)",
                      p.name);
  }
  DDP_USAGE_CHECK(!params.empty(),
                  "ddp::DistributedDataParallel: no parameter of the module requires a gradient");
  for (const auto& b : bufs)
    buffers.push_back(b.second);
  make_reducer();
  check_and_copy_rank0s_state(all, bufs);
  if (options.zero() > 0 && comm.size() > 1) {
    std::vector<torch::Tensor> tensors;
    for (const Param& p : params)
      tensors.push_back(p.tensor);
    shards = std::make_unique<ParamShards>(tensors, options.zero(), comm.rank(), comm.size(),
                                           [this](size_t i) { moved(i); });
  }
  point_grads_at_buckets();
  for (const auto& m : module.modules())  // batch statistics over every rank's slice
    if (auto* sync = dynamic_cast<SyncBatchNormImpl*>(m.get())) sync->set_communicator(&comm);
  std::lock_guard<std::mutex> lock(wrapped_mutex);
  for (const Param& p : params)
    wrapped().insert(p.tensor.unsafeGetTensorImpl());
}

void DistributedDataParallel::Impl::check_and_copy_rank0s_state(
    const std::vector<std::pair<std::string, torch::Tensor>>& all,
    const std::vector<std::pair<std::string, torch::Tensor>>& bufs) {
  if (comm.size() == 1) return;  // one process: nothing to compare or copy
  // Every rank the same names, shapes and dtypes, the first difference named on every rank.
  std::vector<NamedParam> layout;
  for (const auto& [name, tensor] : all)
    layout.push_back({name + ' ' + describe(tensor), static_cast<size_t>(tensor.numel())});
  for (const auto& [name, tensor] : bufs)
    layout.push_back(
        {"buffer " + name + ' ' + describe(tensor), static_cast<size_t>(tensor.numel())});
  if (comm.device_buffers()) {
    reducer->set_device_copies(
        [](void* dst, const void* src, size_t bytes) {
          auto host = torch::from_blob(const_cast<void*>(src), {static_cast<int64_t>(bytes)},
                                       torch::kUInt8);
          torch::from_blob(dst, {static_cast<int64_t>(bytes)},
                           torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA))
              .copy_(host);
        },
        [](void* dst, const void* src, size_t bytes) {
          auto device =
              torch::from_blob(const_cast<void*>(src), {static_cast<int64_t>(bytes)},
                               torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA));
          torch::from_blob(dst, {static_cast<int64_t>(bytes)}, torch::kUInt8).copy_(device);
        });
    reducer->set_device_scratch([this](size_t bytes) {
      if (!device_scratch.defined() || device_scratch.numel() < static_cast<int64_t>(bytes))
        device_scratch = torch::empty({static_cast<int64_t>(bytes)},
                                      torch::TensorOptions().dtype(torch::kUInt8).device(device));
      return device_scratch.data_ptr();
    });
    comm.set_compute_stream(stream());
  }
  reducer->check_same_layout(layout);
  device_scratch = torch::Tensor();
  // Rank 0's parameters and buffers, in one collective.
  std::vector<torch::Tensor> state;
  for (const auto& p : all)
    state.push_back(p.second);
  for (const auto& b : bufs)
    state.push_back(b.second);
  broadcast(state);
}

// Buckets of one dtype each (PyTorch's bucketing by dtype), reduced in the order backward
// completes them; a buffer a dtype; the buckets' reduction as the reducer's hook.
void DistributedDataParallel::Impl::make_reducer() {
  DDP_USAGE_CHECK(options.bucket_cap_mb() > 0 && options.first_bucket_cap_mb() >= 0,
                  "ddp::DistributedDataParallelOptions: bucket_cap_mb {} and first_bucket_cap_mb "
                  "{}: expected sizes above 0",
                  options.bucket_cap_mb(), options.first_bucket_cap_mb());
  std::vector<size_t> counts, element_bytes;
  std::vector<int> kinds;
  for (const Param& p : params) {
    counts.push_back(static_cast<size_t>(p.tensor.numel()));
    kinds.push_back(static_cast<int>(p.dtype));
    element_bytes.push_back(p.tensor.element_size());
  }
  GroupedBuckets plan = plan_grouped_buckets(
      counts, kinds, element_bytes, static_cast<size_t>(options.bucket_cap_mb() * 1048576),
      static_cast<size_t>(options.first_bucket_cap_mb() * 1048576));
  param_of = plan.order;
  layer_of.assign(params.size(), 0);
  for (size_t j = 0; j < param_of.size(); ++j)
    layer_of[param_of[j]] = j;
  for (const size_t i : param_of) {  // each dtype's parameters in the reducer's order
    Param& p = params[i];
    size_t b = 0;
    while (b < grad_buffers.size() && grad_buffers[b].dtype != p.dtype)
      ++b;
    if (b == grad_buffers.size()) grad_buffers.push_back({p.dtype, 0, {}});
    p.buffer = b;
    p.offset = grad_buffers[b].count;
    grad_buffers[b].count += p.tensor.numel();
  }
  for (const Bucket& bucket : plan.buckets) {
    const Param& first = params[param_of[static_cast<size_t>(bucket.first_layer)]];
    slices.push_back({first.buffer, first.offset, static_cast<int64_t>(bucket.count)});
  }
  reducer = std::make_unique<Ddp>(comm, std::move(plan.buckets), static_cast<int>(params.size()),
                                  options.overlap());
  make_grad_buffers();
  for (GradBuffer& buffer : grad_buffers)
    buffer.flat.zero_();
  if (options.reduce_in_bf16() && comm.size() > 1) {  // one process reduces nothing
    comm.require_bf16_reduction();
    for (const GradBuffer& buffer : grad_buffers)
      if (buffer.dtype == torch::kFloat32)
        bf16_scratch = torch::empty({buffer.count},
                                    torch::TensorOptions().dtype(torch::kBFloat16).device(device));
  }
  reducer->register_comm_hook(
      [this](Communicator&, const GradBucket& bucket) { return reduce_bucket(bucket.index); });
}

// Bucket `bucket`'s average: the user's hook, or the all-reduce in the bucket's dtype (float32
// through bf16 with reduce_in_bf16). bf16 and fp16 buckets are summed in their own dtype, as
// PyTorch's DDP does (NCCL adds in that dtype; Gloo and MPI add each pair in float and round).
std::unique_ptr<Work> DistributedDataParallel::Impl::reduce_bucket(size_t bucket) {
  const BucketSlice& slice = slices[bucket];
  GradBuffer& buffer = grad_buffers[slice.buffer];
  if (hook) {
    TorchGradBucket view{bucket, buffer.flat.narrow(0, slice.offset, slice.count), {}, {}};
    const Bucket& planned = reducer->buckets()[bucket];
    for (int layer = planned.first_layer; layer <= planned.last_layer; ++layer) {
      const Param& p = params[param_of[static_cast<size_t>(layer)]];
      view.parameters.push_back(p.tensor);
      view.gradients.push_back(p.view);
    }
    return hook(comm, view);
  }
  void* data = static_cast<char*>(buffer.flat.data_ptr()) +
               slice.offset * static_cast<int64_t>(buffer.flat.element_size());
  const auto count = static_cast<size_t>(slice.count);
  if (bf16_scratch.defined() && buffer.dtype == torch::kFloat32)
    return comm.all_reduce_bf16_async(
        static_cast<float*>(data), static_cast<uint16_t*>(bf16_scratch.data_ptr()) + slice.offset,
        count, ReduceOp::kAverage);
  return comm.all_reduce_async(data, count, wire_type(buffer.dtype, params[0].name),
                               ReduceOp::kAverage);
}

// Each dtype's gradient buffer (uninitialised), and the parameters' views of it.
void DistributedDataParallel::Impl::make_grad_buffers() {
  for (GradBuffer& buffer : grad_buffers)
    buffer.flat =
        torch::empty({buffer.count}, torch::TensorOptions().dtype(buffer.dtype).device(device));
  make_views();
}

// Each parameter's .grad() a view of its bucket, and a hook on its gradient accumulator that
// tells when its gradient is written.
void DistributedDataParallel::Impl::point_grads_at_buckets() {
  for (size_t i = 0; i < params.size(); ++i)
    attach(i);
}

// Each parameter's slot of its dtype's gradient buffer, a tensor of its shape.
void DistributedDataParallel::Impl::make_views() {
  torch::NoGradGuard no_grad;
  for (Param& p : params) {
    // The buffer's memory, but not an autograd view of it: LibTorch's Optimizer::zero_grad()
    // detaches gradients in place, which views refuse.
    const torch::Tensor& flat = grad_buffers[p.buffer].flat;
    p.view = torch::empty({0}, flat.options())
                 .set_(flat.storage(), p.offset, p.sizes, dense_strides(p.sizes));
  }
}

// ZeRO re-set parameter `index`'s tensor (a view into its owner's flat tensor, or empty):
// LibTorch gave it a new gradient accumulator, which gets the hook.
void DistributedDataParallel::Impl::moved(size_t index) {
  Param& p = params[index];
  if (!p.accumulator) return;  // not hooked yet (construction)
  p.accumulator->del_post_hook(p.hook);
  attach(index);
}

// A hook on the parameter's gradient accumulator (the autograd node that writes its .grad()).
void DistributedDataParallel::Impl::attach(size_t index) {
  Param& p = params[index];
  p.accumulator = torch::autograd::impl::grad_accumulator(p.tensor);
  DDP_CHECK(p.accumulator != nullptr, "parameter '{}' has no gradient accumulator", p.name);
  p.hook = p.accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [this, index](const torch::autograd::variable_list& outputs,
                    const torch::autograd::variable_list&) {
        on_gradient(index);
        return outputs;
      }));
}

// torch::load(module, file) replaces each parameter's data with Tensor::set_, and LibTorch then
// drops the parameter's gradient accumulator: the hooks on the old one would never fire again
// and the ranks would train apart with no message. A parameter whose accumulator is not the one
// hooked gets the hook on its new one (same shape, dtype and device, or it is refused: its
// slot in the buckets would be wrong). Comparing the owners of the weak and the strong pointer
// takes no lock, so this runs before every forward.
void DistributedDataParallel::Impl::reattach_replaced() {
  std::vector<std::string> moved;
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = params[i];
    const auto* meta = torch::autograd::impl::get_autograd_meta(p.tensor);
    if (meta != nullptr && !meta->grad_accumulator_.owner_before(p.accumulator) &&
        !p.accumulator.owner_before(meta->grad_accumulator_) && !meta->grad_accumulator_.expired())
      continue;
    DDP_USAGE_CHECK(p.tensor.sizes() == torch::IntArrayRef(p.sizes) &&
                        p.tensor.scalar_type() == p.dtype && p.tensor.device() == device,
                    "ddp::DistributedDataParallel: parameter '{}' was replaced by a tensor of "
                    "another shape, dtype or device ({}) since the wrapper was made; load "
                    "(torch::load) a model of the same layout, or construct the wrapper after it",
                    p.name, describe(p.tensor));
    p.accumulator->del_post_hook(p.hook);
    attach(i);
    if (shards) shards->take_back(i);  // the loaded values into its owner's flat tensor
    p.reattached = in_backward;
    moved.push_back(p.name);
  }
  if (moved.empty()) return;
  std::fprintf(stderr,
               "ddp::DistributedDataParallel: %zu parameter(s) (first '%s') got new tensors since "
               "the wrapper was made (torch::load does this): their gradients are reduced from "
               "now on; every rank must load the same values, as they are not broadcast again\n",
               moved.size(), moved[0].c_str());
}

// A backward that starts after a synchronised one with neither a forward through the wrapper
// (forward(), sync_buffers()) nor an update of any parameter (optimizer.step()) in between is a
// second backward of one step: its all-reduces would pair with the other ranks' next step
// and the replicas would part from then on (PyTorch: "mark a variable ready only once").
void DistributedDataParallel::Impl::refuse_a_second_backward(size_t index) const {
  if (!backward_done || forward_seen) return;
  // An optimizer step changes the parameters, though not always their version (LibTorch
  // 1.13's SGD steps .data()); zero_grad() changes or drops the gradients. Parameter `index`'s
  // own gradient was just accumulated, by this backward.
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    if (p.tensor._version() != p.version) return;
    if (i == index) continue;
    const torch::Tensor& grad = p.tensor.grad();
    if ((grad.defined() ? grad.unsafeGetTensorImpl() : nullptr) != p.grad ||
        (grad.defined() && grad._version() != p.grad_version))
      return;
  }
  throw UsageError(fmt::format(
      "ddp::DistributedDataParallel: parameter '{}' got a second gradient in one step: a second "
      "backward ran after the synchronised one with no forward and no optimizer step in between; "
      "its all-reduce would pair with the other ranks' next step. Sum the losses and call "
      "backward once, or run the earlier backwards under model.no_sync()",
      params[index].name));
}

DistributedDataParallel::Impl::~Impl() {
  for (Param& p : params)
    if (p.accumulator) p.accumulator->del_post_hook(p.hook);
  for (const auto& m : module.modules())
    if (auto* sync = dynamic_cast<SyncBatchNormImpl*>(m.get())) sync->set_communicator(nullptr);
  std::lock_guard<std::mutex> lock(wrapped_mutex);
  for (const Param& p : params)
    wrapped().erase(p.tensor.unsafeGetTensorImpl());
}

// The current CUDA stream of the module's device (what the gradients were written on, what
// the optimizer will read them on), or null on the CPU.
void* DistributedDataParallel::Impl::stream() const {
#if DDP_TORCH_CUDA
  if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
  return nullptr;
}

void DistributedDataParallel::Impl::broadcast(const std::vector<torch::Tensor>& tensors, int root) {
  if (comm.size() == 1 || tensors.empty()) return;
  torch::NoGradGuard no_grad;
  torch::Tensor flat = packed(tensors);
  const size_t words = static_cast<size_t>(flat.numel() / 4);
  if (comm.device_buffers()) {
    comm.set_compute_stream(stream());
    comm.broadcast_async(flat.data_ptr(), words, DataType::kInt32, root)->then_on(stream());
  } else {
    comm.broadcast(flat.data_ptr(), words, DataType::kInt32, root);
  }
  unpack(flat, tensors);
}

// join(): every rank's {training, synchronising} flags summed (a small all-reduce each forward
// of a rank still training, and each round of a rank that has joined).
std::vector<int32_t> DistributedDataParallel::Impl::join_all_reduce(int32_t active, int32_t sync) {
  torch::Tensor flags = torch::tensor({active, sync}, torch::kInt32).to(device);
  if (comm.device_buffers()) comm.set_compute_stream(stream());
  comm.all_reduce(flags.data_ptr(), 2, DataType::kInt32, ReduceOp::kSum);
  flags = flags.cpu();
  return {flags[0].item<int32_t>(), flags[1].item<int32_t>()};
}

// A joined rank's part in the others' backward: the buckets reduced from zeros by the same
// reducer (so the same collectives, hooks included, in the same order), and the unused
// parameters' map where find_unused_parameters.
void DistributedDataParallel::Impl::shadow_backward() {
  torch::NoGradGuard no_grad;
  for (GradBuffer& buffer : grad_buffers)
    buffer.flat.zero_();
  if (comm.device_buffers()) comm.set_compute_stream(stream());
  reducer->begin_backward(nullptr);  // reduce_bucket knows the buffers
  for (size_t layer = 0; layer < params.size(); ++layer)
    reducer->layer_ready(static_cast<int>(layer));
  reducer->end_backward();
  reducer->finish(stream());
  if (options.find_unused_parameters()) {
    torch::Tensor map =
        torch::zeros({static_cast<int64_t>(params.size())}, torch::kInt32).to(device);
    comm.all_reduce(map.data_ptr(), params.size(), DataType::kInt32, ReduceOp::kMax);
  }
}

// Once every rank has joined: the parameters and buffers of the rank that trained the most
// steps (the lowest such rank) on every rank, so that the replicas end equal (PyTorch's Join).
void DistributedDataParallel::Impl::take_last_joiners_model() {
  torch::Tensor steps = torch::tensor({steps_joined}, torch::kInt64).to(device);
  torch::Tensor all = torch::empty({comm.size()}, steps.options());
  if (comm.device_buffers()) comm.set_compute_stream(stream());
  comm.all_gather(steps.data_ptr(), all.data_ptr(), 1, DataType::kInt64);
  const int root = static_cast<int>(all.cpu().argmax().item<int64_t>());
  std::vector<torch::Tensor> state;
  for (const auto& p : module.parameters())
    state.push_back(p);
  for (const torch::Tensor& b : buffers)
    state.push_back(b);
  broadcast(state, root);
}

void DistributedDataParallel::Impl::join(const std::function<void()>& loop) {
  DDP_USAGE_CHECK(!shards,
                  "ddp::DistributedDataParallel::join with zero({}): a rank that has joined would "
                  "miss its own parameters' updates; uneven inputs under ZeRO are not supported",
                  options.zero());
  DDP_USAGE_CHECK(!joining, "ddp::DistributedDataParallel::join inside join");
  if (comm.size() == 1) return loop();
  joining = true;
  steps_joined = 0;
  try {
    loop();
  } catch (...) {
    joining = false;
    throw;
  }
  joining = false;
  // Out of batches: take part in the others' steps until every rank is.
  for (;;) {
    const std::vector<int32_t> flags = join_all_reduce(0, 0);
    if (flags[0] == 0) break;
    if (options.broadcast_buffers()) broadcast(buffers);
    if (flags[1] > 0) shadow_backward();
  }
  take_last_joiners_model();
}

void DistributedDataParallel::Impl::gather_parameters() {
  reattach_replaced();
  if (!shards) return;
  if (comm.device_buffers()) comm.set_compute_stream(stream());
  shards->gather(comm, stream());
}

void DistributedDataParallel::Impl::sync_buffers() {
  if (joining && comm.size() > 1) {  // this rank trains one more step: the joined ranks hear of it
    join_all_reduce(1, no_sync ? 0 : 1);
    ++steps_joined;
    join_notified = true;
  }
  gather_parameters();
  if (options.broadcast_buffers()) broadcast(buffers);
  buffers_synced = true;
  forward_seen = true;
}

// Its .grad() is its slot of the bucket: a gradient written elsewhere (none yet, or
// optimizer.zero_grad() setting it to none) is copied there first.
void DistributedDataParallel::Impl::point_grad_at_view(Param& param) {
  torch::Tensor& grad = param.tensor.mutable_grad();
  if (grad.defined() && grad.is_same(param.view)) return;
  if (grad.defined())
    param.view.copy_(grad);
  else
    param.view.zero_();
  grad = param.view;
}

void DistributedDataParallel::Impl::on_gradient(size_t index) {
  if (no_sync) return;  // accumulated here, reduced by the next backward outside no_sync()
  if (!in_backward) {
    refuse_a_second_backward(index);
    begin_backward();
  }
  Param& p = params[index];
  DDP_CHECK(!p.ready, "parameter '{}' got its gradient twice in one backward", p.name);
  DDP_USAGE_CHECK(!p.tensor.grad().defined() || !p.tensor.grad().is_sparse(),
                  "ddp::DistributedDataParallel: parameter '{}' has a sparse gradient (an "
                  "embedding with sparse(true)?); its buckets reduce dense gradients: make it "
                  "dense (sparse(false))",
                  p.name);
  p.ready = true;
  if (comm.size() == 1) return;  // one process: nothing to reduce, the gradient stays put
  {
    torch::NoGradGuard no_grad;
    point_grad_at_view(p);
  }
  if (comm.device_buffers()) comm.set_compute_stream(stream());
  reducer->layer_ready(static_cast<int>(layer_of[index]));
}

void DistributedDataParallel::Impl::begin_backward() {
  DDP_USAGE_CHECK(
      buffers_synced || !options.broadcast_buffers() || buffers.empty() || comm.size() == 1,
      "ddp::DistributedDataParallel: the module has buffers and broadcast_buffers is on, but this "
      "step's forward ran without model.forward(...) or model.sync_buffers() before it; call one "
      "of them before each forward, or set DistributedDataParallelOptions().broadcast_buffers("
      "false)");
  DDP_USAGE_CHECK(!joining || join_notified,
                  "ddp::DistributedDataParallel::join: this step's forward ran without "
                  "model.forward(...) or model.sync_buffers() before it, which tell the ranks that "
                  "have joined of the step; call one of them before each forward");
  join_notified = false;
  DDP_USAGE_CHECK(
      !shards || shards->current(),
      "ddp::DistributedDataParallel with zero({}): this step's forward ran without "
      "model.forward(...), model.sync_buffers() or model.gather_parameters() before it, so it used "
      "parameters that only their owners had updated; call one of them before each forward",
      options.zero());
  in_backward = true;
  for (Param& p : params)
    p.ready = false;
  reattach_replaced();
  // ZeRO 2 and 3 free them between steps. Not zeroed: every slot is written before its bucket
  // is reduced (a gradient copied in as it is ready, an unused parameter's zeroed at the end of
  // backward).
  if (!grad_buffers[0].flat.defined()) make_grad_buffers();
  reducer->begin_backward(nullptr);  // reduce_bucket knows the buffers
  // Called by the autograd engine once backward is over (its final callback).
  torch::autograd::Engine::get_default_engine().queue_callback([this] { end_backward(); });
}

void DistributedDataParallel::Impl::end_backward() {
  in_backward = false;
  buffers_synced = false;
  forward_seen = false;
  reduce_at_end();
  mark_step_end();
}

// What the next backward compares to tell a new step from a second backward of this one
// (refuse_a_second_backward).
void DistributedDataParallel::Impl::mark_step_end() {
  backward_done = true;
  for (Param& p : params) {
    p.version = p.tensor._version();
    const torch::Tensor& grad = p.tensor.grad();
    p.grad = grad.defined() ? grad.unsafeGetTensorImpl() : nullptr;
    p.grad_version = grad.defined() ? grad._version() : 0;
  }
}

// The end of backward: every parameter's readiness settled, what is left reduced, waited for.
void DistributedDataParallel::Impl::reduce_at_end() {
  std::vector<size_t> unused;
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = params[i];
    // Re-attached during this backward, after its new accumulator had run: its gradient is in
    // .grad(), the hook missed it.
    if (!p.ready && p.reattached && p.tensor.grad().defined()) {
      p.ready = true;
      if (comm.size() > 1) {
        torch::NoGradGuard no_grad;
        point_grad_at_view(p);
        if (comm.device_buffers()) comm.set_compute_stream(stream());
        reducer->layer_ready(static_cast<int>(layer_of[i]));
      }
    }
    p.reattached = false;
    if (!p.ready) unused.push_back(i);
  }
  if (!unused.empty() && !options.find_unused_parameters()) {
    std::string names;
    for (size_t k = 0; k < unused.size() && k < 5; ++k)
      names += (k ? ", '" : "'") + params[unused[k]].name + "'";
    if (unused.size() > 5) names += fmt::format(" and {} more", unused.size() - 5);
    throw UsageError(fmt::format(
        "ddp::DistributedDataParallel: parameter(s) {} got no gradient in this backward, so their "
        "buckets cannot be reduced; use them in the loss, set requires_grad(false) on them, or "
        "construct with DistributedDataParallelOptions().find_unused_parameters(true)",
        names));
  }
  if (comm.size() == 1) return;  // nothing to reduce
  // An unused parameter's part of its bucket: what it holds (a gradient accumulated
  // earlier, zero after zero_grad()), or zero where it has no gradient at all.
  std::vector<int32_t> used(params.size(), 1);
  {
    torch::NoGradGuard no_grad;
    for (const size_t i : unused) {
      Param& p = params[i];
      if (!p.tensor.grad().defined()) {
        p.view.zero_();
        used[i] = 0;
      } else {
        point_grad_at_view(p);
      }
      if (comm.device_buffers()) comm.set_compute_stream(stream());
      reducer->layer_ready(static_cast<int>(layer_of[i]));
    }
  }
  reducer->end_backward();
  reducer->finish(stream());
  if (options.find_unused_parameters()) {
    // A parameter no rank used keeps no gradient (as PyTorch's); one another rank used gets
    // the average.
    torch::Tensor map = torch::tensor(used, torch::kInt32).to(device);
    if (comm.device_buffers()) comm.set_compute_stream(stream());
    comm.all_reduce(map.data_ptr(), used.size(), DataType::kInt32, ReduceOp::kMax);
    map = map.cpu();
    for (const size_t i : unused)
      if (used[i] == 0 && map[static_cast<int64_t>(i)].item<int32_t>() == 1) {
        torch::NoGradGuard no_grad;
        params[i].tensor.mutable_grad() = params[i].view;
      }
  }
  if (shards) keep_own_gradients();
}

// ZeRO, once the gradients are averaged: a parameter of another rank keeps no gradient (so the
// optimizer steps and keeps state for this rank's own only); with ZeRO 2 and 3 this rank's own
// gradients leave the flat buffer, which is freed until the next backward. The owners are
// about to step: the next forward gathers.
void DistributedDataParallel::Impl::keep_own_gradients() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor& grad = params[i].tensor.mutable_grad();
    if (!shards->owns(i))
      grad = torch::Tensor();
    else if (options.zero() >= 2 && grad.defined())
      grad = grad.clone();
  }
  if (options.zero() >= 2) {
    for (GradBuffer& buffer : grad_buffers)
      buffer.flat = torch::Tensor();
    for (Param& p : params)
      p.view = torch::Tensor();
  }
  shards->stale();
}

namespace {

// Several ranks on one node with OMP_NUM_THREADS unset (mpirun, srun): each LibTorch rank would
// run as many threads as the node has cores, all of them contending (an epoch 15.1 s against
// 8.6 s under torchrun). As torchrun does, one thread a rank, said once.
void limit_threads_as_torchrun_does(const World& world) {
  if (world.env().omp_threads_given || world.local_size() < 2 || at::get_num_threads() == 1) return;
  at::set_num_threads(1);
  if (world.local_rank() == 0)
    std::fprintf(stderr,
                 "ddp::DistributedDataParallel: OMP_NUM_THREADS is unset and %d ranks share this "
                 "node: LibTorch runs one thread a rank, as under torchrun (set OMP_NUM_THREADS "
                 "to choose)\n",
                 world.local_size());
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(torch::nn::Module& module, World& world,
                                                 const DistributedDataParallelOptions& options)
    : impl_(std::make_unique<Impl>(module, world, options)) {
  limit_threads_as_torchrun_does(world);
}

DistributedDataParallel::~DistributedDataParallel() = default;
DistributedDataParallel::DistributedDataParallel(DistributedDataParallel&&) noexcept = default;
DistributedDataParallel& DistributedDataParallel::operator=(DistributedDataParallel&&) noexcept =
    default;

void DistributedDataParallel::sync_buffers() {
  impl_->sync_buffers();
}

void DistributedDataParallel::gather_parameters() {
  impl_->gather_parameters();
}

void DistributedDataParallel::join(const std::function<void()>& loop) {
  impl_->join(loop);
}

void DistributedDataParallel::register_comm_hook(TorchCommHook hook) {
  DDP_USAGE_CHECK(hook != nullptr,
                  "ddp::DistributedDataParallel::register_comm_hook: an empty hook");
  Impl& impl = *impl_;
  DDP_USAGE_CHECK(!impl.hook && !impl.bf16_scratch.defined(),
                  "register_comm_hook: the buckets have a hook already ({}); one hook a model, as "
                  "PyTorch's register_comm_hook",
                  impl.hook ? "registered before" : "reduce_in_bf16's");
  DDP_USAGE_CHECK(!impl.in_backward,
                  "register_comm_hook during backward: register it between steps");
  impl.hook = std::move(hook);
}

std::vector<std::string> DistributedDataParallel::owned_parameter_names() const {
  std::vector<std::string> names;
  for (size_t i = 0; i < impl_->params.size(); ++i)
    if (!impl_->shards || impl_->shards->owns(i)) names.push_back(impl_->params[i].name);
  return names;
}

ShardedMemory DistributedDataParallel::memory() const {
  ShardedMemory memory;
  std::set<const void*> seen;
  const auto count = [&seen](const torch::Tensor& t) -> size_t {
    if (!t.defined() || !t.has_storage() || !seen.insert(t.storage().data()).second) return 0;
    return t.storage().nbytes();
  };
  for (const auto& p : impl_->module.parameters()) {
    memory.parameter_bytes += count(p);
    memory.gradient_bytes += count(p.grad());
  }
  return memory;
}

size_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  size_t bytes = 0;
  const auto add = [&bytes](const torch::Tensor& t) {
    if (t.defined()) bytes += static_cast<size_t>(t.numel()) * t.element_size();
  };
  // The state map is keyed by a string in LibTorch 1.13 and by the parameter's address in
  // later ones: only the values are read.
  for (const auto& entry : optimizer.state()) {
    const auto& state = entry.second;
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) {
      add(sgd->momentum_buffer());
    } else if (const auto* adamw =
                   dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
      add(adamw->exp_avg()), add(adamw->exp_avg_sq()), add(adamw->max_exp_avg_sq());
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state.get())) {
      add(adam->exp_avg()), add(adam->exp_avg_sq()), add(adam->max_exp_avg_sq());
    } else if (const auto* adagrad =
                   dynamic_cast<const torch::optim::AdagradParamState*>(state.get())) {
      add(adagrad->sum());
    } else if (const auto* rms =
                   dynamic_cast<const torch::optim::RMSpropParamState*>(state.get())) {
      add(rms->square_avg()), add(rms->momentum_buffer()), add(rms->grad_avg());
    } else {
      throw UsageError(
          "ddp::optimizer_state_bytes: knows the state of SGD, Adam, AdamW, Adagrad and RMSprop, "
          "not this optimizer's");
    }
  }
  return bytes;
}

void DistributedDataParallel::set_forward(torch::nn::AnyModule forward) {
  impl_->forward = std::move(forward);
}

torch::nn::AnyModule& DistributedDataParallel::forward_module() {
  DDP_USAGE_CHECK(!impl_->forward.is_empty(),
                  "ddp::DistributedDataParallel::forward: made from a torch::nn::Module&, it does "
                  "not know the module's forward; call model.sync_buffers() and then the module's "
                  "own forward, or make it from the module holder (or shared_ptr)");
  return impl_->forward;
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& owner)
    : owner_(owner), was_(owner.impl_->no_sync) {
  owner_.impl_->no_sync = true;
}

DistributedDataParallel::NoSync::~NoSync() {
  owner_.impl_->no_sync = was_;
}

torch::nn::Module& DistributedDataParallel::module() {
  return impl_->module;
}

const std::vector<Bucket>& DistributedDataParallel::buckets() const {
  return impl_->reducer->buckets();
}

std::vector<std::string> DistributedDataParallel::parameter_names() const {
  std::vector<std::string> names;
  for (const size_t i : impl_->param_of)
    names.push_back(impl_->params[i].name);
  return names;
}

void DistributedDataParallel::record_events(bool on) {
  impl_->reducer->record_events(on);
}

const std::vector<DdpEvent>& DistributedDataParallel::events() const {
  return impl_->reducer->events();
}

}  // namespace ddp
