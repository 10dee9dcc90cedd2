// ddp's collectives alone, for programs that bring their own training loop: the process's
// place in the job (ProcessEnv::detect(): ddprun, torchrun, mpirun, srun or alone), the
// launcher's store (StoreClient), binding this rank's GPU (bind_device), and the world
// communicator over NCCL, Gloo or MPI (make_communicator, Communicator). Each header states
// its contract; this one only gathers them. <ddp/ddp.h> adds ddp::init, World and Reducer.
#pragma once

#include "collectives/backend.h"
#include "collectives/communicator.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/process_env.h"
#include "runtime/store.h"
