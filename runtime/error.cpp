// Process context and the cold path of the DDP_CHECK macros.
#include "runtime/error.h"

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

namespace detail {
void throw_check_failed(const char* file, int line, const char* statement,
                        const std::string& message) {
  const ProcessContext& c = g_context;
  throw Error(fmt::format("{} [at {}:{}: {}; rank {}/{}, device {}]", message, file, line,
                          statement, c.rank, c.world, c.device));
}
}  // namespace detail
}  // namespace ddp
