// Hello world of ddp: every rank joins the job with ddp::init (binding its GPU with --device
// cuda) and all-reduces its rank + 1; rank r prints the sum, which is size * (size + 1) / 2 on
// every rank (the GPU path where this ddp has NCCL). Run: ddprun --nproc-per-node 2 -- ./hello
// (or: mpirun -np 2 ./hello)
#include <cstdio>
#include <cstring>

#include <ddp/ddp.h>

#if DDP_HAVE_NCCL
#include <cuda_runtime.h>
#endif

int main(int argc, char** argv) {
  ddp::InitOptions options;
  options.bind_gpu =
      argc > 2 && std::strcmp(argv[1], "--device") == 0 && std::strcmp(argv[2], "cuda") == 0;
  ddp::World world = ddp::init(options);  // errors end the program with their message
  if (world.device() != nullptr)
    std::printf("rank %d bound %s\n", world.rank(), world.device()->name.c_str());
  ddp::Communicator& comm = world.comm();
  float value = static_cast<float>(comm.rank() + 1);
#if DDP_HAVE_NCCL
  if (options.bind_gpu) {
    float* on_device = nullptr;
    cudaMalloc(&on_device, sizeof(float));
    cudaMemcpy(on_device, &value, sizeof(float), cudaMemcpyHostToDevice);
    comm.all_reduce(on_device, 1, ddp::ReduceOp::kSum);
    cudaMemcpy(&value, on_device, sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(on_device);
  } else
#endif
  {
    comm.all_reduce(&value, 1, ddp::ReduceOp::kSum);
  }
  std::printf("hello from rank %d of %d over %s: sum %g\n", comm.rank(), comm.size(),
              comm.backend(), value);
  return 0;
}
