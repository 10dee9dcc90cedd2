// ddptrain: trains an MLP on the CPU or on this process's GPU; under ddprun, mpirun or srun
// it binds its device first (the process's first CUDA call).
#include <cstdio>
#include <exception>

#include <spdlog/spdlog.h>

#include "engine/config.h"
#include "engine/gpu_trainer.h"
#include "engine/metrics.h"
#include "engine/trainer.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/process_env.h"
#include "runtime/store.h"
#include "runtime/timer.h"

int main(int argc, char** argv) {
  try {
    ddp::Stopwatch process_clock;
    ddp::TrainConfig config;
    if (!ddp::parse_train_args(argc, argv, &config)) return 0;
    ddp::ProcessEnv env = ddp::ProcessEnv::detect();
    DDP_USAGE_CHECK(env.world_size == 1,
                    "started as rank {} of {} by {}, but data-parallel training is not built yet; "
                    "run one process",
                    env.rank, env.world_size, ddp::launcher_name(env.launcher));
    const bool cuda = config.device == "cuda";
    ddp::set_process_context({env.rank, env.world_size, config.device});
    ddp::init_logging({env.rank, env.world_size, config.device, "", false, false});
    ddp::MetricsWriter metrics =
        config.metrics.empty() ? ddp::MetricsWriter() : ddp::MetricsWriter(config.metrics);
    if (cuda) {
      if (env.launcher == ddp::Launcher::kMpirun || env.launcher == ddp::Launcher::kSrun)
        ddp::narrow_visible_devices(&env);
      const ddp::DeviceInfo device = ddp::bind_device(env, {config.init_retries, 0.5});
      ddp::set_process_context({env.rank, env.world_size, "cuda:" + device.uuid.substr(0, 12)});
      spdlog::info("{}", ddp::describe_phases(device));
      metrics.write({{"event", "init"}, {"device", device.name}, {"uuid", device.uuid},
                     {"driver_ms", device.phases.driver_ms}, {"context_ms", device.phases.context_ms},
                     {"first_alloc_ms", device.phases.first_alloc_ms},
                     {"first_kernel_ms", device.phases.first_kernel_ms},
                     {"attempts", device.phases.attempts}});
      if (!env.master_addr.empty() && env.master_port > 0) {
        ddp::StoreClient store(env.master_addr, env.master_port, env.store_token);
        ddp::check_unique_gpus(store, env, device, 60.0);
      }
    }
    for (const std::string& line : ddp::describe(config)) spdlog::info("{}", line);
    ddp::Stopwatch load_clock;
    const ddp::Dataset data = ddp::load_dataset(config);
    spdlog::info("loaded {}: {} train, {} test samples, {} features, {} classes in {:.2f}s",
                 data.name, data.train.n, data.test.n, data.train.dim, data.classes,
                 load_clock.seconds());
    if (cuda) {
      ddp::train_on_gpu(config, data, &metrics, nullptr);
    } else {
      ddp::Trainer trainer(config, data);
      trainer.run(&metrics);
    }
    spdlog::info("process time {:.2f}s", process_clock.seconds());
    return 0;
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "ddptrain: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddptrain: error: %s\n", e.what());
    return 1;
  }
}
