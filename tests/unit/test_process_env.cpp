// ProcessEnv::detect over fake environments: ddprun/torchrun, mpirun, srun and none.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "runtime/error.h"
#include "runtime/process_env.h"

namespace ddp {
namespace {

ProcessEnv detect_from(const std::map<std::string, std::string>& vars) {
  return ProcessEnv::detect([&](const char* name) -> std::optional<std::string> {
    const auto found = vars.find(name);
    if (found == vars.end()) return std::nullopt;
    return found->second;
  });
}

TEST(ProcessEnv, SingleProcessWithoutLauncher) {
  const ProcessEnv env = detect_from({});
  EXPECT_EQ(env.launcher, Launcher::kNone);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_FALSE(env.cuda_visible_devices_set);
}

TEST(ProcessEnv, CacheDirIsDdpCacheDirThenXdgThenHome) {
  EXPECT_EQ(detect_from({}).cache_dir, "");
  EXPECT_EQ(detect_from({{"HOME", "/h"}}).cache_dir, "/h/.cache/ddp");
  EXPECT_EQ(detect_from({{"HOME", "/h"}, {"XDG_CACHE_HOME", "/x"}}).cache_dir, "/x/ddp");
  EXPECT_EQ(
      detect_from({{"HOME", "/h"}, {"XDG_CACHE_HOME", "/x"}, {"DDP_CACHE_DIR", "/d"}}).cache_dir,
      "/d");
  EXPECT_EQ(detect_from({{"HOME", "/h"}, {"DDP_CACHE_DIR", ""}}).cache_dir, "/h/.cache/ddp");
}

TEST(ProcessEnv, DdprunVariables) {
  const ProcessEnv env = detect_from({{"RANK", "3"},
                                      {"WORLD_SIZE", "4"},
                                      {"LOCAL_RANK", "1"},
                                      {"LOCAL_WORLD_SIZE", "2"},
                                      {"GROUP_RANK", "1"},
                                      {"MASTER_ADDR", "10.0.0.1"},
                                      {"MASTER_PORT", "29500"},
                                      {"DDP_STORE_TOKEN", "abc"},
                                      {"DDP_RESTART_COUNT", "2"},
                                      {"CUDA_VISIBLE_DEVICES", "6"}});
  EXPECT_EQ(env.launcher, Launcher::kDdprun);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.group_rank, 1);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_EQ(env.store_token, "abc");
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_EQ(env.cuda_visible_devices, "6");
}

TEST(ProcessEnv, DdprunsStoreComesFromDdpStoreVariablesAndMasterIsLeftToThePrograms) {
  const ProcessEnv env = detect_from({{"RANK", "0"},
                                      {"WORLD_SIZE", "2"},
                                      {"MASTER_ADDR", "10.0.0.1"},
                                      {"MASTER_PORT", "29500"},
                                      {"DDP_STORE_ADDR", "10.0.0.2"},
                                      {"DDP_STORE_PORT", "41000"}});
  EXPECT_EQ(env.master_addr, "10.0.0.2");
  EXPECT_EQ(env.master_port, 41000);
}

// torchrun (TORCHELASTIC_RUN_ID, no DDP_STORE_PORT): its agent's store is PyTorch's, the
// version hinted by the variable 2.x's agents set, the attempt from its restart count; ddprun's
// own variables win where both are set.
TEST(ProcessEnv, TorchrunsAgentStoreIsPyTorchs) {
  std::map<std::string, std::string> vars = {{"RANK", "1"},
                                             {"WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "127.0.0.1"},
                                             {"MASTER_PORT", "29500"},
                                             {"TORCHELASTIC_RUN_ID", "none"},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                             {"TORCHELASTIC_RESTART_COUNT", "3"},
                                             {"NCCL_ASYNC_ERROR_HANDLING", "1"}};
  ProcessEnv env = detect_from(vars);
  EXPECT_TRUE(env.torch_store);
  EXPECT_FALSE(env.torch2_store);
  EXPECT_FALSE(env.torch_rank0_store);
  EXPECT_EQ(env.restart_count, 3);
  EXPECT_EQ(env.master_port, 29500);
  vars["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
  EXPECT_TRUE(detect_from(vars).torch2_store);
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_TRUE(detect_from(vars).torch_rank0_store);
  vars["DDP_STORE_PORT"] = "41000";
  EXPECT_FALSE(detect_from(vars).torch_store);
  vars.erase("DDP_STORE_PORT");
  vars.erase("TORCHELASTIC_RUN_ID");
  EXPECT_FALSE(detect_from(vars).torch_store);
}

TEST(ProcessEnv, OpenMpiVariables) {
  const ProcessEnv env = detect_from({{"OMPI_COMM_WORLD_RANK", "1"},
                                      {"OMPI_COMM_WORLD_SIZE", "2"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(env.launcher, Launcher::kMpirun);
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
}

// srun without MASTER_ADDR/MASTER_PORT: the store on the job's first node at a port of the
// job's own, the same on every task; the script's own values win.
TEST(ProcessEnv, SrunWithoutMasterVariablesUsesTheJobsFirstNode) {
  EXPECT_EQ(first_host("gpu[07-09,12],cpu3"), "gpu07");
  EXPECT_EQ(first_host("node3,node4"), "node3");
  EXPECT_EQ(first_host("solo"), "solo");
  EXPECT_EQ(first_host("n[5]"), "n5");
  EXPECT_EQ(first_host(""), "");
  std::map<std::string, std::string> vars = {
      {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"},      {"SLURM_NTASKS_PER_NODE", "1"},
      {"SLURM_NODEID", "1"}, {"SLURM_JOB_ID", "123456"}, {"SLURM_JOB_NODELIST", "gpu[07-08]"}};
  ProcessEnv env = detect_from(vars);
  EXPECT_EQ(env.master_addr, "gpu07");
  EXPECT_EQ(env.master_port, 23456);
  EXPECT_TRUE(env.store_from_slurm);
  EXPECT_EQ(env.store_token, "slurm-123456");
  EXPECT_FALSE(env.serves_store);  // rank 1
  vars["SLURM_PROCID"] = "0";
  EXPECT_TRUE(detect_from(vars).serves_store);
  // Two steps of one job side by side: another port and another token each.
  vars["SLURM_STEP_ID"] = "0";
  EXPECT_EQ(detect_from(vars).master_port, 23456);
  EXPECT_EQ(detect_from(vars).store_token, "slurm-123456.0");
  vars["SLURM_STEP_ID"] = "1";
  EXPECT_EQ(detect_from(vars).master_port, 24465);
  EXPECT_EQ(detect_from(vars).store_token, "slurm-123456.1");
  // With one secret for both steps, the run's id in the hello still keeps them apart.
  vars["DDP_STORE_TOKEN"] = "s3cret";
  EXPECT_EQ(detect_from(vars).store_token, "s3cret");
  EXPECT_EQ(detect_from(vars).run_id, "slurm-123456.1");
  vars.erase("DDP_STORE_TOKEN");
  vars["MASTER_ADDR"] = "10.0.0.9";
  vars["MASTER_PORT"] = "29400";
  env = detect_from(vars);
  EXPECT_EQ(env.master_addr, "10.0.0.9");
  EXPECT_EQ(env.master_port, 29400);
  EXPECT_FALSE(env.store_from_slurm);
}

TEST(ProcessEnv, SlurmTasksPerNodeGivesTheLocalWorld) {
  EXPECT_EQ(tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(tasks_on_node("2(x3),1", 4), 0);
  EXPECT_EQ(tasks_on_node("4", 0), 4);
  EXPECT_EQ(tasks_on_node("4,2", 1), 2);
  EXPECT_EQ(tasks_on_node("x", 0), 0);
  EXPECT_EQ(tasks_on_node("", 0), 0);
  const ProcessEnv env = detect_from({{"SLURM_PROCID", "3"},
                                      {"SLURM_NTASKS", "4"},
                                      {"SLURM_LOCALID", "1"},
                                      {"SLURM_TASKS_PER_NODE", "2(x2)"},
                                      {"SLURM_NODEID", "1"},
                                      {"SLURM_JOB_ID", "77"},
                                      {"MASTER_ADDR", "10.0.0.1"},
                                      {"MASTER_PORT", "29400"}});
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.store_token, "slurm-77");
  EXPECT_FALSE(env.serves_store);  // rank 3 connects; rank 0 serves
  try {
    detect_from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}});
    ADD_FAILURE() << "an unknown local world was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("the local world size is unknown"), std::string::npos)
        << e.what();
  }
}

TEST(ProcessEnv, SlurmVariables) {
  const ProcessEnv env = detect_from({{"SLURM_PROCID", "5"},
                                      {"SLURM_NTASKS", "8"},
                                      {"SLURM_LOCALID", "1"},
                                      {"SLURM_NTASKS_PER_NODE", "4"},
                                      {"SLURM_NODEID", "1"}});
  EXPECT_EQ(env.launcher, Launcher::kSrun);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.group_rank, 1);
}

TEST(ProcessEnv, ShareGpuUnderMpirunTakesTheFirstGpuAndItsOwnNcclHost) {
  ProcessEnv env = detect_from({{"OMPI_COMM_WORLD_RANK", "1"},
                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                {"CUDA_VISIBLE_DEVICES", "3,5"},
                                {"DDP_SHARE_GPU", "1"}});
  EXPECT_TRUE(env.share_gpu);
  ::unsetenv("NCCL_HOSTID");
  narrow_visible_devices(&env);
  EXPECT_EQ(env.cuda_visible_devices, "3");  // not entry 1: every rank shares the first
  EXPECT_EQ(env.nccl_host_id, "ddp-share-gpu-rank-1");
  EXPECT_STREQ(std::getenv("NCCL_HOSTID"), "ddp-share-gpu-rank-1");
  ::unsetenv("NCCL_HOSTID");
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_FALSE(detect_from({{"DDP_SHARE_GPU", "0"}}).share_gpu);
  EXPECT_THROW(detect_from({{"DDP_SHARE_GPU", "yes"}}), UsageError);
}

TEST(ProcessEnv, BadValuesNameTheVariable) {
  try {
    detect_from({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=x"), std::string::npos) << e.what();
  }
  EXPECT_THROW(detect_from({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), UsageError);
}

}  // namespace
}  // namespace ddp
