// What a communicator did lately (PyTorch's NCCL flight recorder): its last collectives, each
// with its kind, sequence number, elements, type and when it started and ended, kept in a ring
// of kFlightEntries. The backends record each call as they issue it and as they see it end; a
// timeout's message names the calls before the stuck one (recent_before), and every stuck rank
// publishes what it is stuck in through the store (describe_stuck_operation), so that each
// rank's message names every rank's pending collective.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ddp {

enum class DataType;

// The collectives a communicator remembers.
constexpr size_t kFlightEntries = 64;

// One recorded call.
struct FlightEntry {
  uint64_t sequence = 0;                          // the communicator's number for it
  std::string op;                                 // "all_reduce", "broadcast", ...
  size_t count = 0;                               // elements
  DataType type{};                                // their type
  std::chrono::steady_clock::time_point started;  // when it was issued
  std::chrono::steady_clock::time_point ended;    // meaningful where done or failed
  bool done = false;                              // it ended and succeeded
  bool failed = false;                            // it ended with an error
};

// What the calls of one kind handed the backend since the communicator was made.
struct OpTraffic {
  uint64_t calls = 0;  // how many were issued
  uint64_t bytes = 0;  // each call's elements x their size (all_gather's and reduce_scatter's:
                       // one rank's piece; all_reduce's and broadcast's: the buffer)
};

// A ring of the last kFlightEntries calls, and every call's totals by kind; every method may
// be called from any thread.
class FlightRecorder {
 public:
  // Call `sequence` was issued now.
  void started(uint64_t sequence, const char* op, size_t count, DataType type);
  // Call `sequence` ended now, succeeded or not (no effect once it has left the ring).
  void ended(uint64_t sequence, bool ok);
  // The calls kept, oldest first.
  std::vector<FlightEntry> entries() const;
  // Every call since the start, by kind ("all_reduce", ...).
  std::map<std::string, OpTraffic> totals() const;
  // "broadcast #16 (4 x int32) done 0.2 s before it, all_reduce #15 (...) done 0.3 s before
  // it": up to `most` calls issued before `sequence`, newest first ("" where none).
  std::string recent_before(uint64_t sequence, size_t most = 3) const;

 private:
  mutable std::mutex mutex_;
  std::deque<FlightEntry> ring_;
  std::map<std::string, OpTraffic> totals_;
};

}  // namespace ddp
