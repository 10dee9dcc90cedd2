// ddp_test_worker: small workers for the launcher tests, started by ddprun.
//   store       every rank meets at the store (set, add, wait) and prints what it saw
//   bind [S]    binds its GPU (bind_device), checks that no two ranks share one, holds
//               256 MiB on it for S seconds (default 0) and prints its UUID
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/process_env.h"
#include "runtime/store.h"
#include "runtime/timer.h"

#if DDP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    const ddp::ProcessEnv env = ddp::ProcessEnv::detect();
    ddp::set_process_context({env.rank, env.world_size, mode == "bind" ? "cuda" : "cpu"});
    ddp::init_logging({env.rank, env.world_size, mode == "bind" ? "cuda" : "cpu", "", false, true});
    ddp::StoreClient store(env.master_addr, env.master_port, env.store_token, 10.0, 40.0,
                           env.run_id);
    if (mode == "store") {
      const std::string gen = std::to_string(env.restart_count);
      store.set("hello/" + gen + "/" + std::to_string(env.rank), std::to_string(env.rank * 10));
      const int64_t total = store.add("sum/" + gen, env.rank + 1);
      (void)total;
      std::vector<std::string> keys;
      for (int r = 0; r < env.world_size; ++r)
        keys.push_back("hello/" + gen + "/" + std::to_string(r));
      store.wait(keys, 20.0);
      store.set("arrived/" + gen + "/" + std::to_string(env.rank), "1");
      std::vector<std::string> arrived;
      for (int r = 0; r < env.world_size; ++r)
        arrived.push_back("arrived/" + gen + "/" + std::to_string(r));
      store.wait(arrived, 20.0);
      const int64_t sum = store.add("sum/" + gen, 0);
      const std::string peer =
          store.get("hello/" + gen + "/" + std::to_string((env.rank + 1) % env.world_size))
              .value_or("?");
      std::printf("store ok rank=%d world=%d sum=%lld peer=%s\n", env.rank, env.world_size,
                  static_cast<long long>(sum), peer.c_str());
      return 0;
    }
    if (mode == "bind") {
      const double hold_s = argc > 2 ? std::atof(argv[2]) : 0.0;
      const ddp::DeviceInfo device = ddp::bind_device(env, {});
      spdlog::info("{}", ddp::describe_phases(device));
      ddp::check_unique_gpus(store, env, device, 30.0);
#if DDP_HAVE_CUDA
      void* hold = nullptr;
      cudaMalloc(&hold, 256u << 20);
      std::printf("bind ok rank=%d uuid=%s visible=%s\n", env.rank, device.uuid.c_str(),
                  device.visible_devices.c_str());
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::duration<double>(hold_s));
      cudaFree(hold);
#endif
      return 0;
    }
    std::fprintf(stderr, "usage: ddp_test_worker store | bind [seconds]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_test_worker: error: %s\n", e.what());
    return 1;
  }
}
