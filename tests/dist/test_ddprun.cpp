// ddprun with real worker processes: the environment contract, failure propagation,
// signals, restarts, the store end to end, and no CUDA library in ddprun.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "launcher/console.h"
#include "runtime/parse.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

std::string ddprun() {
  return DDPRUN_PATH;
}

// The tests start CPU workers: hide this machine's GPUs (if any) from ddprun unless a test
// sets CUDA_VISIBLE_DEVICES itself.
class HideGpus : public ::testing::Environment {
 public:
  void SetUp() override { ::setenv("CUDA_VISIBLE_DEVICES", "", 1); }
};
const auto* const kHideGpus = ::testing::AddGlobalTestEnvironment(new HideGpus);

// --help: one usage line, and every value the flags take (auto, last_call_timeout).
TEST(Ddprun, HelpSaysUsageOnceAndEveryValue) {
  const RunResult r = run_command(ddprun() + " --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("Usage:"), r.output.rfind("Usage:")) << r.output;
  EXPECT_NE(r.output.find("ddprun [options] [--] PROGRAM [ARGS...]"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("auto (gpu where there are GPUs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("last_call_timeout"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--python"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("numbered as they join"), std::string::npos) << r.output;
  // The environment it reads (the store's secret past one node) and examples, after the flags.
  EXPECT_NE(r.output.find("Environment (read):\n  DDP_STORE_TOKEN"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Examples:\n  ddprun --nproc-per-node gpu"), std::string::npos)
      << r.output;
}

// torchrun's default where a user expects it: `ddprun --standalone PROGRAM` on a machine
// without GPUs starts one worker (and says why), not an error about GPUs.
TEST(Ddprun, WithoutNprocPerNodeAMachineWithoutGpusGetsOneWorker) {
  const RunResult r = run_command(ddprun() + " --standalone -- sh -c 'echo R=$RANK W=$WORLD_SIZE'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("R=0 W=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no GPU found"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("one CPU worker, torchrun's default"), std::string::npos) << r.output;
  const RunResult asked = run_command(ddprun() + " --nproc-per-node gpu -- true");
  EXPECT_EQ(asked.exit_code, 2) << asked.output;
  EXPECT_NE(asked.output.find("--nproc-per-node gpu: no GPU found"), std::string::npos)
      << asked.output;
}

TEST(Ddprun, EnvironmentContractForEachWorker) {
  const RunResult r =
      run_command("CUDA_VISIBLE_DEVICES=4,6 " + ddprun() +
                  " --nproc-per-node 2 -- sh -c 'echo R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK "
                  "LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK C=$CUDA_VISIBLE_DEVICES "
                  "A=$MASTER_ADDR P=$MASTER_PORT T=${#DDP_STORE_TOKEN} X=$DDP_RESTART_COUNT "
                  "SP=$DDP_STORE_PORT'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] R=0 W=2 L=0 LW=2 G=0 C=4 A=127.0.0.1 P="), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[rank 1] R=1 W=2 L=1 LW=2 G=0 C=6 A=127.0.0.1 P="), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("T=32 X=0"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("P=0 "), std::string::npos) << "port 0 must be replaced by the real port";
  // MASTER_PORT is the program's, not ddprun's store.
  const size_t p = r.output.find(" P="), sp = r.output.find(" SP=");
  ASSERT_NE(p, std::string::npos);
  ASSERT_NE(sp, std::string::npos);
  EXPECT_NE(std::atoi(r.output.c_str() + p + 3), std::atoi(r.output.c_str() + sp + 4)) << r.output;
}

// An ordinary PyTorch DDP script runs unchanged under ddprun (as under torchrun): rank 0
// serves its own store on MASTER_PORT, which ddprun leaves free.
TEST(Ddprun, RunsAnUnchangedTorchDistributedScript) {
  std::string py;
  for (const char* candidate : {"python3", "/usr/bin/python3"})
    if (run_command(std::string(candidate) + " -c 'import torch.distributed'").exit_code == 0) {
      py = candidate;
      break;
    }
  if (py.empty()) GTEST_SKIP() << "no Python with torch (Debian: python3-torch)";
  TempDir dir;
  std::ofstream(dir.file("train.py")) << R"(import torch
import torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(3) * (rank + 1)
dist.all_reduce(t)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.randn(8, 4)).sum().backward()
grad = model.module.weight.grad.clone()
dist.all_reduce(grad)
same = torch.allclose(grad / world, model.module.weight.grad)
print(f"rank {rank} of {world}: sum {t.tolist()}, ddp step ok {same}", flush=True)
dist.destroy_process_group()
)";
  // Every rank a client of the store ddprun serves (TORCHELASTIC_USE_AGENT_STORE), and
  // (--no-torch-store) rank 0 serving torch's store itself.
  for (const char* store : {"", " --no-torch-store"}) {
    const RunResult r =
        run_command(ddprun() + store + " --nproc-per-node 2 -- " + py + " " + dir.file("train.py"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("rank 0 of 2: sum [3.0, 3.0, 3.0], ddp step ok True"),
              std::string::npos)
        << store << r.output;
    EXPECT_NE(r.output.find("rank 1 of 2: sum [3.0, 3.0, 3.0], ddp step ok True"),
              std::string::npos)
        << store << r.output;
  }
}

// The torch store ddprun serves against PyTorch's own server, through PyTorch's own client:
// the same queries (compare_set with a matching and a differing expected value, on present
// and missing keys; add; waits of several keys, one of them missing, first or last; delete;
// num_keys) get the same answers; then a stranger's set of text and an add to it (which once
// aborted ddprun) and a set past int64 close that client only, and the job goes on.
TEST(Ddprun, ServesPyTorchsStoreAsPyTorchsOwnServerDoes) {
  if (run_command("/usr/bin/python3 -c 'import torch.distributed'").exit_code != 0)
    GTEST_SKIP() << "no Python with torch (Debian: python3-torch)";
  TempDir dir;
  std::ofstream(dir.file("store.py")) << R"(import datetime, os, sys
import torch.distributed as d
def ops(connect):
    # (a wait that timed out leaves its answer pending on its connection: a fresh one each)
    s = connect()
    out = []
    base = s.num_keys()
    s.set("a", "1")
    out.append(s.compare_set("a", "0", "2"))
    out.append(s.get("a"))
    out.append(s.compare_set("a", "1", "3"))
    out.append(s.get("a"))
    out.append(s.compare_set("new", "", "x"))
    out.append(s.compare_set("missing", "y", "z"))
    out.append(s.add("n", 5))
    out.append(s.add("n", -7))
    for keys in (["a", "n"], ["a", "nope"], ["nope", "a"], ["missing"]):
        try:
            connect().wait(keys, datetime.timedelta(seconds=0.5))
            out.append("waited")
        except Exception:
            out.append("timed out")
    s.set("nope", "v")
    s.wait(["a", "nope"], datetime.timedelta(seconds=5))
    out.append("waited")
    out.append(s.num_keys() - base)
    out.append(s.delete_key("a"))
    out.append(s.delete_key("a"))
    out.append(s.num_keys() - base)
    return out
server = d.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
theirs = ops(lambda: d.TCPStore("127.0.0.1", server.port, None, False))
port = int(os.environ["MASTER_PORT"])
ours = ops(lambda: d.TCPStore(os.environ["MASTER_ADDR"], port, None, False))
print("torch:", theirs)
print("ddprun:", ours)
stranger = d.TCPStore(os.environ["MASTER_ADDR"], port, None, False)
stranger.set("k", "abc")
try:
    stranger.add("k", 1)
    print("add to text answered")
except Exception:
    print("add to text refused")
big = d.TCPStore(os.environ["MASTER_ADDR"], port, None, False)
big.set("m", "99999999999999999999")
try:
    big.add("m", 1)
except Exception:
    pass
after = d.TCPStore(os.environ["MASTER_ADDR"], port, None, False)
print("still serving:", after.add("alive", 1), after.get("k"))
sys.exit(0 if theirs == ours else 1)
)";
  const RunResult r =
      run_command(ddprun() + " --nproc-per-node 1 -- /usr/bin/python3 " + dir.file("store.py"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("add to text refused"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("still serving: 1 b'abc'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("PyTorch's store refused a client: 127.0.0.1: an add to a key that "
                          "holds no integer"),
            std::string::npos)
      << r.output;
}

TEST(Ddprun, MoreGpuWorkersThanGpusIsAnError) {
  const RunResult r =
      run_command("CUDA_VISIBLE_DEVICES=4,6 " + ddprun() + " --nproc-per-node 3 -- true");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("only 2 GPUs found (CUDA_VISIBLE_DEVICES: 4,6)"), std::string::npos)
      << r.output;
}

TEST(Ddprun, OutputIsPrefixedAndLoggedPerRank) {
  TempDir dir;
  const RunResult r =
      run_command(ddprun() + " --nproc-per-node 3 --log-dir " + dir.file("logs") +
                  " -- sh -c 'echo out-$RANK; echo err-$RANK >&2; printf no-newline-$RANK'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string k = std::to_string(rank);
    EXPECT_NE(r.output.find("[rank " + k + "] out-" + k), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("[rank " + k + "] err-" + k), std::string::npos) << r.output;
    const std::string log = read_file(dir.file("logs/rank-" + k + ".log"));
    EXPECT_NE(log.find("out-" + k + "\n"), std::string::npos) << log;
    EXPECT_NE(log.find("err-" + k + "\n"), std::string::npos) << log;
    EXPECT_NE(log.find("no-newline-" + k), std::string::npos) << log;
  }
}

// A console nobody reads (ddprun's stdout a FIFO whose reader never reads): rank 0 fails, and
// ddprun still reaps it, stops the chatty rank 1 and exits naming rank 0, within the grace
// period rather than when the reader goes away.
TEST(Ddprun, AnUnreadConsoleDoesNotStopSupervision) {
  TempDir dir;
  std::ofstream(dir.file("run.sh"))
      << "mkfifo " << dir.file("console") << "\n"
      << "sleep 120 < " << dir.file("console") << " > /dev/null &\n"
      << "reader=$!\n"
      << "start=$(date +%s)\n"
      << ddprun() << " --nproc-per-node 2 --grace-period 2 --log-dir " << dir.file("logs")
      << " -- sh -c 'if [ $RANK = 0 ]; then sleep 2; exit 3; fi; "
         "yes chatty-line-of-rank-1 | head -c 4000000; sleep 100' > "
      << dir.file("console") << " 2> " << dir.file("err") << "\n"
      << "echo rc=$? after=$(( $(date +%s) - start ))\n"
      << "kill $reader\n";
  const RunResult r = run_command("sh " + dir.file("run.sh"));
  const std::string err = read_file(dir.file("err"));
  EXPECT_NE(r.output.find("rc=3 "), std::string::npos) << r.output << err;
  const size_t after = r.output.find("after=");
  ASSERT_NE(after, std::string::npos) << r.output;
  EXPECT_LE(std::atoi(r.output.c_str() + after + 6), 20) << r.output << err;
  EXPECT_NE(err.find("rank 0 failed first"), std::string::npos) << err;
  // Rank 1 wrote on until ddprun stopped reading (its console queue full: it waits, as on a
  // slow terminal) and was then stopped with the group; its log has what it wrote.
  EXPECT_GE(count_of(read_file(dir.file("logs/rank-1.log")), "chatty-line-of-rank-1\n"),
            (Console::kMaxQueuedBytes - 65536) / 31);
}

// A SIGTERM with a console that reads nothing (its queue full): ddprun stops the group and
// exits within the grace period, not at the console's stall mark (10 s without progress).
TEST(Ddprun, ASignalWithAStalledConsoleEndsWithinTheGracePeriod) {
  TempDir dir;
  std::ofstream(dir.file("run.sh"))
      << "mkfifo " << dir.file("console") << "\n"
      << "sleep 120 < " << dir.file("console") << " > /dev/null &\n"
      << "reader=$!\n"
      << ddprun() << " --nproc-per-node 1 --grace-period 2 -- sh -c "
      << "'yes chatty-line | head -c 8000000; sleep 100' > " << dir.file("console") << " 2> "
      << dir.file("err") << " &\n"
      << "job=$!\n"
      << "sleep 1.5\n"
      << "kill -TERM $job\n"
      << "start=$(date +%s%N)\n"
      << "wait $job; rc=$?\n"
      << "echo rc=$rc after_ms=$(( ($(date +%s%N) - start) / 1000000 ))\n"
      << "kill $reader\n";
  const RunResult r = run_command("bash " + dir.file("run.sh"));
  const std::string err = read_file(dir.file("err"));
  EXPECT_NE(r.output.find("rc=143 "), std::string::npos) << r.output << err;
  const size_t after = r.output.find("after_ms=");
  ASSERT_NE(after, std::string::npos) << r.output;
  // The grace period (2 s) and a second's margin for a loaded machine; before: 8.5 s.
  EXPECT_LE(std::atoi(r.output.c_str() + after + 9), 5000) << r.output << err;
}

// A console that reads slowly (a pipe whose reader sleeps first) gets every line: ddprun holds
// the worker back instead of dropping what it cannot pass on yet.
TEST(Ddprun, ASlowConsoleLosesNoLine) {
  const RunResult r =
      run_command(ddprun() +
                  " --nproc-per-node 1 -- sh -c 'yes line-of-output | head -n 400000' 2>/dev/null "
                  "| (sleep 2; cat) | grep -c line-of-output");
  EXPECT_EQ(r.output, "400000\n");
}

TEST(Ddprun, QuietShowsOnlyRankZero) {
  const RunResult r =
      run_command(ddprun() + " --nproc-per-node 2 --quiet -- sh -c 'echo hi-$RANK'");
  EXPECT_NE(r.output.find("[rank 0] hi-0"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("hi-1"), std::string::npos) << r.output;
}

TEST(Ddprun, FirstFailureStopsTheOthersAndSetsTheExitCode) {
  const RunResult r =
      run_command(ddprun() +
                  " --nproc-per-node 3 --grace-period 2 -- sh -c "
                  "'if [ $RANK = 1 ]; then echo about to fail; exit 3; fi; exec sleep 60'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 10.0) << "the others were not stopped";
  EXPECT_NE(r.output.find("rank 1 failed first: exit code 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| about to fail"), std::string::npos) << r.output;
}

// Ranks that fail at about the same time (every rank meets the same disagreement) are each
// heard: the teardown waits a moment for them before SIGTERM, and names those that ended on their
// own. Rank 1 fails just after rank 0 (it waits for rank 0's mark), rank 2 would run on.
TEST(Ddprun, RanksThatFailOnTheirOwnJustAfterTheFirstAreHeard) {
  TempDir dir;
  const std::string mark = dir.path() + "/rank0-failed";
  const RunResult r = run_command(ddprun() +
                                  " --nproc-per-node 3 --grace-period 5 -- sh -c '"
                                  "if [ $RANK = 0 ]; then echo rank-0-own-error; touch " +
                                  mark +
                                  "; exit 3; fi; "
                                  "if [ $RANK = 1 ]; then while [ ! -e " +
                                  mark +
                                  " ]; do sleep 0.01; done; "
                                  "sleep 0.1; echo rank-1-own-error; exit 4; fi; exec sleep 60'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 15.0) << "the others were not stopped";
  EXPECT_NE(r.output.find("rank 0 failed first: exit code 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] rank-1-own-error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 also failed before the teardown: exit code 4"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("rank 2 also failed"), std::string::npos) << r.output;
}

// Each rank's wrapper script starts one sleep in its own session (setsid) and one in its group;
// kill -9 of ddprun leaves neither behind (each worker's guard is their subreaper).
TEST(Ddprun, WorkersBehindAWrapperScriptDieWithAKilledDdprun) {
  TempDir dir;
  const std::string script =
      "export DDP_TEST_TAG=" + dir.path() + "\n" + ddprun() +
      " --nproc-per-node 2 -- sh -c 'setsid sh -c \"sleep 297\" < /dev/null > /dev/null 2>&1 & "
      "sh -c \"sleep 297\"; true' > /dev/null 2>&1 &\n"
      "launcher=$!\n"
      "sleeping() { n=0; for d in /proc/[0-9]*; do [ \"$(cat $d/comm 2>/dev/null)\" = sleep ] && "
      "tr '\\0' '\\n' < $d/environ 2>/dev/null | grep -qx \"DDP_TEST_TAG=" +
      dir.path() +
      "\" && n=$((n + 1)); done; echo $n; }\n"
      "for i in $(seq 100); do [ $(sleeping) -ge 4 ] && break; sleep 0.05; done\n"
      "echo running $(sleeping)\n"
      "kill -9 $launcher\n"
      "sleep 1\n"
      "for d in /proc/[0-9]*; do tr '\\0' '\\n' < $d/environ 2>/dev/null | "
      "grep -qx \"DDP_TEST_TAG=" +
      dir.path() +
      "\" && echo LEFT BEHIND $(cat $d/comm); done\n"
      "true\n";
  std::ofstream(dir.file("run.sh")) << script;
  const RunResult r = run_command("sh " + dir.file("run.sh"));
  EXPECT_NE(r.output.find("running 4"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("LEFT BEHIND"), std::string::npos) << r.output;
}

TEST(Ddprun, ALineWithoutNewlineIsPassedOnInBoundedPieces) {
  // 5 MiB without a newline: ddprun must not hold it whole.
  const RunResult r = run_command(ddprun() +
                                  " --nproc-per-node 1 -- sh -c 'head -c 5242880 /dev/zero | tr "
                                  "\"\\000\" x; echo; echo done' | awk '{ print length($0) }'");
  EXPECT_EQ(r.exit_code, 0) << r.output.substr(0, 2000);
  // Pieces of "[rank 0] " + 1 MiB + " [line split by ddprun]"; the last MiB may arrive with
  // its newline and pass as an ordinary line. No line is longer, and every x arrives.
  EXPECT_GE(count_of(r.output, "1048608\n"), 4) << r.output.substr(0, 2000);
  std::istringstream lengths(r.output);
  long longest = 0, total = 0;
  for (long n; lengths >> n;) {
    longest = std::max(longest, n);
    if (n > 13) total += n - 9 - (n == 1048608 ? 23 : 0);
  }
  EXPECT_LE(longest, 1048608) << r.output.substr(0, 2000);
  EXPECT_EQ(total, 5242880) << r.output.substr(0, 2000);
}

TEST(Ddprun, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
  const RunResult r =
      run_command(ddprun() +
                  " --nproc-per-node 2 --grace-period 1 -- sh -c "
                  "'trap \"\" TERM; if [ $RANK = 0 ]; then exit 5; fi; sleep 60 & wait; sleep 60'");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_LT(r.seconds, 10.0);
}

TEST(Ddprun, SignalDeathIsReportedByName) {
  const RunResult r = run_command(ddprun() +
                                  " --nproc-per-node 2 -- sh -c "
                                  "'if [ $RANK = 1 ]; then kill -9 $$; fi; exec sleep 60'");
  EXPECT_EQ(r.exit_code, 128 + 9) << r.output;
  EXPECT_NE(r.output.find("rank 1 failed first: killed by SIGKILL (9)"), std::string::npos)
      << r.output;
}

TEST(Ddprun, SigintReachesEveryWorker) {
  TempDir dir;
  const std::string script = "trap 'echo int > " + dir.path() +
                             "/got-$RANK; exit 0' INT; "
                             "echo ready > " +
                             dir.path() + "/ready-$RANK; while true; do sleep 0.05; done";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(DDPRUN_PATH, "ddprun", "--nproc-per-node", "3", "--", "sh", "-c", script.c_str(),
            nullptr);
    ::_exit(127);
  }
  for (int i = 0; i < 200; ++i) {
    bool all = true;
    for (int r = 0; r < 3; ++r)
      all = all && std::filesystem::exists(dir.file("ready-" + std::to_string(r)));
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGINT);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT);
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(std::filesystem::exists(dir.file("got-" + std::to_string(r)))) << "rank " << r;
}

TEST(Ddprun, RestartsCountUpThenGiveUp) {
  TempDir dir;
  const RunResult r =
      run_command(ddprun() +
                  " --nproc-per-node 2 --max-restarts 2 -- sh -c "
                  "'echo $DDP_RESTART_COUNT >> " +
                  dir.path() + "/r-$RANK; if [ $RANK = 0 ]; then exit 1; fi; exec sleep 30'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 20.0) << "rank 1 was not stopped after each failure";
  EXPECT_EQ(read_file(dir.file("r-0")), "0\n1\n2\n");
  EXPECT_NE(r.output.find("restarting the group (restart 2 of 2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("giving up after 2 restarts"), std::string::npos) << r.output;
}

TEST(Ddprun, RestartSucceedsOnALaterAttempt) {
  const RunResult r = run_command(ddprun() +
                                  " --nproc-per-node 2 --max-restarts 3 -- sh -c "
                                  "'test $DDP_RESTART_COUNT -ge 1'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(Ddprun, WorkersMeetAtTheStore) {
  const RunResult r = run_command(ddprun() + " --nproc-per-node 4 -- " + WORKER_PATH + " store");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.output.find("store ok rank=" + std::to_string(rank) +
                            " world=4 sum=10 peer=" + std::to_string((rank + 1) % 4 * 10)),
              std::string::npos)
        << r.output;
}

TEST(Ddprun, StoreWorksAgainAfterARestart) {
  TempDir dir;
  const std::string once = dir.file("once");
  const RunResult r =
      run_command(ddprun() + " --nproc-per-node 2 --max-restarts 1 -- sh -c '" + WORKER_PATH +
                  " store && if [ $DDP_RESTART_COUNT = 0 ] && [ $RANK = 0 ]; then exit 9; fi'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("restarting the group"), std::string::npos) << r.output;
}

// Two nodes on this machine (two ddprun processes with --nnodes 2).
std::string two_nodes(int port, const std::string& node0_worker, const std::string& node1_worker,
                      const std::string& extra = "") {
  const std::string common = "DDP_STORE_TOKEN=t0k3n " + ddprun() + " --nnodes 2 --master-port " +
                             std::to_string(port) + " --nproc-per-node 1 --grace-period 1 " + extra;
  return "{ (" + common + " --node-rank 0 -- sh -c '" + node0_worker +
         "' 2>&1 | sed 's/^/node0 /') & (" + common + " --node-rank 1 -- sh -c '" + node1_worker +
         "' 2>&1 | sed 's/^/node1 /'); wait; }";
}

TEST(Ddprun, NodesAgreeOnTheGenerationWhenOneNodeFails) {
  // Node 1's worker fails in generation 0; node 0's worker would sleep a minute there. Both
  // nodes must move to generation 1 at once, where both workers succeed.
  const std::string worker =
      "echo gen=$DDP_RESTART_COUNT rank=$RANK; if [ $DDP_RESTART_COUNT = 0 ]; then "
      "if [ $GROUP_RANK = 1 ]; then exit 3; fi; exec sleep 60; fi";
  const RunResult r = run_command(two_nodes(free_port(), worker, worker, "--max-restarts 1"));
  EXPECT_LT(r.seconds, 20.0) << "node 0 waited for its worker\n" << r.output;
  EXPECT_NE(r.output.find("node1 ddprun: rank 1 failed first: exit code 3"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("node0 ddprun: another node's workers failed in generation 0"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("node0 [rank 0] gen=1 rank=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("node0 ddprun: starting 1 worker (CPU), store on 0.0.0.0:"),
            std::string::npos)
      << "node 0 says where its store really listens\n"
      << r.output;
  EXPECT_NE(r.output.find("node1 [rank 1] gen=1 rank=1"), std::string::npos) << r.output;
}

// A secret in DDP_STORE_TOKEN stays the token when --rdzv-id is given too (torchrun's lines
// always have one): the id is the run's, said in every hello, never a replacement for the
// secret; and an id that every job shares (torchrun's default "none", or '') makes no token.
TEST(Ddprun, TheSecretStaysTheTokenAndASharedRunIdMakesNone) {
  const std::string worker = "echo token=$DDP_STORE_TOKEN run=$TORCHELASTIC_RUN_ID";
  const RunResult r =
      run_command(two_nodes(free_port(), worker, worker, "--rdzv-id job7 --timeout 20"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "token=t0k3n run=job7"), 2) << r.output;
  EXPECT_EQ(r.output.find("derived from --rdzv-id"), std::string::npos) << r.output;
  for (const std::string id : {"none", "''"}) {
    const RunResult shared =
        run_command("env -u DDP_STORE_TOKEN " + ddprun() + " --nnodes 2 --node-rank 1 --rdzv-id " +
                    id + " --master-port 1 -- true");
    EXPECT_EQ(shared.exit_code, 2) << shared.output;
    EXPECT_NE(shared.output.find("--rdzv-id '" + (id == "''" ? std::string() : id) +
                                 "': every job that gives no id has that one"),
              std::string::npos)
        << shared.output;
  }
}

// A node that joins an elastic job and vanishes (kill -9 of its ddprun and its worker, as a
// stranger with the id would, twice) is named as lost by the node that stays, and spends no
// restart: with --max-restarts 0 the job goes on alone and finishes.
TEST(Ddprun, AnElasticNodeThatVanishesIsNamedAsLostAndSpendsNoRestart) {
  TempDir dir;
  const std::string node =
      "env DDP_STORE_TOKEN=t0k3n " + ddprun() +
      " --nnodes 1:3 --nproc-per-node 1 --rdzv-endpoint " +
      "127.0.0.1:" + std::to_string(free_port()) +
      " --rdzv-conf last_call_timeout=0.3 --max-restarts 0 --timeout 2 --grace-period 1 -- sh -c "
      "'echo gen=$DDP_RESTART_COUNT nodes=$GROUP_WORLD_SIZE; exec sleep 6'";
  std::ofstream(dir.file("job.sh"))
      << "wait_for() { for i in $(seq 300); do grep -q \"$2\" \"$1\" && return 0; sleep 0.1; done; "
         "echo \"no '$2' in $1\"; return 1; }\n"
      << node << " > " << dir.file("a.log") << " 2>&1 &\n"
      << "a=$!\n"
      << "wait_for " << dir.file("a.log") << " 'gen=0 nodes=1' || { cat " << dir.file("a.log")
      << "; exit 9; }\n"
      << "for stranger in 1 2; do\n"
      << "  setsid " << node << " > " << dir.file("b.log") << " 2>&1 &\n"
      << "  b=$!\n"
      << "  wait_for " << dir.file("b.log") << " 'nodes=2' || { cat " << dir.file("a.log")
      << "; exit 9; }\n"
      << "  kill -9 -- -$b; wait $b\n"
      << "  wait_for " << dir.file("a.log") << " \"$stranger node.* lost so far\" || { cat "
      << dir.file("a.log") << "; exit 9; }\n"
      << "done\n"
      << "wait $a; echo \"node a exit $?\"\n"
      << "cat " << dir.file("a.log") << "\n";
  const RunResult r = run_command("bash " + dir.file("job.sh"));
  EXPECT_NE(r.output.find("node a exit 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(1 node lost so far; no restart spent)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(2 nodes lost so far; no restart spent)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("node 1 (127.0.0.1) lost"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("giving up"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("failed first"), std::string::npos) << r.output;
}

// A third node started with torchrun's c10d line of a 2-node job that already runs: it waits
// for room no longer than --timeout (it once waited on past 70 s with --timeout 10) and says
// why; the job's two nodes go on.
TEST(Ddprun, AThirdNodeAtAFullC10dJobEndsWithinTheTimeout) {
  TempDir dir;
  const std::string node =
      "env DDP_STORE_TOKEN=t0k3n " + ddprun() +
      " --nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:" + std::to_string(free_port()) +
      " --rdzv-id job9 --nproc-per-node 1 --timeout 3 -- ";
  const std::string members = dir.file("members.log");
  // The third starts once both members' workers run (their generation closed), whatever the
  // load: it is late for sure.
  const RunResult r = run_command(
      "{ " + node + "sh -c 'echo member; sleep 8' >> " + members + " 2>&1 & " + node +
      "sh -c 'echo member; sleep 8' >> " + members + " 2>&1 & " +
      "for i in $(seq 300); do [ $(grep -c member " + members +
      ") = 2 ] && break; sleep 0.1; done; start=$(date +%s%N); " + node +
      "true; rc=$?; echo third rc=$rc after_ms=$(( ($(date +%s%N) - start) / 1000000 )); wait; "
      "cat " +
      members + "; }");
  EXPECT_NE(r.output.find("third rc=1 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("generation 0 closed with 2 nodes before this one came (the most "
                          "--nnodes allows), and made no room for it within 3s (--timeout)"),
            std::string::npos)
      << r.output;
  const size_t at = r.output.find("after_ms=");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_LT(std::atoi(r.output.c_str() + at + 9), 6000) << r.output;  // 3 s and a margin
  EXPECT_EQ(count_of(r.output, "] member"), 2) << r.output;
}

TEST(Ddprun, TwoNodesWithTheSameNodeRankAreRefused) {
  const int port = free_port();
  const std::string common = "DDP_STORE_TOKEN=t0k3n " + ddprun() + " --nnodes 3 --master-port " +
                             std::to_string(port) + " --nproc-per-node 1 ";
  const RunResult r =
      run_command("{ (" + common +
                  " --node-rank 0 -- sleep 3 >/dev/null 2>&1 &); "
                  "sleep 0.5; (" +
                  common + " --node-rank 1 -- sleep 3 >/dev/null 2>&1 &); sleep 0.5; " + common +
                  " --node-rank 1 -- true; echo exit $?; }");
  EXPECT_NE(r.output.find("--node-rank 1: another ddprun has already joined this job as node 1"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("exit 2"), std::string::npos) << r.output;
}

TEST(Ddprun, PortInUseIsAClearError) {
  const RunResult first =
      run_command(ddprun() + " --nproc-per-node 1 -- sh -c 'echo port=$DDP_STORE_PORT'");
  // Hold a port with a worker, then ask a second ddprun for the same one.
  TempDir dir;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string script = "echo $DDP_STORE_PORT > " + dir.path() + "/port; sleep 30";
    ::execl(DDPRUN_PATH, "ddprun", "--nproc-per-node", "1", "--", "sh", "-c", script.c_str(),
            nullptr);
    ::_exit(127);
  }
  std::string port;
  for (int i = 0; i < 200 && port.empty(); ++i) {
    port = read_file(dir.file("port"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  while (!port.empty() && port.back() == '\n')
    port.pop_back();
  ASSERT_FALSE(port.empty());
  const RunResult r =
      run_command(ddprun() + " --nproc-per-node 1 --master-port " + port + " -- true");
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--master-port " + port + ": 127.0.0.1:" + port + " is already in use"),
            std::string::npos)
      << r.output;
  (void)first;
}

// Refused once, before any worker starts (exit 2), not by every rank's exec.
TEST(Ddprun, MissingProgramIsReported) {
  for (const std::string program : {"/no/such/program", "no-such-program-here"}) {
    const RunResult r = run_command(ddprun() + " --nproc-per-node 2 -- " + program);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(count_of(r.output, "ddprun: error: cannot run " + program), 1) << r.output;
    EXPECT_EQ(r.output.find("starting"), std::string::npos) << r.output;
  }
}

TEST(Ddprun, LinksNoCudaNcclOrMpiLibrary) {
  const RunResult r = run_command("ldd " + ddprun());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* lib : {"libcuda", "libcudart", "libnccl", "libmpi", "libnvidia-ml"})
    EXPECT_EQ(r.output.find(lib), std::string::npos) << lib << " in\n" << r.output;
}

// --- issue 27: every wait interruptible, every process group cleaned, nodes named ----------

// Starts `command` (through sh, in its own process group), lets it run `after_s`, sends
// `signal`, and returns its exit status and the seconds from the signal to its exit.
struct Interrupted {
  int status = -1;
  double seconds = 0;
  std::string output;
};
Interrupted signal_after(const std::string& command, double after_s, int signal) {
  TempDir dir;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const std::string line = "exec env " + command + " > " + dir.file("out") + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", line.c_str(), nullptr);
    ::_exit(127);
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(after_s));
  ::kill(pid, signal);
  Stopwatch clock;
  Interrupted result;
  int status = 0;
  for (int i = 0; i < 600 && ::waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  result.seconds = clock.seconds();
  if (::waitpid(pid, &status, WNOHANG) == 0) {  // still there after 30 s
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  result.output = read_file(dir.file("out"));
  return result;
}

TEST(Ddprun, SignalsEndAWaitForTheStoreOrNodeZeroWithinASecond) {
  const std::string port = std::to_string(free_port());
  // Node 1 with no node 0 retries the store connection (up to --timeout, 300 s).
  for (int signal : {SIGINT, SIGTERM}) {
    const Interrupted r =
        signal_after("DDP_STORE_TOKEN=x " + ddprun() + " --nnodes 2 --node-rank 1 --master-port " +
                         port + " --nproc-per-node 1 -- true",
                     1.5, signal);
    EXPECT_EQ(r.status, 128 + signal) << r.output;
    EXPECT_LT(r.seconds, 1.5) << r.output;
    EXPECT_NE(
        r.output.find(std::string("interrupted by ") + (signal == SIGINT ? "SIGINT" : "SIGTERM") +
                      " while waiting for the other nodes"),
        std::string::npos)
        << r.output;
  }
}

TEST(Ddprun, AStoreThatNeverAnswersIsBoundedByTheTimeout) {
  const RunResult r = run_command("DDP_STORE_TOKEN=x " + ddprun() +
                                  " --nnodes 2 --node-rank 1 --timeout 2 --master-port " +
                                  std::to_string(free_port()) + " --nproc-per-node 1 -- true");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 6) << r.output;
  EXPECT_NE(r.output.find("cannot reach the rendezvous store at 127.0.0.1:"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(waited 2s, --timeout)"), std::string::npos) << r.output;
}

// Processes of this test still alive: those whose environment has DDP_TEST_TAG=<tag>.
std::string left_behind(const std::string& tag) {
  return run_command(
             "for d in /proc/[0-9]*; do tr '\\0' '\\n' < $d/environ 2>/dev/null | "
             "grep -qx 'DDP_TEST_TAG=" +
             tag + "' && echo \"LEFT BEHIND $(cat $d/comm) ${d#/proc/}\"; done; true")
      .output;
}

TEST(Ddprun, WhatAWorkerStartedEndsWithItWhetherItSucceedsFailsOrIsInterrupted) {
  TempDir dir;
  const std::string tag = "DDP_TEST_TAG=" + dir.path() + " ";
  // A background job, and one that ignores SIGTERM, left by a worker that exits by itself.
  const std::string leaves =
      " -- sh -c '(trap \"\" TERM; exec sleep 777) & sleep 778 & echo started; exit $X'";
  for (const char* code : {"0", "4"}) {
    const RunResult r = run_command(tag + "X=" + code + " " + ddprun() +
                                    " --nproc-per-node 2 --grace-period 1" + leaves);
    EXPECT_EQ(r.exit_code, std::stoi(code)) << r.output;
    EXPECT_LT(r.seconds, 8) << r.output;
    EXPECT_EQ(left_behind(dir.path()), "") << "worker exit " << code;
  }
  // Interrupted while its worker waits: the worker's children go too.
  const Interrupted r = signal_after(tag + ddprun() +
                                         " --nproc-per-node 1 --grace-period 1 -- sh -c '(trap "
                                         "\"\" TERM INT; exec sleep 779) & sleep 60'",
                                     1.0, SIGINT);
  EXPECT_EQ(r.status, 128 + SIGINT) << r.output;
  EXPECT_EQ(left_behind(dir.path()), "");
}

TEST(Ddprun, SigintEscalatesToSigtermThenSigkill) {
  TempDir dir;
  // The worker notes each signal it gets and ignores SIGINT: it must then get SIGTERM
  // (halfway through the grace period), and SIGKILL ends the one that ignores both.
  const std::string script = "trap \"echo INT >> " + dir.file("got") +
                             "\" INT; trap \"echo TERM >> " + dir.file("got") +
                             "\" TERM; while true; do sleep 0.05; done";
  const Interrupted r = signal_after(
      ddprun() + " --nproc-per-node 1 --grace-period 2 -- sh -c '" + script + "'", 1.0, SIGINT);
  EXPECT_EQ(r.status, 128 + SIGINT) << r.output;
  EXPECT_GT(r.seconds, 1.5) << "SIGKILL came before the grace period ended";
  EXPECT_LT(r.seconds, 5) << r.output;
  EXPECT_EQ(read_file(dir.file("got")), "INT\nTERM\n") << r.output;
}

// SIGHUP (the terminal closed) stops the workers as SIGTERM does; ddprun exits 128+SIGHUP.
TEST(Ddprun, SighupStopsTheWorkersAsSigtermDoes) {
  TempDir dir;
  const std::string script =
      "trap \"echo TERM >> " + dir.file("got") + "; exit 0\" TERM; while true; do sleep 0.05; done";
  const Interrupted r = signal_after(
      ddprun() + " --nproc-per-node 1 --grace-period 5 -- sh -c '" + script + "'", 1.0, SIGHUP);
  EXPECT_EQ(r.status, 128 + SIGHUP) << r.output;
  EXPECT_LT(r.seconds, 3) << r.output;
  EXPECT_EQ(read_file(dir.file("got")), "TERM\n") << r.output;
  EXPECT_NE(r.output.find("interrupted by SIGHUP"), std::string::npos) << r.output;
}

// A SIGTERM while the group is being stopped after rank 1's failure: the root cause and its
// exit code stand, the grace period is not restarted, and --max-restarts does not restart.
TEST(Ddprun, ASignalDuringTheTeardownKeepsTheRootCause) {
  const std::string script =
      "if [ $RANK = 1 ]; then sleep 0.3; exit 3; fi; trap \"sleep 2; exit 0\" TERM; "
      "while true; do sleep 0.05; done";
  const Interrupted r = signal_after(ddprun() +
                                         " --nproc-per-node 2 --max-restarts 2 "
                                         "--grace-period 4 -- sh -c '" +
                                         script + "'",
                                     1.0, SIGTERM);
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("rank 1 failed first: exit code 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("SIGTERM during the teardown"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restarting the group"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("interrupted by SIGTERM"), std::string::npos) << r.output;
  // Rank 0 ends 2 s after the one SIGTERM it gets, at 1 s: a second SIGTERM (a restarted
  // teardown) would hold it 2 s more.
  EXPECT_LT(r.seconds, 4.0) << "the grace period restarted:\n" << r.output;
}

// A worker's child in a session of its own (setsid) outlived the job before; ddprun, its
// subreaper, stops it with the group, whatever way the job ends.
TEST(Ddprun, WhatAWorkerLeftInASessionOfItsOwnEndsWithTheJob) {
  TempDir dir;
  const std::string marker = dir.file("alive");
  const std::string left = "setsid sh -c \"echo \\$\\$ > " + marker +
                           "; exec sleep 300\" > /dev/null 2>&1 < /dev/null &";
  for (const char* ending : {"exit 0", "exit 4"}) {
    const RunResult r = run_command(ddprun() + " --nproc-per-node 1 --grace-period 2 -- sh -c '" +
                                    left + " sleep 0.5; " + ending + "'");
    EXPECT_EQ(r.exit_code, std::string(ending) == "exit 0" ? 0 : 4) << r.output;
    const std::optional<int> pid =
        parse_number<int>(read_file(marker).substr(0, read_file(marker).find('\n')));
    ASSERT_TRUE(pid.has_value()) << read_file(marker) << r.output;
    EXPECT_NE(::kill(*pid, 0), 0) << "pid " << *pid << " outlived the job (" << ending << ")";
    if (::kill(*pid, 0) == 0) ::kill(*pid, SIGKILL);  // leave nothing behind
  }
}

// ddprun raises its soft limit on open descriptors to the hard one; its workers get the limit
// ddprun was given.
TEST(Ddprun, RaisesItsOwnOpenFileLimitButNotTheWorkers) {
  const RunResult r = run_command(
      "ulimit -Sn 256 && ulimit -Hn 4096 && " + ddprun() +
      " --nproc-per-node 1 -- sh -c 'echo worker=$(ulimit -n) "
      "launcher=$(grep \"Max open files\" /proc/$PPID/limits | tr -s \" \" | cut -d\" \" -f4)'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("worker=256 launcher=4096"), std::string::npos) << r.output;
}

TEST(Ddprun, TheOthersGetTheGracePeriodAndAStoppedWorkerIsContinuedFirst) {
  TempDir dir;
  // Rank 1 fails. Rank 0 stops itself (SIGSTOP): only a SIGCONT lets it see SIGTERM, and
  // only the grace period lets its handler finish writing before SIGKILL.
  const std::string script =
      "if [ $RANK = 1 ]; then sleep 0.5; exit 3; fi; trap \"sleep 0.3; echo "
      "clean > " +
      dir.file("rank0") + "; exit 0\" TERM; kill -STOP $$; sleep 60";
  const RunResult r =
      run_command(ddprun() + " --nproc-per-node 2 --grace-period 3 -- sh -c '" + script + "'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_EQ(read_file(dir.file("rank0")), "clean\n") << r.output;
  EXPECT_LT(r.seconds, 3) << "rank 0 ended by its handler, not by SIGKILL";
}

TEST(Ddprun, WhenNodeZeroGivesUpTheOtherNodesSaySoNotWrongToken) {
  const std::string node0 = "if [ $DDP_RESTART_COUNT = 0 ]; then sleep 0.5; exit 3; fi";
  const std::string node1 = "exec sleep 60";
  const RunResult r = run_command(two_nodes(free_port(), node0, node1));
  EXPECT_LT(r.seconds, 15.0) << r.output;
  EXPECT_NE(r.output.find("node0 ddprun: rank 0 failed first: exit code 3"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("node1 ddprun: the job was ended by node 0 (127.0.0.1:"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 0 failed first: exit code 3; stopped this node's workers"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("wrong token"), std::string::npos) << r.output;
}

TEST(Ddprun, NodeZeroKeepsTheStoreUntilTheOtherNodesFinish) {
  // Node 0's worker is done at once, node 1's after two seconds: node 1 must still succeed.
  const RunResult r = run_command(two_nodes(free_port(), "true", "sleep 2; echo done"));
  EXPECT_EQ(count_of(r.output, "error"), 0) << r.output;
  EXPECT_NE(r.output.find("node1 [rank 1] done"), std::string::npos) << r.output;
  EXPECT_GT(r.seconds, 1.9) << r.output;
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// torchrun's command lines run unchanged: a .py with python3, -m a module, the environment a
// torchrun worker sees, both spellings, and the flags ddprun takes as given said once.
TEST(TorchrunCompat, PythonScriptsAndModulesRunAsUnderTorchrun) {
  TempDir dir;
  write_text(dir.file("env.py"),
             "import os, sys\n"
             "keys = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'GROUP_WORLD_SIZE', 'ROLE_NAME',\n"
             "        'TORCHELASTIC_RUN_ID', 'OMP_NUM_THREADS']\n"
             "print(' '.join(k + '=' + os.environ.get(k, '-') for k in keys), sys.argv[1:])\n"
             "print('error file', os.path.basename(os.environ['TORCHELASTIC_ERROR_FILE']))\n");
  std::filesystem::create_directories(dir.file("pkg"));
  write_text(dir.file("pkg/__init__.py"), "");
  write_text(dir.file("pkg/hello.py"),
             "import os, sys\nprint('module', __name__, os.environ['RANK'], sys.argv[1:])\n");
  const RunResult r = run_command("cd " + dir.path() + " && " + ddprun() +
                                  " --nproc_per_node 2 --standalone --rdzv_id job7 --role "
                                  "trainer --monitor_interval 0.1 env.py --x 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* rank : {"0", "1"})
    EXPECT_NE(r.output.find(std::string("RANK=") + rank + " LOCAL_RANK=" + rank +
                            " WORLD_SIZE=2 GROUP_WORLD_SIZE=1 ROLE_NAME=trainer "
                            "TORCHELASTIC_RUN_ID=job7 OMP_NUM_THREADS=1 ['--x', '1']"),
              std::string::npos)
        << r.output;
  EXPECT_NE(r.output.find("error file error.json"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ddprun: note: --monitor-interval 0.1: not needed"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("setting OMP_NUM_THREADS environment variable for each process to be 1"),
            std::string::npos)
      << r.output;
  const RunResult m = run_command("cd " + dir.path() + " && PYTHONPATH=" + dir.path() + " " +
                                  ddprun() + " --nproc-per-node 2 -m pkg.hello --a");
  ASSERT_EQ(m.exit_code, 0) << m.output;
  EXPECT_NE(m.output.find("module __main__ 1 ['--a']"), std::string::npos) << m.output;
  // --no-python runs it as given: not executable, not on PATH, refused before any rank starts.
  const RunResult raw = run_command("cd " + dir.path() + " && " + ddprun() +
                                    " --nproc-per-node 1 --no-python env.py");
  EXPECT_EQ(raw.exit_code, 2) << raw.output;
  EXPECT_NE(raw.output.find("cannot run env.py: not found on PATH"), std::string::npos)
      << raw.output;
}

// Two nodes (two ddpruns on loopback): node 0 serves PyTorch's store for both, and a torch
// script's ranks on either node meet there.
TEST(TorchrunCompat, TwoNodesMeetAtTheStoreNodeZeroServes) {
  if (run_command("/usr/bin/python3 -c 'import torch.distributed'").exit_code != 0)
    GTEST_SKIP() << "no Python with torch (Debian: python3-torch)";
  TempDir dir;
  write_text(dir.file("meet.py"),
             "import torch, torch.distributed as dist\n"
             "dist.init_process_group('gloo')\n"
             "t = torch.ones(1) * (dist.get_rank() + 1)\n"
             "dist.all_reduce(t)\n"
             "print(f'rank {dist.get_rank()} of {dist.get_world_size()}: {t.item()}', flush=True)\n"
             "dist.destroy_process_group()\n");
  const std::string port = std::to_string(free_port());
  const std::string node = "DDP_STORE_TOKEN=t0k3n " + ddprun() + " --nnodes 2 --master-port " +
                           port + " --nproc-per-node 1 --node-rank ";
  const std::string job = "(" + node + "1 -- /usr/bin/python3 " + dir.file("meet.py") + " > " +
                          dir.file("n1.log") + " 2>&1 &) ; " + node + "0 -- /usr/bin/python3 " +
                          dir.file("meet.py") + "; sleep 1; cat " + dir.file("n1.log");
  const RunResult r = run_command("timeout 60 bash -c '" + job + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PyTorch's store on 0.0.0.0:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 of 2: 3.0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 of 2: 3.0"), std::string::npos) << r.output;
}

// torch's own @record (torch.distributed.elastic) writes the root cause into the file ddprun
// names in TORCHELASTIC_ERROR_FILE; the failure report shows it.
TEST(TorchrunCompat, TorchsRecordShowsItsTracebackInTheReport) {
  std::string py;
  for (const char* candidate : {"python3", "/usr/bin/python3"})
    if (run_command(std::string(candidate) +
                    " -c 'import torch.distributed.elastic.multiprocessing.errors'")
            .exit_code == 0) {
      py = candidate;
      break;
    }
  if (py.empty()) GTEST_SKIP() << "no Python with torch (Debian: python3-torch)";
  TempDir dir;
  write_text(dir.file("boom.py"),
             "import os\n"
             "from torch.distributed.elastic.multiprocessing.errors import record\n"
             "@record\n"
             "def main():\n"
             "    if os.environ['RANK'] == '1':\n"
             "        raise RuntimeError('loss is nan at step 12')\n"
             "main()\n");
  const RunResult r =
      run_command(ddprun() + " --nproc-per-node 2 -- " + py + " " + dir.file("boom.py"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ddprun: root cause recorded by rank 1 ("), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("loss is nan at step 12"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  | Traceback (most recent call last):"), std::string::npos) << r.output;
}

// pytorch/examples' own DDP scripts (tests/torch/pytorch-examples: the upstream files at a
// named commit, made to run on the CPU, UPSTREAM.md), launched with their command lines,
// torchrun replaced by ddprun, give torchrun's weights bitwise: the tutorial series'
// multigpu_torchrun.py (its snapshot's model state) and distributed/ddp's example.py through
// its run_example.sh (rank 0's printed weights).
TEST(TorchrunCompat, PytorchExamplesRunUnderDdprunAsUnderTorchrun) {
  const std::string torchrun = "/usr/bin/torchrun";
  if (run_command("/usr/bin/python3 -c 'import torch.distributed'").exit_code != 0 ||
      run_command("test -x " + torchrun).exit_code != 0)
    GTEST_SKIP() << "no torch and torchrun (Debian: python3-torch)";
  TempDir dir;
  ASSERT_EQ(
      run_command(std::string("cp -r ") + PYTORCH_EXAMPLES_DIR + "/. " + dir.path()).exit_code, 0);
  const std::string tutorial = dir.file("ddp-tutorial-series");
  write_text(dir.file("show.py"),
             "import torch\nsd = torch.load('snapshot.pt')['MODEL_STATE']\n"
             "print(' '.join(repr(v) for t in sd.values() for v in t.flatten().tolist()))\n");
  const auto snapshot = [&](const std::string& launch) {
    const RunResult r =
        run_command("cd " + tutorial + " && rm -f snapshot.pt && PATH=/usr/bin:$PATH " + launch +
                    " && /usr/bin/python3 ../show.py");
    EXPECT_EQ(r.exit_code, 0) << launch << "\n" << r.output;
    const size_t nl = r.output.rfind('\n', r.output.size() - 2);
    return r.output.substr(nl == std::string::npos ? 0 : nl + 1);
  };
  // The tutorial's command line: torchrun --standalone --nproc_per_node=gpu
  // multigpu_torchrun.py 50 10 (CPU: 2 processes, 5 epochs). Debian's torchrun 1.13 needs
  // -r 1 -t 1 on Python 3.11.
  const std::string reference =
      snapshot(torchrun + " -r 1 -t 1 --standalone --nproc_per_node=2 multigpu_torchrun.py 5 2");
  // Linear(20, 1): 21 numbers, not an error's last line.
  EXPECT_EQ(std::count(reference.begin(), reference.end(), ' '), 20) << reference;
  EXPECT_EQ(snapshot(ddprun() + " --standalone --nproc_per_node=2 multigpu_torchrun.py 5 2"),
            reference);
  // distributed/ddp: `bash run_example.sh example.py 2`, its torchrun line run by ddprun
  // (found on PATH, as torchrun is), against the same line run by torchrun.
  const std::string ddp = dir.file("ddp");
  const std::string bin = std::filesystem::path(ddprun()).parent_path().string();
  const auto printed = [&](const std::string& script) {
    const RunResult r = run_command("cd " + ddp + " && PATH=" + bin + ":/usr/bin:$PATH bash " +
                                    script + " example.py 2");
    EXPECT_EQ(r.exit_code, 0) << script << "\n" << r.output;
    const size_t at = r.output.find("weights ");
    return at == std::string::npos ? std::string("none: ") + r.output
                                   : r.output.substr(at, r.output.find('\n', at) - at);
  };
  ASSERT_EQ(run_command("cd " + ddp +
                        " && sed 's/^torchrun /ddprun /' run_example.sh > run_ddprun.sh && "
                        "sed 's/^torchrun /torchrun -r 1 -t 1 /' run_example.sh > run_torchrun.sh")
                .exit_code,
            0);
  const std::string by_torchrun = printed("run_torchrun.sh");
  EXPECT_EQ(by_torchrun.rfind("weights ", 0), 0u) << by_torchrun;
  EXPECT_EQ(printed("run_ddprun.sh"), by_torchrun);
}

// --redirects and --tee write torchrun's layout (RUN/attempt_K/LOCAL_RANK/stdout.log,
// stderr.log) and keep redirected streams off the console; --local-ranks-filter shows only
// the ranks it names; the root cause a program records in TORCHELASTIC_ERROR_FILE (torch's
// @record format) is in the failure report, with its traceback.
TEST(TorchrunCompat, LogLayoutConsoleFilterAndRecordedRootCause) {
  TempDir dir;
  write_text(dir.file("talk.py"),
             "import os, sys\nr = os.environ['LOCAL_RANK']\n"
             "print('out of', r)\nprint('err of', r, file=sys.stderr)\n");
  const RunResult r =
      run_command("cd " + dir.path() + " && " + ddprun() +
                  " --nproc-per-node 2 -r 1 -t 2 --log-dir logs --local-ranks-filter 1 talk.py");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("out of"), std::string::npos) << r.output;    // redirected, not teed
  EXPECT_EQ(r.output.find("err of 0"), std::string::npos) << r.output;  // filtered out
  EXPECT_NE(r.output.find("[rank 1] err of 1"), std::string::npos) << r.output;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.file("logs")))
    if (entry.is_regular_file())
      files.push_back(std::filesystem::relative(entry.path(), dir.file("logs")).string());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 6u) << r.output;  // 2 x (stdout, stderr) + rank-K.log
  EXPECT_EQ(files[0].substr(0, 5), "none_");
  EXPECT_NE(files[0].find("/attempt_0/0/stderr.log"), std::string::npos) << files[0];
  EXPECT_EQ(read_file(dir.file("logs/" + files[1])), "out of 0\n") << files[1];
  EXPECT_EQ(read_file(dir.file("logs/" + files[2])), "err of 1\n") << files[2];

  write_text(dir.file("fail.py"),
             "import json, os, sys, traceback\n"
             "if os.environ['RANK'] == '1':\n"
             "    try:\n"
             "        raise ValueError('bad batch 7')\n"
             "    except ValueError as e:\n"
             "        with open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w') as f:\n"
             "            json.dump({'message': {'message': 'ValueError: ' + str(e), 'extraInfo':"
             " {'py_callstack': traceback.format_exc(), 'timestamp': '1'}}}, f)\n"
             "        sys.exit(3)\n");
  const RunResult f =
      run_command("cd " + dir.path() + " && " + ddprun() + " --nproc-per-node 2 fail.py");
  EXPECT_EQ(f.exit_code, 3) << f.output;
  EXPECT_NE(f.output.find("ddprun: root cause recorded by rank 1 ("), std::string::npos)
      << f.output;
  EXPECT_NE(f.output.find("  | ValueError: bad batch 7"), std::string::npos) << f.output;
  EXPECT_NE(f.output.find("raise ValueError('bad batch 7')"), std::string::npos) << f.output;
}

// A Python program whose interpreter lacks a module: the report says which interpreter ran
// it (and where it is) and how to choose another; --python chooses it.
TEST(Ddprun, AMissingModuleNamesTheInterpreterAndPythonChoosesIt) {
  TempDir dir;
  write_text(dir.file("needs.py"), "import no_such_module_for_ddp\n");
  write_text(dir.file("which.py"), "import sys\nprint('interpreter', sys.executable)\n");
  const RunResult r = run_command(ddprun() + " --nproc-per-node 1 " + dir.file("needs.py"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ModuleNotFoundError"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ran " + dir.file("needs.py") + " with python3 (/"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("give --python PATH or DDP_PYTHON"), std::string::npos) << r.output;
  const RunResult chosen = run_command(ddprun() + " --nproc-per-node 1 --python /usr/bin/python3 " +
                                       dir.file("which.py"));
  ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_NE(chosen.output.find("interpreter /usr/bin/python3"), std::string::npos) << chosen.output;
}

}  // namespace
}  // namespace ddp
