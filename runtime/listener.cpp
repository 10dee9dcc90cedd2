// listen_tcp and WakePipe.
#include "runtime/listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "runtime/error.h"

namespace ddp {

Listener listen_tcp(const std::string& bind_addr, int port, const std::string& what) {
  Listener l;
  l.fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  DDP_CHECK(l.fd.valid(), "socket() failed: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(l.fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  DDP_USAGE_CHECK(::inet_pton(AF_INET, bind_addr.c_str(), &addr.sin_addr) == 1,
                  "--master-addr {}: expected an IPv4 address of this machine to serve {} on",
                  bind_addr, what);
  if (::bind(l.fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (err == EADDRINUSE)
      throw UsageError(
          fmt::format("--master-port {}: {}:{} is already in use; choose another port or pass "
                      "--master-port 0 to pick a free one",
                      port, bind_addr, port));
    throw UsageError(
        fmt::format("cannot serve {} on {}:{}: {}", what, bind_addr, port, std::strerror(err)));
  }
  DDP_CHECK(::listen(l.fd.get(), 1024) == 0, "listen() failed: {}", std::strerror(errno));
  socklen_t len = sizeof(addr);
  ::getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  l.port = ntohs(addr.sin_port);
  return l;
}

WakePipe::WakePipe() {
  int fds[2];
  DDP_CHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0, "pipe() failed: {}", std::strerror(errno));
  read = UniqueFd(fds[0]);
  write = UniqueFd(fds[1]);
}

void WakePipe::wake() {
  const char byte = 0;
  (void)!::write(write.get(), &byte, 1);
}

bool RefusalLog::refuse(const std::string& peer, const std::string& reason) {
  ++count_;
  if (seen_.size() > kMaxRefusalLines) return false;
  std::string kind = peer + ": ";
  for (const char c : reason)
    if (!std::isdigit(static_cast<unsigned char>(c))) kind.push_back(c);
  if (!seen_.insert(kind).second) return false;
  if (!report_) return false;
  if (seen_.size() > kMaxRefusalLines) {
    report_(fmt::format("{}: {} (and further refusals of any peer go unreported)", peer, reason));
    return true;
  }
  report_(peer + ": " + reason);
  return true;
}

}  // namespace ddp
