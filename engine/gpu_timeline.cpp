#include "engine/gpu_timeline.h"

#include <algorithm>

namespace ddp {

std::vector<std::vector<Span>> gather_spans_on_gpu(Communicator* comm,
                                                   const std::vector<Span>& mine) {
  if (comm == nullptr || comm->size() == 1) return {mine};
  const int n = comm->size();
  DeviceBuffer<int64_t> counts(static_cast<size_t>(n) + 1, MemoryCategory::kOther);
  const int64_t count = static_cast<int64_t>(mine.size());
  DDP_CUDA_CHECK(cudaMemcpy(counts.data(), &count, 8, cudaMemcpyHostToDevice));
  comm->all_gather(counts.data(), counts.data() + 1, 1, DataType::kInt64);
  std::vector<int64_t> all_counts(n);
  DDP_CUDA_CHECK(cudaMemcpy(all_counts.data(), counts.data() + 1, 8 * n, cudaMemcpyDeviceToHost));
  const size_t most = static_cast<size_t>(*std::max_element(all_counts.begin(), all_counts.end()));
  std::vector<double> packed = pack_spans(mine);
  packed.resize(std::max<size_t>(most, 1) * kSpanDoubles, 0.0);
  DeviceBuffer<double> buffer(packed.size() * (static_cast<size_t>(n) + 1), MemoryCategory::kOther);
  DDP_CUDA_CHECK(
      cudaMemcpy(buffer.data(), packed.data(), packed.size() * 8, cudaMemcpyHostToDevice));
  comm->all_gather(buffer.data(), buffer.data() + packed.size(), packed.size(), DataType::kFloat64);
  std::vector<double> gathered(packed.size() * n);
  DDP_CUDA_CHECK(cudaMemcpy(gathered.data(), buffer.data() + packed.size(), gathered.size() * 8,
                            cudaMemcpyDeviceToHost));
  std::vector<std::vector<Span>> all(n);
  for (int r = 0; r < n; ++r) {
    auto first = gathered.begin() + static_cast<std::ptrdiff_t>(r * packed.size());
    all[r] = unpack_spans(std::vector<double>(first, first + all_counts[r] * kSpanDoubles));
  }
  return all;
}

}  // namespace ddp
