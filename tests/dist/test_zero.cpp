// ZeRO on the CPU: --zero 1, 2 and 3 with dp 2 and 3, SGD and AdamW, equal plain data
// parallelism under ddprun (Gloo) and mpirun (MPI), also with --accumulate 2 and dp 2 x pp 2
// (and with zb-h1, interleaved stages and --recompute for --zero 3); a rank holds 1/D of the
// optimizer state, and with --zero 3 1/D of the parameters plus the layer in use (its memory
// record); the gathered checkpoint is the plain run's file byte for byte; a --zero 2 or 3
// checkpoint resumes into --zero 0 with another world size and goes on equal to a run that
// never stopped.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/metrics_support.h"
#include "tests/support/test_support.h"
#include "tests/support/weights_support.h"
#include "tests/support/zero_support.h"

namespace ddp {
namespace {

const std::string kLayers = "12,32,16,4";
const std::string kArgs =
    " --data synthetic --layers " + kLayers +
    " --synthetic-samples 240 --batch-size 24 --steps 12 --log-every 4 --quiet --seed 3 "
    "--threads 1 --bucket-mb 0.0005 --first-bucket-mb 0.0002";
const std::string kDdprun = std::string("CUDA_VISIBLE_DEVICES= ") + DDPRUN_PATH;
const std::string kTrain = DDPTRAIN_PATH;
const std::string kMpirun =
    std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + MPIRUN_PATH +
    " --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none ";

// Many equal layers (as `large`), so that --zero 2 and 3 keep the gradients in bucket slots.
const std::string kDeepLayers = [] {
  std::string layers = "12";
  for (int i = 0; i < 12; ++i)
    layers += ",24";
  return layers + ",4";
}();

std::string ddprun(int ranks, const std::string& flags) {
  return kDdprun + " --nproc-per-node " + std::to_string(ranks) + " -- " + kTrain + kArgs + " " +
         flags;
}

struct ZeroCase {
  int zero;
  int dp;
  const char* optimizer;
  const char* extra;  // more flags for both runs
};

void PrintTo(const ZeroCase& c, std::ostream* os) {
  *os << "zero" << c.zero << " dp" << c.dp << " " << c.optimizer << " " << c.extra;
}

class ZeroStages : public ::testing::TestWithParam<ZeroCase> {};

TEST_P(ZeroStages, EqualPlainDataParallelismWithAShareOfTheOptimizerState) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const ZeroCase& c = GetParam();
  TempDir dir;
  const std::string flags = std::string("--optimizer ") + c.optimizer + " " + c.extra;
  const std::string world = std::to_string(c.dp);
  const int ranks = std::string(c.extra).find("--pp 2") != std::string::npos ? 2 * c.dp : c.dp;
  const RunResult plain =
      run_command(ddprun(ranks, flags + " --metrics " + dir.file("plain.jsonl") +
                                    " --save-weights " + dir.file("plain.st")));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  // --check-replicas compares the replicas' weights, which --zero 3 does not keep whole.
  const RunResult r = run_command(ddprun(ranks, flags + " --zero " + std::to_string(c.zero) +
                                                    (c.zero < 3 ? " --check-replicas" : "") +
                                                    " --metrics " + dir.file("zero.jsonl") +
                                                    " --save-weights " + dir.file("zero.st")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Bitwise: the host backends sum every element in rank order, whatever bucket it is in.
  EXPECT_EQ(max_relative_error(load_weights(dir.file("zero.st"), kLayers),
                               load_weights(dir.file("plain.st"), kLayers)),
            0.0);
  // The memory record: this rank's share of the optimizer state, against the plain run's.
  const auto memory = events_of(dir.file("zero.jsonl"), "memory");
  const auto plain_memory = events_of(dir.file("plain.jsonl"), "memory");
  ASSERT_EQ(memory.size(), 1u);
  ASSERT_EQ(plain_memory.size(), 1u);
  // By kind (the record's `held`): 1/D of the plain run's optimizer state, within a padding
  // element per bucket and state buffer.
  const int64_t mine = memory[0]["held"]["optimizer state"];
  const int64_t whole = plain_memory[0]["held"]["optimizer state"];
  EXPECT_GE(mine * c.dp, whole);
  EXPECT_LE(mine, whole / c.dp + 2 * 8 * 4) << mine << " of " << whole;
  // --zero 3: 1/D of the parameters, and one layer gathered at a time (the largest: 32 x 16
  // weights and 16 biases, padded to D pieces); the others keep them whole.
  const int64_t params = memory[0]["held"]["parameters"];
  const int64_t plain_params = plain_memory[0]["held"]["parameters"];
  if (c.zero == 3) {
    EXPECT_GE(params * c.dp, plain_params);
    EXPECT_LE(params, plain_params / c.dp + (32 * 16 + 16 + 8) * 4 + 8 * 4)
        << params << " of " << plain_params;
  } else {
    EXPECT_GE(params, plain_params) << "the whole parameters stay";
  }
  const std::string report = memory[0]["report"];
  EXPECT_NE(report.find("--zero " + std::to_string(c.zero) + ": this rank's 1/" + world),
            std::string::npos)
      << report;
}

INSTANTIATE_TEST_SUITE_P(
    Stages, ZeroStages,
    ::testing::Values(ZeroCase{1, 2, "sgd", ""}, ZeroCase{1, 3, "adamw", ""},
                      ZeroCase{2, 2, "adamw", ""}, ZeroCase{2, 3, "sgd", ""},
                      ZeroCase{2, 2, "adamw", "--accumulate 2"},
                      ZeroCase{2, 2, "adamw", "--pp 2 --micro-batches 4"},
                      ZeroCase{1, 2, "sgd", "--pp 2 --micro-batches 4 --schedule zb-h1"},
                      ZeroCase{3, 2, "adamw", ""}, ZeroCase{3, 3, "sgd", ""},
                      ZeroCase{3, 2, "adamw", "--accumulate 2"},
                      ZeroCase{3, 2, "adamw", "--pp 2 --micro-batches 4"},
                      ZeroCase{3, 2, "sgd", "--pp 2 --micro-batches 4 --schedule zb-h1"},
                      ZeroCase{3, 3, "adamw", "--recompute --accumulate 2"}));

// --zero 3 reduces one bucket a layer whatever --bucket-mb says: said once, not silently.
TEST(Zero, ThreeSaysOnceThatItCutsABucketALayer) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const std::string said =
      "--zero 3 cuts one bucket a layer (a layer's parameters are gathered "
      "and freed together): --bucket-mb 0.0005 and --first-bucket-mb 0.0002 "
      "are not used";
  const RunResult three = run_command(ddprun(2, "--zero 3"));
  ASSERT_EQ(three.exit_code, 0) << three.output;
  EXPECT_EQ(count_of(three.output, said), 1) << three.output;
  const RunResult two = run_command(ddprun(2, "--zero 2"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(count_of(two.output, "cuts one bucket a layer"), 0) << two.output;
}

// --zero 3 with two chunks of layers a rank (interleaved 1F1B): each chunk's layers are
// gathered from the rank's pieces of its own layers.
TEST(Zero, ThreeWithInterleavedStagesEqualsPlainDataParallelism) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const std::string layers = "12,32,16,16,4";
  const std::string job =
      kDdprun + " --nproc-per-node 4 -- " + kTrain + " --data synthetic --layers " + layers +
      " --synthetic-samples 240 --batch-size 24 --steps 12 --log-every 4 --quiet --seed 3 "
      "--threads 1 --optimizer adamw --pp 2 --micro-batches 4 --schedule interleaved-1f1b "
      "--virtual-stages 2 --save-weights ";
  const RunResult plain = run_command(job + dir.file("plain.st"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const RunResult r = run_command(job + dir.file("zero.st") + " --zero 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(max_relative_error(load_weights(dir.file("zero.st"), layers),
                               load_weights(dir.file("plain.st"), layers)),
            0.0);
}

// --zero 2 and 3 where backward runs once a step, on a model of many equal layers (as
// `large`): the gradients live in three bucket slots and the averaged pieces, not one buffer
// (the memory record's gradients below the plain run's), and the weights stay plain data
// parallelism's, over Gloo with 2 and 3 ranks.
TEST(Zero, TwoAndThreeKeepTheGradientsInBucketSlots) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const std::string layers = kDeepLayers;
  for (const int ranks : {2, 3}) {
    TempDir dir;
    const std::string job = kDdprun + " --nproc-per-node " + std::to_string(ranks) + " -- " +
                            kTrain + " --data synthetic --layers " + layers +
                            " --synthetic-samples 240 --batch-size 24 --steps 12 --log-every 4 "
                            "--quiet --seed 3 --threads 1 --optimizer adamw --bucket-mb 0.002 "
                            "--first-bucket-mb 0.001 --metrics ";
    const RunResult plain =
        run_command(job + dir.file("plain.jsonl") + " --save-weights " + dir.file("plain.st"));
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    const int64_t whole = events_of(dir.file("plain.jsonl"), "memory")[0]["held"]["gradients"];
    for (const char* zero : {"2", "3"}) {
      const RunResult r = run_command(job + dir.file("zero.jsonl") + " --zero " + zero +
                                      " --save-weights " + dir.file("zero.st"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      // Bitwise at 3 ranks too: ZeRO 3's one bucket a layer sums each element in the same
      // (rank) order as plain data parallelism's larger buckets.
      EXPECT_EQ(max_relative_error(load_weights(dir.file("zero.st"), layers),
                                   load_weights(dir.file("plain.st"), layers)),
                0.0)
          << "--zero " << zero << " on " << ranks << " ranks";
      const auto memory = events_of(dir.file("zero.jsonl"), "memory");
      ASSERT_EQ(memory.size(), 1u);
      const std::string report = memory[0]["report"];
      EXPECT_NE(report.find("bucket slots"), std::string::npos) << report;
      const int64_t mine = memory[0]["held"]["gradients"];
      EXPECT_LT(mine, whole) << "--zero " << zero << " on " << ranks << " ranks";
    }
  }
}

// The same model with --accumulate 3: backward adds into the whole gradient buffer over the
// micro-batches, so the slots (which later buckets reuse) must not be chosen; the weights are
// one process's.
TEST(Zero, TwoAndThreeWithAccumulationEqualOneProcess) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const std::string layers = kDeepLayers;
  TempDir dir;
  const std::string args = " --data synthetic --layers " + layers +
                           " --synthetic-samples 240 --batch-size 24 --steps 12 --quiet --seed 3 "
                           "--threads 1 --optimizer adamw --bucket-mb 0.002 "
                           "--first-bucket-mb 0.001";
  const RunResult one = run_command(kTrain + args + " --save-weights " + dir.file("one.st"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::string two = kDdprun + " --nproc-per-node 2 -- " + kTrain + args + " --accumulate 3";
  const RunResult plain = run_command(two + " --save-weights " + dir.file("plain.st"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  for (const char* zero : {"2", "3"}) {
    const RunResult r =
        run_command(two + " --zero " + zero + " --save-weights " + dir.file("zero.st"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // Against plain data parallelism with the same micro-batches (bitwise), and against one
    // process (the whole batch at once: kDeepAdamwAcrossRanksMargin, margins.h says why).
    EXPECT_EQ(max_relative_error(load_weights(dir.file("zero.st"), layers),
                                 load_weights(dir.file("plain.st"), layers)),
              0.0)
        << "--zero " << zero << " --accumulate 3";
    EXPECT_LE(max_relative_error(load_weights(dir.file("zero.st"), layers),
                                 load_weights(dir.file("one.st"), layers)),
              kDeepAdamwAcrossRanksMargin)
        << "--zero " << zero << " --accumulate 3";
  }
}

TEST(Zero, MpiEqualsPlainDataParallelism) {
  if (!HAVE_MPI) GTEST_SKIP() << "built without MPI";
  TempDir dir;
  const std::string job = kMpirun + "-np 2 " + kTrain + kArgs + " --backend mpi --optimizer adamw ";
  ASSERT_EQ(run_command(job + "--save-weights " + dir.file("plain.st")).exit_code, 0);
  for (const char* zero : {"1", "2", "3"}) {
    const RunResult r =
        run_command(job + "--zero " + zero + " --save-weights " + dir.file("zero.st"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // Bitwise with 2 ranks: each element is one addition of two values, and a + b == b + a in
    // IEEE arithmetic whatever algorithm MPI picks for the size (3 or more ranks would not be:
    // MPI's own reductions add in an order of its choosing).
    EXPECT_EQ(max_relative_error(load_weights(dir.file("zero.st"), kLayers),
                                 load_weights(dir.file("plain.st"), kLayers)),
              0.0)
        << "--zero " << zero;
  }
}

// tests/support/zero_support.h's scenario, for --zero 2 and 3.
class ZeroCheckpoints : public ::testing::TestWithParam<int> {};

TEST_P(ZeroCheckpoints, AreThePlainFilesAndResumeIntoAnotherLayout) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  expect_zero_checkpoints_are_plain_and_resume(ddprun, kLayers,
                                               "--zero " + std::to_string(GetParam()) + " ", dir);
}

INSTANTIATE_TEST_SUITE_P(Levels, ZeroCheckpoints, ::testing::Values(1, 2, 3));

TEST(Zero, BadLevelsAndTheGpuAreOneLine) {
  const RunResult r = run_command(kTrain + kArgs + " --zero 4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--zero 4: expected 0 (off), 1 (optimizer state sharded), 2 "
                          "(gradients too) or 3 (parameters too)"),
            std::string::npos)
      << r.output;
  const RunResult check = run_command(kTrain + kArgs + " --zero 3 --check-replicas");
  EXPECT_EQ(check.exit_code, 2) << check.output;
  EXPECT_NE(check.output.find("--check-replicas with --zero 3: each replica holds its own piece"),
            std::string::npos)
      << check.output;
  // --zero-prefetch gathers ahead on the GPU with --zero 3 only, 1 to 8 layers.
  for (const std::string& flags : {" --zero 3 --zero-prefetch 2", " --zero 2 --zero-prefetch 2"}) {
    const RunResult ahead = run_command(kTrain + kArgs + flags);
    EXPECT_EQ(ahead.exit_code, 2) << ahead.output;
    EXPECT_NE(ahead.output.find("--zero-prefetch 2: gathers ahead with --zero 3 on the GPU only"),
              std::string::npos)
        << ahead.output;
  }
  const RunResult far = run_command(kTrain + kArgs + " --zero 3 --zero-prefetch 9");
  EXPECT_EQ(far.exit_code, 2) << far.output;
  EXPECT_NE(far.output.find("--zero-prefetch 9: expected 1 to 8 layers ahead"), std::string::npos)
      << far.output;
  const RunResult one = run_command(kTrain + kArgs + " --zero 1");
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("--zero 1: one replica holds everything; nothing to shard"),
            std::string::npos)
      << one.output;
}

}  // namespace
}  // namespace ddp
