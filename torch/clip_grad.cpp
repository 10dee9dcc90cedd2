// Gradient clipping across ranks: the parts of one norm, and the scaling.
#include "torch/clip_grad.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/error.h"

namespace ddp {

double gradient_norm_part(const std::vector<torch::Tensor>& grads, double norm_type) {
  DDP_USAGE_CHECK(norm_type > 0, "clip_grad_norm_: norm_type {}: expected a positive p or inf",
                  norm_type);
  torch::NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    // Each tensor's p-norm reduced in float64 (no float64 copy of the gradient), raised to p.
    const torch::Tensor norm = torch::linalg_vector_norm(g.detach(), norm_type, c10::nullopt,
                                                         /*keepdim=*/false, torch::kFloat64);
    parts.push_back(inf ? norm : norm.pow(norm_type));
  }
  if (parts.empty()) return 0.0;
  const torch::Tensor all = torch::stack(parts);
  return (inf ? all.max() : all.sum()).item<double>();
}

double add_norm_parts(double a, double b, double norm_type) {
  return std::isinf(norm_type) ? std::max(a, b) : a + b;
}

double norm_of_part(double part, double norm_type) {
  return std::isinf(norm_type) ? part : std::pow(part, 1.0 / norm_type);
}

void clip_gradients(const std::vector<torch::Tensor>& grads, double max_norm, double total) {
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient >= 1.0) return;
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& g : grads)
    if (g.defined()) g.mul_(coefficient);
}

}  // namespace ddp
