// ShardedState: ZeRO's pieces, update protocol and host copies, over the home's memory.
#include "dist/sharded_state.h"

#include "runtime/error.h"

namespace ddp {

ShardedState::ShardedState(Ddp& ddp, int level, ShardHome& home, Communicator* gathers)
    : home_(home), shards_(std::make_unique<ShardedBuckets>(ddp, level, home.bucket_memory())) {
  shards_->set_gather_comm(gathers);
  if (level < 3) return;
  // The parameters become this rank's pieces (a bucket a layer: dist/zero.h), copied out
  // of the whole ones, which the home then frees.
  const ShardPlan& plan = shards_->plan();
  pieces_ = home.allocate(plan.shard_count, true);
  float* whole = home.params();
  for (const ShardPart& p : plan.parts) {
    DDP_CHECK(p.shard_at + p.count <= plan.shard_count, "--zero 3: piece {}+{} -> {} out of range",
              p.offset, p.count, p.shard_at);
    home.copy(pieces_.get() + p.shard_at, whole + p.offset, p.count);
  }
}

std::vector<OptimizerPiece> ShardedState::owned_pieces() const {
  std::vector<OptimizerPiece> pieces;
  const ShardPlan& plan = shards_->plan();
  for (size_t b = 0; b < plan.parts.size(); ++b) {
    const ShardPart& p = plan.parts[b];
    if (p.count == 0) continue;
    pieces.push_back(
        {pieces_ ? p.shard_at : p.offset, shards_->reduced_piece(b), p.shard_at, p.count});
  }
  return pieces;
}

void ShardedState::updated() {
  if (pieces_) return;  // the pieces are the parameters: the next uses gather them
  shards_->gather_in_place(home_.params(), home_.stream());
  home_.params_gathered();
}

std::vector<float> ShardedState::params(size_t count) {
  if (!pieces_) return home_.whole_params();  // whole on every replica
  home_.settle();
  const std::shared_ptr<float> whole = home_.allocate(count, false);
  shards_->gather_shards(pieces_.get(), whole.get(), home_.stream());
  return home_.to_host(whole.get(), count);
}

void ShardedState::set_params(const float* host) {
  if (!pieces_) return home_.set_whole_params(host);
  std::vector<float> mine(plan().shard_count);  // this rank's pieces, the padding zero
  shards_->take_shard(host, mine.data());
  home_.settle();
  home_.from_host(pieces_.get(), mine.data(), mine.size());
}

NamedState ShardedState::optimizer_state(
    size_t count, const std::vector<std::pair<std::string, const float*>>& buffers) {
  NamedState state;
  const std::shared_ptr<float> whole = home_.allocate(count, false);
  for (const auto& [name, pieces] : buffers) {
    shards_->gather_shards(pieces, whole.get(), home_.stream());
    state.emplace_back(name, home_.to_host(whole.get(), count));
  }
  return state;
}

NamedState ShardedState::pieces_of(const NamedState& whole) const {
  NamedState mine;
  for (const auto& [name, values] : whole) {
    mine.emplace_back(name, std::vector<float>(plan().shard_count));
    shards_->take_shard(values.data(), mine.back().second.data());
  }
  return mine;
}

}  // namespace ddp
