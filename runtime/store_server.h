// The rendezvous store server that ddprun hosts (and, under srun without ddprun, rank 0's
// ddp::init): a TCP key-value store on one thread with poll(). Who may enter: a process of
// this host must run as this store's user (or root; the socket's owner, as the kernel lists
// it), and every client must present the job's token and the run's id first, in a small
// hello frame and within a deadline, or is dropped; unauthenticated connections are capped;
// a malformed or oversized message drops that connection only, and the server goes on
// serving. Its bounds: a message of at most kMaxStoreMessageBytes, the keys and values held
// at most kMaxStoreBytes together (a set past it is refused, the connection kept), the bytes of
// unfinished messages at most kMaxStoreBuffered over every client together (the client whose
// bytes would pass it is dropped), at most kMaxStoreClients connections, and a client that
// reads none of a reply for kStoreStallSeconds is dropped. Each refused peer is reported once
// (address and reason) through on_refused.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/listener.h"
#include "runtime/socket.h"

namespace ddp {

// Before authentication a frame may be at most this long (a hello is a few dozen bytes).
constexpr size_t kMaxHelloBytes = 4096;
// The bytes of every key and value held together (ranks store addresses and NCCL ids:
// kilobytes); a set past it is refused with kTooLarge.
constexpr uint64_t kMaxStoreBytes = uint64_t{256} << 20;
// The bytes of messages received but not yet whole, over every client together (the torch
// store's bound): each client may leave two frames unfinished, so many clients could otherwise
// hold the server's memory at many times what it keeps.
constexpr uint64_t kMaxStoreBuffered = uint64_t{512} << 20;
// Connections served at once; past it a new one is closed at once (reported).
constexpr size_t kMaxStoreClients = 4096;
// A client that reads nothing of a reply for this long is dropped.
constexpr double kStoreStallSeconds = 10.0;

struct StoreServerConfig {
  std::string bind_addr = "127.0.0.1";  // loopback for single-node jobs
  int port = 0;                         // 0: pick a free port
  std::string token;
  // The run's id (TORCHELASTIC_RUN_ID, or srun's "slurm-JOB.STEP"); a hello of another run is
  // refused, naming both (one that names none comes in on the token alone). Empty: any.
  std::string run_id;
  // Refuse a process of this host that runs as another user (tests turn it off).
  bool check_peer_user = true;
  // Under Slurm: admit only processes that MUNGE vouches for as this store's user (or root),
  // with a credential of run_id (munged at munge_socket; "": libmunge's default).
  bool require_munge = false;
  std::string munge_socket;
  // Where bind_addr and port came from, for the errors that name them.
  ListenOrigin origin;
  // The bytes of keys and values held together (a set past it is refused).
  uint64_t max_bytes = kMaxStoreBytes;
  // The bytes of unfinished messages over every client together (past it, that client goes).
  uint64_t max_buffered = kMaxStoreBuffered;
  double hello_timeout_s = 10;      // an unauthenticated connection is closed after this
  size_t max_unauthenticated = 64;  // more waiting for their hello are refused at once
  // Called on the server thread, once per (peer address, reason): "1.2.3.4: wrong token".
  std::function<void(const std::string&)> on_refused;
};

class StoreServer {
 public:
  // Binds and listens; throws UsageError naming the address and port when it cannot (port
  // in use, address not local). Serving starts with start().
  explicit StoreServer(const StoreServerConfig& config);
  ~StoreServer();  // stops the thread
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // The address it listens on ("0.0.0.0": every interface).
  const std::string& bind_address() const { return config_.bind_addr; }
  void start();
  void stop();
  // Drops every key but the launchers' own ("ddprun/...") for a restarted job; connections
  // stay.
  void clear();
  size_t dropped_connections() const { return dropped_.load(); }

 private:
  void serve();
  void refuse(const std::string& peer, const std::string& reason);
  // Why a hello's MUNGE credential does not admit it ("" when it does).
  std::string munge_refusal(const std::string& credential) const;

  StoreServerConfig config_;
  UniqueFd listen_fd_;
  WakePipe wake_;  // wakes poll() for stop()
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::atomic<size_t> dropped_{0};
  std::mutex mutex_;  // guards data_ against clear() from another thread
  std::map<std::string, std::string> data_;
  uint64_t data_bytes_ = 0;  // keys' and values' lengths in data_
  RefusalLog refusals_;      // what was reported (server thread)
};

}  // namespace ddp
