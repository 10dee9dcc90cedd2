// WorkerGroup: fork/exec with pipes, a poll() loop over the pipes, waitpid() for exits.
#include "launcher/worker_group.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/parse.h"

namespace ddp {

volatile std::sig_atomic_t g_forward_signal = 0;

namespace {
constexpr size_t kTailLines = 20;
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    default:
      return fmt::format("signal {}", signal);
  }
}

namespace {

rlimit g_given_nofile{};  // the open-file limit ddprun was started with (its workers get it)
bool g_raised_nofile = false;

// Every process's parent, from /proc/PID/stat ("pid (comm) state ppid ...": comm may hold
// spaces and parentheses, the last ')' ends it).
std::vector<std::pair<pid_t, pid_t>> processes_and_parents() {
  std::vector<std::pair<pid_t, pid_t>> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (const dirent* entry = ::readdir(proc)) {
    const std::optional<pid_t> pid = parse_number<pid_t>(entry->d_name);
    if (!pid) continue;
    std::ifstream in(fmt::format("/proc/{}/stat", *pid));
    std::string stat;
    std::getline(in, stat);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    found.emplace_back(*pid, ppid);
  }
  ::closedir(proc);
  return found;
}

// Set by the guard's SIGUSR1 (its parent-death signal: ddprun died, even by SIGKILL).
volatile std::sig_atomic_t g_launcher_died = 0;
void note_launcher_death(int) {
  g_launcher_died = 1;
}
void note_child(int) {}  // wakes the guard's sleep when the worker ends

// The guard's reaction to ddprun's death: every descendant stopped and then killed (the
// worker, what it started, and what left its group with setsid and came to the guard, a
// subreaper), then its own process group, the guard with it. Stopping first keeps a
// descendant from forking a child between the survey and the kill.
[[noreturn]] void kill_descendants_and_group() {
  const pid_t self = ::getpid();
  for (const int signal : {SIGSTOP, SIGSTOP, SIGKILL}) {
    std::vector<pid_t> family{self};
    const auto table = processes_and_parents();
    for (size_t at = 0; at < family.size(); ++at)
      for (const auto& [pid, ppid] : table)
        if (ppid == family[at]) family.push_back(pid);
    for (size_t i = 1; i < family.size(); ++i)
      ::kill(family[i], signal);
  }
  ::kill(0, SIGKILL);
  ::_exit(137);
}

// The guard: waits for the worker and ends the way it ended (exit code, or the same
// signal), so that ddprun's supervision sees the worker's own outcome. Signals that
// ddprun forwards to the group reach the worker directly; the guard ignores them. It is the
// subreaper of what the worker leaves in sessions of its own, so that ddprun's death (SIGKILL)
// can still reach them; after a normal ending they pass up to ddprun, which stops them.
[[noreturn]] void guard(pid_t worker) {
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  struct sigaction wake {};
  wake.sa_handler = note_child;  // no SA_RESTART: the sleep below returns at the worker's end
  ::sigaction(SIGCHLD, &wake, nullptr);
  int status = 0;
  while (true) {
    if (g_launcher_died) kill_descendants_and_group();
    const pid_t done = ::waitpid(worker, &status, WNOHANG);
    if (done == worker || (done < 0 && errno != EINTR)) break;
    // Polled, not a blocking wait: a signal between the check above and a blocking wait
    // would be lost until the worker's end.
    const timespec nap{0, 100 * 1000 * 1000};
    ::nanosleep(&nap, nullptr);
  }
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);  // the worker already dumped (or not)
    ::prctl(PR_SET_PDEATHSIG, 0);
    ::signal(signal, SIG_DFL);
    ::kill(::getpid(), signal);
  }
  ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

// mkdir -p: true when `path` is a folder afterwards.
bool make_folders(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at)
    if (at == path.size() || path[at] == '/') ::mkdir(path.substr(0, at).c_str(), 0755);
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

void take_launcher_limits() {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  if (::getrlimit(RLIMIT_NOFILE, &g_given_nofile) == 0 &&
      g_given_nofile.rlim_cur < g_given_nofile.rlim_max) {
    rlimit raised = g_given_nofile;
    raised.rlim_cur = std::min<rlim_t>(g_given_nofile.rlim_max, rlim_t{1} << 20);
    g_raised_nofile = ::setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }
}

std::vector<pid_t> WorkerGroup::orphans() const {
  std::vector<pid_t> found;
  const pid_t self = ::getpid();
  for (const auto& [pid, ppid] : processes_and_parents()) {
    if (ppid != self) continue;
    bool guard = false;
    for (const Worker& w : workers_)
      guard = guard || w.pid == pid;
    if (!guard) found.push_back(pid);
  }
  return found;
}

WorkerGroup::WorkerGroup(const LaunchConfig& config, std::vector<int> ranks, Console& console)
    : config_(config), ranks_(std::move(ranks)), console_(console) {}

WorkerGroup::~WorkerGroup() {
  for (const pid_t orphan : orphans()) {
    ::kill(-orphan, SIGKILL);
    ::kill(orphan, SIGKILL);
    ::waitpid(orphan, nullptr, 0);
  }
  for (Worker& w : workers_) {
    if (w.pid > 0 && (!w.exited || !w.group_gone)) ::kill(-w.pid, SIGKILL);
    if (!w.exited && w.pid > 0) ::waitpid(w.pid, nullptr, 0);
    for (int fd : {w.out_fd, w.err_fd, w.log_fd, w.stream_fd[0], w.stream_fd[1]})
      if (fd >= 0) ::close(fd);
  }
}

void WorkerGroup::start(const std::vector<EnvMap>& environments, int restart) {
  workers_.clear();
  workers_.resize(environments.size());
  const std::vector<std::string> program = program_argv(config_);
  if (!config_.log_dir.empty()) ::mkdir(config_.log_dir.c_str(), 0755);
  for (size_t i = 0; i < environments.size(); ++i) {
    Worker& w = workers_[i];
    w.rank = ranks_[i];
    w.local = static_cast<int>(i);
    w.redirected = stream_bits(config_.redirects, w.local);
    w.teed = stream_bits(config_.tee, w.local);
    const auto& filter = config_.local_ranks_filter;
    w.on_console =
        !(config_.quiet && w.rank != 0) &&
        (filter.empty() || std::find(filter.begin(), filter.end(), w.local) != filter.end());
    EnvMap env = environments[i];
    if (!config_.run_dir.empty()) {
      const std::string dir = worker_dir(config_, restart, w.local);
      DDP_USAGE_CHECK(make_folders(dir), "{}: cannot make the folder {}: {}",
                      config_.log_dir.empty() ? "ddprun" : "--log-dir " + config_.log_dir, dir,
                      std::strerror(errno));
      env["TORCHELASTIC_ERROR_FILE"] = dir + "/error.json";
      for (int stream = 0; stream < 2; ++stream) {
        if (((w.redirected | w.teed) & (1 << stream)) == 0) continue;
        const std::string path = dir + (stream == 0 ? "/stdout.log" : "/stderr.log");
        w.stream_fd[stream] = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_TRUNC, 0644);
        DDP_USAGE_CHECK(w.stream_fd[stream] >= 0, "--redirects/--tee: cannot write {}: {}", path,
                        std::strerror(errno));
      }
    }
    if (!config_.log_dir.empty()) {
      const std::string path = fmt::format("{}/rank-{}.log", config_.log_dir, w.rank);
      w.log_fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_CLOEXEC | (restart ? O_APPEND : O_TRUNC), 0644);
      DDP_USAGE_CHECK(w.log_fd >= 0, "--log-dir {}: cannot write {}: {}", config_.log_dir, path,
                      std::strerror(errno));
      if (restart) {
        const std::string header = fmt::format("--- ddprun: restart {} ---\n", restart);
        (void)!::write(w.log_fd, header.data(), header.size());
      }
    }
    int out[2], err[2];
    DDP_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0, "pipe failed: {}",
              std::strerror(errno));
    std::vector<std::string> env_strings;
    for (const auto& [key, value] : env)
      env_strings.push_back(key + "=" + value);
    std::vector<char*> envp;
    for (std::string& s : env_strings)
      envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (const std::string& arg : program)
      argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    DDP_CHECK(pid >= 0, "fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      // Child: own process group (ddprun forwards signals to it), and a guard: this process
      // stays between ddprun and the worker and, when ddprun dies (even by SIGKILL, which
      // ddprun cannot act on), kills the whole group, so that a worker started through a
      // wrapper script does not outlive the job.
      ::setpgid(0, 0);
      struct sigaction died {};
      died.sa_handler = note_launcher_death;
      ::sigaction(SIGUSR1, &died, nullptr);
      ::prctl(PR_SET_PDEATHSIG, SIGUSR1);
      if (::getppid() != parent) ::_exit(127);
      const pid_t worker = ::fork();
      if (worker < 0) ::_exit(127);
      if (worker > 0) guard(worker);  // never returns
      ::signal(SIGUSR1, SIG_DFL);
      ::prctl(PR_SET_PDEATHSIG, 0);
      if (g_raised_nofile) ::setrlimit(RLIMIT_NOFILE, &g_given_nofile);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGHUP, SIG_DFL);
      ::signal(SIGPIPE, SIG_DFL);
      const int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      // execvpe looks the program up on the child's PATH.
      ::execvpe(argv[0], argv.data(), envp.data());
      std::fprintf(stderr, "ddprun: cannot run %s: %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    ::close(out[1]);
    ::close(err[1]);
    w.pid = pid;
    w.out_fd = out[0];
    w.err_fd = err[0];
    ::fcntl(w.out_fd, F_SETFL, O_NONBLOCK);
    ::fcntl(w.err_fd, F_SETFL, O_NONBLOCK);
  }
}

void WorkerGroup::emit(Worker& w, const std::string& line, bool is_err) {
  if (w.log_fd >= 0) {
    const std::string text = line + "\n";
    (void)!::write(w.log_fd, text.data(), text.size());
  }
  const int bit = is_err ? 2 : 1;
  if (w.stream_fd[is_err ? 1 : 0] >= 0) {
    const std::string text = line + "\n";
    (void)!::write(w.stream_fd[is_err ? 1 : 0], text.data(), text.size());
  }
  w.tail.push_back(line);
  if (w.tail.size() > kTailLines) w.tail.pop_front();
  if (!w.on_console) return;
  if ((w.redirected & bit) != 0 && (w.teed & bit) == 0) return;  // to its file only
  console_.line(is_err, fmt::format("[rank {}] {}", w.rank, line));
}

ssize_t WorkerGroup::pump(Worker& w, int fd, std::string& partial, bool is_err, bool flush) {
  char buffer[65536];
  const ssize_t n = ::read(fd, buffer, sizeof(buffer));
  if (n < 0 && (errno == EAGAIN || errno == EINTR) && !flush) return n;  // nothing yet
  if (n > 0) partial.append(buffer, static_cast<size_t>(n));
  size_t newline;
  while ((newline = partial.find('\n')) != std::string::npos) {
    emit(w, partial.substr(0, newline), is_err);
    partial.erase(0, newline + 1);
  }
  // A worker that writes without newlines must not grow ddprun's memory: past
  // kMaxLineBytes the text so far goes out as a line of its own.
  while (partial.size() >= kMaxLineBytes) {
    emit(w, partial.substr(0, kMaxLineBytes) + " [line split by ddprun]", is_err);
    partial.erase(0, kMaxLineBytes);
  }
  if (n <= 0) {  // EOF or error: this stream is done
    if (!partial.empty() || flush) {
      if (!partial.empty()) emit(w, partial, is_err);
      partial.clear();
    }
    ::close(fd);
    (is_err ? w.err_fd : w.out_fd) = -1;
  }
  return n;
}

void WorkerGroup::reap(bool block_until_exit) {
  for (Worker& w : workers_) {
    if (w.exited) continue;
    int status = 0;
    const pid_t got = ::waitpid(w.pid, &status, block_until_exit ? 0 : WNOHANG);
    if (got == w.pid) {
      w.exited = true;
      w.status = status;
      // The worker is done, so is everything it started (a wrapper's background jobs):
      // the group id stays valid while any member lives, so this reaches them.
      ::kill(-w.pid, SIGTERM);
      ::kill(-w.pid, SIGCONT);
      w.group_kill_at = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(config_.grace_period));
    }
  }
}

bool WorkerGroup::clean_groups() {
  bool all_gone = true;
  for (Worker& w : workers_) {
    if (!w.exited || w.group_gone) {
      all_gone = all_gone && w.group_gone;
      continue;
    }
    if (::kill(-w.pid, 0) != 0 && errno == ESRCH) {
      w.group_gone = true;
      continue;
    }
    if (std::chrono::steady_clock::now() >= w.group_kill_at) ::kill(-w.pid, SIGKILL);
    all_gone = false;
  }
  bool all_exited = true;
  for (const Worker& w : workers_)
    all_exited = all_exited && w.exited;
  if (!all_exited) return false;
  // What the workers left in sessions of their own (setsid) came to ddprun, their subreaper:
  // stopped as the workers' groups are (SIGTERM, SIGKILL after the grace period) and reaped.
  const auto now = std::chrono::steady_clock::now();
  for (const pid_t orphan : orphans()) {
    if (::waitpid(orphan, nullptr, WNOHANG) == orphan) continue;  // it had ended: reaped
    const int signal = !orphans_told_ ? SIGTERM : now >= orphans_kill_at_ ? SIGKILL : 0;
    if (signal != 0) {
      ::kill(-orphan, signal);  // its session's group, where it leads one
      ::kill(orphan, signal);
      if (signal == SIGTERM) ::kill(orphan, SIGCONT);
    }
    if (!orphans_told_) {
      orphans_told_ = true;
      orphans_kill_at_ = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(config_.grace_period));
    }
    all_gone = false;
  }
  return all_gone;
}

void WorkerGroup::stop_all(int signal) {
  for (Worker& w : workers_) {
    if (w.exited) continue;
    ::kill(-w.pid, signal);
    // A stopped worker (SIGSTOP, a debugger) acts on SIGTERM only once continued.
    if (signal != SIGKILL) ::kill(-w.pid, SIGCONT);
  }
}

namespace {

// How long the others may go on after the first failure before SIGTERM (at most the grace
// period): what every rank meets at once, each rank's own error, is then heard from each.
constexpr double kSettleSeconds = 1.0;

// "exit code 3" or "killed by SIGKILL (9)", and the exit code ddprun gives for it.
std::string describe_exit(int status, int* exit_code) {
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    *exit_code = 128 + signal;
    return fmt::format("killed by {} ({})", signal_name(signal), signal);
  }
  *exit_code = WEXITSTATUS(status);
  return fmt::format("exit code {}", WEXITSTATUS(status));
}

}  // namespace

GroupOutcome WorkerGroup::supervise(const std::function<std::string()>& peer_failed) {
  using Clock = std::chrono::steady_clock;
  GroupOutcome outcome;
  bool stopping = false;
  bool settling = false;  // after the first failure, before the others' SIGTERM
  Clock::time_point term_at = Clock::time_point::max();  // SIGINT, a failure: then SIGTERM
  Clock::time_point kill_at{};
  const auto after = [](double seconds) {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  };
  Clock::time_point last_read = Clock::now();  // when a worker's pipe last gave bytes
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, bool>> owners;  // worker index, is stderr
    // A stream whose console queue is full is not read: the workers wait on their pipes (a
    // slow reader loses nothing), while this loop goes on reaping and signalling.
    const bool take[2] = {console_.accepting(false), console_.accepting(true)};
    for (size_t i = 0; i < workers_.size(); ++i) {
      const bool shown = workers_[i].on_console;
      if (workers_[i].out_fd >= 0 && (take[0] || !shown))
        fds.push_back({workers_[i].out_fd, POLLIN, 0}), owners.push_back({i, false});
      if (workers_[i].err_fd >= 0 && (take[1] || !shown))
        fds.push_back({workers_[i].err_fd, POLLIN, 0}), owners.push_back({i, true});
    }
    if (!fds.empty()) {
      const int ready = ::poll(fds.data(), fds.size(), 50);
      if (ready > 0) {
        for (size_t k = 0; k < fds.size(); ++k) {
          if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          Worker& w = workers_[owners[k].first];
          const bool is_err = owners[k].second;
          if (pump(w, is_err ? w.err_fd : w.out_fd, is_err ? w.err_partial : w.out_partial, is_err,
                   false) > 0)
            last_read = Clock::now();
        }
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    console_.flush();
    reap(false);

    if (g_forward_signal != 0 && stopping && !outcome.interrupted &&
        !outcome.signalled_in_teardown) {
      // A signal while the group is already being stopped after a failure: the root cause,
      // its exit code and the grace period stand; ddprun only notes it and will not restart.
      outcome.signalled_in_teardown = true;
      if (settling) {  // the user's signal cuts the others' moment short; the grace period stands
        stop_all(SIGTERM);
        term_at = Clock::time_point::max();
        settling = false;
        kill_at = std::min(kill_at, after(config_.grace_period));
      }
      console_.line(true, fmt::format("ddprun: {} during the teardown: stopping as before, no "
                                      "restart",
                                      signal_name(g_forward_signal)));
    }
    if (g_forward_signal != 0 && !stopping) {
      const int signal = g_forward_signal;
      outcome.interrupted = true;
      outcome.cause = fmt::format("interrupted by {}", signal_name(signal));
      outcome.exit_code = 128 + signal;
      // SIGHUP (the terminal went away) stops the workers as SIGTERM does, as under torchrun.
      stop_all(signal == SIGHUP ? SIGTERM : signal);
      stopping = true;
      // SIGINT (what a program may catch to save its work), then SIGTERM halfway through the
      // grace period, then SIGKILL at its end.
      if (signal == SIGINT) term_at = after(config_.grace_period / 2);
      kill_at = after(config_.grace_period);
    }
    if (outcome.failed_rank < 0 && !outcome.interrupted && !outcome.peer_restart) {
      for (Worker& w : workers_) {
        if (!w.exited) continue;
        const bool failed =
            WIFSIGNALED(w.status) || (WIFEXITED(w.status) && WEXITSTATUS(w.status) != 0);
        if (!failed) continue;
        outcome.failed_rank = w.rank;
        outcome.cause = describe_exit(w.status, &outcome.exit_code);
        // The others get a moment before SIGTERM: ranks that meet the same fault (a
        // disagreement every rank finds) finish saying why on their own.
        stopping = true;
        settling = true;
        const double settle = std::min(kSettleSeconds, config_.grace_period);
        term_at = after(settle);
        kill_at = after(settle + config_.grace_period);
        break;
      }
    }
    if (settling) {
      for (Worker& w : workers_) {
        const bool failed = w.exited && (WIFSIGNALED(w.status) || WEXITSTATUS(w.status) != 0);
        if (!failed || w.rank == outcome.failed_rank || w.told_failed) continue;
        w.told_failed = true;
        int ignored = 0;
        outcome.also_failed.push_back({w.rank, describe_exit(w.status, &ignored)});
      }
    }
    if (!stopping && peer_failed) {
      const std::string cause = peer_failed();
      if (!cause.empty()) {
        outcome.peer_restart = true;
        outcome.cause = cause;
        outcome.exit_code = 1;
        stop_all(SIGTERM);
        stopping = true;
        kill_at = after(config_.grace_period);
      }
    }
    if (stopping && Clock::now() >= term_at) {
      stop_all(SIGTERM);
      term_at = Clock::time_point::max();
      settling = false;
    }
    if (stopping && Clock::now() >= kill_at) {
      stop_all(SIGKILL);
      kill_at = Clock::time_point::max();
    }
    bool all_exited = true;
    for (const Worker& w : workers_)
      all_exited = all_exited && w.exited;
    bool all_drained = true;
    for (const Worker& w : workers_)
      all_drained = all_drained && w.out_fd < 0 && w.err_fd < 0;
    // Output pipes can stay open in a worker's own children; once every worker has exited,
    // stop waiting for them once they have said nothing for a second, unless the console is
    // what holds them back (a slow reader: it drains, or is stalled and drops). A group being
    // stopped waits for the console no longer than the grace period: a reader that takes
    // nothing must not hold a SIGTERM's exit to the console's stall mark.
    const bool groups_gone = clean_groups();
    const bool grace_over = stopping && kill_at == Clock::time_point::max();
    if (all_exited && groups_gone &&
        (all_drained ||
         (Clock::now() - last_read > std::chrono::seconds(1) && take[0] && take[1]) ||
         grace_over)) {
      for (Worker& w : workers_) {
        while (w.out_fd >= 0 && pump(w, w.out_fd, w.out_partial, false, true) > 0) {
        }
        while (w.err_fd >= 0 && pump(w, w.err_fd, w.err_partial, true, true) > 0) {
        }
      }
      break;
    }
  }
  if (outcome.failed_rank >= 0) {
    for (const Worker& w : workers_)
      if (w.rank == outcome.failed_rank) outcome.last_lines.assign(w.tail.begin(), w.tail.end());
  }
  outcome.success = outcome.failed_rank < 0 && !outcome.interrupted && !outcome.peer_restart;
  return outcome;
}

}  // namespace ddp
