// ShardedBuckets: ZeRO's reduce-scatter of each bucket, its memory, and the pieces' gathers.
#include "dist/sharded_buckets.h"

#include <algorithm>
#include <cstring>

#include "runtime/error.h"

namespace ddp {

ShardedBuckets::ShardedBuckets(Reducer& ddp, int level, const MemoryPort* memory, ShardCut cut,
                               const RingSlots* ring)
    : ddp_(ddp),
      comm_(ddp.comm()),
      level_(level),
      types_(cut.types.empty() ? std::vector<DataType>{DataType::kFloat32} : std::move(cut.types)),
      bf16_scratch_(ddp.bf16_scratch()) {
  DDP_USAGE_CHECK(level >= 1 && level <= 3, "--zero {}: expected 0, 1, 2 or 3", level);
  DDP_CHECK(!comm_.device_buffers() || memory != nullptr, "ZeRO over {} needs the device's memory",
            comm_.backend());
  const std::vector<Bucket>& buckets = ddp.buckets();
  for (const Bucket& b : buckets)
    DDP_CHECK(b.buffer < types_.size(), "ZeRO: a bucket of buffer {} where {} types are given",
              b.buffer, types_.size());
  // Host collectives take any piece size: a bucket that divides evenly is sharded in place,
  // only the others go through a padded copy. NCCL's pieces are kept 256-byte aligned.
  const size_t align = cut.align > 0 ? cut.align : comm_.device_buffers() ? kDeviceShardAlign : 1;
  plan_ = cut.owners.empty() ? plan_shards(buckets, comm_.size(), comm_.rank(), align)
                             : plan_owned_shards(buckets, cut.counts, cut.owners, comm_.size(),
                                                 comm_.rank(), align);
  memory_ = memory != nullptr ? *memory : host_memory_port();
  if (ring != nullptr) ring_ = *ring;
  if (bf16_scratch_ != nullptr) {
    // A float32 bucket's bf16 copy spans its padded pieces (from its offset): where the last
    // one would overrun the gradients' scratch, a larger one.
    size_t total = 0, need = 0;
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (types_[buckets[b].buffer] != DataType::kFloat32) continue;
      total = std::max(total, buckets[b].offset + buckets[b].count);
      need = std::max(need, buckets[b].offset + plan_.parts[b].piece * comm_.size());
    }
    if (need > total) bf16_scratch_ = static_cast<uint16_t*>(allocate(need * sizeof(uint16_t)));
  }
  bf16_of_.assign(types_.size(), bf16_scratch_);
  bucket_scratch_.assign(buckets.size(), nullptr);
  reduced_.assign(types_.size(), nullptr);
  if (level >= 2) ddp.set_reduction(this);
  if (ringed()) {
    DDP_CHECK(level >= 2 && ddp.overlaps(), "a gradient ring needs --zero 2 or 3 and overlap");
    DDP_CHECK(types_.size() == 1 && types_[0] == DataType::kFloat32,
              "a gradient ring takes one float32 buffer");
    for (size_t b = 0; b < buckets.size(); ++b) {
      DDP_CHECK(
          plan_.parts[b].piece * comm_.size() <= ring_.slot_floats && plan_.parts[b].strided(),
          "gradient ring: bucket {}'s pieces ({} x {}) overrun its slot of {}", b,
          plan_.parts[b].piece, comm_.size(), ring_.slot_floats);
      bucket_scratch_[b] = reinterpret_cast<char*>(ring_.bucket_grads(b));  // also the copy
    }
    reduced_[0] = static_cast<char*>(allocate(plan_.shard_count * sizeof(float)));
    scratch_bytes_ = plan_.shard_count * sizeof(float);  // the slots are the gradients' own
    return;
  }
  const auto copy_bytes = [&](size_t b) {
    return plan_.parts[b].piece * comm_.size() * element_bytes(buckets[b].buffer);
  };
  // Host collectives reduce-scatter into a buffer of their own (MPI's may not alias its input);
  // device ones where the gradient buffers are freed before the pieces are read.
  const bool apart = !comm_.device_buffers() || cut.pieces_apart;
  std::vector<size_t> padded_buckets;
  size_t largest = 0, all_copies = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (!padded(b)) continue;
    padded_buckets.push_back(b);
    largest = std::max(largest, copy_bytes(b));
    all_copies += copy_bytes(b);
  }
  const auto slots = static_cast<size_t>(std::max(cut.copy_slots, 0));
  // Slots only where they hold less than a copy for each padded bucket would.
  if (slots > 0 && slots * largest < all_copies) {
    DDP_CHECK(level >= 2 && apart, "ZeRO: copy slots need the averaged pieces apart");
    std::vector<char*> slot(slots);
    for (char*& s : slot)
      s = static_cast<char*>(allocate(largest));
    scratch_bytes_ += slots * largest;
    slot_before_.resize(buckets.size());
    for (size_t i = 0; i < padded_buckets.size(); ++i) {
      const size_t b = padded_buckets[i];
      bucket_scratch_[b] = slot[i % slots];
      slot_before_[b] = i >= slots ? padded_buckets[i - slots] : b;
    }
  } else {
    for (const size_t b : padded_buckets) {
      bucket_scratch_[b] = static_cast<char*>(allocate(copy_bytes(b)));
      scratch_bytes_ += copy_bytes(b);
    }
  }
  if (level >= 2 && apart)
    for (size_t k = 0; k < types_.size(); ++k) {
      const size_t bytes =
          (k < plan_.shard_counts.size() ? plan_.shard_counts[k] : 0) * element_bytes(k);
      reduced_[k] = static_cast<char*>(allocate(bytes));
      scratch_bytes_ += bytes;
    }
}

void* ShardedBuckets::allocate(size_t bytes) {
  held_.push_back(memory_.allocate(bytes));
  return held_.back().get();
}

const void* ShardedBuckets::reduced_piece(size_t bucket) const {
  const ShardPart& p = plan_.parts.at(bucket);
  const size_t size = element_bytes(p.buffer);
  // The gradients' own place (null before the first backward gave the buffers).
  const std::vector<GradMemory>& buffers = ddp_.buffers();
  const char* own = p.buffer < buffers.size() && buffers[p.buffer].data != nullptr
                        ? static_cast<const char*>(buffers[p.buffer].data) + p.offset * size
                        : nullptr;
  if (level_ == 1 || p.whole) return own;
  if (reduced_[p.buffer] != nullptr) return reduced_[p.buffer] + p.shard_at * size;
  // In place: the piece's own place in the bucket, or in its padded copy.
  return padded(bucket) ? bucket_scratch_[bucket] + p.piece * plan_.rank * size : own;
}

const void* ShardedBuckets::averaged_at(size_t bucket, size_t offset) const {
  const ShardPart& p = plan_.parts.at(bucket);
  const size_t size = element_bytes(p.buffer);
  const auto* piece = static_cast<const char*>(reduced_piece(bucket));
  if (level_ == 1 || p.whole) return piece + (offset - p.offset) * size;
  for (const ShardRun& run : p.runs[static_cast<size_t>(plan_.rank)])
    if (offset >= run.offset && offset < run.offset + run.count)
      return piece + (run.at + offset - run.offset) * size;
  DDP_CHECK(false, "ZeRO: element {} of bucket {} is not this rank's", offset, bucket);
  return nullptr;
}

const float* ShardedBuckets::reduced_pieces() const {
  return reinterpret_cast<const float*>(reduced_[0]);
}

void ShardedBuckets::take_shard(const float* full, float* shard) const {
  std::fill(shard, shard + plan_.shard_count, 0.0f);
  for (const ShardPart& p : plan_.parts)
    for (const ShardRun& run : p.runs[static_cast<size_t>(plan_.rank)])
      std::copy_n(full + run.offset, run.count, shard + p.shard_at + run.at);
}

void ShardedBuckets::set_bf16_scratch(size_t buffer, uint16_t* scratch) {
  DDP_CHECK(bf16_scratch_ != nullptr && buffer < bf16_of_.size(),
            "set_bf16_scratch: buffer {} of {}, reduce_in_bf16 {}", buffer, bf16_of_.size(),
            bf16_scratch_ != nullptr);
  bf16_of_[buffer] = scratch;
}

uint16_t* ShardedBuckets::bf16_scratch(size_t buffer) const {
  DDP_CHECK(bf16_of_.at(buffer) != nullptr,
            "reduce_in_bf16: buffer {} was given no bf16 scratch before its reduction", buffer);
  return bf16_of_[buffer];
}

void ShardedBuckets::copy(void* dst, const void* src, size_t bytes) {
  memory_.copy(dst, src, bytes);
}

void ShardedBuckets::clear(void* dst, size_t bytes) {
  memory_.clear(dst, bytes);
}

void ShardedBuckets::lay_out(size_t b, const void* full, void* pieces, int rank) {
  const ShardPart& p = plan_.parts[b];
  const size_t size = element_bytes(p.buffer);
  const char* from = static_cast<const char*>(full);
  char* to = static_cast<char*>(pieces);
  const size_t ranks = p.runs.size();
  if (rank < 0 && p.strided()) {  // one block, the tail zero
    copy(to, from + p.bucket_offset * size, p.bucket_count * size);
    clear(to + p.bucket_count * size, (p.piece * ranks - p.bucket_count) * size);
    return;
  }
  for (size_t r = 0; r < ranks; ++r) {
    if (rank >= 0 && static_cast<size_t>(rank) != r) continue;
    size_t filled = 0;
    for (const ShardRun& run : p.runs[r]) {
      copy(to + (p.piece * r + run.at) * size, from + run.offset * size, run.count * size);
      filled = run.at + run.count;
    }
    // The padding between pieces zero (a rank's own piece alone: its padding is never read).
    if (rank < 0) clear(to + (p.piece * r + filled) * size, (p.piece - filled) * size);
  }
}

std::unique_ptr<Work> ShardedBuckets::reduce(size_t bucket, const GradMemory& grads) {
  const Bucket& b = ddp_.buckets()[bucket];
  // The bucket (or its padded copy) reduce-scattered into this rank's averaged piece: on
  // the host into the pieces' own buffer, on the device in place.
  const ShardPart& p = plan_.parts[bucket];
  const size_t size = element_bytes(b.buffer);
  if (ringed()) {
    // From its slot, the tail past the bucket zeroed, into the averaged pieces; the bucket
    // ring_slots later waits for it before backward writes the slot again.
    float* slot = ring_.bucket_grads(bucket);
    memory_.clear(slot + b.count, (p.piece * comm_.size() - b.count) * sizeof(float));
    std::unique_ptr<Work> work = reduce_scatter(slot, reduced_[0] + p.shard_at * size, bucket);
    const size_t next = bucket + 1, slots = static_cast<size_t>(ring_.slots);
    if (next < ddp_.buckets().size() && next >= slots) {
      Work& before = next - slots == bucket ? *work : ddp_.pending(next - slots);
      if (comm_.device_buffers())
        before.then_on(memory_.stream);
      else
        before.wait(comm_.timeout());
    }
    return work;
  }
  DDP_CHECK(grads.data != nullptr && grads.type == types_[b.buffer],
            "ZeRO: bucket {}'s gradients are not in a buffer of its type", bucket);
  char* send = static_cast<char*>(grads.data) + b.offset * size;
  if (p.whole) {  // the all-reduce, as plain data parallelism's
    if (bf16_scratch_ != nullptr && grads.type == DataType::kFloat32)
      return comm_.all_reduce_bf16_async(reinterpret_cast<float*>(send),
                                         bf16_scratch(b.buffer) + b.offset, b.count,
                                         ReduceOp::kAverage);
    return comm_.all_reduce_async(send, b.count, grads.type, ReduceOp::kAverage);
  }
  if (padded(bucket)) {
    if (slotted() && slot_before_[bucket] != bucket) {  // its slot free: the one before done
      Work& before = ddp_.pending(slot_before_[bucket]);
      if (comm_.device_buffers())
        before.then_on(memory_.stream);
      else
        before.wait(comm_.timeout());
    }
    lay_out(bucket, grads.data, bucket_scratch_[bucket]);
    send = bucket_scratch_[bucket];
  }
  char* recv = reduced_[b.buffer] != nullptr ? reduced_[b.buffer] + p.shard_at * size
                                             : send + p.piece * plan_.rank * size;
  return reduce_scatter(send, recv, bucket);
}

std::unique_ptr<Work> ShardedBuckets::reduce_scatter(const void* send, void* recv, size_t bucket) {
  const size_t piece = plan_.parts[bucket].piece;
  const DataType type = types_[ddp_.buckets()[bucket].buffer];
  const Bucket& b = ddp_.buckets()[bucket];
  if (bf16_scratch_ != nullptr && type == DataType::kFloat32)
    return comm_.reduce_scatter_bf16_async(
        static_cast<const float*>(send), static_cast<float*>(recv),
        bf16_scratch(b.buffer) + b.offset, piece, ReduceOp::kAverage);
  return comm_.reduce_scatter_async(send, recv, piece, type, ReduceOp::kAverage);
}

void ShardedBuckets::gather_shards(const std::vector<const void*>& shards,
                                   const std::vector<void*>& full, void* stream) {
  std::vector<std::unique_ptr<Work>> gathers;
  for (size_t b = 0; b < plan_.parts.size(); ++b) {
    const ShardPart& p = plan_.parts[b];
    const size_t size = element_bytes(p.buffer);
    if (p.whole) {  // this rank's runs into place, then each owner's sent from there
      char* whole = static_cast<char*>(full.at(p.buffer));
      const char* mine = static_cast<const char*>(shards.at(p.buffer)) + p.shard_at * size;
      for (const ShardRun& run : p.runs[static_cast<size_t>(plan_.rank)])
        copy(whole + run.offset * size, mine + run.at * size, run.count * size);
      broadcast_runs(b, whole, gathers);
      continue;
    }
    void* into = padded(b) ? bucket_scratch_[b]
                           : static_cast<char*>(full.at(p.buffer)) + p.bucket_offset * size;
    gathers.push_back(
        comm_.all_gather_async(static_cast<const char*>(shards.at(p.buffer)) + p.shard_at * size,
                               into, p.piece, types_[p.buffer]));
    if (shared_copies() && padded(b)) copy_back(b, full[p.buffer], gathers, stream);
  }
  wait_all(gathers, comm_, stream);
  if (!shared_copies())
    for (size_t b = 0; b < plan_.parts.size(); ++b)
      if (padded(b)) copy_back(b, full[plan_.parts[b].buffer], gathers, stream);
}

void ShardedBuckets::gather_in_place(const std::vector<void*>& full, void* stream) {
  // Host collectives send from a copy of the rank's piece (their all-gather does not take an
  // aliased input); NCCL's is in place.
  const bool host = !comm_.device_buffers();
  std::vector<std::vector<char>> mine(host ? plan_.parts.size() : 0);
  std::vector<std::unique_ptr<Work>> gathers;
  for (size_t b = 0; b < plan_.parts.size(); ++b) {
    const ShardPart& p = plan_.parts[b];
    const size_t size = element_bytes(p.buffer);
    char* whole = static_cast<char*>(full.at(p.buffer));
    if (p.whole) {
      broadcast_runs(b, whole, gathers);
      continue;
    }
    char* into = padded(b) ? bucket_scratch_[b] : whole + p.bucket_offset * size;
    const char* send = into + p.piece * plan_.rank * size;
    if (host) {
      mine[b].assign(p.piece * size, 0);
      for (const ShardRun& run : p.runs[static_cast<size_t>(plan_.rank)])
        std::memcpy(mine[b].data() + run.at * size, whole + run.offset * size, run.count * size);
      send = mine[b].data();
    } else if (padded(b) && p.count > 0) {
      lay_out(b, whole, into, plan_.rank);
    }
    gathers.push_back(comm_.all_gather_async(send, into, p.piece, types_[p.buffer]));
    if (shared_copies() && padded(b)) copy_back(b, whole, gathers, stream);
  }
  wait_all(gathers, comm_, stream);
  if (!shared_copies())
    for (size_t b = 0; b < plan_.parts.size(); ++b)
      if (padded(b)) copy_back(b, full[plan_.parts[b].buffer], gathers, stream);
}

void ShardedBuckets::gather_bucket(size_t b, const void* shard, void* into) {
  gather_bucket_async(b, shard, into)->wait(gather_comm().timeout());
}

void ShardedBuckets::broadcast_runs(size_t b, void* full,
                                    std::vector<std::unique_ptr<Work>>& works) {
  const ShardPart& p = plan_.parts[b];
  const size_t size = element_bytes(p.buffer);
  for (size_t r = 0; r < p.runs.size(); ++r)
    for (const ShardRun& run : p.runs[r])
      works.push_back(comm_.broadcast_async(static_cast<char*>(full) + run.offset * size, run.count,
                                            types_[p.buffer], static_cast<int>(r)));
}

std::unique_ptr<Work> ShardedBuckets::gather_bucket_async(size_t b, const void* shard, void* into) {
  const ShardPart& p = plan_.parts.at(b);
  DDP_CHECK(!p.whole, "gather_bucket: bucket {} is not in equal pieces", b);
  return gather_comm().all_gather_async(
      static_cast<const char*>(shard) + p.shard_at * element_bytes(p.buffer), into, p.piece,
      types_[p.buffer]);
}

void ShardedBuckets::copy_back(size_t b, void* full, std::vector<std::unique_ptr<Work>>& gathers,
                               void* stream) {
  wait_all(gathers, comm_, stream);
  const ShardPart& p = plan_.parts[b];
  const size_t size = element_bytes(p.buffer);
  char* to = static_cast<char*>(full);
  if (p.strided()) {
    copy(to + p.bucket_offset * size, bucket_scratch_[b], p.bucket_count * size);
    return;
  }
  for (size_t r = 0; r < p.runs.size(); ++r)
    for (const ShardRun& run : p.runs[r])
      copy(to + run.offset * size, bucket_scratch_[b] + (p.piece * r + run.at) * size,
           run.count * size);
}

}  // namespace ddp
