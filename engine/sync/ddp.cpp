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
      layer_count_(static_cast<int>(layers.size())) {}

Ddp::Ddp(Communicator& comm, const std::vector<ParamSpan>& layers, const DdpOptions& options)
    : comm_(comm),
      buckets_(plan_buckets(layers, options)),
      overlap_(options.overlap),
      layer_count_(static_cast<int>(layers.size())) {}

namespace {

// `text` of rank `root` on every rank (collective over `comm`, a host communicator).
std::string broadcast_text(Communicator& comm, const std::string& text, int root) {
  int64_t length = static_cast<int64_t>(text.size());
  comm.broadcast(&length, 1, DataType::kInt64, root);
  // As 32-bit words (the communicators move numbers), padded.
  const size_t words = (static_cast<size_t>(length) + 3) / 4;
  std::string out = comm.rank() == root ? text : std::string();
  out.resize(words * 4, '\0');
  if (words > 0) comm.broadcast(out.data(), words, DataType::kInt32, root);
  out.resize(static_cast<size_t>(length));
  return out;
}

}  // namespace

void Ddp::check_same_layout(const std::vector<NamedParam>& params) {
  DDP_CHECK(!comm_.device_buffers(), "check_same_layout(names) takes a host communicator");
  // Rank 0's description to everyone; each compares and finds where it differs first.
  std::string mine;
  for (const NamedParam& p : params)
    mine += p.name + '\n' + std::to_string(p.count) + '\n';
  const std::string theirs = broadcast_text(comm_, mine, 0);
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
  comm_.all_gather(&first, all.data(), 1, DataType::kInt64);
  // The lowest rank that differs says what it has, so that every rank names both sides.
  const auto differs = std::find_if(all.begin(), all.end(), [](int64_t at) { return at >= 0; });
  if (differs == all.end()) return;
  const int r = static_cast<int>(differs - all.begin());
  const size_t i = static_cast<size_t>(*differs);
  const auto describe = [i](const std::vector<NamedParam>& list) {
    return i < list.size() ? fmt::format("'{}' of {} elements", list[i].name, list[i].count)
                           : std::string("nothing");
  };
  const std::string its = broadcast_text(comm_, describe(params), r);
  throw UsageError(
      fmt::format("the model differs between ranks: rank {} has parameter {} {} where rank 0 has "
                  "{}; every rank must build the same model",
                  r, i, its, describe(reference)));
}

void Ddp::check_same_layout(uint64_t fingerprint, const std::string& description,
                            void* device_scratch) {
  const int n = comm_.size();
  std::vector<int64_t> mine = {static_cast<int64_t>(fingerprint)};
  std::vector<int64_t> all(n);
  if (comm_.device_buffers()) {
    DDP_CHECK(device_scratch != nullptr, "check_same_layout over {} needs a device buffer",
              comm_.backend());
    copy_to_device_(device_scratch, mine.data(), sizeof(int64_t));
    auto* slots = static_cast<int64_t*>(device_scratch);
    comm_.all_gather(slots, slots + 1, 1, DataType::kInt64);
    copy_to_host_(all.data(), slots + 1, sizeof(int64_t) * n);
  } else {
    comm_.all_gather(mine.data(), all.data(), 1, DataType::kInt64);
  }
  std::string differ;
  for (int r = 0; r < n; ++r)
    if (all[r] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  DDP_USAGE_CHECK(differ.empty(),
                  "--layers: rank(s) {} hold a different model than rank 0 (this rank: {}); every "
                  "rank must be started with the same --layers",
                  differ, description);
}

void Ddp::broadcast_parameters(float* params, size_t count) {
  comm_.broadcast(params, count, DataType::kFloat32, 0);
}

void Ddp::begin_backward(float* grads) {
  DDP_USAGE_CHECK(grads != nullptr || ringed(), "Ddp::begin_backward: no gradient buffer (null)");
  in_backward_ = true;
  grads_ = grads;
  next_bucket_ = 0;
  pending_.clear();
}

void Ddp::reduce_in_bf16(void* scratch) {
  comm_.require_bf16_reduction();  // before training, not at the first step
  DDP_CHECK(scratch != nullptr, "reduce_in_bf16: no scratch buffer");
  bf16_scratch_ = static_cast<uint16_t*>(scratch);
}

void Ddp::shard(int level, const DeviceMemory* device) {
  DDP_USAGE_CHECK(level >= 1 && level <= 3, "--zero {}: expected 0, 1, 2 or 3", level);
  DDP_CHECK(!comm_.device_buffers() || device != nullptr,
            "Ddp::shard over {} needs the device's memory", comm_.backend());
  DDP_USAGE_CHECK(bf16_scratch_ == nullptr || device != nullptr,
                  "--zero {} with --grad-reduce bf16: on the GPU (NCCL) only", level);
  zero_ = level;
  // Host collectives take any piece size: a bucket that divides evenly is sharded in place,
  // only the others go through a padded copy. NCCL's pieces are kept 256-byte aligned.
  shards_ = plan_shards(buckets_, comm_.size(), comm_.rank(),
                        device == nullptr   ? 1
                        : device->align > 0 ? device->align
                                            : kDeviceShardAlign);
  if (device != nullptr) device_ = *device;
  if (bf16_scratch_ != nullptr) {
    // A bucket's bf16 copy spans its padded pieces (from its offset): where the last one
    // would overrun the gradients' scratch, a larger one (bf16 values, two a float).
    size_t total = 0, need = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      total = std::max(total, buckets_[b].offset + buckets_[b].count);
      need = std::max(need, buckets_[b].offset + shards_.parts[b].piece * comm_.size());
    }
    if (need > total) bf16_scratch_ = reinterpret_cast<uint16_t*>(device_.allocate((need + 1) / 2));
  }
  bucket_scratch_.assign(buckets_.size(), nullptr);
  bucket_host_.assign(buckets_.size(), {});
  scratch_floats_ = 0;
  if (ringed()) {
    DDP_CHECK(level >= 2 && overlap_, "a gradient ring needs --zero 2 or 3 and overlap");
    for (size_t b = 0; b < buckets_.size(); ++b) {
      DDP_CHECK(shards_.parts[b].piece * comm_.size() <= device_.slot_floats,
                "gradient ring: bucket {}'s pieces ({} x {}) overrun its slot of {}", b,
                shards_.parts[b].piece, comm_.size(), device_.slot_floats);
      bucket_scratch_[b] = device_.bucket_grads(b);  // the slot is also the padded copy
    }
    reduced_device_ = device_.allocate(shards_.shard_count);
    scratch_floats_ = shards_.shard_count;  // the slots are the gradients' own memory
    return;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!padded(b)) continue;
    const size_t floats = shards_.parts[b].piece * comm_.size();
    if (device != nullptr) {
      bucket_scratch_[b] = device_.allocate(floats);
    } else {
      bucket_host_[b].assign(floats, 0.0f);
      bucket_scratch_[b] = bucket_host_[b].data();
    }
    scratch_floats_ += floats;
  }
  if (level >= 2 && device == nullptr) {
    reduced_shard_.assign(shards_.shard_count, 0.0f);
    scratch_floats_ += shards_.shard_count;
  }
}

size_t Ddp::scratch_floats() const {
  return scratch_floats_;
}

const float* Ddp::reduced_piece(size_t bucket) const {
  const ShardPart& p = shards_.parts.at(bucket);
  if (zero_ == 1) return grads_ + p.offset;
  if (!reduced_shard_.empty()) return reduced_shard_.data() + p.shard_at;
  if (ringed()) return reduced_device_ + p.shard_at;
  // In place: the piece's own place in the bucket, or in its padded copy.
  return padded(bucket) ? bucket_scratch_[bucket] + p.piece * shards_.rank : grads_ + p.offset;
}

void Ddp::take_shard(const float* full, float* shard) const {
  std::fill(shard, shard + shards_.shard_count, 0.0f);
  for (const ShardPart& p : shards_.parts)
    std::copy_n(full + p.offset, p.count, shard + p.shard_at);
}

void Ddp::copy(float* dst, const float* src, size_t floats) {
  if (comm_.device_buffers())
    device_.copy(dst, src, floats);
  else
    std::copy_n(src, floats, dst);
}

void Ddp::wait_all(std::vector<std::unique_ptr<Work>>& works, void* stream) {
  for (auto& work : works) {
    if (comm_.device_buffers())
      work->then_on(stream);
    else
      work->wait(comm_.timeout());
  }
  works.clear();
}

void Ddp::gather_shards(const float* shard, float* full, void* stream) {
  std::vector<std::unique_ptr<Work>> gathers;
  for (size_t b = 0; b < shards_.parts.size(); ++b) {
    const ShardPart& p = shards_.parts[b];
    float* into = padded(b) ? bucket_scratch_[b] : full + p.bucket_offset;
    gathers.push_back(
        comm_.all_gather_async(shard + p.shard_at, into, p.piece, DataType::kFloat32));
    if (ringed() && padded(b)) copy_back(b, full, gathers, stream);  // its slot is shared
  }
  wait_all(gathers, stream);
  if (!ringed())
    for (size_t b = 0; b < shards_.parts.size(); ++b)
      if (padded(b)) copy_back(b, full, gathers, stream);
}

void Ddp::gather_in_place(float* full, void* stream) {
  // Host collectives send from a copy of the rank's piece (their all-gather does not take an
  // aliased input); NCCL's is in place.
  const bool host = !comm_.device_buffers();
  std::vector<std::vector<float>> mine(host ? shards_.parts.size() : 0);
  std::vector<std::unique_ptr<Work>> gathers;
  for (size_t b = 0; b < shards_.parts.size(); ++b) {
    const ShardPart& p = shards_.parts[b];
    float* into = padded(b) ? bucket_scratch_[b] : full + p.bucket_offset;
    const float* send = into + p.piece * shards_.rank;
    if (host) {
      mine[b].assign(p.piece, 0.0f);
      std::copy_n(full + p.offset, p.count, mine[b].data());
      send = mine[b].data();
    } else if (padded(b) && p.count > 0) {
      copy(into + p.piece * shards_.rank, full + p.offset, p.count);
    }
    gathers.push_back(comm_.all_gather_async(send, into, p.piece, DataType::kFloat32));
    if (ringed() && padded(b)) copy_back(b, full, gathers, stream);  // its slot is shared
  }
  wait_all(gathers, stream);
  if (!ringed())
    for (size_t b = 0; b < shards_.parts.size(); ++b)
      if (padded(b)) copy_back(b, full, gathers, stream);
}

void Ddp::gather_bucket(size_t b, const float* shard, float* into) {
  gather_bucket_async(b, shard, into)->wait(gather_comm().timeout());
}

std::unique_ptr<Work> Ddp::gather_bucket_async(size_t b, const float* shard, float* into) {
  const ShardPart& p = shards_.parts.at(b);
  return gather_comm().all_gather_async(shard + p.shard_at, into, p.piece, DataType::kFloat32);
}

void Ddp::copy_back(size_t b, float* full, std::vector<std::unique_ptr<Work>>& gathers,
                    void* stream) {
  wait_all(gathers, stream);
  copy(full + shards_.parts[b].bucket_offset, bucket_scratch_[b], shards_.parts[b].bucket_count);
}

void Ddp::issue(size_t bucket) {
  const Bucket& b = buckets_[bucket];
  if (zero_ >= 2) {
    // The bucket (or its padded copy) reduce-scattered into this rank's averaged piece: on
    // the host into the pieces' own buffer, on the device in place.
    const ShardPart& p = shards_.parts[bucket];
    if (ringed()) {
      // From its slot, the tail past the bucket zeroed, into the averaged pieces; the bucket
      // ring_slots later waits for it before backward writes the slot again.
      float* slot = device_.bucket_grads(bucket);
      device_.zero(slot + b.count, p.piece * comm_.size() - b.count);
      pending_.push_back(reduce_scatter(slot, reduced_device_ + p.shard_at, bucket));
      record({"reduce_scatter_issued", b.first_layer, static_cast<int>(bucket)});
      const size_t next = bucket + 1, slots = static_cast<size_t>(device_.ring_slots);
      if (next < buckets_.size() && next >= slots) {
        if (comm_.device_buffers())
          pending_[next - slots]->then_on(device_.stream);
        else
          pending_[next - slots]->wait(comm_.timeout());
      }
      return;
    }
    float* send = grads_ + b.offset;
    if (padded(bucket)) {
      float* scratch = bucket_scratch_[bucket];
      copy(scratch, grads_ + b.offset, b.count);
      const size_t tail = p.piece * comm_.size() - b.count;
      if (comm_.device_buffers())
        device_.zero(scratch + b.count, tail);
      else
        std::fill_n(scratch + b.count, tail, 0.0f);
      send = scratch;
    }
    float* recv =
        reduced_shard_.empty() ? send + p.piece * shards_.rank : reduced_shard_.data() + p.shard_at;
    pending_.push_back(reduce_scatter(send, recv, bucket));
    record({"reduce_scatter_issued", b.first_layer, static_cast<int>(bucket)});
    return;
  }
  pending_.push_back(bf16_scratch_ != nullptr
                         ? comm_.all_reduce_bf16_async(grads_ + b.offset, bf16_scratch_ + b.offset,
                                                       b.count, ReduceOp::kAverage)
                         : comm_.all_reduce_async(grads_ + b.offset, b.count, DataType::kFloat32,
                                                  ReduceOp::kAverage));
  record({"allreduce_issued", b.first_layer, static_cast<int>(bucket)});
}

std::unique_ptr<Work> Ddp::reduce_scatter(const float* send, float* recv, size_t bucket) {
  const size_t piece = shards_.parts[bucket].piece;
  if (bf16_scratch_ != nullptr)
    return comm_.reduce_scatter_bf16_async(send, recv, bf16_scratch_ + buckets_[bucket].offset,
                                           piece, ReduceOp::kAverage);
  return comm_.reduce_scatter_async(send, recv, piece, DataType::kFloat32, ReduceOp::kAverage);
}

void Ddp::layer_done(int layer) {
  DDP_USAGE_CHECK(in_backward_,
                  "Ddp::layer_done({}) before begin_backward: call begin_backward(grads) when a "
                  "step's backward starts",
                  layer);
  DDP_USAGE_CHECK(layer >= 0 && layer < layer_count_,
                  "Ddp::layer_done({}): the model has layers 0 to {} (as given to Ddp)", layer,
                  layer_count_ - 1);
  record({"layer_done", layer, -1});
  if (!overlap_) return;
  // A bucket is complete once its lowest layer is done (layers arrive last to first).
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first_layer >= layer)
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

void Ddp::finish(void* stream) {
  wait_all(pending_, stream);
  record({"allreduce_waited", -1, -1});
}

}  // namespace ddp
