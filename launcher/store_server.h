// The rendezvous store server that ddprun hosts: a TCP key-value store on one thread with
// poll(). A client must present the job's token first or is dropped; a malformed or
// oversized message drops that connection only, and the server goes on serving.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/socket.h"

namespace ddp {

struct StoreServerConfig {
  std::string bind_addr = "127.0.0.1";  // loopback for single-node jobs
  int port = 0;                         // 0: pick a free port
  std::string token;
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
  void start();
  void stop();
  // Drops every key (a fresh generation for a restarted job); connections stay.
  void clear();
  size_t dropped_connections() const { return dropped_.load(); }

 private:
  void serve();

  StoreServerConfig config_;
  UniqueFd listen_fd_;
  UniqueFd wake_read_;  // a pipe that wakes poll() for stop()
  UniqueFd wake_write_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::atomic<size_t> dropped_{0};
  std::mutex mutex_;  // guards data_ against clear() from another thread
  std::map<std::string, std::string> data_;
};

}  // namespace ddp
