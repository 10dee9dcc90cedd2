// ddp::SyncBatchNorm: batch normalisation whose batch statistics are every rank's slice of the
// global batch (PyTorch's torch.nn.SyncBatchNorm, which is Python-only). Declared in a model in
// place of torch::nn::BatchNorm1d/2d/3d (LibTorch cannot swap a module a parent holds by type),
// with the same parameters and buffers (weight, bias, running_mean, running_var,
// num_batches_tracked), so that a checkpoint of either loads into the other:
//
//   struct NetImpl : torch::nn::Module {
//     ddp::SyncBatchNorm bn{register_module("bn", ddp::SyncBatchNorm(64))};  // was BatchNorm2d
//   };
//
// In training each rank's per-channel sum, sum of squares and count cross one all-reduce (in
// float64), the mean and the biased variance normalise, and the running statistics take the
// global mean and the unbiased variance; backward goes back through the same all-reduce, so the
// gradients are those of one process that saw the global batch. ddp::DistributedDataParallel
// gives every SyncBatchNorm of its module the world's communicator; without one (a single
// process, or outside a wrapper) and in evaluation it is LibTorch's batch norm.
#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>

#include "collectives/communicator.h"

namespace ddp {

// SyncBatchNorm's options (LibTorch's BatchNormOptions' names).
struct SyncBatchNormOptions {
  // Options for `num_features` channels.
  SyncBatchNormOptions(int64_t num_features) : num_features_(num_features) {}  // NOLINT
  // The channels (dimension 1 of the input).
  TORCH_ARG(int64_t, num_features);
  // Added to the variance.
  TORCH_ARG(double, eps) = 1e-5;
  // The running statistics' update factor.
  TORCH_ARG(double, momentum) = 0.1;
  // A learnable weight and bias.
  TORCH_ARG(bool, affine) = true;
  // Running statistics kept (and used in evaluation).
  TORCH_ARG(bool, track_running_stats) = true;
};

// The module (the top of this file); inputs of 2 to 5 dimensions, channels in dimension 1.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  // A module of `options`' channels.
  explicit SyncBatchNormImpl(const SyncBatchNormOptions& options);
  // Makes the parameters and buffers (Cloneable's contract).
  void reset() override;
  // Normalises `input` over every rank's slice (training, with a communicator) or over its own
  // (no communicator), or by the running statistics (evaluation).
  torch::Tensor forward(const torch::Tensor& input);
  // The replicas' group; null: this process alone. DistributedDataParallel sets it.
  void set_communicator(Communicator* comm) { comm_ = comm; }

  // As constructed.
  SyncBatchNormOptions options;
  // The affine weight (undefined without affine).
  torch::Tensor weight;
  // The affine bias (undefined without affine).
  torch::Tensor bias;
  // The running mean (undefined without track_running_stats).
  torch::Tensor running_mean;
  // The running (unbiased) variance.
  torch::Tensor running_var;
  // The training forwards counted.
  torch::Tensor num_batches_tracked;

 private:
  Communicator* comm_ = nullptr;
};
// The module holder (as torch::nn::BatchNorm2d for BatchNorm2dImpl).
TORCH_MODULE(SyncBatchNorm);

}  // namespace ddp
