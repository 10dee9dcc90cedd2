// Launcher detection: ddprun/torchrun variables first, then Open MPI's, then Slurm's.
#include "runtime/process_env.h"

#include <cstdlib>
#include <vector>

#include "runtime/error.h"
#include "runtime/parse.h"

namespace ddp {

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone:
      return "none";
    case Launcher::kDdprun:
      return "ddprun";
    case Launcher::kMpirun:
      return "mpirun";
    case Launcher::kSrun:
      return "srun";
  }
  return "?";
}

namespace {

using Lookup = std::function<std::optional<std::string>(const char*)>;

int read_int(const Lookup& lookup, const char* name, int fallback) {
  const auto value = lookup(name);
  if (!value) return fallback;
  const std::optional<int> parsed = parse_number<int>(*value);
  DDP_USAGE_CHECK(parsed && *parsed >= 0 && *parsed < (1 << 30),
                  "environment variable {}={}: expected a non-negative integer", name, *value);
  return *parsed;
}

}  // namespace

ProcessEnv ProcessEnv::detect(const Lookup& lookup) {
  ProcessEnv env;
  if (const auto cvd = lookup("CUDA_VISIBLE_DEVICES")) {
    env.cuda_visible_devices = *cvd;
    env.cuda_visible_devices_set = true;
  }
  if (lookup("RANK") && lookup("WORLD_SIZE")) {
    env.launcher = Launcher::kDdprun;
    env.rank = read_int(lookup, "RANK", 0);
    env.world_size = read_int(lookup, "WORLD_SIZE", 1);
    env.local_rank = read_int(lookup, "LOCAL_RANK", env.rank);
    env.local_world_size = read_int(lookup, "LOCAL_WORLD_SIZE", env.world_size);
    env.group_rank = read_int(lookup, "GROUP_RANK", 0);
    env.restart_count = read_int(lookup, "DDP_RESTART_COUNT", 0);
    // ddprun passes its store as DDP_STORE_*, leaving MASTER_* to PyTorch programs; a
    // launcher that sets only MASTER_* (torchrun's way) is read as before.
    env.master_addr =
        lookup("DDP_STORE_ADDR").value_or(lookup("MASTER_ADDR").value_or("127.0.0.1"));
    env.master_port = lookup("DDP_STORE_PORT") ? read_int(lookup, "DDP_STORE_PORT", 0)
                                               : read_int(lookup, "MASTER_PORT", 0);
    env.rank_prefixed = lookup("DDP_STORE_PORT").has_value();
    env.store_token = lookup("DDP_STORE_TOKEN").value_or("");
    env.run_id = lookup("TORCHELASTIC_RUN_ID").value_or("");
    if (!lookup("DDP_STORE_PORT") && lookup("TORCHELASTIC_RUN_ID")) {
      env.torch_store = true;
      env.torch2_store = lookup("TORCH_NCCL_ASYNC_ERROR_HANDLING").has_value();
      env.torch_rank0_store = lookup("TORCHELASTIC_USE_AGENT_STORE").value_or("True") != "True";
      env.restart_count = read_int(lookup, "TORCHELASTIC_RESTART_COUNT", 0);
    }
    if (const auto launched = lookup("DDP_LAUNCH_TIME_MS"))
      env.launch_time_ms = parse_number<double>(*launched).value_or(0.0);
  } else if (lookup("OMPI_COMM_WORLD_RANK")) {
    env.launcher = Launcher::kMpirun;
    env.rank = read_int(lookup, "OMPI_COMM_WORLD_RANK", 0);
    env.world_size = read_int(lookup, "OMPI_COMM_WORLD_SIZE", 1);
    env.local_rank = read_int(lookup, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    env.local_world_size = read_int(lookup, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    env.group_rank = read_int(lookup, "OMPI_COMM_WORLD_NODE_RANK", 0);
  } else if (lookup("SLURM_PROCID") && lookup("SLURM_NTASKS")) {
    env.launcher = Launcher::kSrun;
    env.rank = read_int(lookup, "SLURM_PROCID", 0);
    env.world_size = read_int(lookup, "SLURM_NTASKS", 1);
    env.local_rank = read_int(lookup, "SLURM_LOCALID", 0);
    env.group_rank = read_int(lookup, "SLURM_NODEID", 0);
    if (lookup("SLURM_NTASKS_PER_NODE")) {
      env.local_world_size = read_int(lookup, "SLURM_NTASKS_PER_NODE", 1);
    } else {
      const std::string tasks = lookup("SLURM_TASKS_PER_NODE").value_or("");
      env.local_world_size = tasks_on_node(tasks, env.group_rank);
      DDP_USAGE_CHECK(env.local_world_size > 0,
                      "srun environment: the local world size is unknown (SLURM_NTASKS_PER_NODE "
                      "unset, SLURM_TASKS_PER_NODE='{}' says nothing of node {}); run with srun "
                      "--ntasks-per-node N",
                      tasks, env.group_rank);
    }
    env.master_addr = lookup("MASTER_ADDR").value_or("");
    env.master_port = read_int(lookup, "MASTER_PORT", 0);
    const std::string job = lookup("SLURM_JOB_ID").value_or("");
    // As PyTorch's env:// under Slurm is usually given them: the job's first node, and a port
    // of the job's own (the same on every task), where the script sets neither.
    if (env.master_addr.empty() && env.world_size > 1)
      env.master_addr =
          first_host(lookup("SLURM_JOB_NODELIST").value_or(lookup("SLURM_NODELIST").value_or("")));
    // The step too: two srun steps of one job running side by side (`srun ... & srun ... &`)
    // must not meet at one store and train as one world.
    const std::string step = lookup("SLURM_STEP_ID").value_or(lookup("SLURM_STEPID").value_or(""));
    const std::optional<int64_t> job_number = parse_number<int64_t>(job);
    const std::optional<int64_t> step_number = parse_number<int64_t>(step);
    if (env.master_port == 0 && env.world_size > 1 && !env.master_addr.empty() && job_number &&
        *job_number >= 0) {
      const int64_t step_part = step_number && *step_number >= 0 ? *step_number : 0;
      env.master_port = static_cast<int>(20000 + (*job_number + 1009 * step_part) % 10000);
      env.store_from_slurm = true;
    }
    std::string derived;
    if (!job.empty()) derived = "slurm-" + job + (step.empty() ? "" : "." + step);
    env.store_token = lookup("DDP_STORE_TOKEN").value_or(derived);
    env.run_id = derived;
    env.serves_store = env.rank == 0 && env.master_port > 0;
  }
  if (const auto share = lookup("DDP_SHARE_GPU")) {
    DDP_USAGE_CHECK(*share == "0" || *share == "1" || share->empty(),
                    "environment variable DDP_SHARE_GPU={}: expected 0 or 1", *share);
    env.share_gpu = *share == "1";
  }
  env.nccl_host_id = lookup("NCCL_HOSTID").value_or("");
  if (const auto munge = lookup("DDP_STORE_MUNGE")) {
    DDP_USAGE_CHECK(*munge == "0" || *munge == "1",
                    "environment variable DDP_STORE_MUNGE={}: expected 0 or 1", *munge);
    env.store_munge = *munge == "1";
  }
  env.munge_socket = lookup("DDP_MUNGE_SOCKET").value_or("");
  env.omp_threads_given = lookup("OMP_NUM_THREADS").has_value();
  env.socket_iface = lookup("GLOO_SOCKET_IFNAME").value_or("");
  auto set = [&](const char* name) { return lookup(name).value_or(""); };
  if (!set("DDP_CACHE_DIR").empty())
    env.cache_dir = set("DDP_CACHE_DIR");
  else if (!set("XDG_CACHE_HOME").empty())
    env.cache_dir = set("XDG_CACHE_HOME") + "/ddp";
  else if (!set("HOME").empty())
    env.cache_dir = set("HOME") + "/.cache/ddp";
  DDP_USAGE_CHECK(env.world_size >= 1 && env.rank < env.world_size,
                  "{} environment: rank {} is not below world size {}", launcher_name(env.launcher),
                  env.rank, env.world_size);
  DDP_USAGE_CHECK(env.local_rank < env.local_world_size,
                  "{} environment: local rank {} is not below local world size {}",
                  launcher_name(env.launcher), env.local_rank, env.local_world_size);
  return env;
}

std::string first_host(const std::string& nodelist) {
  // "gpu[07-09,12],cpu3" -> "gpu07"; "a,b" -> "a"; "" -> "".
  const size_t bracket = nodelist.find('['), comma = nodelist.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket))
    return nodelist.substr(0, comma);
  const size_t end = nodelist.find_first_of("-,]", bracket + 1);
  if (end == std::string::npos) return nodelist.substr(0, bracket);
  return nodelist.substr(0, bracket) + nodelist.substr(bracket + 1, end - bracket - 1);
}

int tasks_on_node(const std::string& tasks_per_node, int node) {
  // Comma-separated groups "N" or "N(xM)": N tasks on each of the next M nodes.
  int first = 0;
  size_t at = 0;
  while (at < tasks_per_node.size()) {
    const size_t comma = tasks_per_node.find(',', at);
    const std::string group =
        tasks_per_node.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? tasks_per_node.size() : comma + 1;
    // "4" or "4(x3)": tasks on each of `repeat` nodes.
    long tasks = 0, repeat = 1;
    size_t used = parse_number_prefix(std::string_view(group), &tasks);
    if (used == 0) return 0;
    if (used < group.size()) {
      const std::string_view rest = std::string_view(group).substr(used);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') return 0;
      const std::optional<long> times = parse_number<long>(rest.substr(2, rest.size() - 3));
      if (!times) return 0;
      repeat = *times;
    }
    if (tasks <= 0 || repeat <= 0) return 0;
    if (node < first + repeat) return static_cast<int>(tasks);
    first += static_cast<int>(repeat);
  }
  return 0;
}

void narrow_visible_devices(ProcessEnv* env) {
  if (env->share_gpu) {
    if (env->nccl_host_id.empty()) {
      env->nccl_host_id = "ddp-share-gpu-rank-" + std::to_string(env->rank);
      ::setenv("NCCL_HOSTID", env->nccl_host_id.c_str(), 1);
    }
    ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  }
  std::vector<std::string> ids;
  if (env->cuda_visible_devices_set) {
    std::string item;
    for (char c : env->cuda_visible_devices + ",") {
      if (c == ',') {
        if (!item.empty()) ids.push_back(item);
        item.clear();
      } else if (c != ' ') {
        item += c;
      }
    }
    if (ids.size() <= 1) return;  // already one GPU (or none): nothing to narrow
    const int index = env->share_gpu ? 0 : env->local_rank;
    DDP_USAGE_CHECK(index < static_cast<int>(ids.size()),
                    "{}: local rank {} but CUDA_VISIBLE_DEVICES={} lists only {} GPUs",
                    launcher_name(env->launcher), env->local_rank, env->cuda_visible_devices,
                    ids.size());
    env->cuda_visible_devices = ids[index];
  } else {
    env->cuda_visible_devices = env->share_gpu ? "0" : std::to_string(env->local_rank);
  }
  env->cuda_visible_devices_set = true;
  ::setenv("CUDA_VISIBLE_DEVICES", env->cuda_visible_devices.c_str(), 1);
}

ProcessEnv ProcessEnv::detect() {
  return detect([](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

}  // namespace ddp
