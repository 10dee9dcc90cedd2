// ZeRO for LibTorch modules (DistributedDataParallelOptions().zero(1|2|3)), on the CPU (Gloo
// under ddprun): a model of several kinds of layer with SGD momentum and with AdamW, on 2 and 3
// ranks, trains bitwise as plain DistributedDataParallel on as many ranks (the gradients cross
// the same all-reduce; only who steps which parameter changes) and, with SGD, as one process with
// the same global batch within kAcrossRanksMargin; each rank's optimizer state (and with ZeRO 2
// its gradients, with ZeRO 3 its parameters) is its own share; a checkpoint of rank 0 loads into
// a plain module; no_sync, find_unused_parameters and torch::load work under it; a forward that
// skipped the gather is named.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <string>

#include "tests/libtorch/torch_compare.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

const std::string kDdprun = std::string("CUDA_VISIBLE_DEVICES= ") + DDPRUN_PATH;
const std::string kWorker = WORKER_PATH;
// Four residual blocks more than TorchDdp's model: no one tensor is most of it, so that the
// shares of 2 and 3 ranks can be even.
const std::string kModel = " --deep 4";

RunResult train(int ranks, const std::string& out, const std::string& flags) {
  return run_command(kDdprun + " --nproc-per-node " + std::to_string(ranks) + " -- " + kWorker +
                     kModel + " --out " + out + " " + flags);
}

// Every rank's "rank R memory optimizer A parameters B gradients C owned D" (--memory).
struct Held {
  size_t optimizer = 0, parameters = 0, gradients = 0, owned = 0;
};
std::map<int, Held> memory_lines(const std::string& output) {
  std::map<int, Held> held;
  const std::regex line(
      R"(rank (\d+) memory optimizer (\d+) parameters (\d+) gradients (\d+) owned (\d+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it)
    held[std::stoi((*it)[1])] = {std::stoul((*it)[2]), std::stoul((*it)[3]), std::stoul((*it)[4]),
                                 std::stoul((*it)[5])};
  return held;
}

// Every rank's "rank R traffic B" (--memory): the bus bytes of its collectives.
std::map<int, double> traffic_lines(const std::string& output) {
  std::map<int, double> bytes;
  const std::regex line(R"(rank (\d+) traffic (\d+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it)
    bytes[std::stoi((*it)[1])] = std::stod((*it)[2]);
  return bytes;
}

struct Case {
  int ranks;
  const char* optimizer;  // "" (SGD with momentum) or "--adamw"
};

class TorchZero : public ::testing::TestWithParam<Case> {};

// Each level against plain DDP: bitwise, every rank's replica; the shares of what each level
// shards add up to plain DDP's per-rank figure, none above its even share plus the largest
// parameter's (owners hold whole tensors at 1 and 2; ZeRO 3's pieces are equal).
TEST_P(TorchZero, EveryLevelTrainsBitwiseAsPlainDdpWithAShareOfTheMemory) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const Case c = GetParam();
  TempDir dir;
  const std::string flags = std::string(c.optimizer) + " --memory";
  const RunResult plain = train(c.ranks, dir.file("plain-RANK.safetensors"), flags);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const std::map<int, Held> whole = memory_lines(plain.output);
  ASSERT_EQ(whole.size(), static_cast<size_t>(c.ranks)) << plain.output;
  if (std::string(c.optimizer).empty()) {  // SGD: one process with the global batch
    const std::string single = dir.file("single.safetensors");
    const RunResult one = run_command(kWorker + kModel + " --single --out " + single);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    EXPECT_LT(max_relative_difference(dir.file("plain-0.safetensors"), single), kAcrossRanksMargin);
  }
  // The largest parameter: fc1.weight, 72 x 32 floats; AdamW keeps two moments of it.
  const size_t largest = 72 * 32 * sizeof(float);
  for (const int level : {1, 2, 3}) {
    const std::string tag = "zero" + std::to_string(level);
    const RunResult r = train(c.ranks, dir.file(tag + "-RANK.safetensors"),
                              flags + " --zero " + std::to_string(level));
    ASSERT_EQ(r.exit_code, 0) << tag << "\n" << r.output;
    for (int rank = 0; rank < c.ranks; ++rank)
      EXPECT_EQ(max_relative_difference(dir.file(tag + "-" + std::to_string(rank) + ".safetensors"),
                                        dir.file("plain-0.safetensors")),
                0.0)
          << tag << " rank " << rank;
    const std::map<int, Held> shares = memory_lines(r.output);
    ASSERT_EQ(shares.size(), static_cast<size_t>(c.ranks)) << r.output;
    Held sum;
    for (const auto& [rank, held] : shares) {
      sum.optimizer += held.optimizer, sum.parameters += held.parameters;
      sum.gradients += held.gradients, sum.owned += held.owned;
      const Held& all = whole.at(rank);
      const size_t state_per_float = all.optimizer / all.parameters * sizeof(float);
      EXPECT_LE(held.optimizer, all.optimizer / c.ranks + largest / sizeof(float) * state_per_float)
          << tag << " rank " << rank;
      // zero(3)'s equal pieces: every bucket padded to a multiple of the ranks, so a rank's
      // piece of it is its even share plus less than one element (this model has fewer than
      // 16 buckets); its parameters, averaged gradients and optimizer state are that piece.
      const size_t padding = 16 * sizeof(float);
      if (level == 3) {
        EXPECT_GE(held.parameters, held.optimizer * all.parameters / all.optimizer)
            << tag << " rank " << rank;
        EXPECT_LE(held.parameters, all.parameters / c.ranks + padding) << tag << " rank " << rank;
        EXPECT_GE(held.gradients, held.optimizer * all.gradients / all.optimizer)
            << tag << " rank " << rank;
        EXPECT_LE(held.gradients, held.optimizer * all.gradients / all.optimizer + padding)
            << tag << " rank " << rank;
      } else {
        EXPECT_EQ(held.parameters, all.parameters) << tag << " rank " << rank;
        EXPECT_EQ(held.gradients,
                  level == 2 ? held.optimizer * all.gradients / all.optimizer : all.gradients)
            << tag << " rank " << rank;
      }
    }
    EXPECT_EQ(sum.optimizer, whole.at(0).optimizer) << tag;
    // Whole tensors to owners at 1 and 2; at 3 a parameter cut between pieces is every
    // holder's.
    if (level == 3)
      EXPECT_GE(sum.owned, whole.at(0).owned) << tag;
    else
      EXPECT_EQ(sum.owned, whole.at(0).owned) << tag;
    // On the wire: every level reduce-scatters each bucket and all-gathers the updated pieces,
    // about plain DDP's all-reduce (3 steps here: the start's broadcast and ZeRO 3's first
    // gather weigh in; the pieces are padded to the largest share), not the all-reduce and a
    // gather (1.5x, as ZeroRedundancyOptimizer beside DDP).
    const std::map<int, double> plain_bytes = traffic_lines(plain.output);
    const std::map<int, double> bytes = traffic_lines(r.output);
    ASSERT_EQ(bytes.size(), static_cast<size_t>(c.ranks)) << r.output;
    for (const auto& [rank, sent] : bytes)
      EXPECT_LE(sent / plain_bytes.at(rank), 1.2) << tag << " rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TorchZero,
                         ::testing::Values(Case{2, ""}, Case{2, "--adamw"}, Case{3, ""},
                                           Case{3, "--adamw"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::to_string(info.param.ranks) + "ranks" +
                                  (std::string(info.param.optimizer).empty() ? "Sgd" : "AdamW");
                         });

// gather_parameters() then torch::save on rank 0: a plain module (no ddp) loads the file and
// holds the trained weights.
TEST(TorchZeroUse, RankZerosCheckpointLoadsIntoAPlainModule) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const RunResult r =
      train(3, dir.file("trained.safetensors"), "--zero 3 --save-full " + dir.file("net.pt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const RunResult load = run_command(kWorker + kModel + " --check-load " + dir.file("net.pt") +
                                     " --out " + dir.file("loaded.safetensors"));
  ASSERT_EQ(load.exit_code, 0) << load.output;
  EXPECT_EQ(
      max_relative_difference(dir.file("loaded.safetensors"), dir.file("trained.safetensors")),
      0.0);
}

// no_sync accumulation, find_unused_parameters, torch::load after wrapping and communication
// hooks (bf16 travel, PowerSGD compressing from the first step: the buckets' reduction is the
// hook's at every level, each owner then taking its share): each as plain DDP does it, bitwise,
// at every level.
TEST(TorchZeroUse, NoSyncUnusedParametersTorchLoadAndCommHooksWorkUnderEveryLevel) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const std::string start = dir.file("start.pt");
  ASSERT_EQ(run_command(kWorker + kModel + " --save-start " + start).exit_code, 0);
  for (const std::string flags :
       {std::string("--accumulate 3 --adamw"), std::string("--unused --find-unused"),
        "--load " + start, std::string("--hook bf16"),
        std::string("--hook powersgd --powersgd-start 0 --powersgd-rank 1")}) {
    const RunResult plain = train(2, dir.file("plain.safetensors"), flags);
    ASSERT_EQ(plain.exit_code, 0) << flags << "\n" << plain.output;
    for (const int level : {1, 2, 3}) {
      const RunResult r =
          train(2, dir.file("zero.safetensors"), flags + " --zero " + std::to_string(level));
      ASSERT_EQ(r.exit_code, 0) << flags << " zero " << level << "\n" << r.output;
      EXPECT_EQ(
          max_relative_difference(dir.file("zero.safetensors"), dir.file("plain.safetensors")), 0.0)
          << flags << " zero " << level;
    }
  }
}

TEST(TorchZeroUse, AForwardThatSkippedTheGatherAndABadLevelAreNamed) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  // The module's own forward, with neither sync_buffers() nor gather_parameters() before it:
  // the second step would use parameters only their owners updated.
  const RunResult stale =
      train(2, dir.file("w.safetensors"), "--zero 1 --own-forward --no-sync-buffers");
  EXPECT_NE(stale.exit_code, 0) << stale.output;
  EXPECT_NE(stale.output.find("with zero(1): this step's forward ran without model.forward(...), "
                              "model.sync_buffers() or model.gather_parameters() before it"),
            std::string::npos)
      << stale.output;
  // Under zero(3) the other owners' parameters are empty between steps: LibTorch stops the
  // forward itself at the first layer (the README says so: nothing can refuse a forward of one's
  // own, LibTorch having no forward hooks).
  const RunResult empty =
      train(2, dir.file("w.safetensors"), "--zero 3 --own-forward --no-sync-buffers");
  EXPECT_NE(empty.exit_code, 0) << empty.output;
  EXPECT_NE(empty.output.find("'weight' must be 2-D"), std::string::npos) << empty.output;
  EXPECT_EQ(count_of(empty.output, "trained"), 0) << empty.output;
  const RunResult bad = train(2, dir.file("w.safetensors"), "--zero 4");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("DistributedDataParallelOptions().zero(4): expected 0 (plain), 1"),
            std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace ddp
