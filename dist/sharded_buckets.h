// ZeRO's buckets over a Ddp's group (--zero 1, 2, 3): this rank's pieces of every bucket
// (ShardPlan, dist/zero.h), each bucket reduce-scattered into this rank's averaged piece
// as the Ddp's bucket reduction (2, 3; 1 keeps the all-reduce), the padded copies of the buckets
// that do not divide evenly, the gradient ring's slots where backward writes, and the pieces'
// all-gathers back into whole buffers or one layer's parameters. Host or device memory alike:
// the caller gives the memory and the copies (ShardMemory). HostZero and DeviceZero build on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/zero.h"

namespace ddp {

// The memory ZeRO's buckets use. Host communicators: any piece size, the averaged pieces in a
// buffer of their own, nothing to give (or a ring's host memory, `align` 1). Device
// communicators: the memory of the padded buckets' copies and the copies on the compute stream;
// pieces are multiples of 64 elements and the reduce-scatter is in place, so a bucket that
// divides evenly needs no memory of its own.
//
// With `ring_slots` (models/device_parameters.h, GradientRing; level 2 or 3): backward writes
// bucket b's gradients into bucket_grads(b), a slot shared with every ring_slots-th bucket
// and large enough for its padded pieces; each bucket is reduce-scattered from its slot into
// a shard of the averaged pieces, and `stream` waits for that (host communicators: the
// caller's thread, in layer_done) before the bucket ring_slots later is written (so the
// buckets need overlap); the slots serve as the padded copies.
struct ShardMemory {
  std::function<float*(size_t floats)> allocate;  // kept as long as the buckets are used
  std::function<void(float* dst, const float* src, size_t floats)> copy;  // stream order
  std::function<void(float* dst, size_t floats)> clear;  // dst[floats] = 0, stream order
  int ring_slots = 0;                                    // 0: the gradients in one buffer
  std::function<float*(size_t bucket)> bucket_grads;     // a bucket's slot (ring)
  size_t slot_floats = 0;                                // a slot's size (ring)
  void* stream = nullptr;                                // the compute stream
  size_t align = 0;  // the pieces' alignment (elements; 0: kDeviceShardAlign)
};

class ShardedBuckets final : public BucketReduction {
 public:
  // `ddp`'s buckets cut into its group's pieces at `level` (1, 2 or 3; 3: the gradients as 2,
  // the caller shards the parameters through gather_bucket); from now on (2, 3) the Ddp
  // reduce-scatters through it. `memory`: needed with a device communicator or a ring.
  // Kept as long as the Ddp reduces (which may outlive it unused).
  ShardedBuckets(Ddp& ddp, int level, const ShardMemory* memory = nullptr);
  ShardedBuckets(const ShardedBuckets&) = delete;
  ShardedBuckets& operator=(const ShardedBuckets&) = delete;

  // BucketReduction: the bucket (or its padded copy, or its slot) reduce-scattered into this
  // rank's averaged piece.
  std::unique_ptr<Work> reduce(size_t bucket, float* grads) override;
  const char* issued_event() const override { return "reduce_scatter_issued"; }
  bool keeps_gradients() const override { return ringed(); }

  int level() const { return level_; }
  // This rank's pieces of the buckets.
  const ShardPlan& plan() const { return plan_; }
  // After Ddp::finish(): where this rank's averaged piece of bucket b is (plan().parts[b].count
  // elements, or none past the bucket's end): the gradients' own place with level 1, the
  // reduced pieces with level 2.
  const float* reduced_piece(size_t bucket) const;
  // Level 2 or 3: every averaged piece, as one shard, wherever it is kept (host: a buffer of its
  // own, or with a ring its own).
  const float* reduced_pieces() const;
  // This rank's pieces of the flat buffer `full` into `shard` (shard_count, padding zero).
  // Host memory.
  void take_shard(const float* full, float* shard) const;
  // The floats of the padded buckets' copies (the buckets that do not divide evenly) and of
  // the averaged pieces kept apart (host, level 2).
  size_t scratch_floats() const { return scratch_floats_; }

  // Collective: every rank's pieces (`shard`, its own) into the whole flat buffer `full`
  // (device communicators: device buffers, `stream` made to wait).
  void gather_shards(const float* shard, float* full, void* stream = nullptr);
  // Collective: every rank's pieces of `full`, each rank's own being current in place, into
  // every rank's `full` (device communicators: `stream` made to wait).
  void gather_in_place(float* full, void* stream);
  // Collective: bucket b's pieces of every rank (`shard`, its own) into
  // `into` (plan().parts[b].piece x ranks floats: the bucket, then the padding).
  void gather_bucket(size_t b, const float* shard, float* into);
  // The same, not waited for (device communicators: the Work makes a stream wait), on the
  // gathers' communicator.
  std::unique_ptr<Work> gather_bucket_async(size_t b, const float* shard, float* into);
  // --zero 3's gathers of a layer before its use (gather_bucket, gather_bucket_async) on a
  // communicator of their own over the same ranks (in the same order: a split of the Ddp's),
  // so that on the GPU a gather runs on its own stream and never queues behind the reduce-
  // scatters issued before it; null: on the Ddp's.
  void set_gather_comm(Communicator* comm) { gather_comm_ = comm; }
  // The communicator of --zero 3's layer gathers: set_gather_comm's, else the Ddp's.
  Communicator& gather_comm() { return gather_comm_ != nullptr ? *gather_comm_ : comm_; }

 private:
  // Whether bucket b's pieces overrun it (then they go through bucket_scratch_[b]).
  bool padded(size_t b) const;
  bool ringed() const { return memory_.ring_slots > 0; }
  // Bucket `bucket`'s padded pieces at `send` reduce-scattered (averaged) into this rank's
  // piece at `recv`: as float32, or (--grad-reduce bf16) as bfloat16 through the scratch.
  std::unique_ptr<Work> reduce_scatter(const float* send, float* recv, size_t bucket);
  void copy(float* dst, const float* src, size_t floats);  // host, or the device's (in order)
  // `gathers` waited for, then padded bucket b's gathered copy into `full`.
  void copy_back(size_t b, float* full, std::vector<std::unique_ptr<Work>>& gathers, void* stream);

  Ddp& ddp_;
  Communicator& comm_;
  Communicator* gather_comm_ = nullptr;  // --zero 3's layer gathers, where apart
  int level_;
  ShardPlan plan_;
  ShardMemory memory_;
  uint16_t* bf16_scratch_ = nullptr;  // --grad-reduce bf16: the bf16 values on the wire
  std::vector<uint16_t> bf16_host_;   // the host's larger one, where the pieces need it
  // A padded bucket's pieces, every rank's (host: in bucket_host_; device: the caller's).
  std::vector<float*> bucket_scratch_;
  std::vector<std::vector<float>> bucket_host_;
  std::vector<float> reduced_shard_;  // host, level 2: the averaged pieces
  float* reduced_device_ = nullptr;   // ring: the averaged pieces
  size_t scratch_floats_ = 0;
};

}  // namespace ddp
