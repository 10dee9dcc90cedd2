// ddp::init: the environment, the store served (srun), the device, the store client, the
// communicator, in that order.
#include "dist/world.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include <spdlog/spdlog.h>

#include "runtime/error.h"
#include "runtime/munge_auth.h"
#include "runtime/store_server.h"

namespace ddp {

World::World(World&&) noexcept = default;
World& World::operator=(World&&) noexcept = default;

World::~World() {
  starting_ = nullptr;  // a start still in flight ends (its threads use the store)
  comm_.reset();        // before the store it may still use
  store_.reset();
  served_.reset();  // the others' store: last
}

std::unique_ptr<StoreClient> World::connect_store() const {
  return connect_ ? connect_() : nullptr;
}

Communicator& World::comm() {
  if (starting_) {
    CommunicatorStart start = std::move(starting_);
    starting_ = nullptr;
    comm_ = start();
    comm_s_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - comm_started_).count();
  }
  DDP_CHECK(comm_ != nullptr,
            "this process has no world communicator (one process, and no backend named)");
  return *comm_;
}

namespace {

// An exception nobody caught: its message and the exit status a user expects (2 for a
// UsageError, 1 for another ddp::Error or std::exception), not std::terminate's abort (134).
[[noreturn]] void report_uncaught() {
  int status = 1;
  try {
    if (std::current_exception()) std::rethrow_exception(std::current_exception());
    std::fprintf(stderr, "error: std::terminate called without an exception\n");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", error_text(e).c_str());
    status = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", error_text(e).c_str());
  } catch (...) {
    std::fprintf(stderr, "error: an exception of an unknown type\n");
  }
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(status);
}

}  // namespace

World init(const InitOptions& options) {
  // Before the environment is read: its usage errors end the program as `error:` lines too.
  std::set_terminate(report_uncaught);
  return init(options, ProcessEnv::detect());
}

World init(const InitOptions& options, ProcessEnv env) {
  // A program's uncaught error ends it with its message and status, not an abort.
  std::set_terminate(report_uncaught);
  World world;
  world.env_ = std::move(env);
  ProcessEnv& e = world.env_;
  // Under srun, MUNGE where this host's munged answers: every hello carries a credential of
  // the run's id, and rank 0's store admits only processes that MUNGE vouches for as its user.
  std::string credential;
  std::string no_munge = "switched off by DDP_STORE_MUNGE=0";
  if (e.launcher == Launcher::kSrun && e.master_port > 0 && e.world_size > 1 && e.store_munge)
    if (auto made = munge_credential(e.run_id, e.munge_socket, &no_munge)) credential = *made;
  // srun without ddprun: rank 0 serves the store the others connect to.
  if (e.serves_store) {
    DDP_USAGE_CHECK(!e.store_token.empty(),
                    "srun: set DDP_STORE_TOKEN to the same secret for every task (outside "
                    "Slurm there is no SLURM_JOB_ID to derive it from)");
    StoreServerConfig store_config;
    store_config.bind_addr = "0.0.0.0";
    store_config.port = e.master_port;
    store_config.token = e.store_token;
    store_config.run_id = e.run_id;
    store_config.require_munge = !credential.empty();
    store_config.munge_socket = e.munge_socket;
    // Named as the job script gave them (or not), never as ddprun's flags.
    store_config.origin.addr = "MASTER_ADDR";
    store_config.origin.port = e.store_from_slurm ? "the store's port from SLURM_JOB_ID and "
                                                    "SLURM_STEP_ID (MASTER_PORT unset)"
                                                  : "MASTER_PORT";
    store_config.origin.remedy = "set MASTER_PORT to a free port in the job script";
    store_config.on_refused = [](const std::string& line) {
      spdlog::warn("store refused a connection from {}", line);
    };
    world.served_ = std::make_unique<StoreServer>(store_config);
    world.served_->start();
    spdlog::info("srun: rank 0 serves the rendezvous store on port {}", e.master_port);
    if (store_config.require_munge)
      spdlog::info(
          "srun: the store admits only processes that MUNGE vouches for as user {} "
          "(DDP_STORE_MUNGE=0 turns this off)",
          ::geteuid());
    else
      spdlog::info(
          "srun: no MUNGE ({}): the store admits processes of other hosts by its token "
          "alone",
          no_munge);
    if (e.store_from_slurm)
      spdlog::info(
          "srun: MASTER_ADDR/MASTER_PORT unset: the store on the job's first node {} at port {} "
          "(from the job id){}",
          e.master_addr, e.master_port,
          std::getenv("DDP_STORE_TOKEN") == nullptr
              ? ", its token from the job id (set DDP_STORE_TOKEN for a secret)"
              : "");
  }
  if (options.bind_gpu) {
    if (!cuda_built()) bind_device(e, {});  // the error that says what is missing
    if (e.launcher == Launcher::kMpirun || e.launcher == Launcher::kSrun)
      narrow_visible_devices(&e);
    world.device_ = std::make_unique<DeviceInfo>(bind_device(e, {options.bind_retries, 0.5}));
    if (options.on_device) options.on_device(world);
  }
  DDP_USAGE_CHECK(!e.torch_rank0_store,
                  "torchrun with TORCHELASTIC_USE_AGENT_STORE=False: ddp::init joins through "
                  "torchrun's agent store only; start the job with ddprun (the same command "
                  "line), or torchrun's static rendezvous");
  if (e.torch_store && e.master_port > 0)
    // torchrun's agent store, PyTorch's TCPStore; this attempt's keys apart from the agent's.
    world.connect_ = [e] {
      return std::make_unique<StoreClient>(StoreProtocol::kTorch, e.master_addr, e.master_port,
                                           fmt::format("ddp/attempt_{}/", e.restart_count),
                                           e.torch2_store);
    };
  else if (!e.master_addr.empty() && e.master_port > 0)
    world.connect_ = [e, first = credential]() mutable {
      // A MUNGE credential is good for one hello (munged refuses a replay): a new one for each
      // connection after the first.
      std::string credential = std::move(first), why_not;
      if (credential.empty() && e.launcher == Launcher::kSrun && e.world_size > 1 && e.store_munge)
        if (auto made = munge_credential(e.run_id, e.munge_socket, &why_not)) credential = *made;
      first.clear();
      return std::make_unique<StoreClient>(e.master_addr, e.master_port, e.store_token, 30.0, 40.0,
                                           e.run_id, credential);
    };
  if (world.connect_) world.store_ = world.connect_();
  if (world.store_ && e.launcher == Launcher::kSrun)
    world.store_->set_server_description("rank 0's process, which serves it,");
  if (world.store_ && world.device_) check_unique_gpus(*world.store_, e, *world.device_, 60.0);
  if (e.world_size > 1 || options.backend != Backend::kAuto || options.communicator_alone) {
    CommConfig config;
    config.backend = options.backend;
    config.timeout_s = options.timeout_s;
    config.gpu = options.bind_gpu;
    world.comm_started_ = std::chrono::steady_clock::now();
    world.starting_ = start_communicator(config, e, world.store_);
    if (!options.start_in_background) world.comm();
  }
  return world;
}

}  // namespace ddp
