// NodeWatch: a poll of the store every 250 ms on its own thread.
#include "launcher/node_watch.h"

#include <chrono>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/parse.h"
#include "runtime/timer.h"

namespace ddp {
namespace {
constexpr double kPollSeconds = 0.25;
}

std::string node_beat_key(int node) {
  return fmt::format("ddprun/beat/{}", node);
}
std::string node_address_key(int node) {
  return fmt::format("ddprun/node/{}/addr", node);
}
std::string node_finished_key(int node) {
  return fmt::format("ddprun/finished/{}", node);
}

NodeWatch::NodeWatch(StoreClient& store, int node_rank, int nnodes, double timeout_s)
    : store_(store),
      node_rank_(node_rank),
      nnodes_(nnodes),
      timeout_s_(timeout_s),
      beats_(nnodes, -1),
      seen_s_(nnodes, 0.0),
      finished_(nnodes, false),
      joined_(nnodes, false),
      silent_(nnodes),
      silent_since_(nnodes, -1.0),
      addresses_(nnodes) {
  thread_ = std::thread([this] { loop(); });
}

NodeWatch::~NodeWatch() {
  stop_ = true;
  // A store call in flight to a node that no longer answers would hold the thread for up
  // to --timeout: after half a second it is interrupted (the client is then unusable).
  for (int i = 0; i < 50 && !done_; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!done_) store_.interrupt();
  if (thread_.joinable()) thread_.join();
}

void NodeWatch::loop() {
  while (!stop_) {
    try {
      poll_once(clock_.seconds());
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      store_lost_ = true;
      if (!stop_)
        fatal_ = {fmt::format("lost the rendezvous store at {} (on node 0): {}", store_.address(),
                              e.what()),
                  true};
      break;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (fatal_.fatal) break;
    }
    for (int i = 0; i < 10 && !stop_; ++i)
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds / 10));
  }
  done_ = true;
}

void NodeWatch::poll_once(double now_s) {
  store_.add(node_beat_key(node_rank_), 1);
  const int64_t generation =
      parse_number<int64_t>(store_.get(kGenerationKey).value_or("0")).value_or(0);
  const std::optional<std::string> ended = store_.get(kJobEndedKey);
  bool all_finished = true;
  std::string gone;
  for (int node = 0; node < nnodes_; ++node) {
    if (node == node_rank_) continue;
    if (addresses_[node].empty())
      addresses_[node] = store_.get(node_address_key(node)).value_or("");
    if (!finished_[node]) finished_[node] = store_.get(node_finished_key(node)).has_value();
    if (finished_[node]) continue;
    const int64_t beat =
        parse_number<int64_t>(store_.get(node_beat_key(node)).value_or("-1")).value_or(-1);
    // A node that never joined holds nothing of the store: node 0 need not wait for it.
    if (!joined_[node]) joined_[node] = store_.get(fmt::format("ddprun/node/{}", node)).has_value();
    if (joined_[node]) all_finished = false;
    if (beat != beats_[node]) {
      beats_[node] = beat;
      seen_s_[node] = now_s;
    } else if (gone.empty() && now_s - seen_s_[node] > timeout_s_) {
      gone = beat < 0 ? fmt::format("{} never joined the job within {:.0f}s (--timeout)",
                                    describe_node(node), timeout_s_)
                      : fmt::format(
                            "{} stopped answering: no heartbeat through the store for "
                            "{:.1f}s (--timeout {:.0f}); it is gone or cut off",
                            describe_node(node), now_s - seen_s_[node], timeout_s_);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++polls_;
  last_poll_s_ = clock_.seconds();
  for (int node = 0; node < nnodes_; ++node) {
    const bool waited_for = node != node_rank_ && joined_[node] && !finished_[node];
    silent_[node] = waited_for ? describe_node(node) : "";
    silent_since_[node] = waited_for ? seen_s_[node] : -1.0;
  }
  generation_ = generation;
  others_finished_ = all_finished;
  // This node's own end (its ddprun wrote it, and waits for the others) is no verdict on it.
  const bool ended_here = ended && ended->rfind(fmt::format("node {} (", node_rank_), 0) == 0;
  if (ended && !ended_here)
    fatal_ = {fmt::format("the job was ended by {}", *ended), true};
  else if (!gone.empty())
    fatal_ = {gone, true};
}

NodeVerdict NodeWatch::check(int restart) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fatal_.fatal) return fatal_;
  if (generation_ > restart)
    return {fmt::format("another node's workers failed in generation {}", restart), false};
  return {};
}

bool NodeWatch::all_others_finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return others_finished_;
}

double NodeWatch::store_silent_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return clock_.seconds() - last_poll_s_;
}

std::string NodeWatch::all_others_silent(double seconds) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const double now = clock_.seconds();
  std::string silent;
  for (int node = 0; node < nnodes_; ++node) {
    if (silent_since_[node] < 0) continue;
    const double quiet = now - silent_since_[node];
    if (quiet < seconds) return "";
    silent += fmt::format("{}{} stopped answering: no heartbeat for {:.1f}s",
                          silent.empty() ? "" : "; ", silent_[node], quiet);
  }
  return silent;
}

int64_t NodeWatch::polls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return polls_;
}

std::string NodeWatch::describe_node(int node) const {
  const std::string& address = addresses_[node];
  return address.empty() ? fmt::format("node {}", node)
                         : fmt::format("node {} ({})", node, address);
}

}  // namespace ddp
