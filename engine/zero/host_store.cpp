// HostParamStore: the CPU's flat buffers, optimizer and slots, and the state over them.
#include "engine/zero/host_store.h"

#include <algorithm>
#include <map>

#include <spdlog/fmt/fmt.h>

#include "dist/gradient_ring.h"
#include "models/cpu_ops.h"
#include "runtime/error.h"

namespace ddp {

// Level 3's parameters as the CPU's layers read them (models/linear_cpu.h): a layer's use has
// the state gather it into the slot (or find it there), and reads it there at once. Every
// replica makes the same uses in the same order, so the gathers match.
class HostParamStore::SlotParams final : public LayerParams {
 public:
  // `index`: the model's layer -> the rank's.
  SlotParams(HostParamStore& store, std::map<int, int> index)
      : store_(store), index_(std::move(index)) {}

  const float* acquire(int layer) override {
    const int mine = index_.at(layer);
    store_.state_.use_layer(mine, -1);
    return store_.layer_slot(mine);
  }
  void release(int layer) override { (void)layer; }  // the slot is the next use's to gather into

 private:
  HostParamStore& store_;
  std::map<int, int> index_;
};

HostParamStore::HostParamStore(HostStoreLayout layout)
    : layout_(std::move(layout)),
      params_(layout_.count),
      grads_(layout_.count),
      optimizer_(make_optimizer(layout_.optimizer, layout_.count)) {}

HostParamStore::~HostParamStore() = default;

void HostParamStore::join(Reducer& ddp, uint64_t fingerprint, const std::string& description) {
  ddp.check_same_layout(fingerprint, description);
  if (!layout_.bf16_grads) return;
  bf16_wire_.assign(layout_.count, 0);
  ddp.reduce_in_bf16(bf16_wire_.data());
}

std::vector<ParamSpan> HostParamStore::layer_spans() const {
  std::vector<ParamSpan> spans;
  for (const auto& [layer, span] : layout_.layers)
    spans.push_back(span);
  return spans;
}

void HostParamStore::begin_sharding(Reducer& ddp, int level) {
  RingLayout ring;
  ring.zero = level;
  ring.overlap = layout_.plan.overlap;
  ring.stages_on_rank = layout_.stages_on_rank;
  ring.micro_batches = layout_.micro_batches;
  ring.replicas = ddp.comm().size();
  buckets_ = &ddp.buckets();
  const size_t slot = gradient_ring_applies(ring)
                          ? gradient_ring_slot(ddp.buckets(), ddp.comm().size(), 1, layout_.count)
                          : 0;
  if (slot == 0) return;
  constexpr int kRing = kGradientRingSlots;
  ring_.assign(kRing, std::vector<float>(slot, 0.0f));
  ring_slots_.slots = kRing;
  ring_slots_.bucket_grads = [this](size_t bucket) { return ring_[bucket % kRing].data(); };
  ring_slots_.slot_floats = slot;
}

void HostParamStore::sharded(ReplicaState& state) {
  if (ringed()) grads_ = {};  // backward writes into the slots; the whole buffer goes
  if (state.gathers_layers()) {
    // The parameters are this rank's pieces now, and every layer reads its whole parameters
    // from its slot, gathered for each use.
    std::map<int, int> index;
    for (size_t i = 0; i < layout_.layers.size(); ++i)
      index[layout_.layers[i].first] = static_cast<int>(i);
    slot_params_ = std::make_unique<SlotParams>(*this, std::move(index));
    params_ = {};
  }
  if (!rewire_) return;
  std::function<float*(size_t)> grads;
  if (ringed()) grads = [this](size_t offset) { return grad_at(offset); };
  rewire_(grads, slot_params_.get());
}

float* HostParamStore::grad_at(size_t offset) {
  const std::vector<Bucket>& buckets = *buckets_;
  for (size_t b = 0; b < buckets.size(); ++b)
    if (offset >= buckets[b].offset && offset < buckets[b].offset + buckets[b].count)
      return ring_[b % ring_.size()].data() + (offset - buckets[b].offset);
  DDP_CHECK(false, "gradient ring: element {} is in no bucket", offset);
  return nullptr;
}

void HostParamStore::size_optimizer(size_t floats) {
  optimizer_ = make_optimizer(layout_.optimizer, floats);
}

void HostParamStore::update_whole() {
  optimizer_->step(params_.data(), grads_.data(), params_.size(), lr_);
}

void HostParamStore::update_pieces(float* params, const std::vector<OptimizerPiece>& pieces) {
  optimizer_->step_pieces(params != nullptr ? params : params_.data(), pieces, lr_);
}

std::vector<std::pair<std::string, const float*>> HostParamStore::optimizer_buffers() {
  std::vector<std::pair<std::string, const float*>> buffers;
  for (const auto& [name, buffer] : optimizer_->state())
    buffers.emplace_back(name, buffer->data());
  return buffers;
}

NamedState HostParamStore::optimizer_state() {
  NamedState state;
  for (const auto& [name, buffer] : optimizer_->state())
    state.emplace_back(name, *buffer);
  return state;
}

void HostParamStore::set_optimizer_state(const NamedState& state) {
  for (auto& [name, buffer] : optimizer_->state())
    for (const auto& [saved_name, values] : state)
      if (saved_name == name) *buffer = values;
}

void HostParamStore::place_layers(size_t slot_floats, int slots) {
  slots_.assign(static_cast<size_t>(slots), std::vector<float>(slot_floats, 0.0f));
}

float* HostParamStore::layer_slot(int layer) {
  return slots_[static_cast<size_t>(layer) % slots_.size()].data();
}

std::shared_ptr<void> HostParamStore::allocate(size_t bytes, bool pieces) {
  (void)pieces;  // zero either way
  const auto memory =
      std::make_shared<std::vector<float>>((bytes + sizeof(float) - 1) / sizeof(float), 0.0f);
  return std::shared_ptr<void>(memory, memory->data());
}

std::vector<float> HostParamStore::to_host(const float* src, size_t floats) {
  return std::vector<float>(src, src + floats);
}

void HostParamStore::from_host(float* dst, const float* host, size_t floats) {
  std::copy_n(host, floats, dst);
}

void HostParamStore::set_whole_params(const float* host) {
  std::copy_n(host, params_.size(), params_.begin());
}

bool HostParamStore::kept_grads_nonfinite() const {
  const ReplicaState& state = state_;
  return state.level() >= 2 &&
         any_nonfinite(state.pieces().buckets().reduced_pieces(), state.plan().shard_count);
}

std::string HostParamStore::memory_report(const std::function<std::string(size_t)>& size) const {
  const size_t count = layout_.count;
  const std::string whole =
      fmt::format("parameters {}, gradients {}, optimizer state {}", size(params_.size()),
                  size(grads_.size()), size(optimizer_->state_floats()));
  if (!state_.sharded()) return whole;
  const ReplicaState& state = state_;
  const int level = state.level();
  return fmt::format(
      "parameters {}, gradients {}, optimizer state {} (--zero {}: this rank's 1/{} of it, {} of "
      "{} parameters; {} of padded bucket copies and averaged pieces{})",
      state.gathers_layers()
          ? fmt::format("{} (this rank's pieces; {} gather slot{} of {}, a layer's, gathered for "
                        "each use)",
                        size(state.pieces().piece_floats()), state.slots(),
                        state.slots() == 1 ? "" : "s", size(state.slot_floats()))
          : size(count),
      ring_.empty() ? size(count)
                    : fmt::format("{} ({} bucket slots, written again after each bucket's "
                                  "reduce-scatter)",
                                  size(ring_floats()), ring_.size()),
      size(optimizer_->state_floats()), level, state.plan().ranks, state.plan().owned(), count,
      size(state.pieces().buckets().scratch_bytes() / sizeof(float)),
      level >= 2 ? ", the averaged gradients as this rank's pieces only" : "");
}

size_t HostParamStore::param_floats() const {
  return state_.sharded() ? state_.pieces().piece_floats() + slot_floats() : 0;
}

size_t HostParamStore::grad_floats() const {
  return state_.sharded()
             ? ring_floats() + state_.pieces().buckets().scratch_bytes() / sizeof(float)
             : 0;
}

}  // namespace ddp
