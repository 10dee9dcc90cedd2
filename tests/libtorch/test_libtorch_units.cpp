// Shard units (zero(3) a unit at a time; torch/shard_unit.h) on the CPU (Gloo under ddprun),
// run by unit_worker: a Sequential of an embedding, a convolution, residual blocks of layer norm
// and linear, and a linear head.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/libtorch/torch_compare.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

const std::string kDdprun = std::string("CUDA_VISIBLE_DEVICES= ") + DDPRUN_PATH;
const std::string kWorker = UNIT_WORKER_PATH;

// Rank 0's "rank 0 traffic B": the bus bytes of its collectives.
double traffic(const std::string& output) {
  const std::regex line(R"(rank 0 traffic (\d+))");
  std::smatch found;
  return std::regex_search(output, found, line) ? std::stod(found[1]) : -1;
}

RunResult train(int ranks, const std::string& flags) {
  return run_command(kDdprun + " --nproc-per-node " + std::to_string(ranks) + " -- " + kWorker +
                     " " + flags);
}

struct Case {
  int ranks;
  const char* optimizer;  // "" (SGD with momentum) or "--adamw"
};

class TorchUnits : public ::testing::TestWithParam<Case> {};

// Declared units (ddp::ShardUnit in place of each block), the Sequential's children wrapped by
// auto_wrap_min_params, and units kept from forward to backward: each trains bitwise as plain
// DistributedDataParallel on as many ranks (Gloo's reduce-scatter and all-reduce add each
// element in rank order; only where the sums lie differs) and, with SGD, as one process with the
// whole batch within kAcrossRanksMargin (the batch's mean taken in shares). On the wire, units
// kept from forward to backward send plain DDP's bytes (a reduce-scatter and an all-gather a
// bucket, each bucket padded to a multiple of the ranks: 1.003x at 3 ranks, bounded at 1.01x);
// freed after the forward, one all-gather more for the backward (FSDP's FULL_SHARD,
// the ZeRO paper's 1.5x for stage 3): at most 1.5x.
TEST_P(TorchUnits, TrainAsPlainDdpAndAsOneProcess) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const Case c = GetParam();
  TempDir dir;
  const std::string base = std::string(c.optimizer) + " --out ";
  const RunResult plain = train(c.ranks, base + dir.file("plain.safetensors"));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  if (std::string(c.optimizer).empty()) {
    const RunResult one = run_command(kWorker + " --single --out " + dir.file("one.safetensors"));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    EXPECT_LT(max_relative_difference(dir.file("plain.safetensors"), dir.file("one.safetensors")),
              kAcrossRanksMargin);
  }
  for (const std::string flags :
       {std::string("--zero 3 --units"), std::string("--zero 3 --auto-wrap 1"),
        std::string("--zero 3 --auto-wrap 600"),
        std::string("--zero 3 --units --keep-after-forward")}) {
    const RunResult r = train(c.ranks, base + dir.file("units.safetensors") + " " + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    EXPECT_EQ(max_relative_difference(dir.file("units.safetensors"), dir.file("plain.safetensors")),
              0.0)
        << flags;
    const double ratio = traffic(r.output) / traffic(plain.output);
    EXPECT_GT(ratio, 0.9) << flags << "\n" << r.output;
    EXPECT_LE(ratio, flags.find("keep") != std::string::npos ? 1.01 : 1.5) << flags;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TorchUnits,
                         ::testing::Values(Case{2, ""}, Case{2, "--adamw"}, Case{3, ""},
                                           Case{3, "--adamw"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::to_string(info.param.ranks) + "ranks" +
                                  (std::string(info.param.optimizer).empty() ? "Sgd" : "AdamW");
                         });

// The bf16 policy (param_dtype(torch::kBFloat16)): the parameters gathered and computed in
// bfloat16 from float32 master pieces. With units it trains bitwise as without them (the same
// casts, products and float32 gradients, summed in rank order either way); against plain
// float32 DDP it differs by bfloat16's rounding of the forward and backward (2.0e-2 and 1.9e-2
// at 2 and 3 ranks after 4 steps of AdamW; bounded at 0.1, five times that, and above 0, which
// a run not computed in bfloat16 would not be), and sends less than float32 units do (the
// gathers in bfloat16). With the gradients reduced in bfloat16 too (reduce_in_bf16, FSDP2's
// reduce_dtype; each unit's wire buffer allocated with its gradients) units train bitwise as the
// same policy without units, and send less again.
TEST(TorchUnitsPolicy, Bf16ParametersWithFloat32Masters) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const std::string model = "--adamw --steps 4 --out ";
  for (const int ranks : {2, 3}) {
    const std::string where = std::to_string(ranks) + " ranks";
    const auto run = [&](const std::string& name, const std::string& flags) {
      const RunResult r = train(ranks, model + dir.file(name + ".safetensors") + " " + flags);
      EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
      return r;
    };
    run("plain", "");
    run("whole", "--zero 3 --bf16-params");
    const RunResult fp32 = run("fp32", "--zero 3 --units");
    const RunResult units = run("units", "--zero 3 --units --bf16-params");
    EXPECT_EQ(max_relative_difference(dir.file("units.safetensors"), dir.file("whole.safetensors")),
              0.0)
        << where;
    const double apart =
        max_relative_difference(dir.file("units.safetensors"), dir.file("plain.safetensors"));
    std::printf("%s: bf16 policy vs float32 %.3g\n", where.c_str(), apart);
    EXPECT_GT(apart, 0.0) << where;  // computed in bfloat16 indeed
    EXPECT_LT(apart, 0.1) << where;
    EXPECT_LT(traffic(units.output), 0.85 * traffic(fp32.output)) << where;
    EXPECT_GT(traffic(units.output), 0.0) << units.output;
    run("whole-reduce", "--zero 3 --bf16-params --bf16-reduce");
    const RunResult reduced = run("units-reduce", "--zero 3 --units --bf16-params --bf16-reduce");
    EXPECT_EQ(max_relative_difference(dir.file("units-reduce.safetensors"),
                                      dir.file("whole-reduce.safetensors")),
              0.0)
        << where;
    EXPECT_LT(max_relative_difference(dir.file("units-reduce.safetensors"),
                                      dir.file("plain.safetensors")),
              0.1)
        << where;
    EXPECT_LT(traffic(reduced.output), 0.85 * traffic(units.output)) << where;
  }
}

// Every rank's "rank R window W held H ledger L model M block B optimizer O process P step_ms S"
// (--peak).
struct Peak {
  double window = 0, held = 0, ledger = 0, model = 0, block = 0, optimizer = 0, process = 0;
};
std::map<int, Peak> peaks(const std::string& output) {
  std::map<int, Peak> found;
  const std::regex line(
      R"(rank (\d+) window (\d+) held (\d+) ledger (\d+) model (\d+) block (\d+) optimizer (\d+) process (\d+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it)
    found[std::stoi((*it)[1])] = {std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4]),
                                  std::stod((*it)[5]), std::stod((*it)[6]), std::stod((*it)[7]),
                                  std::stod((*it)[8])};
  return found;
}

// The memory at the peak, counted by the CPU allocator itself (every allocation of the process)
// on a model of 24 equal blocks (Linear(256, 256) and LayerNorm) with a batch of one sample a
// rank, at 2 and 4 ranks. The model's bytes are its parameters' and their gradients' (what
// plain DDP holds), a unit's likewise. A rank's parameter and gradient bytes at the peak of a
// step are what ddp held when the step began (its pieces and averaged pieces) plus the most the
// allocator held above that during forward and backward, less plain DDP's own such rise on as
// many ranks (the activations and autograd's temporaries, the same in both). With units that is
// at most the model's bytes / N plus three units'; zero(3) without units (the whole model
// gathered for the step) is far above it, which shows the count sees the gathers. Optimizer
// state (AdamW) is 1/N of plain DDP's, within one element a bucket.
TEST(TorchUnitsMemory, PeakIsTheShareAndThreeUnits) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  for (const int ranks : {2, 4}) {
    const std::string model =
        "--adamw --blocks 24 --dim 256 --steps 3 --peak --batch " + std::to_string(ranks);
    std::map<std::string, std::map<int, Peak>> runs;
    for (const std::string flags :
         {std::string(""), std::string("--zero 3"), std::string("--zero 3 --units"),
          std::string("--zero 3 --auto-wrap 1")}) {
      const RunResult r = train(ranks, model + " " + flags);
      ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
      runs[flags] = peaks(r.output);
      ASSERT_EQ(runs[flags].size(), static_cast<size_t>(ranks)) << flags << "\n" << r.output;
    }
    for (int rank = 0; rank < ranks; ++rank) {
      const Peak& plain = runs[""].at(rank);
      const double model_bytes = 2 * plain.model, unit_bytes = 2 * plain.block;
      const double bound = model_bytes / ranks + 3 * unit_bytes;
      const auto at_peak = [&plain](const Peak& p) { return p.held + p.window - plain.window; };
      const std::string where = std::to_string(ranks) + " ranks, rank " + std::to_string(rank);
      for (const std::string flags : {"--zero 3 --units", "--zero 3 --auto-wrap 1"}) {
        const Peak& units = runs[flags].at(rank);
        EXPECT_LE(at_peak(units), bound) << flags << ", " << where;
        // memory()'s own record of the step's peak: the same bound, and what it held at least.
        EXPECT_LE(units.ledger, bound) << flags << ", " << where;
        EXPECT_GE(units.ledger, units.held) << flags << ", " << where;
        EXPECT_NEAR(units.optimizer, plain.optimizer / ranks, 16.0 * 2 * sizeof(float))
            << flags << ", " << where;
      }
      EXPECT_GT(at_peak(runs["--zero 3"].at(rank)), 2 * bound) << where;
    }
  }
}

// zero(1) and zero(2) with whole tensors to owners, on the same 24 blocks in buckets of half a
// MiB (14 buckets, each laid out in equal pieces in a copy before its reduce-scatter): the copies
// are two slots taken in turn, so that ddp's parameter and gradient bytes at the step's peak are
// plain DDP's, the averaged pieces (1/N) and two of the largest buckets (the first, 1 MiB, with
// its last parameter), not a copy of the whole model as when each bucket kept its own; and the
// process's peak over a step, AdamW's step included, is below plain DDP's (the optimizer's
// state halved) where it was above (1.12x and 1.24x with a copy each and zero(2)'s pieces
// cloned).
TEST(TorchUnitsMemory, ZeroOneAndTwoHoldLessThanPlainAtTheStepsPeak) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const int ranks = 2;
  const std::string model =
      "--adamw --blocks 24 --dim 256 --steps 3 --peak --bucket-mb 0.5 --batch 2";
  TempDir dir;
  std::map<std::string, std::map<int, Peak>> runs;
  for (const std::string flags : {"", "--zero 1", "--zero 2"}) {
    const std::string out = dir.file(flags.empty() ? "plain" : flags.substr(7));
    const RunResult r = train(ranks, model + " --out " + out + " " + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    runs[flags] = peaks(r.output);
    ASSERT_EQ(runs[flags].size(), static_cast<size_t>(ranks)) << flags << "\n" << r.output;
    // The slots change where the copies lie, not what is summed: bitwise plain DDP.
    EXPECT_EQ(max_relative_difference(out, dir.file("plain")), 0.0) << flags;
  }
  for (int rank = 0; rank < ranks; ++rank) {
    const Peak& plain = runs[""].at(rank);
    const double largest_bucket = 1024.0 * 1024 + plain.block;
    const double bound = plain.held + plain.model / ranks + 2 * largest_bucket;
    for (const std::string flags : {"--zero 1", "--zero 2"}) {
      const Peak& zero = runs[flags].at(rank);
      const std::string where = flags + ", rank " + std::to_string(rank);
      EXPECT_LE(zero.ledger, bound) << where;
      EXPECT_LT(zero.process, plain.process) << where;
      EXPECT_NEAR(zero.optimizer, plain.optimizer / ranks, plain.block) << where;
    }
  }
}

// The units' timeline, as rank 0 recorded its last step (record_events; six declared units
// 0-5 and the root, unit 6: the embedding, the convolution and the head). Forward: each unit's
// gather is issued before the unit before it computes (the prefetch), so that it travels while
// that one runs; backward (the units were freed after their forward): each unit is gathered
// again, its gather issued before the unit after it (whose backward comes first) computes.
// Every unit is gathered twice a step, the root once; with reshard_after_forward(false) once.
TEST(TorchUnitsTimeline, EachGatherIsIssuedBeforeThePreviousUnitComputes) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  for (const std::string keep : {"", " --keep-after-forward"}) {
    const RunResult r = train(2, "--zero 3 --units --events --steps 3" + keep);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::smatch found;
    ASSERT_TRUE(std::regex_search(r.output, found, std::regex("rank 0 unit events([^\\n]*)")))
        << r.output;
    std::vector<std::string> events;
    std::istringstream words(found[1].str());
    for (std::string word; words >> word;)
      events.push_back(word);
    const auto first = [&](const std::string& event, size_t from = 0) {
      return std::find(events.begin() + static_cast<std::ptrdiff_t>(from), events.end(), event) -
             events.begin();
    };
    const auto count = [&](const std::string& event) {
      return std::count(events.begin(), events.end(), event);
    };
    const std::string where = keep + ": " + found[1].str();
    const int blocks = 6, root = 6;
    EXPECT_EQ(count("gather_issued:" + std::to_string(root)), 1) << where;
    for (int u = 0; u < blocks; ++u) {
      const std::string unit = ":" + std::to_string(u);
      EXPECT_EQ(count("forward" + unit), 1) << where;
      EXPECT_EQ(count("backward" + unit), 1) << where;
      EXPECT_EQ(count("gather_issued" + unit), keep.empty() ? 2 : 1) << where;
      if (u > 0)  // prefetched in forward
        EXPECT_LT(first("gather_issued" + unit), first("forward:" + std::to_string(u - 1)))
            << u << where;
      if (keep.empty() && u + 1 < blocks) {  // gathered again before the backward after it
        const auto second = first("gather_issued" + unit, first("gather_issued" + unit) + 1);
        EXPECT_LT(second, first("backward:" + std::to_string(u + 1))) << u << where;
        EXPECT_GT(second, first("forward:" + std::to_string(blocks - 1))) << u << where;
      }
    }
  }
}

// Every "rank R step S norm N" line: rank -> the norms, in step order.
std::map<int, std::vector<double>> norms(const std::string& output) {
  std::map<int, std::vector<double>> found;
  const std::regex line(R"(rank (\d+) step \d+ norm ([-+0-9.eE]+|inf|nan))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it)
    found[std::stoi((*it)[1])].push_back(std::stod((*it)[2]));
  return found;
}

// clip_grad_norm_ on the wrapper, clipping every step (max norm 0.05 against norms about 1.2:
// every step clips) under plain DDP, each ZeRO level and units, at 2 and 3 ranks, for the
// 2-norm and the largest element: every rank returns one process's norm of the whole model's
// gradient (LibTorch's own clip_grad_norm_ there) within 1e-6 relative (the same gradients,
// their squares summed in another grouping: each rank's part, then the ranks' parts, in
// float64), and the weights trained with SGD equal one process's with the whole batch within
// kAcrossRanksMargin. LibTorch's own clip_grad_norm_ under ZeRO takes a rank's part for the
// whole: its norms differ from one process's, and the ranks' from each other (the README's
// trap).
TEST(TorchClip, TheWrappersNormIsOneProcesssUnderEveryLevel) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  for (const std::string norm_type : {"2", "inf"}) {
    const std::string clip = " --clip 0.05 --steps 3 --norm-type " + norm_type + " --out ";
    const RunResult one = run_command(kWorker + " --single" + clip + dir.file("one"));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const std::vector<double> reference = norms(one.output).at(0);
    ASSERT_EQ(reference.size(), 3u) << one.output;
    for (const double n : reference)
      ASSERT_GT(n, 0.05 * 4) << one.output;  // clipped, by a factor far from 1
    for (const int ranks : {2, 3})
      for (const std::string flags : {"", "--zero 1", "--zero 2", "--zero 3", "--zero 3 --units"}) {
        const std::string where = norm_type + ", " + std::to_string(ranks) + " ranks " + flags;
        const RunResult r = train(ranks, flags + clip + dir.file("ranks"));
        ASSERT_EQ(r.exit_code, 0) << where << "\n" << r.output;
        const std::map<int, std::vector<double>> got = norms(r.output);
        ASSERT_EQ(got.size(), static_cast<size_t>(ranks)) << where << "\n" << r.output;
        for (const auto& [rank, steps] : got) {
          ASSERT_EQ(steps.size(), reference.size()) << where;
          for (size_t k = 0; k < steps.size(); ++k)
            EXPECT_NEAR(steps[k], reference[k], 1e-6 * reference[k])
                << where << ", rank " << rank << ", step " << k;
        }
        EXPECT_LT(max_relative_difference(dir.file("ranks"), dir.file("one")), kAcrossRanksMargin)
            << where;
      }
  }
  const RunResult own = train(2, "--zero 1 --libtorch-clip --clip 0.05 --steps 1");
  ASSERT_EQ(own.exit_code, 0) << own.output;
  const std::map<int, std::vector<double>> parts = norms(own.output);
  const RunResult one = run_command(kWorker + " --single --clip 0.05 --steps 1");
  const double whole = norms(one.output).at(0).at(0);
  ASSERT_EQ(parts.size(), 2u) << own.output;
  EXPECT_LT(parts.at(0).at(0), 0.9 * whole) << own.output;
  EXPECT_LT(parts.at(1).at(0), 0.9 * whole) << own.output;
  EXPECT_GT(std::abs(parts.at(0).at(0) - parts.at(1).at(0)), 1e-3 * whole) << own.output;
}

// ddp::GradScaler (init_scale 1024, growth_interval 2) where one rank alone finds an inf in its
// gradients at steps 1 and 4 (the last rank, under ZeRO holding only its own share): every rank
// skips those steps and keeps the same scale, the sequence torch.amp.GradScaler's update rule
// gives (halved after a skip, doubled after two steps without one: 1024, 512, 512, 1024, 512,
// 512), as one process with the same skips, whose weights (SGD) the ranks' equal within
// kAcrossRanksMargin; plain DDP, zero(2) and units at 2 and 3 ranks. Its state saved after
// step 2 and loaded by a new run continues the sequence as the run that never stopped.
TEST(TorchGradScaler, ARankThatOverflowsAloneMakesEveryRankSkip) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const std::vector<std::string> expected = {"0:1024:1", "1:512:0", "2:512:1",
                                             "3:1024:1", "4:512:0", "5:512:1"};
  const std::string scaled = " --scaler --overflow 1,4 --steps 6 --out ";
  const RunResult one = run_command(kWorker + " --single" + scaled + dir.file("one"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(scale_lines(one.output)[0], expected) << one.output;
  for (const int ranks : {2, 3})
    for (const std::string flags : {"", "--zero 2", "--zero 3 --units"}) {
      const std::string where = std::to_string(ranks) + " ranks " + flags;
      const RunResult r = train(ranks, flags + " --overflow-rank " + std::to_string(ranks - 1) +
                                           scaled + dir.file("ranks"));
      ASSERT_EQ(r.exit_code, 0) << where << "\n" << r.output;
      const std::map<int, std::vector<std::string>> got = scale_lines(r.output);
      ASSERT_EQ(got.size(), static_cast<size_t>(ranks)) << where << "\n" << r.output;
      for (const auto& [rank, sequence] : got)
        EXPECT_EQ(sequence, expected) << where << ", rank " << rank;
      EXPECT_LT(max_relative_difference(dir.file("ranks"), dir.file("one")), kAcrossRanksMargin)
          << where;
    }
  const std::string state = dir.file("scaler.pt");
  const RunResult first = train(2, "--scaler --overflow 1,4 --steps 3 --save-scaler " + state);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const RunResult resumed =
      train(2, "--scaler --overflow 1,4 --steps 3 --first-step 3 --load-scaler " + state);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(scale_lines(resumed.output)[0],
            std::vector<std::string>(expected.begin() + 3, expected.end()))
      << resumed.output;
  const RunResult bad = train(2, "--scaler --load-scaler " + dir.file("one"));
  EXPECT_NE(bad.exit_code, 0);
}

// ddp::checkpoint in a model trained on ranks (unit_worker --checkpoint: six residual blocks with
// dropout, checkpointed from inside a block's forward, as ddp::CheckpointWrapper (inside the unit
// under zero(3)) and in the module form (around the unit, whose recompute then gathers it
// again)): the weights after 3 steps are bitwise those without checkpointing on the same ranks
// (each gradient reaches the reducer once, with the values it had without: the same kernels on
// the same values, the dropout masks drawn again alike), as plain DDP, zero(1) and units at 2
// and 3 ranks, and as one process; without dropout the ranks with checkpointing train as one
// process without it, within kAcrossRanksMargin.
TEST(TorchCheckpoint, BlocksWithDropoutTrainBitwiseAsWithoutItOnRanksAndUnits) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const std::string model = " --blocks 6 --batch 6 --steps 3 --dropout 0.2 --out ";
  for (const std::string checkpoint : {"", " --checkpoint"}) {
    const RunResult r = run_command(kWorker + " --single" + checkpoint + model +
                                    dir.file(checkpoint.empty() ? "one" : "one-ckpt"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  EXPECT_EQ(max_relative_difference(dir.file("one-ckpt"), dir.file("one")), 0.0);
  for (const int ranks : {2, 3})
    for (const std::string flags : {"", "--zero 1", "--zero 3 --units"}) {
      const std::string where = std::to_string(ranks) + " ranks " + flags;
      for (const std::string checkpoint : {"", " --checkpoint"}) {
        const RunResult r = train(
            ranks, flags + checkpoint + model + dir.file(checkpoint.empty() ? "r" : "r-ckpt"));
        ASSERT_EQ(r.exit_code, 0) << where << checkpoint << "\n" << r.output;
      }
      EXPECT_EQ(max_relative_difference(dir.file("r-ckpt"), dir.file("r")), 0.0) << where;
    }
  const std::string plain = " --blocks 6 --batch 6 --steps 3 --out ";
  ASSERT_EQ(run_command(kWorker + " --single" + plain + dir.file("plain")).exit_code, 0);
  const RunResult r = train(2, "--zero 3 --units --checkpoint" + plain + dir.file("units"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(max_relative_difference(dir.file("units"), dir.file("plain")), kAcrossRanksMargin);
}

// The activations held at the peak (the allocator's growth from the forward's start to the end
// of backward, the CPU allocator counting every allocation) of 24 blocks whose activations
// outweigh their parameters (a batch of 256 x 4 tokens of 64 features): checkpointed, each block
// keeps only its input (one of the five tensors a block's backward needs) and one block's are
// recomputed at a time, so under half of them without it (a third, measured), in one process
// and under shard units on 2 ranks, where ddp's own parameter and gradient bytes at the peak
// stay as without it (the recompute gathers no unit beyond its own).
TEST(TorchCheckpoint, ActivationsAtThePeakAreUnderHalf) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  const std::string model = " --blocks 24 --dim 64 --steps 3 --peak --dropout 0.1";
  std::map<std::string, Peak> single, units;
  for (const std::string checkpoint : {"", " --checkpoint"}) {
    const RunResult one = run_command(kWorker + " --single --batch 256" + model + checkpoint);
    ASSERT_EQ(one.exit_code, 0) << one.output;
    single[checkpoint] = peaks(one.output).at(0);
    const RunResult r = train(2, "--zero 3 --units --batch 512" + model + checkpoint);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    units[checkpoint] = peaks(r.output).at(0);
  }
  EXPECT_LT(single[" --checkpoint"].window, 0.5 * single[""].window);
  EXPECT_LT(units[" --checkpoint"].window, 0.5 * units[""].window);
  EXPECT_EQ(units[" --checkpoint"].ledger, units[""].ledger);
}

// ddp::Checkpointer saved on 2 ranks under zero(3) with shard units (each tensor and its AdamW
// moments in pieces over the ranks), after 2 of 4 steps, and loaded into other layouts, which
// train the last 2 steps: 3 ranks with zero(1), zero(3) and units, 2 ranks plain and zero(2),
// and one process without the wrapper each end as the uninterrupted run (within
// kAcrossRanksMargin: the same sums in other orders). The other way round, one process's
// checkpoint resumes on 2 ranks with units; and asynchronous saves (the second into the host
// copies kept from the first, keep_staging) give the same checkpoint as a synchronous one (the
// weights resumed from it bitwise).
TEST(TorchCheckpointer, SavedOnRanksLoadsIntoAnyLayoutAndTrainingGoesOnAsUninterrupted) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const std::string model = " --adamw --batch 6 --steps 4 ";
  const auto run = [&](int ranks, const std::string& flags) {
    const RunResult r = ranks == 1 ? run_command(kWorker + " --single" + model + flags)
                                   : train(ranks, model + flags);
    EXPECT_EQ(r.exit_code, 0) << ranks << " ranks " << flags << "\n" << r.output;
    return r;
  };
  run(2, "--zero 3 --units --checkpoint-dir " + dir.file("units") + " --save-at 1 --out " +
             dir.file("uninterrupted"));
  struct Layout {
    int ranks;
    std::string flags;
  };
  for (const Layout& l :
       {Layout{3, "--zero 1"}, Layout{3, "--zero 3"}, Layout{3, "--zero 3 --units"}, Layout{2, ""},
        Layout{2, "--zero 2"}, Layout{1, ""}}) {
    const std::string where = std::to_string(l.ranks) + " ranks " + l.flags;
    const RunResult r = run(l.ranks, l.flags + " --resume --checkpoint-dir " + dir.file("units") +
                                         " --out " + dir.file("resumed"));
    EXPECT_NE(r.output.find("rank 0 resumed at step 2"), std::string::npos) << where << r.output;
    EXPECT_LT(max_relative_difference(dir.file("resumed"), dir.file("uninterrupted")),
              kAcrossRanksMargin)
        << where;
  }
  run(1, "--checkpoint-dir " + dir.file("one") + " --save-at 1 --out " + dir.file("one-whole"));
  run(2, "--zero 3 --units --resume --checkpoint-dir " + dir.file("one") + " --out " +
             dir.file("from-one"));
  EXPECT_LT(max_relative_difference(dir.file("from-one"), dir.file("one-whole")),
            kAcrossRanksMargin);
  run(2, "--zero 3 --units --async-save --keep-staging --checkpoint-dir " + dir.file("async") +
             " --save-at 0,1 --out " + dir.file("async-whole"));
  EXPECT_EQ(max_relative_difference(dir.file("async-whole"), dir.file("uninterrupted")), 0.0);
  for (const std::string& saved : {"units", "async"}) {
    run(2, "--zero 3 --units --resume --checkpoint-dir " + dir.file(saved) + " --out " +
               dir.file("resumed-" + saved));
  }
  EXPECT_EQ(max_relative_difference(dir.file("resumed-async"), dir.file("resumed-units")), 0.0);
}

// A save that cannot complete leaves the previous checkpoint to load and says what happened: a
// rank killed (SIGKILL) while the other's asynchronous save of step 2 is in flight (the job torn
// down, a partial folder left, which the next save removes), and a disk that fills up during the
// save of step 2 (a 160 KiB tmpfs in a mount namespace of the test's own: every rank's error names
// the file and the full disk). Each time the next run resumes from step 1.
TEST(TorchCheckpointer, AKilledRankOrAFullDiskLeavesThePreviousCheckpoint) {
  if (!HAVE_GLOO) GTEST_SKIP() << "built without Gloo";
  TempDir dir;
  const std::string model = " --adamw --zero 3 --units --batch 6 --steps 4 --checkpoint-dir ";
  const std::string killed = dir.file("killed");
  const RunResult died = train(2, model + killed + " --save-at 1,2 --async-save --die-at-save 2");
  EXPECT_NE(died.exit_code, 0) << died.output;
  const auto partial = [&killed] {
    int count = 0;
    for (const auto& e : std::filesystem::directory_iterator(killed))
      count += e.path().filename().string().rfind(".step-000000002.", 0) == 0 ? 1 : 0;
    return count;
  };
  EXPECT_EQ(partial(), 1) << died.output;
  const RunResult resumed = train(2, model + killed + " --resume --save-at 3");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("rank 0 resumed at step 2"), std::string::npos) << resumed.output;
  EXPECT_EQ(partial(), 0) << "the partial save's folder is left after the next save";
  EXPECT_TRUE(std::filesystem::exists(killed + "/step-000000003/index.json"));

  if (std::system("unshare -rm true > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no mount namespace (unshare -rm) for a small tmpfs";
  const std::string full = dir.file("full");
  std::filesystem::create_directories(full);
  const std::string mount = "unshare -rm sh -c 'mount -t tmpfs -o size=160k tmpfs " + full + " && ";
  const std::string command = kDdprun + " --nproc-per-node 2 -- " + kWorker + model + full;
  const RunResult filled =
      run_command(mount + command + " --save-at 1,2; echo exit $?; " + command + " --resume'");
  EXPECT_NE(filled.output.find("exit 1"), std::string::npos) << filled.output;
  EXPECT_NE(filled.output.find("the save of step 2 into " + full + " failed"), std::string::npos)
      << filled.output;
  EXPECT_NE(filled.output.find("No space left on device"), std::string::npos) << filled.output;
  EXPECT_NE(filled.output.find("rank 0 resumed at step 2"), std::string::npos) << filled.output;
}

// SIGTERM (a scheduler's preemption, ddprun's teardown) right after async_save() returns: the
// handler says it waits, the save is committed before the process ends by the signal, and the
// next run resumes from it (24 blocks of 512 features, 75 MB to write: far longer than the
// signal takes to arrive).
TEST(TorchCheckpointer, ASignalWaitsForTheSaveInFlight) {
  TempDir dir;
  const std::string ckpt = " --checkpoint-dir " + dir.file("ckpt");
  const std::string model = " --single --adamw --blocks 24 --dim 512 --steps 2";
  const RunResult stopped =
      run_command(kWorker + model + ckpt + " --save-at 0 --async-save --sigterm-after-save");
  EXPECT_NE(stopped.exit_code, 0) << stopped.output;
  EXPECT_NE(stopped.output.find("waiting for the save to finish"), std::string::npos)
      << stopped.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("ckpt") + "/step-000000000/index.json"))
      << stopped.output;
  const RunResult resumed = run_command(kWorker + model + ckpt + " --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("rank 0 resumed at step 1"), std::string::npos) << resumed.output;
}

// What a load cannot trust is refused by name and nothing is loaded: a checkpoint of another
// model (16 features saved, 8 asked for: the tensor, both shapes), another optimizer (AdamW saved,
// SGD asked for), and a rank file with one byte changed (its piece's CRC-32).
TEST(TorchCheckpointer, AForeignOrDamagedCheckpointIsRefusedByName) {
  TempDir dir;
  const std::string ckpt = " --checkpoint-dir " + dir.file("ckpt");
  ASSERT_EQ(run_command(kWorker + " --single --adamw --steps 2 --save-at 0" + ckpt).exit_code, 0);
  const RunResult other = run_command(kWorker + " --single --adamw --dim 8 --resume" + ckpt);
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.output.find("is F32 [16, 16] there, F32 [16, 8] here"), std::string::npos)
      << other.output;
  const RunResult sgd = run_command(kWorker + " --single --resume" + ckpt);
  EXPECT_NE(sgd.exit_code, 0);
  EXPECT_NE(sgd.output.find("a checkpoint of optimizer AdamW, loaded into a SGD"),
            std::string::npos)
      << sgd.output;
  const std::string file = dir.file("ckpt") + "/step-000000000/rank-00000-of-00001.safetensors";
  {
    std::fstream bytes(file, std::ios::in | std::ios::out | std::ios::binary);
    bytes.seekg(-5, std::ios::end);
    const char was = static_cast<char>(bytes.get());
    bytes.seekp(-5, std::ios::end);
    bytes.put(static_cast<char>(was ^ 0x40));
  }
  const RunResult damaged = run_command(kWorker + " --single --adamw --resume" + ckpt);
  EXPECT_NE(damaged.exit_code, 0);
  EXPECT_NE(damaged.output.find("do not match their checksum"), std::string::npos)
      << damaged.output;
}

}  // namespace
}  // namespace ddp
