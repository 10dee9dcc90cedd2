// DeviceParamStore: the GPU's flat buffers, update kernels and memory, and the state over them.
#include "engine/zero/device_store.h"

#include <spdlog/spdlog.h>

#include "dist/ddp_device.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

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
                                   cudaStream_t stream, Update update)
    : layout_(std::move(layout)), weights_(weights), stream_(stream), update_(std::move(update)) {
  cudaStream_t s = stream;
  memory_.allocate = [](size_t bytes) -> std::shared_ptr<void> {
    const auto buffer = std::make_shared<DeviceBuffer<float>>(
        (bytes + sizeof(float) - 1) / sizeof(float), MemoryCategory::kGradients);
    return std::shared_ptr<void>(buffer, buffer->data());
  };
  memory_.copy = [s](void* dst, const void* src, size_t bytes) {
    DDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  };
  memory_.clear = [s](void* dst, size_t bytes) {
    DDP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, s));
  };
  memory_.stream = s;
}

DeviceParamStore::~DeviceParamStore() = default;

void DeviceParamStore::join(Reducer& ddp, uint64_t fingerprint, const std::string& description) {
  ddp_ = &ddp;
  // --nccl-symmetric: the gradients were allocated in NCCL's window memory (where replicas
  // reduce them); the wire copy is too, and both are registered as windows (collective).
  const DeviceAllocator* window = weights_.grads_memory();
  bf16_wire_ = prepare_device_ddp(ddp, stream_, fingerprint, description, layout_.sync.bf16_grads,
                                  layout_.count, window);
  if (window != nullptr) {
    windows_.push_back(
        ddp.comm().register_window(weights_.grads(), weights_.count() * sizeof(float)));
    if (bf16_wire_.count() > 0)
      windows_.push_back(ddp.comm().register_window(bf16_wire_.data(), bf16_wire_.bytes()));
  }
  if (lead_ && announce_)
    spdlog::info(
        "data parallel over {} GPUs ({}): {} buckets, overlap {}, gradients reduced in {}{}",
        ddp.comm().size(), ddp.comm().backend(), ddp.buckets().size(),
        layout_.plan.overlap ? "on" : "off", layout_.sync.bf16_grads ? "bf16" : "fp32",
        window == nullptr ? ""
                          : fmt::format(" from NCCL symmetric windows ({:.1f} MiB{})",
                                        weights_.count() * sizeof(float) / 1048576.0,
                                        bf16_wire_.count() > 0 ? " and the bf16 copy" : ""));
}

std::vector<ParamSpan> DeviceParamStore::layer_spans() const {
  std::vector<ParamSpan> spans;
  for (const auto& [offset, count] : layout_.layers)
    spans.push_back({offset, count});
  return spans;
}

void DeviceParamStore::begin_sharding(Reducer& ddp, int level) {
  (void)level;  // the ring was made with the buffers (device_gradient_ring), where it applies
  if (!weights_.ringed()) return;
  // The ring's slots and the Reducer's buckets are cut from the stage's one BucketPlan.
  const GradientRing& ring = weights_.ring();
  DDP_CHECK(ring.buckets.size() == ddp.buckets().size(),
            "gradient ring: {} buckets where the Reducer has {}", ring.buckets.size(),
            ddp.buckets().size());
  for (size_t b = 0; b < ring.buckets.size(); ++b)
    DDP_CHECK(ring.buckets[b].first == ddp.buckets()[b].offset &&
                  ring.buckets[b].second == ddp.buckets()[b].count,
              "gradient ring: bucket {} is {}+{} where the Reducer's is {}+{}", b,
              ring.buckets[b].first, ring.buckets[b].second, ddp.buckets()[b].offset,
              ddp.buckets()[b].count);
  ring_.slots = ring.slots;
  ring_.slot_floats = ring.slot_floats;
  DeviceParameters& weights = weights_;
  ring_.bucket_grads = [&weights](size_t bucket) { return weights.bucket_grads(bucket); };
}

void DeviceParamStore::sharded(ReplicaState& state) {
  if (lead_) {
    const ShardPlan& plan = state.plan();
    const auto mib = [](size_t floats) { return floats * sizeof(float) / 1048576.0; };
    const int level = state.level();
    if (state.gathers_layers()) {
      const int ahead = state.slots() - 1;
      const Communicator& gathers = state.pieces().buckets().gather_comm();
      spdlog::info(
          "zero 3: this rank holds its {:.1f} MiB of the {:.1f} MiB of parameters and {} "
          "gather slots of {:.1f} MiB (a layer's, gathered for each use, the next {} "
          "meanwhile{})",
          mib(plan.shard_count), mib(layout_.count), ahead == 1 ? "two" : std::to_string(ahead + 1),
          mib(state.slot_floats()), ahead == 1 ? std::string("one") : fmt::format("{}", ahead),
          ddp_ != nullptr && &gathers != &ddp_->comm()
              ? fmt::format(", on {}, a communicator of their own", gathers.name())
              : std::string());
    }
    if (level >= 2) {
      if (weights_.ringed())
        spdlog::info(
            "zero {}: the gradients in {} bucket slots of {:.1f} MiB and this rank's averaged "
            "pieces ({:.1f} MiB), not one buffer of {:.1f} MiB",
            level, ring_.slots, mib(ring_.slot_floats), mib(plan.shard_count), mib(layout_.count));
      else
        spdlog::info(
            "zero {}: the whole gradient buffer stays, backward's workspace ({}); the buckets "
            "are reduce-scattered in place",
            level,
            layout_.ring.micro_batches > 1 ? "it accumulates over micro-batches"
            : !layout_.ring.overlap        ? "--no-overlap"
                                           : "a ring of bucket slots would hold as much");
    }
  }
  if (rewire_) rewire_(state);
}

void DeviceParamStore::update_pieces(float* params, const std::vector<OptimizerPiece>& pieces) {
  for (const OptimizerPiece& p : pieces)
    if (params != nullptr)  // level 3: the pieces are the parameters
      weights_.update_at(params + p.offset, p.grads, p.state_offset, p.count, steps_, counter_,
                         stream_);
    else
      weights_.update_piece(p.offset, p.grads, p.state_offset, p.count, steps_, counter_, stream_);
}

std::vector<std::pair<std::string, const float*>> DeviceParamStore::optimizer_buffers() {
  std::vector<std::pair<std::string, const float*>> buffers;
  for (const auto& [name, pieces] : weights_.optimizer().buffers())
    buffers.emplace_back(name, pieces);
  return buffers;
}

void DeviceParamStore::wait() {
  if (wait_)
    wait_();
  else
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::shared_ptr<void> DeviceParamStore::allocate(size_t bytes, bool pieces) {
  const auto memory = std::make_shared<DeviceBuffer<float>>(
      (bytes + sizeof(float) - 1) / sizeof(float),
      pieces ? MemoryCategory::kParameters : MemoryCategory::kOther);
  if (pieces) DDP_CUDA_CHECK(cudaMemsetAsync(memory->data(), 0, memory->bytes(), stream_));
  return std::shared_ptr<void>(memory, memory->data());
}

std::vector<float> DeviceParamStore::to_host(const float* src, size_t floats) {
  std::vector<float> host(floats);
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), src, floats * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  wait();
  return host;
}

void DeviceParamStore::from_host(float* dst, const float* host, size_t floats) {
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(dst, host, floats * sizeof(float), cudaMemcpyHostToDevice, stream_));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<float> DeviceParamStore::whole_params() {
  std::vector<float> host(weights_.count());
  weights_.get(host.data());
  return host;
}

}  // namespace ddp
