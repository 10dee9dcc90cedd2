// Device binding: the first CUDA call of every worker. Checks what the process sees, binds
// its GPU, creates the context and times each layer of CUDA start-up; the GPU's UUID is
// then published through the store so that two ranks on one GPU fail at start.
// Built from device_cuda.cpp with CUDA, else from device_none.cpp (a clear error).
#pragma once

#include <string>
#include <vector>

#include "runtime/process_env.h"

namespace ddp {

// How long each layer of CUDA start-up took (bind_device times them).
struct InitPhases {
  double driver_ms = 0;        // loading libcuda and cuInit
  double context_ms = 0;       // primary context creation (cudaSetDevice + cudaFree(0))
  double first_alloc_ms = 0;   // first cudaMalloc
  double first_kernel_ms = 0;  // first kernel launch and completion
  int attempts = 1;            // tries it took (BindOptions::init_retries)
};

// The GPU a process bound.
struct DeviceInfo {
  int ordinal = 0;              // index among the visible devices
  std::string name;             // "NVIDIA H200"
  std::string uuid;             // "GPU-xxxxxxxx-xxxx-..."
  std::string pci_bus_id;       // "0000:1B:00.0"
  int cc_major = 0;             // compute capability, major
  int cc_minor = 0;             // and minor
  size_t total_bytes = 0;       // its memory
  int driver_version = 0;       // CUDA version the driver supports, e.g. 13000
  int runtime_version = 0;      // CUDA runtime linked, e.g. 13000
  std::string visible_devices;  // CUDA_VISIBLE_DEVICES as this process saw it
  std::string choice;           // which device was picked and why
  InitPhases phases;            // the start-up's timings
};

// How bind_device retries a start-up that failed for a transient reason.
struct BindOptions {
  int init_retries = 0;          // extra attempts after a transient start-up failure
  double retry_backoff_s = 0.5;  // doubled after each failed attempt
};

// Binds this process's GPU. Must be the process's first CUDA call: fails if a context
// already exists. Picks the only visible device, or env.local_rank modulo the visible
// count (saying so in `choice`). Throws ddp::Error naming the cause and the fix.
DeviceInfo bind_device(const ProcessEnv& env, const BindOptions& options);

// Whether this build has CUDA, and a line saying why not when it does not.
bool cuda_built();

// Two ranks on one GPU: given every rank's claim, returns an error message naming the
// ranks and their CUDA_VISIBLE_DEVICES, or "" when every GPU has one rank. Ranks that
// declare different NCCL host ids (the --share-gpu test mode) count as different hosts,
// as NCCL counts them. Pure.
struct GpuClaim {
  int rank = 0;                 // the claiming rank
  std::string host;             // its host name
  std::string uuid;             // the GPU it bound
  std::string visible_devices;  // its CUDA_VISIBLE_DEVICES
  std::string host_id;          // NCCL_HOSTID under --share-gpu, else empty
};
// The message above, or "".
std::string duplicate_gpu_message(const std::vector<GpuClaim>& claims);

class StoreClient;
// Publishes this rank's claim and checks every rank's (all ranks must call). Throws
// ddp::Error with duplicate_gpu_message() when two ranks share a GPU.
void check_unique_gpus(StoreClient& store, const ProcessEnv& env, const DeviceInfo& device,
                       double timeout_s);

// A one-line summary of the init phases for the log.
std::string describe_phases(const DeviceInfo& device);

}  // namespace ddp
