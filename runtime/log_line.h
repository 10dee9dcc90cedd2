// One finished line to the default logger at info level, for code that cannot include spdlog
// (the torch component: LibTorch's own fmt headers shadow the fmt spdlog was built with).
#pragma once

#include <string>

namespace ddp {

// spdlog::info of `line`, as it is.
void log_info_line(const std::string& line);

}  // namespace ddp
