// Faults injected on purpose, for the launcher's and the restarts' tests: ddptrain's
// --fail-at-step (fail when that step starts, on the first attempt only) and --step-delay-ms
// (a slow rank). They reach the training loop only as its before-step hook
// (Trainer::set_before_step), never as branches of the loop itself.
#pragma once

#include <cstdint>
#include <functional>

#include "engine/config.h"

namespace ddp {

// The hook that carries out the faults `config` asks for, or an empty one when it asks for
// none. Called with the 1-based step number; --fail-at-step throws ddp::Error.
std::function<void(int64_t step)> injected_faults(const TrainConfig& config);

}  // namespace ddp
