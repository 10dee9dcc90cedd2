// make_communicator(): the one place that knows which backends were built, and which this
// program links (NCCL and MPI live in libraries of their own: collectives/backend_hooks.h). A
// backend that was not built or not linked answers here with an error naming what to install,
// rebuild or link.
#include <unistd.h>

#include <cstring>

#include "collectives/communicator.h"
#include "runtime/error.h"
#include "runtime/process_env.h"
#include "runtime/store.h"

#if DDP_HAVE_GLOO
#include "collectives/gloo/gloo_communicator.h"
#endif
#include "collectives/backend_hooks.h"

// Null where the program does not link the backend's library.
extern "C" __attribute__((weak)) const ddp::NcclBackend* ddp_nccl_backend();
extern "C" __attribute__((weak)) const ddp::MpiBackend* ddp_mpi_backend();

namespace ddp {
namespace {

// One process: every collective is a local copy (or nothing).
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(bool gpu) : Communicator(0, 1), gpu_(gpu) {}
  const char* backend() const override { return "self"; }
  bool device_buffers() const override { return gpu_; }
  std::unique_ptr<Work> all_reduce_async(void*, size_t, DataType, ReduceOp) override {
    next_sequence();
    return std::make_unique<Done>();
  }
  std::unique_ptr<Work> broadcast_async(void*, size_t, DataType, int root) override {
    DDP_CHECK(root == 0, "broadcast root {} in a group of 1", root);
    next_sequence();
    return std::make_unique<Done>();
  }
  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, size_t count,
                                         DataType type) override {
    next_sequence();
    DDP_CHECK(!gpu_, "the single-process GPU group copies nothing: use the buffer itself");
    if (send != recv) std::memmove(recv, send, count * dtype_bytes(type));
    return std::make_unique<Done>();
  }
  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp) override {
    return all_gather_async(send, recv, count, type);
  }
  void send(const void*, size_t, DataType, int peer) override {
    DDP_CHECK(false, "send to {} in a group of 1", peer);
  }
  void recv(void*, size_t, DataType, int peer) override {
    DDP_CHECK(false, "recv from {} in a group of 1", peer);
  }
  std::unique_ptr<Work> batch_async(const std::vector<P2pOp>& ops) override {
    DDP_CHECK(ops.empty(), "point-to-point with peer {} in a group of 1", ops.front().peer);
    next_sequence();
    return std::make_unique<Done>();
  }
  void barrier() override { next_sequence(); }
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<SelfCommunicator>(gpu_);
  }

 private:
  struct Done final : Work {
    void wait(double) override {}
    void then_on(void*) override {}
    bool is_completed() override { return true; }
  };
  bool gpu_;
};

std::string host_name(const ProcessEnv& env) {
  if (!env.socket_iface.empty()) return "iface:" + env.socket_iface;
  if (env.local_world_size == env.world_size) return "127.0.0.1";
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

std::string built_backends() {
  std::string names;
  if (DDP_HAVE_NCCL) names += "nccl ";
  if (DDP_HAVE_GLOO) names += "gloo ";
  if (DDP_HAVE_MPI) names += "mpi ";
  if (!names.empty()) names.pop_back();
  return names.empty() ? "none" : names;
}

namespace {

// The NCCL backend's hooks, or the error that says why there are none.
const NcclBackend& nccl(const char* what) {
  DDP_USAGE_CHECK(DDP_HAVE_NCCL,
                  "{}: this build has no NCCL (the CUDA toolkit's NCCL was not found at configure "
                  "time)",
                  what);
  DDP_USAGE_CHECK(ddp_nccl_backend != nullptr,
                  "{}: this program links ddp without its NCCL backend; link it with "
                  "find_package(ddp COMPONENTS nccl) (ddp::ddp) or ddp::collectives",
                  what);
  return *ddp_nccl_backend();
}

const MpiBackend& mpi(const char* what) {
  DDP_USAGE_CHECK(DDP_HAVE_MPI, "{}: this build has no MPI (install libopenmpi-dev and rebuild)",
                  what);
  DDP_USAGE_CHECK(ddp_mpi_backend != nullptr,
                  "{}: this program links ddp without its MPI backend; link it with "
                  "find_package(ddp COMPONENTS mpi) (ddp::ddp) or ddp::collectives",
                  what);
  return *ddp_mpi_backend();
}

}  // namespace

std::string nccl_version() {
  return DDP_HAVE_NCCL && ddp_nccl_backend != nullptr ? ddp_nccl_backend()->version() : "";
}

const DeviceAllocator& nccl_window_memory(const char* what) {
  const NcclBackend& backend = nccl(what);
  DDP_USAGE_CHECK(backend.window_memory != nullptr,
                  "{}: NCCL {} has no memory windows (ncclCommWindowRegister came with NCCL 2.27)",
                  what, backend.version());
  return *backend.window_memory;
}

namespace {
CommunicatorStart ready(std::unique_ptr<Communicator> comm) {
  auto held = std::make_shared<std::unique_ptr<Communicator>>(std::move(comm));
  return [held] { return std::move(*held); };
}
}  // namespace

std::unique_ptr<Communicator> make_host_staged(Communicator& device_comm) {
  return nccl("device communicators").host_staged(device_comm);
}

std::unique_ptr<Communicator> make_communicator(const CommConfig& config, const ProcessEnv& env,
                                                std::shared_ptr<StoreClient> store) {
  return start_communicator(config, env, std::move(store))();
}

CommunicatorStart start_communicator(const CommConfig& config, const ProcessEnv& env,
                                     std::shared_ptr<StoreClient> store) {
  Backend backend = config.backend;
  // How a message names the backend: the flag where one was asked for, else why it was chosen
  // (a program of one's own has no --backend).
  const bool chosen = backend == Backend::kAuto;
  if (backend == Backend::kAuto) {
    // One process talks to itself, whatever a job of several would use.
    if (env.world_size == 1) return ready(std::make_unique<SelfCommunicator>(config.gpu));
    // (A backend built but not linked into this program is chosen all the same, so that the
    // error below says what to link.)
    if (config.gpu && DDP_HAVE_NCCL)
      backend = Backend::kNccl;
    else if (!config.gpu && DDP_HAVE_GLOO && store != nullptr)
      backend = Backend::kGloo;
    else if (!config.gpu && DDP_HAVE_MPI && env.launcher == Launcher::kMpirun)
      backend = Backend::kMpi;
    else
      throw UsageError(fmt::format(
          "--backend auto: no backend fits ({} buffers, launcher {}, built: {}); {}",
          config.gpu ? "GPU" : "CPU", launcher_name(env.launcher), built_backends(),
          config.gpu ? "rebuild with NCCL" : "start with ddprun (Gloo) or mpirun (MPI)"));
  }
  DDP_USAGE_CHECK(backend != Backend::kNccl || config.gpu,
                  "--backend nccl works on GPU buffers: use --device cuda");
  DDP_USAGE_CHECK(backend == Backend::kNccl || !config.gpu,
                  "--backend {} works on CPU buffers; GPU training uses nccl",
                  backend_name(backend));
  if (backend == Backend::kGloo) {
#if DDP_HAVE_GLOO
    auto comm = make_gloo_communicator(env.rank, env.world_size, store,
                                       fmt::format("ddp/gloo/{}/world/", env.restart_count),
                                       config.timeout_s, host_name(env));
    return ready(std::move(comm));
#else
    throw UsageError("--backend gloo: this build has no Gloo (install libgloo-dev and rebuild)");
#endif
  }
  if (backend == Backend::kMpi) {
    const MpiBackend& backend_mpi =
        mpi(chosen ? "under mpirun the collectives go through MPI" : "--backend mpi");
    DDP_USAGE_CHECK(env.launcher == Launcher::kMpirun, "--backend mpi: start the job with mpirun");
    return ready(backend_mpi.make(store, config.timeout_s));
  }
  const NcclBackend& backend_nccl =
      nccl(chosen ? "GPU collectives go through NCCL" : "--backend nccl");
  std::unique_ptr<Communicator> bootstrap;
  // Under mpirun without a store, NCCL's id goes through MPI.
  if (store == nullptr && env.launcher == Launcher::kMpirun && DDP_HAVE_MPI &&
      ddp_mpi_backend != nullptr)
    bootstrap = ddp_mpi_backend()->make(nullptr, config.timeout_s);
  CommunicatorStart comm =
      backend_nccl.start(env.rank, env.world_size, store, fmt::format("world{}", env.restart_count),
                         config.timeout_s, bootstrap.get());
  if (bootstrap) {
    // MPI stays initialised for the job's lifetime; the NCCL communicator owns nothing of it.
    static std::unique_ptr<Communicator> keep;  // plain host state: finalises MPI at exit
    keep = std::move(bootstrap);
  }
  return comm;
}

}  // namespace ddp
