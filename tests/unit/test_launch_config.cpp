// ddprun's pure parts: argument parsing, worker plans, the environment contract, GPU lists,
// and the duplicate-GPU message.
#include <gtest/gtest.h>

#include <set>

#include "launcher/gpu_discovery.h"
#include "launcher/launch_config.h"
#include "runtime/device.h"
#include "runtime/error.h"

namespace ddp {
namespace {

LaunchConfig parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  static std::string name = "ddprun";
  argv.push_back(name.data());
  for (std::string& a : args)
    argv.push_back(a.data());
  LaunchConfig config;
  parse_launch_args(static_cast<int>(argv.size()), argv.data(), &config);
  return config;
}

TEST(LaunchArgs, OptionsThenProgramWithOrWithoutDoubleDash) {
  const LaunchConfig a = parse({"--nproc-per-node", "3", "--", "prog", "--flag", "x"});
  EXPECT_EQ(a.nproc_per_node, "3");
  EXPECT_EQ(a.command, (std::vector<std::string>{"prog", "--flag", "x"}));
  const LaunchConfig b = parse({"--nproc-per-node=2", "--quiet", "prog", "--lr", "1"});
  EXPECT_EQ(b.nproc_per_node, "2");
  EXPECT_TRUE(b.quiet);
  EXPECT_EQ(b.command, (std::vector<std::string>{"prog", "--lr", "1"}));
}

TEST(LaunchArgs, BadValuesNameTheFlag) {
  auto message = [](std::vector<std::string> args) {
    try {
      parse(std::move(args));
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({"--nproc-per-node", "two", "--", "p"}).find("--nproc-per-node two"),
            std::string::npos);
  EXPECT_NE(message({"--master-port", "70000", "--", "p"}).find("--master-port 70000"),
            std::string::npos);
  EXPECT_NE(message({"--grace-period", "soon", "--", "p"}).find("--grace-period soon"),
            std::string::npos);
  EXPECT_NE(message({"--node-rank", "2", "--nnodes", "2", "--", "p"}).find("--node-rank 2"),
            std::string::npos);
  EXPECT_NE(message({"--nproc-per-node", "2"}).find("no program to run"), std::string::npos);
  EXPECT_NE(message({"--bogus", "1", "--", "p"}).find("bogus"), std::string::npos);
}

TEST(WorkerPlan, GpuModeTakesEveryVisibleGpu) {
  LaunchConfig config;
  config.nproc_per_node = "gpu";
  const WorkerPlan plan = plan_workers(config, GpuList{"CUDA_VISIBLE_DEVICES", {"4", "6"}, ""}, 2);
  EXPECT_EQ(plan.nproc, 2);
  EXPECT_EQ(plan.gpu_ids, (std::vector<std::string>{"4", "6"}));
}

TEST(WorkerPlan, MoreGpuWorkersThanGpusShowsWhatWasFound) {
  LaunchConfig config;
  config.nproc_per_node = "3";
  try {
    plan_workers(config, GpuList{"NVML", {"0", "1"}, ""}, 8);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("only 2 GPUs found (NVML: 0,1)"), std::string::npos)
        << e.what();
  }
  config.nproc_per_node = "gpu";
  EXPECT_THROW(plan_workers(config, GpuList{"none", {}, ""}, 8), UsageError);
}

TEST(WorkerPlan, CpuWorkersWithoutGpusOrOnRequest) {
  LaunchConfig config;
  config.nproc_per_node = "3";
  const WorkerPlan plan = plan_workers(config, GpuList{"none", {}, ""}, 8);
  EXPECT_EQ(plan.nproc, 3);
  EXPECT_TRUE(plan.gpu_ids.empty());
  config.nproc_per_node = "cpu";
  const WorkerPlan cpu = plan_workers(config, GpuList{"NVML", {"0"}, ""}, 4);
  EXPECT_EQ(cpu.nproc, 4);
  EXPECT_TRUE(cpu.hide_gpus);
}

TEST(ChildEnvironment, TorchrunContractWithOneGpuEach) {
  LaunchConfig config;
  config.nnodes = 2;
  config.node_rank = 1;
  config.master_addr = "10.1.2.3";
  const WorkerPlan plan{2, {"4", "6"}, false};
  const EnvMap parent = {{"PATH", "/bin"}, {"CUDA_VISIBLE_DEVICES", "4,6"}};
  const EnvMap r0 = child_environment(parent, config, plan, 0, {29500, 29501}, "tok", 0);
  const EnvMap r1 = child_environment(parent, config, plan, 1, {29500, 29501}, "tok", 2);
  EXPECT_EQ(r0.at("CUDA_VISIBLE_DEVICES"), "4");
  EXPECT_EQ(r1.at("CUDA_VISIBLE_DEVICES"), "6");
  EXPECT_EQ(r0.at("RANK"), "2");
  EXPECT_EQ(r1.at("RANK"), "3");
  EXPECT_EQ(r1.at("LOCAL_RANK"), "1");
  EXPECT_EQ(r1.at("WORLD_SIZE"), "4");
  EXPECT_EQ(r1.at("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(r1.at("GROUP_RANK"), "1");
  EXPECT_EQ(r1.at("MASTER_ADDR"), "10.1.2.3");
  EXPECT_EQ(r1.at("MASTER_PORT"), "29501");  // left to the program
  EXPECT_EQ(r1.at("DDP_STORE_ADDR"), "10.1.2.3");
  EXPECT_EQ(r1.at("DDP_STORE_PORT"), "29500");
  EXPECT_EQ(r1.at("ROLE_RANK"), "3");
  EXPECT_EQ(r1.at("ROLE_WORLD_SIZE"), "4");
  EXPECT_EQ(r1.at("TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(r1.at("TORCHELASTIC_MAX_RESTARTS"), "0");
  EXPECT_EQ(r1.at("TORCHELASTIC_RUN_ID"), "none");
  EXPECT_EQ(r1.at("DDP_STORE_TOKEN"), "tok");
  EXPECT_EQ(r1.at("DDP_RESTART_COUNT"), "2");
  EXPECT_EQ(r1.at("PATH"), "/bin");
}

TEST(ChildEnvironment, CpuWorkersKeepOrHideGpus) {
  LaunchConfig config;
  const EnvMap parent = {{"CUDA_VISIBLE_DEVICES", "0"}};
  EXPECT_EQ(child_environment(parent, config, WorkerPlan{2, {}, false}, 1, {1, 1 + 1}, "t", 0)
                .at("CUDA_VISIBLE_DEVICES"),
            "0");
  EXPECT_EQ(child_environment(parent, config, WorkerPlan{2, {}, true}, 1, {1, 1 + 1}, "t", 0)
                .at("CUDA_VISIBLE_DEVICES"),
            "");
}

TEST(GpuDiscovery, VisibleDevicesAreKeptAsGiven) {
  EXPECT_EQ(split_visible_devices("4,6"), (std::vector<std::string>{"4", "6"}));
  EXPECT_EQ(split_visible_devices(" GPU-aa , GPU-bb "),
            (std::vector<std::string>{"GPU-aa", "GPU-bb"}));
  EXPECT_TRUE(split_visible_devices("").empty());
  const GpuList list = discover_gpus(std::string("4,6"));
  EXPECT_EQ(list.source, "CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(list.ids.size(), 2u);
}

TEST(WorkerPlan, ShareGpuPutsEveryWorkerOnTheFirstGpuWithItsOwnNcclHost) {
  const LaunchConfig config = parse({"--share-gpu", "--nproc-per-node", "3", "--", "prog"});
  EXPECT_TRUE(config.share_gpu);
  EXPECT_EQ(config.command, (std::vector<std::string>{"prog"}));
  const WorkerPlan plan = plan_workers(config, GpuList{"nvml", {"0"}, ""}, 2);
  EXPECT_EQ(plan.nproc, 3);
  EXPECT_EQ(plan.gpu_ids, (std::vector<std::string>{"0", "0", "0"}));
  std::set<std::string> host_ids;
  for (int local = 0; local < 3; ++local) {
    const EnvMap env = child_environment({{"NCCL_NVLS_ENABLE", "0"}}, config, plan, local,
                                         {1234, 1234 + 1}, "t", 0);
    EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "0");
    EXPECT_EQ(env.at("DDP_SHARE_GPU"), "1");
    EXPECT_EQ(env.at("NCCL_SOCKET_IFNAME"), "lo");
    EXPECT_EQ(env.at("NCCL_NVLS_ENABLE"), "0");
    host_ids.insert(env.at("NCCL_HOSTID"));
  }
  EXPECT_EQ(host_ids.size(), 3u);
  // The parent's interface choice wins; without --share-gpu nothing of this is set.
  EXPECT_EQ(child_environment({{"NCCL_SOCKET_IFNAME", "eth0"}}, config, plan, 0, {1, 1 + 1}, "t", 0)
                .at("NCCL_SOCKET_IFNAME"),
            "eth0");
  LaunchConfig plain = config;
  plain.share_gpu = false;
  EXPECT_THROW(plan_workers(plain, GpuList{"nvml", {"0"}, ""}, 2), UsageError);
  const EnvMap env = child_environment({}, plain, plan, 0, {1, 1 + 1}, "t", 0);
  EXPECT_EQ(env.count("NCCL_HOSTID"), 0u);
  EXPECT_EQ(env.count("DDP_SHARE_GPU"), 0u);
  EXPECT_THROW(plan_workers(config, GpuList{"none", {}, "no driver"}, 2), UsageError);
}

TEST(DuplicateGpus, RanksWithTheirOwnNcclHostIdsMayShareAGpu) {
  EXPECT_EQ(duplicate_gpu_message({{0, "h", "GPU-a", "0", "ddp-share-gpu-rank-0"},
                                   {1, "h", "GPU-a", "0", "ddp-share-gpu-rank-1"}}),
            "");
  const std::string same =
      duplicate_gpu_message({{0, "h", "GPU-a", "0", "x"}, {1, "h", "GPU-a", "0", "x"}});
  EXPECT_NE(same.find("with the same NCCL_HOSTID 'x'"), std::string::npos) << same;
  EXPECT_NE(same.find("--share-gpu"), std::string::npos) << same;
}

TEST(LaunchArgs, IfaceIsCheckedAndPassedToGlooAndNccl) {
  const LaunchConfig config = parse({"--iface", "lo", "--nproc-per-node", "2", "--", "prog"});
  EXPECT_EQ(config.iface, "lo");
  const WorkerPlan plan{2, {}, false};
  const EnvMap env = child_environment({}, config, plan, 0, {1, 2}, "t", 0);
  EXPECT_EQ(env.at("GLOO_SOCKET_IFNAME"), "lo");
  EXPECT_EQ(env.at("NCCL_SOCKET_IFNAME"), "lo");
  EXPECT_EQ(child_environment({{"NCCL_SOCKET_IFNAME", "ib0"}}, config, plan, 0, {1, 2}, "t", 0)
                .at("NCCL_SOCKET_IFNAME"),
            "ib0");  // the parent's choice wins
  EXPECT_EQ(interface_address("lo"), "127.0.0.1");
  try {
    parse({"--iface", "nosuch9", "--", "prog"});
    ADD_FAILURE() << "an unknown interface was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--iface nosuch9: no such interface"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("lo=127.0.0.1"), std::string::npos) << e.what();
  }
}

TEST(StoreToken, RandomOrRefused) {
  const std::string a = random_token("/dev/urandom");
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, random_token("/dev/urandom"));
  EXPECT_NE(a, std::string(32, '0'));
  for (const char* broken : {"/dev/null", "/nonexistent/random"}) {
    try {
      random_token(broken);
      ADD_FAILURE() << broken << " gave a token";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("refusing to start with a guessable token"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(DuplicateGpus, NamesBothRanksAndTheirVisibleDevices) {
  EXPECT_EQ(duplicate_gpu_message({{0, "h", "GPU-a", "0"}, {1, "h", "GPU-b", "1"}}), "");
  EXPECT_EQ(duplicate_gpu_message({{0, "h1", "GPU-a", "0"}, {1, "h2", "GPU-a", "0"}}), "");
  const std::string message = duplicate_gpu_message(
      {{0, "h", "GPU-a", "0"}, {1, "h", "GPU-a", "GPU-a"}, {2, "h", "GPU-c", "2"}});
  EXPECT_NE(
      message.find("rank 0 (CUDA_VISIBLE_DEVICES='0'), rank 1 (CUDA_VISIBLE_DEVICES='GPU-a')"),
      std::string::npos)
      << message;
  EXPECT_NE(message.find("GPU-a"), std::string::npos);
  EXPECT_EQ(message.find("rank 2"), std::string::npos);
}

}  // namespace
}  // namespace ddp
