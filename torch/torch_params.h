// ZeRO for LibTorch modules, the parameters' side: a ParamStore (dist/param_store.h) whose
// parameters of each dtype are views into one flat tensor, laid out as their gradients are
// (each dtype's buffer, in the reducer's order, so that a bucket is a range of both), and
// dist/'s sharded state over it
// (ShardedState: the same reduce-scatters, all-gathers and pieces as ddptrain's ZeRO). A
// parameter is owned whole (the user's LibTorch optimizer steps whole tensors): each bucket's
// parameters are split into runs of about equal elements among the ranks (balanced_owners),
// so that a rank's optimizer keeps state for about 1/N of the model: the parameters it does
// not own get no gradient (DistributedDataParallel drops them after the reduction), and
// LibTorch's optimizers skip a parameter without one. Level 2 and 3 reduce-scatter each bucket
// (its owners' averaged gradients only); level 3 keeps only this rank's pieces between steps,
// its own parameters viewing them, the others' empty until the next gather.
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
  // `buffer_dtypes`, the reducer `ddp` over them (layer j of it is params[param_of[j]]) at
  // `level` (1, 2, 3): the parameters become views into their buffer (level 3: this rank's
  // into its pieces, the others' empty until gather). `moved(i)` runs after parameter i's
  // tensor is re-set (LibTorch gives it a new gradient accumulator then); `stream()` is the
  // compute stream the collectives and copies are ordered on (null: the CPU).
  TorchParams(std::vector<torch::Tensor> params, std::vector<Slot> slots,
              std::vector<torch::ScalarType> buffer_dtypes, std::vector<int64_t> buffer_counts,
              Reducer& ddp, const std::vector<size_t>& param_of, int level,
              std::function<void(size_t)> moved, std::function<void*()> stream);
  ~TorchParams() override;

  // The rank that owns parameter i (its optimizer state and its update).
  int owner(size_t i) const { return owner_[i]; }
  // Whether this rank owns parameter i.
  bool owns(size_t i) const { return owner_[i] == rank_; }
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
  // The owners are about to change their parameters (their optimizer steps): the next gather
  // brings them to every rank; level 3 frees the others' now.
  void stale();
  // Collective: every rank's parameters become their owners' (level 3: the flat buffers made
  // again and every parameter a view into them), on the compute stream with a device
  // communicator. Nothing to do while current().
  void gather();
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
  void copy(void* dst, const void* src, size_t bytes);     // memory_'s copy
  // Parameter i's place in `storage` at `offset` elements, of its shape.
  torch::Tensor view(size_t i, const torch::Tensor& storage, int64_t offset) const;
  void make_flats();  // each dtype's flat buffer (not filled)
  void view_flats();  // every parameter a view into its flat buffer
  void release();     // level 3: own parameters into the pieces, the others empty
  void point(size_t i, const torch::Tensor& to);  // parameter i set to `to`

  std::vector<torch::Tensor> params_;
  std::vector<Slot> slots_;
  std::vector<torch::ScalarType> dtypes_;
  std::vector<int64_t> counts_;
  torch::TensorOptions options_;  // the parameters' device, uint8
  std::vector<int> owner_;
  std::vector<size_t> bucket_of_;      // each parameter's bucket
  std::vector<int64_t> piece_at_;      // an owned parameter's place in its buffer's pieces
  std::vector<torch::Tensor> flats_;   // each dtype's (level 3: during a step only)
  std::vector<torch::Tensor> pieces_;  // level 3: each dtype's pieces (ShardedState's)
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
