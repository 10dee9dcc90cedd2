// The sample stream: epoch permutations (seeded by seed and epoch) laid end to end, or the
// file order with --no-shuffle. Global batch t is positions [t*B, (t+1)*B) of that stream
// whatever the world size; data-parallel rank r of D takes its contiguous slice of it.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp {

class Sampler {
 public:
  Sampler(int64_t num_samples, uint64_t seed, bool shuffle);

  // Sample indices of stream positions [begin, begin + count) into out[count].
  void indices(int64_t begin, int64_t count, int32_t* out);
  // The epoch that stream position `position` belongs to.
  int64_t epoch_of(int64_t position) const { return position / num_samples_; }
  int64_t num_samples() const { return num_samples_; }

 private:
  void prepare_epoch(int64_t epoch);

  int64_t num_samples_;
  uint64_t seed_;
  bool shuffle_;
  int64_t cached_epoch_ = -1;
  std::vector<int32_t> permutation_;
};

// The stream positions of data-parallel rank `rank` of `ranks` in global batch `step`:
// with `micro_batches` > 1, its contiguous share of micro-batch `micro` (the micro-th
// 1/micro_batches of the global batch), as gradient accumulation and pipelines take them.
// The global batch must divide into micro-batches and ranks (checked).
struct BatchSlice {
  int64_t begin = 0;  // stream position
  int count = 0;      // samples
};
BatchSlice rank_slice(int64_t step, int global_batch, int rank, int ranks, int micro = 0,
                      int micro_batches = 1);

}  // namespace ddp
