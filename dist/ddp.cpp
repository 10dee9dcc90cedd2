// Reducer: bucket planning and the backward hooks.
#include "dist/ddp.h"

#include <algorithm>

#include "dist/agreement.h"
#include "runtime/error.h"

namespace ddp {

Reducer::Reducer(Communicator& comm, const std::vector<ParamSpan>& layers, size_t bucket_bytes,
                 size_t first_bucket_bytes, bool overlap)
    : comm_(comm),
      buckets_(plan_buckets(layers, bucket_bytes, first_bucket_bytes)),
      overlap_(overlap),
      layer_count_(static_cast<int>(layers.size())) {
  index_layers();
}

Reducer::Reducer(Communicator& comm, const std::vector<ParamSpan>& layers,
                 const DdpOptions& options)
    : comm_(comm),
      buckets_(plan_buckets(layers, options)),
      overlap_(options.overlap),
      layer_count_(static_cast<int>(layers.size())) {
  index_layers();
}

Reducer::Reducer(Communicator& comm, std::vector<Bucket> buckets, int layer_count, bool overlap)
    : comm_(comm), buckets_(std::move(buckets)), overlap_(overlap), layer_count_(layer_count) {
  int next = layer_count;  // the buckets tile the layers downwards, with no gap
  for (size_t b = 0; b < buckets_.size(); ++b) {
    DDP_CHECK(
        buckets_[b].last_layer == next - 1 && buckets_[b].first_layer <= buckets_[b].last_layer,
        "Reducer: bucket {} holds layers {} to {} where layer {} was expected to end it (buckets "
        "tile the {} layers, the highest first)",
        b, buckets_[b].first_layer, buckets_[b].last_layer, next - 1, layer_count);
    next = buckets_[b].first_layer;
  }
  DDP_CHECK(next == 0, "Reducer: the buckets leave layers 0 to {} out", next - 1);
  index_layers();
}

void Reducer::index_layers() {
  bucket_of_.assign(static_cast<size_t>(layer_count_), -1);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (int layer = buckets_[b].first_layer; layer <= buckets_[b].last_layer; ++layer)
      bucket_of_[static_cast<size_t>(layer)] = static_cast<int>(b);
  waiting_.assign(buckets_.size(), 0);
  buffer_count_ = 1;
  for (const Bucket& b : buckets_)
    buffer_count_ = std::max(buffer_count_, b.buffer + 1);
}

void Reducer::check_same_layout(const std::vector<NamedParam>& params) {
  DDP_CHECK(!comm_.device_buffers() ||
                (device_scratch_ && copy_to_device_ != nullptr && copy_to_host_ != nullptr),
            "check_same_layout(names) over {} needs set_device_copies and set_device_scratch",
            comm_.backend());
  std::vector<std::string> lines;
  for (const NamedParam& p : params)
    lines.push_back(fmt::format("'{}' of {} elements", p.name, p.count));
  const std::optional<LineDifference> difference =
      first_difference(comm_, lines, {device_scratch_, copy_to_device_, copy_to_host_});
  if (!difference) return;
  throw UsageError(
      fmt::format("the model differs between ranks: rank {} has parameter {} {} where rank 0 has "
                  "{}; every rank must build the same model",
                  difference->rank, difference->index, difference->theirs, difference->rank0s));
}

void Reducer::check_same_layout(uint64_t fingerprint, const std::string& description,
                                void* device_scratch) {
  // The device scratch holds size() + 1 int64: this rank's, then everyone's (Relay's layout).
  const int n = comm_.size();
  DDP_CHECK(!comm_.device_buffers() || device_scratch != nullptr,
            "check_same_layout over {} needs a device buffer", comm_.backend());
  const DeviceStaging staging{[device_scratch](size_t) { return device_scratch; }, copy_to_device_,
                              copy_to_host_};
  const std::vector<int64_t> all =
      all_gather_value(comm_, static_cast<int64_t>(fingerprint), staging);
  std::string differ;
  for (int r = 0; r < n; ++r)
    if (all[r] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  DDP_USAGE_CHECK(differ.empty(),
                  "rank(s) {} hold a different model than rank 0 (this rank: {}); every rank must "
                  "build the same model",
                  differ, description);
}

void Reducer::broadcast_parameters(float* params, size_t count) {
  comm_.broadcast(params, count, DataType::kFloat32, 0);
}

void Reducer::begin_backward(float* grads) {
  begin_backward(std::vector<GradMemory>{{grads, DataType::kFloat32}});
}

void Reducer::begin_backward(std::vector<GradMemory> buffers) {
  DDP_CHECK(buffers.size() == buffer_count_,
            "Reducer::begin_backward: {} gradient buffers for buckets over {}", buffers.size(),
            buffer_count_);
  bool missing = false;
  for (const GradMemory& buffer : buffers)
    missing = missing || buffer.data == nullptr;
  DDP_USAGE_CHECK(!missing || user_hook_ || late_buffers_ ||
                      (reduction_ != nullptr && reduction_->keeps_gradients()),
                  "Reducer::begin_backward: no gradient buffer (null)");
  in_backward_ = true;
  buffers_ = std::move(buffers);
  next_bucket_ = 0;
  pending_.clear();
  std::fill(waiting_.begin(), waiting_.end(), 0);
  ready_.assign(bucket_of_.size(), 0);
  for (const int bucket : bucket_of_)
    if (bucket >= 0) ++waiting_[static_cast<size_t>(bucket)];
}

void Reducer::set_buffer(size_t buffer, const GradMemory& memory) {
  DDP_CHECK(late_buffers_ && in_backward_ && buffer < buffers_.size(),
            "Reducer::set_buffer({}): buffers are given late only during backward, after "
            "give_buffers_late()",
            buffer);
  buffers_[buffer] = memory;
}

float* Reducer::grads() const {
  if (buffers_.size() != 1 || buffers_[0].type != DataType::kFloat32) return nullptr;
  return static_cast<float*>(buffers_[0].data);
}

CommHook allreduce_hook() {
  return [](Communicator& comm, const GradBucket& bucket) {
    return comm.all_reduce_async(bucket.data, bucket.count, bucket.type, ReduceOp::kAverage);
  };
}

CommHook bf16_compress_hook(uint16_t* scratch) {
  DDP_CHECK(scratch != nullptr, "bf16_compress_hook: no scratch buffer");
  return [scratch](Communicator& comm, const GradBucket& bucket) {
    if (bucket.type != DataType::kFloat32)
      return comm.all_reduce_async(bucket.data, bucket.count, bucket.type, ReduceOp::kAverage);
    return comm.all_reduce_bf16_async(static_cast<float*>(bucket.data), scratch + bucket.offset,
                                      bucket.count, ReduceOp::kAverage);
  };
}

void Reducer::reduce_in_bf16(void* scratch) {
  comm_.require_bf16_reduction();  // before training, not at the first step
  DDP_CHECK(scratch != nullptr, "reduce_in_bf16: no scratch buffer");
  DDP_USAGE_CHECK(!user_hook_,
                  "reduce_in_bf16: a communication hook is registered; bf16 travel is a hook "
                  "itself (bf16_compress_hook): register one of them");
  bf16_scratch_ = static_cast<uint16_t*>(scratch);
  hook_ = bf16_compress_hook(bf16_scratch_);
}

void Reducer::register_comm_hook(CommHook hook) {
  DDP_USAGE_CHECK(hook != nullptr, "register_comm_hook: an empty hook");
  DDP_USAGE_CHECK(!user_hook_ && bf16_scratch_ == nullptr,
                  "register_comm_hook: the buckets have a hook already ({}); one hook a model, as "
                  "PyTorch's register_comm_hook",
                  user_hook_ ? "registered before" : "reduce_in_bf16's");
  DDP_USAGE_CHECK(
      reduction_ == nullptr,
      "register_comm_hook: the buckets are reduced by ZeRO's sharded reduction, which a "
      "hook cannot replace");
  DDP_USAGE_CHECK(!in_backward_, "register_comm_hook during backward: register it between steps");
  hook_ = std::move(hook);
  user_hook_ = true;
}

void Reducer::set_reduction(BucketReduction* reduction) {
  DDP_USAGE_CHECK(reduction == nullptr || !user_hook_,
                  "a communication hook is registered: ZeRO's sharded reduction cannot replace it");
  reduction_ = reduction;
}

void Reducer::issue(size_t bucket) {
  const Bucket& b = buckets_[bucket];
  if (reduction_ != nullptr) {
    pending_.push_back(reduction_->reduce(bucket, buffers_[b.buffer]));
    record({reduction_->issued_event(), b.first_layer, static_cast<int>(bucket)});
    return;
  }
  const GradMemory& buffer = buffers_[b.buffer];
  void* data = buffer.data != nullptr
                   ? static_cast<char*>(buffer.data) + b.offset * dtype_bytes(buffer.type)
                   : nullptr;
  const GradBucket view{bucket, data, buffer.type, b.count, b.offset, b.buffer};
  pending_.push_back(
      hook_ ? hook_(comm_, view)
            : comm_.all_reduce_async(view.data, view.count, view.type, ReduceOp::kAverage));
  record({"allreduce_issued", b.first_layer, static_cast<int>(bucket)});
}

void Reducer::check_layer(const char* what, int layer) const {
  DDP_USAGE_CHECK(in_backward_,
                  "Reducer::{}({}) before begin_backward: call begin_backward(grads) when a step's "
                  "backward starts",
                  what, layer);
  DDP_USAGE_CHECK(layer >= 0 && layer < layer_count_,
                  "Reducer::{}({}): the model has layers 0 to {} (as given to Reducer)", what,
                  layer, layer_count_ - 1);
}

void Reducer::layer_done(int layer) {
  check_layer("layer_done", layer);
  record({"layer_done", layer, -1});
  if (!overlap_) return;
  // A bucket is complete once its lowest layer is done (layers arrive last to first).
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first_layer >= layer)
    issue(next_bucket_++);
}

void Reducer::layer_ready(int layer) {
  check_layer("layer_ready", layer);
  const int bucket = bucket_of_[static_cast<size_t>(layer)];
  DDP_USAGE_CHECK(!ready_[static_cast<size_t>(layer)],
                  "Reducer::layer_ready({}): layer {} was already ready in this step", layer,
                  layer);
  ready_[static_cast<size_t>(layer)] = 1;
  --waiting_[static_cast<size_t>(bucket)];
  record({"layer_done", layer, -1});
  if (!overlap_) return;
  while (next_bucket_ < buckets_.size() && waiting_[next_bucket_] == 0)
    issue(next_bucket_++);
}

void Reducer::end_backward() {
  DDP_USAGE_CHECK(in_backward_,
                  "Reducer::end_backward before begin_backward: call begin_backward(grads) when a "
                  "step's backward starts");
  in_backward_ = false;
  record({"backward_done", -1, -1});
  while (next_bucket_ < buckets_.size())
    issue(next_bucket_++);
}

void wait_all(std::vector<std::unique_ptr<Work>>& works, Communicator& comm, void* stream) {
  for (auto& work : works) {
    if (!work) continue;  // a hook that finished its bucket itself
    if (comm.device_buffers())
      work->then_on(stream);
    else
      work->wait(comm.timeout());
  }
  works.clear();
}

void Reducer::finish(void* stream) {
  wait_all(pending_, comm_, stream);
  record({"allreduce_waited", -1, -1});
}

}  // namespace ddp
