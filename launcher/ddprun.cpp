// ddprun: starts one worker per GPU (or CPU worker) with the torchrun environment, hosts the
// rendezvous store, tees output, stops the job on the first failure and says why, and can
// restart the group. Never touches CUDA.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "launcher/elastic.h"
#include "launcher/gpu_discovery.h"
#include "launcher/launch_config.h"
#include "launcher/node_watch.h"
#include "launcher/torch_store.h"
#include "launcher/worker_group.h"
#include "runtime/error.h"
#include "runtime/parse.h"
#include "runtime/store.h"
#include "runtime/store_server.h"
#include "runtime/timer.h"

extern char** environ;

namespace {

// A program that cannot be started (not on PATH, not executable) is refused here, once, before
// any worker or store starts, not by every rank's exec after the job has begun.
void check_program_runs(const std::string& program) {
  const std::string found = ddp::find_on_path(program);
  DDP_USAGE_CHECK(found != "not on PATH", "cannot run {}: not found on PATH (give its path)",
                  program);
  DDP_USAGE_CHECK(::access(found.c_str(), X_OK) == 0 && !std::filesystem::is_directory(found),
                  "cannot run {}: {}", program,
                  ::access(found.c_str(), F_OK) != 0 ? "no such file" : "not an executable file");
}

void on_signal(int signal) {
  ddp::g_forward_signal = signal;
}

// The connections PyTorch's store serves at once: its bound, or a quarter of the descriptors
// ddprun may open, so that strangers' connections leave it room for its own work (pipes for a
// restart, its store's clients).
size_t torch_store_clients() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY)
    return ddp::kMaxTorchStoreClients;
  return std::max<size_t>(16, std::min<size_t>(ddp::kMaxTorchStoreClients, limit.rlim_cur / 4));
}

// Thrown when SIGINT/SIGTERM arrives while ddprun waits for the store or another node.
struct Interrupted {
  int signal;
};

void throw_if_interrupted() {
  if (ddp::g_forward_signal != 0) throw Interrupted{ddp::g_forward_signal};
}

// Connects to the job's store as a process of run `run_id`, retrying until `timeout_s`, in
// slices of a second so that a signal ends the wait at once.
std::unique_ptr<ddp::StoreClient> connect_to_store(const std::string& host, int port,
                                                   const std::string& token,
                                                   const std::string& run_id, double timeout_s) {
  ddp::Stopwatch waited;
  while (true) {
    throw_if_interrupted();
    try {
      return std::make_unique<ddp::StoreClient>(host, port, token, 1.0, timeout_s, run_id);
    } catch (const ddp::UsageError&) {
      throw;  // a wrong token or run: no use retrying
    } catch (const ddp::Error& e) {
      if (waited.seconds() >= timeout_s)
        throw ddp::Error(fmt::format("{} (waited {:.0f}s, --timeout)", e.what(), timeout_s));
    }
  }
}

// The value of `key` once another node has set it, waiting in slices of a second.
std::string wait_for_key(ddp::StoreClient& store, const std::string& key, double timeout_s) {
  ddp::Stopwatch waited;
  while (true) {
    throw_if_interrupted();
    if (std::optional<std::string> value = store.get(key)) return *value;
    if (waited.seconds() >= timeout_s)
      throw ddp::Error(
          fmt::format("node 0 did not publish {} at the store {} within {:.0f}s "
                      "(--timeout): is node 0's ddprun running?",
                      key, store.address(), timeout_s));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The folder of this run's per-rank files (torchrun's layout): under --log-dir as
// RUN_ID_XXXXXXXX, else a temporary one, removed at exit unless --redirects / --tee wrote
// there (then named at start).
struct RunFolder {
  std::string path;
  bool temporary = false;
  RunFolder(const ddp::LaunchConfig& config) {
    const std::string suffix = ddp::random_token("/dev/urandom").substr(0, 8);
    if (!config.log_dir.empty()) {
      path = fmt::format("{}/{}_{}", config.log_dir, config.run_id, suffix);
      return;
    }
    char pattern[] = "/tmp/ddprun-XXXXXX";
    DDP_CHECK(::mkdtemp(pattern) != nullptr, "cannot make a temporary folder: {}",
              std::strerror(errno));
    path = pattern;
    temporary = config.redirects.empty() && config.tee.empty();
  }
  ~RunFolder() {
    std::error_code ignored;
    if (temporary) std::filesystem::remove_all(path, ignored);
  }
};

// The failed rank's last lines and what it recorded (torch's @record writes
// TORCHELASTIC_ERROR_FILE), after "rank R failed first".
void report_failure(const ddp::LaunchConfig& config, const ddp::WorkerPlan& plan,
                    const ddp::GroupOutcome& outcome, int restart) {
  std::fprintf(stderr, "ddprun: rank %d failed first: %s\n", outcome.failed_rank,
               outcome.cause.c_str());
  if (!outcome.last_lines.empty()) {
    std::fprintf(stderr, "ddprun: last lines of rank %d:\n", outcome.failed_rank);
    for (const std::string& line : outcome.last_lines)
      std::fprintf(stderr, "  | %s\n", line.c_str());
  }
  for (const auto& [rank, cause] : outcome.also_failed)
    std::fprintf(stderr, "ddprun: rank %d also failed before the teardown: %s\n", rank,
                 cause.c_str());
  // A module the interpreter lacks: which interpreter ran it, and how to choose another.
  bool missing_module = false;
  for (const std::string& line : outcome.last_lines)
    missing_module = missing_module || line.find("ModuleNotFoundError") != std::string::npos;
  if (missing_module && ddp::launches_python(config))
    std::fprintf(stderr,
                 "ddprun: rank %d ran %s with %s (%s); give --python PATH or DDP_PYTHON for an "
                 "interpreter that has the module\n",
                 outcome.failed_rank, config.command.front().c_str(), config.python.c_str(),
                 ddp::find_on_path(config.python).c_str());
  const std::string error_file =
      ddp::worker_dir(config, restart, outcome.failed_rank - config.node_rank * plan.nproc) +
      "/error.json";
  const std::vector<std::string> recorded = ddp::describe_error_file(error_file);
  if (!recorded.empty()) {
    std::fprintf(stderr, "ddprun: root cause recorded by rank %d (%s):\n", outcome.failed_rank,
                 error_file.c_str());
    for (const std::string& line : recorded)
      std::fprintf(stderr, "  | %s\n", line.c_str());
  }
}

// --nnodes MIN:MAX (launcher/elastic.h): the node that can listen at --rdzv-endpoint serves
// the store for the whole job; every node joins generation after generation, each with the
// ranks and world size its generation gives it, until its workers finish, --max-restarts
// failures are spent, or fewer than MIN nodes come back.
int run_elastic(ddp::LaunchConfig config, const ddp::EnvMap& parent, const ddp::WorkerPlan& plan,
                const std::string& token, ddp::Console& console) {
  std::unique_ptr<ddp::StoreServer> store;
  try {
    ddp::StoreServerConfig store_config;
    store_config.bind_addr = config.master_addr;
    store_config.port = config.master_port;
    store_config.token = token;
    store_config.run_id = config.run_id;
    store_config.on_refused = [](const std::string& line) {
      std::fprintf(stderr, "ddprun: store refused a connection from %s\n", line.c_str());
    };
    store = std::make_unique<ddp::StoreServer>(store_config);
    store->start();
  } catch (const ddp::UsageError&) {
    store.reset();  // another node listens there (or the address is not this host's)
  }
  const std::unique_ptr<ddp::StoreClient> control = connect_to_store(
      config.master_addr, config.master_port, token, config.run_id, config.timeout);
  const std::string me = control->local_address();
  const std::string address = me.substr(0, me.rfind(':'));
  std::fprintf(stderr,
               "ddprun: elastic job (--nnodes %d:%d), rendezvous at %s:%d%s; %d worker%s a node\n",
               config.nnodes, config.max_nodes, config.master_addr.c_str(), config.master_port,
               store ? " (served by this node)" : "", plan.nproc, plan.nproc == 1 ? "" : "s");
  ddp::ElasticRendezvous rendezvous(*control, config.nnodes, config.max_nodes, config.last_call_s,
                                    config.timeout, address);
  int failures = 0;
  int lost_nodes = 0;  // generations ended by a node that vanished (no restart spent)
  int64_t after = -1;
  while (true) {
    ddp::Membership m;
    if (!rendezvous.join(&m, after, throw_if_interrupted)) {
      std::fprintf(stderr, "ddprun: the job finished while this node waited to join\n");
      return 0;
    }
    after = m.generation;
    ddp::LaunchConfig generation = config;
    generation.nnodes = m.nnodes;
    generation.node_rank = m.node_rank;
    std::vector<int> ranks;
    for (int local = 0; local < plan.nproc; ++local)
      ranks.push_back(m.node_rank * plan.nproc + local);
    // The program's MASTER_PORT: a free one on the generation's first node, shared.
    const std::string port_key = fmt::format("ddprun/elastic/{}/master_port", m.generation);
    if (m.node_rank == 0) control->set(port_key, std::to_string(ddp::free_port("0.0.0.0")));
    const std::optional<int> program_port =
        ddp::parse_number<int>(wait_for_key(*control, port_key, config.timeout));
    const ddp::JobPorts ports{config.master_port, program_port.value_or(0)};
    std::fprintf(stderr, "ddprun: generation %lld: node %d of %d, ranks %d-%d of %d\n",
                 static_cast<long long>(m.generation), m.node_rank, m.nnodes, ranks.front(),
                 ranks.back(), m.nnodes * plan.nproc);
    const int attempt = static_cast<int>(m.generation);
    std::vector<ddp::EnvMap> environments;
    for (int local = 0; local < plan.nproc; ++local) {
      environments.push_back(
          ddp::child_environment(parent, generation, plan, local, ports, token, attempt));
      environments.back()["MASTER_ADDR"] = m.addresses.front();  // where its rank 0 runs
    }
    // Beats from a thread of its own until the generation ends here (also while this node
    // stops its workers), so that the others can tell a lost node from a failing one.
    std::optional<ddp::Heartbeat> heartbeat;
    try {
      heartbeat.emplace(connect_to_store(config.master_addr, config.master_port, token,
                                         config.run_id, std::min(config.timeout, 5.0)),
                        m.generation, m.node_rank);
    } catch (const ddp::Error& e) {  // the node's own checks still beat, between their calls
      std::fprintf(stderr, "ddprun: no heartbeat connection of its own: %s\n", e.what());
    }
    ddp::WorkerGroup group(generation, ranks, console);
    group.start(environments, attempt);
    const ddp::GroupOutcome outcome = group.supervise([&] { return rendezvous.check(m); });
    if (outcome.success) {
      rendezvous.finish(m);
      // The store's node stays until every node of the generation has finished.
      ddp::Stopwatch waited;
      while (store && !rendezvous.all_finished(m) && ddp::g_forward_signal == 0 &&
             waited.seconds() < config.timeout)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return 0;
    }
    const std::string node = fmt::format("node {} ({})", m.node_rank, address);
    if (outcome.interrupted) {
      std::fprintf(stderr, "ddprun: %s; stopped every worker\n", outcome.cause.c_str());
      rendezvous.end(m, {fmt::format("{}: {}", node, outcome.cause), false});
      return outcome.exit_code;
    }
    if (outcome.peer_restart) {
      std::fprintf(stderr, "ddprun: %s; stopped this node's workers\n", outcome.cause.c_str());
      if (outcome.cause.find("waiting to join") != std::string::npos)
        rendezvous.end(m, {outcome.cause, true});
      else if (!rendezvous.silent_node().empty())
        rendezvous.end(
            m, {fmt::format("{} lost: {}", rendezvous.silent_node(), outcome.cause), false, true});
    } else {
      // A rank that failed because another node vanished (its ddprun or host gone) is not this
      // node's failure: the lost node is named, and no restart is spent.
      const double window = std::min(config.timeout, 3.0);
      const std::string lost = rendezvous.lost_member(m, window);
      if (!lost.empty()) {
        std::fprintf(stderr,
                     "ddprun: %s is lost (its heartbeat stopped for %.0fs: its ddprun or host is "
                     "gone); rank %d failed after it: %s\n",
                     lost.c_str(), window, outcome.failed_rank, outcome.cause.c_str());
        rendezvous.end(
            m, {fmt::format("{} lost (no heartbeat for {:.0f}s)", lost, window), false, true});
      } else {
        report_failure(generation, plan, outcome, attempt);
        rendezvous.end(m, {fmt::format("{}: rank {} failed first: {}", node, outcome.failed_rank,
                                       outcome.cause),
                           false});
      }
    }
    heartbeat.reset();
    if (outcome.signalled_in_teardown) return outcome.exit_code;  // asked to stop: no next one
    const ddp::GenerationEnd end = rendezvous.ended(m);
    if (end.lost) ++lost_nodes;
    if (!end.membership && !end.lost && ++failures > config.max_restarts) {
      std::fprintf(stderr, "ddprun: giving up after %d failed generation%s (--max-restarts %d)\n",
                   failures, failures == 1 ? "" : "s", config.max_restarts);
      return outcome.exit_code != 0 ? outcome.exit_code : 1;
    }
    std::fprintf(stderr, "ddprun: generation %lld ended (%s); joining the next one%s\n",
                 static_cast<long long>(m.generation), end.why.c_str(),
                 end.membership ? ""
                 : end.lost
                     ? fmt::format(" ({} node{} lost so far; no restart spent)", lost_nodes,
                                   lost_nodes == 1 ? "" : "s")
                           .c_str()
                     : fmt::format(" (restart {} of {})", failures, config.max_restarts).c_str());
  }
}

int run(int argc, char** argv, ddp::Console& console) {
  ddp::LaunchConfig config;
  config.launch_time_ms = ddp::wall_clock_ms();
  if (!ddp::parse_launch_args(argc, argv, &config)) return 0;
  // From here on no write to the console may block: a reader that stalls (a full pipe) must
  // not stop supervision, teardown or signals.
  ddp::take_over_standard_streams();
  ddp::take_launcher_limits();
  for (const std::string& note : config.notes)
    std::fprintf(stderr, "ddprun: note: %s\n", note.c_str());
  const RunFolder run_folder(config);
  config.run_dir = run_folder.path;
  if (!config.log_dir.empty() || !config.redirects.empty() || !config.tee.empty())
    std::fprintf(stderr, "ddprun: each rank's files under %s/attempt_K/LOCAL_RANK\n",
                 config.run_dir.c_str());

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGHUP, &action, nullptr);

  ddp::EnvMap parent;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) parent[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  const auto cvd = parent.count("CUDA_VISIBLE_DEVICES")
                       ? std::optional<std::string>(parent["CUDA_VISIBLE_DEVICES"])
                       : std::nullopt;
  const ddp::GpuList gpus = ddp::discover_gpus(cvd);
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  const ddp::WorkerPlan plan = ddp::plan_workers(config, gpus, cpus);
  if (!plan.note.empty()) std::fprintf(stderr, "ddprun: %s\n", plan.note.c_str());
  check_program_runs(ddp::program_argv(config).at(0));
  // torchrun's words, for PyTorch's programs (the variable is set for every program).
  if (plan.nproc > 1 && !parent.count("OMP_NUM_THREADS") && ddp::runs_python(config))
    std::fprintf(stderr,
                 "ddprun: setting OMP_NUM_THREADS environment variable for each process to be 1 "
                 "in default, to avoid your system being overloaded, please further tune the "
                 "variable for optimal performance in your application as needed\n");

  std::string token = parent.count("DDP_STORE_TOKEN") ? parent["DDP_STORE_TOKEN"] : "";
  const bool several = config.nnodes > 1 || config.elastic();
  // torchrun's default id, or none: every job shares it, no token can come from it.
  DDP_USAGE_CHECK(!several || !token.empty() || !config.run_id_given ||
                      (config.run_id != "none" && !config.run_id.empty()),
                  "--rdzv-id '{}': every job that gives no id has that one, so no store token "
                  "can be derived from it; set the same secret in DDP_STORE_TOKEN on every node, "
                  "or give --rdzv-id an id of this job's own",
                  config.run_id);
  if (several && token.empty() && config.run_id_given) {
    // torchrun's line gives every node the same --rdzv-id and no secret: the token from it.
    token = "rdzv-id:" + config.run_id;
    std::fprintf(stderr,
                 "ddprun: the store's token is derived from --rdzv-id %s, which anyone on another "
                 "host who knows it can give; set the same secret in DDP_STORE_TOKEN on every node "
                 "for a real "
                 "one\n",
                 config.run_id.c_str());
  }
  DDP_USAGE_CHECK(!several || !token.empty(),
                  "--nnodes {}: set the same DDP_STORE_TOKEN on every node (or give every node "
                  "the same --rdzv-id)",
                  config.elastic() && !config.by_arrival
                      ? fmt::format("{}:{}", config.nnodes, config.max_nodes)
                      : std::to_string(config.nnodes));
  if (token.empty()) token = ddp::random_token("/dev/urandom");
  if (config.elastic()) return run_elastic(config, parent, plan, token, console);

  std::unique_ptr<ddp::StoreServer> store;
  int port = config.master_port;
  if (config.node_rank == 0) {
    ddp::StoreServerConfig store_config;
    store_config.bind_addr = config.nnodes == 1      ? "127.0.0.1"
                             : !config.iface.empty() ? ddp::interface_address(config.iface)
                                                     : "0.0.0.0";
    // On one node --master-port is PyTorch's store's (MASTER_PORT, as under torchrun); ddp's
    // own store takes a free port then.
    store_config.port = config.torch_store && config.nnodes == 1 ? 0 : config.master_port;
    store_config.token = token;
    store_config.run_id = config.run_id;
    store_config.on_refused = [](const std::string& line) {
      std::fprintf(stderr, "ddprun: store refused a connection from %s\n", line.c_str());
    };
    store = std::make_unique<ddp::StoreServer>(store_config);
    port = store->port();
    store->start();
  }
  if (config.nnodes == 1) config.master_addr = "127.0.0.1";

  std::vector<int> ranks;
  for (int local = 0; local < plan.nproc; ++local)
    ranks.push_back(config.node_rank * plan.nproc + local);
  if (config.share_gpu)
    std::fprintf(stderr,
                 "ddprun: --share-gpu: all %d workers share GPU %s, each its own NCCL host; NCCL "
                 "traffic goes through sockets (a test mode: correct, slow)\n",
                 plan.nproc, plan.gpu_ids.front().c_str());
  const std::string store_at =
      config.node_rank == 0 && config.nnodes > 1
          ? fmt::format("store on {}:{} ({}; workers use {})",
                        config.iface.empty() ? "0.0.0.0" : ddp::interface_address(config.iface),
                        port, config.iface.empty() ? "all interfaces" : "--iface " + config.iface,
                        config.master_addr)
          : fmt::format("store on {}:{}", config.master_addr, port);
  // (PyTorch's store, on one node, is named once it listens: below.)
  std::fprintf(
      stderr, "ddprun: starting %d worker%s (%s), %s\n", plan.nproc, plan.nproc == 1 ? "" : "s",
      plan.gpu_ids.empty()
          ? "CPU"
          : fmt::format("GPUs {} from {}", fmt::join(plan.gpu_ids, ","), gpus.source).c_str(),
      store_at.c_str());

  // Several nodes agree on the job's generation through the store, as torchrun does: the
  // first node whose workers fail in generation G moves the job to G + 1, and every node
  // stops its workers and starts generation G + 1 (or gives up at --max-restarts).
  std::unique_ptr<ddp::StoreClient> control;
  std::unique_ptr<ddp::NodeWatch> watch;
  // MASTER_PORT: on one node where ddprun serves PyTorch's store (--master-port, or a free
  // port); else a port left to the program (a PyTorch rank 0 serves its own store there), free
  // now and the same on every node (node 0 picks it and shares it through the store).
  ddp::JobPorts ports{port, 0};
  std::unique_ptr<ddp::TorchStoreServer> torch_store;
  if (config.torch_store && config.nnodes == 1) {
    torch_store = std::make_unique<ddp::TorchStoreServer>(
        "127.0.0.1", config.master_port,
        [](const std::string& why) {
          std::fprintf(stderr,
                       "ddprun: PyTorch's store refused a client: %s (--no-torch-store leaves "
                       "the store to the program's rank 0)\n",
                       why.c_str());
        },
        ddp::kTorchStoreStallSeconds, torch_store_clients());
    torch_store->start();
    ports.program = torch_store->port();
    if (ddp::runs_python(config))
      std::fprintf(stderr, "ddprun: PyTorch's store on 127.0.0.1:%d (MASTER_PORT)\n",
                   ports.program);
  } else if (config.nnodes == 1) {
    ports.program = ddp::free_port("127.0.0.1");
  } else {
    // Node 0 first reaches the store at --master-addr, as the other nodes do: where that is
    // another host's node 0 (two nodes started with --node-rank 0), the join below refuses
    // this one. Where --master-addr does not lead back here (an address this host cannot
    // reach itself by), it reaches its own store where it listens: the interface's address
    // with --iface.
    if (config.node_rank == 0) {
      try {
        control = connect_to_store(config.master_addr, port, token, config.run_id,
                                   std::min(config.timeout, 2.0));
      } catch (const std::exception&) {
        control.reset();
      }
    }
    if (!control) {
      const std::string host = config.node_rank != 0                ? config.master_addr
                               : store->bind_address() == "0.0.0.0" ? "127.0.0.1"
                                                                    : store->bind_address();
      control = connect_to_store(host, port, token, config.run_id, config.timeout);
    }
    const int64_t joined = control->add(fmt::format("ddprun/node/{}", config.node_rank), 1);
    DDP_USAGE_CHECK(joined == 1,
                    "--node-rank {}: another ddprun has already joined this job as node {} (two "
                    "nodes started with the same --node-rank?)",
                    config.node_rank, config.node_rank);
    const std::string me = control->local_address();
    // How the other nodes name this one: its address and its ranks.
    control->set(
        ddp::node_address_key(config.node_rank),
        fmt::format("{}, rank{} {}", me.substr(0, me.rfind(':')), ranks.size() == 1 ? "" : "s",
                    ranks.size() == 1 ? std::to_string(ranks.front())
                                      : fmt::format("{}-{}", ranks.front(), ranks.back())));
    if (config.node_rank == 0) {
      control->set("ddprun/nnodes", std::to_string(config.nnodes));
      if (config.torch_store) {
        // PyTorch's store where ddp's listens (the interface's address, or every address),
        // unauthenticated as torchrun's.
        torch_store = std::make_unique<ddp::TorchStoreServer>(
            store->bind_address(), 0,
            [](const std::string& why) {
              std::fprintf(stderr, "ddprun: PyTorch's store refused a client: %s\n", why.c_str());
            },
            ddp::kTorchStoreStallSeconds, torch_store_clients());
        torch_store->start();
        ports.program = torch_store->port();
        std::fprintf(stderr,
                     "ddprun: PyTorch's store on %s:%d (MASTER_PORT); it has no token, as "
                     "torchrun's has not: keep the port inside the cluster's network\n",
                     store->bind_address().c_str(), ports.program);
      } else {
        ports.program = ddp::free_port("0.0.0.0");
      }
      control->set("ddprun/master_port", std::to_string(ports.program));
    } else {
      const std::string nnodes = wait_for_key(*control, "ddprun/nnodes", config.timeout);
      DDP_USAGE_CHECK(nnodes == std::to_string(config.nnodes),
                      "--nnodes {}: node 0 ({}) started this job with --nnodes {}; every node "
                      "needs the same --nnodes",
                      config.nnodes, config.master_addr, nnodes);
      const std::string text = wait_for_key(*control, "ddprun/master_port", config.timeout);
      DDP_CHECK(ddp::parse_number<int>(text).has_value(), "ddprun/master_port in the store: '{}'",
                text);
      ports.program = *ddp::parse_number<int>(text);
    }
    watch =
        std::make_unique<ddp::NodeWatch>(*control, config.node_rank, config.nnodes, config.timeout);
  }
  // Every exit of a multi-node ddprun: says why it ends the job (failures), marks this node
  // finished, and node 0 keeps the store up until every other node has finished or is gone.
  // A node that failed does not wait on a store or a node that has gone silent: past
  // kSilentSeconds without a reply (or a heartbeat) it names what it lost and exits.
  constexpr double kSilentSeconds = 5.0;
  const auto leave = [&](int code, const std::string& why) {
    if (!control || watch->store_lost()) return code;
    const bool failed = code != 0;
    if (failed && config.node_rank != 0 && watch->store_silent_s() > kSilentSeconds) {
      std::fprintf(stderr,
                   "ddprun: node 0 (the rendezvous store at %s) stopped answering: no reply for "
                   "%.1fs; it is gone or cut off, leaving without telling it\n",
                   control->address().c_str(), watch->store_silent_s());
      return code;
    }
    try {
      if (failed) control->set_reply_timeout(std::min(config.timeout, kSilentSeconds));
      if (!why.empty())
        control->set(ddp::kJobEndedKey, fmt::format("node {} ({}): {}", config.node_rank,
                                                    control->local_address(), why));
      control->add(ddp::node_finished_key(config.node_rank), 1);
    } catch (const std::exception& e) {
      if (failed) std::fprintf(stderr, "ddprun: could not tell the other nodes (%s)\n", e.what());
      return code;  // the store is gone: nobody to tell
    }
    ddp::Stopwatch waited;
    const int64_t polled = watch->polls();  // a poll that saw this node's state is awaited
    while (config.node_rank == 0 &&
           (watch->polls() < polled + 2 || !watch->all_others_finished()) &&
           !watch->check(-1).fatal && ddp::g_forward_signal == 0 &&
           waited.seconds() < config.timeout) {
      // Node 0 keeps the store up for nodes that can still read the job's end, not for one
      // whose heartbeat stopped while this node's own workers failed.
      const std::string silent = failed ? watch->all_others_silent(kSilentSeconds) : "";
      if (!silent.empty()) {
        std::fprintf(stderr, "ddprun: %s (gone or cut off); not waiting for it\n", silent.c_str());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return code;
  };
  for (int restart = 0;; ++restart) {
    std::vector<ddp::EnvMap> environments;
    for (int local = 0; local < plan.nproc; ++local)
      environments.push_back(
          ddp::child_environment(parent, config, plan, local, ports, token, restart));
    ddp::WorkerGroup group(config, ranks, console);
    group.start(environments, restart);
    bool fatal = false;
    const ddp::GroupOutcome outcome = group.supervise([&]() -> std::string {
      if (!watch) return "";
      const ddp::NodeVerdict verdict = watch->check(restart);
      fatal = verdict.fatal;
      return verdict.cause;
    });
    if (outcome.success) return leave(0, "");
    if (outcome.interrupted) {
      std::fprintf(stderr, "ddprun: %s; stopped every worker\n", outcome.cause.c_str());
      return leave(outcome.exit_code, outcome.cause);
    }
    if (outcome.peer_restart && fatal) {
      std::fprintf(stderr, "ddprun: %s; stopped this node's workers\n", outcome.cause.c_str());
      return leave(1, "");
    }
    if (outcome.peer_restart) {
      std::fprintf(stderr, "ddprun: %s; stopped this node's workers\n", outcome.cause.c_str());
    } else {
      report_failure(config, plan, outcome, restart);
      // The first node to fail in this generation moves the job on; the others follow.
      if (control && restart < config.max_restarts && !outcome.signalled_in_teardown &&
          control->add(fmt::format("ddprun/failed/{}", restart), 1) == 1)
        control->add(ddp::kGenerationKey, 1);
    }
    if (restart >= config.max_restarts || outcome.signalled_in_teardown) {
      if (config.max_restarts > 0 && !outcome.signalled_in_teardown)
        std::fprintf(stderr, "ddprun: giving up after %d restart%s\n", restart,
                     restart == 1 ? "" : "s");
      return leave(outcome.exit_code, outcome.peer_restart
                                          ? ""
                                          : fmt::format("rank {} failed first: {}",
                                                        outcome.failed_rank, outcome.cause));
    }
    std::fprintf(stderr, "ddprun: restarting the group (restart %d of %d)\n", restart + 1,
                 config.max_restarts);
    if (store && config.nnodes == 1)
      store->clear();  // with several nodes, keys carry the generation
  }
}

int run_and_report(int argc, char** argv, ddp::Console& console) {
  try {
    return run(argc, argv, console);
  } catch (const Interrupted& interrupted) {
    std::fprintf(stderr, "ddprun: interrupted by %s while waiting for the other nodes\n",
                 ddp::signal_name(interrupted.signal).c_str());
    return 128 + interrupted.signal;
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", ddp::error_text(e).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", ddp::error_text(e).c_str());
    return 1;
  }
}
}  // namespace

int main(int argc, char** argv) {
  ddp::Console console(STDOUT_FILENO, STDERR_FILENO);
  const int code = run_and_report(argc, argv, console);
  console.drain(2.0);  // all, to a reader that keeps reading; a stalled one does not hold the exit
  return code;
}
