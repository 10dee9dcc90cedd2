// Gradient clipping across ranks (ddp::DistributedDataParallel::clip_grad_norm_ and
// ddp::Pipeline's): the norm of the whole model's gradient where each rank holds a part of it
// (ZeRO's owners and pieces, a pipeline's stages), combined by one small all-reduce, with
// torch.nn.utils.clip_grad_norm_'s semantics.
#pragma once

#include <torch/types.h>

#include <vector>

namespace ddp {

// The part of a p-norm that `grads` hold (the undefined skipped): the sum of |g|^p over their
// elements, or (norm_type infinite) the largest |g|; in float64. A UsageError names a norm_type
// that is not positive.
double gradient_norm_part(const std::vector<torch::Tensor>& grads, double norm_type);
// Parts of one norm held apart combined: summed, or the largest (infinite norm_type).
double add_norm_parts(double a, double b, double norm_type);
// The norm of a whole part: its p-th root (the part itself for the infinite norm).
double norm_of_part(double part, double norm_type);
// torch.nn.utils.clip_grad_norm_'s scaling: every gradient times max_norm / (total + 1e-6)
// where that is below 1 (clamped at 1: no gradient grows); nothing to do otherwise.
void clip_gradients(const std::vector<torch::Tensor>& grads, double max_norm, double total);

}  // namespace ddp
