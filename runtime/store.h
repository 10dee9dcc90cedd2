// The rendezvous store client: a TCP key-value store served by ddprun (or by any process
// through launcher/StoreServer). Every connection first presents the job's token.
// Each call is a blocking round trip; calls from several threads are serialised.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/socket.h"

namespace ddp {

// Wire protocol, shared with the server. Request: u8 op, then fields; reply: u8 status, then
// fields. Strings are u32 length + bytes, integers little-endian.
// The protocol's version, carried by the hello, so that a ddp of another version is told
// so by name (the hello of version 1 had none; version 3's carries the run's id).
constexpr uint32_t kStoreProtocolVersion = 3;
// A request's operation and its fields.
enum class StoreOp : uint8_t {
  // str token, u32 version, str run id, str MUNGE credential ("": none)
  //   -> ok | unauthorized + str why | version + u32 | other run + str (those three: closed)
  kHello = 1,
  kSet = 2,     // str key, str value                -> ok | too large
  kGet = 3,     // str key                           -> ok + str value | missing
  kWait = 4,    // u32 n, n x str key, i64 timeout_ms -> ok | timeout + u32 m, m x missing key
  kAdd = 5,     // str key, i64 delta                -> ok + i64 new value | too large
  kDelete = 6,  // str key                           -> ok | missing
};
// A reply's status.
enum class StoreStatus : uint8_t {
  kOk = 0,
  kMissing = 1,
  kTimeout = 2,
  kBadRequest = 3,
  kUnauthorized = 4,  // the hello's token is not the job's: said once, then the store hangs up
  kVersion = 5,       // the hello's protocol version is not the store's: + u32 the store's
  kOtherRun = 6,      // the hello's run id is not the store's: + str the store's
  kTooLarge = 7,      // the set would pass the store's bound on what it holds: + i64 the bound
};

// Which protocol the store speaks: ddp's own (ddprun's and srun's: a token first, then the
// requests above), or PyTorch's TCPStore (torchrun's agent store: PyTorch 1.13's query
// numbers or 2.x's, which open with a validate query; which one is found by asking).
enum class StoreProtocol { kDdp, kTorch };

// A connection to the launcher's rendezvous store (the top of this file).
class StoreClient {
 public:
  // Connects (retrying until connect_timeout_s) and presents the token and the run's id
  // (`run_id`: ProcessEnv::run_id; a store of another run refuses it, a UsageError naming
  // both; "" names none and is let in on the token alone) and `credential`, a MUNGE
  // credential of the run's id ("": none; a store under Slurm may demand one). Every call then
  // throws ddp::Error when the server has not answered within reply_timeout_s (a wait: its own
  // timeout plus that), and ConnectionClosed when the server has gone.
  StoreClient(const std::string& host, int port, const std::string& token,
              double connect_timeout_s = 30.0, double reply_timeout_s = 40.0,
              const std::string& run_id = "", const std::string& credential = "");
  // A client of PyTorch's TCPStore (`protocol` kTorch) at host:port: no token; every key this
  // process sets or reads is `key_prefix` + its name, so that a torchrun agent's own keys and
  // an earlier attempt's stay apart. `torch2_first`: try 2.x's protocol first (a wrong guess
  // costs a few seconds). A store that speaks neither is a ddp::Error saying so.
  StoreClient(StoreProtocol protocol, const std::string& host, int port,
              const std::string& key_prefix, bool torch2_first, double connect_timeout_s = 30.0,
              double reply_timeout_s = 40.0);
  // The protocol it speaks.
  StoreProtocol protocol() const { return protocol_; }
  // With PyTorch's (kTorch): whether the store answered PyTorch 2.x's dialect.
  bool torch2() const { return torch2_; }

  // Sets key to value (every waiter on it returns).
  void set(const std::string& key, const std::string& value);
  // The value, or nullopt when the key is not set. Does not block.
  std::optional<std::string> get(const std::string& key);
  // Blocks until every key is set or timeout_s passes; throws ddp::Error naming the keys
  // still missing on timeout.
  void wait(const std::vector<std::string>& keys, double timeout_s);
  // wait({key}) then get(key), both within timeout_s (the value's reply gets at least 1 s).
  std::string wait_get(const std::string& key, double timeout_s);
  // Adds delta to the integer at key (0 when unset); returns the new value. Atomic.
  int64_t add(const std::string& key, int64_t delta);
  // Removes key; returns whether it existed.
  bool remove(const std::string& key);
  // The keys of `keys` that are not set, without waiting.
  std::vector<std::string> missing(const std::vector<std::string>& keys);

  // The store's "host:port", as connected to.
  const std::string& address() const { return address_; }
  // This end's "address:port": the address by which this host reaches the store.
  std::string local_address() const;
  // From another thread: a call blocked on the server returns (throwing) at once, and so
  // does every later call. Safe while a call is in flight.
  void interrupt();
  // The reply timeout of the calls made from now on (seconds; a wait adds its own timeout).
  // A call also waits at most that long for a call in flight on another thread to return.
  void set_reply_timeout(double seconds) { reply_timeout_s_ = seconds; }
  // Who serves the store, for the message when it hangs up ("rank 0, which serves it,";
  // ddprun's node 0 by default).
  void set_server_description(const std::string& who) { server_ = who; }
  // The reply timeout calls are made with now (seconds).
  double reply_timeout() const { return reply_timeout_s_; }

 private:
  std::string round_trip(const MessageWriter& request, double reply_within_s);
  // Throws a UsageError naming key when the reply says the store refused to hold it.
  void check_room(const std::string& reply, const std::string& key, size_t bytes);
  // PyTorch's TCPStore (runtime/store_torch.cpp): one query's bytes, then a reply of
  // `reply_bytes` (0: none) or, `sized`, a u64 length and that many bytes.
  std::string torch_query(uint8_t type, const std::string& fields, size_t reply_bytes, bool sized,
                          double reply_within_s);
  // Whether the store answers PyTorch 2.x's protocol (`torch2`) or 1.13's within `within_s`,
  // on a connection of its own made here.
  bool torch_probe(const std::string& host, int port, bool torch2, double within_s);
  uint8_t torch_type(uint8_t v113) const;  // 1.13's query number in this store's numbering
  bool torch_ready(const std::vector<std::string>& keys, double reply_within_s);
  void torch_set(const std::string& key, const std::string& value);
  std::optional<std::string> torch_get(const std::string& key, double reply_within_s);
  // get(), its reply awaited at most reply_within_s.
  std::optional<std::string> get_within(const std::string& key, double reply_within_s);
  void torch_wait(const std::vector<std::string>& keys, double timeout_s);
  int64_t torch_add(const std::string& key, int64_t delta);
  bool torch_remove(const std::string& key);
  bool torch() const { return protocol_ == StoreProtocol::kTorch; }
  std::string torch_key(const std::string& key) const { return key_prefix_ + key; }

  std::string address_;
  StoreProtocol protocol_ = StoreProtocol::kDdp;
  bool torch2_ = false;
  std::string key_prefix_;
  std::string server_ = "the ddprun that serves it (node 0)";
  std::atomic<double> reply_timeout_s_;
  std::atomic<bool> interrupted_{false};
  UniqueFd fd_;
  std::timed_mutex mutex_;  // one request in flight per connection
};

}  // namespace ddp
