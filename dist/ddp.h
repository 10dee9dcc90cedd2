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
#include "dist/buckets.h"
#include "runtime/checksum.h"

namespace ddp {

// One entry of the engine's own record of a step: what happened, in order.
struct DdpEvent {
  // "layer_done", "allreduce_issued", "backward_done", "allreduce_waited"; shard units':
  // "unit_gather_issued", "unit_gather_ready" (complete when its unit was reached: the prefetch
  // hid it), "unit_gather_waited" (waited for), "unit_forward", "unit_backward" (layer: the unit)
  std::string what;
  int layer = -1;   // the layer it concerns, or -1
  int bucket = -1;  // the bucket it concerns, or -1
};

// A tensor of one's own model for the layout check: its name and element count.
struct NamedParam {
  std::string name;  // as the model calls it ("fc1.weight")
  size_t count = 0;  // its elements
};

// A gradient buffer of backward: its memory (host or device, as the communicator takes) and
// its element type. A bucket is a range of one (Bucket::buffer).
struct GradMemory {
  void* data = nullptr;                // its elements (null: see begin_backward)
  DataType type = DataType::kFloat32;  // their type
};

// How a bucket is reduced instead of the averaging all-reduce (as c10d's communication hooks):
// ZeRO's reduce-scatter into this rank's piece (dist/sharded_buckets.h).
class BucketReduction {
 public:
  virtual ~BucketReduction() = default;
  // Starts bucket `bucket`'s reduction of the step's gradients (`grads`: begin_backward's
  // buffer of the bucket, its data null where the reduction keeps them); Reducer::finish waits for
  // its Work.
  virtual std::unique_ptr<Work> reduce(size_t bucket, const GradMemory& grads) = 0;
  // What the engine's record calls its start ("reduce_scatter_issued").
  virtual const char* issued_event() const = 0;
  // Whether backward may give no flat gradient buffer (the gradients are in its own memory).
  virtual bool keeps_gradients() const = 0;
};

// One bucket's gradients as a communication hook sees them (c10d's GradBucket).
struct GradBucket {
  size_t index = 0;      // its place in the reduction order (0: the last layers')
  void* data = nullptr;  // its gradients, `count` elements of `type` in its buffer (host or
                         // device memory, as the communicator takes; null where backward was
                         // given none: the hook knows where they are)
  DataType type = DataType::kFloat32;  // their element type (their buffer's)
  size_t count = 0;                    // its elements
  size_t offset = 0;                   // where they start in its buffer
  size_t buffer = 0;                   // which of backward's buffers (Bucket::buffer)
};

// A communication hook (c10d's register_comm_hook): starts the reduction of `bucket` over `comm`
// so that `bucket.data` holds the average over the ranks once the returned Work is done (host
// communicators: Reducer::finish waits for it; device ones: the compute stream is made to wait), or
// returns null where it is done already (in the compute stream's order). Every rank runs the
// same hook on the same buckets in the same order.
using CommHook = std::function<std::unique_ptr<Work>(Communicator& comm, const GradBucket& bucket)>;

// Reducer's own reduction as a hook: the averaging all-reduce in the bucket's type (bfloat16 and
// float16 summed in their own type, as NCCL adds; Gloo and MPI add each pair in float and round).
CommHook allreduce_hook();
// The same with float32 gradients on the wire as bfloat16 through `scratch` (as many bf16
// values as buffer 0 has elements, in the communicator's memory; c10d's bf16_compress_hook);
// the buckets of other types reduced as allreduce_hook does.
CommHook bf16_compress_hook(uint16_t* scratch);

// Each of `works` (collectives over `comm`) waited for on the host, bounded by its timeout, or
// (device communicators) made `stream` wait; then none left.
void wait_all(std::vector<std::unique_ptr<Work>>& works, Communicator& comm, void* stream);

// Data parallelism over a communicator (the top of this file): one per model replica group. The
// bucketed reducer (c10d's Reducer): it sees buffers and bucket indices, never a model.
class Reducer {
 public:
  // Any model: its layers as spans of one flat buffer (see ParamSpan; param_spans(shape)
  // for the MLP); layer_done(i) refers to layers[i]. overlap: start each bucket's
  // all-reduce as soon as its layers are done; otherwise all of them after backward.
  Reducer(Communicator& comm, const std::vector<ParamSpan>& layers, size_t bucket_bytes,
          size_t first_bucket_bytes, bool overlap);
  // The same with the flags' units (DdpOptions: MiB); bad options are a UsageError.
  Reducer(Communicator& comm, const std::vector<ParamSpan>& layers, const DdpOptions& options = {});
  // Buckets planned by the caller (plan_grouped_buckets) over `layer_count` layers: they must
  // tile the layers, the highest first (else a Error naming the first that does not).
  Reducer(Communicator& comm, std::vector<Bucket> buckets, int layer_count, bool overlap);
  // The buckets of a plan decided once for the stage (make_bucket_plan), checked as above.
  Reducer(Communicator& comm, const BucketPlan& plan)
      : Reducer(comm, plan.buckets, plan.layer_count, plan.overlap) {}

  // Collective: every rank describes its model the same way, or the first difference is a
  // UsageError on every rank naming it ("rank 1 has parameter 3 'fc2.weight' of 512 elements
  // where rank 0 has 'fc2.weight' of 256"). A device communicator needs the copies
  // (set_device_copies) and a scratch (set_device_scratch).
  void check_same_layout(const std::vector<NamedParam>& params);

  // Collective: every rank must hold the same model; `fingerprint` identifies its layout
  // (MlpShape::fingerprint()), `description` names it in the message (ddptrain's: "--layers
  // 12,8,4", the flag that made it); throws naming the ranks that differ. A device communicator
  // needs `device_scratch` of size() + 1 int64 and the copy functions (set_device_copies).
  void check_same_layout(uint64_t fingerprint, const std::string& description,
                         void* device_scratch = nullptr);
  // A synchronous copy of `bytes` between host and device memory.
  using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
  // The copies check_same_layout uses with a device communicator.
  void set_device_copies(CopyFn to_device, CopyFn to_host) {
    copy_to_device_ = to_device;
    copy_to_host_ = to_host;
  }
  // A device buffer of at least `bytes`, valid until the next call (for the layout check's
  // messages over a device communicator).
  using ScratchFn = std::function<void*(size_t bytes)>;
  // The scratch check_same_layout(names) uses with a device communicator.
  void set_device_scratch(ScratchFn scratch) { device_scratch_ = std::move(scratch); }
  // Reduce float32 gradients as bfloat16 (Communicator::all_reduce_bf16_async) through
  // `scratch`: as many bf16 values as the float32 buffer has floats, in the communicator's memory
  // (bf16_compress_hook registered, and ZeRO's reduce-scatters in bf16 too). UsageError when
  // the backend cannot.
  void reduce_in_bf16(void* scratch);
  // Each bucket reduced by `hook` instead of the averaging all-reduce, from the next backward
  // (one hook a Reducer, as PyTorch's; a UsageError for a second, during backward, or beside a
  // sharded reduction).
  void register_comm_hook(CommHook hook);
  // Whether reduce_in_bf16 was called.
  bool reduces_in_bf16() const { return bf16_scratch_ != nullptr; }
  // Collective: parameters (params[count], host or device as the communicator expects)
  // become rank 0's.
  void broadcast_parameters(float* params, size_t count);

  // Backward hooks, called on the training thread: start of a step's backward, each layer's
  // gradients written (layers arrive last to first), end of backward. layer_done or
  // end_backward without begin_backward, and a layer index out of range, are UsageErrors
  // that say what to call. `grads`: the one float32 buffer every bucket is a range of, or
  // (grouped buckets) a buffer for each Bucket::buffer; null where a registered hook finds each
  // bucket's gradients itself (GradBucket::data is then null) or a reduction keeps them.
  void begin_backward(float* grads);
  // The same with a buffer for each Bucket::buffer, each of its own element type.
  void begin_backward(std::vector<GradMemory> buffers);
  // From now on begin_backward may be given null buffers that set_buffer gives later, before
  // their buckets' layers are ready (LibTorch's shard units: a unit's gradients are allocated as
  // its backward starts and freed once its buckets are reduced).
  void give_buffers_late() { late_buffers_ = true; }
  // During backward: buffer `buffer`'s memory for this backward (give_buffers_late).
  void set_buffer(size_t buffer, const GradMemory& memory);
  // Layer `layer`'s gradients are written: the buckets it completes start (with overlap).
  void layer_done(int layer);
  // Layer `layer`'s gradients are written, in whatever order they come (autograd's): a bucket
  // starts once all of its layers are ready, the buckets in order (every rank issues the same
  // sequence). Each layer at most once a step.
  void layer_ready(int layer);
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
  // Whether events are recorded.
  bool recording() const { return recording_; }
  // An event of the caller's (LibTorch's shard units: their gathers and computations) in the
  // same record, in order with the buckets', while recording.
  void note(DdpEvent event) { record(std::move(event)); }
  // The communicator it reduces over.
  Communicator& comm() { return comm_; }
  // Whether buckets start as soon as their layers are done (else all after backward).
  bool overlaps() const { return overlap_; }

  // A bucket's reduction in place of the averaging all-reduce, from now on (null: the
  // all-reduce again); kept by the caller as long as the Reducer is used.
  void set_reduction(BucketReduction* reduction);
  // The flat float32 gradient buffer of this step's backward (begin_backward's; null with a
  // reduction that keeps the gradients itself, or buffers of other types).
  float* grads() const;
  // This backward's gradient buffers (begin_backward's).
  const std::vector<GradMemory>& buffers() const { return buffers_; }
  // reduce_in_bf16's scratch, or null.
  uint16_t* bf16_scratch() const { return bf16_scratch_; }

 private:
  void issue(size_t bucket);
  void check_layer(const char* what, int layer) const;
  void index_layers();
  void record(DdpEvent event) {
    if (recording_) events_.push_back(std::move(event));
  }

  Communicator& comm_;
  CopyFn copy_to_device_ = nullptr;
  CopyFn copy_to_host_ = nullptr;
  ScratchFn device_scratch_;
  std::vector<Bucket> buckets_;
  bool overlap_;
  std::vector<GradMemory> buffers_;   // this backward's gradients (begin_backward)
  uint16_t* bf16_scratch_ = nullptr;  // bf16 gradients on the wire, when asked
  CommHook hook_;                     // registered, or empty (the averaging all-reduce)
  bool user_hook_ = false;            // hook_ came from register_comm_hook
  size_t next_bucket_ = 0;            // buckets are issued in order (last layers first)
  std::vector<std::unique_ptr<Work>> pending_;
  std::vector<DdpEvent> events_;
  bool recording_ = false;
  int layer_count_ = 0;
  size_t buffer_count_ = 1;     // the gradient buffers the buckets lie in (begin_backward's)
  std::vector<int> bucket_of_;  // each layer's bucket (layer_ready)
  std::vector<int> waiting_;    // each bucket's layers not yet ready this step (layer_ready)
  std::vector<char> ready_;     // each layer: ready this step (layer_ready)
  bool in_backward_ = false;    // between begin_backward and end_backward
  bool late_buffers_ = false;   // give_buffers_late()
  BucketReduction* reduction_ = nullptr;
};

// The reducer's first name, kept for programs written against it.
using Ddp = Reducer;

}  // namespace ddp
