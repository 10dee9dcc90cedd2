// One call joins the job: ddp::init() reads who this process is (ddprun, torchrun, mpirun,
// srun or none: runtime/process_env.h), serves the rendezvous store where it must (rank 0 under
// srun without ddprun), binds its GPU first when asked (before any other CUDA call; two ranks
// on one GPU fail at start), connects the store and makes the world communicator (Gloo, MPI or
// NCCL: collectives/communicator.h), NCCL's in the background where asked. The World owns
// them and ends them in order (the communicator, the store client, the store served). An
// exception the program leaves uncaught then ends it with its message and exit status 2
// (UsageError) or 1, not an abort. Like PyTorch's init_process_group, for one's own programs;
// ddptrain starts the same way.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "runtime/device.h"
#include "runtime/process_env.h"
#include "runtime/store.h"

namespace ddp {

class StoreServer;
class World;

// What ddp::init does beyond reading the environment.
struct InitOptions {
  Backend backend = Backend::kAuto;  // auto: NCCL with bind_gpu, else Gloo (ddprun) or
                                     // MPI (mpirun); or kGloo, kMpi, kNccl
  bool bind_gpu = false;             // bind this rank's GPU and put the collectives' buffers there
  double timeout_s = 300;            // a collective that does not complete by then fails, naming
                                     // the ranks that never reached it
  int bind_retries = 0;              // CUDA start-up tried again this often where the device is
                                     // busy or not ready (ddptrain's --init-retries)
  bool communicator_alone = true;    // false: a job of one process gets no communicator unless
                                     // `backend` names one (World::has_comm)
  bool start_in_background = false;  // NCCL's start goes on while init returns; the first
                                     // World::comm() waits for it (the model builds meanwhile)
  // Called once the GPU is bound (bind_gpu), before the store and the communicator: a
  // program's own checks of the device (ddptrain's memory check) and its log lines.
  std::function<void(const World&)> on_device;
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
  // Whether there is a world communicator (InitOptions::communicator_alone).
  bool has_comm() const { return comm_ != nullptr || starting_ != nullptr; }
  // The world communicator (the first call waits for a start in the background); a
  // ddp::Error without one.
  Communicator& comm();
  // A new connection to the job's rendezvous store, for a thread of one's own (the one
  // ddp::init made is the main thread's; ddp::Checkpointer's writer takes its own); null where
  // the job has none (one process alone).
  std::unique_ptr<StoreClient> connect_store() const;
  // Seconds from the communicator's start to its being ready (after comm()).
  double comm_seconds() const { return comm_s_; }
  // Stops every pending collective so that the other ranks stop waiting (on a fatal error);
  // nothing while the communicator is still starting or where there is none.
  void abort() {
    if (comm_) comm_->abort();
  }

  // Moves the world, what it owns with it.
  World(World&&) noexcept;
  // Moves the world, what it owns with it.
  World& operator=(World&&) noexcept;
  // Ends what it owns in order: the communicator, the store client, the store served.
  ~World();

 private:
  friend World init(const InitOptions& options, ProcessEnv env);
  World() = default;
  ProcessEnv env_;
  std::unique_ptr<StoreServer> served_;  // rank 0 under srun without ddprun
  std::unique_ptr<DeviceInfo> device_;
  std::shared_ptr<StoreClient> store_;
  std::function<std::unique_ptr<StoreClient>()> connect_;  // how store_ was connected
  CommunicatorStart starting_;  // a start in the background, until comm()
  std::unique_ptr<Communicator> comm_;
  std::chrono::steady_clock::time_point comm_started_;
  double comm_s_ = 0;
};

// Collective: every rank of the job calls it once. Throws UsageError for what the user can
// fix (a backend this build lacks, bind_gpu without CUDA, srun without ddprun and no
// DDP_STORE_TOKEN outside Slurm) and ddp::Error for the rest, each naming the cause.
World init(const InitOptions& options = {});
// The same for a process that read its environment already (ProcessEnv::detect()).
World init(const InitOptions& options, ProcessEnv env);

}  // namespace ddp
