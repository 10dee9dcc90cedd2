// One call joins the job: ddp::init() reads who this process is (ddprun, torchrun, mpirun,
// srun or none: runtime/process_env.h), binds its GPU first when asked (before any other
// CUDA call; two ranks on one GPU fail at start), connects the rendezvous store and makes
// the world communicator (Gloo, MPI or NCCL: collectives/communicator.h). The World owns
// them and ends them in order (the communicator, then the store). Like PyTorch's
// init_process_group, for one's own programs; ddptrain does the same in its own way.
#pragma once

#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "runtime/device.h"
#include "runtime/process_env.h"
#include "runtime/store.h"

namespace ddp {

// What ddp::init does beyond reading the environment.
struct InitOptions {
  Backend backend = Backend::kAuto;  // auto: NCCL with bind_gpu, else Gloo (ddprun) or
                                     // MPI (mpirun); or kGloo, kMpi, kNccl
  bool bind_gpu = false;             // bind this rank's GPU and put the collectives' buffers there
  double timeout_s = 300;            // a collective that does not complete by then fails, naming
                                     // the ranks that never reached it
};

// This process in the job, as ddp::init made it: its place, its GPU, the store and the
// world communicator, which it owns and ends in order (the communicator first).
class World {
 public:
  // This process's rank in the job.
  int rank() const { return env_.rank; }
  // The job's processes.
  int size() const { return env_.world_size; }
  // Its index on this node.
  int local_rank() const { return env_.local_rank; }
  // The processes on this node.
  int local_size() const { return env_.local_world_size; }
  // Everything the launcher said (ProcessEnv).
  const ProcessEnv& env() const { return env_; }
  // The GPU bound (bind_gpu), or null.
  const DeviceInfo* device() const { return device_ ? device_.get() : nullptr; }
  // The world communicator.
  Communicator& comm() { return *comm_; }
  // Stops every pending collective so that the other ranks stop waiting (on a fatal error).
  void abort() { comm_->abort(); }

  // Moves the world, what it owns with it.
  World(World&&) = default;
  // Moves the world, what it owns with it.
  World& operator=(World&&) = default;
  ~World();

 private:
  friend World init(const InitOptions& options);
  World() = default;
  ProcessEnv env_;
  std::unique_ptr<DeviceInfo> device_;
  std::shared_ptr<StoreClient> store_;
  std::unique_ptr<Communicator> comm_;
};

// Collective: every rank of the job calls it once. Throws UsageError for what the user can
// fix (a backend this build lacks, bind_gpu without CUDA, srun without ddprun and no
// DDP_STORE_TOKEN) and ddp::Error for the rest, each naming the cause.
World init(const InitOptions& options = {});

}  // namespace ddp
