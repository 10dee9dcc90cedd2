// Names, the factory's shared parts, and the stuck-operation diagnosis through the store.
#include "collectives/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "collectives/host_reduce.h"
#include "runtime/error.h"
#include "runtime/store.h"

namespace ddp {

size_t dtype_bytes(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return 4;
    case DataType::kBFloat16:
    case DataType::kFloat16:
      return 2;
    case DataType::kFloat64:
      return 8;
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat16:
      return "float16";
    case DataType::kFloat64:
      return "float64";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
  }
  return "?";
}

const char* reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

namespace {

// float32 values rounded to bf16 into `wire` (divided by `ranks` there for kAverage, as
// PyTorch's bf16_compress_hook divides its bf16 copy), and the op the bf16 sum then takes.
ReduceOp to_wire(const float* values, uint16_t* wire, size_t count, ReduceOp op, int ranks) {
  for (size_t i = 0; i < count; ++i)
    wire[i] = float_to_bf16(values[i]);
  if (op != ReduceOp::kAverage) return op;
  const float divisor = static_cast<float>(ranks);
  for (size_t i = 0; i < count; ++i)
    wire[i] = float_to_bf16(bf16_to_float(wire[i]) / divisor);
  return ReduceOp::kSum;
}

// A host backend's bf16 reduction: once the bf16 collective is done, its result written back to
// `out` as float32, once (by whichever of wait, then_on or is_completed sees it first).
class WidenedWork final : public Work {
 public:
  WidenedWork(std::unique_ptr<Work> wire, const uint16_t* result, float* out, size_t count,
              std::shared_ptr<std::vector<uint16_t>> keep = nullptr)
      : wire_(std::move(wire)), result_(result), out_(out), count_(count), keep_(std::move(keep)) {}
  void wait(double timeout_s) override {
    wire_->wait(timeout_s);
    widen();
  }
  void then_on(void* stream) override {
    wire_->then_on(stream);
    widen();
  }
  bool is_completed() override {
    if (!wire_->is_completed()) return false;
    widen();
    return true;
  }

 private:
  void widen() {
    if (done_) return;
    for (size_t i = 0; i < count_; ++i)
      out_[i] = bf16_to_float(result_[i]);
    done_ = true;
  }
  std::unique_ptr<Work> wire_;
  const uint16_t* result_;
  float* out_;
  size_t count_;
  std::shared_ptr<std::vector<uint16_t>> keep_;  // the result, where not in the caller's scratch
  bool done_ = false;
};

}  // namespace

std::unique_ptr<Work> Communicator::all_reduce_bf16_async(float* buffer, void* scratch,
                                                          size_t count, ReduceOp op) {
  require_bf16_reduction();  // device memory: only NCCL's override converts it
  auto* wire = static_cast<uint16_t*>(scratch);
  const ReduceOp sum = to_wire(buffer, wire, count, op, size());
  return std::make_unique<WidenedWork>(all_reduce_async(wire, count, DataType::kBFloat16, sum),
                                       wire, buffer, count);
}

std::unique_ptr<Work> Communicator::reduce_scatter_bf16_async(const float* send, float* recv,
                                                              void* scratch, size_t count,
                                                              ReduceOp op) {
  require_bf16_reduction();
  auto* wire = static_cast<uint16_t*>(scratch);
  const ReduceOp sum = to_wire(send, wire, count * static_cast<size_t>(size()), op, size());
  // The host collectives take no aliased output: this rank's block lands apart.
  auto block = std::make_shared<std::vector<uint16_t>>(count);
  auto work = reduce_scatter_async(wire, block->data(), count, DataType::kBFloat16, sum);
  return std::make_unique<WidenedWork>(std::move(work), block->data(), recv, count, block);
}

uint64_t Communicator::bus_bytes() const {
  const auto n = static_cast<uint64_t>(size());
  uint64_t bytes = 0;
  for (const auto& [op, total] : traffic()) {
    if (op == "all_reduce")
      bytes += total.bytes * 2 * (n - 1) / n;
    else if (op == "all_gather" || op == "reduce_scatter")
      bytes += total.bytes * (n - 1);
    else if (op == "broadcast")
      bytes += total.bytes;
  }
  return bytes;
}

std::unique_ptr<Communicator::Window> Communicator::register_window(void* buffer, size_t bytes) {
  (void)buffer;
  (void)bytes;
  throw UsageError(fmt::format(
      "--nccl-symmetric: the {} backend registers no memory windows; that needs NCCL on GPUs",
      backend()));
}

void Communicator::require_bf16_reduction() const {
  DDP_USAGE_CHECK(reduces_bf16(),
                  "--grad-reduce bf16: the {} backend cannot reduce bfloat16 in device memory; "
                  "that needs NCCL",
                  backend());
}

namespace {

// The diagnosis after a timeout asks the store with short deadlines: where the store is cut
// off too (a link down), the rank still fails on time, saying the store could not tell.
constexpr double kDiagnosisReplySeconds = 3.0;
class ShortReplies {
 public:
  explicit ShortReplies(StoreClient& store) : store_(store), before_(store.reply_timeout()) {
    store_.set_reply_timeout(std::min(before_, kDiagnosisReplySeconds));
  }
  ~ShortReplies() { store_.set_reply_timeout(before_); }
  ShortReplies(const ShortReplies&) = delete;
  ShortReplies& operator=(const ShortReplies&) = delete;

 private:
  StoreClient& store_;
  double before_;
};

// The ranks whose recorded call a stuck rank compares with its own.
constexpr int kCallsCompared = 16;

// Records this rank's arrival at `prefix` (its call, `mine`) and what it is stuck in under
// `stuck` (read by the ranks that are stuck later in the group); names the ranks whose record is
// missing, with the call each waits in where it has said, or a call of rank 0's that differs.
std::string missing_ranks(StoreClient* store, const std::string& prefix, const std::string& stuck,
                          uint64_t sequence, const std::string& mine, int rank, int size,
                          const std::vector<int>& world_ranks, const std::string& group) {
  if (store == nullptr) return "";
  const ShortReplies short_replies(*store);
  try {
    store->set(prefix + std::to_string(rank), mine);
    store->set(stuck + std::to_string(rank), fmt::format("#{} {}", sequence, mine));
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r)
      keys.push_back(prefix + std::to_string(r));
    // Peers that reached this point time out at about the same moment; give them a little
    // time to record it.
    std::vector<std::string> absent;
    for (int attempt = 0; attempt < 20; ++attempt) {
      absent = store->missing(keys);
      if (absent.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::vector<int> missing;
    for (const std::string& key : absent)
      missing.push_back(std::stoi(key.substr(prefix.size())));
    if (missing.empty()) {
      // The first ranks' calls against this one's (a few reads, not one a rank: in a large
      // group the ranks that differ from the first ones say so).
      for (int r = 0; r < std::min(size, kCallsCompared); ++r) {
        if (r == rank) continue;
        const std::optional<std::string> theirs = store->get(keys[r]);
        if (theirs && *theirs != mine)
          return fmt::format(
              "; the ranks' calls #{} differ: this rank ({}) called {} where rank {} "
              "called {}",
              sequence, name_ranks({rank}, world_ranks, group), mine,
              name_ranks({r}, world_ranks, group), *theirs);
      }
      return "; every rank reached it (a peer failed inside it?)";
    }
    std::string waits;  // what the first few missing ranks said they are stuck in
    for (size_t k = 0; k < missing.size() && k < 4; ++k)
      if (const auto at = store->get(stuck + std::to_string(missing[k])))
        waits += fmt::format("{}{} waits in {}", waits.empty() ? " (" : "; ",
                             name_ranks({missing[k]}, world_ranks, group), *at);
    if (!waits.empty()) waits += ")";
    return fmt::format("; rank(s) {} never reached it{}", name_ranks(missing, world_ranks, group),
                       waits);
  } catch (const std::exception& e) {
    return fmt::format("; the store could not tell which ranks are missing ({})", e.what());
  }
}

}  // namespace

void sum_over_ranks(Communicator* comm, double* values, size_t count) {
  if (comm == nullptr || comm->size() == 1) return;
  DDP_CHECK(!comm->device_buffers(), "sum_over_ranks needs a host communicator");
  comm->all_reduce(values, count, DataType::kFloat64, ReduceOp::kSum);
}

std::string name_ranks(const std::vector<int>& group_ranks, const std::vector<int>& world_ranks,
                       const std::string& group) {
  std::string text;
  for (int r : group_ranks) {
    text += text.empty() ? "" : ", ";
    if (world_ranks.empty() || r < 0 || r >= static_cast<int>(world_ranks.size()))
      text += std::to_string(r);
    else
      text += fmt::format("{} (rank {} of group {})", world_ranks[r], r, group);
  }
  return text;
}

std::string describe_stuck_operation(StoreClient* store, const std::string& group, int rank,
                                     int size, uint64_t sequence, const char* op, size_t count,
                                     DataType type, const std::string& cause,
                                     const std::vector<int>& world_ranks,
                                     const FlightRecorder* flight) {
  const std::string call = fmt::format("{} of {} x {} ({} bytes)", op, count, dtype_name(type),
                                       count * dtype_bytes(type));
  const std::string missing = missing_ranks(
      store, fmt::format("ddp/arrived/{}/{}/", group, sequence),
      fmt::format("ddp/stuck/{}/", group), sequence, call, rank, size, world_ranks, group);
  const std::string before = flight != nullptr ? flight->recent_before(sequence) : "";
  return fmt::format("{} #{} ({} x {}, {} bytes) in group {} did not complete: {}{}{}", op,
                     sequence, count, dtype_name(type), count * dtype_bytes(type), group, cause,
                     missing, before.empty() ? "" : "; this rank's calls before it: " + before);
}

std::string describe_stuck_p2p(const std::string& group, uint64_t sequence,
                               const std::vector<Communicator::P2pOp>& ops,
                               const std::string& cause, const Communicator* comm) {
  std::string what, peers;
  for (const Communicator::P2pOp& op : ops) {
    what += fmt::format("{}{} of {} x {} ({} bytes) {} rank {}", what.empty() ? "" : " and ",
                        op.send ? "send" : "recv", op.count, dtype_name(op.type),
                        op.count * dtype_bytes(op.type), op.send ? "to" : "from", op.peer);
    const std::string peer = std::to_string(op.peer);
    if (("," + peers + ",").find("," + peer + ",") == std::string::npos)
      peers += (peers.empty() ? "" : ",") + peer;
  }
  // In a sub-group, say which processes those are as the launcher numbers them.
  std::string world;
  if (comm != nullptr && !ops.empty() && comm->world_rank_of(ops.front().peer) >= 0 &&
      comm->world_rank_of(ops.front().peer) != ops.front().peer) {
    for (const Communicator::P2pOp& op : ops) {
      const std::string r = std::to_string(comm->world_rank_of(op.peer));
      if (("," + world + ",").find("," + r + ",") == std::string::npos)
        world += (world.empty() ? "" : ",") + r;
    }
    world = ", world rank " + world;
  }
  return fmt::format(
      "{} (point-to-point #{} in group {}) did not complete: {}; the peer{} (rank {} of that "
      "group{}) {} stopped, dead or behind",
      what.empty() ? "an empty batch" : what, sequence, group, cause,
      peers.find(',') == std::string::npos ? "" : "s", peers, world,
      peers.find(',') == std::string::npos ? "is" : "are");
}

std::string describe_stuck_step(StoreClient* store, const std::string& group, int rank, int size,
                                const std::string& what, uint64_t sequence,
                                const std::string& cause, const std::vector<int>& world_ranks) {
  // Steps are ordered: a rank stuck at a later step has passed this one. Each stuck rank
  // records the step it is stuck at and reads the others' records; ranks without one never
  // got here (stopped, dead), ranks at an earlier step are held up behind them.
  std::string detail;
  if (store != nullptr) {
    const ShortReplies short_replies(*store);
    try {
      const std::string prefix = fmt::format("ddp/reached/{}/{}/", group, what);
      store->set(prefix + std::to_string(rank), std::to_string(sequence));
      std::vector<std::string> keys;
      for (int r = 0; r < size; ++r)
        keys.push_back(prefix + std::to_string(r));
      for (int attempt = 0; attempt < 20 && !store->missing(keys).empty(); ++attempt)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::vector<int> absent;
      std::string behind;
      for (int r = 0; r < size; ++r) {
        const auto value = store->get(keys[r]);
        if (!value)
          absent.push_back(r);
        else if (std::stoull(*value) < sequence)
          behind += fmt::format("{}{} (at #{})", behind.empty() ? "" : ", ",
                                name_ranks({r}, world_ranks, group), *value);
      }
      if (!absent.empty())
        detail +=
            fmt::format("; rank(s) {} never reached it", name_ranks(absent, world_ranks, group));
      if (!behind.empty()) detail += fmt::format("; rank(s) {} held up at an earlier one", behind);
      if (detail.empty()) detail = "; every rank reached it (a peer failed inside it?)";
    } catch (const std::exception& e) {
      detail = fmt::format("; the store could not tell which ranks are missing ({})", e.what());
    }
  }
  return fmt::format("{} #{} in group {} did not complete: {}{}", what, sequence, group, cause,
                     detail);
}

}  // namespace ddp
