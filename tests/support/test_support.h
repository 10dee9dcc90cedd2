// Helpers shared by the test suites: running a command and capturing its output, and a
// scratch folder removed at the end of the test.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
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

}  // namespace ddp
