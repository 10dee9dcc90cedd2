// Communication hooks for ddp::DistributedDataParallel (PyTorch's register_comm_hook and
// torch.distributed.algorithms.ddp_comm_hooks): how each bucket of gradients is reduced over the
// ranks. The built-ins: the averaging all-reduce (what the buckets do without a hook), the same
// with the gradients on the wire as bfloat16 or float16, and PowerSGD, a low-rank approximation of
// each matrix gradient with error feedback (Vogels et al., 2019; PyTorch's powerSGD_hook):
//
//   auto state = std::make_shared<ddp::PowerSGDState>(
//       ddp::PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(10));
//   model.register_comm_hook(ddp::powersgd_comm_hook(state));
#pragma once

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace ddp {

// The collectives' element type of a LibTorch dtype (float32, float64, bfloat16, float16: the
// dtypes DistributedDataParallel buckets); a UsageError naming another.
DataType collective_type(torch::ScalarType dtype);

// A bucket as a LibTorch communication hook sees it (PyTorch's GradBucket).
struct TorchGradBucket {
  size_t index = 0;                       // its place in the reduction order (0: the last
                                          // parameters'), the same on every rank
  torch::Tensor buffer;                   // its gradients, one flat tensor of its parameters'
                                          // dtype (a bucket holds one): a view of the bucket,
                                          // to hold the average over the ranks
  std::vector<torch::Tensor> parameters;  // the parameters whose gradients it holds
  std::vector<torch::Tensor> gradients;   // their gradients: views of buffer, each of its
                                          // parameter's shape (PyTorch's bucket.gradients())
};

// A communication hook (PyTorch's register_comm_hook): starts the reduction of `bucket` over
// `comm` so that bucket.buffer holds the average over the ranks once the returned Work is done
// (CPU: backward waits for it; CUDA: LibTorch's current stream is made to wait), or returns null
// where it is done already (on the CPU, or in the current stream's order on the GPU). Every rank
// runs it on the same buckets in the same order.
using TorchCommHook =
    std::function<std::unique_ptr<Work>(Communicator& comm, TorchGradBucket& bucket)>;

// What `hook` is, for the ranks' comparison at the first backward after register_comm_hook: a
// built-in's name with its settings ("bf16_compress", "powerSGD(matrix_approximation_rank 2,
// ...)"), "a hook of one's own (<its type>)" for another callable, "none" for an empty one.
std::string describe_comm_hook(const TorchCommHook& hook);

// The built-in hook of the averaging all-reduce (what the buckets do without a hook).
TorchCommHook allreduce_comm_hook();
// The built-in hook of the same average with the gradients on the wire as bfloat16 (PyTorch's
// bf16_compress_hook): a float32 bucket through the communicator's bf16 all-reduce (NCCL's
// fused cast, the host backends' rounding on this thread: each value rounded, divided by the
// ranks, summed in bf16); a bucket of another dtype cast in LibTorch and all-reduced as bf16,
// done when the hook returns.
TorchCommHook bf16_compress_comm_hook();
// The same with float16 (PyTorch's fp16_compress_hook): each gradient divided by the ranks in
// half precision (so that the sum does not overflow 65504), summed, cast back to the bucket's
// dtype.
// Finer than bf16 (10 mantissa bits against 7), narrower in range. Every backend.
TorchCommHook fp16_compress_comm_hook();

// PowerSGD's settings, PyTorch's PowerSGDState arguments under the same names and defaults.
struct PowerSGDOptions {
  // The rank r of each gradient matrix's approximation (P: rows x r, Q: columns x r); higher
  // is closer to the exact average and sends more.
  TORCH_ARG(int, matrix_approximation_rank) = 1;
  // The steps (counted from 0) that use the exact averaging all-reduce before compression
  // starts: PyTorch's advice is about a tenth of training, to let the model settle first.
  TORCH_ARG(int64_t, start_powerSGD_iter) = 1000;
  // A gradient is compressed only where (rows + columns) x r x this < rows x columns; others
  // (and every tensor of one dimension: biases, norms' weights) are averaged exactly.
  TORCH_ARG(double, min_compression_rate) = 2;
  // What compression left out of a rank's gradient is added to its next one (error feedback);
  // without it PowerSGD converges to a worse model.
  TORCH_ARG(bool, use_error_feedback) = true;
  // Q kept from step to step as the next step's start (one power iteration a step refines it);
  // else drawn afresh each step.
  TORCH_ARG(bool, warm_start) = true;
  // Added to each column's norm before the Gram-Schmidt division (a column of norm zero stays
  // zero either way).
  TORCH_ARG(double, orthogonalization_epsilon) = 0;
  // The seed of Q's first draw (the same on every rank, as it must be).
  TORCH_ARG(uint64_t, random_seed) = 0;
};

// PowerSGD's state: its options, the step count, each bucket's P, Q and errors, and what the
// compression saved. Shared by the hook and the program that reads its statistics.
class PowerSGDState {
 public:
  // The state of a hook with these options; nothing allocated until the first bucket.
  explicit PowerSGDState(PowerSGDOptions options = {});
  // Its options.
  const PowerSGDOptions& options() const { return options_; }
  // The step the next bucket belongs to (from 0; the steps before start_powerSGD_iter are exact).
  int64_t iteration() const { return iteration_; }
  // The elements a rank would have sent without compression and those it sent, over the
  // compressed steps so far (PyTorch's compression_stats(): their ratio is the rate).
  int64_t elements_before_compression() const { return elements_before_; }
  // The elements sent instead (P and Q, and the tensors averaged exactly).
  int64_t elements_after_compression() const { return elements_after_; }

 private:
  // What the hook keeps of one bucket (the same on every rank).
  struct BucketState {
    std::vector<size_t> compressed;     // indices into the bucket's gradients
    std::vector<size_t> exact;          // the others
    std::vector<int64_t> rows, ranks;   // each compressed gradient's matrix rows and rank r
    torch::Tensor p_memory, q_memory;   // every P of the bucket in one flat tensor; every Q
    torch::Tensor exact_memory;         // the exact tensors, flattened into one
    std::vector<torch::Tensor> errors;  // each compressed gradient's error (feedback)
    std::vector<const void*> members;   // its parameters (their TensorImpl) when it was made
  };

  friend TorchCommHook powersgd_comm_hook(std::shared_ptr<PowerSGDState> state);
  // Reduces `bucket` as the hook does (below).
  void reduce(Communicator& comm, TorchGradBucket& bucket);
  // The bucket's state, made from its gradients at its first compressed step, and again (its
  // error feedback dropped) where the bucket's gradients have changed since (the wrapper
  // rebuilt its buckets from the order gradients arrive in).
  BucketState& bucket_state(const TorchGradBucket& bucket);

  PowerSGDOptions options_;
  int64_t iteration_ = 0;
  bool called_ = false;
  int64_t elements_before_ = 0, elements_after_ = 0;
  std::map<size_t, BucketState> buckets_;
};

// The PowerSGD hook over `state` (PyTorch's powerSGD_hook): for start_powerSGD_iter steps the
// averaging all-reduce; then for each bucket, each gradient matrix M (a tensor of two or more
// dimensions as rows x the rest, error added) is approximated as P Q^T: P = M Q, all-reduced
// (summed) and orthonormalised, Q = M^T P, all-reduced and averaged, M = P Q^T; the local error
// M - P Q^T kept for the next step. Tensors not worth compressing are averaged exactly (in one
// all-reduce, started first); unlike PyTorch's hook they keep no error (theirs sums to zero
// over the ranks, so the averages agree; here a bucket with nothing to compress is the plain
// all-reduce bitwise). Every float dtype: a float64 bucket is computed in float64, a bfloat16,
// float16 or float32 one in float32 (P, Q, the error M - P Q^T, the exact part on the wire),
// the result rounded once into the bucket (PyTorch computes in the bucket's dtype; float32
// keeps a half's error feedback from vanishing below its step).
// Each call is done when it returns (CPU) or in the current CUDA stream's order (GPU), so it
// returns null.
TorchCommHook powersgd_comm_hook(std::shared_ptr<PowerSGDState> state);

}  // namespace ddp
