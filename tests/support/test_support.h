// Helpers shared by the test suites: running a command and capturing its output, and a
// scratch folder removed at the end of the test.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "runtime/timer.h"

namespace ddp {

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string output;  // stdout and stderr
  double seconds = 0;
};

// Runs `command` through /bin/sh with stderr joined to stdout (or alone with stderr_only).
inline RunResult run_command(const std::string& command, bool stderr_only = false) {
  Stopwatch clock;
  FILE* pipe = ::popen((command + (stderr_only ? " 2>&1 >/dev/null" : " 2>&1")).c_str(), "r");
  RunResult result;
  std::array<char, 4096> buffer;
  size_t got;
  while ((got = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), got);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.seconds = clock.seconds();
  return result;
}

inline int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

// The whole file as bytes ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A loopback port that was free a moment ago (bound to 0, then released).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// What a child process run as user nobody (65534 on Debian and Ubuntu) returned: its exit
// status (3: it could not become nobody; 4: `body` threw) and what `body` put in its text.
struct AsNobody {
  int status = -1;
  std::string text;
};
// Forks, becomes nobody and runs `body` (needs root: callers skip otherwise); the child's text
// comes back through a pipe. For tests of what a process of another user gets.
inline AsNobody run_as_nobody(const std::function<int(std::string* text)>& body) {
  int fds[2];
  AsNobody result;
  if (::pipe(fds) != 0) return result;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    int code = 4;
    std::string text;
    try {
      code = body(&text);
    } catch (...) {
      code = 4;
    }
    (void)!::write(fds[1], text.data(), text.size());
    ::_exit(code);
  }
  ::close(fds[1]);
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;)
    result.text.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  if (child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status))
    result.status = WEXITSTATUS(status);
  return result;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ddp-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs `job` (a ddprun command line) in the background with its output in a log, sends
// `signal` to the ddptrain process of rank `rank` once the job has logged `line`, waits for
// the job, and prints the log, "stopped after S s" (from the signal to ddprun's exit) and
// "LEFT BEHIND PID" for any of this job's ddptrain processes still running (the job's
// processes carry DDP_TEST_TAG=<dir>, so that other tests' processes are not counted).
inline RunResult run_and_signal(const TempDir& dir, const std::string& job, const std::string& line,
                                int rank, const std::string& signal) {
  const std::string log = dir.file("job.log");
  const std::string script =
      "ours() { [ \"$(cat $1/comm 2>/dev/null)\" = ddptrain ] && "
      "tr '\\0' '\\n' < $1/environ 2>/dev/null | grep -qx \"DDP_TEST_TAG=" +
      dir.path() +
      "\"; }\n"
      "(export DDP_TEST_TAG=" +
      dir.path() + "; " + job + " > " + log + " 2>&1; echo \"ddprun exit $?\" >> " + log +
      "; date +%s.%N > " + log +
      ".end) &\n"
      "for i in $(seq 1200); do grep -q '" +
      line + "' " + log +
      " && break; sleep 0.05; done\n"
      "for d in /proc/[0-9]*; do\n"
      "  ours $d && tr '\\0' '\\n' < $d/environ | grep -qx RANK=" +
      std::to_string(rank) + " && kill -" + signal + " ${d#/proc/} && date +%s.%N > " + log +
      ".at\n"
      "done\n"
      "wait\n"
      "cat " +
      log +
      "\n"
      "awk -v a=\"$(cat " +
      log + ".at)\" -v b=\"$(cat " + log +
      ".end)\" 'BEGIN { printf \"stopped after %.2f s\\n\", b - a }'\n"
      "for d in /proc/[0-9]*; do ours $d && echo LEFT BEHIND ${d#/proc/}; done\n"
      "true\n";
  std::ofstream(dir.file("run.sh")) << script;
  return run_command("sh " + dir.file("run.sh"));
}

// Seconds from the signal to ddprun's exit, from run_and_signal's output (1e9 if absent).
inline double stopped_after(const std::string& output) {
  const size_t at = output.find("stopped after ");
  return at == std::string::npos ? 1e9 : std::atof(output.c_str() + at + 14);
}

}  // namespace ddp
