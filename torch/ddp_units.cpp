// DistributedDataParallel's shard units (zero(3) over several ranks; torch/shard_unit.h): which
// parameters each unit holds, a unit's gathers around its forward and backward, its gradients'
// memory from its backward's start until its buckets are reduced, and ddp's count of the step's
// peak memory.
#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "runtime/error.h"
#include "torch/checkpoint.h"
#include "torch/ddp_impl.h"

namespace ddp {

// zero(3) over several ranks: each parameter's unit. The ShardUnits of the module (outer ones
// first, so that an inner unit's parameters are its own), then auto_wrap_min_params' groups of
// a Sequential's children, then the root: the parameters of none.
void DistributedDataParallel::Impl::assign_units() {
  std::vector<std::vector<torch::Tensor>> groups;
  std::vector<ShardUnitImpl*> modules;
  for (const auto& m : module.modules(/*include_self=*/false))
    if (auto* unit = dynamic_cast<ShardUnitImpl*>(m.get())) {
      modules.push_back(unit);
      groups.push_back(unit->parameters());
    }
  const int64_t min_params = options.auto_wrap_min_params();
  if (min_params > 0) {
    auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&module);
    DDP_USAGE_CHECK(sequential != nullptr,
                    "ddp::DistributedDataParallelOptions().auto_wrap_min_params({}): the wrapped "
                    "module is not a torch::nn::Sequential, whose children it groups; declare "
                    "ddp::ShardUnit modules in the model instead",
                    min_params);
    std::vector<torch::Tensor> group;
    int64_t elements = 0;
    for (const auto& child : sequential->children()) {
      for (const torch::Tensor& t : child->parameters())
        if (t.requires_grad()) group.push_back(t), elements += t.numel();
      child_unit.push_back(group.empty() ? -1 : static_cast<int>(groups.size()));
      if (elements >= min_params) {
        groups.push_back(std::move(group));
        group.clear();
        elements = 0;
      }
    }
    if (!group.empty()) groups.push_back(std::move(group));
  }
  std::map<const c10::TensorImpl*, size_t> unit_of;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const torch::Tensor& t : groups[g])
      unit_of[t.unsafeGetTensorImpl()] = g;
  // Numbered densely in that order (a unit without trainable parameters is none), the root last.
  std::map<size_t, size_t> number;
  for (const Param& p : params) {
    const auto found = unit_of.find(p.tensor.unsafeGetTensorImpl());
    if (found != unit_of.end()) number.emplace(found->second, 0);
  }
  size_t next = 0;
  for (auto& [group, n] : number)
    n = next++;
  units.resize(next);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto found = unit_of.find(params[i].tensor.unsafeGetTensorImpl());
    if (found == unit_of.end() && root_unit == static_cast<size_t>(-1)) {
      root_unit = units.size();
      units.emplace_back();
    }
    params[i].unit = found != unit_of.end() ? number[found->second] : root_unit;
    units[params[i].unit].params.push_back(i);
  }
  for (int& unit : child_unit) {
    const auto found = number.find(static_cast<size_t>(unit));
    unit = unit >= 0 && found != number.end() ? static_cast<int>(found->second) : -1;
  }
  for (size_t m = 0; m < modules.size(); ++m)
    if (number.count(m)) {
      modules[m]->set_runner(this, number[m]);
      unit_modules.push_back(modules[m]);
    }
}

// Before a forward through the wrapper: with units, every parameter a view of its shape (the
// units gathered at their use) and the root unit gathered; else gather_parameters().
void DistributedDataParallel::Impl::gather_for_forward() {
  peak = {};
  if (units.empty()) return gather_parameters();
  reattach_replaced();
  const ComputeStreamGuard on_stream(comm, stream());
  shards->begin_step();
  // The last step's averaged pieces are not the shape of this step's gradients: dropped (every
  // level from 2 replaces the gradients at each synchronised backward), so that autograd
  // writes them anew. A no_sync() backward's gradients have the shape and stay.
  for (Param& p : params) {
    torch::Tensor& grad = p.tensor.mutable_grad();
    if (grad.defined() && grad.sizes() != torch::IntArrayRef(p.sizes)) grad = torch::Tensor();
  }
  if (root_unit < units.size()) gather_unit(root_unit, true);
  sample_memory();
}

// Unit u's parameters gathered (its gather started now, or before as a prefetch), waited for
// where asked.
void DistributedDataParallel::Impl::gather_unit(size_t u, bool wait) {
  Unit& unit = units[u];
  if (!shards->unit_gathered(u)) {
    shards->gather_unit(u, unit.gathering);
    note("unit_gather_issued", u);
  }
  if (!wait || unit.gathering.empty()) return;
  if (reducer->recording()) {
    const bool ready = std::all_of(unit.gathering.begin(), unit.gathering.end(),
                                   [](const auto& work) { return work->is_completed(); });
    note(ready ? "unit_gather_ready" : "unit_gather_waited", u);
  }
  wait_all(unit.gathering, shards->state().buckets().gather_comm(), stream());
}

void DistributedDataParallel::Impl::unshard() {
  if (units.empty()) return;
  DDP_USAGE_CHECK(shards->current(),
                  "ddp::DistributedDataParallel::unshard() before this step's sync_buffers() or "
                  "forward(): call it after one of them");
  const ComputeStreamGuard on_stream(comm, stream());
  for (size_t u = 0; u < units.size(); ++u)
    gather_unit(u, false);
  keep_gathered = true;
}

void DistributedDataParallel::Impl::reshard() {
  if (units.empty()) return;
  const ComputeStreamGuard on_stream(comm, stream());
  for (size_t u = 0; u < units.size(); ++u) {
    wait_all(units[u].gathering, shards->state().buckets().gather_comm(), stream());
    shards->free_unit(u);
  }
  keep_gathered = false;
  sample_memory();
}

void DistributedDataParallel::Impl::note(const char* what, size_t u) {
  if (reducer->recording()) reducer->note({what, static_cast<int>(u), -1});
}

torch::Tensor DistributedDataParallel::Impl::run_unit(size_t u,
                                                      const std::function<torch::Tensor()>& run) {
  if (units.empty()) return run();
  DDP_USAGE_CHECK(shards->current(),
                  "ddp::DistributedDataParallel with zero(3): a shard unit's forward ran without "
                  "model.forward(...), model.sync_buffers() or model.gather_parameters() before it "
                  "in this step; call one of them before each forward");
  {
    const ComputeStreamGuard on_stream(comm, stream());
    gather_unit(u, true);
    // The next unit's, meanwhile; not in ddp::checkpoint's recompute (a backward: the next
    // unit's backward is over).
    if (u + 1 < units.size() && !detail::recomputing()) gather_unit(u + 1, false);
    sample_memory();
  }
  note("unit_forward", u);
  torch::Tensor out = run();
  // Inside ddp::checkpoint's recompute the unit's backward follows at once: kept gathered.
  if (options.reshard_after_forward() && !keep_gathered && !detail::recomputing())
    shards->free_unit(u);
  if (torch::GradMode::is_enabled() && out.requires_grad())
    out.register_hook([this, u](const torch::Tensor&) { before_backward_of(u); });
  return out;
}

// The gradient of unit u's output is ready: its backward is next. Its parameters gathered
// again (and the unit before it meanwhile), its gradient buffers allocated; the gradients of the
// units whose backward ended before the last one's freed once reduced.
void DistributedDataParallel::Impl::before_backward_of(size_t u) {
  units[u].waiting = units[u].params.size();  // this backward's (no_sync()'s too)
  const ComputeStreamGuard on_stream(comm, stream());
  gather_unit(u, true);
  if (u > 0) gather_unit(u - 1, false);
  if (comm.size() > 1 && !no_sync) unit_grads(u);
  free_reduced_grads(u + 2);
  sample_memory();
  note("unit_backward", u);
}

// Unit u's parameters are all ready this backward: its gathered parameters are not needed
// again by it, and (outside no_sync()) its buckets go out, in order.
void DistributedDataParallel::Impl::unit_ready(size_t u) {
  Unit& unit = units[u];
  if (unit.waiting > 0) --unit.waiting;
  if (unit.waiting > 0) return;
  if (!keep_gathered && u != root_unit) shards->free_unit(u);
  if (no_sync) return;  // its gradients accumulate in .grad(), nothing to reduce
  unit.reducing = true;
  free_reduced_grads(units.size());
}

// The gradients of the units being reduced freed where their buckets' reductions are done, and
// those of units `keep_from` and above (their backward ended two units ago) waited for first.
// Not with a communication hook: the averages stay in the buffers until the end of backward.
void DistributedDataParallel::Impl::free_reduced_grads(size_t keep_from) {
  if (!shards->shards_gradients() || !in_backward) return;
  for (size_t v = 0; v < units.size(); ++v) {
    Unit& unit = units[v];
    if (!unit.reducing || !unit.has_grads) continue;
    bool issued = true, done = true;
    for (const size_t b : unit.buckets) {
      issued = issued && b < reducer->issued();
      done = done && issued && reducer->pending(b).is_completed();
    }
    if (!issued || (!done && v < keep_from)) continue;
    for (const size_t b : unit.buckets)  // device: the stream waits, the memory is reused after it
      if (comm.device_buffers())
        reducer->pending(b).then_on(stream());
      else
        reducer->pending(b).wait(comm.timeout());
    free_unit_grads(v);
  }
}

// This step's peak so far of the parameters' and gradients' memory ddp holds.
void DistributedDataParallel::Impl::sample_memory() {
  size_t held = 0, grads = 0;
  if (shards) {
    held = shards->held_bytes();
    grads = shards->state().buckets().scratch_bytes();
  } else {
    held = param_bytes;  // whole on every rank
  }
  for (const GradBuffer& buffer : grad_buffers)
    if (buffer.flat.defined()) grads += buffer.flat.storage().nbytes();
  peak.peak_parameter_bytes = std::max(peak.peak_parameter_bytes, held);
  peak.peak_gradient_bytes = std::max(peak.peak_gradient_bytes, grads);
}

// Unit u's gradient buffers allocated (their tails zero) and its parameters' views of them;
// the reducer takes them where its backward has begun.
void DistributedDataParallel::Impl::unit_grads(size_t u) {
  Unit& unit = units[u];
  if (unit.has_grads) return;
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < grad_buffers.size(); ++k) {
    GradBuffer& buffer = grad_buffers[k];
    if (buffer.unit != u) continue;
    buffer.flat =
        torch::empty({buffer.count}, torch::TensorOptions().dtype(buffer.dtype).device(device));
    for (const auto& [of, at, count] : pads)
      if (static_cast<size_t>(of) == k) buffer.flat.narrow(0, at, count).zero_();
    if (bf16_scratch.defined() && buffer.dtype == torch::kFloat32) {  // its gradients' wire
      buffer.bf16 = torch::empty({buffer.count},
                                 torch::TensorOptions().dtype(torch::kBFloat16).device(device));
      shards->state().buckets().set_bf16_scratch(k, static_cast<uint16_t*>(buffer.bf16.data_ptr()));
    }
    if (in_backward)
      reducer->set_buffer(k, {buffer.flat.data_ptr(), wire_type(buffer.dtype, params[0].name)});
  }
  for (const size_t i : unit.params)
    make_view(params[i]);
  unit.has_grads = true;
}

// Unit u's gradient buffers freed (its reduction is over), with its parameters' views of them.
void DistributedDataParallel::Impl::free_unit_grads(size_t u) {
  Unit& unit = units[u];
  if (!unit.has_grads) return;
  for (size_t k = 0; k < grad_buffers.size(); ++k) {
    GradBuffer& buffer = grad_buffers[k];
    if (buffer.unit != u) continue;
    buffer.flat = torch::Tensor();
    if (in_backward) reducer->set_buffer(k, {nullptr, wire_type(buffer.dtype, params[0].name)});
    if (buffer.bf16.defined()) {
      buffer.bf16 = torch::Tensor();
      shards->state().buckets().set_bf16_scratch(k, nullptr);
    }
  }
  for (const size_t i : unit.params) {
    Param& p = params[i];
    torch::Tensor& grad = p.tensor.mutable_grad();
    if (grad.defined() && p.view.defined() && grad.is_same(p.view)) grad = torch::Tensor();
    p.view = torch::Tensor();
  }
  unit.has_grads = false;
}

}  // namespace ddp
