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
// so by name (the hello of version 1 had none).
constexpr uint32_t kStoreProtocolVersion = 2;
// A request's operation and its fields.
enum class StoreOp : uint8_t {
  kHello = 1,   // str token, u32 version           -> ok | unauthorized | version (then closed)
  kSet = 2,     // str key, str value                -> ok
  kGet = 3,     // str key                           -> ok + str value | missing
  kWait = 4,    // u32 n, n x str key, i64 timeout_ms -> ok | timeout + u32 m, m x missing key
  kAdd = 5,     // str key, i64 delta                -> ok + i64 new value
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
};

// A connection to the launcher's rendezvous store (the top of this file).
class StoreClient {
 public:
  // Connects (retrying until connect_timeout_s) and presents the token. Every call then
  // throws ddp::Error when the server has not answered within reply_timeout_s (a wait:
  // its own timeout plus that), and ConnectionClosed when the server has gone.
  StoreClient(const std::string& host, int port, const std::string& token,
              double connect_timeout_s = 30.0, double reply_timeout_s = 40.0);

  // Sets key to value (every waiter on it returns).
  void set(const std::string& key, const std::string& value);
  // The value, or nullopt when the key is not set. Does not block.
  std::optional<std::string> get(const std::string& key);
  // Blocks until every key is set or timeout_s passes; throws ddp::Error naming the keys
  // still missing on timeout.
  void wait(const std::vector<std::string>& keys, double timeout_s);
  // wait({key}) then get(key).
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
  // The reply timeout calls are made with now (seconds).
  double reply_timeout() const { return reply_timeout_s_; }

 private:
  std::string round_trip(const MessageWriter& request, double reply_within_s);

  std::string address_;
  std::atomic<double> reply_timeout_s_;
  std::atomic<bool> interrupted_{false};
  UniqueFd fd_;
  std::timed_mutex mutex_;  // one request in flight per connection
};

}  // namespace ddp
