// The rendezvous store server that ddprun hosts (and, under srun without ddprun, rank 0's
// ddp::init): a TCP key-value store on one thread with
// poll(). A client must present the job's token first, in a small hello frame and within
// a deadline, or is dropped; unauthenticated connections are capped; a malformed or
// oversized message drops that connection only, and the server goes on serving. Each
// refused peer is reported once (address and reason) through on_refused.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/listener.h"
#include "runtime/socket.h"

namespace ddp {

struct StoreServerConfig {
  std::string bind_addr = "127.0.0.1";  // loopback for single-node jobs
  int port = 0;                         // 0: pick a free port
  std::string token;
  double hello_timeout_s = 10;      // an unauthenticated connection is closed after this
  size_t max_unauthenticated = 64;  // more waiting for their hello are refused at once
  // Called on the server thread, once per (peer address, reason): "1.2.3.4: wrong token".
  std::function<void(const std::string&)> on_refused;
};

// Before authentication a frame may be at most this long (a hello is a few dozen bytes).
constexpr size_t kMaxHelloBytes = 4096;

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

  StoreServerConfig config_;
  UniqueFd listen_fd_;
  WakePipe wake_;  // wakes poll() for stop()
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::atomic<size_t> dropped_{0};
  std::mutex mutex_;  // guards data_ against clear() from another thread
  std::map<std::string, std::string> data_;
  RefusalLog refusals_;  // what was reported (server thread)
};

}  // namespace ddp
