// DeviceZero: ZeRO's memory, update, gathers and host copies on the GPU.
#include "engine/zero/zero_device.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "dist/gradient_ring.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

namespace {

// The stream waits for `work` (a gather), which is then forgotten.
void wait_for(std::unique_ptr<Work>* work, cudaStream_t stream) {
  if (*work) (*work)->then_on(stream);
  work->reset();
}

}  // namespace

DeviceZero::DeviceZero(Reducer& ddp, const RingLayout& layout, DeviceParameters& weights,
                       const std::vector<std::pair<size_t, size_t>>& layers,
                       const std::vector<int>& stage_layers, int ahead, Communicator* gathers,
                       cudaStream_t stream, bool lead)
    : weights_(weights), stream_(stream) {
  const int level = layout.zero;
  cudaStream_t s = stream;
  MemoryPort& memory = memory_;
  memory.allocate = [](size_t bytes) -> std::shared_ptr<void> {
    const auto buffer = std::make_shared<DeviceBuffer<float>>(
        (bytes + sizeof(float) - 1) / sizeof(float), MemoryCategory::kGradients);
    return std::shared_ptr<void>(buffer, buffer->data());
  };
  memory.copy = [s](void* dst, const void* src, size_t bytes) {
    DDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  };
  memory.clear = [s](void* dst, size_t bytes) {
    DDP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, s));
  };
  memory.stream = s;
  const GradientRing& ring = weights.ring();
  if (weights.ringed()) {
    // The ring's slots and the Reducer's buckets are cut from the stage's one BucketPlan.
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
    ring_.bucket_grads = [&weights](size_t bucket) { return weights.bucket_grads(bucket); };
  }
  // Level 3: the parameters become this rank's pieces (the padding zero), copied out of the
  // whole parameters, which the layers' slots then replace.
  ShardHome& home = *this;  // private: the state is the only one that reaches it
  state_ = std::make_unique<ShardedState>(ddp, level, home, gathers);
  ShardedBuckets& shards = state_->buckets();
  weights.resize_optimizer(state_->plan().shard_count);
  // The gathers' communicator (where apart) starts after the compute stream's work, too.
  shards.gather_comm().set_compute_stream(stream);
  const size_t param_count = weights.count();
  const auto mib = [](size_t floats) { return floats * sizeof(float) / 1048576.0; };
  if (level == 3) {
    // The parameters become this rank's pieces (a bucket a layer) and ahead + 1 gather slots;
    // every use of a layer's parameters gathers them into slot layer % (ahead + 1) on the
    // gathers' communicator's stream, the compute stream waiting for it, and the pass's
    // next `ahead` layers are gathered meanwhile into the others. What a slot holds is known
    // within a step (a layer used twice in a row is gathered once) and forgotten at each step's
    // start.
    const ShardPlan& plan = state_->plan();
    const std::vector<Bucket>& buckets = ddp.buckets();
    std::vector<ParamSpan> spans;
    for (const auto& [offset, count] : layers)
      spans.push_back({offset, count});
    bucket_of_layer_ = layer_buckets(buckets, spans);
    size_t slot = 0;
    for (size_t b = 0; b < buckets.size(); ++b)
      slot = std::max(slot, plan.parts[b].piece * static_cast<size_t>(plan.ranks));
    weights.place_layers(layers, slot, ahead + 1);
    gathering_.resize(layers.size());
    gathers_ = std::make_unique<LayerGathers>(static_cast<int>(layers.size()), ahead);
    for (size_t s = 0; s < stage_layers.size(); ++s)
      stage_of_layer_.insert(stage_of_layer_.end(), static_cast<size_t>(stage_layers[s]),
                             static_cast<int>(s));
    DDP_CHECK(stage_of_layer_.size() == layers.size(), "--zero 3: {} layers in stages of {}",
              layers.size(), stage_of_layer_.size());
    if (lead)
      spdlog::info(
          "zero 3: this rank holds its {:.1f} MiB of the {:.1f} MiB of parameters and {} "
          "gather slots of {:.1f} MiB (a layer's, gathered for each use, the next {} "
          "meanwhile{})",
          mib(plan.shard_count), mib(param_count), ahead == 1 ? "two" : std::to_string(ahead + 1),
          mib(slot), ahead == 1 ? std::string("one") : fmt::format("{}", ahead),
          &shards.gather_comm() != &ddp.comm()
              ? fmt::format(", on {}, a communicator of their own", shards.gather_comm().name())
              : std::string());
  }
  if (level < 2 || !lead) return;
  if (weights.ringed())
    spdlog::info(
        "zero {}: the gradients in {} bucket slots of {:.1f} MiB and this rank's averaged "
        "pieces ({:.1f} MiB), not one buffer of {:.1f} MiB",
        level, ring.slots, mib(ring.slot_floats), mib(state_->plan().shard_count),
        mib(param_count));
  else
    spdlog::info(
        "zero {}: the whole gradient buffer stays, backward's workspace ({}); the buckets are "
        "reduce-scattered in place",
        level,
        layout.micro_batches > 1 ? "it accumulates over micro-batches"
        : !layout.overlap        ? "--no-overlap"
                                 : "a ring of bucket slots would hold as much");
}

void DeviceZero::wait() {
  if (wait_)
    wait_();
  else
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void DeviceZero::use_layer(int layer, int next) {
  std::vector<int> ahead;  // the pass's next layers in the layer's stage, nearest first
  const int step = next - layer;
  const int layers = static_cast<int>(stage_of_layer_.size());
  for (int n = next; next >= 0 && static_cast<int>(ahead.size()) < gathers_->ahead() && n >= 0 &&
                     n < layers && stage_of_layer_[n] == stage_of_layer_[layer];
       n += step)
    ahead.push_back(n);
  carry_out(gathers_->use(layer, ahead));
}

void DeviceZero::prefetch_layer(int layer) {
  carry_out(gathers_->prefetch(layer), /*scheduled=*/true);
}

void DeviceZero::release_layers(int first, int end) {
  carry_out(gathers_->release(first, end));
}

void DeviceZero::forget_gathers() {
  if (gathers_) carry_out(gathers_->forget());
}

void DeviceZero::match_evaluation(int64_t samples, int64_t replicas, int64_t mine, int chunk) {
  if (level() < 3) return;  // the whole parameters are in place: nothing to gather
  int64_t most = 0;
  for (int64_t r = 0; r < replicas; ++r) {
    const int64_t n = samples * (r + 1) / replicas - samples * r / replicas;
    most = std::max(most, (n + chunk - 1) / chunk);
  }
  if (most > mine) gather_as_forwards(most - mine);
}

void DeviceZero::gather_as_forwards(int64_t chunks) {
  const int layers = static_cast<int>(stage_of_layer_.size());
  for (int64_t k = 0; k < chunks; ++k)
    for (int i = 0; i < layers; ++i)  // each stage's layers in order, the next in its stage
      use_layer(i, i + 1 < layers && stage_of_layer_[i + 1] == stage_of_layer_[i] ? i + 1 : -1);
}

void DeviceZero::carry_out(const std::vector<LayerGathers::Action>& actions, bool scheduled) {
  for (const LayerGathers::Action& a : actions) {
    std::unique_ptr<Work>& work = gathering_[a.layer];
    if (a.kind == LayerGathers::Kind::kGather) {
      work = state_->buckets().gather_bucket_async(bucket_of_layer_[a.layer], state_->pieces(),
                                                   weights_.layer_slot(a.layer));
      if (on_gather_) on_gather_(a.layer, scheduled, *work);
      continue;
    }
    wait_for(&work, stream_);
    if (a.kind == LayerGathers::Kind::kUse)
      weights_.layer_to_low_precision(static_cast<size_t>(a.layer), stream_);
  }
}

void DeviceZero::step(const OptStep* steps, const int* counter) {
  float* pieces = state_->pieces();  // level 3: the pieces are the parameters
  for (const OptimizerPiece& p : state_->owned_pieces())
    if (pieces != nullptr)
      weights_.update_at(pieces + p.offset, p.grads, p.state_offset, p.count, steps, counter,
                         stream_);
    else
      weights_.update_piece(p.offset, p.grads, p.state_offset, p.count, steps, counter, stream_);
  state_->updated();
}

std::vector<float> DeviceZero::params(size_t count) {
  return state_->params(count);
}

void DeviceZero::set_params(const float* host) {
  state_->set_params(host);
}

NamedState DeviceZero::optimizer_state(size_t count) {
  std::vector<std::pair<std::string, const float*>> buffers;
  for (const auto& [name, pieces] : weights_.optimizer().buffers())
    buffers.emplace_back(name, pieces);
  return state_->optimizer_state(count, buffers);
}

void DeviceZero::set_optimizer_state(const NamedState& state) {
  weights_.set_optimizer_state(state_->pieces_of(state));
}

std::shared_ptr<void> DeviceZero::allocate(size_t bytes, bool pieces) {
  const auto memory = std::make_shared<DeviceBuffer<float>>(
      (bytes + sizeof(float) - 1) / sizeof(float),
      pieces ? MemoryCategory::kParameters : MemoryCategory::kOther);
  if (pieces) DDP_CUDA_CHECK(cudaMemsetAsync(memory->data(), 0, memory->bytes(), stream_));
  return std::shared_ptr<void>(memory, memory->data());
}

std::vector<float> DeviceZero::to_host(const float* src, size_t floats) {
  std::vector<float> host(floats);
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), src, floats * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  wait();
  return host;
}

void DeviceZero::from_host(float* dst, const float* host, size_t floats) {
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(dst, host, floats * sizeof(float), cudaMemcpyHostToDevice, stream_));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<float> DeviceZero::whole_params() {
  std::vector<float> host(weights_.count());
  weights_.get(host.data());
  return host;
}

std::string DeviceZero::describe_update(size_t count) const {
  return fmt::format("after backward, on this rank's {} of {} parameters", plan().owned(), count);
}

}  // namespace ddp
