// ZeRO for LibTorch modules, the parameters' side: which rank owns which parameter, the owners'
// parameters as views into one flat tensor each, their broadcast from the owners, and (ZeRO 3)
// the others' parameters freed between steps. A parameter is owned whole (the user's LibTorch
// optimizer steps whole tensors), the owners cut as contiguous runs of the registration order
// balanced by bytes, so that a rank's optimizer keeps state for about 1/N of the model: the
// parameters it does not own get no gradient (DistributedDataParallel drops them after the
// reduction), and LibTorch's optimizers skip a parameter without one.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "collectives/communicator.h"

namespace ddp {

class ParamShards {
 public:
  // `params`: the parameters that get gradients, in registration order, on one device, of
  // any dtypes, each with its own values (rank 0's, after the construction's broadcast). They
  // become views into their owner's flat bytes (each at a multiple of its element size); ZeRO 3
  // (`level` 3) frees the others' at once (call gather before they are used). `moved(i)` runs after
  // parameter i's tensor is re-set (LibTorch gives it a new gradient accumulator then).
  ParamShards(std::vector<torch::Tensor> params, int level, int rank, int ranks,
              std::function<void(size_t)> moved);

  // The rank that owns parameter i (its optimizer state and its update).
  int owner(size_t i) const { return owner_[i]; }
  // Whether this rank owns parameter i.
  bool owns(size_t i) const { return owner_[i] == rank_; }
  // Whether every rank's parameters are the owners' values (after gather, until stale()).
  bool current() const { return current_; }
  // The owners are about to change their parameters (their optimizer steps): the next gather
  // broadcasts them; ZeRO 3 frees the others' now.
  void stale();
  // Collective: every rank's parameters become their owners' (ZeRO 3: the others' are
  // allocated first, as views into a flat tensor per owner), one broadcast per owner; on
  // `stream` with a device communicator. Nothing to do while current().
  void gather(Communicator& comm, void* stream);
  // Parameter i's tensor was replaced from outside (torch::load): its values go into its slot
  // where this rank holds one (every rank loads the same values; the owner's win at the next
  // gather) and the tensor is the view again.
  void take_back(size_t i);
  // The bytes the parameters keep alive on this rank now (flat tensors and unsharded ones).
  size_t parameter_bytes() const;

 private:
  void view_into(int owner);                 // the owner's parameters as views into its flat tensor
  torch::Tensor make_flat(int owner) const;  // the owner's flat bytes (not filled)
  torch::Tensor slot(size_t i) const;        // parameter i's place there, of its shape
  void free(int owner);  // the owner's parameters empty, its flat tensor released

  std::vector<torch::Tensor> params_;
  std::vector<int> owner_;
  std::vector<int64_t> offset_;              // each parameter's byte offset in its owner's flat
  std::vector<int64_t> owner_count_;         // each owner's bytes (whole 32-bit words)
  std::vector<std::vector<int64_t>> sizes_;  // each parameter's shape (a freed one is [0])
  std::vector<torch::Tensor> flat_;          // each owner's flat bytes (undefined: freed)
  int level_, rank_;
  bool current_ = true;
  std::function<void(size_t)> moved_;
};

}  // namespace ddp
