// The MPI backend: CPU buffers under mpirun, through MPI-3 non-blocking collectives polled
// against the deadline.
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace ddp {

// The world communicator; initialises MPI (and finalises it when destroyed) unless the
// program already did.
std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<StoreClient> store,
                                                    double timeout_s);

}  // namespace ddp
