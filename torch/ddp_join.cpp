// DistributedDataParallel::join: uneven inputs (PyTorch's Join), a rank out of batches shadowing
// the others' collectives until every rank's loop has returned.
#include <torch/torch.h>

#include <algorithm>

#include "runtime/error.h"
#include "torch/ddp_impl.h"
#include "torch/device_staging.h"

namespace ddp {

// join(): every rank's {training, synchronising} flags summed (a small all-reduce each forward
// of a rank still training, and each round of a rank that has joined).
std::vector<int32_t> DistributedDataParallel::Impl::join_all_reduce(int32_t active, int32_t sync) {
  return agree({active, sync}, ReduceOp::kSum);
}

// A joined rank's part in the others' backward: the buckets reduced from zeros by the same
// reducer (so the same collectives, hooks included, in the same order), and the unused
// parameters' map where find_unused_parameters.
void DistributedDataParallel::Impl::shadow_backward() {
  agree_on_hook();
  rebuild_buckets();
  torch::NoGradGuard no_grad;
  for (GradBuffer& buffer : grad_buffers)
    buffer.flat.zero_();
  const ComputeStreamGuard on_stream(comm, stream());
  reducer->begin_backward(grad_memory());
  for (size_t layer = 0; layer < params.size(); ++layer)
    reducer->layer_ready(static_cast<int>(layer));
  reducer->end_backward();
  reducer->finish(stream());
  if (options.find_unused_parameters())
    agree(std::vector<int32_t>(params.size(), 0), ReduceOp::kMax);
}

// Once every rank has joined: the parameters and buffers of the rank that trained the most
// steps (the lowest such rank) on every rank, so that the replicas end equal (PyTorch's Join).
void DistributedDataParallel::Impl::take_last_joiners_model() {
  std::vector<int64_t> all;
  {
    const ComputeStreamGuard on_stream(comm, stream());
    all = all_gather_value(comm, steps_joined, torch_staging(device, device_scratch));
  }
  // The lowest rank of the most steps (as torch's argmax takes the first).
  const int root = static_cast<int>(std::max_element(all.begin(), all.end()) - all.begin());
  std::vector<torch::Tensor> state;
  for (const auto& p : module.parameters())
    state.push_back(p);
  for (const torch::Tensor& b : buffers)
    state.push_back(b);
  broadcast(state, root);
}

void DistributedDataParallel::Impl::join(const std::function<void()>& loop) {
  DDP_USAGE_CHECK(!shards,
                  "ddp::DistributedDataParallel::join with zero({}): a rank that has joined would "
                  "miss its own parameters' updates; uneven inputs under ZeRO are not supported",
                  options.zero());
  DDP_USAGE_CHECK(!joining, "ddp::DistributedDataParallel::join inside join");
  DDP_USAGE_CHECK(sync_batch_norms == 0,
                  "ddp::DistributedDataParallel::join with ddp::SyncBatchNorm ({} in the module): "
                  "a rank that has joined has no batch to add to the statistics, which every rank "
                  "sums in each forward; uneven inputs with SyncBatchNorm are not supported",
                  sync_batch_norms);
  DDP_USAGE_CHECK(!options.static_graph(),
                  "ddp::DistributedDataParallel::join with static_graph: a rank that has joined "
                  "cannot follow the first step's record; uneven inputs under static_graph are "
                  "not supported");
  if (comm.size() == 1) return loop();
  joining = true;
  steps_joined = 0;
  try {
    loop();
  } catch (...) {
    joining = false;
    throw;
  }
  joining = false;
  // Out of batches: take part in the others' steps until every rank is.
  for (;;) {
    const std::vector<int32_t> flags = join_all_reduce(0, 0);
    if (flags[0] == 0) break;
    if (options.broadcast_buffers()) broadcast(buffers);
    if (flags[1] > 0) shadow_backward();
  }
  take_last_joiners_model();
}

}  // namespace ddp
