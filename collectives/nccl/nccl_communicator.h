// The NCCL backend: GPU buffers; operations run on a dedicated communication stream,
// ordered after the compute stream by events; every call that can block on the host is
// bounded by the communicator's timeout.
#pragma once

#include <memory>
#include <string>

#include "collectives/communicator.h"

namespace ddp {

// Collective over `size` ranks. The unique id comes through the store (rank 0 publishes it
// under `group`), or through `bootstrap` when there is no store (under mpirun). Starts
// NCCL's initialisation and returns at once; calling the result waits for it (and throws
// if a rank never joined within timeout_s).
CommunicatorStart start_nccl_communicator(int rank, int size, std::shared_ptr<StoreClient> store,
                                          const std::string& group, double timeout_s,
                                          Communicator* bootstrap);

// The version of the NCCL library loaded ("2.28.3").
std::string nccl_library_version();
// A host-buffer communicator over `device` (collectives/nccl/host_staged.cpp).
std::unique_ptr<Communicator> make_host_staged_nccl(Communicator& device);

}  // namespace ddp
