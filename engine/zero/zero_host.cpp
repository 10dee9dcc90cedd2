// HostZero: ZeRO's ring, update, gathers and host copies on the CPU.
#include "engine/zero/zero_host.h"

#include <algorithm>
#include <cstring>

#include <spdlog/fmt/fmt.h>

#include "dist/gradient_ring.h"
#include "models/cpu_ops.h"
#include "runtime/error.h"

namespace ddp {

// --zero 3's parameters (models/linear_cpu.h, LayerParams): the rank holds its pieces of every
// layer (a bucket a layer: dist/zero.h); a layer's whole parameters are all-gathered over
// the data-parallel group for each use and dropped after; while materialised (evaluation, copies
// out) every layer's are gathered once and read from there. Every replica makes the same uses
// in the same order, so the gathers match.
class GatheredLayers final : public LayerParams {
 public:
  // `bucket_of`: the model layer's bucket of `state`, whose pieces are the parameters.
  GatheredLayers(ShardedState& state, std::map<int, size_t> bucket_of)
      : state_(state), bucket_of_(std::move(bucket_of)) {}

  const float* acquire(int layer) override {
    const size_t b = bucket_of_.at(layer);
    const ShardPlan& plan = state_.plan();
    if (materialised_) return whole_.data() + plan.parts[b].bucket_offset;
    std::vector<float>& into = held_[layer];
    DDP_CHECK(into.empty(), "--zero 3: layer {} gathered twice", layer);
    into.resize(plan.parts[b].piece * static_cast<size_t>(plan.ranks));
    state_.buckets().gather_bucket(b, state_.pieces(), into.data());
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
  void materialise(size_t count) {
    whole_ = state_.params(count);
    materialised_ = true;
  }
  void drop() {
    materialised_ = false;
    whole_ = {};
  }
  // The most floats of gathered layers held at once in training (materialising aside).
  size_t peak_floats() const { return peak_floats_; }

 private:
  ShardedState& state_;
  std::map<int, size_t> bucket_of_;
  std::map<int, std::vector<float>> held_;  // the layers in use
  size_t held_floats_ = 0, peak_floats_ = 0;
  bool materialised_ = false;
  std::vector<float> whole_;
};

HostZero::HostZero(Reducer& ddp, const RingLayout& layout, std::vector<float>& params,
                   std::vector<float>& grads, const std::vector<std::pair<int, ParamSpan>>& layers,
                   Communicator* gathers, const OptimizerConfig& optimizer)
    : HostState(nullptr), ddp_(ddp), params_(params), grads_(grads) {
  const int level = layout.zero;
  const size_t count = params.size();
  RingLayout ring = layout;
  ring.replicas = ddp.comm().size();
  const size_t slot = gradient_ring_applies(ring)
                          ? gradient_ring_slot(ddp.buckets(), ddp.comm().size(), 1, count)
                          : 0;
  if (slot > 0) {
    constexpr int kRing = kGradientRingSlots;
    ring_.assign(kRing, std::vector<float>(slot, 0.0f));
    ring_slots_.slots = kRing;
    ring_slots_.bucket_grads = [this](size_t bucket) { return ring_[bucket % kRing].data(); };
    ring_slots_.slot_floats = slot;
  }
  ShardHome& home = *this;  // private: the state is the only one that reaches it
  state_ = std::make_unique<ShardedState>(ddp, level, home, gathers);
  set_optimizer(make_optimizer(optimizer, state_->plan().shard_count));  // over the pieces
  if (ringed()) grads_ = {};  // backward writes into the slots; the whole buffer goes
  if (level < 3) return;
  // The parameters are this rank's pieces now, and every layer reads its whole parameters from
  // them for each use (GatheredLayers).
  std::vector<ParamSpan> spans;
  for (const auto& [layer, span] : layers)
    spans.push_back(span);
  const std::vector<size_t> bucket_of_span = layer_buckets(ddp.buckets(), spans);
  std::map<int, size_t> bucket_of;  // the model's layer -> its bucket
  for (size_t i = 0; i < layers.size(); ++i)
    bucket_of[layers[i].first] = bucket_of_span[i];
  gathered_ = std::make_unique<GatheredLayers>(*state_, std::move(bucket_of));
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
  return level() >= 2 &&
         any_nonfinite(state_->buckets().reduced_pieces(), state_->plan().shard_count);
}

void HostZero::step(float lr) {
  Optimizer& optimizer = *optimizer_;
  if (state_->pieces() != nullptr) {
    // Level 3: the pieces are the parameters, updated from their averaged gradients (the
    // padding stays zero).
    optimizer.step(state_->pieces(), state_->buckets().reduced_pieces(), state_->piece_floats(),
                   lr);
  } else {
    // Else this rank's pieces of the whole parameters, updated in place.
    optimizer.step_pieces(params_.data(), state_->owned_pieces(), lr);
  }
  state_->updated();
}

std::vector<float> HostZero::params(size_t count) {
  return state_->params(count);
}

void HostZero::set_params(const float* host) {
  state_->set_params(host);
}

NamedState HostZero::optimizer_state(size_t count) {
  std::vector<std::pair<std::string, const float*>> buffers;
  for (const auto& [name, buffer] : optimizer_->state())
    buffers.emplace_back(name, buffer->data());
  return state_->optimizer_state(count, buffers);
}

void HostZero::set_optimizer_state(const NamedState& state) {
  const NamedState mine = state_->pieces_of(state);
  for (auto& [name, buffer] : optimizer_->state())
    for (const auto& [saved_name, values] : mine)
      if (saved_name == name) *buffer = values;
}

std::shared_ptr<void> HostZero::allocate(size_t bytes, bool pieces) {
  (void)pieces;  // zero either way
  const auto memory =
      std::make_shared<std::vector<float>>((bytes + sizeof(float) - 1) / sizeof(float), 0.0f);
  return std::shared_ptr<void>(memory, memory->data());
}

std::vector<float> HostZero::to_host(const float* src, size_t floats) {
  return std::vector<float>(src, src + floats);
}

void HostZero::from_host(float* dst, const float* host, size_t floats) {
  std::copy_n(host, floats, dst);
}

void HostZero::set_whole_params(const float* host) {
  std::copy_n(host, params_.size(), params_.begin());
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
                              size(state_->piece_floats()), size(gathered_->peak_floats()))
                : size(count),
      ring_.empty() ? size(count)
                    : fmt::format("{} ({} bucket slots, written again after each bucket's "
                                  "reduce-scatter)",
                                  size(ring_floats()), ring_.size()),
      size(state_floats), level(), plan().ranks, plan().owned(), count,
      size(state_->buckets().scratch_bytes() / sizeof(float)),
      level() >= 2 ? ", the averaged gradients as this rank's pieces only" : "");
}

size_t HostZero::param_floats() const {
  return state_->piece_floats() + (gathered_ ? gathered_->peak_floats() : 0);
}

size_t HostZero::grad_floats() const {
  return ring_floats() + state_->buckets().scratch_bytes() / sizeof(float);
}

}  // namespace ddp
