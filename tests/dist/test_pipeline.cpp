// Pipeline parallelism on the CPU: pp = 2 and 3 under both schedules, dp 2 x pp 2 over Gloo
// and pp = 2 under mpirun reproduce one process's weights (and its file layout); the
// engine's own count of live activations meets the 1F1B bound; a pipelined run resumes
// bitwise; evaluation runs through the pipeline; the timeline has a track per rank; bad
// layouts stop with one line naming the flag; a killed stage ends the job, named. Against one
// process within kAcrossRanksMargin, not bitwise: micro-batches add their gradients in another
// order than one batch does (tests/support/margins.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/pipeline/schedule.h"
#include "engine/pipeline/simulate.h"
#include "models/mlp.h"
#include "tests/support/metrics_support.h"
#include "tests/support/test_support.h"
#include "tests/support/weights_support.h"

namespace ddp {
namespace {

const std::string kLayers = "12,32,16,8,4";
const std::string kArgs =
    " --data synthetic --layers " + kLayers +
    " --synthetic-samples 240 --batch-size 24 --steps 12 --log-every 4 --quiet --seed 3";
const std::string kDdprun = std::string("CUDA_VISIBLE_DEVICES= ") + DDPRUN_PATH;
const std::string kTrain = DDPTRAIN_PATH;
const std::string kMpirun =
    std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + MPIRUN_PATH +
    " --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none ";

// One process's weights after the same 12 steps.
std::vector<float> one_process(const TempDir& dir) {
  const RunResult r = run_command(kTrain + kArgs + " --save-weights " + dir.file("one.st"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return load_weights(dir.file("one.st"), kLayers);
}

struct PipeCase {
  int pp;
  const char* schedule;
  int micro_batches;
};

void PrintTo(const PipeCase& c, std::ostream* os) {
  *os << "pp" << c.pp << " " << c.schedule << " x" << c.micro_batches;
}

class PipelineStages : public ::testing::TestWithParam<PipeCase> {};

TEST_P(PipelineStages, GlooMatchesOneProcessWithinTheActivationBound) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const PipeCase& c = GetParam();
  TempDir dir;
  const std::vector<float> one = one_process(dir);
  const RunResult r =
      run_command(kDdprun + " --nproc-per-node " + std::to_string(c.pp) + " -- " + kTrain + kArgs +
                  " --pp " + std::to_string(c.pp) + " --schedule " + c.schedule +
                  " --micro-batches " + std::to_string(c.micro_batches) + " --metrics " +
                  dir.file("m.jsonl") + " --save-weights " + dir.file("pp.st"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // load_weights checks the names, shapes and order of a one-process file.
  EXPECT_LE(max_relative_error(load_weights(dir.file("pp.st"), kLayers), one), kAcrossRanksMargin);
  const auto summary = events_of(dir.file("m.jsonl"), "pipeline_summary");
  ASSERT_EQ(summary.size(), 1u);
  const auto peaks = summary[0]["peak_live_activations"].get<std::vector<int>>();
  ASSERT_EQ(peaks.size(), static_cast<size_t>(c.pp));
  // What each stage's runner counted as it ran equals the simulator's count for the schedule.
  const SimResult sim = simulate_schedule(
      plan_all_ranks(*schedule_from_name(c.schedule), c.pp, c.micro_batches), c.pp, SimCosts());
  ASSERT_TRUE(sim.ok) << sim.error;
  for (int s = 0; s < c.pp; ++s) {
    EXPECT_EQ(peaks[s], sim.peak_live[s]) << "stage " << s;
    const std::string schedule = c.schedule;
    if (schedule == "1f1b") EXPECT_EQ(peaks[s], std::min(c.pp - s, c.micro_batches));
    if (schedule == "gpipe") EXPECT_EQ(peaks[s], c.micro_batches);
    if (schedule == "zb-h1") EXPECT_LE(peaks[s], c.pp);
  }
  const auto windows = events_of(dir.file("m.jsonl"), "pipeline");
  ASSERT_EQ(windows.size(), 3u);  // steps 4, 8, 12
  // The ideal is the schedule's own with equal stages: (P-1)/(M+P-1) for GPipe and 1F1B, less
  // for ZB-H1; the simulation from the window's measured costs is there beside it.
  const std::string schedule = c.schedule;
  if (schedule == "gpipe" || schedule == "1f1b")
    EXPECT_NEAR(windows[0]["ideal_bubble"].get<double>(),
                (c.pp - 1.0) / (c.micro_batches + c.pp - 1.0), 1e-12);
  if (schedule == "zb-h1" && c.micro_batches >= c.pp)
    EXPECT_LT(windows[0]["ideal_bubble"].get<double>(),
              (c.pp - 1.0) / (c.micro_batches + c.pp - 1.0));
  for (const auto& w : windows) {
    EXPECT_GT(w["bubble"].get<double>(), 0.0);
    ASSERT_TRUE(w.contains("simulated_bubble")) << w.dump();
    EXPECT_GE(w["simulated_bubble"].get<double>(), 0.0);
    EXPECT_LT(w["simulated_bubble"].get<double>(), 1.0);
    // The simulated step from the same costs: never shorter than the busiest stage's compute
    // a step (the simulation runs exactly those costs, one after another on each stage).
    ASSERT_TRUE(w.contains("simulated_step_s")) << w.dump();
    double busiest = 0;
    for (const auto& busy : w["busy_s"])
      busiest = std::max(busiest, busy.get<double>() / w["steps"].get<double>());
    EXPECT_GT(busiest, 0.0) << w.dump();
    EXPECT_GE(w["simulated_step_s"].get<double>(), busiest * (1 - 1e-9)) << w.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineStages,
                         ::testing::Values(PipeCase{2, "gpipe", 4}, PipeCase{2, "1f1b", 4},
                                           PipeCase{3, "gpipe", 6}, PipeCase{3, "1f1b", 6},
                                           PipeCase{4, "1f1b", 3}, PipeCase{3, "pairs", 3},
                                           PipeCase{2, "zb-h1", 4}, PipeCase{4, "zb-h1", 8},
                                           PipeCase{3, "zb-h1", 2}));

// Schedules with two chunks a rank (interleaved-1f1b, zb-v) on an eight-layer model, alone and
// with dp 2 (up to 8 ranks): one process's weights; what each rank held at once equals the
// simulator's count for its list; the log names every stage's rank.
struct ChunkCase {
  int dp;
  int pp;
  const char* schedule;
  int micro_batches;
};

void PrintTo(const ChunkCase& c, std::ostream* os) {
  *os << "dp" << c.dp << " pp" << c.pp << " " << c.schedule << " x" << c.micro_batches;
}

class ChunkedStages : public ::testing::TestWithParam<ChunkCase> {};

const std::string kDeepLayers = "12,16,16,16,16,16,16,16,4";

TEST_P(ChunkedStages, GlooMatchesOneProcessAndHoldsWhatTheSimulatorCounts) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const ChunkCase& c = GetParam();
  TempDir dir;
  const std::string args = kArgs + " --layers " + kDeepLayers + " --threads 1";
  ASSERT_EQ(run_command(kTrain + args + " --save-weights " + dir.file("one.st")).exit_code, 0);
  const RunResult r = run_command(
      kDdprun + " --nproc-per-node " + std::to_string(c.dp * c.pp) + " -- " + kTrain + args +
      " --dp " + std::to_string(c.dp) + " --pp " + std::to_string(c.pp) + " --schedule " +
      c.schedule + " --micro-batches " + std::to_string(c.micro_batches) + " --metrics " +
      dir.file("m.jsonl") + " --save-weights " + dir.file("pp.st") + " --timeline " +
      dir.file("t.json") + (c.dp > 1 ? " --check-replicas --bucket-mb 0.001" : ""));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LE(max_relative_error(load_weights(dir.file("pp.st"), kDeepLayers),
                               load_weights(dir.file("one.st"), kDeepLayers)),
            kAcrossRanksMargin);
  const PipelineSchedule schedule = *schedule_from_name(c.schedule);
  SimCosts gloo;  // a lane a flow, direction and peer, as Gloo's point-to-point
  gloo.lane_per_direction = gloo.lane_per_peer = true;
  const SimResult sim = simulate_plan(schedule, c.pp, 2, c.micro_batches, gloo);
  ASSERT_TRUE(sim.ok) << sim.error;
  const auto summary = events_of(dir.file("m.jsonl"), "pipeline_summary");
  ASSERT_EQ(summary.size(), 1u);
  const auto peaks = summary[0]["peak_live_activations"].get<std::vector<int>>();
  ASSERT_EQ(peaks.size(), static_cast<size_t>(c.dp * c.pp));
  for (int rank = 0; rank < c.dp * c.pp; ++rank)
    EXPECT_EQ(peaks[rank], sim.peak_live[rank / c.dp]) << "rank " << rank;
  // The timeline names the stage of each span: every rank forwards its own two.
  const nlohmann::json trace = nlohmann::json::parse(read_file(dir.file("t.json")));
  std::vector<std::set<int>> forwarded(c.dp * c.pp);
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["cat"] == "forward")
      forwarded[e["tid"].get<int>()].insert(e["args"]["stage"].get<int>());
  const std::vector<int> placement = stage_ranks(schedule, c.pp, 2);
  for (int rank = 0; rank < c.dp * c.pp; ++rank) {
    std::set<int> mine;
    for (int stage = 0; stage < 2 * c.pp; ++stage)
      if (placement[stage] == rank / c.dp) mine.insert(stage);
    EXPECT_EQ(forwarded[rank], mine) << "rank " << rank;
  }
  // Every stage of the 2P on its rank, in a loop (s mod P) or a V, as the log says.
  for (int stage = 0; stage < 2 * c.pp; ++stage) {
    const std::string head = "stage " + std::to_string(stage) + ": layers ";
    const size_t at = r.output.find(head);
    ASSERT_NE(at, std::string::npos) << r.output;
    const std::string entry = r.output.substr(at, r.output.find_first_of(";\n", at) - at);
    EXPECT_NE(entry.find(std::string(c.dp > 1 ? " on ranks " : " on rank ") +
                         std::to_string(placement[stage] * c.dp)),
              std::string::npos)
        << entry;
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, ChunkedStages,
                         ::testing::Values(ChunkCase{1, 2, "interleaved-1f1b", 4},
                                           ChunkCase{1, 4, "interleaved-1f1b", 8},
                                           ChunkCase{1, 2, "zb-v", 4}, ChunkCase{1, 4, "zb-v", 6},
                                           ChunkCase{2, 2, "interleaved-1f1b", 2},
                                           ChunkCase{2, 2, "zb-v", 3}, ChunkCase{2, 4, "zb-v", 4}));

// --recompute (activation checkpointing): bitwise the weights of the run without it, under
// every kind of schedule, while a rank holds at most one micro-batch's layer outputs a stage
// plus the inputs of what it has in flight (fewer bytes than without it where its one stage
// holds more than one micro-batch).
TEST(Pipeline, RecomputeGivesTheSameWeightsAndHoldsOnlyTheInputs) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const MlpShape shape = parse_layers(kDeepLayers);
  const int batch = 6;  // 24 / 4 micro-batches
  for (const char* name : {"1f1b", "zb-h1", "zb-v", "interleaved-1f1b"}) {
    TempDir dir;
    const PipelineSchedule schedule = *schedule_from_name(name);
    const std::string job = kDdprun + " --nproc-per-node 2 -- " + kTrain + kArgs + " --layers " +
                            kDeepLayers + " --threads 1 --pp 2 --micro-batches 4 --schedule " +
                            name + " --metrics ";
    ASSERT_EQ(run_command(job + dir.file("plain.jsonl") + " --save-weights " + dir.file("p.st"))
                  .exit_code,
              0);
    const RunResult r =
        run_command(job + dir.file("re.jsonl") + " --recompute --save-weights " + dir.file("r.st"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(load_weights(dir.file("r.st"), kDeepLayers),
              load_weights(dir.file("p.st"), kDeepLayers))
        << name;
    const auto plain = events_of(dir.file("plain.jsonl"), "pipeline_summary").at(0);
    const auto re = events_of(dir.file("re.jsonl"), "pipeline_summary").at(0);
    EXPECT_TRUE(re["recompute"].get<bool>());
    const auto live = re["peak_live_activations"].get<std::vector<int64_t>>();
    const auto bytes = re["peak_activation_bytes"].get<std::vector<int64_t>>();
    const auto plain_bytes = plain["peak_activation_bytes"].get<std::vector<int64_t>>();
    // The layout the run used: 2 x chunks stages balanced by FLOPs, placed by the schedule.
    const int chunks = schedule_chunks(schedule, 0, 2, shape.num_layers(), 4);
    std::vector<double> flops;
    for (int i = 0; i < shape.num_layers(); ++i)
      flops.push_back(double(shape.layer(i).in) * shape.layer(i).out);
    const std::vector<int> placement = stage_ranks(schedule, 2, chunks);
    const std::vector<int> bounds =
        chunks == 1 ? partition_by_cost(flops, 2) : partition_for_ranks(flops, placement);
    for (int rank = 0; rank < 2; ++rank) {
      int64_t outputs = 0, widest_input = 0;
      for (int stage = 0; stage < 2 * chunks; ++stage) {
        if (placement[stage] != rank) continue;
        for (int i = bounds[stage]; i < bounds[stage + 1]; ++i)
          outputs += int64_t{batch} * shape.layer(i).out * 4;
        widest_input = std::max<int64_t>(widest_input, shape.widths()[bounds[stage]]);
      }
      EXPECT_GT(bytes[rank], 0);
      EXPECT_LE(bytes[rank], outputs + live[rank] * batch * widest_input * 4)
          << name << " rank " << rank;
      if (chunks == 1 && live[rank] > 1)
        EXPECT_LT(bytes[rank], plain_bytes[rank]) << name << " rank " << rank;
    }
  }
}

TEST(Pipeline, ADataParallelSizeThatDoesNotFitTheWorldIsOneLine) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const RunResult r =
      run_command(kDdprun + " --nproc-per-node 4 -- " + kTrain + kArgs + " --dp 3 --pp 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("ddptrain: error: --dp 3 --pp 2: the world has 4 ranks, not dp x pp "
                          "= 6 (give --dp 2, or start 6 ranks)"),
            std::string::npos)
      << r.output;
}

TEST(Pipeline, DataParallelTimesPipelineMatchesOneProcessAndReplicasAgree) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const std::vector<float> one = one_process(dir);
  const RunResult r =
      run_command(kDdprun + " --nproc-per-node 4 -- " + kTrain + kArgs +
                  " --dp 2 --pp 2 --micro-batches 3 --check-replicas --bucket-mb 0.0005 "
                  "--first-bucket-mb 0.0002 --timeline " +
                  dir.file("t.json") + " --save-weights " + dir.file("hybrid.st"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pipeline: dp 2 x pp 2, 3 micro-batches of 4 per replica, 1f1b "
                          "schedule; stage 0: layers 0 on ranks 0,1; stage 1: layers 1-3 on "
                          "ranks 2,3"),
            std::string::npos)
      << r.output;
  EXPECT_LE(max_relative_error(load_weights(dir.file("hybrid.st"), kLayers), one),
            kAcrossRanksMargin);
  // One track per rank; every rank forwards and backwards, stages exchange, replicas reduce.
  const nlohmann::json trace = nlohmann::json::parse(read_file(dir.file("t.json")));
  std::vector<std::set<std::string>> kinds(4);
  std::vector<std::string> names(4);
  for (const auto& e : trace["traceEvents"]) {
    const int tid = e["tid"].get<int>();
    ASSERT_LT(tid, 4);
    if (e["ph"] == "X") kinds[tid].insert(e["cat"].get<std::string>());
    if (e["ph"] == "M" && e["name"] == "thread_name") names[tid] = e["args"]["name"];
  }
  EXPECT_EQ(names[2], "rank 2 (stage 1, replica 0)");
  for (int rank = 0; rank < 4; ++rank)
    for (const char* kind : {"forward", "backward", "send", "recv", "all-reduce", "optimizer"})
      EXPECT_EQ(kinds[rank].count(kind), 1u) << "rank " << rank << " lacks " << kind;
}

// ZB-H1 with data parallelism, 4 and 8 ranks: one process's weights; the timeline has each
// backward's input and weight halves apart on every rank and the replicas' reduction.
TEST(Pipeline, ZeroBubbleH1WithDataParallelismMatchesOneProcessAndShowsItsHalves) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const std::vector<float> one = one_process(dir);
  for (const int pp : {2, 4}) {
    const int world = 2 * pp;
    const RunResult r = run_command(
        kDdprun + " --nproc-per-node " + std::to_string(world) + " -- " + kTrain + kArgs +
        " --dp 2 --pp " + std::to_string(pp) + " --schedule zb-h1 --micro-batches " +
        std::to_string(pp) + " --check-replicas --bucket-mb 0.0005 --timeline " +
        dir.file("t.json") + " --save-weights " + dir.file("zb.st") + " --threads 1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LE(max_relative_error(load_weights(dir.file("zb.st"), kLayers), one), kAcrossRanksMargin)
        << "pp " << pp;
    const nlohmann::json trace = nlohmann::json::parse(read_file(dir.file("t.json")));
    std::vector<std::set<std::string>> kinds(world);
    for (const auto& e : trace["traceEvents"])
      if (e["ph"] == "X") kinds[e["tid"].get<int>()].insert(e["cat"].get<std::string>());
    for (int rank = 0; rank < world; ++rank) {
      for (const char* kind : {"forward", "backward input", "backward weight", "all-reduce"})
        EXPECT_TRUE(kinds[rank].count(kind)) << "rank " << rank << " has no " << kind;
      EXPECT_FALSE(kinds[rank].count("backward")) << "rank " << rank << ": a whole backward";
    }
  }
}

TEST(Pipeline, MpiMatchesOneProcess) {
  if (!HAVE_MPI) GTEST_SKIP() << "built without MPI";
  TempDir dir;
  const std::vector<float> one = one_process(dir);
  const RunResult r =
      run_command(kMpirun + "-np 2 " + kTrain + kArgs +
                  " --backend mpi --pp 2 --schedule gpipe --save-weights " + dir.file("mpi.st"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LE(max_relative_error(load_weights(dir.file("mpi.st"), kLayers), one), kAcrossRanksMargin);
  // Two chunks a rank, interleaved, and zb-v's V under MPI.
  for (const char* schedule : {"interleaved-1f1b", "zb-v"}) {
    const RunResult chunked =
        run_command(kMpirun + "-np 2 " + kTrain + kArgs + " --backend mpi --pp 2 --schedule " +
                    schedule + " --micro-batches 4 --save-weights " + dir.file("chunked.st"));
    ASSERT_EQ(chunked.exit_code, 0) << chunked.output;
    EXPECT_LE(max_relative_error(load_weights(dir.file("chunked.st"), kLayers), one),
              kAcrossRanksMargin)
        << schedule;
  }
  const RunResult zb = run_command(
      kMpirun + "-np 4 " + kTrain + kArgs +
      " --backend mpi --dp 2 --pp 2 --schedule zb-h1 --micro-batches 4 --save-weights " +
      dir.file("zb.st"));
  ASSERT_EQ(zb.exit_code, 0) << zb.output;
  EXPECT_LE(max_relative_error(load_weights(dir.file("zb.st"), kLayers), one), kAcrossRanksMargin);
}

TEST(Pipeline, ResumeOfAPipelinedRunIsBitwise) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  for (const std::string schedule : {"1f1b", "zb-h1", "zb-v", "interleaved-1f1b"}) {
    TempDir dir;
    const std::string job = kDdprun + " --nproc-per-node 2 -- " + kTrain + kArgs +
                            " --pp 2 --micro-batches 4 --optimizer adamw --lr 0.01 --schedule " +
                            schedule + " ";
    ASSERT_EQ(run_command(job + "--save-weights " + dir.file("straight.st")).exit_code, 0);
    // The same run stopped at step 6 (a checkpoint) and resumed.
    const std::string first =
        job + "--checkpoint-dir " + dir.file("ck") + " --checkpoint-every 6 --fail-at-step 7";
    EXPECT_NE(run_command(first).exit_code, 0);
    const RunResult r = run_command(job + "--checkpoint-dir " + dir.file("ck") +
                                    " --resume --save-weights " + dir.file("resumed.st"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
    EXPECT_EQ(read_file(dir.file("resumed.st")).size(), read_file(dir.file("straight.st")).size());
    EXPECT_EQ(load_weights(dir.file("resumed.st"), kLayers),
              load_weights(dir.file("straight.st"), kLayers))
        << schedule;
  }
}

TEST(Pipeline, EvaluationRunsThroughThePipeline) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  ASSERT_EQ(
      run_command(kTrain + kArgs + " --eval-every 4 --metrics " + dir.file("one.jsonl")).exit_code,
      0);
  const RunResult r =
      run_command(kDdprun + " --nproc-per-node 4 -- " + kTrain + kArgs +
                  " --pp 2 --micro-batches 2 --eval-every 4 --metrics " + dir.file("pp.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto one = events_of(dir.file("one.jsonl"), "eval");
  const auto pp = events_of(dir.file("pp.jsonl"), "eval");
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(pp.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(pp[i]["test_samples"], 48);
    EXPECT_NEAR(pp[i]["test_loss"].get<double>(), one[i]["test_loss"].get<double>(),
                kAcrossRanksMargin);
  }
  const auto end_one = events_of(dir.file("one.jsonl"), "end");
  const auto end_pp = events_of(dir.file("pp.jsonl"), "end");
  ASSERT_EQ(end_pp.size(), 1u);
  EXPECT_NEAR(end_pp[0]["test_loss"].get<double>(), end_one[0]["test_loss"].get<double>(),
              kAcrossRanksMargin);
}

struct BadLayout {
  const char* name;
  int ranks;
  const char* flags;
  const char* message;
};

void PrintTo(const BadLayout& c, std::ostream* os) {
  *os << c.name;
}

class PipelineBadLayouts : public ::testing::TestWithParam<BadLayout> {};

TEST_P(PipelineBadLayouts, StopWithOneLineNamingTheFlag) {
  const BadLayout& c = GetParam();
  if (c.ranks > 1 && !HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const std::string train = kTrain + kArgs + " " + c.flags;
  const RunResult r = run_command(c.ranks > 1 ? kDdprun + " --nproc-per-node " +
                                                    std::to_string(c.ranks) + " -- " + train
                                              : train);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineBadLayouts,
    ::testing::Values(
        BadLayout{"MoreStagesThanLayers", 1, "--pp 5",
                  "--pp 5: expected 1 to 4 (the number of layers of --layers 12,32,16,8,4)"},
        BadLayout{"WorldNotAMultiple", 3, "--pp 2",
                  "--pp 2: the world of 3 ranks is not a multiple of the stage count"},
        BadLayout{"BatchNotIntoMicroBatches", 1, "--pp 2 --micro-batches 5",
                  "--batch-size 24: does not divide into 5 micro-batches"},
        BadLayout{"BatchNotAmongReplicas", 4, "--pp 2 --micro-batches 8",
                  "--batch-size 24: the global batch / --micro-batches 8 must divide among the 2 "
                  "data-parallel ranks"},
        BadLayout{"PartitionGap", 1, "--pp 2 --partition 0-1,3-3", "--partition 0-1,3-3"},
        BadLayout{"PartitionStagesDiffer", 1, "--pp 3 --partition 0-1,2-3",
                  "--partition 0-1,2-3: names 2 stages but --pp is 3"},
        BadLayout{"AccumulateWithPipeline", 1, "--pp 2 --accumulate 2",
                  "--accumulate 2 with --pp 2: a pipeline accumulates over --micro-batches"},
        BadLayout{"ChunksOfAOneChunkSchedule", 1, "--pp 2 --virtual-stages 2",
                  "--virtual-stages 2: the 1f1b schedule holds one chunk of layers a rank"},
        BadLayout{"ChunksWithoutAPipeline", 1, "--virtual-stages 2",
                  "--virtual-stages 2: chunks of a pipeline; they need --pp 2 or more"},
        BadLayout{"MoreChunksThanLayers", 1,
                  "--pp 2 --schedule interleaved-1f1b --virtual-stages 3",
                  "--pp 2 --virtual-stages 3: 6 stages of layers, but the model has 4 layers"},
        BadLayout{"InterleavedMicroBatchesNotInGroups", 1,
                  "--pp 2 --schedule interleaved-1f1b --micro-batches 3",
                  "--micro-batches 3: the interleaved-1f1b schedule takes micro-batches in "
                  "groups of the 2 pipeline ranks; give a multiple of 2"},
        BadLayout{"ZeroBubbleVWithThreeChunks", 1, "--pp 2 --schedule zb-v --virtual-stages 3",
                  "--virtual-stages 3: zb-v holds exactly 2 chunks a rank"},
        BadLayout{"PartitionOfTheChunks", 1,
                  "--pp 2 --schedule zb-v --micro-batches 4 --partition 0-1,2-3",
                  "--partition 0-1,2-3: names 2 stages but --pp is 2 with 2 chunks a rank (4 "
                  "stages)"}));

TEST(Pipeline, KilledStageIsNamedAndTheOthersStopWithinTheGracePeriod) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const RunResult r = run_and_signal(
      dir,
      kDdprun + " --nproc-per-node 3 --grace-period 2 -- " + kTrain +
          " --data synthetic --layers 12,32,16,4 --synthetic-samples 240 --batch-size 24 "
          "--pp 3 --steps 100000000 --log-every 20 --threads 1 --timeout 60",
      "step 40/", 1, "KILL");
  EXPECT_NE(r.output.find("rank 1 failed first: killed by SIGKILL (9)"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("LEFT BEHIND"), std::string::npos) << r.output;
  EXPECT_LT(stopped_after(r.output), 2.0 + 3.0) << r.output;
}

// A stage that stops (SIGSTOP: alive, silent) is named by its neighbours once
// --timeout passes (in dp x pp also by its world rank), and ddprun ends the job.
TEST(Pipeline, StoppedStageIsNamedByItsNeighboursWithinTheTimeout) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const double timeout = 3, grace = 2;
  const RunResult r = run_and_signal(
      dir,
      kDdprun + " --nproc-per-node 3 --grace-period 2 -- " + kTrain +
          " --data synthetic --layers 12,32,16,4 --synthetic-samples 240 --batch-size 24 "
          "--pp 3 --steps 100000000 --log-every 20 --threads 1 --timeout 3",
      "step 40/", 1, "STOP");
  // Rank 1 stops wherever it is: its neighbours wait either on a transfer from it (named as
  // the peer) or in the step's world all-reduce (named as the rank that never reached it);
  // which, depends on how far it got before the signal (seen under load).
  const bool as_peer =
      r.output.find("from rank 1 (point-to-point #") != std::string::npos &&
      r.output.find("the peer (rank 1 of that group) is stopped, dead or behind") !=
          std::string::npos;
  const bool as_missing = r.output.find("rank(s) 1 never reached it") != std::string::npos;
  EXPECT_TRUE(as_peer || as_missing) << r.output;
  EXPECT_EQ(r.output.find("ddprun exit 0"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("LEFT BEHIND"), std::string::npos) << r.output;
  EXPECT_LT(stopped_after(r.output), timeout + grace + 5.0) << r.output;
}

TEST(Pipeline, StoppedStageOfAHybridJobIsNamedByItsWorldRank) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  // dp 2 x pp 2: world rank 3 is stage 1 of replica 1, rank 1 of its pipeline group.
  const RunResult r = run_and_signal(
      dir,
      kDdprun + " --nproc-per-node 4 --grace-period 2 -- " + kTrain +
          " --data synthetic --layers 12,32,16,4 --synthetic-samples 240 --batch-size 24 "
          "--pp 2 --micro-batches 4 --steps 100000000 --log-every 20 --threads 1 --timeout 3",
      "step 40/", 3, "STOP");
  // The first rank to give up names world rank 3: as its pipeline peer, as missing from its
  // stage's data-parallel all-reduce ("3 (rank 1 of group") or from a world collective; or it
  // names rank 2, held up behind 3, as its peer (which rank gives up first depends on where
  // each was when 3 stopped; the naming itself is tested in StuckRanks.*).
  const bool named =
      r.output.find("of that group, world rank 3) is stopped") != std::string::npos ||
      r.output.find("of that group, world rank 2) is stopped") != std::string::npos ||
      r.output.find("rank(s) 3 (rank 1 of group") != std::string::npos ||
      r.output.find("rank(s) 3 never reached it") != std::string::npos ||
      r.output.find(", 3 never reached it") != std::string::npos;  // with one held up behind it
  EXPECT_TRUE(named) << r.output;
  EXPECT_EQ(r.output.find("ddprun exit 0"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("LEFT BEHIND"), std::string::npos) << r.output;
  EXPECT_LT(stopped_after(r.output), 3.0 + 2.0 + 5.0) << r.output;
}

// A non-finite gradient on any stage is every stage's decision: all stop (nothing written),
// or with --on-nonfinite skip-step all skip the same steps.
TEST(Pipeline, NonFiniteGradientStopsOrSkipsOnEveryStageAlike) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const std::string job = kDdprun + " --nproc-per-node 2 -- " + kTrain + kArgs +
                          " --pp 2 --lr 1e8 --save-weights " + dir.file("w.st");
  const RunResult stopped = run_command(job);
  EXPECT_EQ(stopped.exit_code, 1) << stopped.output;
  EXPECT_NE(stopped.output.find("[rank 0] ddptrain: error: step "), std::string::npos)
      << stopped.output;
  EXPECT_NE(stopped.output.find("[rank 1] ddptrain: error: step "), std::string::npos)
      << stopped.output;
  EXPECT_EQ(count_of(stopped.output, ": non-finite gradient"),
            count_of(stopped.output, "ddptrain: error:"))
      << stopped.output;
  EXPECT_TRUE(read_file(dir.file("w.st")).empty());
  // More skipped steps than a window allows (a tenth of --log-every 4: none) stop the run on
  // every stage, with no weights written.
  const RunResult too_many = run_command(job + " --on-nonfinite skip-step");
  EXPECT_EQ(too_many.exit_code, 1) << too_many.output;
  for (const std::string rank : {"[rank 0]", "[rank 1]"})
    EXPECT_NE(too_many.output.find(rank + " ddptrain: error: steps up to 4: 2 of the last 4 steps "
                                          "were skipped (non-finite gradients), more than "
                                          "--max-skipped-steps 0"),
              std::string::npos)
        << too_many.output;
  EXPECT_TRUE(read_file(dir.file("w.st")).empty());
  const RunResult skipped = run_command(job + " --on-nonfinite skip-step --max-skipped-steps 4 " +
                                        "--metrics " + dir.file("m.jsonl"));
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  const auto records = events_of(dir.file("m.jsonl"), "skipped_step");
  EXPECT_FALSE(records.empty());
  // Both stages skipped the same steps: each warns once per skipped step (ddprun's "[rank N]"
  // names the rank; the line itself names the device only).
  const auto warnings = [&](const std::string& rank) {
    int n = 0;
    std::istringstream lines(skipped.output);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind(rank, 0) == 0 &&
          line.find("] [cpu] warning: skipping step") != std::string::npos)
        ++n;
    return n;
  };
  EXPECT_EQ(warnings("[rank 0] "), warnings("[rank 1] ")) << skipped.output;
  EXPECT_EQ(warnings("[rank 0] "), static_cast<int>(records.size())) << skipped.output;
}

}  // namespace
}  // namespace ddp
