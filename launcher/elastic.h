// Elastic membership (--nnodes MIN:MAX), as torchrun's c10d rendezvous gives it, through the
// rendezvous store: the job runs in generations; a generation closes once MAX nodes joined, or
// once MIN joined and no other came for the last-call wait; its nodes are numbered in the order
// they joined. A node that arrives after its generation closed is late: it says so, and the
// generation's nodes stop their workers and start the next one with it. A node whose workers
// fail, or that sees another's heartbeat stop, ends the generation; the others follow, and
// whoever comes back forms the next one (while at least MIN do). A node whose heartbeat stopped
// (its ddprun or host gone) is named as lost, apart from a failure: a lost node spends no
// restart. A node that waits for room in a full generation waits at most the timeout. Every
// generation gets fresh ranks and world sizes; a program that checkpoints resumes across them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/store.h"

namespace ddp {

// A generation as one node sees it.
struct Membership {
  int64_t generation = 0;
  int node_rank = 0;                   // the order it joined in
  int nnodes = 1;                      // the generation's nodes
  std::vector<std::string> addresses;  // each node's, by node rank
};

// How a generation ended, as the node that ended it said.
struct GenerationEnd {
  std::string why;          // "node 1 (10.0.0.2): rank 1 failed first: exit code 1"
  bool membership = false;  // a late node joins (not a failure: no restart is spent)
  bool lost = false;        // a node's heartbeat stopped (not a failure: no restart is spent)
};

// Beats for one node of one generation every 0.2 s, from a thread of its own on a connection
// of its own (`store`), until destroyed: a node that stops or restarts its workers (the grace
// period) goes on beating, so that only a node whose ddprun or host is gone falls silent. When
// the store cannot be reached it stops quietly (the node's own calls report that); destroying
// it interrupts a call in flight, so that a store that no longer answers never holds it.
class Heartbeat {
 public:
  Heartbeat(std::unique_ptr<StoreClient> store, int64_t generation, int node_rank);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  std::unique_ptr<StoreClient> store_;
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread thread_;
};

class ElasticRendezvous {
 public:
  // `store` outlives it. last_call_s: how long a generation with MIN nodes waits for more;
  // timeout_s: how long a node waits for MIN nodes, and how long a silent heartbeat is
  // trusted.
  ElasticRendezvous(StoreClient& store, int min_nodes, int max_nodes, double last_call_s,
                    double timeout_s, std::string address);

  // Joins the open generation (at least `after` + 1 when given): returns once one closed with
  // this node in it, waiting through any that closed without it. false: the job finished
  // while this node waited. Throws ddp::Error when fewer than MIN nodes joined in timeout_s,
  // or when it came late and no generation made room for it in timeout_s; UsageError when the
  // job's first node gave another MIN:MAX (checked once, at the first join).
  // `between` runs between polls (it may throw: a signal that ends the wait).
  bool join(Membership* membership, int64_t after, const std::function<void()>& between);
  // While `m` runs (called often; it talks to the store at most every 0.2 s): this node's
  // heartbeat, and why it must stop its workers, or "": a late node waits, another node ended
  // the generation, a member's heartbeat stopped for timeout_s.
  std::string check(const Membership& m);
  // The node check() last declared silent ("node 1 (10.0.0.2)"), or "".
  const std::string& silent_node() const { return silent_node_; }
  // After this node's workers failed: whether another member of `m` is gone. Beats for this
  // node while it watches; returns "node K (ADDRESS)" of the first member whose heartbeat did
  // not move for `window_s`, or "" as soon as every other member's has moved (or finished).
  std::string lost_member(const Membership& m, double window_s);
  // Ends `m`'s generation (the first to call moves the job to the next one).
  void end(const Membership& m, const GenerationEnd& end);
  // How `m`'s generation ended (after end()).
  GenerationEnd ended(const Membership& m);
  // This node's workers of `m` finished; true once every node of `m` has said so (the last
  // one marks the job done, so that a late node stops waiting).
  bool finish(const Membership& m);
  bool all_finished(const Membership& m);

 private:
  std::string key(int64_t generation, const std::string& what) const;
  int64_t count(const std::string& key) { return store_.add(key, 0); }
  void check_same_nnodes();

  StoreClient& store_;
  int min_nodes_, max_nodes_;
  double last_call_s_, timeout_s_;
  std::string address_;
  double last_check_s_ = -1;
  std::vector<int64_t> beats_;       // each member's last heartbeat seen (check)
  std::vector<double> beat_seen_s_;  // when it last moved
  std::string silent_node_;
  bool nnodes_checked_ = false;
};

}  // namespace ddp
