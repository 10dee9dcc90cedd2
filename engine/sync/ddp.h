// Data parallelism: gradient buckets (contiguous ranges of the flat gradient buffer, last
// layers first, so a bucket is a view and nothing is copied), their all-reduces started as
// soon as backward has written them, parameter broadcast and the model check at start.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "engine/sync/buckets.h"
#include "engine/sync/zero.h"
#include "models/mlp.h"
#include "runtime/checksum.h"

namespace ddp {

// One entry of the engine's own record of a step: what happened, in order.
struct DdpEvent {
  std::string what;  // "layer_done", "allreduce_issued", "backward_done", "allreduce_waited"
  int layer = -1;    // the layer it concerns, or -1
  int bucket = -1;   // the bucket it concerns, or -1
};

// A tensor of one's own model for the layout check: its name and element count.
struct NamedParam {
  std::string name;  // as the model calls it ("fc1.weight")
  size_t count = 0;  // its elements
};

// Data parallelism over a communicator (the top of this file): one per model replica group.
class Ddp {
 public:
  // Any model: its layers as spans of one flat buffer (see ParamSpan; param_spans(shape)
  // for the MLP); layer_done(i) refers to layers[i]. overlap: start each bucket's
  // all-reduce as soon as its layers are done; otherwise all of them after backward.
  Ddp(Communicator& comm, const std::vector<ParamSpan>& layers, size_t bucket_bytes,
      size_t first_bucket_bytes, bool overlap);
  // The same with the flags' units (DdpOptions: MiB); bad options are a UsageError.
  Ddp(Communicator& comm, const std::vector<ParamSpan>& layers, const DdpOptions& options = {});

  // Collective (host communicators): every rank describes its model the same way, or the
  // first difference is a UsageError on every rank naming it ("rank 1 has parameter 3
  // 'fc2.weight' of 512 elements where rank 0 has 'fc2.weight' of 256").
  void check_same_layout(const std::vector<NamedParam>& params);

  // Collective: every rank must hold the same model; `fingerprint` identifies its layout
  // (MlpShape::fingerprint()), `description` names it in the message; throws naming the
  // ranks that differ. A device communicator needs `device_scratch` of size() + 1 int64 and
  // the copy functions (set_device_copies).
  void check_same_layout(uint64_t fingerprint, const std::string& description,
                         void* device_scratch = nullptr);
  // A synchronous copy of `bytes` between host and device memory.
  using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
  // The copies check_same_layout uses with a device communicator.
  void set_device_copies(CopyFn to_device, CopyFn to_host) {
    copy_to_device_ = to_device;
    copy_to_host_ = to_host;
  }
  // Reduce gradients as bfloat16 (Communicator::all_reduce_bf16_async) through `scratch`:
  // as many bf16 values as the gradient buffer has floats, in the communicator's memory.
  // UsageError when the backend cannot.
  void reduce_in_bf16(void* scratch);
  // Whether reduce_in_bf16 was called.
  bool reduces_in_bf16() const { return bf16_scratch_ != nullptr; }
  // Collective: parameters (params[count], host or device as the communicator expects)
  // become rank 0's.
  void broadcast_parameters(float* params, size_t count);

  // Backward hooks, called on the training thread: start of a step's backward, each layer's
  // gradients written (layers arrive last to first), end of backward. layer_done or
  // end_backward without begin_backward, and a layer index out of range, are UsageErrors
  // that say what to call.
  void begin_backward(float* grads);
  // Layer `layer`'s gradients are written: the buckets it completes start (with overlap).
  void layer_done(int layer);
  // Backward is over: every bucket not yet started starts.
  void end_backward();
  // Waits for every bucket's average (host: blocking; NCCL: makes `stream` wait).
  void finish(void* stream);

  // The buckets, in the order they are reduced (last layers first).
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Buckets issued so far this step (they are issued in order), and bucket b's pending
  // all-reduce (b < issued(), until finish()).
  size_t issued() const { return next_bucket_; }
  // Bucket b's pending collective (b < issued(), until finish()).
  Work& pending(size_t bucket) { return *pending_.at(bucket); }
  // The engine's record of what happened, kept only while asked for (the first step's, for
  // the metrics, or the tests'), so that it never grows over a run.
  void record_events(bool on) {
    recording_ = on;
    if (on) events_.clear();
  }
  // The record kept while record_events(true).
  const std::vector<DdpEvent>& events() const { return events_; }
  // The communicator it reduces over.
  Communicator& comm() { return comm_; }

  // ZeRO (engine/sync/zero.h): from now on, with `level` 2 or 3, each bucket is reduce-scattered
  // into this rank's piece of the averaged gradients (reduced_piece()) instead of all-reduced; with
  // level 1 the all-reduce stays. The shards' plan is this rank's pieces of the buckets. Host
  // communicators: any piece size, the averaged pieces in a buffer of their own. Device
  // communicators need `device` (the memory of the padded buckets' copies and the copies on
  // the compute stream); pieces are multiples of 64 elements and the reduce-scatter is in
  // place, so a bucket that divides evenly needs no memory of its own.
  //
  // Level 2 or 3 with `ring_slots` (models/device_parameters.h, GradientRing): backward writes
  // bucket b's gradients into bucket_grads(b), a slot shared with every ring_slots-th bucket
  // and large enough for its padded pieces; each bucket is reduce-scattered from its slot into
  // a shard of the averaged pieces, and `stream` waits for that (host communicators: the
  // caller's thread, in layer_done) before the bucket ring_slots later is written (so the
  // buckets need overlap); the slots serve as the padded copies. A host communicator's ring
  // gives `device` too (host memory, host copies, `align` 1).
  struct DeviceMemory {
    std::function<float*(size_t floats)> allocate;  // kept as long as the Ddp is used
    std::function<void(float* dst, const float* src, size_t floats)> copy;  // stream order
    std::function<void(float* dst, size_t floats)> zero;  // dst[floats] = 0, stream order
    int ring_slots = 0;                                   // 0: the gradients in one buffer
    std::function<float*(size_t bucket)> bucket_grads;    // a bucket's slot (ring)
    size_t slot_floats = 0;                               // a slot's size (ring)
    void* stream = nullptr;                               // the compute stream
    size_t align = 0;  // the pieces' alignment (elements; 0: kDeviceShardAlign)
  };
  // Shards as above: `level` 1, 2 or 3 (3: the gradients as 2; the caller shards the
  // parameters, through gather_bucket); `device` with a device communicator.
  void shard(int level, const DeviceMemory* device = nullptr);
  // The ZeRO level shard() set (0: not sharded).
  int zero() const { return zero_; }
  // This rank's pieces of the buckets (after shard()).
  const ShardPlan& shards() const { return shards_; }
  // After finish(): where this rank's averaged piece of bucket b is (shards().parts[b].count
  // elements, or none past the bucket's end): the gradients' own place with level 1, the
  // reduced pieces with level 2.
  const float* reduced_piece(size_t bucket) const;
  // Host, level 2: every averaged piece, as one shard (shards().shard_count).
  const float* reduced_shard() const { return reduced_shard_.data(); }
  // Level 2 or 3: every averaged piece, as one shard, wherever it is kept (host: the buffer of
  // reduced_shard(), or with a ring its own).
  const float* reduced_pieces() const { return ringed() ? reduced_device_ : reduced_shard(); }
  // This rank's pieces of the flat buffer `full` into `shard` (shard_count, padding zero).
  // Host memory.
  void take_shard(const float* full, float* shard) const;
  // The floats of the padded buckets' copies (the buckets that do not divide evenly) and of
  // the averaged pieces kept apart (host, level 2).
  size_t scratch_floats() const;
  // Collective: every rank's pieces (`shard`, its own) into the whole flat buffer `full`
  // (device communicators: device buffers, `stream` made to wait).
  void gather_shards(const float* shard, float* full, void* stream = nullptr);
  // Collective: bucket b's pieces of every rank (`shard`, its own) into
  // `into` (shards().parts[b].piece x size() floats: the bucket, then the padding).
  void gather_bucket(size_t b, const float* shard, float* into);
  // The same, not waited for (device communicators: the Work makes a stream wait), on the
  // gathers' communicator.
  std::unique_ptr<Work> gather_bucket_async(size_t b, const float* shard, float* into);
  // --zero 3's gathers of a layer before its use (gather_bucket, gather_bucket_async) on a
  // communicator of their own over the same ranks (in the same order: a split of comm()), so
  // that on the GPU a gather runs on its own stream and never queues behind the reduce-
  // scatters issued before it; null: on comm().
  void set_gather_comm(Communicator* comm) { gather_comm_ = comm; }
  // The communicator of --zero 3's layer gathers: set_gather_comm's, else comm().
  Communicator& gather_comm() { return gather_comm_ != nullptr ? *gather_comm_ : comm_; }
  // Collective: every rank's pieces of `full`, each rank's own being current in place, into
  // every rank's `full` (device communicators: `stream` made to wait).
  void gather_in_place(float* full, void* stream);

 private:
  void issue(size_t bucket);
  // Bucket `bucket`'s padded pieces at `send` reduce-scattered (averaged) into this rank's
  // piece at `recv`: as float32, or (--grad-reduce bf16) as bfloat16 through the scratch.
  std::unique_ptr<Work> reduce_scatter(const float* send, float* recv, size_t bucket);
  void copy(float* dst, const float* src, size_t floats);  // host, or the device's (in order)
  // `gathers` waited for, then padded bucket b's gathered copy into `full`.
  void copy_back(size_t b, float* full, std::vector<std::unique_ptr<Work>>& gathers, void* stream);
  // Each of `works` waited for (host) or made `stream` wait (device); then none left.
  void wait_all(std::vector<std::unique_ptr<Work>>& works, void* stream);
  void record(DdpEvent event) {
    if (recording_) events_.push_back(std::move(event));
  }

  Communicator& comm_;
  Communicator* gather_comm_ = nullptr;  // --zero 3's layer gathers, where apart
  CopyFn copy_to_device_ = nullptr;
  CopyFn copy_to_host_ = nullptr;
  std::vector<Bucket> buckets_;
  bool overlap_;
  float* grads_ = nullptr;
  uint16_t* bf16_scratch_ = nullptr;  // bf16 gradients on the wire, when asked
  size_t next_bucket_ = 0;            // buckets are issued in order (last layers first)
  std::vector<std::unique_ptr<Work>> pending_;
  std::vector<DdpEvent> events_;
  bool recording_ = false;
  int layer_count_ = 0;
  bool in_backward_ = false;  // between begin_backward and end_backward
  int zero_ = 0;
  ShardPlan shards_;
  // Whether bucket b's pieces overrun it (then they go through bucket_scratch_[b]).
  bool padded(size_t b) const {
    return shards_.parts[b].piece * static_cast<size_t>(comm_.size()) != buckets_[b].count;
  }
  // A padded bucket's pieces, every rank's (host: in bucket_host_; device: the caller's).
  std::vector<float*> bucket_scratch_;
  std::vector<std::vector<float>> bucket_host_;
  std::vector<float> reduced_shard_;  // host, level 2: the averaged pieces
  DeviceMemory device_;
  bool ringed() const { return device_.ring_slots > 0; }
  float* reduced_device_ = nullptr;  // ring: the averaged pieces
  size_t scratch_floats_ = 0;
};

}  // namespace ddp
