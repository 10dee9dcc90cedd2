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
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "runtime/error.h"

namespace ddp {

namespace {
UsageError port_in_use(const std::string& bind_addr, int port, const ListenOrigin& origin) {
  return UsageError(fmt::format("{} {}: {}:{} is already in use; {}", origin.port, port, bind_addr,
                                port, origin.remedy));
}
}  // namespace

Listener bind_tcp(const std::string& bind_addr, int port, const std::string& what,
                  const ListenOrigin& origin) {
  Listener l;
  l.fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  DDP_CHECK(l.fd.valid(), "socket() failed: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(l.fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  DDP_USAGE_CHECK(::inet_pton(AF_INET, bind_addr.c_str(), &addr.sin_addr) == 1,
                  "{} {}: expected an IPv4 address of this machine to serve {} on", origin.addr,
                  bind_addr, what);
  if (::bind(l.fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (err == EADDRINUSE) throw port_in_use(bind_addr, port, origin);
    throw UsageError(
        fmt::format("cannot serve {} on {}:{}: {}", what, bind_addr, port, std::strerror(err)));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(l.fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  l.port = ntohs(addr.sin_port);
  return l;
}

void start_listening(const Listener& l, const std::string& bind_addr, const ListenOrigin& origin) {
  if (::listen(l.fd.get(), 1024) == 0) return;
  const int err = errno;
  // With SO_REUSEADDR, Linux lets two sockets bind one port while neither listens yet; the
  // second listen() is then the one that finds it taken (two nodes racing for the rendezvous
  // endpoint): the same error as a failed bind, so that the loser joins as a client.
  if (err == EADDRINUSE) throw port_in_use(bind_addr, l.port, origin);
  throw Error(fmt::format("listen() failed: {}", std::strerror(err)));
}

Listener listen_tcp(const std::string& bind_addr, int port, const std::string& what,
                    const ListenOrigin& origin) {
  Listener l = bind_tcp(bind_addr, port, what, origin);
  start_listening(l, bind_addr, origin);
  return l;
}

std::optional<unsigned> tcp_socket_owner(const std::string& proc_net_tcp, uint32_t local_ip,
                                         int local_port, uint32_t remote_ip, int remote_port) {
  // "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid ...":
  // an address is the in-memory (network order) u32 printed as hex, so 127.0.0.1 reads
  // 0100007F on x86; the port is hex in host order.
  const auto text_of = [](uint32_t ip, int port) {
    return fmt::format("{:08X}:{:04X}", htonl(ip), port);
  };
  const std::string local = text_of(local_ip, local_port);
  const std::string remote = text_of(remote_ip, remote_port);
  std::istringstream lines(proc_net_tcp);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string slot, here, there, state, queues, timer, retransmits;
    unsigned uid = 0;
    if (!(fields >> slot >> here >> there >> state >> queues >> timer >> retransmits >> uid))
      continue;  // the header
    if (here == local && there == remote) return uid;
  }
  return std::nullopt;
}

std::optional<unsigned> local_peer_uid(int fd) {
  sockaddr_in mine{}, theirs{};
  socklen_t mine_len = sizeof(mine), theirs_len = sizeof(theirs);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &theirs_len) != 0 ||
      mine.sin_family != AF_INET || theirs.sin_family != AF_INET)
    return std::nullopt;
  std::ifstream file("/proc/net/tcp");
  if (!file) return std::nullopt;
  std::ostringstream text;
  text << file.rdbuf();
  // The peer's socket: its local end is our remote one.
  return tcp_socket_owner(text.str(), ntohl(theirs.sin_addr.s_addr), ntohs(theirs.sin_port),
                          ntohl(mine.sin_addr.s_addr), ntohs(mine.sin_port));
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
