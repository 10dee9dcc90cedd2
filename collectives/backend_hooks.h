// How the factory reaches the backends that live in libraries of their own (ddp_nccl,
// ddp_mpi), so that a program that links neither (a CPU-only one: find_package(ddp) without
// components, ddp::ddp) needs neither NCCL nor CUDA nor MPI. Each such library defines its
// hook; the factory declares the hooks weak and a hook that was not linked is null. The
// library's target makes the linker keep its hook (--undefined=ddp_<name>_backend), which a
// static archive would otherwise drop.
#pragma once

#include <memory>
#include <string>

#include "collectives/communicator.h"

namespace ddp {

struct NcclBackend {
  CommunicatorStart (*start)(int rank, int size, std::shared_ptr<StoreClient> store,
                             const std::string& group, double timeout_s, Communicator* bootstrap);
  std::unique_ptr<Communicator> (*host_staged)(Communicator& device);
  std::string (*version)();
  // ncclMemAlloc's memory for windows; null where this NCCL has none (before 2.27).
  const DeviceAllocator* window_memory;
};

struct MpiBackend {
  std::unique_ptr<Communicator> (*make)(std::shared_ptr<StoreClient> store, double timeout_s);
};

}  // namespace ddp

extern "C" {
// Defined by collectives/nccl and collectives/mpi; weak where the factory reads them.
const ddp::NcclBackend* ddp_nccl_backend();
const ddp::MpiBackend* ddp_mpi_backend();
}
