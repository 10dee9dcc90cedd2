// Ddp: bucket planning and the backward hooks.
#include "engine/sync/ddp.h"

#include <algorithm>

#include "runtime/error.h"

namespace ddp {

Ddp::Ddp(Communicator& comm, const std::vector<ParamSpan>& layers, size_t bucket_bytes,
         size_t first_bucket_bytes, bool overlap)
    : comm_(comm),
      buckets_(plan_buckets(layers, bucket_bytes, first_bucket_bytes)),
      overlap_(overlap),
      layer_count_(static_cast<int>(layers.size())) {
  index_layers();
}

Ddp::Ddp(Communicator& comm, const std::vector<ParamSpan>& layers, const DdpOptions& options)
    : comm_(comm),
      buckets_(plan_buckets(layers, options)),
      overlap_(options.overlap),
      layer_count_(static_cast<int>(layers.size())) {
  index_layers();
}

Ddp::Ddp(Communicator& comm, std::vector<Bucket> buckets, int layer_count, bool overlap)
    : comm_(comm), buckets_(std::move(buckets)), overlap_(overlap), layer_count_(layer_count) {
  int next = layer_count;  // the buckets tile the layers downwards, with no gap
  for (size_t b = 0; b < buckets_.size(); ++b) {
    DDP_CHECK(
        buckets_[b].last_layer == next - 1 && buckets_[b].first_layer <= buckets_[b].last_layer,
        "Ddp: bucket {} holds layers {} to {} where layer {} was expected to end it (buckets "
        "tile the {} layers, the highest first)",
        b, buckets_[b].first_layer, buckets_[b].last_layer, next - 1, layer_count);
    next = buckets_[b].first_layer;
  }
  DDP_CHECK(next == 0, "Ddp: the buckets leave layers 0 to {} out", next - 1);
  index_layers();
}

void Ddp::index_layers() {
  bucket_of_.assign(static_cast<size_t>(layer_count_), -1);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (int layer = buckets_[b].first_layer; layer <= buckets_[b].last_layer; ++layer)
      bucket_of_[static_cast<size_t>(layer)] = static_cast<int>(b);
  waiting_.assign(buckets_.size(), 0);
}

namespace {

// Host memory exchanged over `comm`: directly with a host communicator, through a device
// scratch and the copies with a device one.
struct Relay {
  Communicator& comm;
  const Ddp::ScratchFn& scratch;
  Ddp::CopyFn to_device;
  Ddp::CopyFn to_host;

  // words[count] of rank `root` on every rank.
  void broadcast(int32_t* words, size_t count, int root) {
    if (count == 0) return;
    if (!comm.device_buffers()) return comm.broadcast(words, count, DataType::kInt32, root);
    void* device = scratch(count * sizeof(int32_t));
    to_device(device, words, count * sizeof(int32_t));
    comm.broadcast(device, count, DataType::kInt32, root);
    to_host(words, device, count * sizeof(int32_t));
  }
  // all[size] holds every rank's `mine`, in rank order.
  void all_gather(int64_t mine, int64_t* all) {
    if (!comm.device_buffers()) return comm.all_gather(&mine, all, 1, DataType::kInt64);
    const size_t n = static_cast<size_t>(comm.size());
    auto* device = static_cast<int64_t*>(scratch((n + 1) * sizeof(int64_t)));
    to_device(device, &mine, sizeof(int64_t));
    comm.all_gather(device, device + 1, 1, DataType::kInt64);
    to_host(all, device + 1, n * sizeof(int64_t));
  }
  // `text` of rank `root` on every rank.
  std::string broadcast_text(const std::string& text, int root) {
    // The length and the text as 32-bit words (the communicators move numbers), padded.
    constexpr size_t kWord = sizeof(int32_t);
    int32_t length = static_cast<int32_t>(text.size());
    broadcast(&length, 1, root);
    const size_t words = (static_cast<size_t>(length) + kWord - 1) / kWord;
    std::string out = comm.rank() == root ? text : std::string();
    out.resize(words * kWord, '\0');
    broadcast(reinterpret_cast<int32_t*>(out.data()), words, root);
    out.resize(static_cast<size_t>(length));
    return out;
  }
};

}  // namespace

void Ddp::check_same_layout(const std::vector<NamedParam>& params) {
  DDP_CHECK(!comm_.device_buffers() ||
                (device_scratch_ && copy_to_device_ != nullptr && copy_to_host_ != nullptr),
            "check_same_layout(names) over {} needs set_device_copies and set_device_scratch",
            comm_.backend());
  Relay relay{comm_, device_scratch_, copy_to_device_, copy_to_host_};
  // Rank 0's description to everyone; each compares and finds where it differs first.
  std::string mine;
  for (const NamedParam& p : params)
    mine += p.name + '\n' + std::to_string(p.count) + '\n';
  const std::string theirs = relay.broadcast_text(mine, 0);
  std::vector<NamedParam> reference;
  for (size_t at = 0; at < theirs.size();) {
    const size_t a = theirs.find('\n', at), b = theirs.find('\n', a + 1);
    reference.push_back({theirs.substr(at, a - at), std::stoull(theirs.substr(a + 1, b - a - 1))});
    at = b + 1;
  }
  int64_t first = -1;  // the first index that differs here, -1: none
  for (size_t i = 0; i < std::max(params.size(), reference.size()) && first < 0; ++i)
    if (i >= params.size() || i >= reference.size() || params[i].name != reference[i].name ||
        params[i].count != reference[i].count)
      first = static_cast<int64_t>(i);
  std::vector<int64_t> all(static_cast<size_t>(comm_.size()));
  relay.all_gather(first, all.data());
  // The lowest rank that differs says what it has, so that every rank names both sides.
  const auto differs = std::find_if(all.begin(), all.end(), [](int64_t at) { return at >= 0; });
  if (differs == all.end()) return;
  const int r = static_cast<int>(differs - all.begin());
  const size_t i = static_cast<size_t>(*differs);
  const auto describe = [i](const std::vector<NamedParam>& list) {
    return i < list.size() ? fmt::format("'{}' of {} elements", list[i].name, list[i].count)
                           : std::string("nothing");
  };
  const std::string its = relay.broadcast_text(describe(params), r);
  throw UsageError(
      fmt::format("the model differs between ranks: rank {} has parameter {} {} where rank 0 has "
                  "{}; every rank must build the same model",
                  r, i, its, describe(reference)));
}

void Ddp::check_same_layout(uint64_t fingerprint, const std::string& description,
                            void* device_scratch) {
  // The device scratch holds size() + 1 int64: this rank's, then everyone's (Relay's layout).
  const int n = comm_.size();
  DDP_CHECK(!comm_.device_buffers() || device_scratch != nullptr,
            "check_same_layout over {} needs a device buffer", comm_.backend());
  const ScratchFn given = [device_scratch](size_t) { return device_scratch; };
  std::vector<int64_t> all(static_cast<size_t>(n));
  Relay{comm_, given, copy_to_device_, copy_to_host_}.all_gather(static_cast<int64_t>(fingerprint),
                                                                 all.data());
  std::string differ;
  for (int r = 0; r < n; ++r)
    if (all[r] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  DDP_USAGE_CHECK(differ.empty(),
                  "rank(s) {} hold a different model than rank 0 (this rank: {}); every rank must "
                  "build the same model",
                  differ, description);
}

void Ddp::broadcast_parameters(float* params, size_t count) {
  comm_.broadcast(params, count, DataType::kFloat32, 0);
}

void Ddp::begin_backward(float* grads) {
  DDP_USAGE_CHECK(
      grads != nullptr || user_hook_ || (reduction_ != nullptr && reduction_->keeps_gradients()),
      "Ddp::begin_backward: no gradient buffer (null)");
  in_backward_ = true;
  grads_ = grads;
  next_bucket_ = 0;
  pending_.clear();
  std::fill(waiting_.begin(), waiting_.end(), 0);
  ready_.assign(bucket_of_.size(), 0);
  for (const int bucket : bucket_of_)
    if (bucket >= 0) ++waiting_[static_cast<size_t>(bucket)];
}

CommHook allreduce_hook() {
  return [](Communicator& comm, const GradBucket& bucket) {
    return comm.all_reduce_async(bucket.data, bucket.count, DataType::kFloat32, ReduceOp::kAverage);
  };
}

CommHook bf16_compress_hook(uint16_t* scratch) {
  DDP_CHECK(scratch != nullptr, "bf16_compress_hook: no scratch buffer");
  return [scratch](Communicator& comm, const GradBucket& bucket) {
    return comm.all_reduce_bf16_async(bucket.data, scratch + bucket.offset, bucket.count,
                                      ReduceOp::kAverage);
  };
}

void Ddp::reduce_in_bf16(void* scratch) {
  comm_.require_bf16_reduction();  // before training, not at the first step
  DDP_CHECK(scratch != nullptr, "reduce_in_bf16: no scratch buffer");
  DDP_USAGE_CHECK(!user_hook_,
                  "reduce_in_bf16: a communication hook is registered; bf16 travel is a hook "
                  "itself (bf16_compress_hook): register one of them");
  bf16_scratch_ = static_cast<uint16_t*>(scratch);
  hook_ = bf16_compress_hook(bf16_scratch_);
}

void Ddp::register_comm_hook(CommHook hook) {
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

void Ddp::set_reduction(BucketReduction* reduction) {
  DDP_USAGE_CHECK(reduction == nullptr || !user_hook_,
                  "a communication hook is registered: ZeRO's sharded reduction cannot replace it");
  reduction_ = reduction;
}

void Ddp::issue(size_t bucket) {
  const Bucket& b = buckets_[bucket];
  if (reduction_ != nullptr) {
    pending_.push_back(reduction_->reduce(bucket, grads_));
    record({reduction_->issued_event(), b.first_layer, static_cast<int>(bucket)});
    return;
  }
  const GradBucket view{bucket, grads_ != nullptr ? grads_ + b.offset : nullptr, b.count, b.offset};
  pending_.push_back(hook_ ? hook_(comm_, view)
                           : comm_.all_reduce_async(view.data, view.count, DataType::kFloat32,
                                                    ReduceOp::kAverage));
  record({"allreduce_issued", b.first_layer, static_cast<int>(bucket)});
}

void Ddp::check_layer(const char* what, int layer) const {
  DDP_USAGE_CHECK(in_backward_,
                  "Ddp::{}({}) before begin_backward: call begin_backward(grads) when a step's "
                  "backward starts",
                  what, layer);
  DDP_USAGE_CHECK(layer >= 0 && layer < layer_count_,
                  "Ddp::{}({}): the model has layers 0 to {} (as given to Ddp)", what, layer,
                  layer_count_ - 1);
}

void Ddp::layer_done(int layer) {
  check_layer("layer_done", layer);
  record({"layer_done", layer, -1});
  if (!overlap_) return;
  // A bucket is complete once its lowest layer is done (layers arrive last to first).
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first_layer >= layer)
    issue(next_bucket_++);
}

void Ddp::layer_ready(int layer) {
  check_layer("layer_ready", layer);
  const int bucket = bucket_of_[static_cast<size_t>(layer)];
  DDP_USAGE_CHECK(!ready_[static_cast<size_t>(layer)],
                  "Ddp::layer_ready({}): layer {} was already ready in this step", layer, layer);
  ready_[static_cast<size_t>(layer)] = 1;
  --waiting_[static_cast<size_t>(bucket)];
  record({"layer_done", layer, -1});
  if (!overlap_) return;
  while (next_bucket_ < buckets_.size() && waiting_[next_bucket_] == 0)
    issue(next_bucket_++);
}

void Ddp::end_backward() {
  DDP_USAGE_CHECK(in_backward_,
                  "Ddp::end_backward before begin_backward: call begin_backward(grads) when a "
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

void Ddp::finish(void* stream) {
  wait_all(pending_, comm_, stream);
  record({"allreduce_waited", -1, -1});
}

}  // namespace ddp
