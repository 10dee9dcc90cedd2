// The GPU runner in a build without CUDA: the error that says so.
#include "engine/runners/stage_runner.h"
#include "runtime/error.h"

namespace ddp {

namespace {
[[noreturn]] void no_cuda() {
  throw UsageError(
      "--device cuda: this build has no CUDA support; rebuild with the CUDA toolkit or use "
      "--device cpu");
}
}  // namespace

std::unique_ptr<StageRunner> make_gpu_runner(const RankStages&, const RunnerOptions&) {
  no_cuda();
}

}  // namespace ddp
