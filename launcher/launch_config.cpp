// ddprun's command line and the worker environment contract.
#include "launcher/launch_config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <iostream>

#include <fmt/format.h>
#include <cxxopts.hpp>

#include "runtime/error.h"
#include "runtime/parse.h"
#include "runtime/socket.h"

namespace ddp {
namespace {

int parse_int(const std::string& flag, const std::string& value) {
  const std::optional<int> parsed = parse_number<int>(value);
  DDP_USAGE_CHECK(parsed.has_value(), "{} {}: expected an integer", flag, value);
  return *parsed;
}

// Options that take a value: the program starts at the first argument that is not an
// option or an option's value, or after "--".
bool takes_value(const std::string& arg) {
  return arg.find('=') == std::string::npos && arg != "--quiet" && arg != "--share-gpu" &&
         arg != "--help" && arg != "-h";
}

}  // namespace

bool parse_launch_args(int argc, char** argv, LaunchConfig* config) {
  LaunchConfig& c = *config;
  const LaunchConfig d;
  std::vector<char*> own{argv[0]};
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;
    own.push_back(argv[i]);
    if (takes_value(arg) && i + 1 < argc) own.push_back(argv[++i]);
  }
  for (; i < argc; ++i)
    c.command.push_back(argv[i]);

  cxxopts::Options options("ddprun",
                           "Start one worker process per GPU (or CPU worker) with the torchrun "
                           "environment, host the rendezvous store, supervise the workers.\n"
                           "Usage: ddprun [options] [--] PROGRAM [ARGS...]");
  // clang-format off
  options.add_options()
    ("nproc-per-node", "workers on this node: N, gpu (one per visible GPU) or cpu (one per core)",
        cxxopts::value<std::string>()->default_value(d.nproc_per_node))
    ("nnodes", "number of nodes", cxxopts::value<std::string>()->default_value(std::to_string(d.nnodes)))
    ("node-rank", "this node's index", cxxopts::value<std::string>()->default_value(std::to_string(d.node_rank)))
    ("master-addr", "address of node 0, where the store runs", cxxopts::value<std::string>()->default_value(d.master_addr))
    ("master-port", "store port (0: pick a free one; single node only)",
        cxxopts::value<std::string>()->default_value(std::to_string(d.master_port)))
    ("log-dir", "write each worker's output to DIR/rank-K.log", cxxopts::value<std::string>())
    ("max-restarts", "restart the whole group up to R times after a failure",
        cxxopts::value<std::string>()->default_value(std::to_string(d.max_restarts)))
    ("grace-period", "seconds between SIGTERM and SIGKILL when stopping workers",
        cxxopts::value<std::string>()->default_value("5"))
    ("timeout", "seconds ddprun waits for the store and the other nodes (connecting, the job's "
        "port, a node that stops answering)", cxxopts::value<std::string>()->default_value(fmt::format("{}", d.timeout)))
    ("quiet", "only rank 0's output on the console (all ranks still go to --log-dir)")
    ("share-gpu", "test mode: every worker on the first GPU, each its own NCCL host (NCCL over "
        "sockets: correct, slow; never for performance figures)")
    ("iface", "network interface for Gloo, NCCL's sockets and (several nodes) the store, e.g. eth0",
        cxxopts::value<std::string>())
    ("h,help", "print this help");
  // clang-format on
  cxxopts::ParseResult result;
  try {
    result = options.parse(static_cast<int>(own.size()), own.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see ddprun --help)", e.what()));
  }
  if (result.count("help")) {
    std::cout << options.help() << std::endl;
    return false;
  }
  c.nproc_per_node = result["nproc-per-node"].as<std::string>();
  c.nnodes = parse_int("--nnodes", result["nnodes"].as<std::string>());
  c.node_rank = parse_int("--node-rank", result["node-rank"].as<std::string>());
  c.master_addr = result["master-addr"].as<std::string>();
  c.master_port = parse_int("--master-port", result["master-port"].as<std::string>());
  if (result.count("log-dir")) c.log_dir = result["log-dir"].as<std::string>();
  c.max_restarts = parse_int("--max-restarts", result["max-restarts"].as<std::string>());
  const std::string grace = result["grace-period"].as<std::string>();
  const std::optional<double> seconds = parse_number<double>(grace);
  DDP_USAGE_CHECK(seconds.has_value(), "--grace-period {}: expected seconds", grace);
  c.grace_period = *seconds;
  const std::string timeout = result["timeout"].as<std::string>();
  const std::optional<double> timeout_s = parse_number<double>(timeout);
  DDP_USAGE_CHECK(timeout_s.has_value(), "--timeout {}: expected seconds", timeout);
  c.timeout = *timeout_s;
  c.quiet = result.count("quiet") > 0;
  c.share_gpu = result.count("share-gpu") > 0;
  if (result.count("iface")) c.iface = result["iface"].as<std::string>();
  validate(c);
  return true;
}

void validate(const LaunchConfig& c) {
  DDP_USAGE_CHECK(!c.command.empty(),
                  "no program to run: expected ddprun [options] -- PROGRAM [ARGS...]");
  if (c.nproc_per_node != "gpu" && c.nproc_per_node != "cpu") {
    const int n = parse_number<int>(c.nproc_per_node).value_or(0);
    DDP_USAGE_CHECK(n >= 1 && n <= 4096,
                    "--nproc-per-node {}: expected a positive number, gpu or cpu",
                    c.nproc_per_node);
  }
  DDP_USAGE_CHECK(c.nnodes >= 1, "--nnodes {}: expected at least 1", c.nnodes);
  DDP_USAGE_CHECK(c.node_rank >= 0 && c.node_rank < c.nnodes,
                  "--node-rank {}: expected 0 to {} for --nnodes {}", c.node_rank, c.nnodes - 1,
                  c.nnodes);
  DDP_USAGE_CHECK(c.master_port >= 0 && c.master_port <= 65535,
                  "--master-port {}: expected 0 to 65535", c.master_port);
  DDP_USAGE_CHECK(c.nnodes == 1 || c.master_port != 0,
                  "--master-port 0: a job of {} nodes needs a fixed port that every node knows",
                  c.nnodes);
  DDP_USAGE_CHECK(c.max_restarts >= 0, "--max-restarts {}: expected 0 or more", c.max_restarts);
  if (!c.iface.empty())
    DDP_USAGE_CHECK(!interface_address(c.iface).empty(),
                    "--iface {}: no such interface with an IPv4 address (this machine has: {})",
                    c.iface, fmt::join(interface_addresses(), ", "));
  DDP_USAGE_CHECK(c.grace_period >= 0 && c.grace_period <= 3600,
                  "--grace-period {}: expected 0 to 3600 seconds", c.grace_period);
  DDP_USAGE_CHECK(std::isfinite(c.timeout) && c.timeout >= 0.5 && c.timeout <= 604800,
                  "--timeout {}: expected 0.5 to 604800 seconds (a week)", c.timeout);
}

WorkerPlan plan_workers(const LaunchConfig& config, const GpuList& gpus, int cpu_count) {
  WorkerPlan plan;
  const int found = static_cast<int>(gpus.ids.size());
  if (config.nproc_per_node == "cpu") {
    plan.nproc = std::max(1, cpu_count);
    plan.hide_gpus = true;
    return plan;
  }
  if (config.share_gpu) {
    DDP_USAGE_CHECK(found > 0, "--share-gpu: no GPU found ({}); it puts every worker on one GPU",
                    gpus.detail.empty() ? gpus.source : gpus.detail);
    plan.nproc = config.nproc_per_node == "gpu" ? found : *parse_number<int>(config.nproc_per_node);
    plan.gpu_ids.assign(plan.nproc, gpus.ids.front());
    return plan;
  }
  if (config.nproc_per_node == "gpu") {
    DDP_USAGE_CHECK(found > 0,
                    "--nproc-per-node gpu: no GPU found ({}); use --nproc-per-node N or cpu for "
                    "CPU workers",
                    gpus.detail.empty() ? gpus.source : gpus.detail);
    plan.nproc = found;
    plan.gpu_ids = gpus.ids;
    return plan;
  }
  plan.nproc = *parse_number<int>(config.nproc_per_node);  // checked by validate()
  if (found == 0) return plan;                             // CPU workers
  DDP_USAGE_CHECK(plan.nproc <= found,
                  "--nproc-per-node {}: only {} GPU{} found ({}: {}); ask for at most {}, or use "
                  "--nproc-per-node cpu for CPU workers",
                  plan.nproc, found, found == 1 ? "" : "s", gpus.source,
                  fmt::format("{}", fmt::join(gpus.ids, ",")), found);
  plan.gpu_ids.assign(gpus.ids.begin(), gpus.ids.begin() + plan.nproc);
  return plan;
}

int free_port(const std::string& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  DDP_CHECK(fd >= 0, "socket() failed: {}", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  DDP_CHECK(bound, "cannot find a free port on {}: {}", address, std::strerror(errno));
  return ntohs(addr.sin_port);
}

std::string random_token(const std::string& source) {
  unsigned char bytes[16] = {};
  const int fd = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  DDP_CHECK(fd >= 0,
            "cannot open {} for the store token ({}); refusing to start with a guessable token "
            "(or set DDP_STORE_TOKEN)",
            source, std::strerror(errno));
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::read(fd, bytes + got, sizeof(bytes) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  DDP_CHECK(got == sizeof(bytes),
            "{} gave {} of 16 random bytes for the store token; refusing to start with a "
            "guessable token (or set DDP_STORE_TOKEN)",
            source, got);
  std::string token;
  for (unsigned char b : bytes)
    token += fmt::format("{:02x}", b);
  return token;
}

EnvMap child_environment(const EnvMap& parent, const LaunchConfig& config, const WorkerPlan& plan,
                         int local_rank, const JobPorts& ports, const std::string& token,
                         int restart) {
  EnvMap env = parent;
  const int rank = config.node_rank * plan.nproc + local_rank;
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(config.nnodes * plan.nproc);
  env["LOCAL_WORLD_SIZE"] = std::to_string(plan.nproc);
  env["GROUP_RANK"] = std::to_string(config.node_rank);
  env["ROLE_RANK"] = env["RANK"];
  env["ROLE_WORLD_SIZE"] = env["WORLD_SIZE"];
  env["ROLE_NAME"] = "default";
  env["MASTER_ADDR"] = config.master_addr;
  env["MASTER_PORT"] = std::to_string(ports.program);
  env["DDP_STORE_ADDR"] = config.master_addr;
  env["DDP_STORE_PORT"] = std::to_string(ports.store);
  env["DDP_RESTART_COUNT"] = std::to_string(restart);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(config.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = "none";  // torchrun's default --rdzv-id
  env["DDP_STORE_TOKEN"] = token;
  if (config.launch_time_ms > 0)
    env["DDP_LAUNCH_TIME_MS"] = fmt::format("{:.0f}", config.launch_time_ms);
  if (!config.iface.empty()) {
    if (!env.count("GLOO_SOCKET_IFNAME")) env["GLOO_SOCKET_IFNAME"] = config.iface;
    if (!env.count("NCCL_SOCKET_IFNAME")) env["NCCL_SOCKET_IFNAME"] = config.iface;
  }
  if (config.share_gpu) {
    env["DDP_SHARE_GPU"] = "1";
    env["NCCL_HOSTID"] = fmt::format("ddp-share-gpu-rank-{}", rank);
    if (!env.count("NCCL_SOCKET_IFNAME")) env["NCCL_SOCKET_IFNAME"] = "lo";
  }
  if (!plan.gpu_ids.empty())
    env["CUDA_VISIBLE_DEVICES"] = plan.gpu_ids.at(local_rank);
  else if (plan.hide_gpus)
    env["CUDA_VISIBLE_DEVICES"] = "";
  return env;
}

}  // namespace ddp
