// What a run wrote is never lost and bad input never runs (issue 27, round 3), tried as a
// hostile user would with one ddptrain process: checkpoints pruned and replaced only when
// known good, a folder of another run or of a live job refused, outputs checked before the
// first step, memory estimated before allocating, inputs that are not what they claim.
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/config.h"
#include "engine/loop/checkpoint.h"
#include "engine/pipeline/schedule.h"
#include "models/cpu_ops.h"
#include "models/mlp.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

const std::string kSmall =
    " --data synthetic --layers 32,64,64,10 --synthetic-samples 2000 --batch-size 64 "
    "--threads 1 --quiet";

RunResult train(const std::string& args) {
  return run_command(std::string(DDPTRAIN_PATH) + kSmall + " " + args);
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::string metadata_of(const std::string& path, const std::string& key) {
  return read_safetensors(path, /*metadata_only=*/true).metadata.at(key);
}

std::vector<nlohmann::json> records(const std::string& path) {
  std::vector<nlohmann::json> all;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    all.push_back(nlohmann::json::parse(line));
  return all;
}

// --- 2: pruning never deletes the checkpoint just written -----------------------------------

TEST(CheckpointPruning, KeepsTheOneJustWrittenAndThisRunsNewestBeforeAnEarlierRunsLaterSteps) {
  const std::vector<std::string> folder = {"latest.safetensors",
                                           "step-000000010.safetensors",
                                           "step-000000025.safetensors",
                                           "step-000000050.safetensors",
                                           "step-000000075.safetensors",
                                           "step-000000100.safetensors",
                                           "notes.txt"};
  // Step 10 just written into a folder with an earlier run's 25..100: 10 stays, then the
  // newest of the others, up to 3 in all.
  EXPECT_EQ(checkpoints_to_prune(folder, 10, 3),
            (std::vector<std::string>{"step-000000050.safetensors", "step-000000025.safetensors"}));
  // Step 20 next: this run's step 10 is kept before any later step of the earlier run.
  const std::vector<std::string> later = {
      "step-000000010.safetensors", "step-000000020.safetensors", "step-000000075.safetensors",
      "step-000000100.safetensors"};
  EXPECT_EQ(checkpoints_to_prune(later, 20, 3),
            (std::vector<std::string>{"step-000000075.safetensors"}));
  EXPECT_EQ(checkpoints_to_prune(later, 20, 1),
            (std::vector<std::string>{"step-000000010.safetensors", "step-000000100.safetensors",
                                      "step-000000075.safetensors"}));
}

TEST(CheckpointPruning, StepNumbersOfAnyWidthArePruned) {
  EXPECT_EQ(step_of_checkpoint_file("step-1000000000.safetensors"), 1000000000);
  EXPECT_EQ(step_of_checkpoint_file("step-000000007.safetensors"), 7);
  EXPECT_EQ(step_of_checkpoint_file("step-.safetensors"), std::nullopt);
  EXPECT_EQ(step_of_checkpoint_file("step-12a.safetensors"), std::nullopt);
  EXPECT_EQ(step_of_checkpoint_file("latest.safetensors"), std::nullopt);
  EXPECT_EQ(checkpoints_to_prune({"step-999999999.safetensors", "step-1000000000.safetensors",
                                  "step-1000000001.safetensors"},
                                 1000000001, 2),
            (std::vector<std::string>{"step-999999999.safetensors"}));
}

TEST(CheckpointPruning, ASecondRunInTheFolderKeepsWhatItWroteAndResumesFromIt) {
  TempDir dir;
  const std::string ckpt = " --checkpoint-dir " + dir.file("D") + " --keep-checkpoints 3";
  ASSERT_EQ(train(ckpt + " --steps 100 --checkpoint-every 25").exit_code, 0);
  const RunResult second = train(ckpt + " --steps 20 --checkpoint-every 10 --fresh");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(std::filesystem::read_symlink(dir.file("D/latest.safetensors")).string(),
            "step-000000020.safetensors");
  EXPECT_TRUE(std::filesystem::exists(dir.file("D/step-000000020.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("D/step-000000010.safetensors")));
  const RunResult resumed = train(ckpt + " --steps 30 --checkpoint-every 10 --resume");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step 20"), std::string::npos) << resumed.output;
}

// --fresh twice: each earlier run's files go into a folder of their own (earlier-1, then
// earlier-2); the second never overwrites what the first moved aside.
TEST(CheckpointDir, ASecondFreshKeepsTheFirstsFilesApart) {
  TempDir dir;
  const std::string ckpt = " --checkpoint-dir " + dir.file("D") + " --checkpoint-every 5";
  ASSERT_EQ(train(ckpt + " --steps 5 --seed 1").exit_code, 0);
  ASSERT_EQ(train(ckpt + " --steps 5 --seed 2 --fresh").exit_code, 0);
  const std::string first = read_file(dir.file("D/earlier-1/latest.safetensors"));
  ASSERT_FALSE(first.empty());
  const RunResult r = train(ckpt + " --steps 5 --seed 3 --fresh");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_file(dir.file("D/earlier-1/latest.safetensors")), first);
  EXPECT_TRUE(std::filesystem::exists(dir.file("D/earlier-2/latest.safetensors")));
  EXPECT_NE(r.output.find("moved into " + dir.file("D/earlier-2/")), std::string::npos) << r.output;
}

// A rerun of the same run without --resume would replace a newer checkpoint and prune the
// earlier run's step files: refused, nothing touched; with --fresh the earlier files are
// moved aside whole (and still resume), never deleted.
TEST(CheckpointDir, ARerunWithoutResumeKeepsTheEarlierRunsCheckpoints) {
  TempDir dir;
  const std::string ckpt = " --checkpoint-dir " + dir.file("D") + " --keep-checkpoints 3";
  ASSERT_EQ(train(ckpt + " --steps 60 --checkpoint-every 10").exit_code, 0);
  const std::vector<std::string> before = files_in(dir.file("D"));
  const std::string newest = read_file(dir.file("D/step-000000060.safetensors"));
  RunResult r = train(ckpt + " --steps 10");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("holds an earlier run's checkpoint at step 60"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("give --resume to continue it, --fresh to start afresh"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(files_in(dir.file("D")), before);
  EXPECT_EQ(read_file(dir.file("D/step-000000060.safetensors")), newest);
  // Without --keep-checkpoints too: latest alone is not replaced.
  r = train(" --checkpoint-dir " + dir.file("D") + " --steps 10");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(files_in(dir.file("D")), before);
  r = train(ckpt + " --steps 10 --fresh");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("moved into " + dir.file("D/earlier-1")), std::string::npos) << r.output;
  EXPECT_EQ(read_file(dir.file("D/earlier-1/step-000000060.safetensors")), newest);
  EXPECT_EQ(files_in(dir.file("D/earlier-1")),
            (std::vector<std::string>{"latest.safetensors", "step-000000040.safetensors",
                                      "step-000000050.safetensors", "step-000000060.safetensors"}));
  const RunResult from_aside =
      train(" --checkpoint-dir " + dir.file("D/earlier-1") + " --steps 70 --resume");
  EXPECT_EQ(from_aside.exit_code, 0) << from_aside.output;
  EXPECT_NE(from_aside.output.find("at step 60"), std::string::npos) << from_aside.output;
}

// The newest step file corrupt: --resume takes the newest intact one, naming both, and the
// older files stay; with no intact one left the first error stands (exit 2).
TEST(CheckpointDir, ACorruptNewestStepFileResumesFromTheNewestIntactOne) {
  TempDir dir;
  const std::string ckpt = " --checkpoint-dir " + dir.file("D") + " --keep-checkpoints 3";
  ASSERT_EQ(train(ckpt + " --steps 30 --checkpoint-every 10").exit_code, 0);
  {
    std::fstream f(dir.file("D/step-000000030.safetensors"),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  const RunResult r = train(ckpt + " --steps 40 --checkpoint-every 10 --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step-000000030.safetensors: checksum mismatch"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resuming from the newest intact checkpoint, " +
                          dir.file("D/step-000000020.safetensors") + " (step 20)"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("D/step-000000040.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("D/step-000000020.safetensors")));
  for (const char* step : {"20", "30", "40"}) {  // nothing intact: the newest one's error
    const std::string path = dir.file(std::string("D/step-0000000") + step + ".safetensors");
    std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  }
  const RunResult none = train(ckpt + " --steps 50 --resume");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("step-000000040.safetensors"), std::string::npos) << none.output;
}

// A write killed midway leaves step-N.safetensors.tmp: the next job on the folder (holding its
// lock) removes it; a folder that cannot be created names mkdir's own error.
TEST(CheckpointDir, UnfinishedWritesAreRemovedAndMkdirErrorsNamed) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.file("D").c_str(), 0755), 0);
  std::ofstream(dir.file("D/step-000000050.safetensors.tmp")) << std::string(4096, 'x');
  // A user's own temporary file in the folder is not ddp's to remove.
  std::ofstream(dir.file("D/mymodel.safetensors.tmp")) << "mine";
  const RunResult r = train(" --steps 4 --checkpoint-dir " + dir.file("D"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("removed 1 unfinished checkpoint file"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("D/step-000000050.safetensors.tmp")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("D/mymodel.safetensors.tmp")));
  const RunResult missing = train(" --steps 4 --checkpoint-dir " + dir.file("none/D"));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("--checkpoint-dir " + dir.file("none/D") + ": cannot create it"),
            std::string::npos)
      << missing.output;
}

// --- 3, 17: outputs checked before the first step --------------------------------------------

TEST(Outputs, AnUnwritableTimelineFailsBeforeTrainingAndLeavesNothingBehind) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.file("folder").c_str(), 0755), 0);
  for (const std::string& timeline : {std::string("/proc/ddp-t.json"), dir.file("folder")}) {
    const RunResult r = train("--steps 10 --timeline " + timeline + " --save-weights " +
                              dir.file("w.st") + " --metrics " + dir.file("m.jsonl"));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("--timeline " + timeline), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step"), std::string::npos) << "no step ran:\n" << r.output;
  }
  EXPECT_EQ(files_in(dir.path()), (std::vector<std::string>{"folder"}));
}

TEST(Outputs, TwoOutputsOnOnePathAreRefused) {
  TempDir dir;
  const RunResult r =
      train("--steps 2 --metrics " + dir.file("x") + " --save-weights " + dir.file("x"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the same file"), std::string::npos) << r.output;
}

TEST(Outputs, AnEarlierRunsMetricsAreKeptAside) {
  TempDir dir;
  ASSERT_EQ(train("--steps 2 --seed 1 --metrics " + dir.file("m.jsonl")).exit_code, 0);
  const RunResult again = train("--steps 2 --seed 2 --metrics " + dir.file("m.jsonl"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("moved them to " + dir.file("m.jsonl.prev")), std::string::npos)
      << again.output;
  const auto earlier = records(dir.file("m.jsonl.prev"));
  const auto latest = records(dir.file("m.jsonl"));
  ASSERT_FALSE(earlier.empty());
  ASSERT_FALSE(latest.empty());
  EXPECT_EQ(earlier.front()["config"]["seed"], 1);
  EXPECT_EQ(latest.front()["config"]["seed"], 2);
}

// --- 8: a diverging run never replaces the good checkpoint --------------------------------

TEST(Divergence, TheCheckpointBeforeADivergingStepStaysAndTheMetricsEndWithTheFailure) {
  TempDir dir;
  const std::string ckpt = " --checkpoint-dir " + dir.file("D");
  ASSERT_EQ(train(ckpt + " --steps 10").exit_code, 0);
  const RunResult r = train(ckpt + " --steps 20 --resume --lr 1e30 --checkpoint-every 1 " +
                            "--metrics " + dir.file("m.jsonl"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(metadata_of(dir.file("D/latest.safetensors"), "step"), "10") << r.output;
  const auto all = records(dir.file("m.jsonl"));
  ASSERT_FALSE(all.empty());
  const nlohmann::json last = all.back();
  EXPECT_EQ(last["event"], "failed") << last.dump();
  EXPECT_EQ(last["rank"], 0);
  EXPECT_EQ(last["non_finite"], true);
  EXPECT_GE(last["step"].get<int>(), 10);
  EXPECT_NE(last["reason"].get<std::string>().find("non-finite"), std::string::npos);
}

TEST(Divergence, AFailureThatIsNotNonFiniteStillWritesTheLastGoodCheckpoint) {
  TempDir dir;
  const RunResult r = train("--steps 20 --checkpoint-every 5 --fail-at-step 11 --checkpoint-dir " +
                            dir.file("D") + " --metrics " + dir.file("m.jsonl"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(metadata_of(dir.file("D/latest.safetensors"), "step"), "10") << r.output;
  const auto all = records(dir.file("m.jsonl"));
  ASSERT_FALSE(all.empty());
  const nlohmann::json last = all.back();
  EXPECT_EQ(last["event"], "failed");
  EXPECT_EQ(last["non_finite"], false);
  EXPECT_EQ(last["step"], 10);
}

// Rank 0 writes checkpoints on a thread of its own while training goes on. A write that fails
// there (a full disk: a tmpfs holding one checkpoint but not a second beside it) is said at
// once, stops the run at its next checkpoint, and leaves the previous checkpoint, which resumes.
TEST(CheckpointDir, ABackgroundWriteThatFailsIsSaidStopsTheRunAndKeepsThePreviousOne) {
  if (std::system("unshare -rm true > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no mount namespace (unshare -rm) for a small tmpfs";
  TempDir dir;
  const std::string full = dir.file("full");
  std::filesystem::create_directories(full);
  // A checkpoint of this model (6,922 parameters and their momentum) takes 14 pages of 4 KiB.
  const std::string run = std::string(DDPTRAIN_PATH) + kSmall +
                          " --steps 20 --checkpoint-every 5 --checkpoint-dir " + full + "/D";
  const RunResult r =
      run_command("unshare -rm sh -c 'mount -t tmpfs -o size=80k tmpfs " + full + " && " + run +
                  "; echo exit $?; cp -r " + full + "/D " + dir.file("kept") + "'");
  EXPECT_NE(r.output.find("exit 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the checkpoint of step 10 could not be written (the previous one is "
                          "kept)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_EQ(metadata_of(dir.file("kept/latest.safetensors"), "step"), "5") << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("kept/latest.safetensors.tmp")));
  const RunResult resumed = run_command(std::string(DDPTRAIN_PATH) +
                                        " --data synthetic --layers "
                                        "32,64,64,10 --synthetic-samples 2000 --batch-size 64 "
                                        "--threads 1 --steps 20 --resume --checkpoint-dir " +
                                        dir.file("kept"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step 5"), std::string::npos) << resumed.output;
}

TEST(Divergence, SkippingMoreStepsThanAllowedStopsWithoutWritingWeights) {
  TempDir dir;
  const RunResult r =
      train("--steps 20 --lr 1e30 --on-nonfinite skip-step --save-weights " + dir.file("w.st"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("more than --max-skipped-steps 10"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("w.st")));
}

// --- 10, 11, 15: what --checkpoint-dir holds -----------------------------------------------

TEST(CheckpointDir, ResumeRefusesAnotherSampleStreamAndNamesOtherChanges) {
  TempDir dir;
  const std::string ckpt = " --checkpoint-dir " + dir.file("D") + " --resume --steps 4";
  ASSERT_EQ(train(ckpt).exit_code, 0);
  for (const std::string& change :
       {std::string("--synthetic-samples 3000"), std::string("--no-shuffle")}) {
    const RunResult r = train(ckpt + " " + change);
    EXPECT_EQ(r.exit_code, 2) << change << "\n" << r.output;
    EXPECT_NE(r.output.find("the sample stream would differ"), std::string::npos) << r.output;
  }
  const RunResult r = train(ckpt + " --steps 8 --momentum 0.5 --weight-decay 0.1 --warmup-steps 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* named :
       {"--momentum 0.9 -> 0.5", "--weight-decay 0 -> 0.1", "--warmup-steps 0 -> 2"})
    EXPECT_NE(r.output.find(named), std::string::npos) << named << "\n" << r.output;
}

TEST(CheckpointDir, ALatestThatIsNotAFileIsNamedNotTakenForNoCheckpoint) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.file("D").c_str(), 0755), 0);
  const std::string latest = dir.file("D/latest.safetensors");
  const std::string ckpt = " --steps 2 --resume --checkpoint-dir " + dir.file("D");
  ASSERT_EQ(::symlink("latest.safetensors", latest.c_str()), 0);  // a loop
  RunResult r = train(ckpt);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("a symbolic link loop"), std::string::npos) << r.output;
  ::unlink(latest.c_str());
  ASSERT_EQ(::symlink("step-000000004.safetensors", latest.c_str()), 0);  // dangling
  r = train(ckpt);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("a dangling symbolic link"), std::string::npos) << r.output;
  ::unlink(latest.c_str());
  ASSERT_EQ(::mkfifo(latest.c_str(), 0644), 0);
  r = run_command("timeout 20 " + std::string(DDPTRAIN_PATH) + kSmall + ckpt);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("latest.safetensors is a FIFO"), std::string::npos) << r.output;
}

TEST(CheckpointDir, AnotherRunsFolderIsRefusedWithoutResume) {
  TempDir dir;
  const std::string ckpt = " --steps 2 --checkpoint-dir " + dir.file("D");
  ASSERT_EQ(train(ckpt + " --seed 1").exit_code, 0);
  const std::string before = read_file(dir.file("D/latest.safetensors"));
  RunResult r = train(ckpt + " --seed 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("holds the checkpoint of another run at step 2"), std::string::npos)
      << r.output;
  EXPECT_EQ(read_file(dir.file("D/latest.safetensors")), before);
  r = run_command(std::string(DDPTRAIN_PATH) +
                  " --data synthetic --layers 32,16,10 --synthetic-samples 2000 --quiet" + ckpt +
                  " --seed 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--layers 32,64,64,10 --seed 1, this run: --layers 32,16,10"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(train(ckpt + " --seed 2 --fresh").exit_code, 0) << "--fresh starts afresh there";
  EXPECT_EQ(read_file(dir.file("D/earlier-1/latest.safetensors")), before);
}

TEST(CheckpointDir, AFolderHeldByALiveJobIsRefusedAndAStaleLockTakenOver) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.file("D").c_str(), 0755), 0);
  const std::string lock = dir.file("D/.ddp-lock");
  {
    std::ofstream(lock) << "host elsewhere pid 4242";  // left by a job that died
  }
  RunResult r = train("--steps 2 --checkpoint-dir " + dir.file("D"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("taking over a stale lock (held by host elsewhere pid 4242"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(lock)) << "removed when the job ends";
  // A live holder: this test process holds the lock as a running job would.
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const std::string holder = "host here pid " + std::to_string(::getpid());
  ASSERT_EQ(::write(fd, holder.data(), holder.size()), static_cast<ssize_t>(holder.size()));
  r = train("--steps 2 --resume --checkpoint-dir " + dir.file("D"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("in use by a running job (held by " + holder + ")"), std::string::npos)
      << r.output;
  ::close(fd);
}

// --- 7, 9, 12, 13, 17: bad input refused before it costs anything -----------------------------

TEST(BadInput, AModelOrDataSetLargerThanTheMachineIsRefusedBeforeAllocating) {
  struct Case {
    std::string args, flag;
  };
  for (const Case& c : {Case{"--layers 32,200000,200000,10", "--layers 32,200000,200000,10"},
                        Case{"--layers 1000000,100000,10", "--layers 1000000,100000,10"},
                        Case{"--layers 32,64,10 --synthetic-samples 2000000000",
                             "--synthetic-samples 2000000000"}}) {
    const RunResult r =
        run_command(std::string(DDPTRAIN_PATH) + " --data synthetic --steps 2 " + c.args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("ddptrain: error: " + c.flag + ": this run needs about"),
              std::string::npos)
        << r.output;
    EXPECT_LT(r.seconds, 5) << "refused before allocating";
  }
}

TEST(BadInput, FlagsThatAreNotFiniteOrRoundAwayAreRefused) {
  for (const auto& [flag, message] : std::vector<std::pair<std::string, std::string>>{
           {"--weight-decay inf", "--weight-decay inf: expected a finite number"},
           {"--bucket-mb inf", "--bucket-mb inf: expected a size in MiB"},
           {"--bucket-mb 1e300", "--bucket-mb 1e+300: expected a size in MiB"},
           {"--first-bucket-mb nan", "--first-bucket-mb nan: expected a size"},
           {"--momentum 0.9999999999", "--momentum 0.9999999999: rounds to 1 in float32"},
           {"--partition ''", "--partition '': expected the layers of each stage"},
           {"--max-skipped-steps -2", "--max-skipped-steps -2: expected -1"},
           {"--product-sms -1", "--product-sms -1: expected 0 (all SMs) or a count of SMs"},
           {"--product-sms 8", "--product-sms: the GPU's products only; use --device cuda"},
           {"--weight-grad-stream on",
            "--weight-grad-stream: the GPU's backward only; use --device cuda"},
           {"--device cuda --weight-grad-stream 2",
            "--weight-grad-stream 2: expected auto, on or off"},
           {"--nccl-symmetric",
            "--nccl-symmetric: NCCL's windows hold GPU gradients; use --device cuda"},
           {"--device cuda --backend gloo --nccl-symmetric",
            "--nccl-symmetric: NCCL's windows hold GPU gradients; use --device cuda with "
            "--backend nccl"},
           {"--device cuda --nccl-symmetric --zero 1",
            "--nccl-symmetric with --zero 1: ZeRO reduce-scatters into pieces outside the window"},
           {"--fused-step", "--fused-step: the GPU's step only; use --device cuda"},
           {"--fused-step=force", "--fused-step: the GPU's step only; use --device cuda"},
           {"--device cuda --fused-step=fast", "--fused-step=fast: expected force, or no value"},
           {"--device cuda --fused-step force",
            "--fused-step force: write --fused-step=force (its value follows '=')"},
           {"--device cuda --check-replicas", "--check-replicas: runs on the CPU path only so far"},
           {"--device cuda --on-nonfinite skip-step",
            "--on-nonfinite skip-step: runs on the CPU path only so far (the GPU path stops)"},
           {"--profile-steps 2",
            "--profile-steps 2: a CUDA profiler's capture range; use --device cuda"},
           {"--device cuda --profile-steps 3-2",
            "--profile-steps 3-2: expected steps A-B with 1 <= A <= B"},
           {"--device cuda --profile-steps 0", "--profile-steps 0: expected steps A-B"},
           {"--device cuda --profile-steps 2-x", "--profile-steps 2-x: expected steps A-B"},
           {"--schedule zigzag",
            "--schedule zigzag: expected gpipe, 1f1b, pairs, zb-h1, interleaved-1f1b or zb-v"},
           {"--dp 2", "--dp 2 --pp 1: the world has 1 rank, not dp x pp = 2 (give --dp 1"}}) {
    const RunResult r = train("--steps 2 " + flag);
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flag << "\n" << r.output;
  }
}

TEST(BadInput, NonFiniteInitWeightsAreFoundAtLoad) {
  TempDir dir;
  const MlpShape shape = parse_layers("32,64,64,10");
  std::vector<float> params(shape.param_count(), 0.01f);
  params[1234] = std::numeric_limits<float>::quiet_NaN();
  save_mlp_weights(dir.file("w.st"), shape, params.data());
  const RunResult r = train("--steps 2 --init-weights " + dir.file("w.st"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--init-weights " + dir.file("w.st") + ": weight nan at index 1234"),
            std::string::npos)
      << r.output;
}

void write_gz_repeated(const std::string& path, const std::string& header, size_t zeros) {
  gzFile file = gzopen(path.c_str(), "wb9");
  gzwrite(file, header.data(), static_cast<unsigned>(header.size()));
  const std::vector<char> chunk(1 << 20, 0);
  for (size_t left = zeros; left > 0;) {
    const size_t n = std::min(left, chunk.size());
    gzwrite(file, chunk.data(), static_cast<unsigned>(n));
    left -= n;
  }
  gzclose(file);
}

TEST(BadInput, AGzipBombIsRefusedAtTheSizeItsHeaderDeclares) {
  TempDir dir;
  // Labels whose IDX header says 60,000 bytes, inflating to 1 GiB.
  const std::string header = {0, 0, 8, 1, 0, 0, static_cast<char>(0xea), 0x60};
  write_gz_repeated(dir.file("train-labels-idx1-ubyte.gz"), header, size_t{1} << 30);
  const std::string images = {0, 0,  8, 3, 0, 0, static_cast<char>(0xea), 0x60, 0, 0,
                              0, 28, 0, 0, 0, 28};
  write_gz_repeated(dir.file("train-images-idx3-ubyte.gz"), images, 60000 * 784);
  // ddptrain's peak memory, measured by a small process of its own: a child's peak counts its
  // parent's memory at the fork, and this test process may be large from earlier tests.
  const RunResult r = run_command(
      "/usr/bin/python3 -c 'import resource, subprocess, sys; "
      "code = subprocess.call(sys.argv[1:]); "
      "print(\"exit\", code, \"peak\", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' " +
      std::string(DDPTRAIN_PATH) + " --data fashion --steps 1 --data-dir " + dir.path());
  EXPECT_NE(r.output.find("exit 2 peak"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("train-labels-idx1-ubyte.gz: oversized IDX data: its header (magic "
                          "00000801: 1 dimension) declares 60008 bytes"),
            std::string::npos)
      << r.output;
  const size_t at = r.output.find(" peak ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const long peak_kib = std::stol(r.output.substr(at + 6));
  EXPECT_LT(peak_kib, 600 * 1024) << "KiB: the labels were inflated whole";
}

// Images with the labels' magic (one dimension) are named as what they look like; a set of 0
// images is exit 2 naming the file, not an internal failure in the sampler.
TEST(BadInput, AnIdxOfTheWrongKindOrOfNoSamplesIsNamed) {
  TempDir dir;
  const std::string one_dim = {0, 0, 8, 1, 0, 0, 0, 10};
  write_gz_repeated(dir.file("train-images-idx3-ubyte.gz"), one_dim, 10 * 784);
  write_gz_repeated(dir.file("train-labels-idx1-ubyte.gz"), one_dim, 10);
  RunResult r = run_command(std::string(DDPTRAIN_PATH) + " --data fashion --steps 1 --data-dir " +
                            dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("a labels file (magic 00000801) where images were expected?"),
            std::string::npos)
      << r.output;
  const std::string no_images = {0, 0, 8, 3, 0, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28};
  const std::string no_labels = {0, 0, 8, 1, 0, 0, 0, 0};
  for (const char* split : {"train", "t10k"}) {
    write_gz_repeated(dir.file(std::string(split) + "-images-idx3-ubyte.gz"), no_images, 0);
    write_gz_repeated(dir.file(std::string(split) + "-labels-idx1-ubyte.gz"), no_labels, 0);
  }
  r = run_command(std::string(DDPTRAIN_PATH) + " --data fashion --steps 1 --data-dir " +
                  dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train-images-idx3-ubyte.gz: holds no samples (its header says 0 x 28 "
                          "x 28)"),
            std::string::npos)
      << r.output;
}

TEST(BadInput, AWidthPastTheLimitNamesTheLimit) {
  const RunResult r =
      run_command(std::string(DDPTRAIN_PATH) + " --data synthetic --layers 8,16777217,4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--layers 8,16777217,4: a width of 16777217 is past the largest one, "
                          "16777216 (2^24)"),
            std::string::npos)
      << r.output;
}

TEST(BadInput, AnInputThatIsNotARegularFileIsNamedAsWhatItIs) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("train_x.npy").c_str(), 0644), 0);
  RunResult r = run_command("timeout 20 " + std::string(DDPTRAIN_PATH) +
                            " --data npy --steps 1 --data-dir " + dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train_x.npy: is a FIFO; expected a regular file"), std::string::npos)
      << r.output;
  ::unlink(dir.file("train_x.npy").c_str());
  ASSERT_EQ(::mkdir(dir.file("train_x.npy").c_str(), 0755), 0);
  r = run_command(std::string(DDPTRAIN_PATH) + " --data npy --steps 1 --data-dir " + dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("train_x.npy: is a folder; expected a regular file"), std::string::npos)
      << r.output;
}

TEST(BadInput, APipelineOnTooFewRanksNamesAWorldItCanRunOn) {
  const RunResult r = train("--steps 2 --pp 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the world of 1 rank is not a multiple of the stage count (world = "
                          "dp x pp; start 2 ranks, or a multiple of it)"),
            std::string::npos)
      << r.output;
}

// --- 18, 21, 22: checks that must be able to fail ---------------------------------------------

TEST(NonFinite, InfinitiesAreFoundAsWellAsNaNs) {
  std::vector<float> values(1001, 1.0f);
  EXPECT_FALSE(any_nonfinite(values.data(), values.size()));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t at : {size_t{0}, size_t{517}, values.size() - 1}) {
      std::vector<float> with = values;
      with[at] = bad;
      EXPECT_TRUE(any_nonfinite(with.data(), with.size())) << bad << " at " << at;
    }
  }
  // The largest finite floats and the denormals are finite.
  values[3] = std::numeric_limits<float>::max();
  values[4] = -std::numeric_limits<float>::max();
  values[5] = std::numeric_limits<float>::denorm_min();
  EXPECT_FALSE(any_nonfinite(values.data(), values.size()));
}

TEST(MicroBatches, TheDefaultCountIsCheckedAgainstTheBatchToo) {
  TrainConfig config;
  config.layers = "8,8,8,4";
  config.data = DataSource::kSynthetic;
  config.pp = 2;
  config.batch_size = 12;  // --micro-batches 0 means 4 x 2 = 8, which 12 does not divide
  try {
    validate(config);
    FAIL() << "--batch-size 12 with 8 micro-batches was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide into 8 micro-batches"), std::string::npos)
        << e.what();
  }
  config.batch_size = 16;
  EXPECT_NO_THROW(validate(config));
}

TEST(PipelineSlots, ASlotIsHeldUntilItsGradientIsSentOnAndItsWeightHalfDone) {
  for (PipelineSchedule schedule : all_schedules())
    for (int stages : {2, 3, 4})
      for (int stage = 0; stage < stages; ++stage) {
        const int micro = 8;
        if (schedule_chunks(schedule, 0, stages, 8, stages == 3 ? 9 : 8) > 1) continue;
        const auto actions = plan_schedule(schedule, stage, stages, micro);
        const SlotPlan plan = plan_slots(actions, micro, peak_live_activations(actions));
        std::vector<int> holder(static_cast<size_t>(plan.peak) + 1, -1);  // slot -> micro-batch
        for (size_t i = 0; i < actions.size(); ++i) {
          const PipelineAction& a = actions[i];
          const int slot = plan.slot[i];
          if (a.kind == ActionKind::kReduceGrad) continue;  // no micro-batch, no slot
          ASSERT_GE(slot, 0) << action_name(a.kind) << " " << a.micro_batch;
          // No two micro-batches in one slot: a slot's holder lasts until it is released.
          if (holder[slot] < 0) holder[slot] = a.micro_batch;
          EXPECT_EQ(holder[slot], a.micro_batch)
              << "stage " << stage << "/" << stages << ": slot " << slot << " reused by "
              << a.micro_batch << " while " << holder[slot] << " still holds it";
          // Released exactly at the send of its gradient (at its backward on stage 0), or at
          // its weight half where the schedule splits backward (that comes last).
          const bool release_point = splits_backward(schedule)
                                         ? a.kind == ActionKind::kBackwardWeight
                                     : stage == 0 ? a.kind == ActionKind::kBackward
                                                  : a.kind == ActionKind::kSendGradient;
          EXPECT_EQ(plan.releases[i], release_point) << action_name(a.kind) << " " << a.micro_batch;
          if (plan.releases[i]) holder[slot] = -1;
        }
        EXPECT_EQ(plan.peak, peak_live_activations(actions));
      }
}

}  // namespace
}  // namespace ddp
