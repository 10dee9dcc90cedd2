// train_on_gpu() in a build without CUDA.
#include "engine/gpu_trainer.h"
#include "engine/stage_runner.h"
#include "runtime/error.h"

namespace ddp {

TrainResult train_on_gpu(const TrainConfig&, const std::function<const Dataset&()>&,
                         const GroupStart&, MetricsWriter*, std::vector<float>*, GpuMonitor*) {
  throw UsageError(
      "--device cuda: this build has no CUDA support; rebuild with the CUDA toolkit or use "
      "--device cpu");
}

std::unique_ptr<StageRunner> make_gpu_runner(const StageSpec&, const TrainConfig&, const Dataset&,
                                             StageLinks, Communicator*, std::function<void()>) {
  throw UsageError(
      "--device cuda: this build has no CUDA support; rebuild with the CUDA toolkit or use "
      "--device cpu");
}

}  // namespace ddp
