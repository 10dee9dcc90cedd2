// spdlog set-up: every line carries "rank/world device"; rank 0 prints at info level on the
// console, other ranks only warnings, and any rank may also write its own log file.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace ddp {

struct LogConfig {
  int rank = 0;
  int world = 1;
  std::string device = "cpu";
  std::string file;        // empty: no file
  bool verbose = false;    // debug level on the console
  bool all_ranks = false;  // every rank prints info on the console
  bool show_rank = true;   // "[r/w device]" on each line; false: "[device]" (the launcher says
                           // the rank, as ddprun's "[rank N]" prefix does)
};

// Installs the default logger. Call once, early in main; safe to call again (replaces it).
void init_logging(const LogConfig& config);

}  // namespace ddp
