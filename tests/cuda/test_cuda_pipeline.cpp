// Pipeline parallelism on the GPU, its ranks sharing the one GPU (ddprun --share-gpu, NCCL
// over sockets): GPipe, 1F1B, pairs and ZB-H1 over 2 to 4 stages, interleaved 1F1B and ZB-V (two
// stages a rank, each flow to each peer on a lane of its own) and dp 2 x pp 2 give the weights
// and the test loss of one GPU (the plain one-GPU loop: the model as one CudaStage), with and
// without graph capture, and in bf16; --timeline has the device's spans; a pipelined run resumes
// bitwise; a rank killed mid-pipeline ends the job, named, within the grace period. Slow by design;
// never a performance figure.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/gpu_support.h"
#include "tests/support/metrics_support.h"
#include "tests/support/shared_gpu.h"
#include "tests/support/test_support.h"
#include "tests/support/weights_support.h"

namespace ddp {
namespace {

const std::string kTrain = DDPTRAIN_PATH;
const std::string kLayers = "24,64,48,32,6";  // four layers: up to four stages
const std::string kArgs = " --device cuda --data synthetic --layers " + kLayers +
                          " --synthetic-samples 960 --batch-size 48 --steps 12 --log-every 4 "
                          "--quiet --seed 5";

struct PipelineCase {
  const char* name;
  int ranks;
  const char* flags;
};

class SharedGpuPipeline : public ::testing::TestWithParam<PipelineCase> {};

TEST_P(SharedGpuPipeline, EqualsOneGpu) {
  REQUIRE_GPU();
  TempDir dir;
  const RunResult one = run_command(kGpuEnv + kTrain + kArgs + " --save-weights " +
                                    dir.file("one.st") + " --metrics " + dir.file("one.jsonl"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<float> reference = load_weights(dir.file("one.st"), kLayers);
  const double one_test_loss = events_of(dir.file("one.jsonl"), "end").back()["test_loss"];
  const PipelineCase& c = GetParam();
  for (const std::string graph : {"", " --no-cuda-graph"}) {
    const RunResult r =
        run_command(kSharedGpu + " --nproc-per-node " + std::to_string(c.ranks) + " -- " + kTrain +
                    kArgs + " " + c.flags + graph + " --metrics " + dir.file("pp.jsonl") +
                    " --save-weights " + dir.file("pp.st"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("on the GPU"), std::string::npos) << r.output;
    // Two stages a rank: the lanes were checked end to end before training.
    const std::string flags = c.flags;
    if (flags.find("interleaved") != std::string::npos || flags.find("zb-v") != std::string::npos)
      EXPECT_NE(r.output.find("lanes (NCCL communicators a flow, direction and peer) checked"),
                std::string::npos)
          << r.output;
    EXPECT_EQ(r.output.find("captured in a CUDA graph") != std::string::npos, graph.empty())
        << r.output;
    const double error = max_relative_error(load_weights(dir.file("pp.st"), kLayers), reference);
    std::printf("%s%s: max relative error against one GPU %.3g\n", c.name, graph.c_str(), error);
    EXPECT_LE(error, 1e-5) << c.name << graph;
    // The test split evaluated through the pipeline (each replica its shard) as on one GPU.
    const double test_loss = events_of(dir.file("pp.jsonl"), "end").back()["test_loss"];
    EXPECT_NEAR(test_loss, one_test_loss, 1e-5 * one_test_loss) << c.name << graph;
    // The bubble is measured on the device: some compute on every stage, less than the step.
    const std::vector<nlohmann::json> records = events_of(dir.file("pp.jsonl"), "pipeline");
    ASSERT_FALSE(records.empty());
    for (const auto& busy : records.back()["busy_s"])
      EXPECT_GT(busy.get<double>(), 0.0);
    EXPECT_GT(records.back()["bubble"].get<double>(), 0.0);
    EXPECT_LT(records.back()["bubble"].get<double>(), 1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SharedGpuPipeline,
    ::testing::Values(PipelineCase{"pp2_gpipe", 2, "--pp 2 --schedule gpipe"},
                      PipelineCase{"pp2_1f1b", 2, "--pp 2 --schedule 1f1b"},
                      PipelineCase{"pp3_pairs", 3, "--pp 3 --schedule pairs --micro-batches 6"},
                      PipelineCase{"pp4_1f1b", 4, "--pp 4 --schedule 1f1b"},
                      PipelineCase{"pp2_1f1b_overlap_optimizer", 2,
                                   "--pp 2 --schedule 1f1b --overlap-optimizer"},
                      PipelineCase{"dp2_pp2_gpipe", 4, "--pp 2 --schedule gpipe"},
                      // Backward in its input and weight halves.
                      PipelineCase{"pp2_zbh1", 2, "--pp 2 --schedule zb-h1"},
                      PipelineCase{"pp3_zbh1", 3, "--pp 3 --schedule zb-h1 --micro-batches 6"},
                      PipelineCase{"pp4_zbh1", 4, "--pp 4 --schedule zb-h1"},
                      PipelineCase{"dp2_pp2_zbh1_overlap_optimizer", 4,
                                   "--pp 2 --schedule zb-h1 --overlap-optimizer"},
                      // Two stages a rank in a loop (the four layers, one a stage).
                      PipelineCase{"pp2_interleaved_v2", 2,
                                   "--pp 2 --schedule interleaved-1f1b --virtual-stages 2"},
                      PipelineCase{"pp2_interleaved_m4", 2,
                                   "--pp 2 --schedule interleaved-1f1b --micro-batches 4"},
                      PipelineCase{"dp2_pp2_interleaved", 4,
                                   "--pp 2 --schedule interleaved-1f1b --micro-batches 4"},
                      // Two stages a rank in a V: the ends of the model on rank 0, its middle
                      // (handed over in memory) on rank 1.
                      PipelineCase{"pp2_zbv", 2, "--pp 2 --schedule zb-v"},
                      PipelineCase{"pp2_zbv_m4", 2, "--pp 2 --schedule zb-v --micro-batches 4"},
                      PipelineCase{"dp2_pp2_zbv", 4, "--pp 2 --schedule zb-v --micro-batches 4"}),
    [](const ::testing::TestParamInfo<PipelineCase>& info) { return info.param.name; });

// bf16: the stages' products in bf16 and activations and their gradients crossing as bf16
// give one GPU's bf16 weights (within rounding: the same per-sample products), and clearly
// not the float32 ones (proof that bf16 was used).
TEST(SharedGpuPipeline, Bf16EqualsOneGpuInBf16) {
  REQUIRE_GPU();
  TempDir dir;
  ASSERT_EQ(
      run_command(kGpuEnv + kTrain + kArgs + " --save-weights " + dir.file("fp32.st")).exit_code,
      0);
  const std::string args = kArgs + " --precision bf16 --save-weights ";
  ASSERT_EQ(run_command(kGpuEnv + kTrain + args + dir.file("one.st")).exit_code, 0);
  const RunResult r = run_command(kSharedGpu + " --nproc-per-node 2 -- " + kTrain + args +
                                  dir.file("pp.st") + " --pp 2 --schedule 1f1b");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<float> pipelined = load_weights(dir.file("pp.st"), kLayers);
  const double error = max_relative_error(pipelined, load_weights(dir.file("one.st"), kLayers));
  const double from_fp32 =
      max_relative_error(pipelined, load_weights(dir.file("fp32.st"), kLayers));
  std::printf("pp 2 1f1b bf16: max relative error against one GPU in bf16 %.3g, in fp32 %.3g\n",
              error, from_fp32);
  EXPECT_LE(error, 1e-5);
  EXPECT_GT(from_fp32, 1e-4);
}

// --timeline: the device's forwards and backwards, every micro-batch of every step on each
// stage, in one trace.
TEST(SharedGpuPipeline, TimelineHasEveryMicroBatchOfEveryStage) {
  REQUIRE_GPU();
  TempDir dir;
  const RunResult r =
      run_command(kSharedGpu + " --nproc-per-node 2 -- " + kTrain + kArgs +
                  " --pp 2 --micro-batches 4 --schedule gpipe --timeline " + dir.file("t.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir.file("t.json"));
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> count;  // "tid name" -> spans
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    ++count[std::to_string(e["tid"].get<int>()) + " " + e["name"].get<std::string>()];
  }
  for (int rank = 0; rank < 2; ++rank)
    for (const char* kind : {"forward", "backward"})
      for (int mb = 0; mb < 4; ++mb) {
        const std::string key = std::to_string(rank) + " " + kind + " " + std::to_string(mb);
        EXPECT_EQ(count[key], 12) << key;  // one a step
      }
}

// With two stages a rank (interleaved): every span names its stage, each rank forwards and
// backwards its two stages of the loop (0 and 2, 1 and 3), one span a micro-batch, stage and
// step each.
TEST(SharedGpuPipeline, TimelineNamesTheStageOfEverySpan) {
  REQUIRE_GPU();
  TempDir dir;
  const RunResult r = run_command(kSharedGpu + " --nproc-per-node 2 -- " + kTrain + kArgs +
                                  " --pp 2 --micro-batches 4 --schedule interleaved-1f1b "
                                  "--timeline " +
                                  dir.file("t.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir.file("t.json"));
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, int> count;  // "tid stage cat mb" -> spans
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || !e.contains("args") || !e["args"].contains("stage")) continue;
    const std::string cat = e["cat"];
    if (cat != "forward" && cat != "backward") continue;
    ++count[std::to_string(e["tid"].get<int>()) + " " +
            std::to_string(e["args"]["stage"].get<int>()) + " " + cat + " " +
            std::to_string(e["args"]["micro_batch"].get<int>())];
  }
  const int stages_of[2][2] = {{0, 2}, {1, 3}};
  for (int rank = 0; rank < 2; ++rank)
    for (int stage : stages_of[rank])
      for (const char* kind : {"forward", "backward"})
        for (int mb = 0; mb < 4; ++mb) {
          const std::string key = std::to_string(rank) + " " + std::to_string(stage) + " " + kind +
                                  " " + std::to_string(mb);
          EXPECT_EQ(count[key], 12) << key;  // one a step
        }
  EXPECT_EQ(count.size(), 2u * 2 * 2 * 4) << "spans of other stages or micro-batches";
}

// --recompute: bitwise the weights of the run without it, under a whole backward (1f1b), its
// halves (zb-h1) and two stages a rank (interleaved, zb-v), with graph capture on and off, while
// the first stage (which holds the most micro-batches) holds fewer activation bytes: its layers but
// the last keep one working set instead of one set a slot.
TEST(SharedGpuPipeline, RecomputeGivesTheSameWeightsWithLessActivationMemory) {
  REQUIRE_GPU();
  const auto activations = [](const std::string& metrics) {
    const auto memory = events_of(metrics, "memory");
    return memory.empty() ? int64_t{-1} : memory.front()["held"].value("activations", int64_t{-1});
  };
  // Two layers a stage (one working set, one output kept a slot), in every case.
  const std::string args =
      " --device cuda --data synthetic --layers 24,64,48,40,32,28,16,12,6 --partition "
      "0-1,2-3,4-5,6-7 --synthetic-samples 960 --batch-size 48 --steps 12 --log-every 4 --quiet "
      "--seed 5 --micro-batches 8 ";
  for (const std::string schedule :
       {"--pp 4 --schedule 1f1b", "--pp 4 --schedule zb-h1",
        "--pp 2 --schedule interleaved-1f1b --virtual-stages 2", "--pp 2 --schedule zb-v"})
    for (const std::string graph : {"", " --no-cuda-graph"}) {
      TempDir dir;
      const std::string ranks = schedule.rfind("--pp 4", 0) == 0 ? "4" : "2";
      const std::string job = kSharedGpu + " --nproc-per-node " + ranks + " -- " + kTrain + args +
                              schedule + graph + " --metrics ";
      const RunResult plain =
          run_command(job + dir.file("plain.jsonl") + " --save-weights " + dir.file("plain.st"));
      ASSERT_EQ(plain.exit_code, 0) << plain.output;
      const RunResult re = run_command(job + dir.file("re.jsonl") + " --save-weights " +
                                       dir.file("re.st") + " --recompute");
      ASSERT_EQ(re.exit_code, 0) << re.output;
      EXPECT_EQ(read_file(dir.file("re.st")), read_file(dir.file("plain.st"))) << schedule << graph;
      const int64_t with = activations(dir.file("re.jsonl"));
      const int64_t without = activations(dir.file("plain.jsonl"));
      std::printf("%s%s: activation bytes %lld with --recompute, %lld without\n", schedule.c_str(),
                  graph.c_str(), static_cast<long long>(with), static_cast<long long>(without));
      EXPECT_GT(with, 0) << schedule << graph;
      EXPECT_LT(with, without) << schedule << graph;
    }
}

TEST(SharedGpuPipeline, ResumeIsBitwiseAndWeightsKeepTheOneProcessLayout) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string job = kSharedGpu + " --nproc-per-node 2 -- " + kTrain + kArgs +
                          " --pp 2 --optimizer adamw --lr 0.01 --lr-schedule constant";
  const RunResult straight = run_command(job + " --save-weights " + dir.file("straight.st"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string ckpt = " --checkpoint-dir " + dir.file("ckpt") + " --resume";
  const RunResult first = run_command(job + ckpt + " --steps 6");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const RunResult second = run_command(job + ckpt + " --save-weights " + dir.file("resumed.st"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  // load_weights reads the one-process names and shapes: the layout is the one-process file's.
  EXPECT_EQ(load_weights(dir.file("resumed.st"), kLayers),
            load_weights(dir.file("straight.st"), kLayers));
}

// One stage a rank (pp 3), and two a rank in a loop (interleaved, pp 2) and in a V (zb-v).
TEST(SharedGpuPipeline, KilledStageIsNamedAndTheOthersStopWithinTheGracePeriod) {
  REQUIRE_GPU();
  const double grace = 3;
  for (const std::string layout :
       {"--pp 3", "--pp 2 --schedule interleaved-1f1b", "--pp 2 --schedule zb-v"}) {
    TempDir dir;
    const int ranks = layout == "--pp 3" ? 3 : 2;
    const RunResult r = run_and_signal(dir,
                                       kSharedGpu + " --nproc-per-node " + std::to_string(ranks) +
                                           " --grace-period 3 -- " + kTrain +
                                           " --device cuda --data synthetic --layers " + kLayers +
                                           " --synthetic-samples 960 --batch-size 48 " + layout +
                                           " --steps 100000000 --log-every 20 --timeout 60",
                                       "step 40/", 1, "KILL");
    EXPECT_NE(r.output.find("rank 1 failed first: killed by SIGKILL (9)"), std::string::npos)
        << layout << "\n"
        << r.output;
    EXPECT_EQ(r.output.find("LEFT BEHIND"), std::string::npos) << layout << "\n" << r.output;
    EXPECT_LT(stopped_after(r.output), grace + 3.0) << layout << "\n" << r.output;
  }
}

}  // namespace
}  // namespace ddp
