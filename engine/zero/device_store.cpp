// DeviceParamStore: the GPU's flat buffers and the state gradient sync keeps them in.
#include "engine/zero/device_store.h"

#include <spdlog/spdlog.h>

#include "dist/ddp_device.h"
#include "engine/zero/zero_device.h"

namespace ddp {

GradientRing device_gradient_ring(const std::vector<Bucket>& buckets, size_t param_count,
                                  const RingLayout& layout) {
  if (!gradient_ring_applies(layout)) return {};
  const size_t slot = gradient_ring_slot(buckets, layout.replicas, kDeviceShardAlign, param_count);
  if (slot == 0) return {};
  GradientRing ring;
  for (const Bucket& b : buckets)
    ring.buckets.emplace_back(b.offset, b.count);
  ring.slot_floats = slot;
  ring.slots = kGradientRingSlots;
  return ring;
}

DeviceParamStore::DeviceParamStore(DeviceStoreLayout layout, DeviceParameters& weights,
                                   cudaStream_t stream, DeviceWhole::Update update)
    : layout_(std::move(layout)),
      weights_(weights),
      stream_(stream),
      state_(std::make_unique<DeviceWhole>(weights, std::move(update))) {}

void DeviceParamStore::join(Reducer& ddp, uint64_t fingerprint, const std::string& description) {
  ddp_ = &ddp;
  bf16_wire_ = prepare_device_ddp(ddp, stream_, fingerprint, description, layout_.sync.bf16_grads,
                                  layout_.count);
  if (lead_ && announce_)
    spdlog::info("data parallel over {} GPUs ({}): {} buckets, overlap {}, gradients reduced in {}",
                 ddp.comm().size(), ddp.comm().backend(), ddp.buckets().size(),
                 layout_.plan.overlap ? "on" : "off", layout_.sync.bf16_grads ? "bf16" : "fp32");
}

const ShardPlan& DeviceParamStore::shard(Reducer& ddp, int level, Communicator* gathers) {
  RingLayout ring = layout_.ring;
  ring.zero = level;
  auto zero =
      std::make_unique<DeviceZero>(ddp, ring, weights_, layout_.layers, layout_.stage_layers,
                                   layout_.sync.zero_prefetch, gathers, stream_, lead_);
  if (wait_) zero->set_wait(wait_);
  const ShardPlan& plan = zero->plan();
  state_ = std::move(zero);
  if (rewire_) rewire_(*state_);
  return plan;
}

}  // namespace ddp
