// ProcessEnv: who this process is (rank, world, local rank) and where the rendezvous store
// is, read from the launcher's environment: ddprun/torchrun, mpirun (Open MPI), srun
// (Slurm), or none (a single process). The only place besides the launcher that reads
// environment variables.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace ddp {

// What started this process (kDdprun also stands for torchrun, which sets the same variables).
enum class Launcher { kNone, kDdprun, kMpirun, kSrun };
// "none", "ddprun", "mpirun", "srun" (for messages).
const char* launcher_name(Launcher launcher);

// This process's place in the job (the top of this file).
struct ProcessEnv {
  Launcher launcher = Launcher::kNone;  // what started it
  int rank = 0;                         // RANK: its index in the job
  int world_size = 1;                   // WORLD_SIZE: the job's processes
  int local_rank = 0;                   // LOCAL_RANK: its index on this node
  int local_world_size = 1;             // LOCAL_WORLD_SIZE: the processes on this node
  int group_rank = 0;                   // node index
  int restart_count = 0;                // ddprun's restart generation
  std::string master_addr;  // the store: DDP_STORE_ADDR (ddprun), else MASTER_ADDR; empty: none
  int master_port = 0;      // the store's port; 0: none
  std::string store_token;  // ddprun's job token for the store
  // MUNGE credentials for the store under srun (runtime/munge_auth.h); DDP_STORE_MUNGE=0
  // turns them off.
  bool store_munge = true;
  // DDP_MUNGE_SOCKET: munged's socket where it is not libmunge's default ("": the default).
  std::string munge_socket;
  // The run's id, said in the store's hello (a store of another run refuses it):
  // TORCHELASTIC_RUN_ID under ddprun, "slurm-JOB.STEP" under srun; empty: none.
  std::string run_id;
  // torchrun (TORCHELASTIC_RUN_ID, no DDP_STORE_PORT): the store at MASTER_ADDR:MASTER_PORT is
  // its agent's, PyTorch's TCPStore (runtime/store.h, StoreProtocol::kTorch).
  bool torch_store = false;
  // torchrun's agent is PyTorch 2.x's, as far as its environment says
  // (TORCH_NCCL_ASYNC_ERROR_HANDLING): the store's protocol tried first.
  bool torch2_store = false;
  // torchrun with TORCHELASTIC_USE_AGENT_STORE=False: rank 0 is to serve the store itself.
  bool torch_rank0_store = false;
  std::string cuda_visible_devices;       // as inherited; empty when unset
  bool cuda_visible_devices_set = false;  // whether CUDA_VISIBLE_DEVICES was set at all
  double launch_time_ms =
      0;  // ddprun's start (ms since the epoch, DDP_LAUNCH_TIME_MS); 0 if unknown
  // Test mode (ddprun --share-gpu, or DDP_SHARE_GPU=1 under mpirun/srun): every rank of a
  // node uses the same GPU and declares its own NCCL_HOSTID, so that NCCL connects the
  // ranks through sockets. Correct but slow; never for performance figures.
  bool share_gpu = false;
  bool rank_prefixed = false;  // ddprun (DDP_STORE_PORT set) prefixes each line with "[rank N]"
  // srun without ddprun: rank 0 serves the store at MASTER_ADDR:MASTER_PORT (the job script
  // sets them) and the others connect; the token is DDP_STORE_TOKEN, else
  // "slurm-JOBID.STEPID" (the step's own, so that two steps of one job never meet).
  bool serves_store = false;
  // srun, MASTER_ADDR or MASTER_PORT unset: the store on the job's first node
  // (SLURM_JOB_NODELIST) at a port from its job and step ids
  // (20000 + (SLURM_JOB_ID + 1009 x SLURM_STEP_ID) % 10000).
  bool store_from_slurm = false;
  std::string socket_iface;  // GLOO_SOCKET_IFNAME (ddprun --iface): Gloo's network interface
  std::string nccl_host_id;  // NCCL_HOSTID as inherited; empty when unset
  // Where results kept between runs go (--autotune's choices): DDP_CACHE_DIR, else
  // $XDG_CACHE_HOME/ddp, else $HOME/.cache/ddp; empty when none of them is set.
  std::string cache_dir;
  // OMP_NUM_THREADS was set (torchrun and ddprun set it to 1 for several workers on a node;
  // mpirun and srun do not, and ddp::DistributedDataParallel then limits LibTorch itself).
  bool omp_threads_given = false;

  // Reads the real environment.
  static ProcessEnv detect();
  // Reads through `lookup` (returns nullopt for unset names); pure, for tests.
  static ProcessEnv detect(const std::function<std::optional<std::string>(const char*)>& lookup);
};

// Slurm's SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of nodes 0-2, 1 on node 3): the
// count of `node`, or 0 when the text does not say. Pure.
int tasks_on_node(const std::string& tasks_per_node, int node);

// The first host of Slurm's node list ("gpu[07-09,12],cpu3": gpu07), or "" for none. Pure.
std::string first_host(const std::string& nodelist);

// Under mpirun or srun with several GPUs visible: narrows this process's
// CUDA_VISIBLE_DEVICES to the GPU of its local rank (entry local_rank of the list, or index
// local_rank when unset), before any CUDA call. Updates env and the process environment.
// With share_gpu every rank takes the first GPU instead, and gets NCCL_HOSTID
// "ddp-share-gpu-rank-R" and NCCL_SOCKET_IFNAME=lo where they are unset.
void narrow_visible_devices(ProcessEnv* env);

}  // namespace ddp
