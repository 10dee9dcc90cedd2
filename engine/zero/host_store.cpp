// HostParamStore: the CPU's flat buffers and the state gradient sync keeps them in.
#include "engine/zero/host_store.h"

#include "engine/zero/zero_host.h"

namespace ddp {

HostParamStore::HostParamStore(HostStoreLayout layout)
    : layout_(std::move(layout)),
      params_(layout_.count),
      grads_(layout_.count),
      state_(std::make_unique<HostWhole>(params_, grads_,
                                         make_optimizer(layout_.optimizer, layout_.count))) {}

void HostParamStore::join(Reducer& ddp, uint64_t fingerprint, const std::string& description) {
  ddp.check_same_layout(fingerprint, description);
  if (!layout_.bf16_grads) return;
  bf16_wire_.assign(layout_.count, 0);
  ddp.reduce_in_bf16(bf16_wire_.data());
}

const ShardPlan& HostParamStore::shard(Reducer& ddp, int level, Communicator* gathers) {
  RingLayout ring;
  ring.zero = level;
  ring.overlap = layout_.plan.overlap;
  ring.stages_on_rank = layout_.stages_on_rank;
  ring.micro_batches = layout_.micro_batches;
  auto zero = std::make_unique<HostZero>(ddp, ring, params_, grads_, layout_.layers, gathers,
                                         layout_.optimizer);
  const ShardPlan& plan = zero->plan();
  state_ = std::move(zero);
  if (rewire_) rewire_(*state_);
  return plan;
}

}  // namespace ddp
