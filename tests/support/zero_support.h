// ZeRO's checkpoint scenario, the same on every path (the CPU's tests/dist/test_zero.cpp, the
// GPU's tests/cuda/test_cuda_zero.cpp): the checkpoint rank 0 gathers from a --zero run's
// shards is the plain run's file byte for byte (its state is the same); that checkpoint of 2
// ranks resumes into --zero 0 on 3 ranks and goes on to the weights of the run that never
// stopped (1e-5: the batch is global); and the plain checkpoint resumes into --zero on 3 ranks.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "tests/support/test_support.h"
#include "tests/support/weights_support.h"

namespace ddp {

// `job(ranks, flags)`: the command line of a training job of `ranks` ranks given `flags`
// (12 steps of the model `layers`); `zero_flag`: "--zero N ".
inline void expect_zero_checkpoints_are_plain_and_resume(
    const std::function<std::string(int, const std::string&)>& job, const std::string& layers,
    const std::string& zero_flag, TempDir& dir) {
  const std::string adamw =
      "--optimizer adamw --lr 0.01 --checkpoint-every 6 --keep-checkpoints 3 ";
  const std::string step6 = "/step-000000006.safetensors";
  const RunResult straight = run_command(job(2, adamw + "--checkpoint-dir " + dir.file("plain") +
                                                    " --save-weights " + dir.file("straight.st")));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const RunResult zero = run_command(
      job(2, adamw + zero_flag + "--checkpoint-dir " + dir.file("zero") + " --fail-at-step 8"));
  EXPECT_NE(zero.exit_code, 0) << zero.output;
  ASSERT_FALSE(read_file(dir.file("plain") + step6).empty()) << "no step-6 checkpoint";
  EXPECT_TRUE(read_file(dir.file("zero") + step6) == read_file(dir.file("plain") + step6))
      << "the gathered checkpoint differs from the plain run's";
  // The same layout resumed: the shards take their optimizer state (AdamW's moments) from
  // the checkpoint, and the run ends bitwise where the one that never stopped did.
  std::filesystem::copy(dir.file("zero"), dir.file("zero-again"));
  const RunResult again =
      run_command(job(2, adamw + zero_flag + "--checkpoint-dir " + dir.file("zero-again") +
                             " --resume --save-weights " + dir.file("again.st")));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(read_file(dir.file("again.st")) == read_file(dir.file("straight.st")))
      << "a resumed --zero run differs from the run that never stopped";
  const RunResult resumed =
      run_command(job(3, adamw + "--checkpoint-dir " + dir.file("zero") +
                             " --resume --save-weights " + dir.file("resumed.st")));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  EXPECT_LE(max_relative_error(load_weights(dir.file("resumed.st"), layers),
                               load_weights(dir.file("straight.st"), layers)),
            1e-5);
  // The plain run's step-6 checkpoint resumed into --zero on 3 ranks: the weights of the run
  // that never stopped (the moments of each rank's shard taken from the file).
  std::filesystem::create_directory(dir.file("plain6"));
  std::filesystem::copy_file(dir.file("plain") + step6, dir.file("plain6/latest.safetensors"));
  const RunResult into_zero =
      run_command(job(3, adamw + zero_flag + "--checkpoint-dir " + dir.file("plain6") +
                             " --resume --save-weights " + dir.file("into-zero.st")));
  ASSERT_EQ(into_zero.exit_code, 0) << into_zero.output;
  EXPECT_LE(max_relative_error(load_weights(dir.file("into-zero.st"), layers),
                               load_weights(dir.file("straight.st"), layers)),
            1e-5);
}

}  // namespace ddp
