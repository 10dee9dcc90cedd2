// ddptrain: trains an MLP; today one process on the CPU.
#include <cstdio>
#include <exception>

#include <spdlog/spdlog.h>

#include "engine/config.h"
#include "engine/trainer.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/process_env.h"
#include "runtime/timer.h"

int main(int argc, char** argv) {
  try {
    ddp::TrainConfig config;
    if (!ddp::parse_train_args(argc, argv, &config)) return 0;
    const ddp::ProcessEnv env = ddp::ProcessEnv::detect();
    DDP_USAGE_CHECK(env.world_size == 1,
                    "started as rank {} of {} by {}, but this build trains one process only",
                    env.rank, env.world_size, ddp::launcher_name(env.launcher));
    ddp::set_process_context({env.rank, env.world_size, config.device});
    ddp::init_logging({env.rank, env.world_size, config.device, "", false, false});
    for (const std::string& line : ddp::describe(config))
      spdlog::info("{}", line);
    ddp::Stopwatch load_clock;
    const ddp::Dataset data = ddp::load_dataset(config);
    spdlog::info("loaded {}: {} train, {} test samples, {} features, {} classes in {:.2f}s",
                 data.name, data.train.n, data.test.n, data.train.dim, data.classes,
                 load_clock.seconds());
    ddp::Trainer trainer(config, data);
    trainer.run();
    return 0;
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "ddptrain: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddptrain: error: %s\n", e.what());
    return 1;
  }
}
