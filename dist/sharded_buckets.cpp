// ShardedBuckets: ZeRO's reduce-scatter of each bucket, its memory, and the pieces' gathers.
#include "dist/sharded_buckets.h"

#include <algorithm>

#include "runtime/error.h"

namespace ddp {

ShardedBuckets::ShardedBuckets(Ddp& ddp, int level, const ShardMemory* memory)
    : ddp_(ddp), comm_(ddp.comm()), level_(level), bf16_scratch_(ddp.bf16_scratch()) {
  DDP_USAGE_CHECK(level >= 1 && level <= 3, "--zero {}: expected 0, 1, 2 or 3", level);
  DDP_CHECK(!comm_.device_buffers() || memory != nullptr, "ZeRO over {} needs the device's memory",
            comm_.backend());
  const std::vector<Bucket>& buckets = ddp.buckets();
  // Host collectives take any piece size: a bucket that divides evenly is sharded in place,
  // only the others go through a padded copy. NCCL's pieces are kept 256-byte aligned.
  plan_ = plan_shards(buckets, comm_.size(), comm_.rank(),
                      memory == nullptr   ? 1
                      : memory->align > 0 ? memory->align
                                          : kDeviceShardAlign);
  if (memory != nullptr) memory_ = *memory;
  if (bf16_scratch_ != nullptr) {
    // A bucket's bf16 copy spans its padded pieces (from its offset): where the last one
    // would overrun the gradients' scratch, a larger one (bf16 values, two a float).
    size_t total = 0, need = 0;
    for (size_t b = 0; b < buckets.size(); ++b) {
      total = std::max(total, buckets[b].offset + buckets[b].count);
      need = std::max(need, buckets[b].offset + plan_.parts[b].piece * comm_.size());
    }
    if (need > total && memory != nullptr) {
      bf16_scratch_ = reinterpret_cast<uint16_t*>(memory_.allocate((need + 1) / 2));
    } else if (need > total) {
      bf16_host_.assign(need, 0);
      bf16_scratch_ = bf16_host_.data();
    }
  }
  bucket_scratch_.assign(buckets.size(), nullptr);
  bucket_host_.assign(buckets.size(), {});
  if (level >= 2) ddp.set_reduction(this);
  if (ringed()) {
    DDP_CHECK(level >= 2 && ddp.overlaps(), "a gradient ring needs --zero 2 or 3 and overlap");
    for (size_t b = 0; b < buckets.size(); ++b) {
      DDP_CHECK(plan_.parts[b].piece * comm_.size() <= memory_.slot_floats,
                "gradient ring: bucket {}'s pieces ({} x {}) overrun its slot of {}", b,
                plan_.parts[b].piece, comm_.size(), memory_.slot_floats);
      bucket_scratch_[b] = memory_.bucket_grads(b);  // the slot is also the padded copy
    }
    reduced_device_ = memory_.allocate(plan_.shard_count);
    scratch_floats_ = plan_.shard_count;  // the slots are the gradients' own memory
    return;
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (!padded(b)) continue;
    const size_t floats = plan_.parts[b].piece * comm_.size();
    if (memory != nullptr) {
      bucket_scratch_[b] = memory_.allocate(floats);
    } else {
      bucket_host_[b].assign(floats, 0.0f);
      bucket_scratch_[b] = bucket_host_[b].data();
    }
    scratch_floats_ += floats;
  }
  if (level >= 2 && memory == nullptr) {
    reduced_shard_.assign(plan_.shard_count, 0.0f);
    scratch_floats_ += plan_.shard_count;
  }
}

bool ShardedBuckets::padded(size_t b) const {
  return plan_.parts[b].piece * static_cast<size_t>(comm_.size()) != ddp_.buckets()[b].count;
}

const float* ShardedBuckets::reduced_piece(size_t bucket) const {
  const ShardPart& p = plan_.parts.at(bucket);
  if (level_ == 1) return ddp_.grads() + p.offset;
  if (!reduced_shard_.empty()) return reduced_shard_.data() + p.shard_at;
  if (ringed()) return reduced_device_ + p.shard_at;
  // In place: the piece's own place in the bucket, or in its padded copy.
  return padded(bucket) ? bucket_scratch_[bucket] + p.piece * plan_.rank : ddp_.grads() + p.offset;
}

const float* ShardedBuckets::reduced_pieces() const {
  return ringed() ? reduced_device_ : reduced_shard_.data();
}

void ShardedBuckets::take_shard(const float* full, float* shard) const {
  std::fill(shard, shard + plan_.shard_count, 0.0f);
  for (const ShardPart& p : plan_.parts)
    std::copy_n(full + p.offset, p.count, shard + p.shard_at);
}

void ShardedBuckets::copy(float* dst, const float* src, size_t floats) {
  if (comm_.device_buffers())
    memory_.copy(dst, src, floats);
  else
    std::copy_n(src, floats, dst);
}

std::unique_ptr<Work> ShardedBuckets::reduce(size_t bucket, float* grads) {
  const Bucket& b = ddp_.buckets()[bucket];
  // The bucket (or its padded copy) reduce-scattered into this rank's averaged piece: on
  // the host into the pieces' own buffer, on the device in place.
  const ShardPart& p = plan_.parts[bucket];
  if (ringed()) {
    // From its slot, the tail past the bucket zeroed, into the averaged pieces; the bucket
    // ring_slots later waits for it before backward writes the slot again.
    float* slot = memory_.bucket_grads(bucket);
    memory_.clear(slot + b.count, p.piece * comm_.size() - b.count);
    std::unique_ptr<Work> work = reduce_scatter(slot, reduced_device_ + p.shard_at, bucket);
    const size_t next = bucket + 1, slots = static_cast<size_t>(memory_.ring_slots);
    if (next < ddp_.buckets().size() && next >= slots) {
      Work& before = next - slots == bucket ? *work : ddp_.pending(next - slots);
      if (comm_.device_buffers())
        before.then_on(memory_.stream);
      else
        before.wait(comm_.timeout());
    }
    return work;
  }
  float* send = grads + b.offset;
  if (padded(bucket)) {
    float* scratch = bucket_scratch_[bucket];
    copy(scratch, grads + b.offset, b.count);
    const size_t tail = p.piece * comm_.size() - b.count;
    if (comm_.device_buffers())
      memory_.clear(scratch + b.count, tail);
    else
      std::fill_n(scratch + b.count, tail, 0.0f);
    send = scratch;
  }
  float* recv =
      reduced_shard_.empty() ? send + p.piece * plan_.rank : reduced_shard_.data() + p.shard_at;
  return reduce_scatter(send, recv, bucket);
}

std::unique_ptr<Work> ShardedBuckets::reduce_scatter(const float* send, float* recv,
                                                     size_t bucket) {
  const size_t piece = plan_.parts[bucket].piece;
  if (bf16_scratch_ != nullptr)
    return comm_.reduce_scatter_bf16_async(
        send, recv, bf16_scratch_ + ddp_.buckets()[bucket].offset, piece, ReduceOp::kAverage);
  return comm_.reduce_scatter_async(send, recv, piece, DataType::kFloat32, ReduceOp::kAverage);
}

void ShardedBuckets::gather_shards(const float* shard, float* full, void* stream) {
  std::vector<std::unique_ptr<Work>> gathers;
  for (size_t b = 0; b < plan_.parts.size(); ++b) {
    const ShardPart& p = plan_.parts[b];
    float* into = padded(b) ? bucket_scratch_[b] : full + p.bucket_offset;
    gathers.push_back(
        comm_.all_gather_async(shard + p.shard_at, into, p.piece, DataType::kFloat32));
    if (ringed() && padded(b)) copy_back(b, full, gathers, stream);  // its slot is shared
  }
  wait_all(gathers, comm_, stream);
  if (!ringed())
    for (size_t b = 0; b < plan_.parts.size(); ++b)
      if (padded(b)) copy_back(b, full, gathers, stream);
}

void ShardedBuckets::gather_in_place(float* full, void* stream) {
  // Host collectives send from a copy of the rank's piece (their all-gather does not take an
  // aliased input); NCCL's is in place.
  const bool host = !comm_.device_buffers();
  std::vector<std::vector<float>> mine(host ? plan_.parts.size() : 0);
  std::vector<std::unique_ptr<Work>> gathers;
  for (size_t b = 0; b < plan_.parts.size(); ++b) {
    const ShardPart& p = plan_.parts[b];
    float* into = padded(b) ? bucket_scratch_[b] : full + p.bucket_offset;
    const float* send = into + p.piece * plan_.rank;
    if (host) {
      mine[b].assign(p.piece, 0.0f);
      std::copy_n(full + p.offset, p.count, mine[b].data());
      send = mine[b].data();
    } else if (padded(b) && p.count > 0) {
      copy(into + p.piece * plan_.rank, full + p.offset, p.count);
    }
    gathers.push_back(comm_.all_gather_async(send, into, p.piece, DataType::kFloat32));
    if (ringed() && padded(b)) copy_back(b, full, gathers, stream);  // its slot is shared
  }
  wait_all(gathers, comm_, stream);
  if (!ringed())
    for (size_t b = 0; b < plan_.parts.size(); ++b)
      if (padded(b)) copy_back(b, full, gathers, stream);
}

void ShardedBuckets::gather_bucket(size_t b, const float* shard, float* into) {
  gather_bucket_async(b, shard, into)->wait(gather_comm().timeout());
}

std::unique_ptr<Work> ShardedBuckets::gather_bucket_async(size_t b, const float* shard,
                                                          float* into) {
  const ShardPart& p = plan_.parts.at(b);
  return gather_comm().all_gather_async(shard + p.shard_at, into, p.piece, DataType::kFloat32);
}

void ShardedBuckets::copy_back(size_t b, float* full, std::vector<std::unique_ptr<Work>>& gathers,
                               void* stream) {
  wait_all(gathers, comm_, stream);
  copy(full + plan_.parts[b].bucket_offset, bucket_scratch_[b], plan_.parts[b].bucket_count);
}

}  // namespace ddp
