// ElasticRendezvous: the generations' keys in the store, "ddprun/elastic/...":
//   gen                   the open generation (a counter; a generation ends by moving it on)
//   done                  set when every node of a generation finished its workers
//   G/joined              how many joined generation G (each node's join index: its rank)
//   G/addr/K              node K's address
//   G/vote, G/closed      the first to see G complete votes and writes how many it took
//   G/late                nodes that came after G closed (G's nodes then restart with them)
//   G/ended, G/why, G/kind  the first end() of G, its reason and kind (membership, failure,
//                           lost)
//   G/beat/K, G/finished  node K's heartbeat; how many finished G's workers
#include "launcher/elastic.h"

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/parse.h"
#include "runtime/timer.h"

namespace ddp {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void pause() {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

Heartbeat::Heartbeat(std::unique_ptr<StoreClient> store, int64_t generation, int node_rank)
    : store_(std::move(store)) {
  const std::string beat = fmt::format("ddprun/elastic/{}/beat/{}", generation, node_rank);
  thread_ = std::thread([this, beat] {
    try {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!stopping_) {
        lock.unlock();
        store_->add(beat, 1);
        lock.lock();
        stop_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping_; });
      }
    } catch (const std::exception&) {
      // The store is gone or cut off: the node's own calls say so.
    }
  });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  store_->interrupt();  // a beat the store does not answer returns at once
  thread_.join();
}

ElasticRendezvous::ElasticRendezvous(StoreClient& store, int min_nodes, int max_nodes,
                                     double last_call_s, double timeout_s, std::string address)
    : store_(store),
      min_nodes_(min_nodes),
      max_nodes_(max_nodes),
      last_call_s_(last_call_s),
      timeout_s_(timeout_s),
      address_(std::move(address)) {}

std::string ElasticRendezvous::key(int64_t generation, const std::string& what) const {
  return fmt::format("ddprun/elastic/{}/{}", generation, what);
}

// The job's --nnodes is the first node's: a node that gives another is refused before it joins
// (admitted, it would close generations at its own MIN and MAX, not the job's).
void ElasticRendezvous::check_same_nnodes() {
  if (nnodes_checked_) return;
  const std::string mine = fmt::format("{}:{}", min_nodes_, max_nodes_);
  if (store_.add("ddprun/elastic/nnodes-first", 1) == 1) store_.set("ddprun/elastic/nnodes", mine);
  const std::string jobs = store_.wait_get("ddprun/elastic/nnodes", timeout_s_);
  if (jobs != mine)
    throw UsageError(
        fmt::format("--nnodes {}: the job's nodes were started with --nnodes {}; "
                    "every node of an elastic job must give the same MIN:MAX",
                    mine, jobs));
  nnodes_checked_ = true;
}

bool ElasticRendezvous::join(Membership* m, int64_t after, const std::function<void()>& between) {
  check_same_nnodes();
  int64_t g = std::max(count("ddprun/elastic/gen"), after + 1);
  while (true) {
    const int rank = static_cast<int>(store_.add(key(g, "joined"), 1) - 1);
    store_.set(key(g, fmt::format("addr/{}", rank)), address_);
    Stopwatch waited;
    double complete_at = -1;  // when this node first saw MIN nodes
    bool late = false;
    double late_at = 0;  // when it found G closed without it
    while (true) {
      between();
      if (store_.get("ddprun/elastic/done")) return false;
      if (const std::optional<std::string> closed = store_.get(key(g, "closed"))) {
        const int n = parse_number<int>(*closed).value_or(0);
        if (rank < n) {
          m->generation = g;
          m->node_rank = rank;
          m->nnodes = n;
          m->addresses.clear();
          for (int k = 0; k < n; ++k)
            m->addresses.push_back(store_.get(key(g, fmt::format("addr/{}", k))).value_or("?"));
          beats_.assign(static_cast<size_t>(n), -1);
          beat_seen_s_.assign(static_cast<size_t>(n), now_s());
          last_check_s_ = -1;
          return true;
        }
        // Too late for G: say so (its nodes restart with this one), and wait for G + 1.
        if (!late) store_.add(key(g, "late"), 1), late_at = waited.seconds();
        late = true;
        if (count("ddprun/elastic/gen") > g) break;
        if (waited.seconds() - late_at >= timeout_s_)
          throw Error(fmt::format(
              "--nnodes {}:{}: generation {} closed with {} node{} before this one came{}, and "
              "made no room for it within {:.0f}s (--timeout)",
              min_nodes_, max_nodes_, g, n, n == 1 ? "" : "s",
              n >= max_nodes_ ? " (the most --nnodes allows)" : "", timeout_s_));
        pause();
        continue;
      }
      const int64_t joined = count(key(g, "joined"));
      if (joined >= min_nodes_ && complete_at < 0) complete_at = waited.seconds();
      const bool full = joined >= max_nodes_;
      const bool called = complete_at >= 0 && waited.seconds() - complete_at >= last_call_s_;
      if ((full || called) && store_.add(key(g, "vote"), 1) == 1)
        store_.set(key(g, "closed"),
                   std::to_string(std::min<int64_t>(count(key(g, "joined")), max_nodes_)));
      if (complete_at < 0 && waited.seconds() >= timeout_s_)
        throw Error(fmt::format(
            "--nnodes {}:{}: {} of at least {} nodes joined generation {} within {:.0f}s "
            "(--timeout); are the other nodes' ddprun running with the same --rdzv-endpoint?",
            min_nodes_, max_nodes_, joined, min_nodes_, g, timeout_s_));
      pause();
    }
    g = count("ddprun/elastic/gen");
  }
}

std::string ElasticRendezvous::check(const Membership& m) {
  const double now = now_s();
  if (last_check_s_ >= 0 && now - last_check_s_ < 0.2) return "";
  last_check_s_ = now;
  const int64_t g = m.generation;
  if (count("ddprun/elastic/gen") > g) {
    const GenerationEnd e = ended(m);
    return e.why.empty() ? "another node ended the generation" : e.why;
  }
  // (A late node waits for room: none while the generation has MAX nodes.)
  if (const int64_t late = m.nnodes < max_nodes_ ? count(key(g, "late")) : 0; late > 0)
    return fmt::format("{} node{} waiting to join: restarting the group with {}", late,
                       late == 1 ? "" : "s", late == 1 ? "it" : "them");
  store_.add(key(g, fmt::format("beat/{}", m.node_rank)), 1);
  for (int k = 0; k < m.nnodes; ++k) {
    if (k == m.node_rank) continue;
    const int64_t beat = count(key(g, fmt::format("beat/{}", k)));
    if (beat != beats_[k]) {
      beats_[k] = beat;
      beat_seen_s_[k] = now;
    } else if (now - beat_seen_s_[k] > timeout_s_ &&
               count(key(g, "finished")) == 0) {  // a node done with its work stops beating
      silent_node_ = fmt::format("node {} ({})", k, m.addresses[k]);
      return fmt::format("{} stopped answering for {:.0f}s (--timeout)", silent_node_, timeout_s_);
    }
  }
  return "";
}

std::string ElasticRendezvous::lost_member(const Membership& m, double window_s) {
  const int64_t g = m.generation;
  std::vector<int64_t> first(static_cast<size_t>(m.nnodes), -1);
  std::vector<bool> moved(static_cast<size_t>(m.nnodes), false);
  moved[static_cast<size_t>(m.node_rank)] = true;
  Stopwatch watched;
  while (true) {
    store_.add(key(g, fmt::format("beat/{}", m.node_rank)), 1);
    if (count(key(g, "finished")) > 0) return "";  // a node done with its work stops beating
    bool all = true;
    for (int k = 0; k < m.nnodes; ++k) {
      if (moved[k]) continue;
      const int64_t beat = count(key(g, fmt::format("beat/{}", k)));
      if (first[k] < 0) first[k] = beat;
      moved[k] = beat != first[k];
      all = all && moved[k];
    }
    if (all) return "";
    if (watched.seconds() >= window_s)
      for (int k = 0; k < m.nnodes; ++k)
        if (!moved[k]) return fmt::format("node {} ({})", k, m.addresses[k]);
    pause();
  }
}

void ElasticRendezvous::end(const Membership& m, const GenerationEnd& e) {
  const int64_t g = m.generation;
  if (store_.add(key(g, "ended"), 1) != 1) return;
  store_.set(key(g, "why"), e.why);
  store_.set(key(g, "kind"), e.membership ? "membership" : e.lost ? "lost" : "failure");
  store_.add("ddprun/elastic/gen", 1);
}

GenerationEnd ElasticRendezvous::ended(const Membership& m) {
  GenerationEnd e;
  Stopwatch waited;  // the ender writes its reason just before it moves the generation on
  while (!store_.get(key(m.generation, "kind")) && waited.seconds() < 2)
    pause();
  e.why = store_.get(key(m.generation, "why")).value_or("");
  const std::string kind = store_.get(key(m.generation, "kind")).value_or("");
  e.membership = kind == "membership";
  e.lost = kind == "lost";
  return e;
}

bool ElasticRendezvous::finish(const Membership& m) {
  if (store_.add(key(m.generation, "finished"), 1) < m.nnodes) return false;
  store_.set("ddprun/elastic/done", "1");
  return true;
}

bool ElasticRendezvous::all_finished(const Membership& m) {
  return count(key(m.generation, "finished")) >= m.nnodes;
}

}  // namespace ddp
