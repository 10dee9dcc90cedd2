// RankStages: a pipeline rank's stages and their slices of the model's flat parameters; the
// first weights and the buckets' options a stage's runner starts from.
#include <algorithm>
#include <cmath>

#include "models/safetensors.h"

#include "dist/grad_sync.h"
#include "engine/runners/stage_runner.h"
#include "runtime/error.h"

namespace ddp {

size_t RankStages::param_count() const {
  size_t n = 0;
  for (const StageSpec& c : chunks)
    n += c.param_count();
  return n;
}

size_t RankStages::offset_of(int chunk) const {
  size_t at = 0;
  for (int c = 0; c < chunk; ++c)
    at += chunks[c].param_count();
  return at;
}

std::vector<float> RankStages::take(const float* whole) const {
  std::vector<float> mine;
  mine.reserve(param_count());
  for (const StageSpec& c : chunks)
    mine.insert(mine.end(), whole + c.param_offset(), whole + c.param_offset() + c.param_count());
  return mine;
}

void RankStages::put(const float* mine, float* whole) const {
  for (const StageSpec& c : chunks) {
    std::copy_n(mine, c.param_count(), whole + c.param_offset());
    mine += c.param_count();
  }
}

size_t RankStages::model_index(size_t i) const {
  for (const StageSpec& c : chunks) {
    if (i < c.param_count()) return c.param_offset() + i;
    i -= c.param_count();
  }
  DDP_CHECK(false, "index {} past the rank's {} parameters", i, param_count());
  return 0;
}

std::vector<std::pair<size_t, size_t>> RankStages::layer_spans() const {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t base = 0;
  for (const StageSpec& c : chunks) {
    for (int i = c.first; i < c.end; ++i)
      spans.emplace_back(base + c.shape.layer(i).weight_offset - c.param_offset(),
                         c.shape.layer(i).count());
    base += c.param_count();
  }
  return spans;
}

uint64_t RankStages::fingerprint() const {
  uint64_t f = shape().fingerprint();
  for (const StageSpec& c : chunks)
    f ^= (uint64_t(c.first) << 48) ^ (uint64_t(c.end) << 56) ^ (uint64_t(c.stage) << 40);
  return f;
}

std::vector<StagePlace> RankStages::places() const {
  std::vector<StagePlace> places;
  for (const StageSpec& c : chunks)
    places.push_back({c.stage, c.stages, c.micro_batches, c.end - c.first});
  return places;
}

RankStages rank_stages(const PipelineLayout& layout, int pipe_rank, const StageSpec& cut) {
  RankStages stages;
  const int total = static_cast<int>(layout.stage_rank.size());
  for (int s : layout.stages_of(pipe_rank)) {
    StageSpec spec = cut;
    spec.first = layout.bounds[s];
    spec.end = layout.bounds[s + 1];
    spec.stage = s;
    spec.stages = total;
    spec.rank = pipe_rank;
    spec.prev_rank = s > 0 ? layout.stage_rank[s - 1] : -1;
    spec.next_rank = s + 1 < total ? layout.stage_rank[s + 1] : -1;
    stages.chunks.push_back(spec);
  }
  DDP_CHECK(!stages.chunks.empty(), "pipeline rank {} holds no stage", pipe_rank);
  return stages;
}

std::vector<float> initial_weights(const std::string& init_weights, uint64_t seed,
                                   const MlpShape& shape) {
  std::vector<float> whole(shape.param_count());
  if (init_weights.empty())
    init_params(shape, seed, whole.data());
  else
    load_mlp_weights(init_weights, shape, whole.data());
  for (size_t i = 0; i < whole.size(); ++i)
    DDP_USAGE_CHECK(std::isfinite(whole[i]),
                    "--init-weights {}: weight {} at index {} of the flat parameters is not "
                    "finite; expected finite weights",
                    init_weights, whole[i], i);
  return whole;
}

BucketPlan stage_bucket_plan(const RankStages& stages, const SyncOptions& sync) {
  std::vector<ParamSpan> spans;
  for (const auto& [offset, count] : stages.layer_spans())
    spans.push_back({offset, count});
  return plan_sync_buckets(spans, sync);
}

}  // namespace ddp
