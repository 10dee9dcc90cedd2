// ddp::init: the environment, the device, the store, the communicator, in that order.
#include "engine/setup/world.h"

#include "runtime/error.h"

namespace ddp {

World::~World() {
  comm_.reset();  // before the store it may still use
  store_.reset();
}

World init(const InitOptions& options) {
  World world;
  world.env_ = ProcessEnv::detect();
  ProcessEnv& env = world.env_;
  DDP_USAGE_CHECK(!env.serves_store,
                  "srun without ddprun: ddp::init does not serve the rendezvous store; start the "
                  "tasks with ddprun (srun ddprun ...) or under mpirun");
  if (options.bind_gpu) {
    if (!cuda_built()) bind_device(env, {});  // the error that says what is missing
    if (env.launcher == Launcher::kMpirun || env.launcher == Launcher::kSrun)
      narrow_visible_devices(&env);
    world.device_ = std::make_unique<DeviceInfo>(bind_device(env, {}));
  }
  if (!env.master_addr.empty() && env.master_port > 0)
    world.store_ = std::make_shared<StoreClient>(env.master_addr, env.master_port, env.store_token);
  if (world.store_ && world.device_) check_unique_gpus(*world.store_, env, *world.device_, 60.0);
  CommConfig config;
  config.backend = options.backend;
  config.timeout_s = options.timeout_s;
  config.gpu = options.bind_gpu;
  world.comm_ = make_communicator(config, env, world.store_);
  return world;
}

}  // namespace ddp
