// ddprun's configuration (cxxopts, defaults in one place, validate()) and the pure
// function that builds each worker's environment.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/gpu_discovery.h"
#include "runtime/socket.h"

namespace ddp {

struct LaunchConfig {
  std::string nproc_per_node = "gpu";  // N | gpu | cpu
  bool nproc_given = false;            // --nproc-per-node given (else its default: gpu, or 1)
  int nnodes = 1;
  int node_rank = 0;
  // --nnodes MIN:MAX with MIN < MAX: elastic membership (launcher/elastic.h); nnodes is MIN.
  int max_nodes = 1;
  double last_call_s = 30;  // --rdzv-conf last_call_timeout: a generation's wait for more nodes
  // Several nodes numbered in the order they join (torchrun's c10d line, or --nnodes N:N,
  // without --node-rank): the elastic membership with MIN = MAX.
  bool by_arrival = false;
  bool elastic() const { return max_nodes > nnodes || by_arrival; }
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port (single node)
  std::string log_dir;  // empty: no per-rank files
  int max_restarts = 0;
  double grace_period = 5.0;         // seconds between SIGTERM and SIGKILL
  double timeout = 300;              // seconds ddprun waits for the store and the other nodes
  bool quiet = false;                // only rank 0 on the console
  bool share_gpu = false;            // test mode: every worker on the first GPU (NCCL over sockets)
  std::string iface;                 // network interface for Gloo, NCCL's sockets and the store
  std::vector<std::string> command;  // PROGRAM ARGS...
  double launch_time_ms = 0;         // when ddprun started (ms since the epoch); not a flag
  // torchrun's flags with the same meaning (README, "Launching PyTorch scripts").
  std::string run_id = "none";          // --rdzv-id: TORCHELASTIC_RUN_ID
  bool run_id_given = false;            // --rdzv-id given (a store token can be derived from it)
  std::string role = "default";         // --role: ROLE_NAME
  bool module = false;                  // -m: PROGRAM is a Python module
  bool no_python = false;               // --no-python: PROGRAM runs as given, even a .py
  bool run_path = false;                // --run-path: PROGRAM is a Python file
  std::string python = "python3";       // --python, else DDP_PYTHON: what runs a Python PROGRAM
  bool torch_store = false;             // --torch-store: serve PyTorch's store (agent store)
  std::vector<int> redirects;           // per local rank: 1 stdout, 2 stderr, 3 both to
  std::vector<int> tee;                 // files only (redirects) or to files and console (tee)
  std::vector<int> local_ranks_filter;  // console shows only these local ranks (empty: all)
  std::vector<std::string> notes;       // what ddprun says once about flags it takes as given
  // Where each attempt's per-rank files go, torchrun's layout: RUN_DIR/attempt_K/LOCAL_RANK/
  // {stdout.log, stderr.log, error.json}; set by ddprun (under --log-dir, or a temporary
  // folder), not a flag.
  std::string run_dir;
};

// RUN_DIR/attempt_K/LOCAL_RANK: a worker's files (TORCHELASTIC_ERROR_FILE is error.json there).
std::string worker_dir(const LaunchConfig& config, int restart, int local_rank);
// What a worker's torchelastic error file (torch.distributed.elastic's @record) says: its
// message and the Python traceback, as lines; empty when there is no readable file.
std::vector<std::string> describe_error_file(const std::string& path);

// The stream bits of --redirects / --tee for `local_rank` (0 none, 1 stdout, 2 stderr, 3 both).
int stream_bits(const std::vector<int>& per_rank, int local_rank);
// torchrun's --redirects / --tee value: "3", or per local rank "0:1,1:2" (the others 0).
// Throws UsageError naming `flag`.
std::vector<int> parse_streams(const std::string& flag, const std::string& value);
// The argv that runs the program (torchrun's rules): with -m, python3 -u -m MODULE ARGS; a
// PROGRAM ending in .py (unless --no-python), python3 -u PROGRAM ARGS; else as given.
std::vector<std::string> program_argv(const LaunchConfig& config);
// Whether the program is Python's (as program_argv runs it, or a python interpreter given as
// the program): PyTorch's notes (OMP_NUM_THREADS, its store) are for those only.
bool runs_python(const LaunchConfig& config);
// Whether ddprun chose the interpreter (a .py PROGRAM, -m, --run-path): config.python.
bool launches_python(const LaunchConfig& config);
// Where `program` is run from: itself when it names a path, else the first executable of that
// name on PATH, else "not on PATH".
std::string find_on_path(const std::string& program);

// What --help prints after the flags: the environment ddprun reads and sets, and examples
// (each example's line parses: LaunchArgs.HelpExamplesParse).
extern const char* const kDdprunHelpFooter;

// Parses `ddprun [options] [--] PROGRAM [ARGS...]`. Returns false after printing --help.
// Throws UsageError naming the flag on bad input.
bool parse_launch_args(int argc, char** argv, LaunchConfig* config);
void validate(const LaunchConfig& config);

// How many workers this node runs and which GPU each gets (empty ids: CPU workers).
struct WorkerPlan {
  int nproc = 0;
  std::vector<std::string> gpu_ids;  // gpu_ids[local_rank], or empty for CPU workers
  bool hide_gpus = false;            // CPU workers asked for with --nproc-per-node cpu
  std::string note;                  // a line for the user about the choice made, or empty
};
// `cpu_count`: cores of this machine. Throws UsageError when more GPU workers are asked for
// than GPUs were found, saying what was found. With share_gpu every worker gets the first GPU.
// --nproc-per-node left out on a machine without GPUs: one worker, as torchrun's default (the
// note says so).
WorkerPlan plan_workers(const LaunchConfig& config, const GpuList& gpus, int cpu_count);

// A TCP port that nobody listens on at `address` now (bound to port 0, then released).
int free_port(const std::string& address);

// 32 hex digits from `source` (ddprun: /dev/urandom). Throws ddp::Error when the source
// cannot give 16 bytes: a job never runs with a guessable store token.
std::string random_token(const std::string& source);

using EnvMap = std::map<std::string, std::string>;

// The two ports of a job: ddprun's store (DDP_STORE_PORT, what ddp programs use) and
// MASTER_PORT: on one node the PyTorch store ddprun serves (--master-port), else a free port
// left to the program (where a PyTorch program's rank 0 serves its own store).
struct JobPorts {
  int store = 0;
  int program = 0;
};

// The worker's environment: the parent's, plus what torchrun sets (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK,
// ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, OMP_NUM_THREADS=1 for several workers
// unless the parent sets it; TORCHELASTIC_ERROR_FILE is the worker group's to set),
// ddp's own (DDP_STORE_ADDR, DDP_STORE_PORT, DDP_STORE_TOKEN, DDP_RESTART_COUNT), and
// CUDA_VISIBLE_DEVICES set to exactly its GPU. With --iface, GLOO_SOCKET_IFNAME and
// NCCL_SOCKET_IFNAME name it (unless the parent set them). With share_gpu also DDP_SHARE_GPU=1,
// NCCL_HOSTID=ddp-share-gpu-rank-R (its own "host" for NCCL) and, unless the parent sets it,
// NCCL_SOCKET_IFNAME=lo.
EnvMap child_environment(const EnvMap& parent, const LaunchConfig& config, const WorkerPlan& plan,
                         int local_rank, const JobPorts& ports, const std::string& token,
                         int restart);

}  // namespace ddp
