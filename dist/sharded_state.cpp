// ShardedState: ZeRO's pieces, update protocol and host copies, over the store's memory.
#include "dist/sharded_state.h"

#include "runtime/error.h"

namespace ddp {

ShardedState::ShardedState(Reducer& ddp, int level, ParamStore& store, Communicator* gathers,
                           ShardCut cut)
    : store_(store),
      memory_(store.memory() != nullptr ? *store.memory() : host_memory_port()),
      shards_(std::make_unique<ShardedBuckets>(ddp, level, store.memory(), std::move(cut),
                                               store.ring())) {
  shards_->set_gather_comm(gathers);
  if (level < 3) return;
  // The parameters become this rank's pieces (each of its runs of a bucket, packed), copied
  // out of the whole ones, which the store then frees.
  const ShardPlan& plan = shards_->plan();
  const std::vector<GradMemory> whole = store.param_memory();
  for (size_t k = 0; k < whole.size(); ++k) {
    const size_t count = k < plan.shard_counts.size() ? plan.shard_counts[k] : 0;
    pieces_.push_back(store.allocate(count * shards_->element_bytes(k), true));
  }
  for (const ShardPart& p : plan.parts) {
    DDP_CHECK(p.shard_at + p.count <= plan.shard_counts[p.buffer],
              "--zero 3: piece {}+{} -> {} out of range", p.offset, p.count, p.shard_at);
    const size_t size = shards_->element_bytes(p.buffer);
    char* mine = static_cast<char*>(pieces_[p.buffer].get()) + p.shard_at * size;
    const char* from = static_cast<const char*>(whole[p.buffer].data);
    for (const ShardRun& run : p.runs[static_cast<size_t>(plan.rank)])
      memory_.copy(mine + run.at * size, from + run.offset * size, run.count * size);
  }
}

std::vector<OptimizerPiece> ShardedState::owned_pieces() const {
  std::vector<OptimizerPiece> pieces;
  const ShardPlan& plan = shards_->plan();
  for (size_t b = 0; b < plan.parts.size(); ++b) {
    const ShardPart& p = plan.parts[b];
    if (p.count == 0) continue;
    DDP_CHECK(p.strided() && p.buffer == 0 && shards_->type(0) == DataType::kFloat32,
              "owned_pieces: one float32 buffer in equal pieces");
    pieces.push_back({pieces_.empty() ? p.offset : p.shard_at,
                      static_cast<const float*>(shards_->reduced_piece(b)), p.shard_at, p.count});
  }
  return pieces;
}

void ShardedState::updated() {
  if (!pieces_.empty()) return;  // the pieces are the parameters: the next uses gather them
  std::vector<void*> whole;
  for (const GradMemory& buffer : store_.param_memory())
    whole.push_back(buffer.data);
  shards_->gather_in_place(whole, store_.stream());
  store_.params_gathered();
}

void ShardedState::gather_params(const std::vector<void*>& whole) {
  DDP_CHECK(!pieces_.empty(), "gather_params: the parameters are whole (level {})", level());
  std::vector<const void*> mine;
  for (const std::shared_ptr<void>& piece : pieces_)
    mine.push_back(piece.get());
  shards_->gather_shards(mine, whole, store_.stream());
}

std::unique_ptr<Work> ShardedState::gather_bucket(size_t b, void* whole) {
  DDP_CHECK(!pieces_.empty(), "gather_bucket: the parameters are whole (level {})", level());
  const size_t buffer = plan().parts.at(b).buffer;
  return gather_bucket(b, whole, pieces_.at(buffer).get(), shards_->type(buffer));
}

std::unique_ptr<Work> ShardedState::gather_bucket(size_t b, void* whole, const void* pieces,
                                                  DataType type) {
  const ShardPart& p = plan().parts.at(b);
  DDP_CHECK(p.in_place(), "gather_bucket: bucket {}'s pieces ({} x {}) are not the bucket ({})", b,
            p.piece, plan().ranks, p.bucket_count);
  const size_t size = dtype_bytes(type);
  return shards_->gather_comm().all_gather_async(
      static_cast<const char*>(pieces) + p.shard_at * size,
      static_cast<char*>(whole) + p.bucket_offset * size, p.piece, type);
}

std::vector<float> ShardedState::params(size_t count) {
  if (pieces_.empty()) return store_.whole_params();  // whole on every replica
  const std::shared_ptr<void> whole = store_.allocate(count * sizeof(float), false);
  shards_->gather_shards(pieces_[0].get(), whole.get(), store_.stream());
  return store_.to_host(static_cast<const float*>(whole.get()), count);
}

void ShardedState::set_params(const float* host) {
  if (pieces_.empty()) return store_.set_whole_params(host);
  std::vector<float> mine(plan().shard_count);  // this rank's pieces, the padding zero
  shards_->take_shard(host, mine.data());
  store_.from_host(pieces(), mine.data(), mine.size());
}

NamedState ShardedState::optimizer_state(
    size_t count, const std::vector<std::pair<std::string, const float*>>& buffers) {
  NamedState state;
  const std::shared_ptr<void> whole = store_.allocate(count * sizeof(float), false);
  for (const auto& [name, pieces] : buffers) {
    shards_->gather_shards(pieces, whole.get(), store_.stream());
    state.emplace_back(name, store_.to_host(static_cast<const float*>(whole.get()), count));
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
