// The training loop on this process's GPU (call after bind_device()). With CUDA it lives
// in gpu_trainer_cuda.cpp; without, gpu_trainer_none.cpp answers with a clear error.
#pragma once

#include <functional>
#include <vector>

#include "engine/config.h"
#include "engine/gpu_monitor.h"
#include "engine/trainer.h"

namespace ddp {

// The data-parallel group, possibly still starting (NCCL takes hundreds of milliseconds, in
// which the trainer builds its model and its weights): rank and size are the launcher's,
// known at once; get() waits for the communicator and returns it (null: no group).
struct GroupStart {
  int rank = 0;
  int size = 1;
  std::function<Communicator*()> get;
};

// Trains config's model on the data that data_ready() returns (waiting for it: it may still
// be loading while the model builds) on the current device: uploads the data once, replays
// the captured step, logs and writes metrics like the CPU loop. Writes the final
// parameters to *final_params when it is not null.
// Metrics go to `metrics` when given, else to config.metrics.
// `group` is the data-parallel group over NCCL (get() may return null: one GPU).
// `monitor` (may be null: --no-gpu-monitor) samples this rank's GPU; every rank must pass one
// or none alike, since the windows are gathered to rank 0.
TrainResult train_on_gpu(const TrainConfig& config,
                         const std::function<const Dataset&()>& data_ready, const GroupStart& group,
                         MetricsWriter* metrics, std::vector<float>* final_params,
                         GpuMonitor* monitor = nullptr);

}  // namespace ddp
