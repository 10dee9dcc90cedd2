// DistributedDataParallel: the module's parameters and buffers, the hooks on the gradient
// accumulators and the end of backward (the hooks themselves: ddp_hooks.cpp; the buckets:
// ddp_buckets.cpp; join: ddp_join.cpp).
#include "torch/distributed_data_parallel.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_set>

#include "dist/agreement.h"
#include "runtime/error.h"
#include "torch/clip_grad.h"
#include "torch/ddp_impl.h"
#include "torch/device_staging.h"
#include "torch/sync_batch_norm.h"

#if DDP_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp {

namespace {

// The parameters some wrapper holds now (their TensorImpl, which torch::load's set_ keeps),
// so that a second wrapper of one module is refused by name rather than failing later.
std::mutex wrapped_mutex;
std::set<const c10::TensorImpl*>& wrapped() {
  static std::set<const c10::TensorImpl*> held;
  return held;
}

// Every SyncBatchNorm of `module` (itself included) reduces its statistics over `comm` (null:
// none); returns how many there are. Not module.modules(), which takes the module's shared_ptr
// and throws for a module made on the stack (`Net model;`, as pytorch/examples' cpp/mnist).
int set_sync_batch_norm_communicator(torch::nn::Module& module, Communicator* comm) {
  int count = 0;
  if (auto* sync = dynamic_cast<SyncBatchNormImpl*>(&module)) sync->set_communicator(comm), ++count;
  for (const auto& m : module.modules(/*include_self=*/false))
    if (auto* sync = dynamic_cast<SyncBatchNormImpl*>(m.get()))
      sync->set_communicator(comm), ++count;
  return count;
}

}  // namespace

DistributedDataParallel::Impl::Impl(torch::nn::Module& module_, Communicator& comm_,
                                    const DistributedDataParallelOptions& options_)
    : module(module_), comm(comm_), options(options_) {
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
  DDP_USAGE_CHECK(options.auto_wrap_min_params() >= 0 &&
                      (options.auto_wrap_min_params() == 0 || options.zero() == 3),
                  "ddp::DistributedDataParallelOptions().auto_wrap_min_params({}): expected 0, or "
                  "a count above 0 with zero(3) (shard units shard the parameters)",
                  options.auto_wrap_min_params());
  DDP_USAGE_CHECK(!options.param_dtype() ||
                      (options.zero() == 3 && (*options.param_dtype() == torch::kBFloat16 ||
                                               *options.param_dtype() == torch::kHalf)),
                  "ddp::DistributedDataParallelOptions().param_dtype({}): expected "
                  "torch::kBFloat16 or torch::kHalf, with zero(3) (the float32 pieces are the "
                  "master)",
                  options.param_dtype() ? c10::toString(*options.param_dtype()) : "none");
  if (options.zero() == 3 && comm.size() > 1) assign_units();
  make_reducer();
  for (const Param& p : params)
    param_bytes += static_cast<size_t>(p.numel()) * c10::elementSize(p.dtype);
  for (size_t b = 0; b < reducer->buckets().size() && !units.empty(); ++b)
    units[grad_buffers[reducer->buckets()[b].buffer].unit].buckets.push_back(b);
  check_and_copy_rank0s_state(all, bufs);
  if (options.zero() > 0 && comm.size() > 1) {
    // The parameters laid out as their gradients, sharded by dist/'s state over the reducer.
    std::vector<torch::Tensor> tensors;
    std::vector<TorchParams::Slot> slots;
    for (const Param& p : params) {
      tensors.push_back(p.tensor);
      slots.push_back({p.buffer, p.offset, p.sizes});
    }
    std::vector<torch::ScalarType> dtypes;
    std::vector<int64_t> counts;
    for (const GradBuffer& buffer : grad_buffers) {
      dtypes.push_back(buffer.dtype);
      counts.push_back(buffer.count);
    }
    std::vector<size_t> buffer_units;
    for (const GradBuffer& buffer : grad_buffers)
      buffer_units.push_back(buffer.unit);
    const ComputeStreamGuard on_stream(comm, stream());
    shards = std::make_unique<TorchParams>(
        tensors, slots, dtypes, counts, *reducer, param_of, options.zero(),
        [this](size_t i) { moved(i); }, [this] { return stream(); }, buffer_units);
  }
  point_grads_at_buckets();
  if (!units.empty()) {
    // Hooked while whole (their accumulators take their shape); now their pieces, the
    // gradients allocated a unit at a time from the first backward on.
    reducer->give_buffers_late();
    for (size_t u = 0; u < units.size(); ++u)
      free_unit_grads(u);
    for (size_t k = 0; k < grad_buffers.size() && bf16_scratch.defined(); ++k)
      if (grad_buffers[k].dtype == torch::kFloat32)  // each unit's with its gradients
        shards->state().buckets().set_bf16_scratch(k, nullptr);
    if (options.param_dtype()) shards->set_param_dtype(*options.param_dtype());
    shards->stale();
  }
  // batch statistics over every rank's slice
  sync_batch_norms = set_sync_batch_norm_communicator(module, &comm);
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
  const DeviceStaging through = torch_staging(device, device_scratch);
  if (comm.device_buffers()) {
    reducer->set_device_copies(through.to_device, through.to_host);
    reducer->set_device_scratch(through.scratch);
  }
  const ComputeStreamGuard on_stream(comm, stream());
  reducer->check_same_layout(layout);
  check_same_settings(comm, settings(), "ddp::DistributedDataParallel: the ranks' options differ",
                      "construct it with the same DistributedDataParallelOptions", through);
  device_scratch = torch::Tensor();
  // Rank 0's parameters and buffers, in one collective.
  std::vector<torch::Tensor> state;
  for (const auto& p : all)
    state.push_back(p.second);
  for (const auto& b : bufs)
    state.push_back(b.second);
  broadcast(state);
}

// The options every rank must give alike (each changes which collectives run, in what order
// or on what bytes), as the lines the construction compares.
std::vector<std::string> DistributedDataParallel::Impl::settings() const {
  return {fmt::format("bucket_cap_mb({})", options.bucket_cap_mb()),
          fmt::format("first_bucket_cap_mb({})", options.first_bucket_cap_mb()),
          fmt::format("find_unused_parameters({})", options.find_unused_parameters()),
          fmt::format("static_graph({})", options.static_graph()),
          fmt::format("broadcast_buffers({})", options.broadcast_buffers()),
          fmt::format("reduce_in_bf16({})", options.reduce_in_bf16()),
          fmt::format("zero({})", options.zero()),
          fmt::format("auto_wrap_min_params({})", options.auto_wrap_min_params()),
          fmt::format("reshard_after_forward({})", options.reshard_after_forward()),
          fmt::format("param_dtype({})",
                      options.param_dtype() ? c10::toString(*options.param_dtype()) : "none")};
}

// The first synchronised backward (or a joined rank's part in it), on every rank: the ranks'
// communication hooks compared, so that ranks that registered different ones (bf16 here, fp16
// there: the same bytes on the wire) stop naming them instead of training apart.
void DistributedDataParallel::Impl::agree_on_hook() {
  if (hook_agreed || comm.size() == 1) return;
  hook_agreed = true;
  check_same_settings(comm, {"comm hook " + describe_comm_hook(hook)},
                      "ddp::DistributedDataParallel: the ranks' communication hooks differ",
                      "register the same one (register_comm_hook) before the first backward",
                      torch_staging(device, device_scratch));
  device_scratch = torch::Tensor();
}

DistributedDataParallel::Impl::~Impl() {
  for (ShardUnitImpl* unit : unit_modules)
    unit->set_runner(nullptr, 0);
  *alive = nullptr;  // the gradients' hooks stay on the tensors and do nothing from now on
  for (Param& p : params)
    if (p.accumulator) p.accumulator->del_post_hook(p.hook);
  set_sync_batch_norm_communicator(module, nullptr);
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

// Collective: every rank's small `values` (flags, a map of the parameters used) reduced by `op`
// on every rank (dist/agreement.h), in the compute stream's order on the GPU.
std::vector<int32_t> DistributedDataParallel::Impl::agree(std::vector<int32_t> values,
                                                          ReduceOp op) {
  const ComputeStreamGuard on_stream(comm, stream());
  return all_reduce_values(comm, std::move(values), op, torch_staging(device, device_scratch));
}

double DistributedDataParallel::Impl::norm_parts(double part, double norm_type) {
  const ComputeStreamGuard on_stream(comm, stream());
  return all_reduce_doubles(comm, {part}, std::isinf(norm_type) ? ReduceOp::kMax : ReduceOp::kSum,
                            torch_staging(device, device_scratch))
      .at(0);
}

void DistributedDataParallel::Impl::broadcast(const std::vector<torch::Tensor>& tensors, int root) {
  if (comm.size() == 1 || tensors.empty()) return;
  torch::NoGradGuard no_grad;
  torch::Tensor flat = packed(tensors);
  const size_t words = static_cast<size_t>(flat.numel() / 4);
  if (comm.device_buffers()) {
    const ComputeStreamGuard on_stream(comm, stream());
    comm.broadcast_async(flat.data_ptr(), words, DataType::kInt32, root)->then_on(stream());
  } else {
    comm.broadcast(flat.data_ptr(), words, DataType::kInt32, root);
  }
  unpack(flat, tensors);
}

void DistributedDataParallel::Impl::gather_parameters() {
  reattach_replaced();
  if (!shards) return;
  const ComputeStreamGuard on_stream(comm, stream());
  if (!units.empty()) {
    for (Unit& unit : units)  // a prefetch in flight
      wait_all(unit.gathering, shards->state().buckets().gather_comm(), stream());
    keep_gathered = true;  // until the next synchronised backward ends
  }
  shards->gather();
}

void DistributedDataParallel::Impl::sync_buffers() {
  rebuild_buckets();
  if (joining && comm.size() > 1) {  // this rank trains one more step: the joined ranks hear of it
    join_all_reduce(1, no_sync ? 0 : 1);
    ++steps_joined;
    join_notified = true;
  }
  gather_for_forward();
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
  if (no_sync) {  // accumulated here, reduced by the next backward outside no_sync()
    if (!units.empty()) unit_ready(params[index].unit);  // its unit may be freed
    return;
  }
  if (!in_backward) {
    refuse_a_second_backward(index);
    begin_backward();
  }
  Param& p = params[index];
  DDP_USAGE_CHECK(!p.early_unused,
                  "ddp::DistributedDataParallel: parameter '{}' got a gradient, but {} marked it "
                  "unused when backward started ({}); compute the loss from forward()'s output "
                  "(or give prepare_for_backward every output it uses){}",
                  p.name, static_recorded ? "static_graph" : "find_unused_parameters",
                  static_recorded ? "the first step left it without one"
                                  : "forward's output does not depend on it",
                  static_recorded ? ", or construct without static_graph" : "");
  DDP_CHECK(!p.ready, "parameter '{}' got its gradient twice in one backward", p.name);
  DDP_USAGE_CHECK(!p.tensor.grad().defined() || !p.tensor.grad().is_sparse(),
                  "ddp::DistributedDataParallel: parameter '{}' has a sparse gradient (an "
                  "embedding with sparse(true)?); its buckets reduce dense gradients: make it "
                  "dense (sparse(false))",
                  p.name);
  p.ready = true;
  if (comm.size() == 1) return;  // one process: nothing to reduce, the gradient stays put
  if (!arrival_recorded) arrival.push_back(index);
  if (!units.empty()) unit_grads(p.unit);
  {
    torch::NoGradGuard no_grad;
    point_grad_at_view(p);
  }
  const ComputeStreamGuard on_stream(comm, stream());
  reducer->layer_ready(static_cast<int>(layer_of[index]));
  if (!units.empty()) unit_ready(p.unit);
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
  agree_on_hook();
  for (Param& p : params)
    p.ready = p.early_unused = false;
  reattach_replaced();
  rebuild_buckets();  // where this step runs no forward through the wrapper
  // ZeRO 2 and 3 free them between steps. Not zeroed: every slot is written before its bucket
  // is reduced (a gradient copied in as it is ready, an unused parameter's zeroed at the end of
  // backward).
  if (units.empty() && !grad_buffers[0].flat.defined()) make_grad_buffers();
  for (Unit& unit : units) {
    unit.waiting = unit.params.size();
    unit.reducing = false;
  }
  reducer->begin_backward(grad_memory());
  sample_memory();
  used.assign(params.size(), 1);
  // The parameters known unused already (forward's graph walk, or static_graph's first step):
  // their buckets need not wait for them.
  const std::vector<char> early = static_recorded ? static_unused : std::move(predicted_unused);
  predicted_unused.clear();
  for (size_t i = 0; i < early.size() && comm.size() > 1; ++i)
    if (early[i]) {
      params[i].ready = params[i].early_unused = true;
      mark_unused(i);
    }
  // Called by the autograd engine once backward is over (its final callback), unless the owner
  // ends it.
  if (!manual_end)
    torch::autograd::Engine::get_default_engine().queue_callback([this] { end_backward(); });
}

void DistributedDataParallel::Impl::end_backward() {
  in_backward = false;
  buffers_synced = false;
  forward_seen = false;
  reduce_at_end();
  sample_memory();
  last_peak = peak;
  plan_rebuild();
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
        if (!arrival_recorded) arrival.push_back(i);
        if (!units.empty()) unit_grads(p.unit);
        torch::NoGradGuard no_grad;
        point_grad_at_view(p);
        const ComputeStreamGuard on_stream(comm, stream());
        reducer->layer_ready(static_cast<int>(layer_of[i]));
        if (!units.empty()) unit_ready(p.unit);
      }
    }
    p.reattached = false;
    if (!p.ready) unused.push_back(i);
  }
  const bool handles_unused = options.find_unused_parameters() || options.static_graph();
  if (!unused.empty() && !handles_unused) {
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
  DDP_USAGE_CHECK(!static_recorded || unused.empty(),
                  "ddp::DistributedDataParallel with static_graph: parameter '{}' got no gradient "
                  "in this step but did in the first, so the graph changed; construct with "
                  "find_unused_parameters instead, which follows a graph that changes",
                  unused.empty() ? "" : params[unused[0]].name);
  if (comm.size() == 1) return;  // nothing to reduce
  const ComputeStreamGuard on_stream(comm, stream());
  for (const size_t i : unused)
    mark_unused(i);
  reducer->end_backward();
  reducer->finish(stream());
  if (handles_unused) {
    // A parameter no rank used keeps no gradient (as PyTorch's); one another rank used gets
    // the average. static_graph: what the first step's all-reduce found.
    if (!static_recorded) {
      const std::vector<int32_t> anywhere = agree(used, ReduceOp::kMax);
      used_anywhere.assign(anywhere.begin(), anywhere.end());
    }
    if (options.static_graph() && !static_recorded) {
      static_recorded = true;
      static_unused.assign(params.size(), 0);
      for (const size_t i : unused)
        static_unused[i] = 1;
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i)
      if (used[i] == 0 && used_anywhere[i]) params[i].tensor.mutable_grad() = params[i].view;
  }
  if (shards) keep_own_gradients();
}

// Parameter `i` gets no gradient in this backward: its part of its bucket is what its .grad()
// holds (a gradient accumulated earlier, zero after zero_grad()), or zero where it has none (then
// used[i] is 0); its bucket may go.
void DistributedDataParallel::Impl::mark_unused(size_t i) {
  Param& p = params[i];
  if (!arrival_recorded) arrival.push_back(i);
  if (!units.empty()) unit_grads(p.unit);
  {
    torch::NoGradGuard no_grad;
    if (!p.tensor.grad().defined()) {
      p.view.zero_();
      used[i] = 0;
    } else {
      point_grad_at_view(p);
    }
  }
  const ComputeStreamGuard on_stream(comm, stream());
  reducer->layer_ready(static_cast<int>(layer_of[i]));
  if (!units.empty()) unit_ready(p.unit);
}

// The parameters none of `outputs` depends on: a walk of the autograd graph from their
// functions, each parameter's gradient accumulator reached or not (PyTorch's
// prepare_for_backward). Several forwards before one backward: unused by all of them.
void DistributedDataParallel::Impl::prepare_for_backward(
    const std::vector<torch::Tensor>& outputs) {
  if (!options.find_unused_parameters() || options.static_graph() || no_sync || comm.size() == 1)
    return;
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const torch::Tensor& out : outputs)
    if (out.defined() && out.grad_fn() && seen.insert(out.grad_fn().get()).second)
      stack.push_back(out.grad_fn().get());
  if (stack.empty()) return;  // no graph (a forward without gradients): nothing to predict
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    for (const torch::autograd::Edge& edge : node->next_edges())
      if (edge.function && seen.insert(edge.function.get()).second)
        stack.push_back(edge.function.get());
  }
  if (predicted_unused.empty()) predicted_unused.assign(params.size(), 1);
  for (size_t i = 0; i < params.size(); ++i)
    predicted_unused[i] = predicted_unused[i] && !seen.count(params[i].accumulator.get());
}

// ZeRO, once the gradients are averaged: a parameter of another rank keeps no gradient (so the
// optimizer steps and keeps state for this rank's own only); this rank's own take their
// averaged pieces (reduce-scattered): with ZeRO 2 and 3 as tensors of their own, the flat
// buffer freed until the next backward; with ZeRO 1 copied into their place in the buffer,
// which is kept. The owners are about to step: the next forward gathers.
void DistributedDataParallel::Impl::keep_own_gradients() {
  torch::NoGradGuard no_grad;
  sample_memory();  // before the units' memory is freed
  if (!units.empty()) {
    // zero(3): an owned parameter's gradient is its averaged piece (1-D, as the parameter is
    // between steps), kept where the reduce-scatter left it; a hook's all-reduce leaves the
    // averages in the buffers, whose piece is copied out. Every unit's memory freed.
    for (size_t i = 0; i < params.size(); ++i) {
      Param& p = params[i];
      torch::Tensor& grad = p.tensor.mutable_grad();
      const bool got = used[i] != 0 || (i < used_anywhere.size() && used_anywhere[i]);
      if (!shards->owns(i) || !got)
        grad = torch::Tensor();
      else if (shards->shards_gradients())
        grad = shards->own_gradient(i);
      else
        grad = shards->piece_of(i, p.view).clone();
    }
    for (size_t u = 0; u < units.size(); ++u)
      free_unit_grads(u);
    keep_gathered = false;
    shards->stale();
    return;
  }
  // Whether `t` lies in parameter i's flat gradient buffer (freed below with ZeRO 2).
  const auto in_flat = [this](size_t i, const torch::Tensor& t) {
    const torch::Tensor& flat = grad_buffers[params[i].buffer].flat;
    const auto* at = static_cast<const char*>(t.data_ptr());
    const auto* begin = static_cast<const char*>(flat.data_ptr());
    return flat.defined() && at >= begin && at < begin + flat.nbytes();
  };
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor& grad = params[i].tensor.mutable_grad();
    if (!shards->owns(i)) {
      grad = torch::Tensor();
    } else if (shards->shards_gradients() && grad.defined() && options.zero() >= 2) {
      // The averaged piece where the reduce-scatter left it (apart, kept until the next
      // backward's reduction), or copied out of a whole bucket's place in the flat buffer.
      const torch::Tensor averaged = shards->own_gradient(i);
      grad = in_flat(i, averaged) ? averaged.clone() : averaged;
    } else if (shards->shards_gradients() && grad.defined()) {
      const torch::Tensor averaged = shards->own_gradient(i);
      if (averaged.data_ptr() != grad.data_ptr()) grad.copy_(averaged);  // into its place
    } else if (options.zero() >= 2 && grad.defined())
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
    : impl_(std::make_unique<Impl>(module, world.comm(), options)) {
  limit_threads_as_torchrun_does(world);
}

DistributedDataParallel::DistributedDataParallel(torch::nn::Module& module, Communicator& group,
                                                 const DistributedDataParallelOptions& options)
    : impl_(std::make_unique<Impl>(module, group, options)) {}

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
  DDP_USAGE_CHECK(!impl.hook_agreed,
                  "register_comm_hook after the first synchronised backward: register it before "
                  "(the ranks compare their hooks there, as the first backward's buckets go out)");
  impl.hook = std::move(hook);
  // ZeRO: the hook reduces each bucket whole (as plain DDP's), the owners take their share.
  if (impl.shards) impl.shards->keep_all_reduce();
  impl.reducer->register_comm_hook(
      [&impl](Communicator&, const GradBucket& bucket) { return impl.run_user_hook(bucket); });
}

std::vector<std::string> DistributedDataParallel::owned_parameter_names() const {
  std::vector<std::string> names;
  for (size_t i = 0; i < impl_->params.size(); ++i)
    if (!impl_->shards || impl_->shards->owns(i)) names.push_back(impl_->params[i].name);
  return names;
}

std::vector<ParameterShard> DistributedDataParallel::parameter_shards() const {
  std::vector<ParameterShard> shards;
  const TorchParams* zero = impl_->shards.get();
  // Without ZeRO every rank holds every parameter: one writes each, spread by bytes.
  std::vector<size_t> load(static_cast<size_t>(impl_->comm.size()), 0);
  for (size_t i = 0; i < impl_->params.size(); ++i) {
    const Impl::Param& p = impl_->params[i];
    ParameterShard shard{p.name, p.sizes, p.dtype, 0, {}, p.tensor, true, true, p.sizes};
    if (zero && zero->level() == 3) {
      shard.offset = zero->piece_offset(i);
      shard.values = zero->own_piece(i);
      shard.steps = shard.values.numel() > 0;
      shard.state_shape = {shard.values.numel()};
    } else {
      shard.values = p.tensor.detach().view(-1);
      shard.steps = !zero || zero->owns(i);
    }
    if (zero) {
      shard.writes = shard.steps;
    } else {
      const auto least = std::min_element(load.begin(), load.end());
      *least += static_cast<size_t>(p.numel()) * c10::elementSize(p.dtype);
      shard.writes = least - load.begin() == impl_->comm.rank();
    }
    shards.push_back(std::move(shard));
  }
  return shards;
}

void DistributedDataParallel::shards_written() {
  if (impl_->shards && impl_->shards->level() == 3) impl_->shards->stale();
}

ShardedMemory DistributedDataParallel::memory() const {
  ShardedMemory memory = impl_->last_peak;
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

namespace {

// A Sequential's forward is a template (the caller names its return type), which AnyModule
// cannot hold: this module runs it as Tensor -> Tensor, the form LibTorch's examples call; with
// auto-wrapped units each unit's children run through the wrapper's runner.
struct SequentialForwardImpl : torch::nn::Module {
  SequentialForwardImpl(std::shared_ptr<torch::nn::SequentialImpl> sequential, UnitRunner* runner,
                        std::vector<int> child_unit)
      : sequential(std::move(sequential)), runner(runner), child_unit(std::move(child_unit)) {}
  torch::Tensor forward(torch::Tensor input) {
    if (child_unit.empty()) return sequential->forward(std::move(input));
    torch::Tensor x = std::move(input);
    const size_t n = sequential->size();
    for (size_t i = 0; i < n;) {
      size_t end = i + 1;  // the children of child i's unit, run together
      while (child_unit[i] >= 0 && end < n && child_unit[end] == child_unit[i])
        ++end;
      const auto children = [this, i, end, &x] {
        torch::Tensor y = x;
        for (size_t c = i; c < end; ++c)
          y = sequential->begin()[static_cast<std::ptrdiff_t>(c)].forward(y);
        return y;
      };
      x = child_unit[i] >= 0 ? runner->run_unit(static_cast<size_t>(child_unit[i]), children)
                             : children();
      i = end;
    }
    return x;
  }
  std::shared_ptr<torch::nn::SequentialImpl> sequential;
  UnitRunner* runner;
  std::vector<int> child_unit;
};

}  // namespace

void DistributedDataParallel::keep_sequential_forward(
    std::shared_ptr<torch::nn::SequentialImpl> sequential) {
  set_forward(torch::nn::AnyModule(std::make_shared<SequentialForwardImpl>(
      std::move(sequential), impl_.get(), impl_->child_unit)));
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

void DistributedDataParallel::prepare_for_backward(const std::vector<torch::Tensor>& outputs) {
  impl_->prepare_for_backward(outputs);
}

void DistributedDataParallel::record_events(bool on) {
  impl_->recording_events = on;
  impl_->reducer->record_events(on);
}

double DistributedDataParallel::clip_grad_norm_(double max_norm, double norm_type) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : impl_->module.parameters())
    grads.push_back(p.grad());
  double part = gradient_norm_part(grads, norm_type);
  // Plain DDP: every rank holds the same averaged gradients. ZeRO: each its own share of them.
  if (impl_->shards && impl_->comm.size() > 1) part = impl_->norm_parts(part, norm_type);
  const double total = norm_of_part(part, norm_type);
  clip_gradients(grads, max_norm, total);
  return total;
}

void DistributedDataParallel::unshard() {
  impl_->unshard();
}

void DistributedDataParallel::reshard() {
  impl_->reshard();
}

const std::vector<DdpEvent>& DistributedDataParallel::events() const {
  return impl_->reducer->events();
}

}  // namespace ddp
