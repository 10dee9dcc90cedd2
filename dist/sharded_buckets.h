// ZeRO's buckets over a Reducer's group (--zero 1, 2, 3; LibTorch's zero(N)): this rank's pieces of
// every bucket (ShardPlan, dist/zero.h: equal pieces or whole layers), each bucket reduce-
// scattered into this rank's averaged piece in its buffer's type as the Reducer's bucket reduction
// (2, 3; 1 keeps the all-reduce), the padded copies of the buckets whose pieces are not the
// bucket itself, the gradient ring's slots where backward writes, and the pieces' all-gathers
// back into whole buffers or one layer's parameters. Host or device memory alike: the caller
// gives the memory and the copies (MemoryPort). ShardedState builds on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/zero.h"
#include "runtime/memory_port.h"

namespace ddp {

// The gradient ring (dist/gradient_ring.h; one float32 buffer; level 2 or 3): backward writes
// bucket b's gradients into bucket_grads(b), a slot shared with every slots-th bucket and large
// enough for its padded pieces; each bucket is reduce-scattered from its slot into a shard of
// the averaged pieces, and the memory's stream waits for that (host communicators: the caller's
// thread, in layer_done) before the bucket `slots` later is written (so the buckets need
// overlap); the slots serve as the padded copies.
struct RingSlots {
  int slots = 0;                                      // 0: no ring
  std::function<float*(size_t bucket)> bucket_grads;  // a bucket's slot
  size_t slot_floats = 0;                             // a slot's size
};

// How the buckets are cut: each gradient buffer's element type (Bucket::buffer; empty: one
// float32 buffer); for whole layers to owners (plan_owned_shards), each layer's elements and
// owner (empty: equal pieces, plan_shards); the pieces' alignment in elements (0: none over a
// host communicator, kDeviceShardAlign over a device one, as NCCL moves such pieces best).
struct ShardCut {
  std::vector<DataType> types;  // each buffer's
  std::vector<size_t> counts;   // each layer's elements (with owners)
  std::vector<int> owners;      // each layer's owner rank
  size_t align = 0;
  // Level 2, 3: the averaged pieces in a buffer of their own also over a device communicator
  // (else reduce-scattered in place there), so that the gradient buffers may be freed once
  // their buckets are reduced (LibTorch's shard units).
  bool pieces_apart = false;
  // The padded buckets' copies (the buckets whose pieces are not the bucket itself, laid out
  // before their reduce-scatter and gathered into after the step): 0, one of its own for each
  // such bucket, kept as long as this object; K > 0, K slots of the largest one's size, a
  // padded bucket taking the one the K-th padded bucket before it used once that one's
  // collective is done (LibTorch's whole-tensor owners: the copies' memory is then K buckets',
  // not the model's). Needs the averaged pieces in a buffer of their own (a host communicator,
  // or pieces_apart); not with a gradient ring.
  int copy_slots = 0;
};

class ShardedBuckets final : public BucketReduction {
 public:
  // `ddp`'s buckets cut into its group's pieces at `level` (1, 2 or 3; 3: the gradients as 2,
  // the caller shards the parameters through gather_bucket) as `cut` says; from now on (2, 3)
  // the Reducer reduce-scatters through it. `memory`: where its padded copies and averaged pieces
  // go (needed with a device communicator; null: the host's); `ring`: the gradient ring's
  // slots, or null. Kept as long as the Reducer reduces (which may outlive it unused). Host
  // communicators: any piece size, so that a bucket that divides evenly needs no memory of its
  // own; device ones: pieces of a multiple of kDeviceShardAlign elements, reduce-scattered in
  // place.
  ShardedBuckets(Reducer& ddp, int level, const MemoryPort* memory = nullptr, ShardCut cut = {},
                 const RingSlots* ring = nullptr);
  ShardedBuckets(const ShardedBuckets&) = delete;
  ShardedBuckets& operator=(const ShardedBuckets&) = delete;

  // BucketReduction: the bucket (or its padded copy, or its slot) reduce-scattered into this
  // rank's averaged piece.
  std::unique_ptr<Work> reduce(size_t bucket, const GradMemory& grads) override;
  const char* issued_event() const override { return "reduce_scatter_issued"; }
  bool keeps_gradients() const override { return ringed(); }

  int level() const { return level_; }
  // This rank's pieces of the buckets.
  const ShardPlan& plan() const { return plan_; }
  // Buffer b's element type, and its bytes.
  DataType type(size_t buffer) const { return types_.at(buffer); }
  size_t element_bytes(size_t buffer) const { return dtype_bytes(types_.at(buffer)); }
  // After Reducer::finish(): where this rank's averaged piece of bucket b is (its runs packed,
  // plan().parts[b].count elements, none past the bucket's end): the reduced pieces with level
  // 2 and 3; with level 1 the gradients' own place (the piece only where the part is strided).
  // A whole bucket's (ShardPart::whole): the gradients' own place, its runs where they lie.
  const void* reduced_piece(size_t bucket) const;
  // After Reducer::finish(): the averaged gradient of element `offset` of bucket b's buffer, which
  // this rank owns (in its piece, or where it lies in a whole bucket).
  const void* averaged_at(size_t bucket, size_t offset) const;
  // Level 2 or 3 with one float32 buffer (ddptrain's): every averaged piece, as one shard,
  // wherever it is kept (host: a buffer of its own, or with a ring its own).
  const float* reduced_pieces() const;
  // This rank's pieces of the flat float32 buffer `full` into `shard` (shard_count, padding
  // zero). Host memory; one float32 buffer.
  void take_shard(const float* full, float* shard) const;
  // reduce_in_bf16: buffer b's float32 buckets go on the wire through `scratch` (as many bf16
  // values as the buffer has elements) from now on, instead of the Reducer's scratch (null: none
  // may be reduced until one is given, which is an error). LibTorch's shard units give each
  // unit's buffer a scratch of its own, allocated and freed with its gradients.
  void set_bf16_scratch(size_t buffer, uint16_t* scratch);
  // The bytes of the padded buckets' copies (the buckets that do not divide evenly) and of
  // the averaged pieces kept apart (host, level 2).
  size_t scratch_bytes() const { return scratch_bytes_; }

  // Collective: every rank's pieces (`shards`, its own, one a buffer) into the whole flat
  // buffers `full` (device communicators: device buffers, `stream` made to wait).
  void gather_shards(const std::vector<const void*>& shards, const std::vector<void*>& full,
                     void* stream = nullptr);
  // The same for one buffer.
  void gather_shards(const void* shard, void* full, void* stream = nullptr) {
    gather_shards(std::vector<const void*>{shard}, std::vector<void*>{full}, stream);
  }
  // Collective: every rank's pieces of `full` (one a buffer), each rank's own being current in
  // place, into every rank's `full` (device communicators: `stream` made to wait).
  void gather_in_place(const std::vector<void*>& full, void* stream);
  // Collective: bucket b's pieces of every rank (`shard`, its own, of the bucket's buffer) into
  // `into` (plan().parts[b].piece x ranks elements: the bucket, then the padding).
  void gather_bucket(size_t b, const void* shard, void* into);
  // The same, not waited for (device communicators: the Work makes a stream wait), on the
  // gathers' communicator.
  std::unique_ptr<Work> gather_bucket_async(size_t b, const void* shard, void* into);
  // --zero 3's gathers of a layer before its use (gather_bucket, gather_bucket_async) on a
  // communicator of their own over the same ranks (in the same order: a split of the Reducer's),
  // so that on the GPU a gather runs on its own stream and never queues behind the reduce-
  // scatters issued before it; null: on the Reducer's.
  void set_gather_comm(Communicator* comm) { gather_comm_ = comm; }
  // The communicator of --zero 3's layer gathers: set_gather_comm's, else the Reducer's.
  Communicator& gather_comm() { return gather_comm_ != nullptr ? *gather_comm_ : comm_; }
  const Communicator& gather_comm() const {
    return gather_comm_ != nullptr ? *gather_comm_ : comm_;
  }

 private:
  // Whether bucket b's pieces are not the bucket itself (then they go through
  // bucket_scratch_[b]).
  bool padded(size_t b) const { return !plan_.parts[b].whole && !plan_.parts[b].in_place(); }
  // Bucket b's (whole) runs sent from each owner: from its place in `full`, in place.
  void broadcast_runs(size_t b, void* full, std::vector<std::unique_ptr<Work>>& works);
  bool ringed() const { return ring_.slots > 0; }
  bool slotted() const { return !slot_before_.empty(); }  // ShardCut::copy_slots
  // Whether a padded bucket's copy is shared with others (a ring's slot or a copy slot): it is
  // copied back as soon as it is gathered, before the next bucket's gather may reuse it.
  bool shared_copies() const { return ringed() || slotted(); }
  uint16_t* bf16_scratch(size_t buffer) const;  // buffer's bf16 scratch (reduce_in_bf16)
  // Bucket `bucket`'s padded pieces at `send` reduce-scattered (averaged) into this rank's
  // piece at `recv`: in the bucket's type, or (reduce_in_bf16, float32) as bfloat16.
  std::unique_ptr<Work> reduce_scatter(const void* send, void* recv, size_t bucket);
  void copy(void* dst, const void* src, size_t bytes);  // host, or the device's (in order)
  void clear(void* dst, size_t bytes);                  // the same, zeros
  void* allocate(size_t bytes);                         // the memory's, held as long as this object
  // Bucket b's runs of every rank from its buffer `full` into their places in `pieces` (the
  // padded copy, zeros between), or of rank `rank` only.
  // Bucket b's runs of every rank from its buffer `full` into their places in `pieces`
  // (the padded copy, zeros between), or of this rank only (`rank`).
  void lay_out(size_t b, const void* full, void* pieces, int rank = -1);
  // `gathers` waited for, then padded bucket b's gathered copy into `full` (its buffer).
  void copy_back(size_t b, void* full, std::vector<std::unique_ptr<Work>>& gathers, void* stream);

  Reducer& ddp_;
  Communicator& comm_;
  Communicator* gather_comm_ = nullptr;  // --zero 3's layer gathers, where apart
  int level_;
  std::vector<DataType> types_;  // each buffer's
  ShardPlan plan_;
  MemoryPort memory_;                  // the caller's, or the host's
  RingSlots ring_;                     // the gradient ring's, or none
  uint16_t* bf16_scratch_ = nullptr;   // reduce_in_bf16: the bf16 values on the wire
  std::vector<uint16_t*> bf16_of_;     // and each buffer's (set_bf16_scratch; else that one)
  std::vector<char*> bucket_scratch_;  // a padded bucket's pieces, every rank's
  // ShardCut::copy_slots: the padded bucket that used bucket b's slot before it (or b itself).
  std::vector<size_t> slot_before_;
  std::vector<char*> reduced_;  // level 2, 3 on the host or with a ring: each buffer's pieces
  std::vector<std::shared_ptr<void>> held_;  // what allocate() gave
  size_t scratch_bytes_ = 0;
};

}  // namespace ddp
