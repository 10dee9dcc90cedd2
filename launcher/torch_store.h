// PyTorch's own rendezvous store, served by ddprun (--torch-store): the c10d TCPStore
// protocol (the wire format of its TCPStore client: a query type byte, strings as a u64
// length and their bytes, replies as u64 lengths, i64 values or one status byte) of PyTorch
// 1.13 and of 2.x (which opens with a validate query carrying a magic number, numbers its
// query types from it, and pings), so that every rank connects as a client to a store already
// open (TORCHELASTIC_USE_AGENT_STORE, as torchrun's agent store) instead of rank 1 retrying
// until rank 0 has opened its own. Unauthenticated, as torchrun's store is: ddprun serves it on
// loopback only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "launcher/listener.h"
#include "runtime/socket.h"

namespace ddp {

// The largest key or value a query may carry; more drops that connection.
constexpr uint64_t kMaxTorchStoreValue = uint64_t{64} << 20;
// Connections served at once; more are closed as they come (reported once per peer).
constexpr size_t kMaxTorchStoreClients = 4096;

// One connection's side of the protocol, pure: bytes in, replies out, over the shared keys.
class TorchStoreConnection {
 public:
  // Takes the bytes that arrived, answers every complete query (against `kv`), and returns
  // what to send back. A WAIT for keys not all set yet stays pending (answer_waits).
  std::string feed(const std::string& bytes, std::map<std::string, std::string>& kv);
  // The STOP_WAITING replies of pending waits whose keys are all set now.
  std::string answer_waits(const std::map<std::string, std::string>& kv);
  // Set when the peer sent what this store cannot take (then close it): why, in a line.
  const std::string& error() const { return error_; }

 private:
  bool parse_one(std::map<std::string, std::string>& kv, std::string* out);
  std::string in_;
  size_t at_ = 0;  // the parse position in in_
  std::vector<std::vector<std::string>> waits_;
  bool first_ = true;
  bool torch2_ = false;  // PyTorch 2.x's query types (it opened with a validate query)
  std::string error_;
};

class TorchStoreServer {
 public:
  // Listens on bind_addr:port (0: a free port); throws UsageError naming the address when it
  // cannot. `on_refused` is told once per peer and reason ("10.0.0.7: query type 42 ...").
  TorchStoreServer(const std::string& bind_addr, int port,
                   std::function<void(const std::string&)> on_refused);
  ~TorchStoreServer();
  TorchStoreServer(const TorchStoreServer&) = delete;
  TorchStoreServer& operator=(const TorchStoreServer&) = delete;
  int port() const { return port_; }
  void start();
  void stop();

 private:
  void serve();
  UniqueFd listen_fd_;
  WakePipe wake_;  // wakes poll() for stop()
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::function<void(const std::string&)> on_refused_;
};

}  // namespace ddp
