// Sampler: one Fisher-Yates permutation per epoch, cached while the stream stays in it.
#include "engine/loop/sampler.h"

#include <numeric>

#include "models/rng.h"
#include "runtime/error.h"

namespace ddp {

Sampler::Sampler(int64_t num_samples, uint64_t seed, bool shuffle)
    : num_samples_(num_samples), seed_(seed), shuffle_(shuffle) {
  DDP_CHECK(num_samples > 0 && num_samples < (int64_t{1} << 31), "bad sample count {}",
            num_samples);
}

void Sampler::prepare_epoch(int64_t epoch) {
  if (epoch == cached_epoch_) return;
  permutation_.resize(num_samples_);
  std::iota(permutation_.begin(), permutation_.end(), 0);
  if (shuffle_) {
    Rng rng(mix_seed(seed_, static_cast<uint64_t>(epoch)));
    rng.shuffle(permutation_);
  }
  cached_epoch_ = epoch;
}

void Sampler::indices(int64_t begin, int64_t count, int32_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t position = begin + i;
    prepare_epoch(position / num_samples_);
    out[i] = permutation_[position % num_samples_];
  }
}

BatchSlice rank_slice(int64_t step, int global_batch, int rank, int ranks, int micro,
                      int micro_batches) {
  DDP_CHECK(micro_batches >= 1 && micro >= 0 && micro < micro_batches &&
                global_batch % (micro_batches * ranks) == 0,
            "global batch {} not divisible into {} micro-batches over {} ranks", global_batch,
            micro_batches, ranks);
  const int micro_size = global_batch / micro_batches;
  const int local = micro_size / ranks;
  return {step * global_batch + static_cast<int64_t>(micro) * micro_size +
              static_cast<int64_t>(rank) * local,
          local};
}

}  // namespace ddp
