// Collectives across real processes: Gloo under ddprun (2, 3, 4 ranks), MPI under mpirun
// (2 ranks), each checking every element against closed-form values; and a rank that never
// calls makes the others fail with the timeout message instead of hanging.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/support/test_support.h"

namespace ddp {
namespace {

// CPU workers: hide any GPU from ddprun.
const std::string kDdprun = std::string("CUDA_VISIBLE_DEVICES= ") + DDPRUN_PATH;
// Open MPI as root in containers: allow root, shared-memory transport without CMA.
const std::string kMpirun =
    std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + MPIRUN_PATH +
    " --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none";

class GlooRanks : public ::testing::TestWithParam<int> {};

TEST_P(GlooRanks, EveryOperationMatchesClosedForm) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const int ranks = GetParam();
  const RunResult r = run_command(kDdprun + " --nproc-per-node " + std::to_string(ranks) + " -- " +
                                  CHECK_PATH + " gloo all");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "collectives ok: gloo"), ranks) << r.output;
  EXPECT_EQ(r.output.find("MISMATCH"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooRanks, ::testing::Values(2, 3, 4));

TEST(Gloo, IfaceChoosesTheInterface) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const RunResult r = run_command(kDdprun +
                                  " --iface lo --nproc-per-node 2 -- sh -c 'echo "
                                  "G=$GLOO_SOCKET_IFNAME; exec " +
                                  CHECK_PATH + " gloo all'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "G=lo"), 2) << r.output;
  EXPECT_EQ(count_of(r.output, "collectives ok: gloo"), 2) << r.output;
}

TEST(Gloo, RankThatNeverCallsMakesTheOthersFailWithTheTimeoutMessage) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const RunResult r = run_command(kDdprun + " --nproc-per-node 3 --grace-period 1 -- " +
                                  CHECK_PATH + " gloo straggler");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 25.0) << "the job hung";
  EXPECT_NE(r.output.find("all_reduce #1 (10 x float32, 40 bytes)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank(s) 1 never reached it"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("returned without rank 1"), std::string::npos) << r.output;
}

// Ranks whose calls at one sequence number differ (another count: Gloo's transport ended the
// process from its own thread, "op.preamble.length <= op.nbytes. 40 vs 20") wait to the
// deadline, since a call's tag carries what it is, and are named with both calls, from what
// every stuck rank records in the store; the calls before it on that rank (the flight recorder)
// are named too.
TEST(Gloo, RanksWhoseCallsDifferAreNamedWithBothCalls) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const RunResult r = run_command(kDdprun + " --nproc-per-node 2 --grace-period 5 -- " +
                                  CHECK_PATH + " gloo mismatch");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 25.0) << "the job hung";
  // Whichever rank fails first names both calls (ddprun stops the other before it may speak).
  const bool zero_first =
      r.output.find(
          "the ranks' calls #2 differ: this rank (0) called all_reduce of 10 x float32 "
          "(40 bytes) where rank 1 called all_reduce of 20 x float32 (80 bytes)") !=
      std::string::npos;
  const bool one_first =
      r.output.find(
          "the ranks' calls #2 differ: this rank (1) called all_reduce of 20 x float32 "
          "(80 bytes) where rank 0 called all_reduce of 10 x float32 (40 bytes)") !=
      std::string::npos;
  EXPECT_TRUE(zero_first || one_first) << r.output;
  EXPECT_NE(r.output.find("this rank's calls before it: all_reduce #1 (4 x float32) done "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("mismatch: all_reduce returned"), std::string::npos) << r.output;
}

TEST(Ddpbench, EveryOperationReportsNoWrongElements) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv"}) {
    const RunResult r = run_command(
        kDdprun + " --nproc-per-node 3 --quiet -- " + BENCH_PATH + " collectives --op " + op +
        " --min-bytes 12 --max-bytes 3000000 --factor 10 --iters 2 --warmup 1 --json");
    EXPECT_EQ(r.exit_code, 0) << op << "\n" << r.output;
    EXPECT_EQ(count_of(r.output, "\"busbw_gbs\""), 6) << op << "\n" << r.output;  // 12 B .. 1.2 MB
    EXPECT_EQ(count_of(r.output, "\"wrong\":0"), 6) << op << "\n" << r.output;
    EXPECT_EQ(count_of(r.output, "\"call_us\""), 6) << op << "\n" << r.output;
    EXPECT_EQ(count_of(r.output, "\"device_us\":null"), 6) << op << "\n" << r.output;  // CPU
  }
}

TEST(Ddpbench, HelpExitsZeroAndOneRankReportsNoBandwidth) {
  EXPECT_EQ(run_command(std::string(BENCH_PATH) + " --help").exit_code, 0);
  EXPECT_EQ(run_command(std::string(BENCH_PATH) + " collectives --help").exit_code, 0);
  EXPECT_EQ(run_command(std::string(BENCH_PATH) + " bogus").exit_code, 2);
  const RunResult table = run_command(std::string(BENCH_PATH) +
                                      " collectives --min-bytes 64 --max-bytes 256 --iters 2 "
                                      "--warmup 1");
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_EQ(count_of(table.output, "n/a"), 6) << table.output;  // algbw and busbw, 3 sizes
  const RunResult json = run_command(std::string(BENCH_PATH) +
                                     " collectives --min-bytes 64 --max-bytes 64 --iters 2 "
                                     "--warmup 1 --json");
  EXPECT_NE(json.output.find("\"busbw_gbs\":null"), std::string::npos) << json.output;
}

TEST(Mpi, EveryOperationMatchesClosedForm) {
  if (!HAVE_MPI) GTEST_SKIP() << "built without MPI";
  const RunResult r = run_command(kMpirun + " -np 2 " + CHECK_PATH + " mpi all");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "collectives ok: mpi"), 2) << r.output;
}

TEST(Mpi, RankThatNeverCallsMakesTheOthersFailWithTheTimeoutMessage) {
  if (!HAVE_MPI) GTEST_SKIP() << "built without MPI";
  const RunResult r = run_command(kMpirun + " -np 3 " + CHECK_PATH + " mpi straggler");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 40.0) << "the job hung";
  EXPECT_NE(r.output.find("all_reduce #1 (10 x float32, 40 bytes)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did not complete: no completion within the 3.0s deadline"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank(s) 1 never reached it"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ddp
