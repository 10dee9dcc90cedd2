// ddprun's console: a stream nobody reads never blocks a line; lines past the bound are
// dropped and counted, and a notice says how many once the reader reads again.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <string>

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

TEST(Console, AStreamNobodyReadsDropsLinesWithoutBlockingAndSaysHowMany) {
  int out[2], err[2];
  ASSERT_EQ(::pipe2(out, O_NONBLOCK), 0);
  ASSERT_EQ(::pipe2(err, O_NONBLOCK), 0);
  Console console(out[1], err[1]);
  const std::string line(999, 'x');                            // 1000 bytes with its newline
  const size_t lines = Console::kMaxQueuedBytes / 1000 + 500;  // past the pipe and the queue
  for (size_t i = 0; i < lines; ++i)
    console.line(false, line);  // returns at once: a blocking write would hang the test here
  console.line(true, "stderr still goes out");
  EXPECT_GT(console.dropped(), 0u);
  EXPECT_LT(console.dropped(), lines);
  EXPECT_EQ(read_all(err[0]), "stderr still goes out\n");
  EXPECT_GE(console.waiting_fd(false), 0);  // still queued
  std::string seen;
  while (console.flush())
    seen += read_all(out[0]);
  seen += read_all(out[0]);
  EXPECT_EQ(console.waiting_fd(false), -1);
  EXPECT_EQ(seen.size(), (lines - console.dropped()) * 1000);
  console.line(false, "after");
  seen = read_all(out[0]);
  EXPECT_EQ(seen, "ddprun: " + std::to_string(console.dropped()) +
                      " lines of output dropped while the console was not read (the per-rank "
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
