// Hello world of ddp: every rank binds its GPU (with --device cuda), joins the group and
// all-reduces its rank + 1; rank r prints the sum, which is size * (size + 1) / 2 on every
// rank. Run: ddprun --nproc-per-node 2 -- ./hello   (or: mpirun -np 2 ./hello)
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <ddp/collectives.h>

#if DDP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

int main(int argc, char** argv) {
  std::unique_ptr<ddp::Communicator> comm;
  try {
    const bool gpu =
        argc > 2 && std::strcmp(argv[1], "--device") == 0 && std::strcmp(argv[2], "cuda") == 0;
    ddp::ProcessEnv env = ddp::ProcessEnv::detect();
    if (gpu) {
      if (env.launcher == ddp::Launcher::kMpirun) ddp::narrow_visible_devices(&env);
      const ddp::DeviceInfo device = ddp::bind_device(env, {});  // the first CUDA call
      std::printf("rank %d bound %s\n", env.rank, device.name.c_str());
    }
    std::shared_ptr<ddp::StoreClient> store;
    if (env.master_port > 0)
      store = std::make_shared<ddp::StoreClient>(env.master_addr, env.master_port, env.store_token);
    ddp::CommConfig config;
    config.gpu = gpu;
    comm = ddp::make_communicator(config, env, store);
    float value = static_cast<float>(comm->rank() + 1);
#if DDP_HAVE_CUDA
    float* device_value = nullptr;
    if (gpu) {
      cudaMalloc(&device_value, sizeof(float));
      cudaMemcpy(device_value, &value, sizeof(float), cudaMemcpyHostToDevice);
      comm->all_reduce(device_value, 1, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
      cudaMemcpy(&value, device_value, sizeof(float), cudaMemcpyDeviceToHost);
      cudaFree(device_value);
    } else
#endif
    {
      comm->all_reduce(&value, 1, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
    }
    std::printf("hello from rank %d of %d over %s: sum %g\n", comm->rank(), comm->size(),
                comm->backend(), value);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hello: error: %s\n", e.what());
    if (comm) comm->abort();
    return 1;
  }
}
