// The training loop on this process's GPU (call after bind_device()). With CUDA it lives
// in gpu_trainer_cuda.cpp; without, gpu_trainer_none.cpp answers with a clear error.
#pragma once

#include <vector>

#include "engine/config.h"
#include "engine/gpu_monitor.h"
#include "engine/trainer.h"

namespace ddp {

// Trains config's model on `data` on the current device: uploads the data once, replays
// the captured step, logs and writes metrics like the CPU loop. Writes the final
// parameters to *final_params when it is not null.
// Metrics go to `metrics` when given, else to config.metrics.
// `comm` (may be null: one GPU) is the data-parallel group over NCCL.
// `monitor` (may be null: --no-gpu-monitor) samples this rank's GPU; every rank must pass one
// or none alike, since the windows are gathered to rank 0.
TrainResult train_on_gpu(const TrainConfig& config, const Dataset& data, Communicator* comm,
                         MetricsWriter* metrics, std::vector<float>* final_params,
                         GpuMonitor* monitor = nullptr);

}  // namespace ddp
