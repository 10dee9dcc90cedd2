// GradSync: gradient sync's set-up, whole or sharded, over any runner's ReplicaStore.
#include "dist/grad_sync.h"

#include <spdlog/spdlog.h>

namespace ddp {

BucketPlan plan_sync_buckets(const std::vector<ParamSpan>& layers, const SyncOptions& options) {
  return make_bucket_plan(layers, sync_bucket_options(options.zero, options.buckets));
}

RingLayout sync_ring_layout(const SyncOptions& options, int stages_on_rank, int micro_batches,
                            int replicas) {
  RingLayout layout;
  layout.zero = options.zero;
  layout.overlap = options.buckets.overlap;
  layout.stages_on_rank = stages_on_rank;
  layout.micro_batches = micro_batches;
  layout.replicas = replicas;
  return layout;
}

std::unique_ptr<Reducer> GradSync::make(Communicator& group, ReplicaStore& store,
                                        const SyncOptions& options, const ModelIdentity& model,
                                        bool lead, Communicator* gathers) {
  auto ddp = std::make_unique<Reducer>(group, store.bucket_plan());
  const DdpOptions defaults;
  if (lead && options.gathers_layers() &&
      (options.buckets.bucket_mb != defaults.bucket_mb ||
       options.buckets.first_bucket_mb != defaults.first_bucket_mb))
    spdlog::warn(
        "--zero 3 cuts one bucket a layer (a layer's parameters are gathered and freed together): "
        "--bucket-mb {} and --first-bucket-mb {} are not used",
        options.buckets.bucket_mb, options.buckets.first_bucket_mb);
  store.join(*ddp, model.fingerprint, model.description);
  if (lead && !group.device_buffers())  // the GPU's store says it with its stream's set-up
    spdlog::info(
        "data parallel over {} ranks ({}): {} bucket{}, overlap {}, gradients reduced in {}",
        group.size(), group.backend(), ddp->buckets().size(), ddp->buckets().size() == 1 ? "" : "s",
        store.bucket_plan().overlap ? "on" : "off", options.bf16_grads ? "bf16" : "fp32");
  ddp->broadcast_parameters(store.params(), store.count());
  store.params_changed();
  if (options.zero > 0) {
    const ShardPlan& plan = store.shard(*ddp, options.zero, gathers);
    if (lead)
      spdlog::info(
          "zero: stage {} over {} data-parallel ranks; rank 0 holds the optimizer state of {} "
          "of {} parameters{}",
          options.zero, plan.ranks, plan.owned(), store.count(),
          options.zero == 1   ? ""
          : options.zero == 2 ? " and only its pieces of the averaged gradients"
                              : ", its pieces of the averaged gradients and of the parameters "
                                "(a layer's gathered for each use)");
  }
  return ddp;
}

}  // namespace ddp
