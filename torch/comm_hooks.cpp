// The built-in communication hooks of ddp::DistributedDataParallel: the average, its bf16
// travel, and PowerSGD.
#include "torch/comm_hooks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "runtime/error.h"

#if DDP_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp {

namespace {

// `work` done before what comes next in the order of `like`'s device: LibTorch's current
// stream waits for it on the GPU (the host does not), the host waits on the CPU.
void finish_in_order(Communicator& comm, Work& work, const torch::Tensor& like) {
#if DDP_TORCH_CUDA
  if (like.is_cuda()) {
    work.then_on(c10::cuda::getCurrentCUDAStream(like.device().index()).stream());
    return;
  }
#endif
  (void)like;
  work.wait(comm.timeout());
}

// The columns of m (rows x r) made orthonormal in place, as PyTorch's _orthogonalize: for
// r <= 2 by Gram-Schmidt (a column of norm zero stays zero: no host read, no NaN), else by a
// Householder QR, which stays orthonormal where m's rank is below r (Gram-Schmidt's noise
// column would not be, and P P^T would no longer project).
void orthogonalize(torch::Tensor m, double epsilon) {
  const int64_t r = m.size(1);
  if (r > 2) {
    m.copy_(std::get<0>(torch::linalg_qr(m)));
    return;
  }
  for (int64_t i = 0; i < r; ++i) {
    torch::Tensor col = m.narrow(1, i, 1);
    torch::Tensor norm = torch::norm(col) + epsilon;
    col.div_(norm.clamp_min(std::numeric_limits<float>::min()));
    if (i + 1 < r) {
      torch::Tensor rest = m.narrow(1, i + 1, r - i - 1);
      rest.sub_(col * (col * rest).sum(0, /*keepdim=*/true));
    }
  }
}

// Each bucket's scratch tensor in another dtype, kept from step to step (a collective in
// flight reads it), made again only when the bucket's size changes.
class BucketScratch {
 public:
  torch::Tensor& of(const TorchGradBucket& bucket, torch::ScalarType dtype) {
    if (tensors_.size() <= bucket.index) tensors_.resize(bucket.index + 1);
    torch::Tensor& scratch = tensors_[bucket.index];
    if (!scratch.defined() || scratch.numel() != bucket.buffer.numel())
      scratch = torch::empty_like(bucket.buffer, bucket.buffer.options().dtype(dtype));
    return scratch;
  }

 private:
  std::vector<torch::Tensor> tensors_;
};

// The average with the gradients on the wire in `dtype` (PyTorch's fp16_compress_hook and
// bf16_compress_hook): each bucket cast into its scratch, divided by the ranks there, summed,
// cast back. Done when it returns on the CPU (the host waits), in the current stream's order
// on the GPU.
TorchCommHook compress_hook(torch::ScalarType dtype, DataType wire_type) {
  auto wire = std::make_shared<BucketScratch>();
  return [wire, dtype, wire_type](Communicator& comm,
                                  TorchGradBucket& bucket) -> std::unique_ptr<Work> {
    torch::Tensor& scratch = wire->of(bucket, dtype);
    scratch.copy_(bucket.buffer).div_(comm.size());
    auto work = comm.all_reduce_async(scratch.data_ptr(), static_cast<size_t>(scratch.numel()),
                                      wire_type, ReduceOp::kSum);
    finish_in_order(comm, *work, bucket.buffer);
    bucket.buffer.copy_(scratch);
    return nullptr;
  };
}

}  // namespace

DataType collective_type(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return DataType::kFloat32;
    case torch::kFloat64:
      return DataType::kFloat64;
    case torch::kBFloat16:
      return DataType::kBFloat16;
    case torch::kFloat16:
      return DataType::kFloat16;
    default:
      throw UsageError(fmt::format("{} where float32, float64, bfloat16 or float16 was expected",
                                   c10::toString(dtype)));
  }
}

namespace {

// A built-in hook: what it runs and the name describe_comm_hook gives it.
struct BuiltinHook {
  std::string name;
  TorchCommHook run;
  std::unique_ptr<Work> operator()(Communicator& comm, TorchGradBucket& bucket) const {
    return run(comm, bucket);
  }
};

}  // namespace

std::string describe_comm_hook(const TorchCommHook& hook) {
  if (!hook) return "none";
  if (const auto* builtin = hook.target<BuiltinHook>()) return builtin->name;
  return std::string("a hook of one's own (") + hook.target_type().name() + ")";
}

TorchCommHook allreduce_comm_hook() {
  return BuiltinHook{"allreduce", [](Communicator& comm, TorchGradBucket& bucket) {
                       return comm.all_reduce_async(
                           bucket.buffer.data_ptr(), static_cast<size_t>(bucket.buffer.numel()),
                           collective_type(bucket.buffer.scalar_type()), ReduceOp::kAverage);
                     }};
}

TorchCommHook bf16_compress_comm_hook() {
  // A float32 bucket: the communicator's bf16 all-reduce (the collective of reduce_in_bf16, so
  // the same weights; NCCL's fused cast, the host backends' rounding); another dtype: the cast
  // in LibTorch and a bf16 all-reduce.
  auto wire = std::make_shared<BucketScratch>();
  TorchCommHook host = compress_hook(torch::kBFloat16, DataType::kBFloat16);
  return BuiltinHook{"bf16_compress", [wire, host](Communicator& comm, TorchGradBucket& bucket) {
                       if (!comm.reduces_bf16() || bucket.buffer.scalar_type() != torch::kFloat32)
                         return host(comm, bucket);
                       return comm.all_reduce_bf16_async(
                           bucket.buffer.data_ptr<float>(),
                           wire->of(bucket, torch::kBFloat16).data_ptr(),
                           static_cast<size_t>(bucket.buffer.numel()), ReduceOp::kAverage);
                     }};
}

TorchCommHook fp16_compress_comm_hook() {
  return BuiltinHook{"fp16_compress", compress_hook(torch::kHalf, DataType::kFloat16)};
}

PowerSGDState::PowerSGDState(PowerSGDOptions options) : options_(options) {
  DDP_USAGE_CHECK(options_.matrix_approximation_rank() >= 1,
                  "PowerSGDOptions: matrix_approximation_rank {} (expected 1 or more)",
                  options_.matrix_approximation_rank());
  DDP_USAGE_CHECK(options_.start_powerSGD_iter() >= 0,
                  "PowerSGDOptions: start_powerSGD_iter {} (expected 0 or more)",
                  options_.start_powerSGD_iter());
  DDP_USAGE_CHECK(options_.min_compression_rate() > 0,
                  "PowerSGDOptions: min_compression_rate {} (expected more than 0)",
                  options_.min_compression_rate());
  DDP_USAGE_CHECK(options_.orthogonalization_epsilon() >= 0,
                  "PowerSGDOptions: orthogonalization_epsilon {} (expected 0 or more)",
                  options_.orthogonalization_epsilon());
}

// What PowerSGD computes a bucket of `dtype` in: float64 stays float64; bfloat16, float16 and
// float32 in float32 (P, Q, the error and the exact part), the result rounded once into the
// bucket, so that a half's few bits neither truncate the products nor lose the error feedback.
namespace {

torch::ScalarType working_dtype(torch::ScalarType dtype) {
  return dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

}  // namespace

PowerSGDState::BucketState& PowerSGDState::bucket_state(const TorchGradBucket& bucket) {
  std::vector<const void*> members;
  for (const torch::Tensor& p : bucket.parameters)
    members.push_back(p.unsafeGetTensorImpl());
  const auto found = buckets_.find(bucket.index);
  if (found != buckets_.end() && found->second.members == members) return found->second;
  BucketState& state = buckets_[bucket.index];
  state = BucketState();
  state.members = members;
  int64_t p_size = 0, q_size = 0, exact_size = 0;
  for (size_t i = 0; i < bucket.gradients.size(); ++i) {
    const torch::Tensor& g = bucket.gradients[i];
    if (g.dim() > 1) {
      const int64_t n = g.size(0), m = g.numel() / std::max<int64_t>(n, 1);
      const int64_t r = std::min<int64_t>({n, m, options_.matrix_approximation_rank()});
      if (static_cast<double>((n + m) * r) * options_.min_compression_rate() <
          static_cast<double>(n * m)) {
        state.compressed.push_back(i);
        state.rows.push_back(n);
        state.ranks.push_back(r);
        p_size += n * r;
        q_size += m * r;
        continue;
      }
    }
    state.exact.push_back(i);
    exact_size += g.numel();
  }
  const torch::TensorOptions like =
      bucket.buffer.options().dtype(working_dtype(bucket.buffer.scalar_type()));
  state.p_memory = torch::empty({p_size}, like);
  state.q_memory = torch::empty({q_size}, like);
  if (!state.compressed.empty()) state.exact_memory = torch::empty({exact_size}, like);
  return state;
}

void PowerSGDState::reduce(Communicator& comm, TorchGradBucket& bucket) {
  BucketState& state = bucket_state(bucket);
  const size_t count = static_cast<size_t>(bucket.buffer.numel());
  const DataType type = collective_type(bucket.buffer.scalar_type());
  const torch::ScalarType work_dtype = working_dtype(bucket.buffer.scalar_type());
  const DataType work_type = collective_type(work_dtype);
  elements_before_ += static_cast<int64_t>(count);
  // The exact part first, so that it travels while P is computed: the whole buffer where
  // nothing is compressed (the plain all-reduce), else the exact tensors packed.
  std::unique_ptr<Work> exact;
  if (state.compressed.empty()) {
    exact = comm.all_reduce_async(bucket.buffer.data_ptr(), count, type, ReduceOp::kAverage);
    elements_after_ += static_cast<int64_t>(count);
  } else if (!state.exact.empty()) {
    int64_t at = 0;
    for (const size_t i : state.exact) {
      const torch::Tensor& g = bucket.gradients[i];
      state.exact_memory.narrow(0, at, g.numel()).copy_(g.reshape({-1}));
      at += g.numel();
    }
    exact = comm.all_reduce_async(state.exact_memory.data_ptr(),
                                  static_cast<size_t>(state.exact_memory.numel()), work_type,
                                  ReduceOp::kAverage);
    elements_after_ += state.exact_memory.numel();
  }
  if (!state.compressed.empty()) {
    // Each compressed gradient as a matrix M (the error of the last step added), its P and Q;
    // in another dtype than the bucket's, M is a copy, rounded back into the bucket at the end.
    std::vector<torch::Tensor> views, ms, ps, qs;
    int64_t p_at = 0, q_at = 0;
    const bool fresh_q = !options_.warm_start() || state.errors.empty();
    for (size_t k = 0; k < state.compressed.size(); ++k) {
      const torch::Tensor& g = bucket.gradients[state.compressed[k]];
      const int64_t n = state.rows[k], m = g.numel() / n, r = state.ranks[k];
      views.push_back(g.view({n, m}));
      ms.push_back(g.scalar_type() == work_dtype ? views.back() : views.back().to(work_dtype));
      ps.push_back(state.p_memory.narrow(0, p_at, n * r).view({n, r}));
      qs.push_back(state.q_memory.narrow(0, q_at, m * r).view({m, r}));
      p_at += n * r;
      q_at += m * r;
    }
    if (fresh_q) {  // the same draw on every rank: a generator of the seed, step and bucket
      auto generator = at::detail::createCPUGenerator(
          options_.random_seed() + 1000003 * static_cast<uint64_t>(bucket.index) +
          (options_.warm_start() ? 0 : static_cast<uint64_t>(iteration_) * 7919));
      state.q_memory.copy_(torch::randn({state.q_memory.numel()}, generator, torch::kFloat));
      for (torch::Tensor& q : qs)
        orthogonalize(q, options_.orthogonalization_epsilon());
    }
    if (options_.use_error_feedback()) {
      if (state.errors.empty())
        for (const torch::Tensor& m : ms)
          state.errors.push_back(torch::zeros_like(m));
      for (size_t k = 0; k < ms.size(); ++k) {
        ms[k].add_(state.errors[k]);
        state.errors[k].copy_(ms[k]);  // M, from which P Q^T is taken below
      }
    } else if (state.errors.empty()) {
      state.errors.resize(ms.size());  // marks Q as drawn (warm start)
    }
    for (size_t k = 0; k < ms.size(); ++k)
      torch::matmul_out(ps[k], ms[k], qs[k]);
    auto work = comm.all_reduce_async(state.p_memory.data_ptr(),
                                      static_cast<size_t>(state.p_memory.numel()), work_type,
                                      ReduceOp::kSum);
    finish_in_order(comm, *work, bucket.buffer);
    for (torch::Tensor& p : ps)
      orthogonalize(p, options_.orthogonalization_epsilon());
    for (size_t k = 0; k < ms.size(); ++k)
      torch::matmul_out(qs[k], ms[k].t(), ps[k]);
    work = comm.all_reduce_async(state.q_memory.data_ptr(),
                                 static_cast<size_t>(state.q_memory.numel()), work_type,
                                 ReduceOp::kAverage);
    finish_in_order(comm, *work, bucket.buffer);
    for (size_t k = 0; k < ms.size(); ++k) {
      torch::matmul_out(ms[k], ps[k], qs[k].t());
      if (!ms[k].is_same(views[k])) views[k].copy_(ms[k]);  // rounded into the bucket's dtype
      if (options_.use_error_feedback()) state.errors[k].sub_(ms[k]);
    }
    elements_after_ += state.p_memory.numel() + state.q_memory.numel();
  }
  if (exact) {
    finish_in_order(comm, *exact, bucket.buffer);
    if (!state.compressed.empty()) {
      int64_t at = 0;
      for (const size_t i : state.exact) {
        torch::Tensor& g = bucket.gradients[i];
        g.copy_(state.exact_memory.narrow(0, at, g.numel()).view_as(g));
        at += g.numel();
      }
    }
  }
}

TorchCommHook powersgd_comm_hook(std::shared_ptr<PowerSGDState> state) {
  DDP_USAGE_CHECK(state != nullptr, "powersgd_comm_hook: no PowerSGDState");
  const PowerSGDOptions& o = state->options();
  std::string name = fmt::format(
      "powerSGD(matrix_approximation_rank {}, start_powerSGD_iter {}, min_compression_rate {}, "
      "use_error_feedback {}, warm_start {}, orthogonalization_epsilon {}, random_seed {})",
      o.matrix_approximation_rank(), o.start_powerSGD_iter(), o.min_compression_rate(),
      o.use_error_feedback(), o.warm_start(), o.orthogonalization_epsilon(), o.random_seed());
  return BuiltinHook{std::move(name),
                     [state](Communicator& comm, TorchGradBucket& bucket) -> std::unique_ptr<Work> {
                       // A step begins at bucket 0 (buckets are reduced in index order, every one
                       // each step).
                       if (bucket.index == 0 && state->called_) ++state->iteration_;
                       state->called_ = true;
                       if (state->iteration_ < state->options_.start_powerSGD_iter())
                         return comm.all_reduce_async(
                             bucket.buffer.data_ptr(), static_cast<size_t>(bucket.buffer.numel()),
                             collective_type(bucket.buffer.scalar_type()), ReduceOp::kAverage);
                       state->reduce(comm, bucket);
                       return nullptr;
                     }};
}

}  // namespace ddp
