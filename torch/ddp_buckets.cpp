// DistributedDataParallel's buckets: planned by dtype (plan_grouped_buckets), a gradient buffer
// a dtype with each parameter's .grad() a view of it, each bucket's reduction, and the rebuild
// of the buckets from the order the first step's gradients arrived in.
#include <torch/torch.h>

#include <algorithm>

#include "dist/zero.h"
#include "runtime/error.h"
#include "torch/ddp_impl.h"

namespace ddp {

// Buckets of one dtype each (PyTorch's bucketing by dtype), reduced in the order backward
// completes them; a buffer a dtype; the buckets' reduction as the reducer's hook.
void DistributedDataParallel::Impl::make_reducer() {
  DDP_USAGE_CHECK(options.bucket_cap_mb() > 0 && options.first_bucket_cap_mb() >= 0,
                  "ddp::DistributedDataParallelOptions: bucket_cap_mb {} and first_bucket_cap_mb "
                  "{}: expected sizes above 0",
                  options.bucket_cap_mb(), options.first_bucket_cap_mb());
  use_plan(plan({}));
  make_grad_buffers();
  for (GradBuffer& buffer : grad_buffers)
    buffer.flat.zero_();
  if (options.reduce_in_bf16() && comm.size() > 1) {  // one process reduces nothing
    comm.require_bf16_reduction();
    // One float32 buffer's scratch; with units each unit's float32 buffer gets one of its own
    // with its gradients (unit_grads), this one only stands for them.
    for (const GradBuffer& buffer : grad_buffers)
      if (buffer.dtype == torch::kFloat32)
        bf16_scratch = torch::empty({units.empty() ? buffer.count : 1},
                                    torch::TensorOptions().dtype(torch::kBFloat16).device(device));
    if (bf16_scratch.defined()) reducer->reduce_in_bf16(bf16_scratch.data_ptr());
  }
}

// The buckets for gradients arriving in `arrival`'s order (empty: the last parameter first).
GroupedBuckets DistributedDataParallel::Impl::plan(const std::vector<size_t>& arrival) const {
  std::vector<size_t> counts, element_bytes;
  std::vector<int> kinds;
  for (const Param& p : params) {
    counts.push_back(static_cast<size_t>(p.numel()));
    // With units a buffer a unit and dtype, so that a unit's gradients and gathered parameters
    // are memory of their own.
    kinds.push_back(static_cast<int>(p.unit) * kUnitKinds + static_cast<int>(p.dtype));
    element_bytes.push_back(dtype_bytes(wire_type(p.dtype, p.name)));
  }
  // Units: each unit's backward is its reduction's start, no smaller first bucket a unit.
  const double first = units.empty() ? options.first_bucket_cap_mb() : options.bucket_cap_mb();
  return plan_grouped_buckets(counts, kinds, element_bytes,
                              static_cast<size_t>(options.bucket_cap_mb() * 1048576),
                              static_cast<size_t>(first * 1048576), arrival);
}

// `planned`'s numbering, each dtype's buffer layout (its parameters in the reducer's order, so
// that a bucket is a range of it) and a reducer over its buckets, which reduces them itself (the
// average in each dtype, bf16 travel) or through the user's hook. The buffers are not made.
void DistributedDataParallel::Impl::use_plan(GroupedBuckets planned) {
  param_of = planned.order;
  layer_of.assign(params.size(), 0);
  for (size_t j = 0; j < param_of.size(); ++j)
    layer_of[param_of[j]] = j;
  if (!units.empty()) pad_buckets(planned);
  grad_buffers.clear();
  for (size_t b = 0; b < planned.buffer_kinds.size(); ++b)
    grad_buffers.push_back({static_cast<torch::ScalarType>(planned.buffer_kinds[b] % kUnitKinds),
                            static_cast<size_t>(planned.buffer_kinds[b] / kUnitKinds),
                            static_cast<int64_t>(planned.buffer_sizes[b]),
                            {}});
  for (const Bucket& bucket : planned.buckets) {
    int64_t offset = static_cast<int64_t>(bucket.offset);
    for (int layer = bucket.first_layer; layer <= bucket.last_layer; ++layer) {
      Param& p = params[param_of[static_cast<size_t>(layer)]];
      p.buffer = bucket.buffer;
      p.offset = offset;
      offset += p.numel();
    }
  }
  reducer = std::make_unique<Reducer>(comm, std::move(planned.buckets),
                                      static_cast<int>(params.size()), options.overlap());
  reducer->record_events(recording_events);
  if (hook)
    reducer->register_comm_hook(
        [this](Communicator&, const GradBucket& bucket) { return run_user_hook(bucket); });
  if (bf16_scratch.defined()) reducer->reduce_in_bf16(bf16_scratch.data_ptr());
}

// zero(3)'s equal pieces are the buckets themselves (no padded copies, gathered in place): each
// bucket's count rounded up to a multiple of the ranks (of kDeviceShardAlign elements each on the
// GPU), its tail never written by a gradient; `pads` records the tails.
void DistributedDataParallel::Impl::pad_buckets(GroupedBuckets& planned) {
  const size_t multiple =
      static_cast<size_t>(comm.size()) * (device.is_cuda() ? kDeviceShardAlign : 1);
  pads.clear();
  for (size_t k = 0; k < planned.buffer_sizes.size(); ++k) {
    std::vector<size_t> in_buffer;  // its buckets, in the buffer's order
    for (size_t b = 0; b < planned.buckets.size(); ++b)
      if (planned.buckets[b].buffer == k) in_buffer.push_back(b);
    std::sort(in_buffer.begin(), in_buffer.end(), [&planned](size_t a, size_t b) {
      return planned.buckets[a].offset < planned.buckets[b].offset;
    });
    size_t at = 0;
    for (const size_t b : in_buffer) {
      Bucket& bucket = planned.buckets[b];
      const size_t padded = (bucket.count + multiple - 1) / multiple * multiple;
      if (padded > bucket.count)
        pads.push_back({static_cast<int64_t>(k), static_cast<int64_t>(at + bucket.count),
                        static_cast<int64_t>(padded - bucket.count)});
      bucket.offset = at;
      bucket.count = padded;
      at += padded;
    }
    planned.buffer_sizes[k] = at;
  }
}

// Each dtype's gradient buffer as the reducer takes it (null where a unit's is not allocated).
std::vector<GradMemory> DistributedDataParallel::Impl::grad_memory() const {
  std::vector<GradMemory> memory;
  for (const GradBuffer& buffer : grad_buffers)
    memory.push_back({buffer.flat.defined() ? buffer.flat.data_ptr() : nullptr,
                      wire_type(buffer.dtype, params[0].name)});
  return memory;
}

// The end of the first synchronised backward: rank 0's order of arrival (each rank may see
// its own; one order for all, as PyTorch takes rank 0's) planned again, to be used from the
// next step where it cuts other buckets (PyTorch's rebuilt buckets). Collective; not inside
// join(), where a rank that has joined would not take part.
void DistributedDataParallel::Impl::plan_rebuild() {
  const bool first = !arrival_recorded;
  arrival_recorded = true;
  // ZeRO keeps the first buckets: its owners and pieces are cut from them.
  if (!first || comm.size() == 1 || joining || shards || arrival.size() != params.size()) return;
  std::vector<int32_t> order(arrival.begin(), arrival.end());
  torch::Tensor rank0s = torch::tensor(order, torch::kInt32).to(device);
  broadcast({rank0s});
  rank0s = rank0s.cpu();
  std::vector<size_t> agreed;
  for (int64_t k = 0; k < rank0s.numel(); ++k)
    agreed.push_back(static_cast<size_t>(rank0s[k].item<int32_t>()));
  GroupedBuckets rebuilt = plan(agreed);
  bool same = rebuilt.order == param_of && rebuilt.buckets.size() == reducer->buckets().size();
  for (size_t b = 0; same && b < rebuilt.buckets.size(); ++b)
    same = rebuilt.buckets[b].first_layer == reducer->buckets()[b].first_layer;
  if (!same) pending_plan = std::make_unique<GroupedBuckets>(std::move(rebuilt));
  arrival.clear();
}

// The rebuilt buckets in use from here (before a step's forward or backward): new buffers, each
// gradient that was a view of the old ones copied into its new view.
void DistributedDataParallel::Impl::rebuild_buckets() {
  if (!pending_plan) return;
  torch::NoGradGuard no_grad;
  const bool allocated = grad_buffers[0].flat.defined();  // ZeRO 2, 3 free them between steps
  std::vector<torch::Tensor> old_views;
  std::vector<char> was_view;
  for (Param& p : params) {
    const torch::Tensor& grad = p.tensor.grad();
    was_view.push_back(grad.defined() && p.view.defined() && grad.is_same(p.view));
    old_views.push_back(p.view);
  }
  const std::vector<GradBuffer> old = grad_buffers;  // alive until the copies are done
  use_plan(std::move(*pending_plan));
  pending_plan.reset();
  if (!allocated) {
    for (Param& p : params)
      p.view = torch::Tensor();
    return;
  }
  make_grad_buffers();
  for (GradBuffer& buffer : grad_buffers)
    buffer.flat.zero_();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!was_view[i]) continue;
    params[i].view.copy_(old_views[i]);
    params[i].tensor.mutable_grad() = params[i].view;
  }
}

// The user's hook (register_comm_hook) on bucket `bucket`: its range of its dtype's buffer,
// with its parameters and their gradients.
std::unique_ptr<Work> DistributedDataParallel::Impl::run_user_hook(const GradBucket& bucket) {
  const GradBuffer& buffer = grad_buffers[bucket.buffer];
  TorchGradBucket view{bucket.index,
                       buffer.flat.narrow(0, static_cast<int64_t>(bucket.offset),
                                          static_cast<int64_t>(bucket.count)),
                       {},
                       {}};
  const Bucket& planned = reducer->buckets()[bucket.index];
  for (int layer = planned.first_layer; layer <= planned.last_layer; ++layer) {
    const Param& p = params[param_of[static_cast<size_t>(layer)]];
    view.parameters.push_back(p.tensor);
    view.gradients.push_back(p.view);
  }
  return hook(comm, view);
}

// Each dtype's gradient buffer (uninitialised), and the parameters' views of it.
void DistributedDataParallel::Impl::make_grad_buffers() {
  for (GradBuffer& buffer : grad_buffers)
    buffer.flat =
        torch::empty({buffer.count}, torch::TensorOptions().dtype(buffer.dtype).device(device));
  make_views();
}

// Each parameter's slot of its dtype's gradient buffer, a tensor of its shape.
void DistributedDataParallel::Impl::make_views() {
  for (Param& p : params)
    make_view(p);
}

void DistributedDataParallel::Impl::make_view(Param& p) {
  torch::NoGradGuard no_grad;
  // The buffer's memory, but not an autograd view of it: LibTorch's Optimizer::zero_grad()
  // detaches gradients in place, which views refuse.
  const torch::Tensor& flat = grad_buffers[p.buffer].flat;
  p.view = torch::empty({0}, flat.options())
               .set_(flat.storage(), p.offset, p.sizes, dense_strides(p.sizes));
}

}  // namespace ddp
