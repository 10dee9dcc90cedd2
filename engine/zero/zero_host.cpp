// HostZero: ZeRO's ring, update, gathers and host copies on the CPU.
#include "engine/zero/zero_host.h"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

#include "engine/sync/gradient_ring.h"
#include "models/cpu_ops.h"
#include "runtime/error.h"

namespace ddp {

// --zero 3's parameters (models/linear_cpu.h, LayerParams): the rank holds its pieces of every
// layer (a bucket a layer: engine/sync/zero.h); a layer's whole parameters are all-gathered over
// the data-parallel group for each use and dropped after; while materialised (evaluation, copies
// out) every layer's are gathered once and read from there. Every replica makes the same uses
// in the same order, so the gathers match.
class GatheredLayers final : public LayerParams {
 public:
  // `bucket_of`: the model layer's bucket; `shard`: the rank's pieces (of `shards`' plan).
  GatheredLayers(ShardedBuckets& shards, const std::vector<float>& shard,
                 std::map<int, size_t> bucket_of)
      : shards_(shards), shard_(shard), bucket_of_(std::move(bucket_of)) {}

  const float* acquire(int layer) override {
    const size_t b = bucket_of_.at(layer);
    if (materialised_) return whole_.data() + shards_.plan().parts[b].bucket_offset;
    std::vector<float>& into = held_[layer];
    DDP_CHECK(into.empty(), "--zero 3: layer {} gathered twice", layer);
    into.resize(shards_.plan().parts[b].piece * static_cast<size_t>(shards_.plan().ranks));
    shards_.gather_bucket(b, shard_.data(), into.data());
    held_floats_ += into.size();
    peak_floats_ = std::max(peak_floats_, held_floats_);
    return into.data();
  }
  void release(int layer) override {
    if (materialised_) return;
    const auto it = held_.find(layer);
    DDP_CHECK(it != held_.end(), "--zero 3: layer {} released but not gathered", layer);
    held_floats_ -= it->second.size();
    held_.erase(it);
  }
  // Collective: every layer's parameters (`count`, the rank's flat layout), until drop().
  const std::vector<float>& materialise(size_t count) {
    whole_.assign(count, 0.0f);
    shards_.gather_shards(shard_.data(), whole_.data());
    materialised_ = true;
    return whole_;
  }
  void drop() {
    materialised_ = false;
    whole_ = {};
  }
  // The most floats of gathered layers held at once in training (materialising aside).
  size_t peak_floats() const { return peak_floats_; }

 private:
  ShardedBuckets& shards_;
  const std::vector<float>& shard_;
  std::map<int, size_t> bucket_of_;
  std::map<int, std::vector<float>> held_;  // the layers in use
  size_t held_floats_ = 0, peak_floats_ = 0;
  bool materialised_ = false;
  std::vector<float> whole_;
};

HostZero::HostZero(Ddp& ddp, const RingLayout& layout, std::vector<float>& params,
                   std::vector<float>& grads, const std::vector<std::pair<int, ParamSpan>>& layers,
                   Communicator* gathers, const OptimizerConfig& optimizer)
    : HostState(nullptr), ddp_(ddp), level_(layout.zero), params_(params), grads_(grads) {
  const int level = level_;
  const size_t count = params.size();
  RingLayout ring = layout;
  ring.replicas = ddp.comm().size();
  const size_t slot = gradient_ring_applies(ring)
                          ? gradient_ring_slot(ddp.buckets(), ddp.comm().size(), 1, count)
                          : 0;
  if (slot > 0) {
    constexpr int kRing = kGradientRingSlots;
    ring_.assign(kRing, std::vector<float>(slot, 0.0f));
    ring_memory_.allocate = [this](size_t floats) {
      ring_pieces_.emplace_back(floats, 0.0f);
      return ring_pieces_.back().data();
    };
    ring_memory_.copy = [](float* dst, const float* src, size_t floats) {
      std::copy_n(src, floats, dst);
    };
    ring_memory_.zero = [](float* dst, size_t floats) { std::fill_n(dst, floats, 0.0f); };
    ring_memory_.ring_slots = kRing;
    ring_memory_.bucket_grads = [this](size_t bucket) { return ring_[bucket % kRing].data(); };
    ring_memory_.slot_floats = slot;
    ring_memory_.align = 1;
  }
  shards_ = std::make_unique<ShardedBuckets>(ddp, level, ringed() ? &ring_memory_ : nullptr);
  shards_->set_gather_comm(gathers);
  set_optimizer(make_optimizer(optimizer, shards_->plan().shard_count));  // over the pieces
  if (ringed()) grads_ = {};  // backward writes into the slots; the whole buffer goes
  if (level < 3) return;
  // The parameters become this rank's pieces, and every layer reads its whole parameters from
  // them for each use (GatheredLayers).
  shard_params_.assign(shards_->plan().shard_count, 0.0f);
  shards_->take_shard(params.data(), shard_params_.data());
  std::vector<ParamSpan> spans;
  for (const auto& [layer, span] : layers)
    spans.push_back(span);
  const std::vector<size_t> bucket_of_span = layer_buckets(ddp.buckets(), spans);
  std::map<int, size_t> bucket_of;  // the model's layer -> its bucket
  for (size_t i = 0; i < layers.size(); ++i)
    bucket_of[layers[i].first] = bucket_of_span[i];
  gathered_ = std::make_unique<GatheredLayers>(*shards_, shard_params_, std::move(bucket_of));
  params_ = {};  // every layer reads its whole parameters from the pieces for each use
}

HostZero::~HostZero() = default;

float* HostZero::grad_at(size_t offset) {
  const std::vector<Bucket>& buckets = ddp_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b)
    if (offset >= buckets[b].offset && offset < buckets[b].offset + buckets[b].count)
      return ring_[b % ring_.size()].data() + (offset - buckets[b].offset);
  DDP_CHECK(false, "gradient ring: element {} is in no bucket", offset);
  return nullptr;
}

std::function<float*(size_t)> HostZero::gradient_home() {
  if (!ringed()) return {};
  return [this](size_t offset) { return grad_at(offset); };
}

LayerParams* HostZero::layer_params() {
  return gathered_.get();
}

bool HostZero::kept_grads_nonfinite() const {
  return level_ >= 2 && any_nonfinite(shards_->reduced_pieces(), shards_->plan().shard_count);
}

void HostZero::step(float lr) {
  Optimizer& optimizer = *optimizer_;
  float* params = params_.data();
  // Level 3: the pieces are the parameters, updated from their averaged gradients (the
  // padding stays zero); the next uses gather them.
  if (gathered_) {
    optimizer.step(shard_params_.data(), shards_->reduced_pieces(), shard_params_.size(), lr);
    return;
  }
  // Else this rank's pieces updated in place from their averaged gradients, then every
  // rank's pieces gathered into the whole parameters.
  std::vector<OptimizerPiece> pieces;
  const ShardPlan& plan = shards_->plan();
  for (size_t b = 0; b < plan.parts.size(); ++b)
    if (plan.parts[b].count > 0)
      pieces.push_back({plan.parts[b].offset, shards_->reduced_piece(b), plan.parts[b].shard_at,
                        plan.parts[b].count});
  optimizer.step_pieces(params, pieces, lr);
  shards_->gather_in_place(params, nullptr);
}

std::vector<float> HostZero::params(size_t count) {
  if (gathered_ == nullptr) return params_;  // whole on every replica
  std::vector<float> whole = gathered_->materialise(count);
  gathered_->drop();
  return whole;
}

void HostZero::set_params(const float* host) {
  if (gathered_ == nullptr) return (void)std::copy_n(host, params_.size(), params_.begin());
  shards_->take_shard(host, shard_params_.data());
}

NamedState HostZero::optimizer_state(size_t count) {
  NamedState state;
  for (const auto& [name, buffer] : optimizer_->state()) {
    // Every rank's pieces of it, gathered (collective over the data-parallel group).
    state.emplace_back(name, std::vector<float>(count));
    shards_->gather_shards(buffer->data(), state.back().second.data());
  }
  return state;
}

void HostZero::set_optimizer_state(const NamedState& state) {
  for (auto& [name, buffer] : optimizer_->state())
    for (const auto& [saved_name, values] : state)
      if (saved_name == name) shards_->take_shard(values.data(), buffer->data());
}

void HostZero::begin_evaluation(size_t count) {
  if (gathered_) gathered_->materialise(count);
}

void HostZero::end_evaluation() {
  if (gathered_) gathered_->drop();
}

std::string HostZero::memory_report(size_t count,
                                    const std::function<std::string(size_t)>& size) const {
  const size_t state_floats = optimizer_->state_floats();
  return fmt::format(
      "parameters {}, gradients {}, optimizer state {} (--zero {}: this rank's 1/{} of it, {} of "
      "{} parameters; {} of padded bucket copies and averaged pieces{})",
      gathered_ ? fmt::format("{} (this rank's pieces; at most {} of layers gathered at once, "
                              "the whole model while evaluating or copying out)",
                              size(shard_params_.size()), size(gathered_->peak_floats()))
                : size(count),
      ring_.empty() ? size(count)
                    : fmt::format("{} ({} bucket slots, written again after each bucket's "
                                  "reduce-scatter)",
                                  size(ring_floats()), ring_.size()),
      size(state_floats), level_, shards_->plan().ranks, shards_->plan().owned(), count,
      size(shards_->scratch_floats()),
      level_ >= 2 ? ", the averaged gradients as this rank's pieces only" : "");
}

size_t HostZero::param_floats() const {
  return shard_params_.size() + (gathered_ ? gathered_->peak_floats() : 0);
}

size_t HostZero::grad_floats() const {
  return ring_floats() + shards_->scratch_floats();
}

}  // namespace ddp
