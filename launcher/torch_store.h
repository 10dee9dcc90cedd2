// PyTorch's own rendezvous store, served by ddprun (--torch-store): the c10d TCPStore
// protocol (the wire format of its TCPStore client: a query type byte, strings as a u64
// length and their bytes, replies as u64 lengths, i64 values or one status byte) of PyTorch
// 1.13 and of 2.x (which opens with a validate query carrying a magic number, numbers its
// query types from it, and pings), so that every rank connects as a client to a store already
// open (TORCHELASTIC_USE_AGENT_STORE, as torchrun's agent store) instead of rank 1 retrying
// until rank 0 has opened its own. Without a token, as torchrun's store is (PyTorch's clients
// give none), so that anyone who can reach it from another host, and any process of this host
// that runs as the job's user (or root; the kernel's table names a local peer's owner), is a
// client: no query may stop the server, and its memory and its time are
// bounded per client and in all (the bounds below), a client that does not read its replies
// being dropped rather than waited for.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "runtime/listener.h"
#include "runtime/socket.h"

namespace ddp {

// The largest key or value a query may carry; more drops that connection.
constexpr uint64_t kMaxTorchStoreValue = uint64_t{64} << 20;
// The bytes of every key and value held together; a set past it drops that connection.
// (torch's own clients store rendezvous records and NCCL ids: kilobytes.)
constexpr uint64_t kMaxTorchStoreBytes = uint64_t{256} << 20;
// Replies queued for one client: past this, its further queries wait unread until it has
// read what it was sent.
constexpr uint64_t kMaxTorchStoreReplyQueue = uint64_t{64} << 20;
// Bytes received and not yet answered plus replies not yet read, over all clients together;
// a client whose bytes pass it is dropped.
constexpr uint64_t kMaxTorchStoreBuffered = uint64_t{512} << 20;
// A client with replies waiting that reads none of them for this long is dropped.
constexpr double kTorchStoreStallSeconds = 10.0;
// Connections served at once; past it the longest-idle connection that never sent a whole
// query makes room, else the new one is closed (reported once per peer).
constexpr size_t kMaxTorchStoreClients = 4096;

// The keys every connection shares, and their bytes.
struct TorchStoreKeys {
  std::map<std::string, std::string> values;
  uint64_t bytes = 0;  // keys' and values' lengths summed
  uint64_t max_bytes = kMaxTorchStoreBytes;
};

// One connection's side of the protocol, pure: bytes in, replies out, over the shared keys.
class TorchStoreConnection {
 public:
  // Takes the bytes that arrived, answers complete queries (against `kv`) while the replies
  // stay under `room` bytes, and returns what to send back; the rest waits in the connection
  // for the next call (with no new bytes, once the peer has read). A WAIT for keys not all
  // set yet stays pending (answer_waits).
  std::string feed(const std::string& bytes, TorchStoreKeys& kv,
                   uint64_t room = kMaxTorchStoreReplyQueue);
  // The STOP_WAITING replies of pending waits whose keys are all set now.
  std::string answer_waits(const TorchStoreKeys& kv);
  // Set when the peer sent what this store cannot take (then close it): why, in a line.
  const std::string& error() const { return error_; }
  // Bytes received and not yet answered.
  uint64_t pending() const { return in_.size() - at_; }
  // Whether the peer has sent one whole query (a stranger that never has may be dropped).
  bool spoke() const { return spoke_; }

 private:
  bool parse_one(TorchStoreKeys& kv, std::string* out);
  // Sets key to value within kv's bound; false (and error_) past it.
  bool put(TorchStoreKeys& kv, const std::string& key, std::string value);
  std::string in_;
  size_t at_ = 0;  // the parse position in in_
  std::vector<std::vector<std::string>> waits_;
  bool first_ = true;
  bool torch2_ = false;  // PyTorch 2.x's query types (it opened with a validate query)
  bool spoke_ = false;
  std::string error_;
};

class TorchStoreServer {
 public:
  // Listens on bind_addr:port (0: a free port); throws UsageError naming the address when it
  // cannot. `on_refused` is told once per peer and kind of reason ("10.0.0.7: query type 42
  // ..."), for a bounded number of lines.
  // `stall_seconds`: how long a client with replies waiting may read none of them;
  // `max_clients`: connections served at once (the defaults are the bounds above).
  TorchStoreServer(const std::string& bind_addr, int port,
                   std::function<void(const std::string&)> on_refused,
                   double stall_seconds = kTorchStoreStallSeconds,
                   size_t max_clients = kMaxTorchStoreClients);
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
  RefusalLog refusals_;
  double stall_seconds_;
  size_t max_clients_;
};

}  // namespace ddp
