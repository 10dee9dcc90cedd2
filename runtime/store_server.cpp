// StoreServer: per-connection input buffers, framed requests, waits parked until their keys
// appear or their deadline passes.
#include "runtime/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "runtime/error.h"
#include "runtime/munge_auth.h"
#include "runtime/parse.h"
#include "runtime/store.h"

namespace ddp {
namespace {

struct Connection {
  UniqueFd fd;
  std::string peer;  // "address:port"
  bool authenticated = false;
  // Not empty: a process of this host of another user, refused at its hello with this reason.
  std::string foreign;
  Deadline hello_deadline;
  std::string input;
  // A parked wait: keys still wanted and the deadline.
  bool waiting = false;
  std::vector<std::string> wait_keys;
  Deadline wait_deadline;
};

// A framed reply: u32 length, u8 status, then the body's fields.
std::string reply_of(StoreStatus status, const MessageWriter& body = MessageWriter()) {
  MessageWriter reply;
  reply.u8(static_cast<uint8_t>(status)).raw(body.payload());
  return reply.framed();
}

// Compares in time that depends only on the lengths, not on where the first difference is
// (a remote peer must not learn the token byte by byte from response times).
bool same_token(const std::string& given, const std::string& token) {
  unsigned char diff = given.size() == token.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ (token.empty() ? 0 : token[i % token.size()]));
  return diff == 0 && !token.empty();
}

}  // namespace

StoreServer::StoreServer(const StoreServerConfig& config)
    : config_(config), refusals_(config.on_refused) {
  Listener listener = listen_tcp(config.bind_addr, config.port, "the store", config.origin);
  listen_fd_ = std::move(listener.fd);
  port_ = listener.port;
}

StoreServer::~StoreServer() {
  stop();
}

void StoreServer::start() {
  running_ = true;
  thread_ = std::thread([this] { serve(); });
}

void StoreServer::stop() {
  if (!thread_.joinable()) return;
  running_ = false;
  wake_.wake();
  thread_.join();
}

void StoreServer::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  // The launchers' own keys (nodes, generation) outlive a restart; the workers' do not.
  for (auto it = data_.begin(); it != data_.end();) {
    if (it->first.rfind("ddprun/", 0) == 0) {
      ++it;
      continue;
    }
    data_bytes_ -= it->first.size() + it->second.size();
    it = data_.erase(it);
  }
}

std::string StoreServer::munge_refusal(const std::string& credential) const {
  if (credential.empty())
    return "no MUNGE credential: under Slurm this store admits only processes that MUNGE "
           "vouches for (is munged running on that host? DDP_STORE_MUNGE=0 turns this off)";
  std::string why;
  const std::optional<MungeIdentity> who =
      munge_decode_credential(credential, config_.munge_socket, &why);
  if (!who) return why;
  if (who->uid != ::geteuid() && who->uid != 0)
    return fmt::format("a MUNGE credential of user {} (the job's user is {})", who->uid,
                       ::geteuid());
  if (who->payload != config_.run_id)
    return fmt::format("a MUNGE credential for run '{}' (this store serves run '{}')", who->payload,
                       config_.run_id);
  return "";
}

void StoreServer::refuse(const std::string& peer, const std::string& reason) {
  ++dropped_;
  const std::string address = peer.substr(0, peer.rfind(':'));
  refusals_.refuse(address, reason);
}

void StoreServer::serve() {
  std::vector<Connection> connections;
  while (running_) {
    // Answer parked waits whose keys have all appeared or whose deadline passed.
    const auto now = std::chrono::steady_clock::now();
    int poll_ms = 200;
    for (Connection& c : connections) {
      if (!c.authenticated && c.fd.valid() && now >= c.hello_deadline) {
        refuse(c.peer,
               fmt::format("no hello with the token within {:.1f}s", config_.hello_timeout_s));
        c.fd.reset();
      }
    }
    for (Connection& c : connections) {
      if (!c.waiting || !c.fd.valid()) continue;
      std::vector<std::string> missing;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const std::string& key : c.wait_keys)
          if (data_.find(key) == data_.end()) missing.push_back(key);
      }
      std::string reply;
      if (missing.empty()) {
        reply = reply_of(StoreStatus::kOk);
      } else if (now >= c.wait_deadline) {
        MessageWriter body;
        body.u32(static_cast<uint32_t>(missing.size()));
        for (const std::string& key : missing)
          body.str(key);
        reply = reply_of(StoreStatus::kTimeout, body);
      } else {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(c.wait_deadline - now).count();
        poll_ms = static_cast<int>(std::min<int64_t>(poll_ms, std::max<int64_t>(1, left)));
        continue;
      }
      c.waiting = false;
      try {
        write_all(c.fd.get(), reply.data(), reply.size());
      } catch (const Error&) {
        c.fd.reset();
      }
    }
    connections.erase(std::remove_if(connections.begin(), connections.end(),
                                     [](const Connection& c) { return !c.fd.valid(); }),
                      connections.end());

    std::vector<pollfd> fds;
    fds.push_back({listen_fd_.get(), POLLIN, 0});
    fds.push_back({wake_.read.get(), POLLIN, 0});
    for (const Connection& c : connections)
      fds.push_back({c.fd.get(), POLLIN, 0});
    // Parked waits are re-checked after every request (a set may complete them) and when
    // the nearest deadline passes (poll_ms).
    const int ready = ::poll(fds.data(), fds.size(), poll_ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    if (fds[0].revents & POLLIN) {
      sockaddr_in peer{};
      socklen_t peer_len = sizeof(peer);
      UniqueFd client(
          ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&peer), &peer_len, SOCK_CLOEXEC));
      if (client.valid()) {
        char address[INET_ADDRSTRLEN] = "?";
        ::inet_ntop(AF_INET, &peer.sin_addr, address, sizeof(address));
        Connection c;
        c.fd = std::move(client);
        c.peer = fmt::format("{}:{}", address, ntohs(peer.sin_port));
        // A client that reads nothing of a reply for this long makes the send fail (dropped).
        const timeval stall{static_cast<time_t>(kStoreStallSeconds), 0};
        ::setsockopt(c.fd.get(), SOL_SOCKET, SO_SNDTIMEO, &stall, sizeof(stall));
        if (config_.check_peer_user) {
          const std::optional<unsigned> uid = local_peer_uid(c.fd.get());
          if (uid && *uid != ::geteuid() && *uid != 0)
            c.foreign = fmt::format("a process of user {} on this host (the job's user is {})",
                                    *uid, ::geteuid());
        }
        c.hello_deadline =
            std::chrono::steady_clock::now() +
            std::chrono::milliseconds(static_cast<int64_t>(config_.hello_timeout_s * 1000));
        // At the cap the oldest stranger goes, not the newcomer: a rank says hello at once,
        // so a flood of silent connections cannot lock the ranks out.
        const size_t waiting = static_cast<size_t>(std::count_if(
            connections.begin(), connections.end(),
            [](const Connection& other) { return other.fd.valid() && !other.authenticated; }));
        if (waiting >= config_.max_unauthenticated) {
          for (Connection& other : connections) {
            if (!other.fd.valid() || other.authenticated) continue;
            refuse(other.peer,
                   fmt::format("dropped: more than {} connections waited for their hello",
                               config_.max_unauthenticated));
            other.fd.reset();
            break;
          }
        }
        if (connections.size() >= kMaxStoreClients) {
          refuse(c.peer, fmt::format("more than {} connections at once", kMaxStoreClients));
        } else {
          connections.push_back(std::move(c));
        }
      }
    }
    uint64_t buffered = 0;  // what every client's unfinished messages hold
    for (const Connection& c : connections)
      buffered += c.input.size();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Connection& c = connections[i - 2];
      char buffer[65536];
      const ssize_t n = ::recv(c.fd.get(), buffer, sizeof(buffer), 0);
      if (n <= 0) {
        buffered -= c.input.size();
        c.fd.reset();
        continue;
      }
      if (buffered + static_cast<uint64_t>(n) > config_.max_buffered) {
        refuse(c.peer, fmt::format("over the {} MiB the store buffers for all clients together",
                                   config_.max_buffered >> 20));
        buffered -= c.input.size();
        c.input.clear();
        c.fd.reset();
        continue;
      }
      const size_t before = c.input.size();
      c.input.append(buffer, static_cast<size_t>(n));
      // Handle every complete frame; a parked wait holds back later requests.
      while (c.fd.valid() && !c.waiting && c.input.size() >= 4) {
        const auto* b = reinterpret_cast<const unsigned char*>(c.input.data());
        const uint32_t len = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t{b[3]} << 24);
        if (len == 0 || len > (c.authenticated ? kMaxStoreMessageBytes : kMaxHelloBytes)) {
          refuse(c.peer, fmt::format("a frame of {} bytes{}", len,
                                     c.authenticated ? "" : " before authenticating"));
          c.fd.reset();
          break;
        }
        if (c.input.size() < 4 + static_cast<size_t>(len)) break;
        const std::string payload = c.input.substr(4, len);
        c.input.erase(0, 4 + static_cast<size_t>(len));
        MessageReader reader(payload);
        const auto op = static_cast<StoreOp>(reader.u8());
        std::string reply;
        bool drop = false;
        if (!c.authenticated) {
          const std::string token = reader.str();
          // Version 1's hello ended at the token; version 3's carries the run's id.
          const uint32_t version = reader.ok() && reader.at_end() ? 1 : reader.u32();
          // Another version's hello may hold other fields: its version is told first.
          const bool hello = op == StoreOp::kHello && reader.ok();
          const std::string run_id = version == kStoreProtocolVersion ? reader.str() : "";
          const std::string credential = version == kStoreProtocolVersion ? reader.str() : "";
          if (!hello || (version == kStoreProtocolVersion && (!reader.ok() || !reader.at_end()))) {
            refuse(c.peer, "not a store hello (another program on this port?)");
            c.fd.reset();
            break;
          }
          if (version != kStoreProtocolVersion) {
            refuse(c.peer, fmt::format("a client of store protocol version {} (this store speaks "
                                       "{}): a ddp of another version",
                                       version, kStoreProtocolVersion));
            MessageWriter body;
            body.u32(kStoreProtocolVersion);
            const std::string told = reply_of(StoreStatus::kVersion, body);
            (void)!::send(c.fd.get(), told.data(), told.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
            c.fd.reset();
            break;
          }
          // Said before hanging up, so that the peer can tell a refusal from a store that is
          // not up yet (best effort: a stranger may not read it).
          const auto refuse_hello = [&](const std::string& reason, const std::string& told) {
            refuse(c.peer, reason);
            (void)!::send(c.fd.get(), told.data(), told.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
            c.fd.reset();
          };
          if (!c.foreign.empty()) {
            MessageWriter body;
            body.str(c.foreign);
            refuse_hello(c.foreign, reply_of(StoreStatus::kUnauthorized, body));
            break;
          }
          if (!same_token(token, config_.token)) {
            MessageWriter body;
            body.str("a wrong token (every node of a job needs the same DDP_STORE_TOKEN)");
            refuse_hello("wrong token (check DDP_STORE_TOKEN on every node)",
                         reply_of(StoreStatus::kUnauthorized, body));
            break;
          }
          // A client that names no run (a program's own StoreClient) comes in on the token alone.
          if (!config_.run_id.empty() && !run_id.empty() && run_id != config_.run_id) {
            MessageWriter body;
            body.str(config_.run_id);
            refuse_hello(fmt::format("a process of run '{}' (this store serves run '{}')", run_id,
                                     config_.run_id),
                         reply_of(StoreStatus::kOtherRun, body));
            break;
          }
          // Last, after the cheap checks: decoding a credential asks munged (on this thread), so
          // a stranger without the token must not get that far.
          if (config_.require_munge) {
            const std::string why = munge_refusal(credential);
            if (!why.empty()) {
              MessageWriter body;
              body.str(why);
              refuse_hello(why, reply_of(StoreStatus::kUnauthorized, body));
              break;
            }
          }
          c.authenticated = true, reply = reply_of(StoreStatus::kOk);
        } else {
          std::lock_guard<std::mutex> lock(mutex_);
          switch (op) {
            case StoreOp::kSet: {
              std::string key = reader.str();
              std::string value = reader.str();
              if (!reader.ok() || !reader.at_end()) {
                drop = true;
                break;
              }
              const auto found = data_.find(key);
              const uint64_t before = found == data_.end() ? 0 : key.size() + found->second.size();
              if (data_bytes_ - before + key.size() + value.size() > config_.max_bytes) {
                refuse(c.peer, fmt::format("a set that would pass the bound of {} MiB held",
                                           config_.max_bytes >> 20));
                MessageWriter body;
                body.i64(static_cast<int64_t>(config_.max_bytes));
                reply = reply_of(StoreStatus::kTooLarge, body);
                break;
              }
              data_bytes_ += key.size() + value.size() - before;
              data_[key] = std::move(value);
              reply = reply_of(StoreStatus::kOk);
              break;
            }
            case StoreOp::kGet: {
              const std::string key = reader.str();
              if (!reader.ok() || !reader.at_end()) {
                drop = true;
                break;
              }
              const auto found = data_.find(key);
              if (found == data_.end()) {
                reply = reply_of(StoreStatus::kMissing);
              } else {
                MessageWriter body;
                body.str(found->second);
                reply = reply_of(StoreStatus::kOk, body);
              }
              break;
            }
            case StoreOp::kWait: {
              const uint32_t n = reader.u32();
              std::vector<std::string> keys;
              for (uint32_t k = 0; k < n && reader.ok(); ++k)
                keys.push_back(reader.str());
              const int64_t timeout_ms = reader.i64();
              if (!reader.ok() || !reader.at_end() || timeout_ms < 0) {
                drop = true;
                break;
              }
              c.waiting = true;
              c.wait_keys = std::move(keys);
              c.wait_deadline =
                  std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
              break;
            }
            case StoreOp::kAdd: {
              const std::string key = reader.str();
              const int64_t delta = reader.i64();
              if (!reader.ok() || !reader.at_end()) {
                drop = true;
                break;
              }
              int64_t value = 0;
              const auto found = data_.find(key);
              if (found != data_.end()) {
                value = parse_number<int64_t>(found->second).value_or(0);
              }
              value += delta;
              const std::string text = std::to_string(value);
              const uint64_t before = found == data_.end() ? 0 : key.size() + found->second.size();
              if (data_bytes_ - before + key.size() + text.size() > config_.max_bytes) {
                MessageWriter body;
                body.i64(static_cast<int64_t>(config_.max_bytes));
                reply = reply_of(StoreStatus::kTooLarge, body);
                break;
              }
              data_bytes_ += key.size() + text.size() - before;
              data_[key] = text;
              MessageWriter body;
              body.i64(value);
              reply = reply_of(StoreStatus::kOk, body);
              break;
            }
            case StoreOp::kDelete: {
              const std::string key = reader.str();
              if (!reader.ok() || !reader.at_end()) {
                drop = true;
                break;
              }
              const auto found = data_.find(key);
              const bool existed = found != data_.end();
              if (existed) {
                data_bytes_ -= key.size() + found->second.size();
                data_.erase(found);
              }
              reply = reply_of(existed ? StoreStatus::kOk : StoreStatus::kMissing);
              break;
            }
            default:
              drop = true;
          }
        }
        if (drop) {
          ++dropped_;
          c.fd.reset();
          break;
        }
        if (!reply.empty()) {
          try {
            write_all(c.fd.get(), reply.data(), reply.size());
          } catch (const Error&) {
            c.fd.reset();
          }
        }
      }
      // Nothing large is buffered for a stranger, nor more than two frames for a rank.
      const size_t limit = c.authenticated ? 2 * (4 + kMaxStoreMessageBytes) : 4 + kMaxHelloBytes;
      if (c.fd.valid() && c.input.size() > limit) {
        refuse(c.peer, c.authenticated ? "more than two maximal requests unanswered"
                                       : "sent more than a hello before authenticating");
        c.fd.reset();
      }
      buffered = buffered - before + c.input.size();
    }
  }
}

}  // namespace ddp
