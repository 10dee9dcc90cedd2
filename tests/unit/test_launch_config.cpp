// ddprun's pure parts: argument parsing, worker plans, the environment contract, GPU lists,
// and the duplicate-GPU message.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "launcher/gpu_discovery.h"
#include "launcher/launch_config.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/flag_hint.h"

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

// Every example of --help's footer parses as ddprun reads it; the environment section names
// the store's secret.
TEST(LaunchArgs, HelpExamplesParse) {
  const std::string footer = kDdprunHelpFooter;
  EXPECT_NE(footer.find("DDP_STORE_TOKEN"), std::string::npos);
  std::istringstream lines(footer.substr(footer.find("Examples:")));
  int examples = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  ddprun ", 0) != 0) continue;
    std::istringstream words(line.substr(9));
    std::vector<std::string> args;
    for (std::string word; words >> word;)
      args.push_back(word);
    LaunchConfig config;
    EXPECT_NO_THROW(config = parse(args)) << line;
    EXPECT_FALSE(config.command.empty()) << line;
    ++examples;
  }
  EXPECT_EQ(examples, 4);
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

// torchrun 1.x's underscore spelling is rewritten in the option's name only, never in its
// value (given after '=' or as the next argument).
TEST(LaunchArgs, UnderscoresAreRewrittenInNamesNotValues) {
  const LaunchConfig a =
      parse({"--rdzv_id=my_job", "--log_dir=logs/run_a", "--nproc_per_node", "1", "--", "p"});
  EXPECT_EQ(a.run_id, "my_job");
  EXPECT_EQ(a.log_dir, "logs/run_a");
  EXPECT_EQ(a.nproc_per_node, "1");
  const LaunchConfig b = parse({"--rdzv_id", "my_job", "--log_dir", "logs/run_b", "p"});
  EXPECT_EQ(b.run_id, "my_job");
  EXPECT_EQ(b.log_dir, "logs/run_b");
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
  EXPECT_NE(message({"--bogus", "1", "--", "p"}).find("--bogus: not a ddprun flag"),
            std::string::npos);
  // A flag of the program before it: where it goes; a mistyped one of ddprun's: which.
  EXPECT_NE(message({"--nproc-per-node", "2", "--steps", "10", "ddptrain"})
                .find("--steps: not a ddprun flag; a flag of the program goes after it: ddprun "
                      "[options] PROGRAM --steps ..."),
            std::string::npos);
  EXPECT_NE(message({"--nproc_per_nod", "2", "--", "p"}).find("did you mean --nproc-per-node?"),
            std::string::npos);
}

// PyTorch's notes are for PyTorch's programs: a .py file, -m, a python interpreter; not
// ddptrain or a C++ program of one's own.
TEST(LaunchArgs, PythonProgramsAreToldApart) {
  EXPECT_TRUE(runs_python(parse({"train.py"})));
  EXPECT_TRUE(runs_python(parse({"-m", "pkg.train"})));
  EXPECT_TRUE(runs_python(parse({"--", "/usr/bin/python3", "train.py"})));
  EXPECT_TRUE(runs_python(parse({"--", "python", "-c", "pass"})));
  EXPECT_FALSE(runs_python(parse({"--", "build/bin/ddptrain", "--steps", "1"})));
  EXPECT_FALSE(runs_python(parse({"--no-python", "--", "./train.py"})));
  EXPECT_FALSE(runs_python(parse({"--", "./my_worker"})));
}

// The interpreter of a Python program: --python, else DDP_PYTHON, else python3 on PATH; a
// program that is not Python's runs as given.
TEST(LaunchArgs, PythonInterpreterFromTheFlagOrTheEnvironment) {
  ::unsetenv("DDP_PYTHON");
  EXPECT_EQ(program_argv(parse({"train.py", "--x"})),
            (std::vector<std::string>{"python3", "-u", "train.py", "--x"}));
  EXPECT_EQ(program_argv(parse({"--python", "/opt/py/bin/python3", "train.py"})).front(),
            "/opt/py/bin/python3");
  ::setenv("DDP_PYTHON", "/venv/bin/python", 1);
  EXPECT_EQ(program_argv(parse({"-m", "pkg"})).front(), "/venv/bin/python");
  EXPECT_EQ(program_argv(parse({"--python", "python3.11", "-m", "pkg"})).front(), "python3.11");
  EXPECT_EQ(program_argv(parse({"--", "./worker"})).front(), "./worker");
  ::unsetenv("DDP_PYTHON");
  EXPECT_EQ(find_on_path("/x/y"), "/x/y");
  EXPECT_EQ(find_on_path("sh").substr(find_on_path("sh").size() - 3), "/sh");
  EXPECT_EQ(find_on_path("no-such-program-here"), "not on PATH");
}

// The flag a user most likely meant: the same once case, dashes and underscores are set aside,
// else within a few edits (fewer for short names), else none.
TEST(FlagHint, TheClosestKnownFlagOrNone) {
  const std::vector<std::string> known = {"batch-size", "lr", "seed", "steps", "nproc-per-node"};
  EXPECT_EQ(closest_flag("batchsize", known), "batch-size");
  EXPECT_EQ(closest_flag("Batch_Size", known), "batch-size");
  EXPECT_EQ(closest_flag("sed", known), "seed");
  EXPECT_EQ(closest_flag("nproc-per-nodes", known), "nproc-per-node");
  EXPECT_EQ(closest_flag("step", known), "steps");
  EXPECT_EQ(closest_flag("xy", known), "");  // two edits from "lr": too far for a short name
  EXPECT_EQ(closest_flag("learning-rate", known), "");
  EXPECT_EQ(closest_flag("", known), "");
  EXPECT_EQ(did_you_mean("batchsize", known), " did you mean --batch-size?");
  EXPECT_EQ(did_you_mean("zzzzzz", known), "");
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
  config.nproc_given = true;  // asked for GPU workers: none is an error
  EXPECT_THROW(plan_workers(config, GpuList{"none", {}, ""}, 8), UsageError);
}

// --nproc-per-node left out, as torchrun's users do: one worker a GPU where there are GPUs,
// one CPU worker where there are none (torchrun's default), with a note saying so.
TEST(WorkerPlan, LeftOutItIsOneWorkerWithoutGpusAndOneAGpuWithThem) {
  const LaunchConfig config = parse({"--", "p"});
  EXPECT_FALSE(config.nproc_given);
  const WorkerPlan none = plan_workers(config, GpuList{"none", {}, "no driver"}, 8);
  EXPECT_EQ(none.nproc, 1);
  EXPECT_TRUE(none.gpu_ids.empty());
  EXPECT_NE(none.note.find("no GPU found (no driver): one CPU worker, torchrun's default"),
            std::string::npos)
      << none.note;
  const WorkerPlan gpus = plan_workers(config, GpuList{"NVML", {"0", "1"}, ""}, 8);
  EXPECT_EQ(gpus.nproc, 2);
  EXPECT_TRUE(gpus.note.empty());
  EXPECT_TRUE(parse({"--nproc-per-node", "gpu", "--", "p"}).nproc_given);
  EXPECT_TRUE(parse({"--nproc_per_node=gpu", "--", "p"}).nproc_given);
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

namespace ddp {
namespace {

std::string usage_error(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "accepted";
}

// torchrun's command lines: both spellings, its rendezvous flags mapped onto ddprun's store,
// the flags ddprun takes as given said once, the ones it cannot honour one line each.
TEST(TorchrunArgs, BothSpellingsAndTheRendezvousFlags) {
  const LaunchConfig a = parse({"--nproc_per_node=2", "--max_restarts", "1", "--rdzv_id", "job7",
                                "--role", "trainer", "train.py", "--lr_rate", "1"});
  EXPECT_EQ(a.nproc_per_node, "2");
  EXPECT_EQ(a.max_restarts, 1);
  EXPECT_EQ(a.run_id, "job7");
  EXPECT_EQ(a.role, "trainer");
  EXPECT_EQ(a.command, (std::vector<std::string>{"train.py", "--lr_rate", "1"}));  // untouched
  const LaunchConfig s = parse({"--standalone", "--nproc-per-node", "auto", "-m", "pkg.train"});
  EXPECT_EQ(s.master_addr, "127.0.0.1");
  EXPECT_EQ(s.master_port, 0);
  EXPECT_EQ(s.nproc_per_node, "auto");
  EXPECT_TRUE(s.module);
  EXPECT_EQ(s.command, (std::vector<std::string>{"pkg.train"}));
  const LaunchConfig c =
      parse({"--nnodes", "2:2", "--node_rank", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
             "10.0.0.5:29600", "--rdzv-conf", "join_timeout=20,read_timeout=60",
             "--monitor-interval", "0.1", "prog"});
  EXPECT_EQ(c.nnodes, 2);
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_EQ(c.master_addr, "10.0.0.5");
  EXPECT_EQ(c.master_port, 29600);
  EXPECT_DOUBLE_EQ(c.timeout, 20);
  ASSERT_EQ(c.notes.size(), 2u);
  EXPECT_NE(c.notes[0].find("read_timeout=60: taken as given"), std::string::npos);
  EXPECT_NE(c.notes[1].find("--monitor-interval 0.1: not needed"), std::string::npos);
  EXPECT_EQ(
      parse({"--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h1", "--", "p"}).master_port,
      29400);  // torchrun's default rendezvous port
  // Elastic: MIN:MAX, the endpoint, no --node-rank, the last call from --rdzv-conf.
  const LaunchConfig e = parse({"--nnodes", "1:4", "--rdzv-endpoint", "10.0.0.5:29600",
                                "--rdzv-conf", "last_call_timeout=3", "p"});
  EXPECT_TRUE(e.elastic());
  EXPECT_EQ(e.nnodes, 1);
  EXPECT_EQ(e.max_nodes, 4);
  EXPECT_DOUBLE_EQ(e.last_call_s, 3);
  EXPECT_FALSE(e.torch_store);
  EXPECT_FALSE(parse({"--nnodes", "2:2", "--node-rank", "0", "--master-port", "1", "p"}).elastic());
  EXPECT_NE(usage_error({"--nnodes", "1:4", "p"}).find("--nnodes 1:4: give --rdzv-endpoint"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "1:4", "--rdzv-endpoint", "h:1", "--node-rank", "0", "p"})
                .find("numbered in the order they join"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "3:2", "p"}).find("expected MIN:MAX with 1 <= MIN <= MAX"),
            std::string::npos);
  EXPECT_NE(usage_error({"--rdzv-backend", "etcd", "p"})
                .find("--rdzv-backend etcd: expected "
                      "static or c10d"),
            std::string::npos);
  // torchrun's c10d line and N:N without node ranks: the nodes numbered as they join.
  const LaunchConfig c10d = parse({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                   "127.0.0.1:29611", "--rdzv-id", "job1", "p"});
  EXPECT_TRUE(c10d.by_arrival);
  EXPECT_TRUE(c10d.elastic());
  EXPECT_EQ(c10d.nnodes, 2);
  EXPECT_EQ(c10d.max_nodes, 2);
  EXPECT_TRUE(c10d.run_id_given);
  EXPECT_EQ(c10d.run_id, "job1");
  const LaunchConfig same = parse({"--nnodes", "2:2", "--rdzv-endpoint", "h:1", "p"});
  EXPECT_TRUE(same.by_arrival);
  EXPECT_FALSE(same.run_id_given);
  EXPECT_FALSE(parse({"--nnodes", "2", "--rdzv-backend", "c10d", "--node-rank", "1",
                      "--master-port", "1", "p"})
                   .elastic());
  EXPECT_NE(usage_error({"--nnodes", "2", "--rdzv-backend", "c10d", "p"})
                .find("--nnodes 2:2: give --rdzv-endpoint"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "2", "--rdzv-backend", "static", "p"})
                .find("give each node its --node-rank (0 on the node of --master-addr), or use "
                      "--rdzv-backend c10d"),
            std::string::npos);
  EXPECT_NE(usage_error({"--local-addr", "10.0.0.1", "p"}).find("give --iface"), std::string::npos);
  EXPECT_NE(usage_error({"--redirects", "5", "p"}).find("--redirects 5: expected 0 (none)"),
            std::string::npos);
  EXPECT_NE(usage_error({"--standalone", "--nnodes", "2", "p"}).find("standalone is one node"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nproc-per-node", "many", "p"}).find("gpu, cpu or auto"),
            std::string::npos);
}

TEST(TorchrunArgs, StreamsAndProgramsAsTorchrunTakesThem) {
  EXPECT_EQ(stream_bits(parse_streams("--tee", "3"), 5), 3);
  const std::vector<int> map = parse_streams("--redirects", "0:1,2:3");
  EXPECT_EQ(stream_bits(map, 0), 1);
  EXPECT_EQ(stream_bits(map, 1), 0);
  EXPECT_EQ(stream_bits(map, 2), 3);
  EXPECT_EQ(stream_bits(map, 9), 0);
  EXPECT_EQ(stream_bits({}, 0), 0);
  LaunchConfig c;
  c.command = {"train.py", "--x"};
  EXPECT_EQ(program_argv(c), (std::vector<std::string>{"python3", "-u", "train.py", "--x"}));
  c.no_python = true;
  EXPECT_EQ(program_argv(c), c.command);
  c.no_python = false;
  c.command = {"ddptrain", "--x"};
  EXPECT_EQ(program_argv(c), c.command);
  c.run_path = true;
  EXPECT_EQ(program_argv(c), (std::vector<std::string>{"python3", "-u", "ddptrain", "--x"}));
  c.run_path = false;
  c.module = true;
  c.command = {"pkg.train"};
  EXPECT_EQ(program_argv(c), (std::vector<std::string>{"python3", "-u", "-m", "pkg.train"}));
  const WorkerPlan two{2, {}, false}, one{1, {}, false};
  LaunchConfig e;
  e.role = "trainer";
  e.run_id = "job7";
  e.nnodes = 3;
  const EnvMap env = child_environment({}, e, two, 0, {1, 2}, "t", 0);
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(env.at("GROUP_WORLD_SIZE"), "3");
  EXPECT_EQ(env.at("ROLE_NAME"), "trainer");
  EXPECT_EQ(env.at("TORCHELASTIC_RUN_ID"), "job7");
  EXPECT_EQ(child_environment({{"OMP_NUM_THREADS", "4"}}, e, two, 0, {1, 2}, "t", 0)
                .at("OMP_NUM_THREADS"),
            "4");
  EXPECT_EQ(child_environment({}, e, one, 0, {1, 2}, "t", 0).count("OMP_NUM_THREADS"), 0u);
}

// torchrun 2.x's flags that change nothing here are accepted (a torchrun command line runs
// unchanged), each named once in a note with why; the program's own arguments stay its own.
TEST(LaunchConfig, TorchrunFlagsThatChangeNothingAreAcceptedAndNamed) {
  const LaunchConfig c =
      parse({"--exit_barrier_timeout", "5", "--logs-specs", "x", "--virtual-local-rank",
             "--numa-binding=node", "prog", "--exit-barrier-timeout", "7"});
  ASSERT_EQ(c.command.size(), 3u);
  EXPECT_EQ(c.command[0], "prog");
  EXPECT_EQ(c.command[1], "--exit-barrier-timeout");
  ASSERT_EQ(c.notes.size(), 4u);
  EXPECT_NE(c.notes[0].find("--exit-barrier-timeout 5: accepted, changes nothing"),
            std::string::npos)
      << c.notes[0];
  EXPECT_NE(c.notes[3].find("--virtual-local-rank: accepted, changes nothing"), std::string::npos)
      << c.notes[3];
}

}  // namespace
}  // namespace ddp
