// Multi-rank GPU paths on one GPU (ddprun --share-gpu: each rank its own NCCL host, NCCL
// over sockets): every collective against closed-form values, sub-groups, the straggler
// message, data parallelism equal to one rank, checkpoint resume, mpirun with NCCL, a rank
// killed or stopped mid-run; and the duplicate-GPU check without --share-gpu. Each test
// skips, saying why, where no GPU is usable. Slow by design; never a performance figure.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/loop/checkpoint.h"
#include "models/mlp.h"
#include "models/safetensors.h"
#include "tests/support/gpu_support.h"
#include "tests/support/metrics_support.h"
#include "tests/support/shared_gpu.h"
#include "tests/support/test_support.h"
#include "tests/support/weights_support.h"

namespace ddp {
namespace {

const std::string& kEnv = kGpuEnv;
const std::string& kShared = kSharedGpu;
const std::string kTrain = DDPTRAIN_PATH;
const std::string kLayers = "24,64,32,6";
const std::string kArgs = " --device cuda --data synthetic --layers " + kLayers +
                          " --synthetic-samples 960 --batch-size 48 --steps 24 --log-every 8 "
                          "--quiet --seed 5 --bucket-mb 0.004 --first-bucket-mb 0.001";

const std::string kLongRun =
    " --device cuda --data synthetic --layers 24,64,6 --synthetic-samples 960 --batch-size 48 "
    "--steps 1000000 --log-every 20";

class SharedGpuCollectives : public ::testing::TestWithParam<int> {};

TEST_P(SharedGpuCollectives, EveryOperationAndDtypeMatchesClosedForm) {
  REQUIRE_GPU();
  const int ranks = GetParam();
  const RunResult r = run_command(kShared + " --nproc-per-node " + std::to_string(ranks) + " -- " +
                                  CHECK_PATH + " nccl all");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "collectives ok: nccl"), ranks) << r.output;
  EXPECT_EQ(r.output.find("MISMATCH"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("NCCL traffic goes through sockets"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Ranks, SharedGpuCollectives, ::testing::Values(2, 3));

TEST(SharedGpu, StragglerIsNamedWithinItsDeadline) {
  REQUIRE_GPU();
  const RunResult r = run_command(kShared + " --nproc-per-node 3 --grace-period 2 -- " +
                                  CHECK_PATH + " nccl straggler");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 40.0) << "the job hung\n" << r.output;
  EXPECT_NE(r.output.find("all_reduce #1 (10 x float32, 40 bytes)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank(s) 1 never reached it"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("returned without rank 1"), std::string::npos) << r.output;
}

TEST(SharedGpu, MpirunWithNccl) {
  REQUIRE_GPU();
  if (!HAVE_MPI) GTEST_SKIP() << "built without MPI";
  const RunResult r = run_command(
      kEnv + "DDP_SHARE_GPU=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
      MPIRUN_PATH +
      " --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism "
      "none -np 2 " +
      CHECK_PATH + " nccl all");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "collectives ok: nccl"), 2) << r.output;
}

// The one-process run of kArgs, the data-parallel tests' reference; its weights to `file`.
void run_one_rank(const std::string& file) {
  const RunResult one = run_command(kEnv + kTrain + kArgs + " --save-weights " + file);
  ASSERT_EQ(one.exit_code, 0) << one.output;
}

class SharedGpuDataParallel : public ::testing::TestWithParam<int> {};

TEST_P(SharedGpuDataParallel, EqualsOneRankWithBucketsOverlapAndGraphs) {
  REQUIRE_GPU();
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(run_one_rank(dir.file("one.safetensors")));
  const int ranks = GetParam();
  const RunResult r = run_command(kShared + " --nproc-per-node " + std::to_string(ranks) + " -- " +
                                  kTrain + kArgs + " --metrics " + dir.file("dp.jsonl") +
                                  " --save-weights " + dir.file("dp.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data parallel over " + std::to_string(ranks) + " GPUs (nccl)"),
            std::string::npos)
      << r.output;
  EXPECT_LE(max_relative_error(load_weights(dir.file("dp.safetensors"), kLayers),
                               load_weights(dir.file("one.safetensors"), kLayers)),
            1e-5);
}

INSTANTIATE_TEST_SUITE_P(Ranks, SharedGpuDataParallel, ::testing::Values(2, 3));

// --grad-reduce bf16: the gradients cross as bfloat16, so the weights leave one rank's by
// rounding (more than float32's 1e-5: proof that bf16 was sent) but stay close to them.
TEST(SharedGpuDataParallel, GradientsReducedInBf16StayCloseToOneRank) {
  REQUIRE_GPU();
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(run_one_rank(dir.file("one.safetensors")));
  for (const std::string graph : {"", " --no-cuda-graph"}) {
    const RunResult r =
        run_command(kShared + " --nproc-per-node 2 -- " + kTrain + kArgs + graph +
                    " --grad-reduce bf16 --save-weights " + dir.file("bf16.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("gradients reduced in bf16"), std::string::npos) << r.output;
    const double error = max_relative_error(load_weights(dir.file("bf16.safetensors"), kLayers),
                                            load_weights(dir.file("one.safetensors"), kLayers));
    std::printf("--grad-reduce bf16%s, 2 ranks: max relative error against one rank %.3g\n",
                graph.c_str(), error);
    EXPECT_GT(error, 1e-5) << graph;
    EXPECT_LT(error, 5e-2) << graph;
  }
}

// --nccl-symmetric: the gradients (and bf16's wire copy) in NCCL's window memory, registered
// with the data-parallel communicator; each average a sum then a scaling by 1 / ranks. On 2
// ranks (a power of two) that is the plain average bit for bit, with and without the CUDA
// graph, fp32 and bf16 on the wire; on 3 the last bits may differ (sum then divide against
// NCCL's pre-divided sum), so within float rounding. A missing or doubled scaling would move
// the weights by far more. (Sharing one GPU, NCCL keeps the windows for its zero-copy paths; its
// symmetric kernels need GPUs over NVLink: scripts/device-check.sh levers compares the weights
// there.)
TEST(SharedGpuDataParallel, SymmetricWindowsGiveThePlainAverage) {
  REQUIRE_GPU();
  TempDir dir;
  for (const std::string variant : {"", " --no-cuda-graph", " --grad-reduce bf16"}) {
    for (const int ranks : {2, 3}) {
      if (ranks == 3 && variant != "") continue;
      const std::string run = kShared + " --nproc-per-node " + std::to_string(ranks) + " -- " +
                              kTrain + kArgs + variant + " --save-weights ";
      const RunResult plain = run_command(run + dir.file("plain.safetensors"));
      ASSERT_EQ(plain.exit_code, 0) << plain.output;
      const RunResult windows =
          run_command(run + dir.file("windows.safetensors") + " --nccl-symmetric");
      ASSERT_EQ(windows.exit_code, 0) << windows.output;
      EXPECT_NE(windows.output.find("from NCCL symmetric windows"), std::string::npos)
          << windows.output;
      const std::vector<float> got = load_weights(dir.file("windows.safetensors"), kLayers);
      const std::vector<float> want = load_weights(dir.file("plain.safetensors"), kLayers);
      if (ranks == 2)
        EXPECT_TRUE(got == want) << variant << ": max relative error "
                                 << max_relative_error(got, want);
      else
        EXPECT_LT(max_relative_error(got, want), 1e-5) << variant;
    }
  }
  // One process reduces nothing: said, not silently ignored.
  const RunResult alone = run_command(kEnv + kTrain + kArgs + " --nccl-symmetric");
  EXPECT_EQ(alone.exit_code, 0) << alone.output;
  EXPECT_NE(alone.output.find("--nccl-symmetric: one replica of each stage"), std::string::npos)
      << alone.output;
}

TEST(SharedGpu, CheckpointResumeIsBitwise) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string job = kShared + " --nproc-per-node 2 -- " + kTrain + kArgs +
                          " --lr-schedule constant --optimizer adamw --lr 0.01";
  const RunResult straight =
      run_command(job + " --save-weights " + dir.file("straight.safetensors"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const std::string ckpt = " --checkpoint-dir " + dir.file("ckpt") + " --resume";
  const RunResult first = run_command(job + ckpt + " --steps 10");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const RunResult second =
      run_command(job + ckpt + " --save-weights " + dir.file("resumed.safetensors"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
  EXPECT_EQ(load_weights(dir.file("resumed.safetensors"), kLayers),
            load_weights(dir.file("straight.safetensors"), kLayers));
}

TEST(SharedGpu, KilledRankIsNamedAndTheOthersStopWithinTheGracePeriod) {
  REQUIRE_GPU();
  TempDir dir;
  const double grace = 3;
  const RunResult r = run_and_signal(
      dir,
      kShared + " --nproc-per-node 3 --grace-period 3 -- " + kTrain + kLongRun + " --timeout 60",
      "step 40/", 1, "KILL");
  EXPECT_NE(r.output.find("rank 1 failed first: killed by SIGKILL (9)"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("LEFT BEHIND"), std::string::npos) << r.output;
  EXPECT_LT(stopped_after(r.output), grace + 3.0) << r.output;
}

TEST(SharedGpu, StoppedRankDuringGraphReplayMakesTheOthersFailWithinTheTimeout) {
  REQUIRE_GPU();
  TempDir dir;
  const double timeout = 4, grace = 2;
  const RunResult r = run_and_signal(
      dir,
      kShared + " --nproc-per-node 3 --grace-period 2 -- " + kTrain + kLongRun + " --timeout 4",
      "step 40/", 2, "STOP");
  EXPECT_NE(r.output.find("training step #"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no progress on this GPU"), std::string::npos) << r.output;
  // Rank 2 is named; rank 1 may be named beside it: its host can still be waiting on a step
  // whose collectives rank 2 never joined, so it has not reached this one either (seen once).
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(rank\(s\) (1, )?2 never reached it)")))
      << r.output;
  EXPECT_NE(r.output.find("ddprun exit 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("LEFT BEHIND"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("core dumped"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  EXPECT_LT(stopped_after(r.output), timeout + grace + 5.0) << r.output;
}

class DivergedGpuRun : public ::testing::TestWithParam<int> {};

TEST_P(DivergedGpuRun, StopsOnEveryRankAndKeepsTheGoodCheckpoint) {
  REQUIRE_GPU();
  TempDir dir;
  const int ranks = GetParam();
  const std::string launch =
      ranks == 1 ? kEnv + kTrain
                 : kShared + " --nproc-per-node " + std::to_string(ranks) + " -- " + kTrain;
  const std::string run = launch +
                          " --device cuda --data synthetic --layers 64,128,8 --checkpoint-every 50 "
                          "--quiet --timeout 30 --checkpoint-dir " +
                          dir.file("ckpt") + " --resume";
  const RunResult good = run_command(run + " --steps 100");
  ASSERT_EQ(good.exit_code, 0) << good.output;
  const std::string before = read_file(dir.file("ckpt/latest.safetensors"));
  const RunResult r =
      run_command(run + " --steps 300 --lr 1e30 --save-weights " + dir.file("w.safetensors"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 25.0) << "a rank hung\n" << r.output;
  EXPECT_NE(r.output.find("non-finite"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopped before"), std::string::npos) << r.output;
  EXPECT_TRUE(read_file(dir.file("ckpt/latest.safetensors")) == before) << "checkpoint replaced";
  EXPECT_FALSE(std::ifstream(dir.file("w.safetensors")).good());
}

INSTANTIATE_TEST_SUITE_P(Ranks, DivergedGpuRun, ::testing::Values(1, 2));

TEST(GpuRun, EvalEveryLogsTheTestSplitMidRunWithoutDisturbingTraining) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string run = kEnv + kTrain + kArgs + " --metrics ";
  ASSERT_EQ(run_command(run + dir.file("plain.jsonl") + " --save-weights " +
                        dir.file("plain.safetensors"))
                .exit_code,
            0);
  const RunResult r = run_command(run + dir.file("eval.jsonl") + " --eval-every 8 --save-weights " +
                                  dir.file("eval.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string metrics = read_file(dir.file("eval.jsonl"));
  EXPECT_EQ(count_of(metrics, "\"event\":\"eval\""), 3) << metrics;  // steps 8, 16, 24
  // Evaluating between steps changes nothing of the training.
  EXPECT_EQ(load_weights(dir.file("eval.safetensors"), kLayers),
            load_weights(dir.file("plain.safetensors"), kLayers));
}

// The GPU trains as the CPU does, through the same loop: the same samples in the same order
// and the same learning rate at every step, although the GPU takes a chunk of steps at once
// (--log-every 7 cuts chunks of 7, --eval-every 5 and --checkpoint-every 9 cut them again) and
// the CPU one at a time; fp32 weights after 40 steps within float rounding of the CPU's, SGD
// and AdamW, on the cosine schedule (so that a step run with another step's rate shows).
TEST(GpuRun, TrainsAsTheCpuDoes) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string common =
      " --data synthetic --layers 24,64,32,6 --synthetic-samples 960 --batch-size 48 --steps 40 "
      "--log-every 7 --eval-every 5 --checkpoint-every 9 --seed 5 --quiet --precision fp32";
  for (const std::string optimizer : {"sgd", "adamw"}) {
    for (const std::string device : {"cpu", "cuda"}) {
      // (a checkpoint folder each: a second run in one would be refused without --resume)
      const RunResult r =
          run_command(kEnv + kTrain + common + " --optimizer " + optimizer +
                      (optimizer == "adamw" ? " --lr 0.005" : "") + " --device " + device +
                      " --checkpoint-dir " + dir.file(device + "-" + optimizer + "-ckpt") +
                      " --save-weights " + dir.file(device + ".safetensors"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    const double error =
        max_relative_error(load_weights(dir.file("cuda.safetensors"), "24,64,32,6"),
                           load_weights(dir.file("cpu.safetensors"), "24,64,32,6"));
    std::printf("--optimizer %s: GPU against CPU after 40 steps, max relative error %.3g\n",
                optimizer.c_str(), error);
    EXPECT_LT(error, 1e-5) << optimizer;  // measured 1.4e-07 (SGD), 1.6e-07 (AdamW)
  }
}

// --fused-step=force: checked at start against the usual step and, where its update agrees,
// used (the log says so with both steps' times); 40 steps then give the usual step's weights
// within the GPU's tolerance against the CPU, in fp32 and (looser, bf16 rounding) bf16; where
// the model does not fit it (AdamW), the log says why and the usual step trains. --fused-step
// alone uses it only where it is the faster, by the times it logs.
TEST(GpuRun, FusedStepIsCheckedAndTrainsAsTheUsualStep) {
  REQUIRE_GPU();
  TempDir dir;
  for (const auto& [precision, tolerance] :
       std::vector<std::pair<std::string, double>>{{"fp32", 1e-4}, {"bf16", 6e-2}}) {
    const std::string run =
        kEnv + kTrain + kArgs + " --precision " + precision + " --save-weights ";
    const RunResult usual = run_command(run + dir.file("usual.st"));
    ASSERT_EQ(usual.exit_code, 0) << usual.output;
    const RunResult fused = run_command(run + dir.file("fused.st") + " --fused-step=force");
    ASSERT_EQ(fused.exit_code, 0) << fused.output;
    EXPECT_NE(fused.output.find("--fused-step: the whole step as one kernel"), std::string::npos)
        << fused.output;
    EXPECT_NE(fused.output.find("optimizer in the fused step"), std::string::npos) << fused.output;
    const double error = max_relative_error(load_weights(dir.file("fused.st"), kLayers),
                                            load_weights(dir.file("usual.st"), kLayers));
    std::printf("--fused-step %s: max relative error against the usual step after the run %.3g\n",
                precision.c_str(), error);
    EXPECT_LT(error, tolerance) << precision;
  }
  const RunResult timed = run_command(kEnv + kTrain + kArgs + " --fused-step");
  ASSERT_EQ(timed.exit_code, 0) << timed.output;
  const std::regex times(
      "--fused-step: (not used: )?.*?([0-9]+\\.[0-9]) us a step against ([0-9]+\\.[0-9]) us for "
      "the usual one");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(timed.output, m, times)) << timed.output;
  EXPECT_EQ(!m[1].matched, std::stod(m[2]) < std::stod(m[3])) << timed.output;
  const RunResult adamw =
      run_command(kEnv + kTrain + kArgs + " --fused-step --optimizer adamw --lr 0.005");
  ASSERT_EQ(adamw.exit_code, 0) << adamw.output;
  EXPECT_NE(
      adamw.output.find("--fused-step: not used: it does not take an optimizer other than SGD"),
      std::string::npos)
      << adamw.output;
}

// --autotune alone: the fused step is tried where the model fits it and used only where it
// is faster; the log gives both times and the choice follows them; the choice is kept, so the
// next run takes it from the cache (and says so) and ends with bitwise the same weights; either
// way the weights are the usual step's within the GPU's tolerance.
TEST(GpuRun, AutotuneUsesTheFusedStepWhereItIsFaster) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string run = kEnv + "DDP_CACHE_DIR=" + dir.file("cache") + " " + kTrain + kArgs +
                          " --precision fp32 --save-weights ";
  const RunResult usual = run_command(run + dir.file("usual.st"));
  ASSERT_EQ(usual.exit_code, 0) << usual.output;
  const RunResult first = run_command(run + dir.file("first.st") + " --autotune");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::regex timed(
      "--autotune: the fused step: (.*?)([0-9]+\\.[0-9]) us a step against ([0-9]+\\.[0-9]) us for "
      "the usual "
      "one.*; (used|the usual step)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(first.output, m, timed)) << first.output;
  const double fused_us = std::stod(m[2]), usual_us = std::stod(m[3]);
  const bool used = m[4] == "used";
  std::printf("--autotune: fused step %.1f us, usual step %.1f us: %s\n", fused_us, usual_us,
              used ? "fused" : "usual");
  EXPECT_EQ(used, fused_us < usual_us) << first.output;
  EXPECT_EQ(used, m[1].str().find("not used") == std::string::npos) << first.output;
  const RunResult second = run_command(run + dir.file("second.st") + " --autotune");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const std::regex kept("--autotune: the fused step: (not used: )?.*the choice kept in " +
                        dir.file("cache") + ".*; (used|the usual step)");
  ASSERT_TRUE(std::regex_search(second.output, m, kept)) << second.output;
  EXPECT_EQ(m[1].matched, !used) << second.output;
  EXPECT_EQ(m[2] == "used", used) << second.output;
  EXPECT_EQ(load_weights(dir.file("first.st"), kLayers),
            load_weights(dir.file("second.st"), kLayers));
  EXPECT_LT(max_relative_error(load_weights(dir.file("first.st"), kLayers),
                               load_weights(dir.file("usual.st"), kLayers)),
            1e-4);
}

// --profile-steps opens the CUDA profiler's capture range before its first step and closes it
// after its last, leaving the weights as a run without it has them; a range past the run's
// end is refused. Under Nsight Systems, where the machine has it, the report holds kernels.
TEST(GpuRun, ProfileStepsOpensAndClosesTheCaptureRange) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string run = kEnv + kTrain + kArgs + " --save-weights ";
  const RunResult plain = run_command(run + dir.file("plain.st"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const RunResult r = run_command(run + dir.file("profiled.st") + " --profile-steps 10-12");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(
                "--profile-steps 10-12: the CUDA profiler's capture range opens before step 10"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--profile-steps 10-12: the capture range closes after step 12"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(load_weights(dir.file("profiled.st"), kLayers),
            load_weights(dir.file("plain.st"), kLayers));
  const RunResult past = run_command(kEnv + kTrain + kArgs + " --profile-steps 20-30");
  EXPECT_EQ(past.exit_code, 2) << past.output;
  EXPECT_NE(past.output.find("--profile-steps 20-30: the run has 24 steps"), std::string::npos)
      << past.output;
  if (run_command("command -v nsys").exit_code != 0) {
    std::printf("no nsys on PATH: the capture under Nsight Systems not tried\n");
    return;
  }
  const RunResult nsys =
      run_command(kEnv +
                  "nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop -t cuda "
                  "--cuda-graph-trace=node --force-overwrite true -o " +
                  dir.file("p") + " " + kTrain + kArgs + " --profile-steps 10-12");
  ASSERT_EQ(nsys.exit_code, 0) << nsys.output;
  const RunResult stats =
      run_command("nsys stats --report cuda_gpu_kern_sum --format csv " + dir.file("p.nsys-rep"));
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_NE(stats.output.find("Instances"), std::string::npos) << stats.output;
}

// A checkpoint whose optimizer took fewer steps than the run did (as after steps skipped by
// --on-nonfinite skip-step) resumes on the GPU with the optimizer's own step count, as the
// CPU does: AdamW's bias corrections (and SGD's first step) follow the optimizer, not the
// training step. The two counts differed on the GPU's plain path before (its chunked
// scalars were computed from the training step).
TEST(GpuRun, ResumeFollowsTheOptimizersOwnStepCountAsTheCpuDoes) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string layers = "24,64,32,6";
  const std::string common = " --data synthetic --layers " + layers +
                             " --synthetic-samples 960 --batch-size 48 --seed 5 --quiet "
                             "--precision fp32 --optimizer adamw --lr 0.005 --lr-schedule constant";
  ASSERT_EQ(run_command(kEnv + kTrain + common + " --steps 10 --checkpoint-dir " + dir.file("a"))
                .exit_code,
            0);
  // The same weights and state, but 6 optimizer steps in 10 training steps.
  const MlpShape shape = parse_layers(layers);
  RunSettings settings;
  settings.seed = 5;
  settings.data = "synthetic";
  settings.synthetic_samples = 960;
  Checkpoint c =
      load_checkpoint(dir.file("a/latest.safetensors"), shape, OptimizerKind::kAdamW, 48, settings);
  ASSERT_EQ(c.optimizer_steps, 10);
  c.optimizer_steps = 6;
  for (const std::string device : {"cpu", "cuda"})
    save_checkpoint(dir.file(device), shape, c);
  for (const std::string device : {"cpu", "cuda"}) {
    const RunResult r = run_command(kEnv + kTrain + common + " --steps 20 --resume --device " +
                                    device + " --checkpoint-dir " + dir.file(device) +
                                    " --save-weights " + dir.file(device + ".safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const double error = max_relative_error(load_weights(dir.file("cuda.safetensors"), layers),
                                          load_weights(dir.file("cpu.safetensors"), layers));
  std::printf("resumed with 6 optimizer steps in 10: GPU against CPU, max relative error %.3g\n",
              error);
  EXPECT_LT(error, 1e-5);
}

// The optimizer overlapped with backward (--overlap-optimizer) updates each range of
// parameters with the same elementwise arithmetic as one pass after backward (the default):
// bitwise the same weights, on one GPU (per layer) and with two ranks (per bucket), in fp32
// and bf16, SGD and AdamW.
TEST(GpuRun, OptimizerOverlapGivesBitwiseTheWeightsOfOnePass) {
  REQUIRE_GPU();
  TempDir dir;
  for (const std::string extra : {"", " --precision bf16 --optimizer adamw --lr 0.01"}) {
    for (const std::string job : {kEnv + kTrain, kShared + " --nproc-per-node 2 -- " + kTrain}) {
      const std::string run = job + kArgs + extra + " --save-weights ";
      const RunResult overlapped =
          run_command(run + dir.file("overlapped.safetensors") + " --overlap-optimizer");
      ASSERT_EQ(overlapped.exit_code, 0) << overlapped.output;
      EXPECT_NE(overlapped.output.find("optimizer overlapped with backward"), std::string::npos)
          << overlapped.output;
      const RunResult plain = run_command(run + dir.file("plain.safetensors"));
      ASSERT_EQ(plain.exit_code, 0) << plain.output;
      EXPECT_NE(plain.output.find("optimizer after backward"), std::string::npos) << plain.output;
      EXPECT_EQ(load_weights(dir.file("overlapped.safetensors"), kLayers),
                load_weights(dir.file("plain.safetensors"), kLayers))
          << job << extra;
    }
  }
}

// --timeline on the GPU: per step a forward, every layer's backward and the optimizer on
// each rank's track, and with two ranks every bucket's all-reduce on a communication track,
// inside its step; the same with and without the CUDA graph.
TEST(GpuRun, TimelineHasEveryLayerAndBucketOfEveryStep) {
  REQUIRE_GPU();
  TempDir dir;
  for (const std::string graph : {"", " --no-cuda-graph"}) {
    for (int ranks : {1, 2}) {
      const std::string job =
          ranks == 1 ? kEnv + kTrain : kShared + " --nproc-per-node 2 -- " + kTrain;
      const RunResult r = run_command(job + kArgs + graph + " --timeline " + dir.file("t.json"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      std::ifstream in(dir.file("t.json"));
      const nlohmann::json trace = nlohmann::json::parse(in);
      std::map<std::string, int> bars;  // name -> count
      std::map<int, std::string> tracks;
      double forward_end = 0, last_reduce_end = 0;
      for (const auto& e : trace["traceEvents"]) {
        if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"]] = e["args"]["name"];
        if (e["ph"] != "X") continue;
        ++bars[e["name"].get<std::string>()];
        EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
        if (e["args"]["step"] == 10 && e["tid"] == 0 && e["name"] == "forward")
          forward_end = e["ts"].get<double>() + e["dur"].get<double>();
        if (e["args"]["step"] == 10 && e["tid"] == ranks)
          last_reduce_end =
              std::max(last_reduce_end, e["ts"].get<double>() + e["dur"].get<double>());
      }
      const int steps = 24;  // kArgs
      EXPECT_EQ(bars["forward"], steps * ranks) << graph;
      EXPECT_EQ(bars["optimizer"], steps * ranks) << graph;
      for (int layer = 0; layer < 3; ++layer)
        EXPECT_EQ(bars["backward layer " + std::to_string(layer)], steps * ranks) << graph;
      if (ranks == 2) {
        EXPECT_EQ(tracks[2], "rank 0 GPU communication") << graph;
        EXPECT_GE(bars["all-reduce bucket 0"], steps * ranks) << graph;
        EXPECT_GT(last_reduce_end, forward_end) << graph;  // the reductions follow the forward
      } else {
        EXPECT_EQ(bars.count("all-reduce bucket 0"), 0u) << graph;
      }
    }
  }
}

// --autotune keeps its choices: the second run takes them from the cache (and says so),
// so it uses the same algorithms and ends with bitwise the same weights.
TEST(GpuRun, AutotuneChoicesAreKeptForTheNextRun) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string run = kEnv + "DDP_CACHE_DIR=" + dir.file("cache") + " " + kTrain + kArgs +
                          " --autotune --save-weights ";
  const RunResult first = run_command(run + dir.file("first.safetensors"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(first.output.find("autotuning, from"), std::string::npos) << first.output;
  const RunResult second = run_command(run + dir.file("second.safetensors"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("autotuning, from " + dir.file("cache") + "/autotune.json"),
            std::string::npos)
      << second.output;
  EXPECT_EQ(load_weights(dir.file("first.safetensors"), kLayers),
            load_weights(dir.file("second.safetensors"), kLayers));
}

TEST(SharedGpu, WithoutShareGpuTwoRanksOnOneGpuStayAnError) {
  REQUIRE_GPU();
  const RunResult r = run_command(kEnv + "CUDA_VISIBLE_DEVICES=0,0 " + DDPRUN_PATH +
                                  " --nproc-per-node 2 -- " + WORKER_PATH + " bind");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("two ranks on one GPU"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--share-gpu"), std::string::npos) << r.output;
}

// The GPU monitor: every window's record carries every rank's utilization and memory, the
// end has a table and a gpu_summary of every rank; --no-gpu-monitor leaves them out. (And the
// step strategy's record says the step was replayed from a CUDA graph.)
TEST(GpuMonitor, EveryRankReportsItsGpuInTheMetricsAndTheEndTable) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string run =
      " --device cuda --data synthetic --layers 256,1024,1024,10 "
      "--synthetic-samples 20000 --batch-size 256 --steps 600 --log-every 200 "
      "--metrics ";
  for (int ranks : {1, 2}) {
    const std::string metrics = dir.file("m" + std::to_string(ranks) + ".jsonl");
    const RunResult r = run_command(kShared + " --nproc-per-node " + std::to_string(ranks) +
                                    " -- " + kTrain + run + metrics);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("gpu monitor: sampling GPU-"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("GPUs over the run (NVML"), std::string::npos) << r.output;
    const auto steps = events_of(metrics, "step");
    ASSERT_EQ(steps.size(), 3u);
    for (const auto& step : steps) {
      ASSERT_TRUE(step.contains("gpu")) << step.dump();
      ASSERT_EQ(step["gpu"]["util"]["mean"].size(), static_cast<size_t>(ranks)) << step.dump();
      for (int k = 0; k < ranks; ++k) {
        const auto& util = step["gpu"]["util"]["mean"][k];
        ASSERT_TRUE(util.is_number()) << step.dump();
        EXPECT_GE(util.get<double>(), 0.0);
        EXPECT_LE(util.get<double>(), 100.0);
        EXPECT_GT(step["gpu"]["mem_used_mib"]["max"][k].get<double>(), 0.0) << step.dump();
        EXPECT_GT(step["gpu"]["mem_total_mib"][k].get<double>(), 1000.0) << step.dump();
      }
    }
    // The step strategy, once: replayed from a CUDA graph (the default on the GPU).
    const auto strategy = events_of(metrics, "step_strategy");
    ASSERT_EQ(strategy.size(), 1u);
    EXPECT_EQ(strategy[0]["graph"], true) << strategy[0].dump();
    const auto summary = events_of(metrics, "gpu_summary");
    ASSERT_EQ(summary.size(), 1u);
    for (int k = 0; k < ranks; ++k)
      EXPECT_GE(summary[0]["gpu"]["samples"][k].get<int>(), 1) << summary[0].dump();
  }
  const std::string off = dir.file("off.jsonl");
  ASSERT_EQ(run_command(kEnv + kTrain + run + off + " --no-gpu-monitor").exit_code, 0);
  for (const auto& step : events_of(off, "step"))
    EXPECT_FALSE(step.contains("gpu")) << step.dump();
  EXPECT_TRUE(events_of(off, "gpu_summary").empty());
}

// Gradient accumulation on the GPU (inside the captured graph, and without it): four
// micro-batches a step give the weights of one step on the whole batch, alone and with two
// data-parallel ranks (each taking its share of every micro-batch).
TEST(GpuAccumulate, FourMicroBatchesEqualTheWholeBatchAloneAndWithTwoRanks) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string args = " --device cuda --data synthetic --layers " + kLayers +
                           " --synthetic-samples 960 --batch-size 48 --steps 12 --log-every 4 "
                           "--quiet --seed 5 --save-weights ";
  ASSERT_EQ(run_command(kEnv + kTrain + args + dir.file("whole.st")).exit_code, 0);
  const std::vector<float> whole = load_weights(dir.file("whole.st"), kLayers);
  for (const std::string graph : {"", " --no-cuda-graph"}) {
    const RunResult alone =
        run_command(kEnv + kTrain + args + dir.file("acc.st") + " --accumulate 4" + graph);
    ASSERT_EQ(alone.exit_code, 0) << alone.output;
    const double alone_error = max_relative_error(load_weights(dir.file("acc.st"), kLayers), whole);
    EXPECT_LE(alone_error, 1e-6) << graph;
    const RunResult dp = run_command(kShared + " --nproc-per-node 2 -- " + kTrain + args +
                                     dir.file("dp.st") + " --accumulate 4" + graph);
    ASSERT_EQ(dp.exit_code, 0) << dp.output;
    const double dp_error = max_relative_error(load_weights(dir.file("dp.st"), kLayers), whole);
    EXPECT_LE(dp_error, 1e-6) << graph;
    std::printf("accumulate 4%s: max relative error alone %.3g, dp 2 %.3g\n", graph.c_str(),
                alone_error, dp_error);
  }
  const RunResult refused =
      run_command(kEnv + kTrain + args + dir.file("x.st") + " --accumulate 4 --stage-from-host");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--accumulate 4: the training set stays on the host"),
            std::string::npos)
      << refused.output;
}

}  // namespace
}  // namespace ddp
