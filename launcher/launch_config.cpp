// ddprun's command line and the worker environment contract.
#include "launcher/launch_config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/flag_hint.h"
#include "runtime/parse.h"
#include "runtime/socket.h"

namespace ddp {
namespace {

int parse_int(const std::string& flag, const std::string& value) {
  const std::optional<int> parsed = parse_number<int>(value);
  DDP_USAGE_CHECK(parsed.has_value(), "{} {}: expected an integer", flag, value);
  return *parsed;
}

// Switches (no value): the program starts at the first argument that is not an option or an
// option's value, or after "--".
// torchrun's flags that change nothing under ddprun: accepted, each named once in a note
// that says why (a torchrun command line runs unchanged).
struct NoOpFlag {
  const char* name;
  bool takes_value;
  const char* why;
};
constexpr NoOpFlag kTorchrunNoOps[] = {
    {"exit-barrier-timeout", true,
     "ddprun waits for every worker's exit itself and needs no barrier"},
    {"logs-specs", true, "ddprun writes its own per-rank logs (--log-dir)"},
    {"event-log-handler", true, "ddprun keeps no torchelastic event log"},
    {"numa-binding", true, "ddprun binds no NUMA nodes; numactl in the command does"},
    {"signals-to-handle", true, "ddprun forwards SIGINT, SIGTERM and SIGHUP to every worker"},
    {"duplicate-stdout-filters", true, "ddprun tees whole streams (--tee)"},
    {"duplicate-stderr-filters", true, "ddprun tees whole streams (--tee)"},
    {"virtual-local-rank", false, "each worker sees its one GPU as device 0 already"},
};

bool takes_value(const std::string& arg) {
  for (const char* flag : {"--quiet", "--share-gpu", "--help", "-h", "--standalone", "-m",
                           "--module", "--no-python", "--run-path", "--no-torch-store"})
    if (arg == flag) return false;
  for (const NoOpFlag& flag : kTorchrunNoOps)
    if (!flag.takes_value && arg == std::string("--") + flag.name) return false;
  return arg.find('=') == std::string::npos;
}

// torchrun 1.x spells its flags with underscores (--nproc_per_node), 2.x both ways: an
// option's name with '-' for '_' (its value as given).
std::string dashed(const std::string& arg) {
  if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) return arg;
  const size_t end = std::min(arg.find('='), arg.size());
  std::string out = arg;
  std::replace(out.begin() + 2, out.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  return out;
}

}  // namespace

int stream_bits(const std::vector<int>& per_rank, int local_rank) {
  if (per_rank.empty()) return 0;
  if (per_rank.size() == 1 && per_rank[0] >= 0 && local_rank >= 0) return per_rank[0];
  return local_rank >= 0 && local_rank + 1 < static_cast<int>(per_rank.size())
             ? per_rank[static_cast<size_t>(local_rank) + 1]
             : 0;
}

std::vector<int> parse_streams(const std::string& flag, const std::string& value) {
  // Stored as {all} for one value, or {-1, rank 0's, rank 1's, ...} for a map.
  const auto bits = [&](const std::string& text) {
    const std::optional<int> v = parse_number<int>(text);
    DDP_USAGE_CHECK(v && *v >= 0 && *v <= 3,
                    "{} {}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or per local "
                    "rank like 0:1,1:2",
                    flag, value);
    return *v;
  };
  if (value.find(':') == std::string::npos) return {bits(value)};
  std::vector<int> out = {-1};
  size_t at = 0;
  while (at <= value.size()) {
    const size_t comma = std::min(value.find(',', at), value.size());
    const std::string part = value.substr(at, comma - at);
    const size_t colon = part.find(':');
    const std::optional<int> rank =
        colon == std::string::npos ? std::nullopt : parse_number<int>(part.substr(0, colon));
    DDP_USAGE_CHECK(rank && *rank >= 0 && *rank < 4096,
                    "{} {}: '{}' is not LOCAL_RANK:STREAMS (like 0:1,1:2)", flag, value, part);
    if (out.size() < static_cast<size_t>(*rank) + 2) out.resize(static_cast<size_t>(*rank) + 2, 0);
    out[static_cast<size_t>(*rank) + 1] = bits(part.substr(colon + 1));
    at = comma + 1;
  }
  return out;
}

bool launches_python(const LaunchConfig& c) {
  if (c.command.empty()) return false;
  const std::string& program = c.command.front();
  return c.module || c.run_path ||
         (!c.no_python && program.size() > 3 && program.compare(program.size() - 3, 3, ".py") == 0);
}

std::string find_on_path(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr ? path : "";
  for (size_t at = 0; at <= dirs.size();) {
    const size_t colon = std::min(dirs.find(':', at), dirs.size());
    const std::string dir = dirs.substr(at, colon - at);
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    at = colon + 1;
  }
  return "not on PATH";
}

bool runs_python(const LaunchConfig& c) {
  if (c.command.empty()) return false;
  if (launches_python(c)) return true;
  const std::string& program = c.command.front();
  const std::string name = program.substr(program.find_last_of('/') + 1);
  return name.rfind("python", 0) == 0;  // python, python3, python3.11
}

std::vector<std::string> program_argv(const LaunchConfig& c) {
  if (!launches_python(c)) return c.command;
  std::vector<std::string> argv = {c.python, "-u"};
  if (c.module) argv.push_back("-m");
  argv.insert(argv.end(), c.command.begin(), c.command.end());
  return argv;
}

std::string worker_dir(const LaunchConfig& config, int restart, int local_rank) {
  return fmt::format("{}/attempt_{}/{}", config.run_dir, restart, local_rank);
}

std::vector<std::string> describe_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) return {};
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("message")) return {};
  // {"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "..."}}}
  // (or a plain string message, as torch writes for some errors).
  const nlohmann::json& m = j["message"];
  std::vector<std::string> lines;
  const auto split = [&](const std::string& text) {
    size_t at = 0;
    while (at < text.size()) {
      const size_t nl = std::min(text.find('\n', at), text.size());
      lines.push_back(text.substr(at, nl - at));
      at = nl + 1;
    }
  };
  if (m.is_string()) {
    split(m.get<std::string>());
    return lines;
  }
  if (m.contains("message") && m["message"].is_string()) split(m["message"].get<std::string>());
  if (m.contains("extraInfo") && m["extraInfo"].contains("py_callstack") &&
      m["extraInfo"]["py_callstack"].is_string())
    split(m["extraInfo"]["py_callstack"].get<std::string>());
  return lines;
}

const char* const kDdprunHelpFooter =
    "Environment (read):\n"
    "  DDP_STORE_TOKEN       the rendezvous store's secret; past one node set the same one on\n"
    "                        every node (else: a random one on one node, one derived from\n"
    "                        --rdzv-id, named weak, across nodes)\n"
    "  CUDA_VISIBLE_DEVICES  the GPUs to use (each worker gets one of them)\n"
    "  OMP_NUM_THREADS       passed on; unset with several workers a node: 1 (as torchrun)\n"
    "  DDP_PYTHON            the interpreter of a .py PROGRAM, -m or --run-path (else python3)\n"
    "  PATH                  where PROGRAM is found (checked before any worker starts)\n"
    "Environment (each worker's): RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK\n"
    "  MASTER_ADDR MASTER_PORT TORCHELASTIC_RUN_ID TORCHELASTIC_RESTART_COUNT, and ddp's own\n"
    "  DDP_STORE_ADDR DDP_STORE_PORT DDP_STORE_TOKEN (ddp::init joins through them)\n"
    "\n"
    "Examples:\n"
    "  ddprun --nproc-per-node gpu -- build/bin/ddptrain --device cuda\n"
    "  ddprun --nproc-per-node 2 train.py --epochs 3\n"
    "  ddprun --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 "
    "--nproc-per-node gpu -- prog\n"
    "  ddprun --nnodes 1:3 --rdzv-endpoint 10.0.0.1:29400 --rdzv-id job7 --max-restarts 3 "
    "-- prog\n";

bool parse_launch_args(int argc, char** argv, LaunchConfig* config) {
  LaunchConfig& c = *config;
  const LaunchConfig d;
  std::vector<char*> own{argv[0]};
  std::vector<std::string> spellings;  // ddprun's own arguments, dashed
  spellings.reserve(static_cast<size_t>(argc));
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;
    spellings.push_back(dashed(arg));
    if (takes_value(spellings.back()) && i + 1 < argc) spellings.push_back(argv[++i]);
  }
  for (std::string& s : spellings)
    own.push_back(s.data());
  for (; i < argc; ++i)
    c.command.push_back(argv[i]);

  cxxopts::Options options("ddprun",
                           "Start one worker process per GPU (or CPU worker) with the torchrun "
                           "environment, host the rendezvous store, supervise the workers.");
  options.custom_help("[options] [--] PROGRAM [ARGS...]");
  // clang-format off
  options.add_options()
    ("nproc-per-node", "workers on this node: N, gpu (one per visible GPU; left out on a machine "
        "without GPUs: 1, as torchrun), cpu (one per core) or auto (gpu where there are GPUs, "
        "else cpu)",
        cxxopts::value<std::string>()->default_value(d.nproc_per_node))
    ("nnodes", "number of nodes, or MIN:MAX (elastic: --rdzv-endpoint, no --node-rank); N with --rdzv-backend c10d and no --node-rank, or N:N: numbered as they join", cxxopts::value<std::string>()->default_value(std::to_string(d.nnodes)))
    ("node-rank", "this node's index", cxxopts::value<std::string>()->default_value(std::to_string(d.node_rank)))
    ("master-addr", "address of node 0, where the store runs", cxxopts::value<std::string>()->default_value(d.master_addr))
    ("master-port", "one node: PyTorch's store's port, MASTER_PORT (ddprun's own store takes a "
        "free one); several nodes: ddprun's store's; 0: pick a free one (one node only)",
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
    ("standalone", "torchrun's: one node, the store on a free port of this machine")
    ("rdzv-backend", "torchrun's: static (nodes given --node-rank) or c10d (numbered as they join; both: ddprun's own store)", cxxopts::value<std::string>())
    ("rdzv-endpoint", "torchrun's: HOST[:PORT] of the store (node 0's; port 29400 if left out)",
        cxxopts::value<std::string>())
    ("rdzv-id", "torchrun's: the job's id (TORCHELASTIC_RUN_ID; several nodes without DDP_STORE_TOKEN: the store's token from it)", cxxopts::value<std::string>())
    ("rdzv-conf", "torchrun's: key=value,...; join_timeout sets --timeout, last_call_timeout "
        "how long an elastic join waits for more nodes once it has enough",
        cxxopts::value<std::string>())
    ("role", "torchrun's: the workers' role (ROLE_NAME)", cxxopts::value<std::string>())
    ("m,module", "torchrun's: PROGRAM is a Python module, run as python3 -u -m PROGRAM")
    ("no-python", "torchrun's: run PROGRAM as given, even one ending in .py")
    ("run-path", "torchrun's: PROGRAM is a Python file, run with python3 (as a .py is)")
    ("python", "the interpreter a .py PROGRAM or -m MODULE runs with (torchrun: its own): "
        "python3 on PATH, or DDP_PYTHON", cxxopts::value<std::string>())
    ("r,redirects", "torchrun's: streams of each rank to files only: 0 none, 1 stdout, 2 stderr, 3 "
        "both, or per local rank like 0:1,1:2 (files under --log-dir, torchrun's layout)",
        cxxopts::value<std::string>())
    ("t,tee", "torchrun's: streams of each rank to files and the console (as --redirects)",
        cxxopts::value<std::string>())
    ("local-ranks-filter", "torchrun's: only these local ranks on the console, like 0,1",
        cxxopts::value<std::string>())
    ("monitor-interval", "torchrun's: accepted and not needed (ddprun acts on an exit at once)",
        cxxopts::value<std::string>())
    ("start-method", "torchrun's: accepted (ddprun starts workers with fork and exec)",
        cxxopts::value<std::string>())
    ("local-addr", "torchrun's: refused (give --iface)", cxxopts::value<std::string>())
    ("no-torch-store", "leave PyTorch's store to the program's rank 0 (by default ddprun, on node "
        "0, serves it at MASTER_PORT, the c10d TCPStore protocol of PyTorch 1.13 and 2.x, and sets "
        "TORCHELASTIC_USE_AGENT_STORE as torchrun does)")
    ("h,help", "print this help");
  // clang-format on
  for (const NoOpFlag& flag : kTorchrunNoOps) {
    const std::string help =
        std::string("torchrun's: accepted, changes nothing (") + flag.why + ")";
    if (flag.takes_value)
      options.add_options()(flag.name, help, cxxopts::value<std::string>());
    else
      options.add_options()(flag.name, help);
  }
  // An unknown flag before the program: the one it most likely meant, and where a flag of
  // the program goes.
  std::vector<std::string> known;
  for (const cxxopts::HelpOptionDetails& o : options.group_help("").options)
    known.insert(known.end(), o.l.begin(), o.l.end());
  for (size_t k = 0; k < spellings.size(); ++k) {
    const std::string& arg = spellings[k];
    if (arg.size() > 2 && arg.compare(0, 2, "--") == 0) {
      const std::string name = arg.substr(2, arg.find('=') - 2);
      const std::string hint = did_you_mean(name, known);
      DDP_USAGE_CHECK(std::find(known.begin(), known.end(), name) != known.end(),
                      "--{}: not a ddprun flag;{} {} flag of the program goes after it: ddprun "
                      "[options] PROGRAM --{} ... (see ddprun --help)",
                      name, hint, hint.empty() ? "a" : "A", name);
    }
    if (takes_value(arg) && arg.find('=') == std::string::npos) ++k;  // its value
  }
  cxxopts::ParseResult result;
  try {
    result = options.parse(static_cast<int>(own.size()), own.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(fmt::format("{} (see ddprun --help)", e.what()));
  }
  if (result.count("help")) {
    std::cout << options.help() << '\n' << kDdprunHelpFooter << std::endl;
    return false;
  }
  c.nproc_per_node = result["nproc-per-node"].as<std::string>();
  c.nproc_given = result.count("nproc-per-node") > 0;
  const std::string nnodes = result["nnodes"].as<std::string>();
  const size_t colon = nnodes.find(':');
  if (colon != std::string::npos) {
    const int low = parse_int("--nnodes", nnodes.substr(0, colon));
    const int high = parse_int("--nnodes", nnodes.substr(colon + 1));
    DDP_USAGE_CHECK(low >= 1 && high >= low, "--nnodes {}: expected MIN:MAX with 1 <= MIN <= MAX",
                    nnodes);
    c.nnodes = low;
    c.max_nodes = high;
  } else {
    c.nnodes = parse_int("--nnodes", nnodes);
    c.max_nodes = c.nnodes;
  }
  c.node_rank = parse_int("--node-rank", result["node-rank"].as<std::string>());
  c.master_addr = result["master-addr"].as<std::string>();
  c.master_port = parse_int("--master-port", result["master-port"].as<std::string>());
  if (result.count("standalone")) {
    DDP_USAGE_CHECK(c.nnodes == 1, "--standalone with --nnodes {}: standalone is one node",
                    c.nnodes);
    c.master_addr = "127.0.0.1";
    c.master_port = 0;
  }
  if (result.count("rdzv-backend")) {
    const std::string backend = result["rdzv-backend"].as<std::string>();
    DDP_USAGE_CHECK(backend == "static" || backend == "c10d",
                    "--rdzv-backend {}: expected static or c10d (ddprun serves the rendezvous "
                    "itself; no etcd)",
                    backend);
    // torchrun's c10d rendezvous numbers the nodes as they arrive; static needs node ranks.
    if (backend == "c10d" && c.nnodes > 1 && !result.count("node-rank")) c.by_arrival = true;
    DDP_USAGE_CHECK(c.nnodes == 1 || c.elastic() || result.count("node-rank"),
                    "--rdzv-backend static with --nnodes {}: give each node its --node-rank (0 on "
                    "the node of --master-addr), or use --rdzv-backend c10d, which numbers the "
                    "nodes as they join",
                    c.nnodes);
  }
  // --nnodes N:N without node ranks: numbered as they join, as torchrun does.
  if (colon != std::string::npos && c.nnodes > 1 && !result.count("node-rank")) c.by_arrival = true;
  if (result.count("rdzv-endpoint") && !result.count("standalone")) {
    const std::string endpoint = result["rdzv-endpoint"].as<std::string>();
    const size_t at = endpoint.rfind(':');
    c.master_addr = endpoint.substr(0, at);
    c.master_port = at == std::string::npos ? 29400
                                            : parse_int("--rdzv-endpoint " + endpoint + ": port",
                                                        endpoint.substr(at + 1));
    DDP_USAGE_CHECK(!c.master_addr.empty(), "--rdzv-endpoint {}: expected HOST[:PORT]", endpoint);
    if (c.master_addr == "localhost") c.master_addr = "127.0.0.1";
  }
  if (result.count("rdzv-id")) {
    c.run_id = result["rdzv-id"].as<std::string>();
    c.run_id_given = true;
  }
  std::optional<double> join_timeout;  // --rdzv-conf's, unless --timeout is given
  if (result.count("rdzv-conf")) {
    const std::string conf = result["rdzv-conf"].as<std::string>();
    size_t at = 0;
    while (at < conf.size()) {
      const size_t comma = std::min(conf.find(',', at), conf.size());
      const std::string part = conf.substr(at, comma - at);
      const size_t eq = part.find('=');
      DDP_USAGE_CHECK(eq != std::string::npos, "--rdzv-conf {}: '{}' is not KEY=VALUE", conf, part);
      const std::string key = part.substr(0, eq), value = part.substr(eq + 1);
      if (key == "join_timeout") {
        const std::optional<double> seconds = parse_number<double>(value);
        DDP_USAGE_CHECK(seconds.has_value(), "--rdzv-conf {}: join_timeout {}: expected seconds",
                        conf, value);
        join_timeout = *seconds;
      } else if (key == "last_call_timeout") {
        const std::optional<double> seconds = parse_number<double>(value);
        DDP_USAGE_CHECK(seconds && *seconds >= 0,
                        "--rdzv-conf {}: last_call_timeout {}: expected seconds", conf, value);
        c.last_call_s = *seconds;
      } else {
        c.notes.push_back(
            fmt::format("--rdzv-conf {}: taken as given (ddprun's store has no "
                        "such setting)",
                        part));
      }
      at = comma + 1;
    }
  }
  if (result.count("role")) c.role = result["role"].as<std::string>();
  c.module = result.count("module") > 0;
  if (result.count("python")) {
    c.python = result["python"].as<std::string>();
  } else if (const char* python = std::getenv("DDP_PYTHON"); python != nullptr && *python) {
    c.python = python;
  }
  DDP_USAGE_CHECK(!c.python.empty(), "--python: expected an interpreter, like /usr/bin/python3");
  c.no_python = result.count("no-python") > 0;
  c.run_path = result.count("run-path") > 0;
  c.torch_store = result.count("no-torch-store") == 0;
  DDP_USAGE_CHECK(!(c.module && c.no_python),
                  "-m with --no-python: a module runs with python3; give one of them");
  if (result.count("redirects"))
    c.redirects = parse_streams("--redirects", result["redirects"].as<std::string>());
  if (result.count("tee")) c.tee = parse_streams("--tee", result["tee"].as<std::string>());
  if (result.count("local-ranks-filter")) {
    const std::string filter = result["local-ranks-filter"].as<std::string>();
    size_t at = 0;
    while (at <= filter.size()) {
      const size_t comma = std::min(filter.find(',', at), filter.size());
      const std::optional<int> r = parse_number<int>(filter.substr(at, comma - at));
      DDP_USAGE_CHECK(r && *r >= 0, "--local-ranks-filter {}: expected local ranks like 0,1",
                      filter);
      c.local_ranks_filter.push_back(*r);
      at = comma + 1;
    }
  }
  for (const NoOpFlag& flag : kTorchrunNoOps)
    if (result.count(flag.name))
      c.notes.push_back(fmt::format(
          "--{}{}: accepted, changes nothing ({})", flag.name,
          flag.takes_value ? " " + result[flag.name].as<std::string>() : std::string(), flag.why));
  if (result.count("monitor-interval"))
    c.notes.push_back(
        fmt::format("--monitor-interval {}: not needed (ddprun acts on a worker's exit at once)",
                    result["monitor-interval"].as<std::string>()));
  if (result.count("start-method")) {
    const std::string method = result["start-method"].as<std::string>();
    DDP_USAGE_CHECK(method == "spawn" || method == "fork" || method == "forkserver",
                    "--start-method {}: expected spawn, fork or forkserver", method);
    c.notes.push_back(fmt::format(
        "--start-method {}: ddprun starts every worker as a new process (fork and exec)", method));
  }
  DDP_USAGE_CHECK(!result.count("local-addr"),
                  "--local-addr: not taken; give --iface with this node's interface instead");
  if (result.count("log-dir")) c.log_dir = result["log-dir"].as<std::string>();
  c.max_restarts = parse_int("--max-restarts", result["max-restarts"].as<std::string>());
  const std::string grace = result["grace-period"].as<std::string>();
  const std::optional<double> seconds = parse_number<double>(grace);
  DDP_USAGE_CHECK(seconds.has_value(), "--grace-period {}: expected seconds", grace);
  c.grace_period = *seconds;
  const std::string timeout = result["timeout"].as<std::string>();
  const std::optional<double> timeout_s = parse_number<double>(timeout);
  DDP_USAGE_CHECK(timeout_s.has_value(), "--timeout {}: expected seconds", timeout);
  c.timeout = result.count("timeout") == 0 && join_timeout ? *join_timeout : *timeout_s;
  c.quiet = result.count("quiet") > 0;
  c.share_gpu = result.count("share-gpu") > 0;
  if (result.count("iface")) c.iface = result["iface"].as<std::string>();
  if (c.elastic()) {
    DDP_USAGE_CHECK(!result.count("node-rank"),
                    "--node-rank with --nnodes {}:{}: the nodes of an elastic job are numbered "
                    "in the order they join each generation; drop --node-rank",
                    c.nnodes, c.max_nodes);
    DDP_USAGE_CHECK(result.count("rdzv-endpoint") || result.count("master-addr"),
                    "--nnodes {}:{}: give --rdzv-endpoint HOST:PORT (the same on every node; the "
                    "node that can listen there serves the rendezvous)",
                    c.nnodes, c.max_nodes);
    if (c.torch_store) {
      c.torch_store = false;
      if (runs_python(c))  // a PyTorch program's note only
        c.notes.push_back(fmt::format(
            "--nnodes {}: PyTorch's store is left to the program's rank 0 where nodes are "
            "numbered as they join (MASTER_ADDR is the generation's first node)",
            c.by_arrival && c.max_nodes == c.nnodes ? std::to_string(c.nnodes)
                                                    : fmt::format("{}:{}", c.nnodes, c.max_nodes)));
    }
  }
  validate(c);
  return true;
}

void validate(const LaunchConfig& c) {
  DDP_USAGE_CHECK(!c.command.empty(),
                  "no program to run: expected ddprun [options] -- PROGRAM [ARGS...]");
  if (c.nproc_per_node != "gpu" && c.nproc_per_node != "cpu" && c.nproc_per_node != "auto") {
    const int n = parse_number<int>(c.nproc_per_node).value_or(0);
    DDP_USAGE_CHECK(n >= 1 && n <= 4096,
                    "--nproc-per-node {}: expected a positive number, gpu, cpu or auto",
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
  // torchrun's auto: a worker per GPU when there are GPUs, else one per core.
  if (config.nproc_per_node == "auto") {
    LaunchConfig resolved = config;
    resolved.nproc_per_node = found > 0 ? "gpu" : "cpu";
    return plan_workers(resolved, gpus, cpu_count);
  }
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
  if (config.nproc_per_node == "gpu" && found == 0 && !config.nproc_given) {
    plan.nproc = 1;
    plan.note = fmt::format(
        "no GPU found ({}): one CPU worker, torchrun's default without --nproc-per-node; give "
        "--nproc-per-node N or cpu for more",
        gpus.detail.empty() ? gpus.source : gpus.detail);
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
  env["GROUP_WORLD_SIZE"] = std::to_string(config.nnodes);
  env["ROLE_RANK"] = env["RANK"];
  env["ROLE_WORLD_SIZE"] = env["WORLD_SIZE"];
  env["ROLE_NAME"] = config.role;
  // As torchrun: several workers on one node would oversubscribe its cores.
  if (plan.nproc > 1 && !env.count("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = "1";
  env["MASTER_ADDR"] = config.master_addr;
  env["MASTER_PORT"] = std::to_string(ports.program);
  env["DDP_STORE_ADDR"] = config.master_addr;
  env["DDP_STORE_PORT"] = std::to_string(ports.store);
  env["DDP_RESTART_COUNT"] = std::to_string(restart);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(config.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = config.run_id;  // torchrun's default --rdzv-id: none
  // Every rank a client of the store ddprun serves at MASTER_PORT (torchrun's agent store).
  if (config.torch_store) env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
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
