// injected_faults.
#include "engine/setup/faults.h"

#include <chrono>
#include <thread>

#include "runtime/error.h"

namespace ddp {

std::function<void(int64_t step)> injected_faults(const TrainConfig& config) {
  // A restarted generation runs clean: the fault was the first attempt's.
  const int64_t fail_at = config.restart_count > 0 ? 0 : config.fail_at_step;
  const int64_t delay_ms = config.step_delay_ms;
  if (fail_at == 0 && delay_ms == 0) return {};
  return [fail_at, delay_ms](int64_t step) {
    if (step == fail_at)
      throw Error(fmt::format("--fail-at-step {}: failing on purpose at step {}", fail_at, step));
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  };
}

}  // namespace ddp
