// Starts the workers of one node, tees their output line by line (console with a
// "[rank K] " prefix, and <log-dir>/rank-K.log; with torchrun's --redirects / --tee each
// stream also, or only, to RUN_DIR/attempt_K/LOCAL_RANK/stdout.log and stderr.log), and
// supervises them: the first failure stops the others (SIGTERM, grace period, SIGKILL) and is
// reported as the root cause. Each worker's TORCHELASTIC_ERROR_FILE is error.json in its
// folder of the attempt (where torch's @record writes the root cause).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "launcher/console.h"
#include "launcher/launch_config.h"

namespace ddp {

struct GroupOutcome {
  bool success = false;
  int exit_code = 0;     // what ddprun should exit with
  int failed_rank = -1;  // the first rank that failed, or -1
  std::string cause;     // "exit code 3", "signal SIGKILL (9)", "interrupted by SIGINT"
  std::vector<std::string> last_lines;  // the failed rank's last output lines
  // Other ranks that failed on their own before the teardown's SIGTERM (rank, cause): ranks
  // that meet the same fault each say why in their own lines.
  std::vector<std::pair<int, std::string>> also_failed;
  bool interrupted = false;            // ddprun itself got SIGINT/SIGTERM/SIGHUP
  bool peer_restart = false;           // another node failed: this one stopped its workers
  bool signalled_in_teardown = false;  // SIGINT/SIGTERM/SIGHUP while stopping after a failure
};

// The longest output line ddprun holds before passing it on in pieces.
constexpr size_t kMaxLineBytes = 1 << 20;

// Set by ddprun's signal handler; the supervision loop forwards it to every worker.
extern volatile std::sig_atomic_t g_forward_signal;

// ddprun's own limits, set once at its start: it becomes the subreaper of what its workers
// leave behind (PR_SET_CHILD_SUBREAPER: a worker's child that calls setsid and outlives the
// worker comes to ddprun, which stops it with the group), and raises its soft limit on open
// descriptors to the hard one (strangers' connections must not leave it without a pipe for a
// restart), the workers getting the limit ddprun was given.
void take_launcher_limits();

class WorkerGroup {
 public:
  // The workers' lines go to `console` (which outlives the group).
  WorkerGroup(const LaunchConfig& config, std::vector<int> ranks, Console& console);
  ~WorkerGroup();  // kills workers still running
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts one process per environment (same order as ranks). Throws on fork/exec setup errors.
  void start(const std::vector<EnvMap>& environments, int restart);
  // Runs until every worker has exited or the group was stopped; returns the outcome.
  // `peer_failed` (polled about every 50 ms, may be empty) returns a cause when another
  // node of the job has failed: the workers are then stopped as after a local failure.
  GroupOutcome supervise(const std::function<std::string()>& peer_failed = {});

 private:
  struct Worker {
    int rank = 0;
    pid_t pid = -1;
    int out_fd = -1;
    int err_fd = -1;
    std::string out_partial, err_partial;
    int log_fd = -1;
    int local = 0;                 // its local rank
    int stream_fd[2] = {-1, -1};   // --redirects / --tee: stdout.log, stderr.log
    int redirected = 0, teed = 0;  // its stream bits (1 stdout, 2 stderr)
    bool on_console = true;        // --local-ranks-filter, --quiet
    bool exited = false;
    int status = 0;
    bool told_failed = false;  // listed in GroupOutcome::also_failed
    // Once the worker has exited, what it left in its process group is stopped too
    // (SIGTERM, then SIGKILL after the grace period); true once the group is empty.
    bool group_gone = false;
    std::chrono::steady_clock::time_point group_kill_at{};
    std::deque<std::string> tail;
  };
  // Reads once from `fd` and passes on its complete lines (`flush`: the rest too, and the fd is
  // closed when nothing more comes); the read's result (bytes, 0 at the end, -1 nothing yet).
  ssize_t pump(Worker& worker, int fd, std::string& partial, bool is_err, bool flush);
  void emit(Worker& worker, const std::string& line, bool is_err);
  void stop_all(int signal);
  void reap(bool block_until_exit);
  // Stops what exited workers left in their process groups; true when every group is empty.
  bool clean_groups();
  // The processes that came to ddprun as their subreaper, less this group's guards.
  std::vector<pid_t> orphans() const;
  bool orphans_told_ = false;  // SIGTERM sent to the orphans; SIGKILL at orphans_kill_at_
  std::chrono::steady_clock::time_point orphans_kill_at_{};

  LaunchConfig config_;
  std::vector<int> ranks_;
  Console& console_;
  std::vector<Worker> workers_;
};

// "SIGKILL" for 9, etc.
std::string signal_name(int signal);

}  // namespace ddp
