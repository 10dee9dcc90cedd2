// TorchStoreConnection: PyTorch 1.13's TCPStore queries; TorchStoreServer: poll() over them.
#include "launcher/torch_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/parse.h"
#include "runtime/torch_wire.h"

namespace ddp {
namespace {

// What a query asks, whichever PyTorch sent it.
enum class Op {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kUnknown
};
// PyTorch 1.13's query types (SET = 0 ... DELETE_KEY = 8, WATCH_KEY = 7 not served), and 2.x's
// (VALIDATE = 0, SET = 1 ... PING = 13).
Op op_of(bool torch2, uint8_t type) {
  static const Op v113[] = {Op::kSet,  Op::kCompareSet, Op::kGet,     Op::kAdd,      Op::kCheck,
                            Op::kWait, Op::kGetNumKeys, Op::kUnknown, Op::kDeleteKey};
  static const Op v2[] = {Op::kValidate,   Op::kSet,    Op::kCompareSet, Op::kGet,
                          Op::kAdd,        Op::kCheck,  Op::kWait,       Op::kGetNumKeys,
                          Op::kDeleteKey,  Op::kAppend, Op::kMultiGet,   Op::kMultiSet,
                          Op::kCancelWait, Op::kPing};
  if (torch2) return type < std::size(v2) ? v2[type] : Op::kUnknown;
  return type < std::size(v113) ? v113[type] : Op::kUnknown;
}
constexpr uint8_t kReady = 0, kNotReady = 1, kStopWaiting = 0, kWaitCanceled = 1;
using torch_wire::kTorch2Magic;
using torch_wire::put_bytes;
using torch_wire::put_u64;

// Reads from `in` at `*at` without consuming on a short read: false until enough bytes came.
struct Reader {
  const std::string& in;
  size_t at;
  bool u64(uint64_t* v) {
    if (in.size() < at + 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i)
      *v |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
    at += 8;
    return true;
  }
  bool u32(uint32_t* v) {
    if (in.size() < at + 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i)
      *v |= uint32_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
    at += 4;
    return true;
  }
  // A u64-prefixed string; `too_long` set (and false) past the bound.
  bool bytes(std::string* v, bool* too_long) {
    uint64_t n = 0;
    const size_t start = at;
    if (!u64(&n)) return false;
    if (n > kMaxTorchStoreValue) {
      *too_long = true;
      return false;
    }
    if (in.size() < at + n) {
      at = start;
      return false;
    }
    v->assign(in, at, n);
    at += n;
    return true;
  }
};

}  // namespace

std::string TorchStoreConnection::feed(const std::string& bytes, TorchStoreKeys& kv,
                                       uint64_t room) {
  in_.append(bytes);
  std::string out;
  // A query holds at most three strings of the bound: more waiting is not a client's.
  if (in_.size() - at_ > 3 * kMaxTorchStoreValue + 4096) {
    error_ = fmt::format("over {} MiB of unanswerable bytes", (3 * kMaxTorchStoreValue) >> 20);
    return out;
  }
  if (first_) {
    // PyTorch 2.x opens with a validate query (type 0 and its magic number); 1.13 with any
    // query (type 0 is its set, whose key length follows).
    if (in_.size() < 5 && (in_.empty() || in_[0] == 0 || static_cast<uint8_t>(in_[0]) == 0xCE))
      return out;
    uint32_t magic = 0;
    for (int i = 0; i < 4 && in_.size() >= 5; ++i)
      magic |= uint32_t{static_cast<uint8_t>(in_[1 + i])} << (8 * i);
    uint32_t head = 0;
    for (int i = 0; i < 4 && in_.size() >= 4; ++i)
      head |= uint32_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    // (or, in the releases that put the magic number before every query, with that)
    torch2_ = (in_[0] == 0 && magic == kTorch2Magic) || head == kTorch2Magic;
    first_ = false;
  }
  // Replies beyond `room` would be built whole in memory before the peer reads any: the
  // queries past it wait in in_ (a GET of a large value asked many times over is answered
  // as the peer reads).
  while (error_.empty() && out.size() < room && parse_one(kv, &out)) {
  }
  if (at_ > 0) {
    in_.erase(0, at_);
    at_ = 0;
  }
  out += answer_waits(kv);
  return out;
}

bool TorchStoreConnection::put(TorchStoreKeys& kv, const std::string& key, std::string value) {
  const auto it = kv.values.find(key);
  const uint64_t before = it == kv.values.end() ? 0 : key.size() + it->second.size();
  const uint64_t after = key.size() + value.size();
  if (kv.bytes - before + after > kv.max_bytes) {
    error_ = fmt::format("a set past the {} MiB the store holds in all", kv.max_bytes >> 20);
    return false;
  }
  kv.bytes = kv.bytes - before + after;
  kv.values[key] = std::move(value);
  return true;
}

bool TorchStoreConnection::parse_one(TorchStoreKeys& kv, std::string* out) {
  if (at_ >= in_.size()) return false;
  size_t start = at_;
  if (torch2_ && in_.size() >= start + 4) {  // a query's own magic number, where sent
    uint32_t head = 0;
    for (int i = 0; i < 4; ++i)
      head |= uint32_t{static_cast<uint8_t>(in_[start + i])} << (8 * i);
    if (head == kTorch2Magic) start += 4;
  } else if (torch2_ && static_cast<uint8_t>(in_[start]) == 0xCE) {
    return false;  // perhaps a magic number: wait for its four bytes
  }
  if (start >= in_.size()) return false;
  Reader r{in_, start + 1};
  bool too_long = false;
  const uint8_t type = static_cast<uint8_t>(in_[start]);
  std::string key, a, b;
  const auto done = [&] {
    at_ = r.at;
    spoke_ = true;
    return true;
  };
  const auto read_keys = [&](std::vector<std::string>* keys, bool pairs) {
    uint64_t count = 0;
    if (!r.u64(&count)) return false;
    if (count > 4096) {
      error_ = fmt::format("a query of {} keys", count);
      return false;
    }
    keys->resize(pairs ? 2 * count : count);
    for (std::string& k : *keys)
      if (!r.bytes(&k, &too_long)) return false;
    return true;
  };
  std::vector<std::string> keys;
  switch (op_of(torch2_, type)) {
    case Op::kValidate: {
      uint32_t magic = 0;
      if (!r.u32(&magic)) break;
      if (magic != kTorch2Magic) {
        error_ = fmt::format("a validate query with magic number {:#x}", magic);
        return false;
      }
      return done();
    }
    case Op::kPing: {
      uint32_t nonce = 0;
      if (!r.u32(&nonce)) break;
      for (int i = 0; i < 4; ++i)
        out->push_back(static_cast<char>((nonce >> (8 * i)) & 0xff));
      return done();
    }
    case Op::kSet:
      if (!r.bytes(&key, &too_long) || !r.bytes(&a, &too_long)) break;
      return put(kv, key, std::move(a)) && done();
    case Op::kAppend: {
      if (!r.bytes(&key, &too_long) || !r.bytes(&a, &too_long)) break;
      const auto it = kv.values.find(key);
      return put(kv, key, (it == kv.values.end() ? std::string() : it->second) + a) && done();
    }
    case Op::kMultiSet:
      if (!read_keys(&keys, true)) break;
      for (size_t i = 0; i + 1 < keys.size(); i += 2)
        if (!put(kv, keys[i], std::move(keys[i + 1]))) return false;
      return done();
    case Op::kCompareSet: {
      if (!r.bytes(&key, &too_long) || !r.bytes(&a, &too_long) || !r.bytes(&b, &too_long)) break;
      // As torch's server: a missing key is set when the expected value is empty; the reply
      // is the value the key holds afterwards (or the expected one for a missing key).
      const auto it = kv.values.find(key);
      if (it == kv.values.end()) {
        if (a.empty() && !put(kv, key, b)) return false;
        put_bytes(out, a.empty() ? b : a);
      } else {
        if (it->second == a && !put(kv, key, b)) return false;
        put_bytes(out, kv.values.at(key));
      }
      return done();
    }
    case Op::kGet: {
      if (!r.bytes(&key, &too_long)) break;
      const auto it = kv.values.find(key);
      put_bytes(out, it == kv.values.end() ? std::string() : it->second);
      return done();
    }
    case Op::kMultiGet:
      if (!read_keys(&keys, false)) break;
      for (const std::string& k : keys) {
        const auto it = kv.values.find(k);
        put_bytes(out, it == kv.values.end() ? std::string() : it->second);
      }
      return done();
    case Op::kAdd: {
      uint64_t delta = 0;
      if (!r.bytes(&key, &too_long) || !r.u64(&delta)) break;
      // Torch keeps counters as decimal text; a key holding other text, or a sum past int64,
      // is the client's mistake, refused (torch's own server fails that query too).
      int64_t value = static_cast<int64_t>(delta);
      const auto it = kv.values.find(key);
      if (it != kv.values.end() && !it->second.empty()) {
        const std::optional<int64_t> held = parse_number<int64_t>(it->second);
        if (!held) {
          error_ =
              fmt::format("an add to a key that holds no integer ({} bytes)", it->second.size());
          return false;
        }
        if (__builtin_add_overflow(*held, value, &value)) {
          error_ = "an add past the largest 64-bit integer";
          return false;
        }
      }
      if (!put(kv, key, std::to_string(value))) return false;
      put_u64(out, static_cast<uint64_t>(value));
      return done();
    }
    case Op::kCheck:
    case Op::kWait: {
      if (!read_keys(&keys, false)) break;
      bool all = true;
      for (const std::string& k : keys)
        all = all && kv.values.count(k) > 0;
      if (op_of(torch2_, type) == Op::kCheck)
        out->push_back(static_cast<char>(all ? kReady : kNotReady));
      else if (all)
        out->push_back(static_cast<char>(kStopWaiting));
      else
        waits_.push_back(std::move(keys));
      return done();
    }
    case Op::kCancelWait:
      waits_.clear();
      out->push_back(static_cast<char>(kWaitCanceled));
      return done();
    case Op::kGetNumKeys:
      put_u64(out, kv.values.size());
      return done();
    case Op::kDeleteKey: {
      if (!r.bytes(&key, &too_long)) break;
      const auto it = kv.values.find(key);
      const bool found = it != kv.values.end();
      if (found) {
        kv.bytes -= key.size() + it->second.size();
        kv.values.erase(it);
      }
      put_u64(out, found ? 1 : 0);
      return done();
    }
    case Op::kUnknown:
      error_ = fmt::format("query type {}, which PyTorch {}'s store does not serve here", type,
                           torch2_ ? "2.x" : "1.13");
      return false;
  }
  if (too_long) error_ = fmt::format("a key or value over {} MiB", kMaxTorchStoreValue >> 20);
  return false;  // incomplete: wait for more bytes
}

std::string TorchStoreConnection::answer_waits(const TorchStoreKeys& kv) {
  std::string out;
  std::vector<std::vector<std::string>> still;
  for (std::vector<std::string>& keys : waits_) {
    bool all = true;
    for (const std::string& k : keys)
      all = all && kv.values.count(k) > 0;
    if (all)
      out.push_back(static_cast<char>(kStopWaiting));
    else
      still.push_back(std::move(keys));
  }
  waits_ = std::move(still);
  return out;
}

TorchStoreServer::TorchStoreServer(const std::string& bind_addr, int port,
                                   std::function<void(const std::string&)> on_refused,
                                   double stall_seconds, size_t max_clients)
    : refusals_(std::move(on_refused)), stall_seconds_(stall_seconds), max_clients_(max_clients) {
  Listener listener = listen_tcp(bind_addr, port, "PyTorch's store");
  listen_fd_ = std::move(listener.fd);
  port_ = listener.port;
}

TorchStoreServer::~TorchStoreServer() {
  stop();
}

void TorchStoreServer::start() {
  running_ = true;
  thread_ = std::thread([this] { serve(); });
}

void TorchStoreServer::stop() {
  if (!running_.exchange(false)) return;
  wake_.wake();
  if (thread_.joinable()) thread_.join();
}

namespace {

using Clock = std::chrono::steady_clock;

// One client: its socket (non-blocking: the server never waits on one peer), its protocol
// state, and the replies it has not read yet.
struct TorchClient {
  UniqueFd fd;
  std::string peer;  // its address, for the refusals' lines
  TorchStoreConnection protocol;
  std::string out;  // replies not sent yet, from out_at
  size_t out_at = 0;
  Clock::time_point last_read;  // when it last took bytes of its replies (or had none waiting)
  Clock::time_point last_heard;

  uint64_t queued() const { return out.size() - out_at; }
  // Adds replies to the queue; a queue that was empty starts its reading deadline now.
  void queue(const std::string& replies, Clock::time_point now) {
    if (replies.empty()) return;
    if (queued() == 0) last_read = now;
    out += replies;
  }
  uint64_t buffered() const { return queued() + protocol.pending(); }
  // Sends what the socket takes now; false when the peer is gone.
  bool flush(Clock::time_point now) {
    while (queued() > 0) {
      const ssize_t n =
          ::send(fd.get(), out.data() + out_at, queued(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
      out_at += static_cast<size_t>(n);
      last_read = now;
    }
    out.clear();
    out_at = 0;
    return true;
  }
};

}  // namespace

void TorchStoreServer::serve() {
  std::vector<std::unique_ptr<TorchClient>> clients;
  TorchStoreKeys kv;
  const auto drop = [&](TorchClient& c, const std::string& why) {
    refusals_.refuse(c.peer, why);
    c.fd = UniqueFd();
  };
  while (running_) {
    std::vector<pollfd> fds = {{wake_.read.get(), POLLIN, 0}, {listen_fd_.get(), POLLIN, 0}};
    for (const auto& c : clients) {
      // A client with a full reply queue is not read until it has read some of it.
      short events = c->queued() < kMaxTorchStoreReplyQueue ? POLLIN : 0;
      if (c->queued() > 0) events |= POLLOUT;
      fds.push_back({c->fd.get(), events, 0});
    }
    if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;
    const Clock::time_point now = Clock::now();
    if (fds[1].revents & POLLIN) {
      sockaddr_in addr{};
      socklen_t len = sizeof(addr);
      UniqueFd fd(::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len,
                            SOCK_CLOEXEC | SOCK_NONBLOCK));
      char text[INET_ADDRSTRLEN] = "?";
      ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
      // PyTorch's clients give no token, but one of this host must run as the job's user
      // (or root): the kernel's table names the other end's owner.
      if (fd.valid()) {
        const std::optional<unsigned> uid = local_peer_uid(fd.get());
        if (uid && *uid != ::geteuid() && *uid != 0) {
          refusals_.refuse(text, fmt::format("a process of user {} on this host (the job's user "
                                             "is {})",
                                             *uid, ::geteuid()));
          fd.reset();
        }
      }
      bool room = clients.size() < max_clients_;
      if (fd.valid() && !room) {
        // Room is made by the longest-idle connection that never sent a whole query (a
        // stranger holding a place), never by a client that has spoken.
        TorchClient* idle = nullptr;
        for (auto& c : clients)
          if (c->fd.valid() && !c->protocol.spoke() &&
              (idle == nullptr || c->last_heard < idle->last_heard))
            idle = c.get();
        room = idle != nullptr;
        if (idle != nullptr)
          drop(*idle, fmt::format("an idle connection closed to make room past {} connections",
                                  max_clients_));
        else
          refusals_.refuse(text, fmt::format("more than {} connections", max_clients_));
      }
      if (fd.valid() && room) {
        const int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, 1 /* TCP_NODELAY */, &one, sizeof(one));
        auto c = std::make_unique<TorchClient>();
        c->fd = std::move(fd);
        c->peer = text;
        c->last_read = c->last_heard = now;
        clients.push_back(std::move(c));
      }
    }
    uint64_t buffered = 0;
    for (const auto& c : clients)
      buffered += c->buffered();
    bool changed = false;
    for (size_t i = 0; i < clients.size(); ++i) {
      TorchClient& c = *clients[i];
      const short revents = i + 2 < fds.size() ? fds[i + 2].revents : 0;
      if (!c.fd.valid()) continue;
      if ((revents & POLLOUT) && !c.flush(now)) {
        c.fd = UniqueFd();
        continue;
      }
      std::string bytes;
      if (revents & (POLLIN | POLLHUP | POLLERR)) {
        char buffer[65536];
        const ssize_t n = ::recv(c.fd.get(), buffer, sizeof(buffer), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          c.fd = UniqueFd();
          continue;
        }
        if (n > 0) {
          bytes.assign(buffer, static_cast<size_t>(n));
          c.last_heard = now;
        }
      }
      // Queries left unanswered for want of room are taken up again once the queue drains.
      if (bytes.empty() && (c.protocol.pending() == 0 || c.queued() >= kMaxTorchStoreReplyQueue))
        continue;
      if (buffered + bytes.size() > kMaxTorchStoreBuffered) {
        drop(c, fmt::format("over the {} MiB the store buffers for all clients together",
                            kMaxTorchStoreBuffered >> 20));
        continue;
      }
      const uint64_t before = c.buffered();
      c.queue(c.protocol.feed(bytes, kv, kMaxTorchStoreReplyQueue - c.queued()), now);
      changed = true;
      buffered = buffered - before + c.buffered();
      if (!c.protocol.error().empty()) {
        drop(c, c.protocol.error());
        continue;
      }
      if (!c.flush(now)) c.fd = UniqueFd();
    }
    // A set may complete other connections' waits.
    if (changed)
      for (auto& c : clients)
        if (c->fd.valid()) {
          c->queue(c->protocol.answer_waits(kv), now);
          if (!c->flush(now)) c->fd = UniqueFd();
        }
    // A client that reads none of its replies is dropped, so that neither memory nor the
    // job's end waits on it.
    for (auto& c : clients)
      if (c->fd.valid() && c->queued() > 0 &&
          now - c->last_read > std::chrono::duration<double>(stall_seconds_))
        drop(*c, fmt::format("read none of its replies for {:g} s", stall_seconds_));
    std::vector<std::unique_ptr<TorchClient>> open;
    for (auto& c : clients)
      if (c->fd.valid()) open.push_back(std::move(c));
    clients = std::move(open);
  }
}

}  // namespace ddp
