// ddp::Pipeline on the CPU (Gloo under ddprun): a LibTorch Sequential of several kinds of layer
// under every schedule on 2 and 3 ranks trains as one process with the same global batch
// (within kAcrossRanksMargin: the micro-batches' gradients are summed in another order than
// the whole batch's product); recomputation is bitwise the run without it; a stage that refuses
// its input mid-step is named, with the shape and where it came from, and the job ends.
#include <gtest/gtest.h>

#include <fstream>

#include <map>
#include <ostream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "tests/libtorch/torch_compare.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

const std::string kDdprun = std::string("CUDA_VISIBLE_DEVICES= ") + DDPRUN_PATH;
const std::string kWorker = PIPELINE_WORKER_PATH;

RunResult pipeline(int ranks, const std::string& out, const std::string& flags) {
  return run_command(kDdprun + " --nproc-per-node " + std::to_string(ranks) + " -- " + kWorker +
                     " --out " + out + " " + flags);
}

// The largest difference of every rank's parameters (out.R) from the reference's (ref.0); each
// reference tensor found in exactly one rank's file.
double against_reference(const TempDir& dir, int ranks) {
  std::vector<std::string> paths;
  for (int r = 0; r < ranks; ++r)
    paths.push_back(dir.file("out." + std::to_string(r)));
  return max_relative_difference_of_ranks(paths, dir.file("ref.0"));
}

struct Case {
  const char* schedule;
  int ranks;
  const char* optimizer;
};

// gtest prints a case by its fields (not its bytes: the names ctest lists stay the same).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.schedule << " pp " << c.ranks << " " << c.optimizer;
}

class TorchPipeline : public ::testing::TestWithParam<Case> {};

TEST_P(TorchPipeline, TrainsAsOneProcessWithTheWholeBatch) {
  const Case c = GetParam();
  TempDir dir;
  // 6 micro-batches of 4: a multiple of 2 and 3 ranks (interleaved takes them in groups).
  const std::string flags = std::string(" --micro-batches 6 --steps 3 --optimizer ") + c.optimizer;
  const RunResult ref = run_command(kWorker + " --reference --out " + dir.file("ref") + flags);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const RunResult run = pipeline(c.ranks, dir.file("out"), flags + " --schedule " + c.schedule);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("the simulator's bubble"), std::string::npos) << run.output;
  // Margin: kAcrossRanksMargin (support/margins.h); a micro-batch lost or a gradient sent to
  // the wrong stage is off by 1e-3 or more after 3 steps.
  EXPECT_LT(against_reference(dir, c.ranks), kAcrossRanksMargin) << run.output;
  // The losses the last stage printed are the reference's (6 decimals).
  for (int step = 0; step < 3; ++step) {
    const std::string tag = "step " + std::to_string(step) + " loss ";
    const size_t at = ref.output.find(tag);
    ASSERT_NE(at, std::string::npos) << ref.output;
    EXPECT_NE(run.output.find(ref.output.substr(at, tag.size() + 6)), std::string::npos)
        << ref.output.substr(at, ref.output.find('\n', at) - at) << " in\n"
        << run.output;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, TorchPipeline,
    ::testing::Values(Case{"gpipe", 2, "sgd"}, Case{"1f1b", 2, "sgd"}, Case{"1f1b", 3, "sgd"},
                      Case{"interleaved-1f1b", 2, "sgd"}, Case{"interleaved-1f1b", 3, "sgd"},
                      Case{"zb-h1", 2, "sgd"}, Case{"zb-h1", 3, "sgd"}, Case{"zb-v", 2, "sgd"},
                      Case{"zb-v", 3, "sgd"}, Case{"gpipe", 3, "adamw"}, Case{"zb-v", 2, "adamw"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = std::string(info.param.schedule) + "_pp" +
                         std::to_string(info.param.ranks) + "_" + info.param.optimizer;
      for (char& ch : name)
        if (ch == '-') ch = '_';
      return name;
    });

// dp 2 x pp 2 (four ranks: two replicas of a two-rank zb-v pipeline, each on half of the
// global batch): the stages' gradients averaged over their replicas give the one process's
// weights with the whole batch, with SGD momentum and with AdamW.
TEST(TorchPipelineUse, TwoReplicasOfTheZbvPipelineTrainAsOneProcess) {
  for (const std::string optimizer : {"sgd", "adamw"}) {
    TempDir dir;
    const std::string flags = " --micro-batches 4 --steps 3 --optimizer " + optimizer;
    const RunResult ref = run_command(kWorker + " --reference --out " + dir.file("ref") + flags);
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    const RunResult run =
        pipeline(4, dir.file("out"), flags + " --schedule zb-v --data-parallel 2");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("2 replicas (data parallel)"), std::string::npos) << run.output;
    EXPECT_LT(against_reference(dir, 2), kAcrossRanksMargin) << optimizer << "\n" << run.output;
  }
}

// dp 2 x pp 2 under 1f1b, each stage wrapped by a DistributedDataParallel over its replicas:
// small buckets (several a stage) go out while the step's last backward still writes gradients
// ("overlap yes" on every rank, from the wrappers' events), and the weights are one process's
// with the whole batch; the bf16 hook on every stage equals reduce_in_bf16 bitwise and stays
// within bf16's margin of one process (2e-2, the DDP hooks' test's: gradients rounded to 2^-8).
TEST(TorchPipelineUse, ReplicasAverageThroughBucketsThatOverlapAndTakeHooksAndBf16) {
  TempDir dir;
  const std::string flags = " --micro-batches 4 --steps 3 --schedule 1f1b";
  const RunResult ref = run_command(kWorker + " --reference --out " + dir.file("ref") + flags);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const RunResult buckets =
      pipeline(4, dir.file("out"), flags + " --data-parallel 2 --bucket-kb 1 --events");
  ASSERT_EQ(buckets.exit_code, 0) << buckets.output;
  EXPECT_EQ(count_of(buckets.output, "overlap yes"), 4) << buckets.output;
  EXPECT_LT(against_reference(dir, 2), kAcrossRanksMargin) << buckets.output;
  const RunResult hook = pipeline(4, dir.file("hook"), flags + " --data-parallel 2 --hook bf16");
  ASSERT_EQ(hook.exit_code, 0) << hook.output;
  const RunResult option =
      pipeline(4, dir.file("option"), flags + " --data-parallel 2 --reduce-in-bf16");
  ASSERT_EQ(option.exit_code, 0) << option.output;
  for (const std::string rank : {"0", "1"})
    EXPECT_EQ(max_relative_difference(dir.file("hook." + rank), dir.file("option." + rank)), 0.0);
  const double bf16 =
      max_relative_difference_of_ranks({dir.file("hook.0"), dir.file("hook.1")}, dir.file("ref.0"));
  EXPECT_GT(bf16, 0.0) << "the gradients did not travel as bf16";
  EXPECT_LT(bf16, 2e-2);
  // Replicas that disagree in the wrappers' options are named by the wrapper's own check (world
  // rank 1 is stage 0's replica 1: the ranks of one stage side by side, as ddptrain's).
  const RunResult differ =
      pipeline(4, dir.file("differ"), flags + " --data-parallel 2 --rank1-flags --reduce-in-bf16");
  EXPECT_NE(differ.exit_code, 0);
  EXPECT_NE(
      differ.output.find("rank 1 has reduce_in_bf16(true) where rank 0 has reduce_in_bf16(false)"),
      std::string::npos)
      << differ.output;
}

// What each rank printed after its last step: "rank R keeps optimizer state S bytes,
// parameters P bytes", as {S, P} by rank.
std::map<int, std::pair<double, double>> kept_bytes(const std::string& output) {
  std::map<int, std::pair<double, double>> kept;
  const std::regex line("rank (\\d+) keeps optimizer state (\\d+) bytes, parameters (\\d+) bytes");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it)
    kept[std::stoi((*it)[1])] = {std::stod((*it)[2]), std::stod((*it)[3])};
  return kept;
}

// ZeRO inside the pipeline (dp 2 x pp 2 under zb-v, AdamW): each stage's DistributedDataParallel
// shards over its replicas as plain DDP's ZeRO does, so every level trains bitwise as zero(0)
// (the gradients cross the same all-reduce; the evaluation output in the files too, gathered
// first), the replicas of a place keeping each byte of its optimizer state once between them
// (whole tensors go to owners, so the halves are uneven on a model this small), and under
// zero(3) a part of its parameters each between steps.
TEST(TorchPipelineUse, ZeroInsideThePipelineIsBitwisePlainWithAShareOfTheState) {
  TempDir dir;
  const std::string flags =
      " --micro-batches 4 --steps 3 --schedule zb-v --data-parallel 2 --optimizer adamw --memory";
  const RunResult plain = pipeline(4, dir.file("z0"), flags);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto full = kept_bytes(plain.output);
  ASSERT_EQ(full.size(), 4u) << plain.output;
  for (const int level : {1, 2, 3}) {
    const std::string name = "z" + std::to_string(level);
    const RunResult run = pipeline(4, dir.file(name), flags + " --zero " + std::to_string(level));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    for (const std::string rank : {"0", "1"})
      EXPECT_EQ(max_relative_difference(dir.file(name + "." + rank), dir.file("z0." + rank)), 0.0)
          << "zero(" << level << ") rank " << rank;
    const auto kept = kept_bytes(run.output);
    ASSERT_EQ(kept.size(), 4u) << run.output;
    // World ranks 2p and 2p + 1 are the replicas of pipeline place p: between them they keep
    // each byte of the optimizer state (zero(3): of the parameters) once, each a part.
    for (const int place : {0, 1}) {
      const auto& a = kept.at(2 * place);
      const auto& b = kept.at(2 * place + 1);
      const auto& whole = full.at(2 * place);
      EXPECT_EQ(a.first + b.first, whole.first) << "zero(" << level << ") place " << place;
      EXPECT_GT(a.first, 0.0) << "zero(" << level << ") place " << place;
      EXPECT_GT(b.first, 0.0) << "zero(" << level << ") place " << place;
      if (level == 3) {
        EXPECT_LT(a.second, whole.second) << "place " << place;
        EXPECT_LT(b.second, whole.second) << "place " << place;
      } else {
        EXPECT_EQ(a.second, whole.second) << "zero(" << level << ") place " << place;
      }
    }
  }
}

// Shard units inside the pipeline (dp 2 x pp 2, each Linear a ddp::ShardUnit, zero(3)): the
// schedule's UNSHARD gathers a stage's units over its replicas ahead of the stage's first use
// in a step and its RESHARD frees them after the last (a weight half's included: LibTorch's
// may read a weight), so that each unit crosses the wire once a step, not at each micro-batch's
// forward and backward (8 times a step here): the step trains bitwise as zero(0) under the
// zero-bubble, 1F1B and GPipe schedules (the gradients cross the same sums), the evaluation
// output too. The stage is then whole during the step, as zero(3) without units holds it (a
// stage of three units and a LayerNorm, GPipe, --balance 6,3: 16,320 bytes at the peak; it was
// 14,144 gathering at each use), its pieces between steps.
TEST(TorchPipelineUse, ShardUnitsInsideThePipelineAreBitwisePlain) {
  TempDir dir;
  for (const std::string schedule : {"zb-v", "1f1b", "gpipe"}) {
    const std::string flags = " --micro-batches 4 --steps 3 --data-parallel 2 --optimizer adamw " +
                              std::string("--schedule ") + schedule;
    const RunResult plain = pipeline(4, dir.file("z0"), flags);
    ASSERT_EQ(plain.exit_code, 0) << schedule << "\n" << plain.output;
    const RunResult units = pipeline(4, dir.file("u3"), flags + " --zero 3 --units --events");
    ASSERT_EQ(units.exit_code, 0) << schedule << "\n" << units.output;
    for (const std::string rank : {"0", "1"})
      EXPECT_EQ(max_relative_difference(dir.file("u3." + rank), dir.file("z0." + rank)), 0.0)
          << schedule << " rank " << rank;
    const int stages = schedule == "zb-v" ? 8 : 4;  // one line a stage of each rank
    EXPECT_EQ(count_of(units.output, "unit gathers a step: most 1 fewest 1"), stages)
        << schedule << "\n"
        << units.output;
  }
  const std::string flags =
      " --micro-batches 4 --steps 3 --schedule gpipe --balance 6,3 "
      "--data-parallel 2 --optimizer adamw --memory --zero 3";
  const RunResult whole = pipeline(4, dir.file("w3"), flags);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const RunResult units = pipeline(4, dir.file("w3u"), flags + " --units");
  ASSERT_EQ(units.exit_code, 0) << units.output;
  const std::regex line(R"(rank 0 peak parameters (\d+) bytes)");
  std::smatch gathered, unit;
  ASSERT_TRUE(std::regex_search(whole.output, gathered, line)) << whole.output;
  ASSERT_TRUE(std::regex_search(units.output, unit, line)) << units.output;
  EXPECT_EQ(std::stod(gathered[1]), 16320.0);
  EXPECT_EQ(std::stod(unit[1]), 16320.0);
}

// A pipeline rank holds its own stages' parameters only (round 6: a whole-model torch::save on
// a rank silently held the other stages' untrained weights): the model's 12 parameter tensors
// split 6 and 6 over the two ranks (modules 0-4 and 5-8), and a whole-model forward on either
// rank fails instead of computing with weights nobody trains.
TEST(TorchPipelineUse, ARankHoldsOnlyItsOwnStagesParameters) {
  TempDir dir;
  const RunResult r = pipeline(2, dir.file("out"), " --whole-model");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string rank : {"0", "1"}) {
    EXPECT_NE(r.output.find("rank " + rank + " holds 6 parameter tensors of the model's 12"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("rank " + rank + " whole-model forward failed"), std::string::npos)
        << r.output;
  }
}

// The same dp 2 x pp 2 started by mpirun (ddp::init joins the job as under ddprun).
TEST(TorchPipelineUse, MpirunStartsTheSamePipeline) {
  if (!HAVE_MPI) GTEST_SKIP() << "built without MPI";
  TempDir dir;
  const std::string flags = " --micro-batches 4 --steps 3 --schedule zb-v --data-parallel 2";
  const RunResult ref = run_command(kWorker + " --reference --out " + dir.file("ref") + flags);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const RunResult run =
      run_command(std::string("env -u OMP_NUM_THREADS CUDA_VISIBLE_DEVICES= ") + MPIRUN_PATH +
                  " --allow-run-as-root --oversubscribe --bind-to none -np 4 " + kWorker +
                  " --out " + dir.file("out") + flags);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("2 replicas (data parallel)"), std::string::npos) << run.output;
  EXPECT_LT(against_reference(dir, 2), kAcrossRanksMargin) << run.output;
}

TEST(TorchPipelineUse, RecomputationIsBitwiseTheRunWithout) {
  TempDir dir;
  const std::string flags = " --schedule zb-v --micro-batches 4 --steps 2";
  const RunResult plain = pipeline(2, dir.file("plain"), flags);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const RunResult again = pipeline(2, dir.file("again"), flags + " --recompute");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("recomputing activations"), std::string::npos) << again.output;
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(max_relative_difference(dir.file("again." + std::to_string(r)),
                                      dir.file("plain." + std::to_string(r))),
              0.0);
}

// A batch that the micro-batches do not split evenly (22 in 4: 6, 6, 5, 5): each micro-batch's
// mean loss weighs by its share of the batch, so the gradients are the whole batch's mean's
// (weighted by 1/M, the 5-sample micro-batches would count as much as the 6-sample ones: the
// weights leave the reference by ~1e-3 after 3 steps).
TEST(TorchPipelineUse, AnUnevenBatchWeighsEachMicroBatchByItsSamples) {
  TempDir dir;
  const std::string flags = " --batch 22 --micro-batches 4 --steps 3";
  const RunResult ref = run_command(kWorker + " --reference --out " + dir.file("ref") + flags);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const RunResult run = pipeline(2, dir.file("out"), flags + " --schedule 1f1b");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // kAcrossRanksMargin: support/margins.h.
  EXPECT_LT(against_reference(dir, 2), kAcrossRanksMargin) << run.output;
}

TEST(TorchPipelineUse, AStageThatRefusesItsInputIsNamedAndTheJobEnds) {
  TempDir dir;
  // Module 3 takes 24 features but module 2 gives 32; with balance 3,6 it is stage 1's first.
  const RunResult run =
      pipeline(2, dir.file("out"), " --bad-shape --balance 3,6 --micro-batches 4 --steps 2");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("module 3 (stage 1's first) refused its input [6, 32] Float of "
                            "micro-batch 0, received from stage 0"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("rank 1"), std::string::npos) << run.output;
  EXPECT_LT(run.seconds, 60) << "the job was torn down, not left waiting";
}

TEST(TorchPipelineUse, OptionsThatDoNotFitAreNamed) {
  TempDir dir;
  // The last three are the schedule library's own checks, in the pipeline's option names.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --schedule 2f2b", "PipelineOptions::schedule '2f2b': expected gpipe, 1f1b"},
      {" --balance 4,4", "PipelineOptions::balance: 8 modules in all, but the Sequential has 9"},
      {" --schedule interleaved-1f1b --micro-batches 3",
       "PipelineOptions::micro_batches 3: the interleaved-1f1b schedule takes micro-batches in "
       "groups of the 2 pipeline ranks"},
      {" --schedule zb-h1 --stages-per-rank 2",
       "PipelineOptions::stages_per_rank 2: the zb-h1 schedule holds one chunk of modules a rank; "
       "give PipelineOptions::schedule interleaved-1f1b or zb-v for more"},
      {" --schedule interleaved-1f1b --stages-per-rank 5",
       "ranks 2 PipelineOptions::stages_per_rank 5: 10 stages of modules, but the Sequential has "
       "9 modules"}};
  for (const auto& [flags, message] : cases) {
    const RunResult run = pipeline(2, dir.file("out"), flags);
    EXPECT_NE(run.exit_code, 0) << flags;
    EXPECT_NE(run.output.find(message), std::string::npos) << flags << "\n" << run.output;
  }
}

// Ranks that cut the model in different places (or schedule it differently) would each run
// modules the other runs too, and the job would train a model nobody built, exit 0 (round 6:
// balance 3,6 on one rank and 4,5 on the other trained module 3 on both). The construction
// compares them and every rank names the first difference.
TEST(TorchPipelineUse, RanksThatDisagreeStopNamingTheFirstDifference) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--balance 3,6 --rank1-flags '--balance 4,5'",
       "rank 1 has balance({4, 5}) (modules a stage) where rank 0 has balance({3, 6})"},
      {"--micro-batches 4 --rank1-flags '--micro-batches 2'",
       "rank 1 has micro_batches(2) where rank 0 has micro_batches(4)"},
      {"--rank1-flags '--schedule gpipe'",
       "rank 1 has schedule(gpipe) where rank 0 has "
       "schedule(1f1b)"},
      {"--rank1-flags --recompute",
       "rank 1 has recompute(true) where rank 0 has recompute(false)"}};
  for (const auto& [flags, message] : cases) {
    const RunResult run = pipeline(2, dir.file("out"), flags + " --steps 2");
    EXPECT_NE(run.exit_code, 0) << flags << "\n" << run.output;
    for (const int rank : {0, 1})
      EXPECT_NE(run.output.find(
                    "[rank " + std::to_string(rank) +
                    "] pipeline_worker: ddp::Pipeline: the pipeline's ranks differ: " + message),
                std::string::npos)
          << flags << "\n"
          << run.output;
  }
}

// Pipeline::clip_grad_norm_ clipping every step (max norm 0.05 against norms about 1.2) on
// pp 2, pp 3 and dp 2 x pp 2 (plain, zero(1), zero(3), zero(3) with units), for the 2-norm and
// the largest element: every rank returns the one process's norm of the whole model's gradient
// (LibTorch's own clip_grad_norm_ there) within 1e-6 relative (each stage's part once, its
// replicas' shares combined, in float64), and the weights trained with SGD equal that process's
// within kAcrossRanksMargin.
TEST(TorchPipelineUse, ClipGradNormIsTheWholeModelsOverStagesAndReplicas) {
  TempDir dir;
  for (const std::string norm_type : {"2", "inf"}) {
    const std::string flags = " --micro-batches 4 --steps 3 --clip 0.05 --norm-type " + norm_type;
    const RunResult ref = run_command(kWorker + " --reference --out " + dir.file("ref") + flags);
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    std::vector<double> reference;
    const std::regex line(R"(rank (\d+) step (\d+) norm ([-+0-9.eE]+|inf))");
    for (auto it = std::sregex_iterator(ref.output.begin(), ref.output.end(), line);
         it != std::sregex_iterator(); ++it)
      reference.push_back(std::stod((*it)[3]));
    ASSERT_EQ(reference.size(), 3u) << ref.output;
    struct Layout {
      int ranks, stages;
      std::string flags;
    };
    for (const Layout& l :
         {Layout{2, 2, ""}, Layout{3, 3, ""}, Layout{4, 2, "--data-parallel 2"},
          Layout{4, 2, "--data-parallel 2 --zero 1"}, Layout{4, 2, "--data-parallel 2 --zero 3"},
          Layout{4, 2, "--data-parallel 2 --zero 3 --units"}}) {
      const std::string where = norm_type + ", " + std::to_string(l.ranks) + " ranks " + l.flags;
      const RunResult r = pipeline(l.ranks, dir.file("out"), l.flags + flags);
      ASSERT_EQ(r.exit_code, 0) << where << "\n" << r.output;
      int lines = 0;
      for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line);
           it != std::sregex_iterator(); ++it, ++lines) {
        const double want = reference.at(std::stoul((*it)[2]));
        EXPECT_NEAR(std::stod((*it)[3]), want, 1e-6 * want) << where << ": " << it->str();
      }
      EXPECT_EQ(lines, 3 * l.ranks) << where << "\n" << r.output;
      EXPECT_LT(against_reference(dir, l.stages), kAcrossRanksMargin) << where;
    }
  }
}

// ddp::checkpoint inside a pipeline's stages (pipeline_worker --checkpoint: each Linear a
// ddp::CheckpointWrapper, inside its unit with --units): each rank's weights after 3 steps are
// bitwise the same pipeline's without it, under 1F1B, GPipe and the zero-bubble ZB-V (whose
// split backward asks the checkpoint for its input's gradient and its parameters' in two passes,
// each from its own recompute), and with replicas under zero(3) units (dp 2 x pp 2).
TEST(TorchPipelineUse, CheckpointedLayersTrainBitwiseAsWithoutUnderEverySchedule) {
  TempDir dir;
  struct Layout {
    int ranks, stages;
    std::string flags;
  };
  for (const Layout& l : {Layout{2, 2, "--schedule 1f1b"}, Layout{2, 2, "--schedule gpipe"},
                          Layout{2, 4, "--schedule zb-v"},
                          Layout{4, 4, "--schedule zb-v --data-parallel 2 --zero 3 --units"}}) {
    const std::string flags = " --micro-batches 4 --steps 3 " + l.flags;
    const RunResult plain = pipeline(l.ranks, dir.file("plain"), flags);
    ASSERT_EQ(plain.exit_code, 0) << l.flags << "\n" << plain.output;
    const RunResult checkpointed = pipeline(l.ranks, dir.file("ckpt"), flags + " --checkpoint");
    ASSERT_EQ(checkpointed.exit_code, 0) << l.flags << "\n" << checkpointed.output;
    int compared = 0;
    for (int r = 0; r < l.ranks; ++r) {
      const std::string rank = "." + std::to_string(r);
      if (!std::ifstream(dir.file("plain" + rank))) continue;  // a replica that writes none
      EXPECT_EQ(max_relative_difference(dir.file("ckpt" + rank), dir.file("plain" + rank)), 0.0)
          << l.flags << ", rank " << r;
      ++compared;
    }
    EXPECT_GE(compared, 2) << l.flags;
  }
}

// ddp::GradScaler with ddp::Pipeline as a user writes it (the loss scaled in the loss function,
// the scaler over the world's ranks), where the last rank alone (the last stage's, of the
// second replica where there are two) finds an inf in its gradients at steps 1 and 4: every rank
// of every stage and replica skips those steps with the scale one process's GradScaler gives
// with the same skips (1024, 512, 512, 1024, 512, 512), and the weights equal that process's
// within kAcrossRanksMargin (the scales are powers of two: scaling and unscaling are exact), on
// pp 2, pp 3 and dp 2 x pp 2 (zero(1), and zero(3) with units).
TEST(TorchPipelineUse, GradScalerSkipsTheSameStepsOnEveryStageAndReplica) {
  TempDir dir;
  const std::string flags = " --micro-batches 4 --steps 6 --scaler --overflow 1,4";
  const RunResult ref = run_command(kWorker + " --reference --out " + dir.file("ref") + flags);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::vector<std::string> expected = scale_lines(ref.output)[0];
  ASSERT_EQ(expected, (std::vector<std::string>{"0:1024:1", "1:512:0", "2:512:1", "3:1024:1",
                                                "4:512:0", "5:512:1"}))
      << ref.output;
  struct Layout {
    int ranks, stages;
    std::string flags;
  };
  for (const Layout& l :
       {Layout{2, 2, ""}, Layout{3, 3, ""}, Layout{4, 2, "--data-parallel 2 --zero 1"},
        Layout{4, 2, "--data-parallel 2 --zero 3 --units"}}) {
    const std::string where = std::to_string(l.ranks) + " ranks " + l.flags;
    const RunResult r =
        pipeline(l.ranks, dir.file("out"),
                 l.flags + flags + " --overflow-rank " + std::to_string(l.ranks - 1));
    ASSERT_EQ(r.exit_code, 0) << where << "\n" << r.output;
    const std::map<int, std::vector<std::string>> got = scale_lines(r.output);
    ASSERT_EQ(got.size(), static_cast<size_t>(l.ranks)) << where << "\n" << r.output;
    for (const auto& [rank, sequence] : got)
      EXPECT_EQ(sequence, expected) << where << ", rank " << rank;
    EXPECT_LT(against_reference(dir, l.stages), kAcrossRanksMargin) << where;
  }
}

// A ddp::Checkpointer checkpoint of a pipeline (pp 2, AdamW, saved after 2 of 4 steps: each rank
// its stages' parameters and moments under the whole model's names) resumes in one process
// without a pipeline, as pp 3 and as dp 2 x pp 2 with zero(3) units (each stage's DDP wrapper
// taking its pieces), and one process's checkpoint resumes as pp 2: each ends as the
// uninterrupted one process's run within kAcrossRanksMargin.
TEST(TorchPipelineUse, CheckpointsMoveBetweenPipelineCutsReplicasAndOneProcess) {
  TempDir dir;
  const std::string flags = " --micro-batches 4 --steps 4 --optimizer adamw ";
  const RunResult ref = run_command(kWorker + " --reference --out " + dir.file("ref") + flags);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::string saved = " --checkpoint-dir " + dir.file("pp");
  const RunResult save = pipeline(2, dir.file("out"), flags + saved + " --save-at 1");
  ASSERT_EQ(save.exit_code, 0) << save.output;
  const RunResult one =
      run_command(kWorker + " --reference --out " + dir.file("one") + flags + saved + " --resume");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("rank 0 resumed at step 2"), std::string::npos) << one.output;
  EXPECT_LT(max_relative_difference(dir.file("one.0"), dir.file("ref.0")), kAcrossRanksMargin);
  struct Layout {
    int ranks, stages;
    std::string flags;
  };
  for (const Layout& l : {Layout{3, 3, ""}, Layout{4, 2, "--data-parallel 2 --zero 3 --units"}}) {
    const RunResult r = pipeline(l.ranks, dir.file("out"), flags + l.flags + saved + " --resume");
    ASSERT_EQ(r.exit_code, 0) << l.flags << "\n" << r.output;
    EXPECT_NE(r.output.find("rank 0 resumed at step 2"), std::string::npos) << r.output;
    EXPECT_LT(against_reference(dir, l.stages), kAcrossRanksMargin) << l.ranks << " " << l.flags;
  }
  const std::string from_one = " --checkpoint-dir " + dir.file("one-ckpt");
  ASSERT_EQ(run_command(kWorker + " --reference" + flags + from_one + " --save-at 1").exit_code, 0);
  const RunResult back = pipeline(2, dir.file("out"), flags + from_one + " --resume");
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_LT(against_reference(dir, 2), kAcrossRanksMargin);
}

}  // namespace
}  // namespace ddp
