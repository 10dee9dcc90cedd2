// What the store servers (ddprun's own store, PyTorch's; ddp::init's under srun) share: a
// listening TCP socket and a pipe that wakes their poll() loop to stop.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>

#include "runtime/socket.h"

namespace ddp {

// A listening socket and the port it got.
struct Listener {
  UniqueFd fd;   ///< the listening socket
  int port = 0;  ///< the port it got (the one asked for, or a free one for 0)
};

// Where the address and port to listen on came from, for the errors that name them.
struct ListenOrigin {
  std::string port = "--master-port";  // "MASTER_PORT" under srun
  std::string addr = "--master-addr";  // "MASTER_ADDR" under srun
  // What to do when the port is taken.
  std::string remedy = "choose another port or pass --master-port 0 to pick a free one";
};

// Listens on bind_addr:port (0: a free port). UsageError naming the port's origin when the port
// is taken, the address's when it is not this machine's IPv4 one; `what` names the server in
// other errors ("the store").
Listener listen_tcp(const std::string& bind_addr, int port, const std::string& what,
                    const ListenOrigin& origin = ListenOrigin());
// listen_tcp's two halves. bind_tcp binds (SO_REUSEADDR) without listening; start_listening
// listens, and a port another socket began listening on after this one's bind (Linux lets both
// bind while neither listens) is the same UsageError as a taken port at bind_tcp.
Listener bind_tcp(const std::string& bind_addr, int port, const std::string& what,
                  const ListenOrigin& origin = ListenOrigin());
// The second half: listen() on the socket bind_tcp bound.
void start_listening(const Listener& l, const std::string& bind_addr,
                     const ListenOrigin& origin = ListenOrigin());

// The user id that owns the other end of the connected TCP socket `fd`, when that end is a
// socket of this host (of this network namespace: the kernel's /proc/net/tcp lists it);
// nullopt when it is elsewhere (another host) or cannot be told. TCP's counterpart of a Unix
// socket's SO_PEERCRED, which TCP does not have.
std::optional<unsigned> local_peer_uid(int fd);
// The owner of the socket whose local end is local_ip:local_port and whose remote end is
// remote_ip:remote_port (addresses and ports in host order) in `proc_net_tcp`, text as
// /proc/net/tcp has it; nullopt when no line matches. Pure, for tests.
std::optional<unsigned> tcp_socket_owner(const std::string& proc_net_tcp, uint32_t local_ip,
                                         int local_port, uint32_t remote_ip, int remote_port);

// A non-blocking pipe: wake() makes `read` readable.
struct WakePipe {
  /// Opens the pipe, both ends non-blocking.
  WakePipe();
  /// Makes `read` readable (a byte written; never blocks).
  void wake();
  UniqueFd read;   ///< the end a poll() loop watches
  UniqueFd write;  ///< the end wake() writes to
};

// The refusals a server reports, once per peer address and kind of reason: the reason with
// its digits taken out, so that a fuzzing peer's frames of a thousand sizes make one line.
// At most kMaxRefusalLines lines in all (then one that says the rest go unreported), so that
// what it remembers stays bounded. Used by one thread.
class RefusalLog {
 public:
  /// The most lines it reports.
  static constexpr size_t kMaxRefusalLines = 64;
  /// Reports each line through `report`.
  explicit RefusalLog(std::function<void(const std::string&)> report)
      : report_(std::move(report)) {}
  // `peer` is an address without its port. Returns whether a line was reported.
  bool refuse(const std::string& peer, const std::string& reason);
  uint64_t count() const { return count_; }  // every refusal, reported or not

 private:
  std::function<void(const std::string&)> report_;
  std::set<std::string> seen_;
  uint64_t count_ = 0;
};

}  // namespace ddp
