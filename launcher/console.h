// ddprun's console: the workers' lines reach ddprun's stdout and stderr through bounded queues
// written without blocking, so that a console nobody reads (a stalled pipe, a terminal held by
// XOFF) never stops supervision, reaping or signals. A slow reader loses nothing: while a
// stream's queue is full, ddprun stops reading the workers' pipes of that stream (accepting())
// and they wait, as they would on a slow terminal of their own. A reader that takes nothing
// for `stall_seconds` is stalled: its lines are then dropped and counted (a line says how
// many once it reads again), so that the workers and their logs (--log-dir, which keep every
// line) go on.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

class Console {
 public:
  static constexpr size_t kMaxQueuedBytes = size_t{4} << 20;  // a stream's queue
  static constexpr double kStallSeconds = 10;

  // Writes to out_fd and err_fd (ddprun: 1 and 2, see take_over_standard_streams), which must
  // not block: a full one keeps its lines queued.
  Console(int out_fd, int err_fd, double stall_seconds = kStallSeconds)
      : fds_{out_fd, err_fd}, stall_seconds_(stall_seconds) {}
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // Queues one line (without its newline) for stdout or stderr and writes what the stream
  // takes now; while the stream is stalled the line is dropped and counted.
  void line(bool is_err, const std::string& text);
  // Whether more lines of that stream should be read now: its queue is below the bound, or
  // the stream is stalled (its lines dropped).
  bool accepting(bool is_err);
  // Writes what the streams take now; returns whether anything is still queued.
  bool flush();
  // Keeps flushing (ddprun's exit) while the reader takes something every `seconds`; returns
  // whether all went out.
  bool drain(double seconds);
  uint64_t dropped() const { return streams_[0].dropped_total + streams_[1].dropped_total; }
  // The descriptor each stream waits on (for poll's POLLOUT), or -1 when nothing is queued.
  int waiting_fd(bool is_err) const;

 private:
  struct Stream {
    std::string queued;
    size_t at = 0;         // the first byte of queued not written yet
    uint64_t dropped = 0;  // lines dropped since the last notice
    uint64_t dropped_total = 0;
    bool broken = false;  // the reader is gone (EPIPE): the queue is discarded
    std::chrono::steady_clock::time_point progress{};  // when it last took bytes or was empty
  };
  bool flush(int which);
  bool stalled(const Stream& s) const;
  int fds_[2];
  double stall_seconds_;
  Stream streams_[2];
};

// Makes ddprun's stdout and stderr safe for Console: where one is a pipe or a terminal, it is
// reopened through /proc/self/fd as an open file description of its own and set O_NONBLOCK
// there (setting it on the inherited one would change the shell's too); a file or a socket
// is left as it is (a file's writes do not wait on a reader; a socket is written with
// MSG_DONTWAIT). ddprun's own lines (fprintf to stderr) then never block either: one written
// while the console is full is lost from the console, not from the logs.
void take_over_standard_streams();

}  // namespace ddp
