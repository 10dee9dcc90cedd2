// StoreClient's PyTorch side: the TCPStore protocol of 1.13 and 2.x as a client (the wire
// format launcher/torch_store.h serves: a query type byte, strings as a u64 length and their
// bytes, integers as u64 little-endian; replies are u64 values, sized strings or one status
// byte; a set has no reply). PyTorch 2.x opens each connection with a validate query
// carrying its magic number and numbers its queries from it.
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "runtime/error.h"
#include "runtime/store.h"
#include "runtime/torch_wire.h"

namespace ddp {
namespace {

// 1.13's query numbers (2.x's are one more, its 0 being the validate query).
constexpr uint8_t kSet = 0, kGet = 2, kAdd = 3, kCheck = 4, kGetNumKeys = 6, kDeleteKey = 8;
constexpr uint8_t kReady = 0;
// How long a guess of the protocol waits for its answer before the other is tried.
constexpr double kProbeSeconds = 3.0;

using torch_wire::get_u64;
using torch_wire::kTorch2Magic;
using torch_wire::put_bytes;
using torch_wire::put_u64;

std::string validate_query() {
  std::string q(1, '\0');
  for (int i = 0; i < 4; ++i)
    q.push_back(static_cast<char>((kTorch2Magic >> (8 * i)) & 0xff));
  return q;
}

}  // namespace

uint8_t StoreClient::torch_type(uint8_t v113) const {
  // 2.x inserted VALIDATE before SET and has no WATCH_KEY (7): DELETE_KEY is 8 in both.
  return torch2_ && v113 < kDeleteKey ? static_cast<uint8_t>(v113 + 1) : v113;
}

bool StoreClient::torch_probe(const std::string& host, int port, bool torch2, double within_s) {
  // The store's key count, asked in one protocol: a store of the other never answers it (a
  // 1.13 store reads 2.x's validate as the start of a set and waits for the rest; a 2.x store
  // refuses a first query that is no validate, or waits for what 1.13's numbers mean there),
  // and closing the connection frees it.
  fd_ = tcp_connect(host, port, deadline_in(within_s));
  std::string probe = torch2 ? validate_query() : std::string();
  probe.push_back(static_cast<char>(torch2 ? kGetNumKeys + 1 : kGetNumKeys));
  try {
    write_all(fd_.get(), probe.data(), probe.size());
    char reply[8];
    if (read_exact(fd_.get(), reply, sizeof(reply), deadline_in(kProbeSeconds))) {
      torch2_ = torch2;
      return true;
    }
  } catch (const Error&) {  // closed: not this protocol
  }
  fd_ = UniqueFd();
  return false;
}

StoreClient::StoreClient(StoreProtocol protocol, const std::string& host, int port,
                         const std::string& key_prefix, bool torch2_first, double connect_timeout_s,
                         double reply_timeout_s)
    : address_(fmt::format("{}:{}", host, port)),
      protocol_(protocol),
      key_prefix_(key_prefix),
      reply_timeout_s_(reply_timeout_s) {
  DDP_CHECK(protocol == StoreProtocol::kTorch, "this constructor is PyTorch's store's");
  // The first connection may wait for the store to open; the guesses then take it as it is.
  (void)tcp_connect(host, port, deadline_in(connect_timeout_s));
  if (torch_probe(host, port, torch2_first, connect_timeout_s) ||
      torch_probe(host, port, !torch2_first, connect_timeout_s))
    return;
  throw Error(fmt::format(
      "the store at {} (torchrun's, MASTER_ADDR:MASTER_PORT) answers neither PyTorch 1.13's nor "
      "2.x's TCPStore protocol within {:.0f}s",
      address_, kProbeSeconds));
}

std::string StoreClient::torch_query(uint8_t type, const std::string& fields, size_t reply_bytes,
                                     bool sized, double reply_within_s) {
  const Deadline deadline = deadline_in(reply_within_s);
  std::unique_lock<std::timed_mutex> lock(mutex_, std::defer_lock);
  if (!lock.try_lock_until(deadline))
    throw Error(fmt::format(
        "the store at {} did not answer within {:.0f}s (another call still waits on it)", address_,
        reply_within_s));
  std::string query(1, static_cast<char>(torch_type(type)));
  query += fields;
  try {
    write_all(fd_.get(), query.data(), query.size());
    std::string reply(sized ? 8 : reply_bytes, '\0');
    if (!reply.empty() && !read_exact(fd_.get(), reply.data(), reply.size(), deadline))
      throw Error(
          fmt::format("the store at {} did not answer within {:.0f}s", address_, reply_within_s));
    if (!sized) return reply;
    const uint64_t n = get_u64(reply);
    DDP_CHECK(n <= kMaxStoreMessageBytes, "the store at {} sent a value of {} bytes", address_, n);
    std::string value(n, '\0');
    if (n > 0 && !read_exact(fd_.get(), value.data(), n, deadline))
      throw Error(fmt::format(
          "the store at {} announced a value of {} bytes and did not send it all within {:.1f}s",
          address_, n, reply_within_s));
    return value;
  } catch (const ConnectionClosed&) {
    if (interrupted_) throw Error(fmt::format("rendezvous store at {}: interrupted", address_));
    throw ConnectionClosed(fmt::format(
        "the store at {} closed the connection: the torchrun that serves it has ended", address_));
  }
}

bool StoreClient::torch_ready(const std::vector<std::string>& keys, double reply_within_s) {
  std::string fields;
  put_u64(&fields, keys.size());
  for (const std::string& key : keys)
    put_bytes(&fields, torch_key(key));
  return static_cast<uint8_t>(torch_query(kCheck, fields, 1, false, reply_within_s)[0]) == kReady;
}

void StoreClient::torch_set(const std::string& key, const std::string& value) {
  std::string fields;
  put_bytes(&fields, torch_key(key));
  put_bytes(&fields, value);
  torch_query(kSet, fields, 0, false, reply_timeout_s_);
}

std::optional<std::string> StoreClient::torch_get(const std::string& key, double reply_within_s) {
  // PyTorch's GET of a key not set waits (2.x) or drops the connection (1.13): asked first.
  if (!torch_ready({key}, reply_within_s)) return std::nullopt;
  std::string fields;
  put_bytes(&fields, torch_key(key));
  return torch_query(kGet, fields, 0, true, reply_within_s);
}

void StoreClient::torch_wait(const std::vector<std::string>& keys, double timeout_s) {
  // Polled with CHECK, so that a timeout leaves no answer pending on the connection.
  const Deadline deadline = deadline_in(timeout_s);
  // Each poll's reply within the wait's time left (and a second): a store that answers short
  // or late must not hold the caller a whole reply timeout past the wait's own.
  const auto within = [&] {
    const double left =
        std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    return std::min<double>(reply_timeout_s_, std::max(0.0, left) + 1.0);
  };
  auto pause = std::chrono::milliseconds(1);
  while (!torch_ready(keys, within())) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string list;
      size_t count = 0;
      for (const std::string& key : keys)
        if (!torch_ready({key}, within()))
          list += (count++ < 16 ? (list.empty() ? "" : ", ") + key : "");
      throw Error(fmt::format(
          "timed out after {:.1f}s waiting at the rendezvous store {} for {} of {} keys: {}",
          timeout_s, address_, count, keys.size(), list));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

int64_t StoreClient::torch_add(const std::string& key, int64_t delta) {
  std::string fields;
  put_bytes(&fields, torch_key(key));
  put_u64(&fields, static_cast<uint64_t>(delta));
  return static_cast<int64_t>(get_u64(torch_query(kAdd, fields, 8, false, reply_timeout_s_)));
}

bool StoreClient::torch_remove(const std::string& key) {
  std::string fields;
  put_bytes(&fields, torch_key(key));
  return get_u64(torch_query(kDeleteKey, fields, 8, false, reply_timeout_s_)) > 0;
}

}  // namespace ddp
