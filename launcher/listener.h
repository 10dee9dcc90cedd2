// What ddprun's two servers (its own store, PyTorch's) share: a listening TCP socket and a
// pipe that wakes their poll() loop to stop.
#pragma once

#include <string>

#include "runtime/socket.h"

namespace ddp {

struct Listener {
  UniqueFd fd;
  int port = 0;  // the port it got (the one asked for, or a free one for 0)
};

// Listens on bind_addr:port (0: a free port). UsageError naming --master-port when the port is
// taken, --master-addr when the address is not this machine's IPv4 one; `what` names the
// server in other errors ("the store").
Listener listen_tcp(const std::string& bind_addr, int port, const std::string& what);

// A non-blocking pipe: wake() makes `read` readable.
struct WakePipe {
  WakePipe();
  void wake();
  UniqueFd read, write;
};

}  // namespace ddp
