// ddp::DistributedDataParallel on CUDA tensors (NCCL, LibTorch's current stream), with two ranks
// sharing the one GPU (ddprun --share-gpu: correct, slow): the same weights as one CUDA process
// with the same global batch, also under no_sync accumulation; bf16 reduction close to them; and
// the same model's weights on the GPU close to the CPU's; ZeRO 1, 2 and 3 bitwise plain DDP
// with a share of the optimizer state; PowerSGD exact at full rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <regex>
#include <string>

#include "tests/libtorch/torch_compare.h"
#include "tests/support/gpu_support.h"
#include "tests/support/shared_gpu.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

const std::string kWorker = WORKER_PATH;
const std::string kPipelineWorker = PIPELINE_WORKER_PATH;
const std::string kUserProgram = USER_PROGRAM_PATH;
const std::string kUnitWorker = UNIT_WORKER_PATH;

// torch::load after wrapping a module on the GPU by reference (a module on the stack and a
// holder), then the module's own forward and no sync_buffers(): the gradients' own hooks find
// the accumulators the load made, over NCCL as over Gloo (TorchUsers.TorchLoadAfterWrapping...),
// and 2 ranks sharing the GPU train as one CUDA process (TF32 off; the ranks' shares are summed
// in another order than one product over the batch: kAcrossRanksMargin).
TEST(TorchUsersCuda, TorchLoadAfterWrappingByReferenceStillReducesEveryGradient) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string start = dir.file("start.pt");
  ASSERT_EQ(run_command(kUserProgram + " --save-start " + start).exit_code, 0);
  for (const std::string model : {"stack", "holder"}) {
    const std::string flags = " --cuda --model " + model + " --load " + start;
    const std::string single = dir.file(model + "-single"), ranks = dir.file(model + "-ranks");
    const RunResult one = run_command(kGpuEnv + kUserProgram + " --single --out " + single + flags);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const RunResult two = run_command(kSharedGpu + " --nproc-per-node 2 -- " + kUserProgram +
                                      " --out " + ranks + flags);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_NE(two.output.find("got new tensors since the wrapper was made"), std::string::npos)
        << two.output;
    EXPECT_LT(max_relative_difference(ranks, single), kAcrossRanksMargin) << model;
  }
}

// ddp::Pipeline over NCCL (CUDA tensors, LibTorch's current stream): two pipeline ranks sharing
// the GPU train as one CUDA process with the whole batch, under 1f1b and zb-v (the CPU's
// margin: the micro-batches' products and sums differ from the whole batch's in order only;
// TF32 is off in LibTorch's products by default).
TEST(TorchPipelineCuda, TwoStagesSharingTheGpuTrainAsOneCudaProcess) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string flags = " --cuda --micro-batches 6 --steps 3";
  const RunResult one =
      run_command(kGpuEnv + kPipelineWorker + " --reference --out " + dir.file("ref") + flags);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  for (const std::string schedule : {"1f1b", "zb-v"}) {
    const RunResult r =
        run_command(kSharedGpu + " --nproc-per-node 2 -- " + kPipelineWorker + " --out " +
                    dir.file(schedule) + " --schedule " + schedule + flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LT(max_relative_difference_of_ranks(
                  {dir.file(schedule + ".0"), dir.file(schedule + ".1")}, dir.file("ref.0")),
              kAcrossRanksMargin)
        << schedule << "\n"
        << r.output;
  }
}

// Two replicas of a one-rank pipeline sharing the GPU: the stage's DistributedDataParallel over
// NCCL (buckets of 1 KB going out during the last micro-batch's backward on LibTorch's stream,
// waited for at the step's end) trains as one CUDA process with the whole batch, and under
// zero(3) bitwise as without.
TEST(TorchPipelineCuda, ReplicasAverageThroughTheStagesBucketsOverNccl) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string flags = " --cuda --micro-batches 4 --steps 3";
  const RunResult one =
      run_command(kGpuEnv + kPipelineWorker + " --reference --out " + dir.file("ref") + flags);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const RunResult r =
      run_command(kSharedGpu + " --nproc-per-node 2 -- " + kPipelineWorker + " --out " +
                  dir.file("dp") + " --data-parallel 2 --bucket-kb 1 --events" + flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "overlap yes"), 2) << r.output;
  EXPECT_LT(max_relative_difference_of_ranks({dir.file("dp.0")}, dir.file("ref.0")),
            kAcrossRanksMargin)
      << r.output;
  // ZeRO 3 inside the pipeline (the stage's parameters gathered over NCCL at each step's start
  // and before the evaluation): bitwise the run above.
  const RunResult z =
      run_command(kSharedGpu + " --nproc-per-node 2 -- " + kPipelineWorker + " --out " +
                  dir.file("z3") + " --data-parallel 2 --bucket-kb 1 " + "--zero 3" + flags);
  ASSERT_EQ(z.exit_code, 0) << z.output;
  EXPECT_EQ(max_relative_difference(dir.file("z3.0"), dir.file("dp.0")), 0.0) << z.output;
}

TEST(TorchDdpCuda, TwoRanksSharingTheGpuEqualOneCudaProcess) {
  REQUIRE_GPU();
  TempDir dir;
  for (const std::string flags : {"", "--accumulate 2"}) {
    const std::string single = dir.file("single.safetensors"), cpu = dir.file("cpu.safetensors");
    const RunResult one =
        run_command(kGpuEnv + kWorker + " --single --cuda --out " + single + " " + flags);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const RunResult host = run_command(kWorker + " --single --out " + cpu + " " + flags);
    ASSERT_EQ(host.exit_code, 0) << host.output;
    EXPECT_LT(max_relative_difference(single, cpu), 1e-4) << flags;  // TF32 off: fp32 products
    const std::string out = dir.file("two.safetensors");
    const RunResult r = run_command(kSharedGpu + " --nproc-per-node 2 -- " + kWorker +
                                    " --cuda --bucket-kb 2 --out " + out + " " + flags);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LT(max_relative_difference(out, single), 1e-5) << flags << "\n" << r.output;
  }
}

TEST(TorchDdpCuda, Bf16ReductionStaysCloseAndBuffersAreRankZeros) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string single = dir.file("single.safetensors"), out = dir.file("bf16.safetensors");
  ASSERT_EQ(run_command(kGpuEnv + kWorker + " --single --cuda --out " + single).exit_code, 0);
  const RunResult r =
      run_command(kSharedGpu + " --nproc-per-node 2 -- " + kWorker + " --cuda --bf16 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(max_relative_difference(out, single), 2e-2) << r.output;
  const RunResult bn = run_command(kSharedGpu + " --nproc-per-node 2 -- " + kWorker +
                                   " --cuda --batchnorm --out " + out);
  ASSERT_EQ(bn.exit_code, 0) << bn.output;
  EXPECT_EQ(batchnorm_line(bn.output, 1), batchnorm_line(bn.output, 0));
}

// ddp::SyncBatchNorm over NCCL: two ranks sharing the GPU train as one CUDA process with
// LibTorch's BatchNorm1d and the global batch (the CPU's margin: float64 statistics there too).
TEST(TorchDdpCuda, SyncBatchNormTrainsAsOneProcessWithTheGlobalBatch) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string single = dir.file("single.safetensors"), out = dir.file("sync.safetensors");
  ASSERT_EQ(
      run_command(kGpuEnv + kWorker + " --single --cuda --batchnorm --out " + single).exit_code, 0);
  const RunResult r = run_command(kSharedGpu + " --nproc-per-node 2 -- " + kWorker +
                                  " --cuda --syncbn --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(max_relative_difference(out, single), kAcrossRanksMargin) << r.output;
}

// model.join over NCCL: a rank with two batches fewer; the replicas end bitwise equal and as one
// CUDA process that left its share out of those steps.
TEST(TorchDdpCuda, JoinLetsRanksWithFewerBatchesFinishTogether) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string single = dir.file("single.safetensors");
  ASSERT_EQ(
      run_command(kGpuEnv + kWorker + " --single --cuda --short-rank 1 --ranks 2 --out " + single)
          .exit_code,
      0);
  const RunResult r =
      run_command(kSharedGpu + " --nproc-per-node 2 -- " + kWorker +
                  " --cuda --join --short-rank 1 --out " + dir.file("joined-RANK.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(max_relative_difference(dir.file("joined-0.safetensors"), single), 1e-5) << r.output;
  EXPECT_EQ(
      max_relative_difference(dir.file("joined-1.safetensors"), dir.file("joined-0.safetensors")),
      0.0);
}

// The built-in bf16 compression hook: the same collective as reduce_in_bf16, so the same
// weights.
TEST(TorchDdpCuda, Bf16CompressHookEqualsReduceInBf16) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string common = kSharedGpu + " --nproc-per-node 2 -- " + kWorker + " --cuda --out ";
  const RunResult option = run_command(common + dir.file("option.safetensors") + " --bf16");
  ASSERT_EQ(option.exit_code, 0) << option.output;
  const RunResult hook = run_command(common + dir.file("hook.safetensors") + " --hook bf16");
  ASSERT_EQ(hook.exit_code, 0) << hook.output;
  EXPECT_EQ(max_relative_difference(dir.file("hook.safetensors"), dir.file("option.safetensors")),
            0.0);
}

// PowerSGD over NCCL (its products, QR and all-reduces in LibTorch's stream order): at a rank
// as large as each gradient matrix the approximation is the exact average, so two ranks
// sharing the GPU equal one CUDA process (the CPU's margin); at rank 1 it sends under a fifth
// of the elements and fits the data set as on the CPU.
TEST(TorchDdpCuda, PowerSgdHookIsExactAtFullRankAndConvergesCompressed) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string single = dir.file("single.safetensors"), out = dir.file("full.safetensors");
  ASSERT_EQ(run_command(kGpuEnv + kWorker + " --single --cuda --out " + single).exit_code, 0);
  const std::string common =
      kSharedGpu + " --nproc-per-node 2 -- " + kWorker + " --cuda --bucket-kb 2 --hook powersgd ";
  const RunResult full = run_command(
      common + "--powersgd-start 0 --powersgd-rank 100 --powersgd-min-rate 0.01 --out " + out);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_LT(max_relative_difference(out, single), kAcrossRanksMargin) << full.output;
  const RunResult fit = run_command(common + "--powersgd-rank 1 --steps 40 --data-steps 2 --loss");
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  const size_t at = fit.output.find("rank 0 loss ");
  ASSERT_NE(at, std::string::npos) << fit.output;
  EXPECT_LT(std::stod(fit.output.substr(fit.output.find("-> ", at) + 3)), 0.2) << fit.output;
}

// ZeRO over NCCL (the owners' broadcasts on LibTorch's stream): bitwise plain DDP on 2 and 3
// ranks with AdamW, each rank's optimizer state below plain DDP's.
// Parameters of four dtypes over NCCL (bf16, fp16 and float64 all-reduces, ncclAvg): the first
// step's gradients of two ranks sharing the GPU within each dtype's rounding of one CUDA
// process's (the CPU test's margins, relative to each tensor's largest element), and the
// weights after 5 steps within bf16's margin; LibTorch's CUDA autocast to bf16 around the
// wrapper's forward trains as one CUDA process under it, within the same margin.
TEST(TorchDdpCuda, EveryFloatDtypeAndAutocastTrainAsOneCudaProcess) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string single = dir.file("single.st"), grads = dir.file("g1.st");
  const RunResult one = run_command(kGpuEnv + kWorker + " --single --cuda --dtypes --out " +
                                    single + " --grads-out " + grads);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::string out = dir.file("two.st"), two_grads = dir.file("g2.st");
  const RunResult r = run_command(kSharedGpu + " --nproc-per-node 2 -- " + kWorker +
                                  " --cuda --dtypes --out " + out + " --grads-out " + two_grads);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::map<std::string, double> margins = {
      {"embed.weight", 1.0 / 32}, {"norm.weight", 1.0 / 256}, {"norm.bias", 1.0 / 256}};
  for (const auto& [name, difference] : difference_per_tensor(two_grads, grads)) {
    const auto margin = margins.find(name);
    EXPECT_LT(difference, margin == margins.end() ? 1e-5 : margin->second) << name;
  }
  EXPECT_LT(max_relative_difference(out, single), 2e-2) << r.output;
  const std::string autocast_one = dir.file("a1.st"), autocast_two = dir.file("a2.st");
  ASSERT_EQ(run_command(kGpuEnv + kWorker + " --single --cuda --autocast --out " + autocast_one)
                .exit_code,
            0);
  const RunResult a = run_command(kSharedGpu + " --nproc-per-node 2 -- " + kWorker +
                                  " --cuda --autocast --out " + autocast_two);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_LT(max_relative_difference(autocast_two, autocast_one), 2e-2) << a.output;
}

// The wrapper sets LibTorch's stream on the world communicator only while it uses it: a stream
// the program set there before is still there after training (unused parameters marked as
// backward starts, the buckets' rebuild and SyncBatchNorm's all-reduce included); static_graph
// over NCCL trains bitwise as find_unused_parameters, and both as one CUDA process.
TEST(TorchDdpCuda, TheWorldCommunicatorKeepsTheProgramsStream) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string common = kSharedGpu + " --nproc-per-node 2 -- " + kWorker +
                             " --cuda --unused --stem 2 --bucket-kb 1 --out ";
  const RunResult r =
      run_command(common + dir.file("kept.st") + " --keep-stream --find-unused --syncbn");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const int rank : {0, 1})
    EXPECT_NE(r.output.find("rank " + std::to_string(rank) + " compute stream kept: yes"),
              std::string::npos)
        << r.output;
  const std::string single = dir.file("single.st"), found = dir.file("found.st"),
                    fixed = dir.file("static.st");
  ASSERT_EQ(run_command(kGpuEnv + kWorker + " --single --cuda --unused --stem 2 --out " + single)
                .exit_code,
            0);
  const RunResult f = run_command(common + found + " --find-unused");
  ASSERT_EQ(f.exit_code, 0) << f.output;
  const RunResult g = run_command(common + fixed + " --static-graph");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_LT(max_relative_difference(found, single), 1e-5);
  EXPECT_EQ(max_relative_difference(fixed, found), 0.0);
}

TEST(TorchDdpCuda, ZeroEveryLevelTrainsAsPlainDdp) {
  REQUIRE_GPU();
  TempDir dir;
  for (const int ranks : {2, 3}) {
    const std::string common = kSharedGpu + " --nproc-per-node " + std::to_string(ranks) + " -- " +
                               kWorker + " --cuda --deep 4 --adamw --memory --out ";
    const std::string plain = dir.file("plain.safetensors");
    const RunResult base = run_command(common + plain);
    ASSERT_EQ(base.exit_code, 0) << base.output;
    for (const int level : {1, 2, 3}) {
      const std::string out = dir.file("zero.safetensors");
      const RunResult r = run_command(common + out + " --zero " + std::to_string(level));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      // Bitwise where each element is summed in the all-reduce's order: two ranks (a + b either
      // way). Every level reduce-scatters: over NCCL with three ranks an element's three terms
      // meet in another order than in NCCL's all-reduce (5.3e-8 on an H100, 2026-12-06),
      // within the margin of another order.
      const double difference = max_relative_difference(out, plain);
      if (ranks == 2)
        EXPECT_EQ(difference, 0.0) << ranks << " ranks, zero " << level;
      else
        EXPECT_LT(difference, kAcrossRanksMargin) << ranks << " ranks, zero " << level;
      EXPECT_NE(r.output.find("owned"), std::string::npos) << r.output;
    }
  }
}

// Shard units over NCCL (ddp::ShardUnit blocks, and auto_wrap_min_params; each unit gathered
// before its forward with the next one prefetched, freed after it, gathered again for its
// backward and its gradients reduce-scattered as it ends): two ranks sharing the GPU train as
// plain DistributedDataParallel on two ranks (bitwise: NCCL's reduce-scatter and all-reduce add
// an element's two terms, a + b either way, and the products are the same kernels on the same
// shapes) and, with SGD, as one CUDA process with the whole batch within kAcrossRanksMargin
// (the batch's mean taken in shares). The bf16 policy bitwise as without units. Each process's
// peak in the CUDA caching allocator over a step (AdamW's step included) is below plain DDP's.
TEST(TorchUnitsCuda, TrainAsPlainDdpAndAsOneCudaProcess) {
  REQUIRE_GPU();
  TempDir dir;
  const auto run = [&](const std::string& name, const std::string& flags) {
    const RunResult r =
        run_command(kSharedGpu + " --nproc-per-node 2 -- " + kUnitWorker + " --cuda --peak " +
                    flags + " --out " + dir.file(name + ".safetensors"));
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    return r;
  };
  const auto apart = [&](const std::string& a, const std::string& b) {
    return max_relative_difference(dir.file(a + ".safetensors"), dir.file(b + ".safetensors"));
  };
  const RunResult one =
      run_command(kGpuEnv + kUnitWorker + " --single --cuda --out " + dir.file("one.safetensors"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  run("plain", "");
  EXPECT_LT(apart("plain", "one"), kAcrossRanksMargin);
  for (const std::string flags :
       {"--zero 3 --units", "--zero 3 --auto-wrap 1", "--zero 3 --units --keep-after-forward"}) {
    run("units", flags);
    EXPECT_EQ(apart("units", "plain"), 0.0) << flags;
  }
  const std::string adamw = "--adamw --blocks 24 --dim 1024 ";
  const RunResult plain = run("plain-adamw", adamw);
  const RunResult units = run("units-adamw", adamw + "--zero 3 --units");
  EXPECT_EQ(apart("units-adamw", "plain-adamw"), 0.0);
  const auto process_peak = [](const std::string& output) {
    const std::regex line(
        R"(rank 0 window \d+ held \d+ ledger \d+ model \d+ block \d+ optimizer \d+ process (\d+))");
    std::smatch found;
    return std::regex_search(output, found, line) ? std::stod(found[1]) : -1.0;
  };
  std::printf("peak a process: plain %.0f, units %.0f bytes\n", process_peak(plain.output),
              process_peak(units.output));
  EXPECT_GT(process_peak(units.output), 0.0) << units.output;
  EXPECT_LT(process_peak(units.output), 0.75 * process_peak(plain.output)) << units.output;
  run("whole-bf16", adamw + "--zero 3 --bf16-params");
  run("units-bf16", adamw + "--zero 3 --units --bf16-params");
  EXPECT_EQ(apart("units-bf16", "whole-bf16"), 0.0);
  EXPECT_GT(apart("units-bf16", "plain-adamw"), 0.0);  // computed in bfloat16 indeed
}

// ddp::checkpoint on the GPU (unit_worker --checkpoint: blocks with dropout checkpointed in its
// three ways): the recompute draws the same dropout masks from the CUDA generator put back, so
// that one CUDA process trains bitwise as without it, and 2 ranks sharing the GPU (NCCL) with
// shard units likewise; the activations at the peak (the CUDA caching allocator's growth over
// forward and backward, 24 blocks of 256 features on 512 x 4 tokens) under half of those
// without it, printed.
TEST(TorchCheckpointCuda, DropoutBlocksTrainBitwiseAsWithoutItWithLessActivationMemory) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string model = " --cuda --dropout 0.2 --blocks 6 --batch 8 --steps 3";
  std::map<std::string, double> window;
  for (const std::string checkpoint : {"", " --checkpoint"}) {
    const std::string tag = checkpoint.empty() ? "plain" : "ckpt";
    const RunResult one = run_command(kGpuEnv + kUnitWorker + " --single" + model + checkpoint +
                                      " --out " + dir.file("one-" + tag));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const RunResult ranks =
        run_command(kSharedGpu + " --nproc-per-node 2 -- " + kUnitWorker + model + checkpoint +
                    " --zero 3 --units --out " + dir.file("units-" + tag));
    ASSERT_EQ(ranks.exit_code, 0) << ranks.output;
    const RunResult peak = run_command(kGpuEnv + kUnitWorker +
                                       " --single --cuda --peak --dropout 0.1 --blocks 24 "
                                       "--dim 256 --batch 512 --steps 3" +
                                       checkpoint);
    ASSERT_EQ(peak.exit_code, 0) << peak.output;
    const std::regex line(R"(rank 0 window (\d+) )");
    std::smatch found;
    ASSERT_TRUE(std::regex_search(peak.output, found, line)) << peak.output;
    window[tag] = std::stod(found[1]);
  }
  EXPECT_EQ(max_relative_difference(dir.file("one-ckpt"), dir.file("one-plain")), 0.0);
  EXPECT_EQ(max_relative_difference(dir.file("units-ckpt"), dir.file("units-plain")), 0.0);
  std::printf("activations at the peak: %.0f bytes without checkpointing, %.0f with\n",
              window["plain"], window["ckpt"]);
  EXPECT_LT(window["ckpt"], 0.5 * window["plain"]);
}

}  // namespace
}  // namespace ddp
