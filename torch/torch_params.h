// ZeRO for LibTorch modules, the parameters' side: a ParamStore (dist/param_store.h) whose
// parameters of each buffer are views into one flat tensor, laid out as their gradients are
// (each buffer in the reducer's order, so that a bucket is a range of both), and dist/'s sharded
// state over it (ShardedState: the same reduce-scatters, all-gathers and pieces as ddptrain's
// ZeRO).
// - Levels 1 and 2: a parameter is owned whole (the user's LibTorch optimizer steps whole
//   tensors): each bucket's parameters are split into runs of about equal elements among the
//   ranks (balanced_owners); a rank's optimizer keeps state for about 1/N of the model (the
//   parameters it does not own get no gradient, and LibTorch's optimizers skip those). Each
//   bucket is reduce-scattered (its owners' averaged gradients only) and the owners' updates
//   all-gathered in place.
// - Level 3 (FSDP's FULL_SHARD): each bucket in equal pieces (plan_shards, ddptrain's
//   partitioner; DistributedDataParallel pads each bucket to a multiple of the ranks so that the
//   pieces are the bucket itself), so that every rank holds about 1/N of every parameter:
//   between steps each parameter *is* this rank's piece of it (a 1-D tensor of its elements in
//   the piece, none where it has none), which the user's optimizer steps element-wise, and its
//   gradient the averaged piece. During a step the parameters are views of their shape into
//   their buffer's flat tensor, whose memory is allocated and gathered before a unit's use and
//   freed after it (its storage emptied in place, FSDP's trick: autograd's saved tensors share
//   it and see it again when backward gathers it anew), a unit being the buffers of one shard
//   unit (torch/shard_unit.h; the module's remaining parameters are one more).
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "dist/ddp.h"
#include "dist/param_store.h"
#include "dist/sharded_state.h"

namespace ddp {

class TorchParams final : public ParamStore {
 public:
  // Where a parameter lies: its dtype's buffer, its offset there (elements) and its shape.
  struct Slot {
    size_t buffer = 0;
    int64_t offset = 0;
    std::vector<int64_t> sizes;
  };

  // `params` (registration order, one device, each with its own values: rank 0's after the
  // construction's broadcast) at `slots` of buffers of `buffer_counts` elements each of
  // `buffer_dtypes` (level 3: buffer k of unit buffer_units[k]), the reducer `ddp` over them
  // (layer j of it is params[param_of[j]]) at `level` (1, 2, 3): the parameters become views
  // into their buffer (level 3: whole until the first stale()). `moved(i)` runs after parameter
  // i's tensor is re-set (LibTorch gives it a new gradient accumulator then); `stream()` is the
  // compute stream the collectives and copies are ordered on (null: the CPU).
  TorchParams(std::vector<torch::Tensor> params, std::vector<Slot> slots,
              std::vector<torch::ScalarType> buffer_dtypes, std::vector<int64_t> buffer_counts,
              Reducer& ddp, const std::vector<size_t>& param_of, int level,
              std::function<void(size_t)> moved, std::function<void*()> stream,
              std::vector<size_t> buffer_units = {});
  ~TorchParams() override;

  // Whether this rank owns parameter i (levels 1, 2: the whole tensor; 3: a piece of it), its
  // optimizer state and its update.
  bool owns(size_t i) const { return level_ == 3 ? local_count_[i] > 0 : owner_[i] == rank_; }
  // Whether every rank's parameters are the owners' values (after gather, until stale()).
  bool current() const { return current_; }
  // Whether the buckets are reduce-scattered (every level, unless a communication hook
  // reduces them): then an owner's averaged gradient is own_gradient(i), not its place in the
  // gradient buffer. Level 1 differs from 2 only in what the wrapper keeps between steps (the
  // whole gradient buffer), so that no level sends more than plain DDP's all-reduce.
  bool shards_gradients() const { return shards_gradients_; }
  // A communication hook reduces the buckets (register_comm_hook): they are all-reduced as
  // plain DDP's and the owners take their share from the gradient buffer.
  void keep_all_reduce();
  // After the reduction (shards_gradients()): owned parameter i's averaged gradient, where the
  // reduction left it (valid until the next backward).
  torch::Tensor own_gradient(size_t i) const;
  // The ZeRO level (1, 2, 3).
  int level() const { return level_; }
  // Level 3: where this rank's piece of parameter i starts among its elements (flattened).
  int64_t piece_offset(size_t i) const { return local_at_[i] - slots_[i].offset; }
  // Level 3: this rank's piece of parameter i, 1-D (maybe empty): its own memory, the master its
  // optimizer steps between steps, whatever the parameter views now. Written, the next gather
  // (after stale()) brings the values to every rank.
  torch::Tensor own_piece(size_t i) const;
  // Level 3: this rank's piece of parameter i out of `whole` (a tensor of its shape), 1-D.
  torch::Tensor piece_of(size_t i, const torch::Tensor& whole) const;
  // The owners are about to change their parameters (their optimizer steps): the next gather
  // brings them to every rank; level 3 frees the others' now.
  void stale();
  // Collective: every rank's parameters become their owners' (level 3: every unit gathered, every
  // parameter a view of its shape), on the compute stream with a device communicator. Nothing
  // to do while current().
  void gather();

  // Level 3, before the first stale(): the parameters of float32 buffers gathered as `dtype`
  // (bfloat16 or float16: all-gathered in it from this rank's pieces cast, half the bytes) for a
  // step's forward and backward, their float32 pieces the master the optimizer steps (FSDP2's
  // MixedPrecisionPolicy(param_dtype)). gather() gives the float32 masters.
  void set_param_dtype(torch::ScalarType dtype);
  // Level 3's units (the buffers of one unit each), numbered as buffer_units.
  size_t units() const { return unit_buffers_.size(); }
  // Every parameter a view of its shape into its buffer (gathered or not): a step begins.
  void begin_step();
  // Collective: unit u's memory allocated and its buckets' gathers started (`works`, waited for
  // by the caller before its parameters are read); nothing where it is gathered.
  void gather_unit(size_t u, std::vector<std::unique_ptr<Work>>& works);
  // Unit u's gathered memory freed (its parameters keep their shape, their storage empty).
  void free_unit(size_t u);
  // Whether unit u's memory holds its parameters (gathered or being gathered).
  bool unit_gathered(size_t u) const;
  // The bytes of the parameters this rank holds now: its pieces and the gathered units (level
  // 3), or every buffer.
  size_t held_bytes() const;
  // Parameter i's tensor was replaced from outside (torch::load): its values go into its slot
  // where this rank holds one (every rank loads the same values; the owner's win at the next
  // gather) and the tensor is the view again.
  void take_back(size_t i);
  // The sharded state over this store (ShardedState, dist/sharded_state.h).
  const ShardedState& state() const { return *state_; }
  ShardedState& state() { return *state_; }

  // ParamStore: the flat buffers and LibTorch tensors on the parameters' device. The whole
  // parameters out and in as float32 need one float32 buffer.
  const MemoryPort* memory() const override { return &memory_; }
  std::vector<GradMemory> param_memory() override;
  void* stream() override { return stream_(); }
  std::shared_ptr<void> allocate(size_t bytes, bool pieces) override;
  std::vector<float> to_host(const float* src, size_t floats) override;
  void from_host(float* dst, const float* host, size_t floats) override;
  std::vector<float> whole_params() override;
  void set_whole_params(const float* host) override;

 private:
  torch::Tensor bytes_at(void* data, size_t bytes) const;  // a uint8 tensor over that memory
  // Parameter i's metadata set (no new tensor, no version bump: autograd's saved tensors and
  // its gradient accumulator stay valid) to `sizes` at `offset` of `storage`.
  void repoint(size_t i, const torch::Tensor& storage, int64_t offset,
               const std::vector<int64_t>& sizes, torch::ScalarType dtype);
  // The flat tensor a step's parameters of buffer k view: the cast one (set_param_dtype) unless
  // gather() asked for the masters.
  const torch::Tensor& step_flat(size_t k) const;
  void point_at_pieces(size_t i);  // level 3: parameter i its piece (1-D, maybe empty)
  // A tensor of `sizes` and `dtype` over `data`, which lies in memory this store allocated
  // (keeping it alive, not an autograd view).
  torch::Tensor tensor_at(const void* data, torch::ScalarType dtype,
                          const std::vector<int64_t>& sizes) const;
  void copy(void* dst, const void* src, size_t bytes);  // memory_'s copy
  // Parameter i's place in `storage` at `offset` elements, of its shape.
  torch::Tensor view(size_t i, const torch::Tensor& storage, int64_t offset) const;
  void make_flats();                              // each dtype's flat buffer (not filled)
  void view_flats();                              // every parameter a view into its flat buffer
  void point(size_t i, const torch::Tensor& to);  // parameter i set to `to`

  std::vector<torch::Tensor> params_;
  std::vector<Slot> slots_;
  std::vector<torch::ScalarType> dtypes_;
  std::vector<int64_t> counts_;
  torch::TensorOptions options_;  // the parameters' device, uint8
  std::vector<int> owner_;
  std::vector<size_t> bucket_of_;     // each parameter's bucket
  std::vector<int64_t> piece_at_;     // an owned parameter's place in its buffer's pieces
  std::vector<int64_t> local_at_;     // level 3: where its piece starts in its buffer
  std::vector<int64_t> local_count_;  // level 3: and its elements
  std::vector<std::vector<size_t>> unit_buffers_;  // level 3: each unit's buffers
  std::vector<torch::Tensor> allocated_;           // what memory_ and allocate() gave
  std::vector<torch::Tensor> cast_flats_;          // set_param_dtype: each float32 buffer's, cast
  std::vector<torch::Tensor> cast_pieces_;         // and this rank's pieces of it cast (each step)
  bool masters_ = false;                           // gather(): the step views the float32 masters
  std::vector<torch::Tensor> flats_;               // each dtype's (level 3: during a step only)
  std::vector<torch::Tensor> pieces_;              // level 3: each dtype's pieces (ShardedState's)
  MemoryPort memory_;  // LibTorch tensors on the parameters' device, copies in stream order
  std::unique_ptr<ShardedState> state_;
  Reducer& ddp_;
  int level_, rank_;
  bool current_ = true;
  bool shards_gradients_ = false;
  std::function<void(size_t)> moved_;
  std::function<void*()> stream_;
};

}  // namespace ddp
