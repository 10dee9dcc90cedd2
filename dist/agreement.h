// Ranks that must agree: each rank describes what must match across the job (its model's
// tensors, its options, its flags) as lines in one order, and a small collective finds the first
// line where some rank differs from rank 0, so that every rank can name it. Host memory is
// exchanged directly over a host communicator, through a device scratch over a device one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace ddp {

// How host memory reaches a device communicator (NCCL): a scratch in its memory and the copies
// to and from it. Unused (may be empty) with a host communicator.
struct DeviceStaging {
  // A device buffer of at least `bytes`, valid until the next call.
  std::function<void*(size_t bytes)> scratch;
  // Synchronous copies of `bytes` between host and device memory.
  void (*to_device)(void* dst, const void* src, size_t bytes) = nullptr;
  void (*to_host)(void* dst, const void* src, size_t bytes) = nullptr;
};

// Where the ranks' lines first differ: rank `rank` (the lowest that differs) has line `index`
// `theirs` where rank 0 has `rank0s` ("nothing" where a list is shorter).
struct LineDifference {
  int rank = 0;
  size_t index = 0;
  std::string theirs, rank0s;
};

// Collective over `comm` (every rank, with its own lines): the first difference from rank 0's
// lines, the same on every rank, or none. A device communicator needs `staging`.
std::optional<LineDifference> first_difference(Communicator& comm,
                                               const std::vector<std::string>& lines,
                                               const DeviceStaging& staging = {});

// Collective: `settings` ("name value" lines: the options that must match, in one order) equal
// rank 0's on every rank, or a UsageError on every rank naming the first that differs:
// "<who>: rank 1 has zero 2 where rank 0 has zero 1; every rank must <must>".
void check_same_settings(Communicator& comm, const std::vector<std::string>& settings,
                         const std::string& who, const std::string& must,
                         const DeviceStaging& staging = {});

// Collective: every rank's int64 `mine`, in rank order (through `staging` on a device
// communicator).
std::vector<int64_t> all_gather_value(Communicator& comm, int64_t mine,
                                      const DeviceStaging& staging = {});

// Collective: every rank's `values` (the same count on each: flags, counts, a map of what each
// rank used) summed, or their largest, on every rank (through `staging` on a device
// communicator).
std::vector<int32_t> all_reduce_values(Communicator& comm, std::vector<int32_t> values, ReduceOp op,
                                       const DeviceStaging& staging = {});
// The same for float64 values (the parts of a gradient norm that each rank holds).
std::vector<double> all_reduce_doubles(Communicator& comm, std::vector<double> values, ReduceOp op,
                                       const DeviceStaging& staging = {});

}  // namespace ddp
