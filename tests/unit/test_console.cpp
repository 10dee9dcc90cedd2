// ddprun's console: a stream nobody reads never blocks a line; a full queue holds the workers
// back, a stalled reader's lines are dropped and counted, and a notice says how many once the
// reader reads again.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <string>
#include <thread>

#include "launcher/console.h"

namespace ddp {
namespace {

std::string read_all(int fd) {
  std::string text;
  char buffer[65536];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0)
    text.append(buffer, static_cast<size_t>(n));
  return text;
}

// A slow reader loses nothing: past the bound the console stops accepting (ddprun then stops
// reading the workers' pipes) rather than dropping. One that reads nothing for the stall time
// is stalled: lines are dropped and counted, and a notice says how many once it reads again.
TEST(Console, AFullQueueHoldsBackAndOnlyAStalledReaderLosesLines) {
  int out[2], err[2];
  ASSERT_EQ(::pipe2(out, O_NONBLOCK), 0);
  ASSERT_EQ(::pipe2(err, O_NONBLOCK), 0);
  Console console(out[1], err[1], 0.3);
  const std::string line(999, 'x');  // 1000 bytes with its newline
  size_t lines = 0;
  while (console.accepting(false) && lines < 100000) {
    console.line(false, line);  // returns at once: a blocking write would hang the test here
    ++lines;
  }
  EXPECT_LT(lines, 100000u) << "the console never said it was full";
  EXPECT_GE(lines * 1000, Console::kMaxQueuedBytes);
  EXPECT_EQ(console.dropped(), 0u);
  console.line(true, "stderr still goes out");
  EXPECT_EQ(read_all(err[0]), "stderr still goes out\n");
  std::string seen = read_all(out[0]);  // a slow reader: it reads, so nothing is lost
  EXPECT_TRUE(console.accepting(false));
  while (console.flush())
    seen += read_all(out[0]);
  seen += read_all(out[0]);
  EXPECT_EQ(seen.size(), lines * 1000);
  // Now a reader that stops: full again, then stalled after 0.3 s, then lines are dropped.
  while (console.accepting(false))
    console.line(false, line);
  EXPECT_FALSE(console.accepting(false));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_TRUE(console.accepting(false)) << "a stalled console must let the workers go on";
  console.line(false, line);
  console.line(false, line);
  EXPECT_EQ(console.dropped(), 2u);
  while (console.flush())
    read_all(out[0]);
  read_all(out[0]);
  console.line(false, "after");
  EXPECT_EQ(read_all(out[0]),
            "ddprun: 2 lines of output dropped while the console read nothing (the per-rank "
            "logs of --log-dir keep every line)\nafter\n");
  for (int fd : {out[0], out[1], err[0], err[1]})
    ::close(fd);
}

TEST(Console, AReaderThatIsGoneDiscardsTheQueue) {
  int out[2];
  ASSERT_EQ(::pipe2(out, O_NONBLOCK), 0);
  ::close(out[0]);
  ::signal(SIGPIPE, SIG_IGN);
  Console console(out[1], out[1]);
  console.line(false, "nobody");
  EXPECT_FALSE(console.flush());
  EXPECT_TRUE(console.drain(0.1));
  ::close(out[1]);
}

}  // namespace
}  // namespace ddp
