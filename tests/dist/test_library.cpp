// ddp as a library: the README's short example (ddp::init, Reducer) equals one process with 2
// and 3 ranks, under ddprun, under srun without it and under torchrun; a layout check of one's own
// model names the first difference on every rank. Ranks against one process: within
// kAcrossRanksMargin, relative to 1 + |w| (why not bitwise: tests/support/margins.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/support/margins.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

const std::string kDdprun = std::string("CUDA_VISIBLE_DEVICES= ") + DDPRUN_PATH;

// The three weights rank 0 prints.
std::vector<double> weights(const std::string& output) {
  const size_t at = output.find("rank 0 of ");
  EXPECT_NE(at, std::string::npos) << output;
  std::vector<double> w(3, NAN);
  if (at != std::string::npos)
    std::sscanf(output.c_str() + output.find("weights", at), "weights %lf %lf %lf", &w[0], &w[1],
                &w[2]);
  return w;
}

TEST(Library, TheShortExampleEqualsOneProcess) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const RunResult one = run_command(CLASSIFIER_PATH);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> reference = weights(one.output);
  for (const int ranks : {2, 3}) {
    const RunResult r = run_command(kDdprun + " --nproc-per-node " + std::to_string(ranks) +
                                    " -- " + CLASSIFIER_PATH);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> w = weights(r.output);
    for (int i = 0; i < 3; ++i)
      EXPECT_NEAR(w[i], reference[i], kAcrossRanksMargin * (1 + std::abs(reference[i])))
          << ranks << " ranks, weight " << i << "\n"
          << r.output;
  }
}

// A launcher environment that cannot be (rank 3 of 2) ends a program that calls ddp::init() with
// an `error:` line and exit status 2, as the README promises, not std::terminate's abort (134).
TEST(Library, AnInitEnvironmentErrorIsAnErrorLineAndExitTwo) {
  const RunResult r = run_command("RANK=3 WORLD_SIZE=2 " + std::string(CLASSIFIER_PATH));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("error: ddprun environment: rank 3 is not below world size 2"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
}

// srun without ddprun, faked on loopback: ddp::init serves the rendezvous store from rank 0
// (as ddptrain does, the one start-up path), and the example trains as one process does.
TEST(Library, UnderSrunWithoutDdprunRankZeroServesTheStore) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const RunResult one = run_command(CLASSIFIER_PATH);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::string common =
      "CUDA_VISIBLE_DEVICES= SLURM_NTASKS=2 SLURM_TASKS_PER_NODE=2 SLURM_NODEID=0 "
      "SLURM_JOB_ID=4343 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
      std::to_string(free_port()) + " ";
  TempDir dir;
  const RunResult r =
      run_command("{ " + common + "SLURM_PROCID=1 SLURM_LOCALID=1 " + CLASSIFIER_PATH + " > " +
                  dir.file("rank1.log") + " 2>&1 & " + common + "SLURM_PROCID=0 SLURM_LOCALID=0 " +
                  CLASSIFIER_PATH + "; echo rank0 exit $?; wait $!; echo rank1 exit $?; cat " +
                  dir.file("rank1.log") + "; }");
  EXPECT_NE(r.output.find("rank0 exit 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank1 exit 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("srun: rank 0 serves the rendezvous store"), std::string::npos)
      << r.output;
  const std::vector<double> reference = weights(one.output), w = weights(r.output);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(w[i], reference[i], kAcrossRanksMargin * (1 + std::abs(reference[i]))) << r.output;
}

// Under torchrun (Debian's PyTorch, --no_python): ddp::init joins through its agent's store,
// PyTorch's TCPStore, and the example's weights are ddprun's to the digit; also when the first
// guess of the store's PyTorch version is the wrong one (TORCH_NCCL_ASYNC_ERROR_HANDLING set,
// which 2.x's agents set: 1.13's store is then found by the second guess).
TEST(Library, UnderTorchrunJoinsThroughItsAgentStore) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  if (run_command("/usr/bin/python3 -c 'import torch.distributed.run'").exit_code != 0)
    GTEST_SKIP() << "no torch for /usr/bin/python3";
  const RunResult ddprun = run_command(kDdprun + " --nproc-per-node 2 -- " + CLASSIFIER_PATH);
  ASSERT_EQ(ddprun.exit_code, 0) << ddprun.output;
  const std::vector<double> reference = weights(ddprun.output);
  for (const std::string hint : {"", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 "}) {
    const RunResult r = run_command(
        "CUDA_VISIBLE_DEVICES= " + hint +
        "/usr/bin/python3 -m torch.distributed.run --no_python -r 1 -t 1 --nproc_per_node 2 "
        "--master_port " +
        std::to_string(free_port()) + " " + CLASSIFIER_PATH);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(weights(r.output), reference) << hint << "\n" << r.output;
  }
}

// torchrun's usual multi-node line, on each "node" alike (two ddprun processes on loopback): no
// --node-rank, no DDP_STORE_TOKEN. The nodes are numbered as they join, the store's token comes
// from --rdzv-id (said once), and the example's weights are one process's; `--nnodes 2:2`
// likewise. Without --rdzv-id and a token it is refused, naming both ways.
TEST(Library, TorchrunsMultiNodeLineNumbersTheNodesAsTheyJoin) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const RunResult one = run_command(CLASSIFIER_PATH);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> reference = weights(one.output);
  for (const std::string nnodes : {"2 --rdzv-backend c10d", "2:2"}) {
    const std::string node = "env -u DDP_STORE_TOKEN " + kDdprun + " --nnodes " + nnodes +
                             " --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) +
                             " --rdzv-id job1 --nproc-per-node 1 -- " + CLASSIFIER_PATH;
    const RunResult r = run_command("{ (" + node + " 2>&1 | sed 's/^/A /') & (" + node +
                                    " 2>&1 | sed 's/^/B /'); wait; }");
    EXPECT_NE(r.output.find("ddprun: the store's token is derived from --rdzv-id job1"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("generation 0: node 0 of 2"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("generation 0: node 1 of 2"), std::string::npos) << r.output;
    const std::vector<double> w = weights(r.output);
    for (int i = 0; i < 3; ++i)
      EXPECT_NEAR(w[i], reference[i], kAcrossRanksMargin * (1 + std::abs(reference[i])))
          << nnodes << "\n"
          << r.output;
  }
  const RunResult refused =
      run_command("env -u DDP_STORE_TOKEN " + kDdprun +
                  " --nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:1 -- true");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("set the same DDP_STORE_TOKEN on every node (or give every node "
                                "the same --rdzv-id)"),
            std::string::npos)
      << refused.output;
}

TEST(Library, ALayoutCheckNamesTheFirstDifferenceOnEveryRank) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const RunResult same = run_command(kDdprun + " --nproc-per-node 2 -- " + LAYOUT_PATH);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  const RunResult r = run_command(kDdprun + " --nproc-per-node 2 -- " + LAYOUT_PATH + " differ");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the model differs between ranks: rank 1 has parameter 1 'fc2.bias' "
                          "of 4 elements where rank 0 has 'fc2.weight' of 4 elements"),
            std::string::npos)
      << r.output;
}

// A program of one's own that leaves ddp's UsageError uncaught ends with its message and exit
// status 2 (ddp::init's terminate handler), not std::terminate's abort (134).
TEST(Library, AnUncaughtUsageErrorExitsTwoWithItsMessage) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const RunResult r = run_command(kDdprun + " --nproc-per-node 2 -- " + LAYOUT_PATH + " uncaught");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("error: the model differs between ranks"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("SIGABRT"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ddp
