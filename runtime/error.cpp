// Process context and the cold path of the DDP_CHECK macros.
#include "runtime/error.h"

#include <cstdlib>

namespace ddp {
namespace {
ProcessContext g_context;  // plain data, set once by main; owns no GPU or network state
}  // namespace

void set_process_context(const ProcessContext& context) {
  g_context = context;
}
const ProcessContext& process_context() {
  return g_context;
}

std::string error_text(const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  const char* debug = std::getenv("DDP_DEBUG");
  if (error == nullptr || error->where().empty() || debug == nullptr || std::string(debug) != "1")
    return e.what();
  return fmt::format("{} [at {}]", e.what(), error->where());
}

namespace detail {
void throw_check_failed(const char* file, int line, const char* statement,
                        const std::string& message) {
  const ProcessContext& c = g_context;
  throw Error(fmt::format("{} [rank {}/{}, device {}]", message, c.rank, c.world, c.device),
              fmt::format("{}:{}: {}", file, line, statement));
}
}  // namespace detail
}  // namespace ddp
