// ddptrain as a user runs it: bad flags and inputs give one clear line and a non-zero exit.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/config.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

// Runs ddptrain; output holds stdout and stderr, or stderr alone with `stderr_only`.
RunResult run_ddptrain(const std::string& args, bool stderr_only = false) {
  return run_command(std::string(DDPTRAIN_PATH) + " " + args, stderr_only);
}

void expect_usage_error(const std::string& args, const std::string& message) {
  const RunResult result = run_ddptrain(args, /*stderr_only=*/true);
  EXPECT_EQ(result.exit_code, 2) << args << "\n" << result.output;
  EXPECT_NE(result.output.find(message), std::string::npos) << args << "\n" << result.output;
  EXPECT_EQ(result.output.find("ddptrain: error:"), 0u) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
}

TEST(DdptrainCli, HelpListsTheFlags) {
  const RunResult result = run_ddptrain("--help");
  EXPECT_EQ(result.exit_code, 0);
  for (const char* flag :
       {"--layers", "--batch-size", "--lr-schedule", "--save-weights", "--metrics"})
    EXPECT_NE(result.output.find(flag), std::string::npos) << flag;
}

std::vector<std::string> split_on(const std::string& text, const std::string& separator) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (size_t at; (at = text.find(separator, begin)) != std::string::npos;
       begin = at + separator.size())
    parts.push_back(text.substr(begin, at - begin));
  parts.push_back(text.substr(begin));
  return parts;
}

std::string trimmed(std::string text) {
  const auto keep = [](char c) { return c != ' ' && c != '`'; };
  while (!text.empty() && !keep(text.back()))
    text.pop_back();
  size_t start = 0;
  while (start < text.size() && !keep(text[start]))
    ++start;
  return text.substr(start);
}

// Every flag of --help is in the metrics' record of the configuration (a "no-" switch as the
// setting it clears), so that a run can be told apart from another by any of its flags.
TEST(DdptrainCli, EveryFlagIsInTheConfigRecord) {
  TempDir dir;
  const RunResult r = run_ddptrain("--data synthetic --layers 8,4 --steps 1 --quiet --metrics " +
                                   dir.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir.file("m.jsonl"));
  std::string first;
  std::getline(in, first);
  const nlohmann::json config = nlohmann::json::parse(first).at("config");
  const std::string help = run_ddptrain("--help").output;
  int flags = 0;
  for (size_t at = help.find("  --"); at != std::string::npos; at = help.find("  --", at + 1)) {
    const size_t begin = at + 4;
    const size_t end = help.find_first_of(" \n", begin);
    const std::string flag = help.substr(begin, end - begin);
    if (flag == "help" || flag == "version") continue;
    ++flags;
    const std::string key = flag.rfind("no-", 0) == 0 ? flag.substr(3) : flag;
    EXPECT_TRUE(config.contains(key)) << "--" << flag << " is not in the config record";
  }
  EXPECT_GE(flags, 50);
}

// --fused-step: the fused step where it is faster; --fused-step=force: also where slower;
// each recorded in the metrics' configuration.
TEST(DdptrainCli, FusedStepIsForcedOnlyWhenAskedTo) {
  auto parse = [](std::vector<std::string> args) {
    args.insert(args.begin(), "ddptrain");
    std::vector<char*> argv;
    for (std::string& a : args)
      argv.push_back(a.data());
    TrainConfig config;
    EXPECT_TRUE(parse_train_args(static_cast<int>(argv.size()), argv.data(), &config));
    return config;
  };
  const TrainConfig off = parse({"--device", "cuda"});
  EXPECT_FALSE(off.fused_step);
  EXPECT_EQ(config_json(off)["fused-step"], "off");
  const TrainConfig faster = parse({"--device", "cuda", "--fused-step"});
  EXPECT_TRUE(faster.fused_step);
  EXPECT_FALSE(faster.fused_step_force);
  EXPECT_EQ(config_json(faster)["fused-step"], "faster");
  const TrainConfig force = parse({"--fused-step=force", "--device", "cuda"});
  EXPECT_TRUE(force.fused_step);
  EXPECT_TRUE(force.fused_step_force);
  EXPECT_EQ(config_json(force)["fused-step"], "force");
  // --weight-grad-stream: auto unless given, and recorded.
  EXPECT_EQ(off.weight_grad_stream, WeightGradStream::kAuto);
  EXPECT_EQ(config_json(off)["weight-grad-stream"], "auto");
  const TrainConfig one = parse({"--device", "cuda", "--weight-grad-stream", "off"});
  EXPECT_EQ(one.weight_grad_stream, WeightGradStream::kOff);
  EXPECT_EQ(config_json(one)["weight-grad-stream"], "off");
}

// ddptrain's page, where its flags are documented.
constexpr const char* kFlagsPage = DOCS_DIR "/ddptrain.md";

// docs/ddptrain.md's flag table against --help: every default the table states is the one the
// parser has (a value in --help's "(default: X)").
// Every flag --help lists is on the page (the ones for tests say so there).
TEST(DdptrainCli, EveryFlagOfHelpIsOnItsPage) {
  std::ifstream in(kFlagsPage);
  ASSERT_TRUE(in.good()) << kFlagsPage;
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::regex option("^ +(-[a-z], )?--([a-z0-9-]+)");
  std::istringstream help(run_ddptrain("--help").output);
  int flags = 0;
  for (std::string line; std::getline(help, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, option)) continue;
    const std::string flag = m[2];
    if (flag == "help" || flag == "version") continue;
    ++flags;
    EXPECT_NE(page.find("`--" + flag), std::string::npos)
        << "--" << flag << " is not in docs/ddptrain.md";
  }
  EXPECT_GE(flags, 40);
}

TEST(DdptrainCli, ThePagesDefaultsMatchHelp) {
  std::ifstream in(kFlagsPage);
  ASSERT_TRUE(in.good()) << kFlagsPage;
  std::string help = run_ddptrain("--help").output;
  std::string flat;  // --help with its line wraps undone
  for (size_t i = 0; i < help.size(); ++i) {
    if (help[i] == '\n' || help[i] == ' ') {
      if (!flat.empty() && flat.back() != ' ') flat += ' ';
    } else {
      flat += help[i];
    }
  }
  int checked = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `--", 0) != 0) continue;
    const std::vector<std::string> cells = split_on(line, " | ");
    if (cells.size() < 3) continue;
    std::vector<std::string> flags = split_on(cells[0].substr(2), ", ");
    if (flags.size() == 1) flags = split_on(cells[0].substr(2), " / ");
    std::vector<std::string> defaults = split_on(cells[1], ", ");
    if (defaults.size() != flags.size()) defaults = split_on(cells[1], " / ");
    if (defaults.size() != flags.size()) continue;
    for (size_t i = 0; i < flags.size(); ++i) {
      const std::string flag = trimmed(flags[i]);
      std::string value = trimmed(defaults[i]);
      value = value.substr(0, value.find(' '));  // "0 (adamw: 0.01)" -> "0"
      if (value == "—" || value == "off" || value.empty()) continue;
      const size_t at = flat.find(flag + " arg ");
      ASSERT_NE(at, std::string::npos) << flag << " is in docs/ddptrain.md but not in --help";
      const size_t end = flat.find(" --", at + flag.size());
      const std::string entry = flat.substr(at, end == std::string::npos ? end : end - at);
      const size_t d = entry.find("(default: ");
      if (d == std::string::npos) continue;  // a default the parser does not state
      const std::string stated = entry.substr(d + 10, entry.find(')', d) - d - 10);
      EXPECT_EQ(stated.substr(0, stated.find(' ')), value)
          << flag << ": docs/ddptrain.md says " << value << ", --help says " << stated;
      ++checked;
    }
  }
  EXPECT_GE(checked, 15) << "docs/ddptrain.md's flag table was not found or not parsed";
}

TEST(DdptrainCli, MetricsStartWithTheRunsContextAndEveryRecordIsTimed) {
  TempDir dir;
  const RunResult r = run_ddptrain(
      "--data synthetic --layers 8,16,4 --steps 20 --log-every 5 "
      "--quiet --seed 7 --metrics " +
      dir.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir.file("m.jsonl"));
  std::string line;
  std::vector<nlohmann::json> records;
  while (std::getline(in, line))
    records.push_back(nlohmann::json::parse(line));
  ASSERT_GE(records.size(), 6u);
  const nlohmann::json& first = records.front();
  EXPECT_EQ(first["event"], "start");
  EXPECT_EQ(first["config"]["layers"], "8,16,4");
  EXPECT_EQ(first["config"]["seed"], 7);
  EXPECT_EQ(first["config"]["steps"], 20);
  EXPECT_EQ(first["world"]["size"], 1);
  EXPECT_FALSE(first["versions"]["ddp"].get<std::string>().empty());
  EXPECT_EQ(first["start_time"].get<std::string>().size(), 24u);  // 2026-11-29T17:55:02.123Z
  // The step strategy, once, after the first step: the CPU runs the schedule's actions.
  int strategies = 0;
  for (const nlohmann::json& record : records)
    if (record["event"] == "step_strategy") {
      ++strategies;
      EXPECT_EQ(record["strategy"], "schedule, eager") << record.dump();
      EXPECT_EQ(record["fused"], false);
      EXPECT_EQ(record["graph"], false);
    }
  EXPECT_EQ(strategies, 1);
  double last = -1;
  for (const nlohmann::json& record : records) {
    EXPECT_TRUE(record.contains("time")) << record.dump();
    ASSERT_TRUE(record.contains("elapsed_s")) << record.dump();
    EXPECT_GE(record["elapsed_s"].get<double>(), last) << record.dump();
    last = record["elapsed_s"].get<double>();
  }
}

TEST(DdptrainCli, BadFlagsAndValues) {
  expect_usage_error("--no-such-flag", "--no-such-flag: no such flag (see ddptrain --help)");
  // A mistyped flag is named with the one it most likely meant.
  expect_usage_error("--batchsize 64", "--batchsize: no such flag; did you mean --batch-size?");
  expect_usage_error("--batch_size 64", "did you mean --batch-size?");
  expect_usage_error("--sedd 1", "did you mean --seed?");
  expect_usage_error("--batch-size abc", "--batch-size abc: expected an integer");
  expect_usage_error("--lr 0.1x", "--lr 0.1x: expected a number");
  expect_usage_error("--seed -1", "--seed -1: expected a non-negative integer");
  expect_usage_error("--batch-size 0", "--batch-size 0: expected 1 to 1048576");
  expect_usage_error("--layers 784,x,10", "--layers 784,x,10");
  expect_usage_error("--lr-schedule linear", "--lr-schedule linear: expected constant or cosine");
  expect_usage_error("--optimizer adam", "--optimizer adam: expected sgd or adamw");
  expect_usage_error("--device tpu", "--device tpu");
  expect_usage_error("--steps 5 --epochs 2", "give one or the other");
  expect_usage_error("--data npy", "--data-dir is required");
  for (const char* timeout : {"inf", "1e300", "1e12", "0", "-1", "nan"})
    expect_usage_error(std::string("--timeout ") + timeout, "expected 0.1 to 604800 seconds");
  expect_usage_error("--on-nonfinite ignore", "--on-nonfinite ignore: expected stop or skip-step");
  expect_usage_error("--grad-reduce fp16", "--grad-reduce fp16: expected fp32 or bf16");
}

TEST(DdptrainCli, OutputsAreCheckedBeforeTheFirstStep) {
  TempDir dir;
  const std::string train = "--data synthetic --layers 8,4 --steps 50 --log-every 1 ";
  RunResult r = run_ddptrain(train + "--save-weights " + dir.file("missing/w.safetensors"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--save-weights " + dir.file("missing/w.safetensors") +
                          ": cannot create files in " + dir.file("missing")),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "trained first:\n" << r.output;
  r = run_ddptrain(train + "--metrics " + dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is a folder"), std::string::npos) << r.output;
  std::ofstream(dir.file("file")) << "x";
  r = run_ddptrain(train + "--checkpoint-dir " + dir.file("file/ckpt"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--checkpoint-dir " + dir.file("file/ckpt") +
                          ": cannot create it (Not a directory)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
}

TEST(DdptrainCli, ACheckpointThatIsAFolderAndAFullDiskSayWhat) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.file("ckpt").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(dir.file("ckpt/latest.safetensors").c_str(), 0755), 0);
  RunResult r = run_ddptrain(
      "--data synthetic --layers 8,4 --steps 2 --quiet --resume "
      "--checkpoint-dir " +
      dir.file("ckpt"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("latest.safetensors is a folder; expected a checkpoint file"),
            std::string::npos)
      << r.output;
  if (::geteuid() != 0) GTEST_SKIP() << "/dev/full needs root to pass the folder check";
  r = run_ddptrain("--data synthetic --layers 8,4 --steps 2 --quiet --metrics /dev/full");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--metrics /dev/full: write failed (No space left on device)"),
            std::string::npos)
      << r.output;
}

TEST(DdptrainCli, ADivergedRunStopsAndKeepsTheGoodCheckpoint) {
  TempDir dir;
  const std::string run =
      "--data synthetic --layers 64,128,8 --checkpoint-every 50 --quiet "
      "--checkpoint-dir " +
      dir.file("ckpt") + " --resume ";
  ASSERT_EQ(run_ddptrain(run + "--steps 100").exit_code, 0);
  const std::string good = read_file(dir.file("ckpt/latest.safetensors"));
  const RunResult r =
      run_ddptrain(run + "--steps 300 --lr 1e30 --save-weights " + dir.file("w.safetensors"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("non-finite"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on rank 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopped before"), std::string::npos) << r.output;
  EXPECT_TRUE(read_file(dir.file("ckpt/latest.safetensors")) == good)
      << "the good checkpoint changed";
  EXPECT_FALSE(std::ifstream(dir.file("w.safetensors")).good());
}

TEST(DdptrainCli, SkipStepCountsTheSkippedStepsInTheMetrics) {
  TempDir dir;
  const RunResult r = run_ddptrain(
      "--data synthetic --layers 64,128,8 --steps 40 --lr 1e30 --quiet --on-nonfinite skip-step "
      "--metrics " +
      dir.file("m.jsonl"));
  const std::string metrics = read_file(dir.file("m.jsonl"));
  EXPECT_NE(metrics.find("\"event\":\"skipped_step\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("skipping step"), std::string::npos) << r.output;
}

TEST(DdptrainCli, BadDataAndWeights) {
  TempDir dir;
  expect_usage_error("--data fashion --data-dir " + dir.path(),
                     "train-images-idx3-ubyte.gz: no such file");
  expect_usage_error("--data synthetic --layers 8,4 --init-weights " + dir.file("none.safetensors"),
                     "none.safetensors: cannot open");
  expect_usage_error("--data synthetic --layers 8,4 --steps 1 --metrics " + dir.file("no/m.jsonl"),
                     "--metrics " + dir.file("no/m.jsonl") + ": cannot create files in");
}

TEST(DdptrainCli, TrainsSyntheticAndWritesMetricsAndWeights) {
  TempDir dir;
  const RunResult result = run_ddptrain(
      "--data synthetic --layers 8,16,3 --synthetic-samples 300 --batch-size 30 --epochs 2 "
      "--log-every 5 --metrics " +
      dir.file("m.jsonl") + " --save-weights " + dir.file("w.safetensors"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("test accuracy"), std::string::npos) << result.output;
  std::ifstream metrics(dir.file("m.jsonl"));
  std::string line, last;
  int steps = 0;
  bool first_step = false;
  while (std::getline(metrics, line)) {
    steps += line.find("\"event\":\"step\"") != std::string::npos;
    first_step = first_step || line.find("\"event\":\"first_step\"") != std::string::npos;
    last = line;
  }
  EXPECT_EQ(steps, 4);  // steps 5, 10, 15, 20
  EXPECT_TRUE(first_step);
  EXPECT_NE(last.find("\"event\":\"end\""), std::string::npos) << last;
  // The weights fit the model they came from, and not another.
  EXPECT_EQ(
      run_ddptrain("--data synthetic --layers 8,16,3 --synthetic-samples 30 --steps 1 --quiet "
                   "--init-weights " +
                   dir.file("w.safetensors"))
          .exit_code,
      0);
  expect_usage_error(
      "--data synthetic --layers 8,12,3 --synthetic-samples 30 --steps 1 "
      "--init-weights " +
          dir.file("w.safetensors"),
      "has shape [16, 8], expected [12, 8]");
}

TEST(Ddpdoctor, ReportsTheBuildAndTheMachine) {
  const RunResult r = run_command(DDPDOCTOR_PATH);
  for (const char* line : {"build: CUDA", "build: NCCL", "build: Gloo", "build: MPI",
                           "build: LibTorch", "build: MUNGE", "NVIDIA driver",
                           "CUDA_VISIBLE_DEVICES", "network", "lo=127.0.0.1", "failure(s)"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  EXPECT_EQ(run_command(std::string(DDPDOCTOR_PATH) + " --help").exit_code, 0);
  EXPECT_EQ(run_command(std::string(DDPDOCTOR_PATH) + " --bogus").exit_code, 2);
}

TEST(Ddpdoctor, AMachineWithoutGpusIsFineForCpuTrainingUnlessAGpuIsRequired) {
  if (run_command("nvidia-smi -L").exit_code == 0) GTEST_SKIP() << "this machine has a GPU";
  const RunResult cpu = run_command(DDPDOCTOR_PATH);
  EXPECT_EQ(cpu.exit_code, 0) << cpu.output;
  EXPECT_NE(cpu.output.find("warn  NVIDIA driver"), std::string::npos) << cpu.output;
  const RunResult gpu = run_command(std::string(DDPDOCTOR_PATH) + " --require-gpu");
  EXPECT_EQ(gpu.exit_code, 1) << gpu.output;
  EXPECT_NE(gpu.output.find("FAIL  NVIDIA driver"), std::string::npos) << gpu.output;
}

TEST(Ddpdoctor, AVisibleDeviceThatDoesNotExistIsAFailure) {
  const RunResult r =
      run_command(std::string("CUDA_VISIBLE_DEVICES=GPU-00000000-no-such ") + DDPDOCTOR_PATH);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("GPU-00000000-no-such (no such GPU)"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ddp
