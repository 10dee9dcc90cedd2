// ZeRO on the GPU, its ranks sharing the one GPU (ddprun --share-gpu, NCCL over sockets):
// --zero 1, 2 and 3 with dp 2 and 3, SGD and AdamW, --accumulate 2, dp 2 x pp 2 and bf16 give
// the weights of plain data parallelism (one GPU's, which plain data parallelism equals), with
// the step captured in a CUDA graph; a rank holds 1/D of the optimizer state (its memory
// record, within the 64-element alignment of each bucket's pieces); the checkpoint rank 0
// gathers is the plain run's file byte for byte, and resumes into --zero 0 on 3 ranks. Slow by
// design; never a performance figure.
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
#include "tests/support/zero_support.h"

namespace ddp {
namespace {

const std::string kTrain = DDPTRAIN_PATH;
const std::string kLayers = "24,64,48,32,6";
// Small buckets: every layer a bucket of its own, none a multiple of 64 x D elements, so every
// bucket goes through a padded copy somewhere.
const std::string kArgs = " --device cuda --data synthetic --layers " + kLayers +
                          " --synthetic-samples 960 --batch-size 48 --steps 12 --log-every 4 "
                          "--quiet --seed 5 --bucket-mb 0.004 --first-bucket-mb 0.001";

std::string shared(int ranks, const std::string& flags) {
  return kSharedGpu + " --nproc-per-node " + std::to_string(ranks) + " -- " + kTrain + kArgs + " " +
         flags;
}

int64_t held(const std::string& metrics, const std::string& kind) {
  const auto memory = events_of(metrics, "memory");
  return memory.empty() ? -1 : memory.back()["held"].value(kind, int64_t{-1});
}

struct ZeroCase {
  const char* name;
  int ranks;
  int replicas;       // the data-parallel group
  const char* flags;  // both runs'
  int zero;
  bool plain_dp;  // compared with plain data parallelism (else with one GPU)
};

void PrintTo(const ZeroCase& c, std::ostream* os) {
  *os << c.name;
}

class SharedGpuZero : public ::testing::TestWithParam<ZeroCase> {};

TEST_P(SharedGpuZero, EqualsPlainDataParallelismWithAShareOfTheOptimizerState) {
  REQUIRE_GPU();
  const ZeroCase& c = GetParam();
  TempDir dir;
  const std::string flags = std::string(c.flags) + " --metrics ";
  const RunResult plain =
      run_command(c.plain_dp ? shared(c.ranks, flags + dir.file("plain.jsonl") +
                                                   " --save-weights " + dir.file("plain.st"))
                             : kGpuEnv + kTrain + kArgs + " " + flags + dir.file("plain.jsonl") +
                                   " --save-weights " + dir.file("plain.st"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const RunResult r = run_command(shared(c.ranks, flags + dir.file("zero.jsonl") + " --zero " +
                                                      std::to_string(c.zero) + " --save-weights " +
                                                      dir.file("zero.st")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("captured in a CUDA graph") != std::string::npos,
            std::string(c.flags).find("--no-cuda-graph") == std::string::npos)
      << r.output;
  const double error = max_relative_error(load_weights(dir.file("zero.st"), kLayers),
                                          load_weights(dir.file("plain.st"), kLayers));
  std::printf("%s: max relative error against %s %.3g\n", c.name,
              c.plain_dp ? "plain data parallelism" : "one GPU", error);
  EXPECT_LE(error, 1e-5) << c.name;
  // This rank's share of the optimizer state: 1/D of the plain run's, plus at most 63
  // elements of padding per bucket (four buckets) and state buffer.
  const int64_t whole = held(dir.file("plain.jsonl"), "optimizer state");
  const int64_t mine = held(dir.file("zero.jsonl"), "optimizer state");
  std::printf("%s: optimizer state %lld bytes, plain %lld\n", c.name, static_cast<long long>(mine),
              static_cast<long long>(whole));
  ASSERT_GT(whole, 0);
  const int64_t buffers = std::string(c.flags).find("adamw") != std::string::npos ? 2 : 1;
  EXPECT_GE(mine * c.replicas, whole) << c.name;
  EXPECT_LE(mine, whole / c.replicas + buffers * 4 * 63 * 4) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SharedGpuZero,
    ::testing::Values(
        ZeroCase{"zero1_dp2_sgd", 2, 2, "--optimizer sgd --momentum 0.9", 1, false},
        ZeroCase{"zero2_dp2_adamw", 2, 2, "--optimizer adamw", 2, false},
        // AdamW over three ranks, or with --accumulate, sums the gradients in another order
        // than one GPU (3.7e-5 apart after 12 steps): against plain data parallelism.
        ZeroCase{"zero2_dp3_adamw", 3, 3, "--optimizer adamw", 2, true},
        ZeroCase{"zero1_dp3_sgd", 3, 3, "--optimizer sgd --momentum 0.9", 1, false},
        ZeroCase{"zero2_dp2_adamw_accumulate2", 2, 2, "--optimizer adamw --accumulate 2", 2, true},
        ZeroCase{"zero2_dp2_pp2_adamw", 4, 2, "--optimizer adamw --pp 2", 2, true},
        // Two stages a rank: each chunk's layers sharded over the stage's replicas.
        ZeroCase{"zero2_dp2_pp2_interleaved", 4, 2,
                 "--optimizer adamw --pp 2 --schedule interleaved-1f1b --micro-batches 4", 2, true},
        ZeroCase{"zero1_dp2_bf16_adamw", 2, 2, "--optimizer adamw --precision bf16", 1, true},
        ZeroCase{"zero2_dp2_no_graph_overlap_optimizer", 2, 2,
                 "--optimizer adamw --overlap-optimizer --no-cuda-graph", 2, false},
        // Gradients reduce-scattered as bfloat16, as plain data parallelism all-reduces them
        // (two ranks: one bf16 sum an element, whatever the algorithm).
        ZeroCase{"zero1_dp2_grad_reduce_bf16", 2, 2, "--optimizer sgd --grad-reduce bf16", 1, true},
        ZeroCase{"zero2_dp2_grad_reduce_bf16", 2, 2, "--optimizer adamw --grad-reduce bf16", 2,
                 true},
        // The parameters sharded too: every layer gathered for each use.
        ZeroCase{"zero3_dp2_sgd", 2, 2, "--optimizer sgd --momentum 0.9", 3, false},
        ZeroCase{"zero3_dp2_adamw", 2, 2, "--optimizer adamw", 3, false},
        ZeroCase{"zero3_dp3_adamw", 3, 3, "--optimizer adamw", 3, true},
        ZeroCase{"zero3_dp2_pp2_adamw", 4, 2, "--optimizer adamw --pp 2", 3, true},
        ZeroCase{"zero3_dp2_pp2_zbh1_recompute", 4, 2,
                 "--optimizer adamw --pp 2 --schedule zb-h1 --recompute", 3, true},
        ZeroCase{"zero3_dp2_bf16_adamw", 2, 2, "--optimizer adamw --precision bf16", 3, true},
        ZeroCase{"zero3_dp2_accumulate2_no_graph", 2, 2,
                 "--optimizer adamw --accumulate 2 --no-cuda-graph", 3, true}),
    [](const ::testing::TestParamInfo<ZeroCase>& info) { return info.param.name; });

// --zero 3's layer gathers run on a communicator of their own (never behind a reduce-scatter)
// and --timeline shows them on each rank's gathers track: the same gathers every step, the
// graph's replays too, each overlapping the rank's compute of that step (the pass's next layer
// is gathered while the one before it computes); the forward's first layer is started by the
// schedule's kUnshard ("unshard layer 0"), the backward's first read (the last layer) being
// still held from the forward.
TEST(SharedGpuZero, LayerGathersRunBesideComputeOnACommunicatorOfTheirOwn) {
  REQUIRE_GPU();
  TempDir dir;
  const RunResult r =
      run_command(shared(2, "--optimizer adamw --zero 3 --timeline " + dir.file("t.json")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("meanwhile, on "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("a communicator of their own"), std::string::npos) << r.output;
  std::ifstream in(dir.file("t.json"));
  const nlohmann::json trace = nlohmann::json::parse(in);
  const int ranks = 2;
  std::map<int, std::string> tracks;
  // (rank, step) -> its compute spans and its gathers, [start, end)
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> compute, gathers;
  std::map<std::pair<int, int>, std::vector<std::string>> unshards;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"]] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    const int tid = e["tid"];
    const std::pair<int, int> key{tid % ranks, e["args"]["step"].get<int>()};
    const double start = e["ts"], end = start + e["dur"].get<double>();
    const std::string name = e["name"];
    if (tid / ranks == 2) {
      const bool scheduled = name.rfind("unshard layer ", 0) == 0;
      EXPECT_TRUE(scheduled || name.rfind("gather layer ", 0) == 0) << e.dump();
      gathers[key].push_back({start, end});
      if (scheduled) unshards[key].push_back(name);
    } else if (tid / ranks == 0 && (name == "forward" || name.rfind("backward layer", 0) == 0)) {
      compute[key].push_back({start, end});
    }
  }
  EXPECT_EQ(tracks[2 * ranks], "rank 0 GPU gathers");
  const int steps = 12;  // kArgs
  size_t per_step = 0;
  for (int rank = 0; rank < ranks; ++rank)
    for (int step = 1; step <= steps; ++step) {
      const auto& mine = gathers[{rank, step}];
      if (per_step == 0) per_step = mine.size();
      EXPECT_EQ(mine.size(), per_step) << "rank " << rank << " step " << step;
      const std::vector<std::string>& started = unshards[{rank, step}];
      EXPECT_EQ(started, std::vector<std::string>{"unshard layer 0"})
          << "rank " << rank << " step " << step;
      size_t overlapping = 0;
      for (const auto& [gs, ge] : mine)
        for (const auto& [cs, ce] : compute[{rank, step}])
          if (gs < ce && cs < ge) {
            ++overlapping;
            break;
          }
      EXPECT_GT(overlapping, 0u) << "rank " << rank << " step " << step;
    }
  // Four layers: at least each one's forward gather and the backward's input-gradient ones.
  EXPECT_GE(per_step, 4u);
  std::printf("--zero 3 --timeline: %zu gathers a step on each rank's gathers track\n", per_step);
}

// --zero-prefetch 2: every use of a layer has the pass's next two layers of its stage on their
// way (three gather slots); the gathers are exact copies, so the weights are bitwise those of
// one layer ahead, with one stage a rank and with two (interleaved: no prefetch crosses into
// the other stage), and the rank holds one more layer's slot of parameters.
TEST(SharedGpuZero, PrefetchingTwoLayersAheadTrainsBitwiseAsOne) {
  REQUIRE_GPU();
  const std::vector<std::pair<int, std::string>> layouts = {
      {2, "--optimizer adamw"},
      {4, "--optimizer adamw --pp 2 --schedule interleaved-1f1b --micro-batches 4"}};
  for (const auto& [ranks, layout] : layouts) {
    TempDir dir;
    const auto run = [&, ranks = ranks, layout = layout](const std::string& name, int ahead) {
      const RunResult r = run_command(shared(
          ranks, layout + " --zero 3 --zero-prefetch " + std::to_string(ahead) + " --metrics " +
                     dir.file(name + ".jsonl") + " --save-weights " + dir.file(name + ".st")));
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return r;
    };
    const RunResult one = run("one", 1);
    const RunResult two = run("two", 2);
    EXPECT_NE(one.output.find("and two gather slots of"), std::string::npos) << one.output;
    EXPECT_NE(two.output.find("and 3 gather slots of"), std::string::npos) << two.output;
    EXPECT_NE(two.output.find("the next 2 meanwhile"), std::string::npos) << two.output;
    EXPECT_EQ(load_weights(dir.file("two.st"), kLayers), load_weights(dir.file("one.st"), kLayers))
        << layout;
    const int64_t held_one = held(dir.file("one.jsonl"), "parameters");
    const int64_t held_two = held(dir.file("two.jsonl"), "parameters");
    std::printf("--zero-prefetch 2 (%s): parameters held %lld bytes, one ahead %lld\n",
                layout.c_str(), static_cast<long long>(held_two), static_cast<long long>(held_one));
    EXPECT_GT(held_two, held_one) << layout;
  }
}

// A model of many equal layers (as `large`), where backward runs once a step: with --zero 2
// the gradients live in three bucket slots and the rank's averaged pieces, not one buffer;
// with --zero 3 a rank also holds its pieces of the parameters plus two gather slots of a
// layer each (1/D of them, within each bucket's 64-element alignment, plus the layers in
// flight); the weights stay plain data parallelism's, with the step in a CUDA graph (dp 2)
// and without (dp 3).
TEST(SharedGpuZero, ManyEqualLayersHoldAShareOfTheGradientsAndParameters) {
  REQUIRE_GPU();
  std::string layers = "24";
  for (int i = 0; i < 16; ++i)
    layers += ",32";
  layers += ",6";
  const std::string args = " --device cuda --data synthetic --layers " + layers +
                           " --synthetic-samples 960 --batch-size 48 --steps 12 --log-every 4 "
                           "--quiet --seed 5 --optimizer adamw --bucket-mb 0.001 "
                           "--first-bucket-mb 0.001 --metrics ";
  for (const int ranks : {2, 3}) {
    TempDir dir;
    const std::string job =
        kSharedGpu + " --nproc-per-node " + std::to_string(ranks) + " -- " + kTrain + args;
    const RunResult plain =
        run_command(job + dir.file("plain.jsonl") + " --save-weights " + dir.file("plain.st"));
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    const std::string graph = ranks == 3 ? " --no-cuda-graph" : "";
    for (const int zero : {2, 3}) {
      const RunResult r =
          run_command(job + dir.file("zero.jsonl") + " --zero " + std::to_string(zero) +
                      " --save-weights " + dir.file("zero.st") + graph);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("zero " + std::to_string(zero) + ": the gradients in 3 bucket slots"),
                std::string::npos)
          << r.output;
      const double error = max_relative_error(load_weights(dir.file("zero.st"), layers),
                                              load_weights(dir.file("plain.st"), layers));
      const int64_t grads = held(dir.file("zero.jsonl"), "gradients");
      const int64_t plain_grads = held(dir.file("plain.jsonl"), "gradients");
      const int64_t params = held(dir.file("zero.jsonl"), "parameters");
      const int64_t plain_params = held(dir.file("plain.jsonl"), "parameters");
      std::printf(
          "zero %d dp %d%s: max relative error against plain %.3g; gradients %lld bytes (plain "
          "%lld), parameters %lld (plain %lld)\n",
          zero, ranks, graph.c_str(), error, static_cast<long long>(grads),
          static_cast<long long>(plain_grads), static_cast<long long>(params),
          static_cast<long long>(plain_params));
      EXPECT_LE(error, 1e-5);
      EXPECT_LT(grads, plain_grads);
      if (zero < 3) continue;
      EXPECT_NE(r.output.find("zero 3: this rank holds its"), std::string::npos) << r.output;
      // A 32x32 layer and its bias: 1056 floats, padded to D pieces of a multiple of 64.
      const int64_t slot = (1056 / ranks + 63) / 64 * 64 * ranks * 4;
      EXPECT_GE(params, plain_params / ranks + 2 * slot - 18 * 64 * 4);
      EXPECT_LE(params, plain_params / ranks + 2 * slot + 18 * 64 * 4);
      EXPECT_LT(params, plain_params);
    }
  }
}

// tests/support/zero_support.h's scenario, for --zero 2 and 3 through NCCL.
TEST(SharedGpuZero, CheckpointsAreThePlainFilesAndResumeIntoAnotherLayout) {
  REQUIRE_GPU();
  for (const char* zero : {"--zero 2 ", "--zero 3 "}) {
    TempDir dir;
    expect_zero_checkpoints_are_plain_and_resume(shared, kLayers, zero, dir);
  }
}

}  // namespace
}  // namespace ddp
