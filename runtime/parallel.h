// Splits [0, n) into contiguous ranges run on threads (the caller's among them) and waits
// for all: for start-up work that is the same whatever the thread count (counter-based
// random fills). Small ranges stay on the calling thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace ddp {

// fn(begin, end) over ranges of at least `grain` elements, on up to
// std::thread::hardware_concurrency() threads (at most 32).
template <typename Fn>
void parallel_for(size_t n, size_t grain, Fn fn) {
  const size_t hardware = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>({hardware, 32, std::max<size_t>(1, n / grain)});
  if (threads <= 1) {
    if (n > 0) fn(size_t{0}, n);
    return;
  }
  const size_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) {
    const size_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    if (begin < end) pool.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  fn(size_t{0}, std::min(n, chunk));
  for (std::thread& thread : pool)
    thread.join();
}

}  // namespace ddp
