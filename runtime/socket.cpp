// TCP helpers: connect with retries, full writes, reads with a deadline, framing.
#include "runtime/socket.h"

#include <arpa/inet.h>
#include <ifaddrs.h>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "runtime/error.h"

namespace ddp {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

// connect() that gives up at the deadline: a blocking one waits out the kernel's SYN
// retries (about two minutes) when the peer's address does not answer at all (a cut link).
// The socket is left blocking again on success.
bool connect_before(int fd, const sockaddr* address, socklen_t length, Deadline deadline,
                    std::string* error) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  if (::connect(fd, address, length) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      *error = std::strerror(errno);
      return false;
    }
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd pfd{fd, POLLOUT, 0};
      const int ready =
          ::poll(&pfd, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready > 0) break;
      if (left.count() <= 0) {
        *error = "no answer (connection timed out)";
        return false;
      }
    }
    int code = 0;
    socklen_t code_length = sizeof(code);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &code, &code_length);
    if (code != 0) {
      *error = std::strerror(code);
      return false;
    }
  }
  ::fcntl(fd, F_SETFL, flags);
  return true;
}

}  // namespace

UniqueFd tcp_connect(const std::string& host, int port, Deadline deadline) {
  std::string last_error = "no attempt";
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0) {
      last_error = ::gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (!fd.valid()) continue;
        if (connect_before(fd.get(), a->ai_addr, a->ai_addrlen, deadline, &last_error)) {
          const int one = 1;
          ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          ::freeaddrinfo(found);
          return fd;
        }
      }
      ::freeaddrinfo(found);
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw Error(fmt::format(
      "cannot reach the rendezvous store at {}:{} ({}); check MASTER_ADDR/MASTER_PORT and that "
      "ddprun is still running",
      host, port, last_error));
}

void write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == ECONNRESET || errno == EPIPE))
      throw ConnectionClosed("the connection was closed by the other side");
    DDP_CHECK(n > 0, "store connection: send failed: {}", std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

bool read_exact(int fd, void* data, size_t bytes, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno == EINTR) continue;
    DDP_CHECK(ready >= 0, "store connection: poll failed: {}", std::strerror(errno));
    if (ready == 0) continue;
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    // A peer that closes with our bytes unread resets the connection instead of ending it:
    // either way it hung up.
    if (n == 0 || (n < 0 && errno == ECONNRESET))
      throw ConnectionClosed("the connection was closed by the other side");
    DDP_CHECK(n > 0, "store connection: receive failed: {}", std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

MessageWriter& MessageWriter::u8(uint8_t v) {
  payload_.push_back(static_cast<char>(v));
  return *this;
}
MessageWriter& MessageWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i)
    payload_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return *this;
}
MessageWriter& MessageWriter::i64(int64_t v) {
  const uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i)
    payload_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  return *this;
}
MessageWriter& MessageWriter::str(const std::string& v) {
  u32(static_cast<uint32_t>(v.size()));
  payload_ += v;
  return *this;
}
MessageWriter& MessageWriter::raw(const std::string& bytes) {
  payload_ += bytes;
  return *this;
}
std::string MessageWriter::framed() const {
  MessageWriter frame;
  frame.u32(static_cast<uint32_t>(payload_.size()));
  return frame.payload_ + payload_;
}

bool MessageReader::take(void* out, size_t bytes) {
  if (!ok_ || data_.size() - pos_ < bytes) {
    ok_ = false;
    return false;
  }
  std::memcpy(out, data_.data() + pos_, bytes);
  pos_ += bytes;
  return true;
}
uint8_t MessageReader::u8() {
  uint8_t v = 0;
  take(&v, 1);
  return v;
}
uint32_t MessageReader::u32() {
  unsigned char b[4] = {};
  if (!take(b, 4)) return 0;
  return b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t{b[3]} << 24);
}
int64_t MessageReader::i64() {
  unsigned char b[8] = {};
  if (!take(b, 8)) return 0;
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i)
    u |= static_cast<uint64_t>(b[i]) << (8 * i);
  return static_cast<int64_t>(u);
}
std::string MessageReader::str() {
  const uint32_t n = u32();
  if (!ok_ || data_.size() - pos_ < n) {
    ok_ = false;
    return {};
  }
  std::string v = data_.substr(pos_, n);
  pos_ += n;
  return v;
}

std::vector<std::string> interface_addresses() {
  std::vector<std::string> found;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return found;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                sizeof(text));
    found.push_back(std::string(a->ifa_name) + "=" + text);
  }
  ::freeifaddrs(list);
  return found;
}

std::string interface_address(const std::string& name) {
  for (const std::string& entry : interface_addresses())
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
  return "";
}

std::string local_address(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "";
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
    port = ntohs(v4->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
    port = ntohs(v6->sin6_port);
  } else {
    return "";
  }
  return fmt::format("{}:{}", host, port);
}

}  // namespace ddp
