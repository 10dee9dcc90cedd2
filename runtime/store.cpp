// StoreClient: one framed request, one framed reply.
#include "runtime/store.h"

#include <sys/socket.h>

#include "runtime/error.h"

namespace ddp {

StoreClient::StoreClient(const std::string& host, int port, const std::string& token,
                         double connect_timeout_s, double reply_timeout_s,
                         const std::string& run_id, const std::string& credential)
    : address_(fmt::format("{}:{}", host, port)),
      reply_timeout_s_(reply_timeout_s),
      fd_(tcp_connect(host, port, deadline_in(connect_timeout_s))) {
  MessageWriter hello;
  hello.u8(static_cast<uint8_t>(StoreOp::kHello))
      .str(token)
      .u32(kStoreProtocolVersion)
      .str(run_id)
      .str(credential);
  std::string reply;
  try {
    reply = round_trip(hello, connect_timeout_s);
  } catch (const ConnectionClosed&) {
    // No answer at all: not up yet behind something that accepted for it, or not a store.
    throw Error(fmt::format(
        "the rendezvous store at {} closed the connection before answering its hello", address_));
  }
  MessageReader reader(reply);
  const auto status = static_cast<StoreStatus>(reader.u8());
  if (status == StoreStatus::kVersion)
    throw UsageError(fmt::format(
        "the rendezvous store at {} speaks protocol version {}, this process {}: every node and "
        "worker of a job needs the same ddp",
        address_, reader.u32(), kStoreProtocolVersion));
  if (status == StoreStatus::kOtherRun)
    throw UsageError(fmt::format(
        "the rendezvous store at {} serves run '{}', this process belongs to run '{}' "
        "(TORCHELASTIC_RUN_ID, or srun's job and step): two jobs meet at one address and token",
        address_, reader.str(), run_id));
  if (status == StoreStatus::kUnauthorized) {
    const std::string why = reader.str();
    throw UsageError(fmt::format("the rendezvous store at {} refused this process: {}", address_,
                                 reader.ok() ? why : "a wrong token"));
  }
}

std::string StoreClient::round_trip(const MessageWriter& request, double reply_within_s) {
  const Deadline deadline = deadline_in(reply_within_s);
  // Behind a call of another thread that the store does not answer, this one waits no longer
  // than its own deadline (a failed node leaving must not wait out a watcher's call).
  std::unique_lock<std::timed_mutex> lock(mutex_, std::defer_lock);
  if (!lock.try_lock_until(deadline))
    throw Error(fmt::format(
        "the rendezvous store at {} did not answer within {:.0f}s (another call still waits on it)",
        address_, reply_within_s));
  const std::string frame = request.framed();
  try {
    write_all(fd_.get(), frame.data(), frame.size());
    unsigned char len_bytes[4];
    // Not an internal failure: a server that is gone or cut off (no source location).
    if (!read_exact(fd_.get(), len_bytes, 4, deadline))
      throw Error(fmt::format("the rendezvous store at {} did not answer within {:.0f}s", address_,
                              reply_within_s));
    const uint32_t len =
        len_bytes[0] | (len_bytes[1] << 8) | (len_bytes[2] << 16) | (uint32_t{len_bytes[3]} << 24);
    if (len < 1 || len > kMaxStoreMessageBytes) {
      std::string head;  // what the other program said, where it is text ("HTTP")
      for (const unsigned char c : len_bytes)
        head += (c >= 32 && c < 127) ? static_cast<char>(c) : '.';
      throw UsageError(fmt::format(
          "{} answered with what no ddp store sends (it began '{}'): another program listens "
          "there; check MASTER_ADDR and MASTER_PORT (ddprun's --master-addr, --master-port)",
          address_, head));
    }
    std::string payload(len, '\0');
    DDP_CHECK(read_exact(fd_.get(), payload.data(), len, deadline),
              "rendezvous store at {}: reply cut short", address_);
    const auto status = static_cast<StoreStatus>(static_cast<uint8_t>(payload[0]));
    DDP_CHECK(status != StoreStatus::kBadRequest, "rendezvous store at {} refused a request",
              address_);
    return payload;
  } catch (const ConnectionClosed&) {
    if (interrupted_) throw Error(fmt::format("rendezvous store at {}: interrupted", address_));
    throw ConnectionClosed(fmt::format(
        "the rendezvous store at {} closed the connection: {} has ended", address_, server_));
  }
}

void StoreClient::check_room(const std::string& reply, const std::string& key, size_t bytes) {
  if (static_cast<StoreStatus>(static_cast<uint8_t>(reply[0])) != StoreStatus::kTooLarge) return;
  MessageReader reader(reply);
  reader.u8();
  const int64_t bound = reader.i64();
  throw UsageError(fmt::format(
      "the rendezvous store at {} refused to hold key '{}' ({} bytes): what it holds would pass "
      "its bound of {} MiB (the store is for addresses and ids, not data)",
      address_, key, bytes, bound >> 20));
}

void StoreClient::interrupt() {
  interrupted_ = true;
  ::shutdown(fd_.get(), SHUT_RDWR);
}

std::string StoreClient::local_address() const {
  return ddp::local_address(fd_.get());
}

void StoreClient::set(const std::string& key, const std::string& value) {
  if (torch()) return torch_set(key, value);
  MessageWriter request;
  request.u8(static_cast<uint8_t>(StoreOp::kSet)).str(key).str(value);
  check_room(round_trip(request, reply_timeout_s_), key, value.size());
}

std::optional<std::string> StoreClient::get(const std::string& key) {
  return get_within(key, reply_timeout_s_);
}

std::optional<std::string> StoreClient::get_within(const std::string& key, double reply_within_s) {
  if (torch()) return torch_get(key, reply_within_s);
  MessageWriter request;
  request.u8(static_cast<uint8_t>(StoreOp::kGet)).str(key);
  const std::string reply = round_trip(request, reply_within_s);
  MessageReader reader(reply);
  if (static_cast<StoreStatus>(reader.u8()) != StoreStatus::kOk) return std::nullopt;
  std::string value = reader.str();
  DDP_CHECK(reader.ok(), "rendezvous store at {}: malformed reply to get({})", address_, key);
  return value;
}

std::vector<std::string> StoreClient::missing(const std::vector<std::string>& keys) {
  std::vector<std::string> result;
  for (const std::string& key : keys)
    if (!get(key)) result.push_back(key);
  return result;
}

void StoreClient::wait(const std::vector<std::string>& keys, double timeout_s) {
  if (torch()) return torch_wait(keys, timeout_s);
  MessageWriter request;
  request.u8(static_cast<uint8_t>(StoreOp::kWait)).u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& key : keys)
    request.str(key);
  request.i64(static_cast<int64_t>(timeout_s * 1000));
  // The server answers a wait only when it completes or times out: allow it some slack.
  const std::string reply = round_trip(request, timeout_s + reply_timeout_s_);
  MessageReader reader(reply);
  const auto status = static_cast<StoreStatus>(reader.u8());
  if (status == StoreStatus::kOk) return;
  std::vector<std::string> missing_keys;
  const uint32_t n = reader.u32();
  for (uint32_t i = 0; i < n && reader.ok(); ++i)
    missing_keys.push_back(reader.str());
  std::string list;
  for (size_t i = 0; i < missing_keys.size() && i < 16; ++i)
    list += (i ? ", " : "") + missing_keys[i];
  throw Error(
      fmt::format("timed out after {:.1f}s waiting at the rendezvous store {} for {} of "
                  "{} keys: {}",
                  timeout_s, address_, missing_keys.size(), keys.size(), list));
}

std::string StoreClient::wait_get(const std::string& key, double timeout_s) {
  const Deadline deadline = deadline_in(timeout_s);
  wait({key}, timeout_s);
  // The value's reply counts against the same deadline: one cut short must not hold the
  // caller a whole reply timeout more.
  const double left =
      std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
  auto value = get_within(key, std::min<double>(reply_timeout_s_, std::max(1.0, left)));
  DDP_CHECK(value.has_value(), "key {} vanished from the store at {}", key, address_);
  return *value;
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  if (torch()) return torch_add(key, delta);
  MessageWriter request;
  request.u8(static_cast<uint8_t>(StoreOp::kAdd)).str(key).i64(delta);
  const std::string reply = round_trip(request, reply_timeout_s_);
  check_room(reply, key, 0);
  MessageReader reader(reply);
  reader.u8();
  const int64_t value = reader.i64();
  DDP_CHECK(reader.ok(), "rendezvous store at {}: malformed reply to add({})", address_, key);
  return value;
}

bool StoreClient::remove(const std::string& key) {
  if (torch()) return torch_remove(key);
  MessageWriter request;
  request.u8(static_cast<uint8_t>(StoreOp::kDelete)).str(key);
  MessageReader reader(round_trip(request, reply_timeout_s_));
  return static_cast<StoreStatus>(reader.u8()) == StoreStatus::kOk;
}

}  // namespace ddp
