// ReplicaState: a replica's state, whole or sharded, and level 3's layer gathers over its store.
#include "dist/replica_state.h"

#include <algorithm>

#include <spdlog/fmt/fmt.h>

#include "dist/gradient_ring.h"
#include "runtime/error.h"

namespace ddp {

const ShardPlan& ReplicaStore::shard(Reducer& ddp, int level, Communicator* gathers) {
  return state().shard(ddp, level, gathers);
}

const ShardPlan& ReplicaState::shard(Reducer& ddp, int level, Communicator* gathers) {
  DDP_CHECK(!sharded_, "--zero {}: the state is sharded already (level {})", level, this->level());
  store_.begin_sharding(ddp, level);
  // Level 3: the parameters become this rank's pieces (the padding zero), copied out of the
  // whole parameters, which the layers' slots then replace.
  sharded_ = std::make_unique<ShardedState>(ddp, level, store_, gathers);
  const ShardPlan& plan = sharded_->plan();
  store_.size_optimizer(plan.shard_count);  // over this rank's pieces
  // The gathers' communicator (where apart) starts after the compute stream's work, too.
  if (store_.stream() != nullptr)
    sharded_->buckets().gather_comm().set_compute_stream(store_.stream());
  if (level == 3) {
    // The parameters are this rank's pieces (a bucket a layer) and ahead + 1 gather slots;
    // every use of a layer's parameters gathers them into slot layer % (ahead + 1) (on the
    // gathers' communicator; the compute stream, or the host, waiting for it), and the pass's
    // next `ahead` layers are gathered meanwhile into the others. What a slot holds is known
    // within a step (a layer used twice in a row is gathered once) and forgotten at each
    // step's start.
    const std::vector<Bucket>& buckets = ddp.buckets();
    const std::vector<ParamSpan> layers = store_.layer_spans();
    bucket_of_layer_ = layer_buckets(buckets, layers);
    for (size_t b = 0; b < buckets.size(); ++b)
      slot_floats_ = std::max(slot_floats_, plan.parts[b].piece * static_cast<size_t>(plan.ranks));
    const int ahead = store_.gather_ahead();
    store_.place_layers(slot_floats_, ahead + 1);
    gathering_.resize(layers.size());
    gathers_ = std::make_unique<LayerGathers>(static_cast<int>(layers.size()), ahead);
    const std::vector<int> stage_layers = store_.stage_layers();
    for (size_t s = 0; s < stage_layers.size(); ++s)
      stage_of_layer_.insert(stage_of_layer_.end(), static_cast<size_t>(stage_layers[s]),
                             static_cast<int>(s));
    DDP_CHECK(stage_of_layer_.size() == layers.size(), "--zero 3: {} layers in stages of {}",
              layers.size(), stage_of_layer_.size());
  }
  store_.sharded(*this);
  return plan;
}

void ReplicaState::step() {
  // Level 3: a gather still reading the pieces (a prefetch nobody used) is done before the
  // update writes them, and what the slots hold is stale after it.
  forget_gathers();
  if (!sharded_) return store_.update_whole();
  store_.update_pieces(sharded_->pieces(), sharded_->owned_pieces());
  sharded_->updated();
}

std::string ReplicaState::describe_update(size_t count) const {
  if (!sharded_) return "after backward";
  return fmt::format("after backward, on this rank's {} of {} parameters", plan().owned(), count);
}

void ReplicaState::use_layer(int layer, int next) {
  std::vector<int> ahead;  // the pass's next layers in the layer's stage, nearest first
  const int step = next - layer;
  const int layers = static_cast<int>(stage_of_layer_.size());
  for (int n = next; next >= 0 && static_cast<int>(ahead.size()) < gathers_->ahead() && n >= 0 &&
                     n < layers && stage_of_layer_[n] == stage_of_layer_[layer];
       n += step)
    ahead.push_back(n);
  carry_out(gathers_->use(layer, ahead));
}

void ReplicaState::prefetch_layer(int layer) {
  carry_out(gathers_->prefetch(layer), /*scheduled=*/true);
}

void ReplicaState::release_layers(int first, int end) {
  carry_out(gathers_->release(first, end));
}

void ReplicaState::forget_gathers() {
  if (gathers_) carry_out(gathers_->forget());
}

void ReplicaState::match_evaluation(int64_t samples, int64_t mine, int chunk) {
  if (!gathers_) return;  // the whole parameters are in place: nothing to gather
  const int64_t replicas = plan().ranks;
  int64_t most = 0;
  for (int64_t r = 0; r < replicas; ++r) {
    const int64_t n = samples * (r + 1) / replicas - samples * r / replicas;
    most = std::max(most, (n + chunk - 1) / chunk);
  }
  if (most > mine) gather_as_forwards(most - mine);
  forget_gathers();
}

void ReplicaState::gather_as_forwards(int64_t chunks) {
  const int layers = static_cast<int>(stage_of_layer_.size());
  for (int64_t k = 0; k < chunks; ++k)
    for (int i = 0; i < layers; ++i)  // each stage's layers in order, the next in its stage
      use_layer(i, i + 1 < layers && stage_of_layer_[i + 1] == stage_of_layer_[i] ? i + 1 : -1);
}

void ReplicaState::carry_out(const std::vector<LayerGathers::Action>& actions, bool scheduled) {
  ShardedBuckets& buckets = sharded_->buckets();
  void* stream = store_.stream();
  for (const LayerGathers::Action& a : actions) {
    std::unique_ptr<Work>& work = gathering_[a.layer];
    if (a.kind == LayerGathers::Kind::kGather) {
      work = buckets.gather_bucket_async(bucket_of_layer_[a.layer], sharded_->pieces(),
                                         store_.layer_slot(a.layer));
      if (on_gather_) on_gather_(a.layer, scheduled, *work);
      continue;
    }
    // The stream (the host, without one) waits for the gather, which is then forgotten.
    if (work) {
      if (stream != nullptr)
        work->then_on(stream);
      else
        work->wait(buckets.gather_comm().timeout());
      work.reset();
    }
    if (a.kind == LayerGathers::Kind::kUse) store_.layer_used(a.layer);
  }
}

std::vector<float> ReplicaState::params(size_t count) {
  if (!sharded_) return store_.whole_params();
  forget_gathers();  // nothing reads the pieces while they go out
  return sharded_->params(count);
}

void ReplicaState::set_params(const float* host) {
  if (!sharded_) return store_.set_whole_params(host);
  forget_gathers();  // nothing reads the pieces while they are replaced
  sharded_->set_params(host);
}

NamedState ReplicaState::optimizer_state(size_t count) {
  if (!sharded_) return store_.optimizer_state();
  return sharded_->optimizer_state(count, store_.optimizer_buffers());
}

void ReplicaState::set_optimizer_state(const NamedState& state) {
  store_.set_optimizer_state(sharded_ ? sharded_->pieces_of(state) : state);
}

}  // namespace ddp
