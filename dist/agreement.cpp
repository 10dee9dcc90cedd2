// Ranks that must agree: rank 0's lines to every rank, each rank's first difference gathered,
// the lowest differing rank's line to every rank.
#include "dist/agreement.h"

#include <algorithm>
#include <utility>

#include "runtime/error.h"

namespace ddp {

namespace {

// Host memory exchanged over `comm`: directly with a host communicator, through the device
// scratch and the copies with a device one.
struct Relay {
  Communicator& comm;
  const DeviceStaging& staging;

  // `collective` on words[count]: in place over a host communicator, through the device
  // scratch (copied there and back) over a device one.
  template <typename T, typename Collective>
  void on_words(T* words, size_t count, Collective collective) {
    if (count == 0) return;
    if (!comm.device_buffers()) return collective(words);
    void* device = staging.scratch(count * sizeof(T));
    staging.to_device(device, words, count * sizeof(T));
    collective(device);
    staging.to_host(words, device, count * sizeof(T));
  }
  // words[count] of rank `root` on every rank.
  void broadcast(int32_t* words, size_t count, int root) {
    on_words(words, count, [&](void* at) { comm.broadcast(at, count, DataType::kInt32, root); });
  }
  // words[count] reduced by `op` over the ranks, on every rank.
  template <typename T>
  void all_reduce(T* words, size_t count, ReduceOp op) {
    on_words(words, count, [&](void* at) { comm.all_reduce(at, count, data_type_of<T>(), op); });
  }
  // all[size] holds every rank's `mine`, in rank order.
  void all_gather(int64_t mine, int64_t* all) {
    if (!comm.device_buffers()) return comm.all_gather(&mine, all, 1, DataType::kInt64);
    const size_t n = static_cast<size_t>(comm.size());
    auto* device = static_cast<int64_t*>(staging.scratch((n + 1) * sizeof(int64_t)));
    staging.to_device(device, &mine, sizeof(int64_t));
    comm.all_gather(device, device + 1, 1, DataType::kInt64);
    staging.to_host(all, device + 1, n * sizeof(int64_t));
  }
  // `text` of rank `root` on every rank.
  std::string broadcast_text(const std::string& text, int root) {
    // The length and the text as 32-bit words (the communicators move numbers), padded.
    constexpr size_t kWord = sizeof(int32_t);
    int32_t length = static_cast<int32_t>(text.size());
    broadcast(&length, 1, root);
    const size_t words = (static_cast<size_t>(length) + kWord - 1) / kWord;
    std::string out = comm.rank() == root ? text : std::string();
    out.resize(words * kWord, '\0');
    broadcast(reinterpret_cast<int32_t*>(out.data()), words, root);
    out.resize(static_cast<size_t>(length));
    return out;
  }
};

void check_staging(const Communicator& comm, const DeviceStaging& staging) {
  DDP_CHECK(!comm.device_buffers() ||
                (staging.scratch && staging.to_device != nullptr && staging.to_host != nullptr),
            "comparing ranks over {} needs a device scratch and copies (DeviceStaging)",
            comm.backend());
}

}  // namespace

std::optional<LineDifference> first_difference(Communicator& comm,
                                               const std::vector<std::string>& lines,
                                               const DeviceStaging& staging) {
  check_staging(comm, staging);
  Relay relay{comm, staging};
  // Rank 0's lines to everyone (each ends with '\n'); each rank finds where it differs first.
  std::string mine;
  for (const std::string& line : lines)
    mine += line + '\n';
  const std::string text = relay.broadcast_text(mine, 0);
  std::vector<std::string> reference;
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at);
    reference.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  int64_t first = -1;  // the first index that differs here, -1: none
  for (size_t i = 0; i < std::max(lines.size(), reference.size()) && first < 0; ++i)
    if (i >= lines.size() || i >= reference.size() || lines[i] != reference[i])
      first = static_cast<int64_t>(i);
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  relay.all_gather(first, all.data());
  // The lowest rank that differs says what it has, so that every rank names both sides.
  const auto differs = std::find_if(all.begin(), all.end(), [](int64_t at) { return at >= 0; });
  if (differs == all.end()) return std::nullopt;
  LineDifference difference;
  difference.rank = static_cast<int>(differs - all.begin());
  difference.index = static_cast<size_t>(*differs);
  const auto line = [&difference](const std::vector<std::string>& list) {
    return difference.index < list.size() ? list[difference.index] : std::string("nothing");
  };
  difference.theirs = relay.broadcast_text(line(lines), difference.rank);
  difference.rank0s = line(reference);
  return difference;
}

void check_same_settings(Communicator& comm, const std::vector<std::string>& settings,
                         const std::string& who, const std::string& must,
                         const DeviceStaging& staging) {
  if (comm.size() == 1) return;
  const std::optional<LineDifference> difference = first_difference(comm, settings, staging);
  if (!difference) return;
  throw UsageError(fmt::format("{}: rank {} has {} where rank 0 has {}; every rank must {}", who,
                               difference->rank, difference->theirs, difference->rank0s, must));
}

std::vector<int64_t> all_gather_value(Communicator& comm, int64_t mine,
                                      const DeviceStaging& staging) {
  check_staging(comm, staging);
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  Relay{comm, staging}.all_gather(mine, all.data());
  return all;
}

namespace {

// `values` summed or their largest over the ranks (the two reductions' one body).
template <typename T>
std::vector<T> all_reduce_small(Communicator& comm, std::vector<T> values, ReduceOp op,
                                const DeviceStaging& staging) {
  check_staging(comm, staging);
  DDP_CHECK(op == ReduceOp::kSum || op == ReduceOp::kMax,
            "all_reduce_values: counts, flags and norms' parts are summed or take the largest");
  Relay{comm, staging}.all_reduce(values.data(), values.size(), op);
  return values;
}

}  // namespace

std::vector<int32_t> all_reduce_values(Communicator& comm, std::vector<int32_t> values, ReduceOp op,
                                       const DeviceStaging& staging) {
  return all_reduce_small(comm, std::move(values), op, staging);
}

std::vector<double> all_reduce_doubles(Communicator& comm, std::vector<double> values, ReduceOp op,
                                       const DeviceStaging& staging) {
  return all_reduce_small(comm, std::move(values), op, staging);
}

}  // namespace ddp
