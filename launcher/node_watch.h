// One node's view of the other nodes of a multi-node job, kept through the rendezvous store
// by a thread of its own, so that ddprun's supervision loop never blocks on the network:
// this node's heartbeat, every other node's, the job's generation, and the job's end.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/store.h"
#include "runtime/timer.h"

namespace ddp {

// Store keys of a multi-node job, shared by every node's ddprun.
std::string node_beat_key(int node);      // "ddprun/beat/K": K's heartbeat counter
std::string node_address_key(int node);   // "ddprun/node/K/addr": "ADDR, ranks A-B" of node K
std::string node_finished_key(int node);  // "ddprun/finished/K": K's ddprun is exiting
constexpr const char* kJobEndedKey = "ddprun/ended";  // why a node ended the whole job
constexpr const char* kGenerationKey = "ddprun/generation";

struct NodeVerdict {
  std::string cause;   // "" while every node is well
  bool fatal = false;  // the job cannot go on (a node gone, the store lost, the job ended)
};

class NodeWatch {
 public:
  // `store` must outlive the watch (and is used from its thread; StoreClient serialises
  // calls). A node whose heartbeat has not moved for timeout_s (or that has not joined
  // timeout_s after the watch started) is gone.
  NodeWatch(StoreClient& store, int node_rank, int nnodes, double timeout_s);
  ~NodeWatch();  // stops the thread (interrupting a store call in flight)
  NodeWatch(const NodeWatch&) = delete;
  NodeWatch& operator=(const NodeWatch&) = delete;

  // Why this node must stop its workers in generation `restart`, if it must.
  NodeVerdict check(int restart) const;
  // Every other node that joined has said it is exiting (node_finished_key).
  bool all_others_finished() const;
  // How many polls have completed (a caller waits for one after a change it made).
  int64_t polls() const;
  // The store stopped answering: nothing more should be asked of it.
  bool store_lost() const { return store_lost_; }
  // Seconds since a poll of the store last completed (or since the watch started): a store
  // call in flight that long is one a failed node should not queue behind.
  double store_silent_s() const;
  // When every other node that joined and has not finished has sent no heartbeat for
  // `seconds`: those nodes, described ("node 1 (10.0.0.2, ranks 2-3) stopped answering: no
  // heartbeat for 6.1s"); else "" (one still beats, or none is left to wait for).
  std::string all_others_silent(double seconds) const;

 private:
  // "node K (address)" as K published it (watch thread only).
  std::string describe_node(int node) const;
  void loop();
  void poll_once(double now_s);

  StoreClient& store_;
  int node_rank_;
  int nnodes_;
  double timeout_s_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::atomic<bool> store_lost_{false};
  mutable std::mutex mutex_;
  NodeVerdict fatal_;       // under mutex_
  int64_t generation_ = 0;  // under mutex_
  bool others_finished_ = false;
  std::vector<int64_t> beats_;  // each node's last heartbeat seen
  std::vector<double> seen_s_;  // when it last moved (seconds since start)
  std::vector<bool> finished_;
  std::vector<bool> joined_;
  int64_t polls_ = 0;  // under mutex_
  Stopwatch clock_;
  double last_poll_s_ = 0;            // under mutex_
  std::vector<std::string> silent_;   // under mutex_: per node, "" or its description
  std::vector<double> silent_since_;  // under mutex_: when its heartbeat last moved
  std::vector<std::string> addresses_;
  std::thread thread_;
};

}  // namespace ddp
