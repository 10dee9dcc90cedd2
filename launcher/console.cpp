// Console: per-stream queues flushed with non-blocking writes.
#include "launcher/console.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>

#include <fmt/format.h>

namespace ddp {

bool Console::stalled(const Stream& s) const {
  return s.queued.size() > s.at && std::chrono::steady_clock::now() - s.progress >
                                       std::chrono::duration<double>(stall_seconds_);
}

bool Console::accepting(bool is_err) {
  Stream& s = streams_[is_err ? 1 : 0];
  flush(is_err ? 1 : 0);
  return s.broken || s.queued.size() - s.at < kMaxQueuedBytes || stalled(s);
}

void Console::line(bool is_err, const std::string& text) {
  Stream& s = streams_[is_err ? 1 : 0];
  if (s.broken) return;
  if (s.queued.size() == s.at) s.progress = std::chrono::steady_clock::now();
  if (stalled(s)) {
    ++s.dropped;
    ++s.dropped_total;
    return;
  }
  if (s.dropped > 0 && s.queued.size() == s.at) {
    s.queued += fmt::format(
        "ddprun: {} line{} of output dropped while the console read nothing (the per-rank logs "
        "of --log-dir keep every line)\n",
        s.dropped, s.dropped == 1 ? "" : "s");
    s.dropped = 0;
  }
  s.queued += text;
  s.queued += '\n';
  flush(is_err ? 1 : 0);
}

bool Console::flush(int which) {
  Stream& s = streams_[which];
  while (!s.broken && s.at < s.queued.size()) {
    const char* data = s.queued.data() + s.at;
    const size_t bytes = s.queued.size() - s.at;
    ssize_t n = ::send(fds_[which], data, bytes, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = ::write(fds_[which], data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      s.broken = true;  // EPIPE or another error: nobody will read this stream again
      break;
    }
    s.at += static_cast<size_t>(n);
    s.progress = std::chrono::steady_clock::now();
  }
  if (s.broken || s.at == s.queued.size()) {
    s.queued.clear();
    s.at = 0;
  } else if (s.at > (size_t{1} << 20)) {
    s.queued.erase(0, s.at);
    s.at = 0;
  }
  return !s.queued.empty();
}

bool Console::flush() {
  const bool out = flush(0);
  const bool err = flush(1);
  return out || err;
}

int Console::waiting_fd(bool is_err) const {
  const Stream& s = streams_[is_err ? 1 : 0];
  return s.queued.size() > s.at ? fds_[is_err ? 1 : 0] : -1;
}

bool Console::drain(double seconds) {
  // As long as the reader takes something every `seconds`: a slow one gets everything.
  const auto quiet = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(seconds));
  while (flush()) {
    auto last = std::chrono::steady_clock::time_point::min();
    for (const Stream& s : streams_)
      if (s.queued.size() > s.at) last = std::max(last, s.progress);
    if (std::chrono::steady_clock::now() - last > quiet) return false;
    pollfd fds[2];
    nfds_t n = 0;
    for (bool is_err : {false, true})
      if (waiting_fd(is_err) >= 0) fds[n++] = {waiting_fd(is_err), POLLOUT, 0};
    ::poll(fds, n, 100);
  }
  return true;
}

void take_over_standard_streams() {
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) continue;
    if (!S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) continue;
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0 && (flags & O_NONBLOCK) != 0) continue;  // already ours (a restart)
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    const int own = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (own < 0) continue;  // no /proc: writes may block on a stalled reader, as before
    ::dup2(own, fd);        // (dup2 leaves the new descriptor without O_CLOEXEC)
    ::close(own);
  }
}

}  // namespace ddp
