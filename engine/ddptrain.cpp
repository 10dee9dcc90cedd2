// ddptrain: trains an MLP on the CPU or on this process's GPU, alone or as one rank of a
// data-parallel job started by ddprun, mpirun or srun. It joins the job as every program does,
// through ddp::init (dist/world.h: the store served under srun, the GPU bound first,
// NCCL started while the model builds), with its own checks of the device; on a fatal error it
// aborts the communicator so that peers stop waiting, then exits non-zero.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <future>
#include <memory>
#include <optional>

#include <spdlog/spdlog.h>

#include "collectives/communicator.h"
#include "dist/world.h"
#include "engine/config.h"
#include "engine/loop/checkpoint.h"
#include "engine/loop/trainer.h"
#include "engine/runners/stage_runner.h"
#include "engine/setup/faults.h"
#include "engine/setup/run_setup.h"
#include "engine/telemetry/gpu_monitor.h"
#include "engine/telemetry/metrics.h"
#include "models/mlp.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/process_env.h"
#include "runtime/store.h"
#include "runtime/timer.h"

namespace {

// The metrics' last record when a run fails: why, at which step, on which rank.
void write_failed(ddp::MetricsWriter& metrics, const std::exception& e, int64_t step, int rank,
                  int exit_code) {
  try {
    metrics.write({{"event", "failed"},
                   {"reason", e.what()},
                   {"step", step},
                   {"rank", rank},
                   {"exit_code", exit_code},
                   {"non_finite", dynamic_cast<const ddp::NonFiniteError*>(&e) != nullptr}});
  } catch (const std::exception&) {
    // the metrics file itself may be what failed
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<ddp::World> world;  // outlives the try: a failure aborts its communicator
  ddp::MetricsWriter metrics;       // outlives the try: a failure's record goes to it
  int64_t step_reached = 0;
  int rank = 0;
  try {
    ddp::Stopwatch process_clock;
    const double start_ms = ddp::wall_clock_ms();
    ddp::TrainConfig config;
    if (!ddp::parse_train_args(argc, argv, &config)) return 0;
    ddp::ProcessEnv env = ddp::ProcessEnv::detect();
    config.restart_count = env.restart_count;
    config.cache_dir = env.cache_dir;
    config.start_time_ms = env.launch_time_ms > 0 ? env.launch_time_ms : start_ms;
    const bool cuda = config.device == ddp::Device::kCuda;
    const bool lead = env.rank == 0;
    rank = env.rank;
    const std::string device = ddp::device_name(config.device);
    ddp::set_process_context({env.rank, env.world_size, device});
    // Under ddprun, whose "[rank N]" starts each line, the lines name the device only.
    ddp::init_logging({env.rank, env.world_size, device, "", false, false, !env.rank_prefixed});
    // Before anything slow: a run must not train for hours and then fail to write.
    std::unique_ptr<ddp::CheckpointDirLock> checkpoint_lock;
    if (lead) {
      ddp::check_outputs_writable(config);
      if (!config.checkpoint_dir.empty()) {
        checkpoint_lock = std::make_unique<ddp::CheckpointDirLock>(config.checkpoint_dir);
        // A restarted generation without --resume starts afresh by the program's own choice:
        // the earlier generation's files are kept aside, not refused.
        ddp::prepare_checkpoint_dir(config.checkpoint_dir, ddp::parse_layers(config.layers),
                                    config.seed, config.resume,
                                    config.fresh || env.restart_count > 0);
      }
    }
    // The layout (dp x pp, the batch among the replicas) before the collectives start, so that
    // every rank stops with the same usage error: checked after joining, a rank still
    // connecting would report its peers' exit instead, and ddprun could name that first.
    ddp::stage_cut(config, ddp::layout_of(config, env.world_size, env.rank).replicas);
    // Before anything is allocated: what the flags ask for against what this machine has
    // (its ranks share it); the GPU's part is checked once the device is bound.
    const ddp::MemoryNeed need = ddp::estimate_memory(config);
    {
      ddp::MemoryNeed on_host = need;
      if (cuda) on_host.model_bytes = on_host.activation_bytes = 0;
      ddp::check_memory_fits(
          config, on_host, ddp::available_host_bytes() / std::max(1, env.local_world_size),
          env.local_world_size > 1
              ? fmt::format("this machine's share of each of its {} ranks", env.local_world_size)
              : "this machine");
    }
    // The dataset loads (and decompresses) on another thread while CUDA and the
    // communicator start: both take hundreds of milliseconds.
    ddp::Stopwatch load_clock;
    std::future<ddp::Dataset> loading =
        std::async(std::launch::async, [config] { return ddp::load_dataset(config); });
    // A resumed or restarted run appends to the metrics, marked by a "resume" record.
    const bool continuing =
        env.restart_count > 0 ||
        (config.resume && ddp::find_latest_checkpoint(config.checkpoint_dir).has_value());
    if (!config.metrics.empty() && lead) metrics = ddp::MetricsWriter(config.metrics, continuing);
    nlohmann::json device_record = nullptr;
    ddp::InitOptions options;
    options.backend = config.backend;
    options.bind_gpu = cuda;
    options.timeout_s = config.timeout;
    options.bind_retries = config.init_retries;
    // One process gets a communicator too when a backend is named, so that the data-parallel
    // path can be checked against the plain one on a single device.
    options.communicator_alone = false;
    // On the GPU, NCCL starts while the model runner builds its plans; the CPU backends start
    // in init.
    options.start_in_background = cuda;
    options.on_device = [&](const ddp::World& joined) {
      const ddp::DeviceInfo& device = *joined.device();
      const ddp::ProcessEnv& e = joined.env();
      ddp::set_process_context({e.rank, e.world_size, "cuda:" + device.uuid.substr(4, 8)});
      ddp::init_logging({e.rank, e.world_size, "cuda:" + device.uuid.substr(4, 8), "", false, false,
                         !e.rank_prefixed});
      spdlog::info("{}", ddp::describe_phases(device));
      ddp::MemoryNeed on_device = need;
      on_device.data_bytes = 0;  // kept on the host when it does not fit (--stage-from-host)
      const int sharing = e.share_gpu ? std::max(1, e.local_world_size) : 1;
      ddp::check_memory_fits(config, on_device, static_cast<double>(device.total_bytes) / sharing,
                             sharing > 1
                                 ? fmt::format("the GPU's share of each of its {} ranks", sharing)
                                 : "the GPU " + device.name);
      if (e.share_gpu)
        spdlog::warn(
            "test mode (--share-gpu / DDP_SHARE_GPU=1): the ranks share this GPU, each its own "
            "NCCL host (NCCL_HOSTID={}); NCCL traffic goes through sockets: correct but slow, "
            "never a performance figure",
            e.nccl_host_id);
      device_record = {{"gpu", device.name},
                       {"uuid", device.uuid},
                       {"cuda_runtime", device.runtime_version},
                       {"cuda_driver", device.driver_version},
                       {"driver_ms", device.phases.driver_ms},
                       {"context_ms", device.phases.context_ms},
                       {"first_alloc_ms", device.phases.first_alloc_ms},
                       {"first_kernel_ms", device.phases.first_kernel_ms},
                       {"attempts", device.phases.attempts}};
    };
    world.emplace(ddp::init(options, env));
    std::unique_ptr<ddp::GpuMonitor> gpu_monitor;
    if (cuda && config.gpu_monitor) {
      gpu_monitor = std::make_unique<ddp::GpuMonitor>(world->device()->uuid);
      if (gpu_monitor->available())
        spdlog::info("gpu monitor: sampling {} through NVML every {:.1f}s (--no-gpu-monitor: off)",
                     world->device()->uuid.substr(0, 12), gpu_monitor->period_s());
      else
        spdlog::info("gpu monitor: off ({}); no gpu fields in the metrics", gpu_monitor->why());
    }
    if (!cuda) spdlog::info("gpu monitor: off (--device cpu)");
    ddp::Communicator* comm = nullptr;
    auto started = [&] {
      comm = &world->comm();
      spdlog::info("rank {} of {} ({}), collectives over {} (ready {:.2f}s after its start)",
                   env.rank, env.world_size, ddp::launcher_name(env.launcher), comm->backend(),
                   world->comm_seconds());
    };
    if (world->has_comm() && !cuda) started();
    // The first record says what this run is, so that runs can be told apart later; a
    // resumed or restarted run appends it again with its restart count.
    metrics.write({{"event", continuing ? "resume" : "start"},
                   {"start_time", ddp::iso_time(config.start_time_ms)},
                   {"restart_count", env.restart_count},
                   {"config", ddp::config_json(config)},
                   {"world",
                    {{"size", env.world_size},
                     {"local_size", env.local_world_size},
                     {"nodes", env.world_size / std::max(1, env.local_world_size)},
                     {"launcher", ddp::launcher_name(env.launcher)},
                     {"backend", comm                ? comm->backend()
                                 : world->has_comm() ? "nccl"
                                                     : "none"}}},
                   {"versions",
                    {{"ddp", DDP_VERSION},
                     {"built_backends", ddp::built_backends()},
                     {"nccl", ddp::nccl_version()}}},
                   {"device", device_record}});
    for (const std::string& line : ddp::describe(config))
      spdlog::info("{}", line);
    std::optional<ddp::Dataset> loaded;
    auto data_ready = [&]() -> const ddp::Dataset& {
      if (!loaded) {
        loaded = loading.get();
        spdlog::info(
            "loaded {}: {} train, {} test samples, {} features, {} classes ({:.2f}s after start)",
            loaded->name, loaded->train.n, loaded->test.n, loaded->train.dim, loaded->classes,
            load_clock.seconds());
      }
      return *loaded;
    };
    // The whole model's GPU runner builds its plans (and autotunes) while the data loads and
    // NCCL starts; a pipeline's stages, and the CPU, are made by the trainer.
    std::unique_ptr<ddp::StageRunner> runner;
    if (cuda && config.pp == 1)
      runner =
          ddp::make_gpu_runner(ddp::RankStages{{ddp::whole_model_spec(config, env.world_size)}},
                               ddp::runner_options(config));
    const ddp::Dataset& data = data_ready();
    if (world->has_comm() && comm == nullptr) started();
    {
      // Its groups (split from the world) go before the world does.
      ddp::Trainer trainer(config, data, comm, std::move(runner));
      trainer.set_before_step(ddp::injected_faults(config));
      step_reached = trainer.current_step();
      try {
        trainer.run(&metrics, gpu_monitor.get());
      } catch (...) {
        step_reached = trainer.current_step();
        throw;
      }
    }
    spdlog::info("process time {:.2f}s", process_clock.seconds());
    world.reset();  // the communicator before the store and the device go
    return 0;
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "ddptrain: error: %s\n", ddp::error_text(e).c_str());
    std::fflush(stderr);
    if (world) world->abort();
    write_failed(metrics, e, step_reached, rank, 2);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddptrain: error: %s\n", ddp::error_text(e).c_str());
    std::fflush(stderr);
    if (world) world->abort();
    write_failed(metrics, e, step_reached, rank, 1);
    return 1;
  }
}
