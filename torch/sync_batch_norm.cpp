// SyncBatchNorm: the sums' all-reduce as an autograd function, the normalisation over them, and
// the running statistics.
#include "torch/sync_batch_norm.h"

#include <torch/torch.h>

#include <vector>

#include "runtime/error.h"

#if DDP_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp {

namespace {

// Every rank's `local` summed (float64), forward and backward: the gradient of a sum that every
// rank uses is the sum of every rank's gradient of it.
struct AllReduceSum : torch::autograd::Function<AllReduceSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& local,
                               int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return summed(local, comm);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    return {summed(grads[0], ctx->saved_data["comm"].toInt()), torch::Tensor()};
  }
  static torch::Tensor summed(const torch::Tensor& local, int64_t handle) {
    auto& comm = *reinterpret_cast<Communicator*>(handle);
    torch::Tensor out = local.detach().to(torch::kDouble).contiguous().clone();
    void* stream = comm.compute_stream();
#if DDP_TORCH_CUDA
    if (out.is_cuda()) stream = c10::cuda::getCurrentCUDAStream().stream();
#endif
    const ComputeStreamGuard on_stream(comm, stream);
    comm.all_reduce(out.data_ptr(), static_cast<size_t>(out.numel()), DataType::kFloat64,
                    ReduceOp::kSum);
    return out;
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const SyncBatchNormOptions& options_) : options(options_) {
  reset();
}

void SyncBatchNormImpl::reset() {
  DDP_USAGE_CHECK(options.num_features() > 0,
                  "ddp::SyncBatchNorm: num_features {}: expected a count of channels above 0",
                  options.num_features());
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::ones({c}));
    bias = register_parameter("bias", torch::zeros({c}));
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::kLong));
  }
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  const int64_t c = options.num_features();
  DDP_USAGE_CHECK(input.dim() >= 2 && input.dim() <= 5 && input.size(1) == c,
                  "ddp::SyncBatchNorm: an input of {} dimensions with {} channels in dimension 1; "
                  "expected 2 to 5 dimensions and {} channels",
                  input.dim(), input.dim() >= 2 ? input.size(1) : 0, c);
  const bool batch_stats = is_training() || !options.track_running_stats();
  if (is_training() && options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  if (!batch_stats || comm_ == nullptr || comm_->size() == 1)
    return torch::batch_norm(input, weight, bias, running_mean, running_var, batch_stats,
                             options.momentum(), options.eps(),
                             at::globalContext().userEnabledCuDNN());
  // Each rank's per-channel sums and count, summed over the ranks in one all-reduce.
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < input.dim(); ++d)
    dims.push_back(d);
  const torch::Tensor x = input.to(torch::kDouble);
  const torch::Tensor count =
      torch::full({1}, static_cast<double>(input.numel() / c), x.options().requires_grad(false));
  const torch::Tensor global = AllReduceSum::apply(
      torch::cat({x.sum(dims), (x * x).sum(dims), count}), reinterpret_cast<int64_t>(comm_));
  const double n = global[2 * c].item<double>();
  DDP_USAGE_CHECK(n > 1,
                  "ddp::SyncBatchNorm: {} value(s) a channel over every rank; batch "
                  "statistics need more than one",
                  n);
  const torch::Tensor mean = global.narrow(0, 0, c) / n;
  const torch::Tensor var = global.narrow(0, c, c) / n - mean * mean;  // biased, as training uses
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = c;
  torch::Tensor y =
      ((x - mean.view(shape)) * (var + options.eps()).rsqrt().view(shape)).to(input.scalar_type());
  if (options.affine()) y = y * weight.view(shape) + bias.view(shape);
  if (options.track_running_stats()) {
    torch::NoGradGuard no_grad;
    const double m = options.momentum();
    running_mean.mul_(1 - m).add_(mean.to(running_mean.scalar_type()), m);
    running_var.mul_(1 - m).add_((var * (n / (n - 1))).to(running_var.scalar_type()), m);
  }
  return y;
}

}  // namespace ddp
