// The rendezvous store: operations, deadlines, token check, garbage and oversized input,
// port 0 and a port already in use. Server and clients in one process, over loopback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/error.h"
#include "runtime/listener.h"
#include "runtime/munge_auth.h"
#include "runtime/socket.h"
#include "runtime/store.h"
#include "runtime/store_server.h"
#include "runtime/timer.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

// A client's hello, framed, as StoreClient sends it: the token, this protocol's version, no run
// id and no MUNGE credential.
std::string hello_frame(const std::string& token) {
  MessageWriter hello;
  hello.u8(static_cast<uint8_t>(StoreOp::kHello))
      .str(token)
      .u32(kStoreProtocolVersion)
      .str("")   // the run's id: none
      .str("");  // a MUNGE credential: none
  return hello.framed();
}

int count_lines(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

// A server of one's own on a free loopback port that answers its first connection with
// `reply` (another program, or a store of another version), then waits a moment and closes.
class FakeServer {
 public:
  explicit FakeServer(std::string reply) : listener_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_.get(), 4), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, reply = std::move(reply)] {
      UniqueFd c(::accept(listener_.get(), nullptr, nullptr));
      write_all(c.get(), reply.data(), reply.size());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    });
  }
  ~FakeServer() { thread_.join(); }
  int port() const { return port_; }

 private:
  UniqueFd listener_;
  int port_ = 0;
  std::thread thread_;
};

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<StoreServer>(StoreServerConfig{"127.0.0.1", 0, "secret"});
    server_->start();
  }
  StoreClient client() { return StoreClient("127.0.0.1", server_->port(), "secret", 5.0); }
  std::unique_ptr<StoreServer> server_;
};

TEST_F(StoreTest, PortZeroPicksAFreePort) {
  EXPECT_GT(server_->port(), 0);
}

TEST_F(StoreTest, SetGetAddDelete) {
  StoreClient a = client();
  StoreClient b = client();
  EXPECT_FALSE(a.get("k").has_value());
  a.set("k", "v1");
  EXPECT_EQ(b.get("k").value(), "v1");
  a.set("k", std::string("bin\0ary", 7));
  EXPECT_EQ(b.get("k").value(), std::string("bin\0ary", 7));
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", -2), 3);
  EXPECT_TRUE(a.remove("k"));
  EXPECT_FALSE(b.remove("k"));
  EXPECT_FALSE(a.get("k").has_value());
  EXPECT_EQ(a.missing({"n", "k"}), std::vector<std::string>{"k"});
}

TEST_F(StoreTest, WaitReturnsWhenAnotherClientSetsTheKeys) {
  StoreClient waiter = client();
  std::thread setter([this] {
    StoreClient c = client();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c.set("a", "1");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c.set("b", "2");
  });
  Stopwatch clock;
  waiter.wait({"a", "b"}, 10.0);
  EXPECT_LT(clock.seconds(), 5.0);
  EXPECT_EQ(waiter.wait_get("b", 1.0), "2");
  setter.join();
}

TEST_F(StoreTest, WaitDeadlineNamesTheMissingKeys) {
  StoreClient c = client();
  c.set("present", "x");
  Stopwatch clock;
  try {
    c.wait({"present", "rank/1", "rank/2"}, 0.3);
    FAIL() << "wait did not time out";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("2 of 3 keys: rank/1, rank/2"), std::string::npos) << message;
  }
  EXPECT_GE(clock.seconds(), 0.25);
  EXPECT_LT(clock.seconds(), 5.0);
  c.set("after", "still works");  // the connection survives a timed-out wait
  EXPECT_EQ(c.get("after").value(), "still works");
}

// A wrong token is said as such (UsageError: no use retrying); a listener that hangs up
// without answering (a proxy whose store is not up yet) is not taken for one (Error, which
// ddprun retries until --timeout).
TEST_F(StoreTest, AWrongTokenIsToldApartFromAStoreThatDoesNotAnswer) {
  EXPECT_THROW(StoreClient("127.0.0.1", server_->port(), "guess", 2.0), UsageError);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  // Hung up with a plain close (the client may see the end of the stream or, when its hello
  // was already there unread, a reset) and with a reset for sure (SO_LINGER of 0).
  for (const bool reset : {false, true}) {
    std::thread hang_up([fd, reset] {
      const int client = ::accept(fd, nullptr, nullptr);
      if (reset) {
        const linger abort_on_close{1, 0};
        ::setsockopt(client, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
      }
      ::close(client);
    });
    try {
      // A deadline far above the hang-up's microseconds: on a loaded CI machine the hang-up
      // thread once ran only after a 2 s deadline had passed ("did not answer within 2s").
      StoreClient("127.0.0.1", ntohs(addr.sin_port), "secret", 20.0);
      ADD_FAILURE() << "a store that hung up was accepted";
    } catch (const UsageError& e) {
      ADD_FAILURE() << "taken for a wrong token: " << e.what();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("closed the connection before answering its hello"),
                std::string::npos)
          << (reset ? "reset: " : "closed: ") << e.what();
    }
    hang_up.join();
  }
  ::close(fd);
}

TEST_F(StoreTest, WrongTokenIsDropped) {
  EXPECT_THROW(StoreClient("127.0.0.1", server_->port(), "guess", 2.0), Error);
  EXPECT_GE(server_->dropped_connections(), 1u);
  StoreClient good = client();  // the server goes on serving
  good.set("k", "v");
  EXPECT_EQ(good.get("k").value(), "v");
}

TEST_F(StoreTest, GarbageAndOversizedInputDropOnlyThatConnection) {
  StoreClient good = client();
  good.set("k", "v");
  {
    UniqueFd raw = tcp_connect("127.0.0.1", server_->port(), deadline_in(2.0));
    const std::string garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    write_all(raw.get(), garbage.data(), garbage.size());
    char byte;
    EXPECT_THROW(read_exact(raw.get(), &byte, 1, deadline_in(5.0)), Error);  // closed by server
  }
  {
    UniqueFd raw = tcp_connect("127.0.0.1", server_->port(), deadline_in(2.0));
    const std::string frame = hello_frame("secret");
    write_all(raw.get(), frame.data(), frame.size());
    char reply[5];
    ASSERT_TRUE(read_exact(raw.get(), reply, 5, deadline_in(5.0)));
    const unsigned char huge[4] = {0xff, 0xff, 0xff, 0x7f};  // a 2 GiB frame
    write_all(raw.get(), huge, 4);
    char byte;
    EXPECT_THROW(read_exact(raw.get(), &byte, 1, deadline_in(5.0)), Error);
  }
  {
    UniqueFd raw = tcp_connect("127.0.0.1", server_->port(), deadline_in(2.0));
    MessageWriter truncated;  // a set whose value length runs past the frame
    truncated.u8(static_cast<uint8_t>(StoreOp::kSet)).str("k").u32(1000);
    const std::string frames = hello_frame("secret") + truncated.framed();
    write_all(raw.get(), frames.data(), frames.size());
    char reply[5];
    ASSERT_TRUE(read_exact(raw.get(), reply, 5, deadline_in(5.0)));
    char byte;
    EXPECT_THROW(read_exact(raw.get(), &byte, 1, deadline_in(5.0)), Error);
  }
  EXPECT_GE(server_->dropped_connections(), 3u);
  EXPECT_EQ(good.get("k").value(), "v");
  EXPECT_EQ(client().get("k").value(), "v");
}

// A server whose refusals are collected, with a short hello deadline and a small cap.
class GuardedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreServerConfig config{"127.0.0.1", 0, "secret"};
    config.hello_timeout_s = 0.5;
    config.max_unauthenticated = 8;
    config.on_refused = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex_);
      refused_.push_back(line);
    };
    server_ = std::make_unique<StoreServer>(config);
    server_->start();
  }
  std::string refusals() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string all;
    for (const std::string& line : refused_)
      all += line + "\n";
    return all;
  }
  // True when the server hangs up within `seconds`, having sent nothing but (for a wrong
  // token or version) its one "unauthorized" or "version" reply: nothing pipelined after the
  // hello was answered.
  static bool closed_by_server(int fd, double seconds) {
    std::string received;
    const Deadline deadline = deadline_in(seconds);
    try {
      char byte;
      while (read_exact(fd, &byte, 1, deadline))
        received.push_back(byte);
    } catch (const Error&) {
      const std::string unauthorized = {1, 0, 0, 0, 4};
      const std::string version = {5, 0, 0, 0, 5, static_cast<char>(kStoreProtocolVersion),
                                   0, 0, 0};
      return received.empty() || received == unauthorized || received == version;
    }
    return false;
  }
  std::unique_ptr<StoreServer> server_;
  std::mutex mutex_;
  std::vector<std::string> refused_;
};

TEST_F(GuardedStoreTest, ALargeFrameBeforeTheHelloIsRefusedAtOnce) {
  UniqueFd raw = tcp_connect("127.0.0.1", server_->port(), deadline_in(2.0));
  const unsigned char header[4] = {0x00, 0x00, 0xf0, 0x03};  // announces a 63 MiB frame
  write_all(raw.get(), header, 4);
  const std::string some(60000, 'x');
  try {
    write_all(raw.get(), some.data(), some.size());
  } catch (const Error&) {
    // already closed
  }
  Stopwatch clock;
  EXPECT_TRUE(closed_by_server(raw.get(), 3.0));
  EXPECT_LT(clock.seconds(), 0.4) << "closed by the hello deadline, not by the size";
  EXPECT_NE(refusals().find("127.0.0.1: a frame of 66060288 bytes before authenticating"),
            std::string::npos)
      << refusals();
}

TEST_F(GuardedStoreTest, SilentStrangersAreCappedAndTimedOutWhileRanksStillConnect) {
  std::vector<UniqueFd> strangers;
  for (int i = 0; i < 20; ++i)
    strangers.push_back(tcp_connect("127.0.0.1", server_->port(), deadline_in(2.0)));
  StoreClient rank("127.0.0.1", server_->port(), "secret", 5.0);  // after the cap: still served
  rank.set("k", "v");
  EXPECT_EQ(rank.get("k").value(), "v");
  EXPECT_NE(refusals().find("dropped: more than 8 connections waited for their hello"),
            std::string::npos)
      << refusals();
  Stopwatch clock;
  for (UniqueFd& fd : strangers)
    EXPECT_TRUE(closed_by_server(fd.get(), 3.0));
  EXPECT_LT(clock.seconds(), 2.0);
  EXPECT_NE(refusals().find("no hello with the token within 0.5s"), std::string::npos)
      << refusals();
  EXPECT_EQ(count_lines(refusals(), "no hello"), 1) << "reported once per peer and reason";
}

// In a sub-group (dp x pp: ranks 2 and 3 of the world form one stage's data-parallel group),
// a rank that never arrived is named as the launcher numbers it, its group rank after it.
TEST_F(StoreTest, StuckRanksOfASubGroupAreNamedByTheirWorldRank) {
  StoreClient c = client();
  const std::string message = describe_stuck_operation(&c, "dp1", 0, 2, 7, "all_reduce", 16,
                                                       DataType::kFloat32, "timed out", {2, 3});
  EXPECT_NE(message.find("rank(s) 3 (rank 1 of group dp1) never reached it"), std::string::npos)
      << message;
  const std::string step =
      describe_stuck_step(&c, "dp2", 1, 2, "training step", 9, "no progress", {2, 3});
  EXPECT_NE(step.find("rank(s) 2 (rank 0 of group dp2) never reached it"), std::string::npos)
      << step;
  EXPECT_EQ(name_ranks({0, 1}, {}, "world"), "0, 1");
  EXPECT_EQ(name_ranks({1}, {4, 6}, "g"), "6 (rank 1 of group g)");
}

TEST(GuardedStore, TheCapOnStrangersIsExactlyItsValue) {
  std::vector<std::string> refused;
  std::mutex mutex;
  StoreServerConfig config{"127.0.0.1", 0, "secret"};
  config.hello_timeout_s = 30;  // no stranger times out during the test
  config.max_unauthenticated = 4;
  config.on_refused = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex);
    refused.push_back(line);
  };
  StoreServer server(config);
  server.start();
  const auto dropped = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    return std::count_if(refused.begin(), refused.end(), [](const std::string& line) {
      return line.find("dropped: more than 4 connections") != std::string::npos;
    });
  };
  // A rank's connection waits for its hello too: 3 strangers and a rank are 4 waiting.
  std::vector<UniqueFd> strangers;
  for (int i = 0; i < 3; ++i) {
    strangers.push_back(tcp_connect("127.0.0.1", server.port(), deadline_in(2.0)));
    // A served round trip after each: the server has accepted the stranger by then.
    StoreClient("127.0.0.1", server.port(), "secret", 2.0).set("k", "v");
  }
  EXPECT_EQ(dropped(), 0) << "4 waiting are within a cap of 4";
  strangers.push_back(tcp_connect("127.0.0.1", server.port(), deadline_in(2.0)));
  StoreClient("127.0.0.1", server.port(), "secret", 2.0).set("k", "v");
  EXPECT_EQ(dropped(), 1) << "the fifth waiting makes one too many";
  char byte;
  EXPECT_THROW(read_exact(strangers[0].get(), &byte, 1, deadline_in(2.0)), Error)
      << "the oldest stranger goes";
  EXPECT_FALSE(read_exact(strangers[1].get(), &byte, 1, deadline_in(0.2))) << "the others stay";
}

TEST_F(GuardedStoreTest, OnlyTheWholeTokenAuthenticatesAndWrongOnesAreReported) {
  for (const char* token : {"secre", "", "secret!", "Secret"})
    EXPECT_THROW(StoreClient("127.0.0.1", server_->port(), token, 2.0), Error) << token;
  EXPECT_NE(refusals().find("127.0.0.1: wrong token (check DDP_STORE_TOKEN on every node)"),
            std::string::npos)
      << refusals();
  StoreClient good("127.0.0.1", server_->port(), "secret", 5.0);
  good.set("k", "v");
}

TEST_F(GuardedStoreTest, ARefusedHelloGetsNoKeyAndAWrongLengthPrefixIsRefused) {
  StoreClient("127.0.0.1", server_->port(), "secret", 5.0).set("k", "v");
  const size_t dropped = server_->dropped_connections();
  auto refused = [&](const std::string& hello_payload) {
    UniqueFd raw = tcp_connect("127.0.0.1", server_->port(), deadline_in(2.0));
    MessageWriter get;  // pipelined after the hello: must never be answered
    get.u8(static_cast<uint8_t>(StoreOp::kGet)).str("k");
    MessageWriter set;
    set.u8(static_cast<uint8_t>(StoreOp::kSet)).str("k").str("stolen");
    MessageWriter hello;
    hello.raw(hello_payload);
    const std::string frames = hello.framed() + get.framed() + set.framed();
    write_all(raw.get(), frames.data(), frames.size());
    return closed_by_server(raw.get(), 3.0);
  };
  const std::string op(1, static_cast<char>(StoreOp::kHello));
  auto with_length = [&](uint32_t length, const std::string& token) {
    MessageWriter w;
    w.u32(length);
    return op + w.payload() + token;
  };
  EXPECT_TRUE(refused(with_length(5, "secret")));  // right token, wrong length prefix
  EXPECT_TRUE(refused(with_length(7, "secret")));
  EXPECT_TRUE(refused(with_length(0, "")));       // empty token
  EXPECT_TRUE(refused(with_length(5, "secre")));  // a prefix
  EXPECT_TRUE(refused(with_length(7, "secret!")));
  EXPECT_GE(server_->dropped_connections(), dropped + 5);
  StoreClient good("127.0.0.1", server_->port(), "secret", 5.0);
  EXPECT_EQ(good.get("k").value(), "v");  // nobody wrote it
}

// A hello of another protocol version (another ddp) is told the store's version and named;
// the client of such a store says which versions differ.
TEST_F(GuardedStoreTest, AnotherProtocolVersionIsToldAndNamed) {
  UniqueFd raw = tcp_connect("127.0.0.1", server_->port(), deadline_in(2.0));
  MessageWriter hello;
  hello.u8(static_cast<uint8_t>(StoreOp::kHello)).str("secret").u32(99);
  const std::string frame = hello.framed();
  write_all(raw.get(), frame.data(), frame.size());
  char reply[9];
  ASSERT_TRUE(read_exact(raw.get(), reply, 9, deadline_in(2.0)));
  EXPECT_EQ(reply[4], static_cast<char>(StoreStatus::kVersion));
  EXPECT_EQ(reply[5], static_cast<char>(kStoreProtocolVersion));
  for (int i = 0; i < 20 && refusals().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(refusals().find("a client of store protocol version 99 (this store speaks " +
                            std::to_string(kStoreProtocolVersion) + ")"),
            std::string::npos)
      << refusals();
  // A client against a store that answers so (version 7).
  MessageWriter told;
  told.u8(static_cast<uint8_t>(StoreStatus::kVersion)).u32(7);
  FakeServer other(told.framed());
  try {
    StoreClient("127.0.0.1", other.port(), "secret", 2.0);
    ADD_FAILURE() << "a store of another version was taken";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("speaks protocol version 7, this process " +
                                         std::to_string(kStoreProtocolVersion)),
              std::string::npos)
        << e.what();
  }
}

// Stuck ranks of a graph-replayed step can be one step apart (a rank whose part of step 56
// completed is stuck at 57): a rank that never arrived is named by all of them, and one at
// an earlier step is named as held up, not as missing.
TEST_F(StoreTest, StuckStepsNameTheRankThatNeverArrivedWhateverStepTheOthersAreAt) {
  std::string at56, at57;
  std::thread first([&] {
    StoreClient c = client();
    at56 = describe_stuck_step(&c, "world0", 0, 3, "training step", 56, "no progress");
  });
  std::thread second([&] {
    StoreClient c = client();
    at57 = describe_stuck_step(&c, "world0", 1, 3, "training step", 57, "no progress");
  });
  first.join();
  second.join();
  EXPECT_EQ(at56,
            "training step #56 in group world0 did not complete: no progress; rank(s) 2 never "
            "reached it");
  EXPECT_EQ(at57,
            "training step #57 in group world0 did not complete: no progress; rank(s) 2 never "
            "reached it; rank(s) 0 (at #56) held up at an earlier one");
}

TEST_F(StoreTest, ClearStartsAFreshGeneration) {
  StoreClient c = client();
  c.set("k", "v");
  server_->clear();
  EXPECT_FALSE(c.get("k").has_value());
}

TEST(StoreServer, PortInUseIsAClearError) {
  StoreServer first(StoreServerConfig{"127.0.0.1", 0, "t"});
  try {
    StoreServer second(StoreServerConfig{"127.0.0.1", first.port(), "t"});
    FAIL() << "bound a port in use";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("already in use"), std::string::npos) << message;
    EXPECT_NE(message.find("--master-port " + std::to_string(first.port())), std::string::npos)
        << message;
  }
}

TEST(StoreClient, UnreachableStoreNamesTheAddress) {
  int port;
  {
    StoreServer probe(StoreServerConfig{"127.0.0.1", 0, "t"});
    port = probe.port();
  }  // closed: nothing listens there now
  try {
    StoreClient("127.0.0.1", port, "t", 0.2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  }
}

// Another program on the store's port (an HTTP server's reply): a usage error that names the
// address and says so, not an internal failure about a reply length.
TEST(StoreClient, AnotherProgramOnThePortIsNamed) {
  FakeServer http("HTTP/1.1 400 Bad Request\r\n\r\n");
  try {
    StoreClient("127.0.0.1", http.port(), "t", 2.0);
    ADD_FAILURE() << "took an HTTP server for a store";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("127.0.0.1:" + std::to_string(http.port()) +
                           " answered with what no ddp store sends (it began 'HTTP')"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("check MASTER_ADDR and MASTER_PORT"), std::string::npos) << message;
  }
}

// A call behind another thread's call that the store does not answer waits no longer than
// its own reply timeout (a failed node leaving must not wait out a watcher's call).
TEST_F(StoreTest, ACallBehindAnUnansweredOneKeepsItsOwnDeadline) {
  StoreClient client("127.0.0.1", server_->port(), "secret", 5.0, 30.0);
  std::thread waiter([&] {
    try {
      client.wait({"never"}, 3.0);  // holds the connection for 3 s
    } catch (const Error&) {
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  client.set_reply_timeout(0.5);
  Stopwatch clock;
  EXPECT_THROW(client.get("k"), Error);
  EXPECT_LT(clock.seconds(), 2.0);
  waiter.join();
}

// Refusals are reported once per peer and kind of reason (numbers aside), and a bounded
// number of lines in all.
// A hello of another run (two jobs that meet at one address with one token: two srun steps
// given one DDP_STORE_TOKEN) is refused, naming both runs; the run's own is let in.
TEST(StoreRun, AHelloOfAnotherRunIsRefusedNamingBoth) {
  StoreServerConfig config{"127.0.0.1", 0, "secret"};
  config.run_id = "slurm-7.0";
  std::string refused;
  config.on_refused = [&refused](const std::string& line) { refused += line + "\n"; };
  StoreServer server(config);
  server.start();
  try {
    StoreClient("127.0.0.1", server.port(), "secret", 2.0, 5.0, "slurm-7.1");
    ADD_FAILURE() << "a process of another run was let in";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("serves run 'slurm-7.0', this process belongs to run "
                                         "'slurm-7.1'"),
              std::string::npos)
        << e.what();
  }
  StoreClient mine("127.0.0.1", server.port(), "secret", 2.0, 5.0, "slurm-7.0");
  mine.set("k", "v");
  // A program's own client that names no run comes in on the token alone.
  EXPECT_EQ(StoreClient("127.0.0.1", server.port(), "secret", 2.0).get("k").value(), "v");
  EXPECT_EQ(mine.get("k").value(), "v");
  server.stop();  // before reading what its thread wrote
  EXPECT_NE(refused.find("a process of run 'slurm-7.1' (this store serves run 'slurm-7.0')"),
            std::string::npos)
      << refused;
}

// The owner of a TCP socket as /proc/net/tcp lists it (text of a real x86 kernel), and of a
// real loopback connection: this process's user.
TEST(PeerUser, TheSocketsOwnerIsReadFromTheKernelsTable) {
  const std::string table =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
      "timeout inode\n"
      "   0: 0100007F:9C41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        "
      "0 4242 1 0000000000000000 100 0 0 10 0\n"
      "   1: 0100007F:D431 0100007F:9C41 01 00000000:00000000 00:00000000 00000000  1000        "
      "0 4243 1 0000000000000000 20 4 30 10 -1\n";
  const uint32_t loopback = 0x7F000001;
  EXPECT_EQ(tcp_socket_owner(table, loopback, 0xD431, loopback, 0x9C41), 1000u);
  EXPECT_EQ(tcp_socket_owner(table, loopback, 0x9C41, 0, 0), 0u);
  EXPECT_FALSE(tcp_socket_owner(table, loopback, 0xD431, loopback, 0x9C42).has_value());
  EXPECT_FALSE(tcp_socket_owner(table, 0x0A000001, 0xD431, loopback, 0x9C41).has_value());

  Listener listener = listen_tcp("127.0.0.1", 0, "a test");
  UniqueFd client = tcp_connect("127.0.0.1", listener.port, deadline_in(2.0));
  UniqueFd accepted(::accept(listener.fd.get(), nullptr, nullptr));
  ASSERT_TRUE(accepted.valid());
  EXPECT_EQ(local_peer_uid(accepted.get()), ::geteuid());
  EXPECT_EQ(local_peer_uid(client.get()), ::geteuid());
}

// Two nodes racing for one rendezvous endpoint: Linux lets both bind it (SO_REUSEADDR) while
// neither listens, and the second listen() finds it taken. That is the taken-port UsageError a
// failed bind gives (ddprun's elastic nodes then join as clients), not an internal error.
TEST(Listener, ASecondListenOnAPortBothBoundIsThePortInUse) {
  Listener first = bind_tcp("127.0.0.1", 0, "a test");
  Listener second = bind_tcp("127.0.0.1", first.port, "a test");
  start_listening(first, "127.0.0.1");
  try {
    start_listening(second, "127.0.0.1");
    FAIL() << "two sockets listen on port " << first.port;
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--master-port " + std::to_string(first.port) +
                  ": 127.0.0.1:" + std::to_string(first.port) +
                  " is already in use; choose another port or pass --master-port 0 to pick a "
                  "free one");
  }
}

// A process of this host that runs as another user is refused even with the token (it could
// have read it from a world-readable script), and says why; the store goes on serving.
TEST(PeerUser, AProcessOfAnotherUserOnThisHostIsRefusedWithTheToken) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run a client as another user";
  StoreServerConfig config{"127.0.0.1", 0, "secret"};
  std::string refused;
  config.on_refused = [&refused](const std::string& line) { refused += line + "\n"; };
  StoreServer server(config);
  server.start();
  const AsNobody nobody = run_as_nobody([&](std::string* text) {
    try {
      StoreClient("127.0.0.1", server.port(), "secret", 2.0);
      return 1;  // let in
    } catch (const UsageError& e) {
      *text = e.what();
      return 0;
    }
  });
  EXPECT_EQ(nobody.status, 0) << "1: let in, 3: setuid, 4: another error";
  EXPECT_NE(nobody.text.find("refused this process: a process of user 65534 on this host (the "
                             "job's user is 0)"),
            std::string::npos)
      << nobody.text;
  StoreClient mine("127.0.0.1", server.port(), "secret", 2.0);  // the job's user still gets in
  mine.set("k", "v");
  server.stop();
  EXPECT_NE(refused.find("127.0.0.1: a process of user 65534 on this host"), std::string::npos)
      << refused;
}

// What the store holds is bounded (256 MiB of keys and values by default; 4 MiB here, so the
// test stays light): a set past it is refused, naming the key and the bound, and the
// connection stays; replacing or removing a key makes room, and so does a restart's clear.
TEST(StoreBound, WhatTheStoreHoldsIsBounded) {
  EXPECT_EQ(StoreServerConfig().max_bytes, uint64_t{256} << 20);
  StoreServerConfig config{"127.0.0.1", 0, "secret"};
  config.max_bytes = uint64_t{4} << 20;
  StoreServer server(config);
  server.start();
  StoreClient c("127.0.0.1", server.port(), "secret", 5.0);
  const std::string big(1000000, 'x');
  for (int i = 0; i < 4; ++i)
    c.set("big" + std::to_string(i), big);  // 4,000,016 bytes of 4,194,304
  c.set("big0", big);                       // a replacement takes no more room
  try {
    c.set("big4", big);
    ADD_FAILURE() << "the store held more than its bound";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("refused to hold key 'big4' (1000000 bytes): what it "
                                         "holds would pass its bound of 4 MiB"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(c.add("counter", 2), 2);  // small keys still fit, on the same connection
  EXPECT_TRUE(c.remove("big1"));
  c.set("big4", big);
  EXPECT_EQ(c.get("big4")->size(), big.size());
  EXPECT_THROW(c.set("big5", big), UsageError);
  server.clear();  // a restart's clear gives back the room too
  for (int i = 5; i < 9; ++i)
    c.set("big" + std::to_string(i), big);
}

// What the store buffers is bounded too (512 MiB over every client by default, the torch
// store's bound; 8 MiB here): clients that each leave a large set unfinished (round 6: 20 of
// them, 60 MiB each, held ddprun at 1236 MiB) are dropped once their bytes together would pass
// it, the one that would pass it named; the others and a new client are served.
TEST(StoreBound, WhatTheStoreBuffersForUnfinishedMessagesIsBounded) {
  EXPECT_EQ(StoreServerConfig().max_buffered, uint64_t{512} << 20);
  StoreServerConfig config{"127.0.0.1", 0, "secret"};
  config.max_buffered = uint64_t{8} << 20;
  std::string refused;
  std::mutex refused_mutex;
  config.on_refused = [&](const std::string& line) {
    const std::lock_guard<std::mutex> lock(refused_mutex);
    refused += line + "\n";
  };
  StoreServer server(config);
  server.start();
  std::vector<UniqueFd> clients;
  const std::string part(3u << 20, 'x');  // 3 MiB of a 6 MiB set, never finished
  for (int i = 0; i < 4; ++i) {
    UniqueFd raw = tcp_connect("127.0.0.1", server.port(), deadline_in(2.0));
    const std::string frame = hello_frame("secret");
    write_all(raw.get(), frame.data(), frame.size());
    char reply[5];
    ASSERT_TRUE(read_exact(raw.get(), reply, 5, deadline_in(5.0)));
    const uint32_t length = 6u << 20;  // the frame's length, then only half of it
    const unsigned char head[4] = {
        static_cast<unsigned char>(length), static_cast<unsigned char>(length >> 8),
        static_cast<unsigned char>(length >> 16), static_cast<unsigned char>(length >> 24)};
    write_all(raw.get(), head, 4);
    try {
      write_all(raw.get(), part.data(), part.size());
    } catch (const Error&) {  // the server closed this one while it was sending
    }
    clients.push_back(std::move(raw));
  }
  // Two fit (6 MiB of 8); the third and fourth pass the bound and are closed.
  int closed = 0;
  for (UniqueFd& c : clients) {
    char byte;
    try {
      read_exact(c.get(), &byte, 1, deadline_in(1.0));  // false at the deadline: still open
    } catch (const Error&) {
      ++closed;  // closed by the server
    }
  }
  StoreClient fresh("127.0.0.1", server.port(), "secret", 5.0);
  fresh.set("k", "v");
  EXPECT_EQ(fresh.get("k").value(), "v");
  server.stop();
  EXPECT_EQ(closed, 2) << refused;
  EXPECT_NE(refused.find("over the 8 MiB the store buffers for all clients together"),
            std::string::npos)
      << refused;
}

// The message when the store hangs up names who served it: ddprun's node 0 by default, rank 0
// under srun (there is no ddprun there).
TEST(StoreClient, AStoreThatEndsIsNamedByWhoServedIt) {
  for (const bool srun : {false, true}) {
    auto server = std::make_unique<StoreServer>(StoreServerConfig{"127.0.0.1", 0, "secret"});
    server->start();
    StoreClient c("127.0.0.1", server->port(), "secret", 2.0);
    if (srun) c.set_server_description("rank 0's process, which serves it,");
    server.reset();
    try {
      c.get("k");
      ADD_FAILURE() << "a store that ended answered";
    } catch (const ConnectionClosed& e) {
      EXPECT_NE(std::string(e.what()).find(srun ? "closed the connection: rank 0's process, which "
                                                  "serves it, has ended"
                                                : "closed the connection: the ddprun that serves "
                                                  "it (node 0) has ended"),
                std::string::npos)
          << e.what();
    }
  }
}

// A munged of the test's own (its own key and socket), as Slurm's nodes run one.
class OwnMunged : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!munge_built()) GTEST_SKIP() << "built without MUNGE (libmunge-dev)";
    if (::access("/usr/sbin/munged", X_OK) != 0) GTEST_SKIP() << "no munged (Debian's munge)";
    const std::string d = dir_.path();
    const RunResult r = run_command(
        "dd if=/dev/urandom of=" + d + "/key bs=1024 count=1 2>/dev/null && chmod 400 " + d +
        "/key && chmod 755 " + d + " && /usr/sbin/munged --force --key-file=" + d +
        "/key --socket=" + d + "/socket --pid-file=" + d + "/pid --log-file=" + d +
        "/log --seed-file=" + d + "/seed");
    if (r.exit_code != 0) GTEST_SKIP() << "munged did not start here: " << r.output;
    socket_ = d + "/socket";
  }
  void TearDown() override {
    if (socket_.empty()) return;
    run_command("kill $(cat " + dir_.file("pid") + ")");
  }
  std::string credential(const std::string& payload) {
    std::string why;
    const std::optional<std::string> made = munge_credential(payload, socket_, &why);
    EXPECT_TRUE(made.has_value()) << why;
    return made.value_or("");
  }
  TempDir dir_;
  std::string socket_;
};

// A credential made and decoded through the test's munged: this process's user and the
// payload; a credential decoded twice is refused the second time (a replay).
TEST_F(OwnMunged, ACredentialSaysWhoMadeItOnce) {
  const std::string made = credential("slurm-9.0");
  std::string why;
  const std::optional<MungeIdentity> who = munge_decode_credential(made, socket_, &why);
  ASSERT_TRUE(who.has_value()) << why;
  EXPECT_EQ(who->uid, ::geteuid());
  EXPECT_EQ(who->payload, "slurm-9.0");
  EXPECT_FALSE(munge_decode_credential(made, socket_, &why).has_value());
  EXPECT_NE(why.find("its MUNGE credential: "), std::string::npos) << why;
}

// A client without the token is refused before its credential is decoded: decoding asks munged
// on the store's one thread, and a munged that never answers (here a socket nobody serves) held
// every client about 10 s while a stranger's credential waited on it.
TEST(StoreMunge, AStrangerIsRefusedBeforeMungedIsAsked) {
  if (!munge_built()) GTEST_SKIP() << "built without MUNGE (libmunge-dev)";
  TempDir dir;
  const std::string path = dir.file("silent-munged");
  UniqueFd silent(::socket(AF_UNIX, SOCK_STREAM, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
  ASSERT_EQ(::bind(silent.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(silent.get(), 16), 0);  // accepts, never answers
  StoreServerConfig config{"127.0.0.1", 0, "slurm-9.0"};
  config.run_id = "slurm-9.0";
  config.require_munge = true;
  config.munge_socket = path;
  StoreServer server(config);
  server.start();
  const Stopwatch clock;
  try {
    StoreClient("127.0.0.1", server.port(), "a-guess", 2.0, 5.0, "slurm-9.0", "some-credential");
    ADD_FAILURE() << "a client without the token was let in";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong token"), std::string::npos) << e.what();
  }
  EXPECT_LT(clock.seconds(), 2.0) << "the refusal waited on munged";
}

// A store under Slurm that demands MUNGE: a client with a credential of the run's id is let
// in; without one, with one of another run, a replayed one, or (root only) one of another user,
// it is refused with the reason, even with the right token.
TEST_F(OwnMunged, TheStoreAdmitsOnlyWhomMungeVouchesFor) {
  StoreServerConfig config{"127.0.0.1", 0, "slurm-9.0"};
  config.run_id = "slurm-9.0";
  config.require_munge = true;
  config.munge_socket = socket_;
  StoreServer server(config);
  server.start();
  const auto refused = [&](const std::string& cred) -> std::string {
    try {
      StoreClient("127.0.0.1", server.port(), "slurm-9.0", 2.0, 5.0, "slurm-9.0", cred);
      return "let in";
    } catch (const UsageError& e) {
      return e.what();
    }
  };
  const std::string good = credential("slurm-9.0");
  StoreClient("127.0.0.1", server.port(), "slurm-9.0", 2.0, 5.0, "slurm-9.0", good).set("k", "v");
  EXPECT_NE(refused("").find("refused this process: no MUNGE credential"), std::string::npos);
  EXPECT_NE(refused(credential("slurm-9.1"))
                .find("a MUNGE credential for run 'slurm-9.1' (this store serves run 'slurm-9.0')"),
            std::string::npos);
  EXPECT_NE(refused(good).find("its MUNGE credential: "), std::string::npos);  // replayed
  EXPECT_NE(refused("garbage").find("its MUNGE credential: "), std::string::npos);
  if (::geteuid() != 0) return;  // another user's credential needs root to make
  const AsNobody nobody = run_as_nobody([&](std::string* text) {
    std::string why;
    const std::optional<std::string> made = munge_credential("slurm-9.0", socket_, &why);
    *text = made.value_or(why);
    return made ? 0 : 5;
  });
  ASSERT_EQ(nobody.status, 0) << "nobody could not get a credential: " << nobody.text;
  const std::string theirs = nobody.text;
  EXPECT_NE(refused(theirs).find("a MUNGE credential of user 65534 (the job's user is 0)"),
            std::string::npos);
}

TEST(RefusalLog, OncePerPeerAndKindAndBoundedInAll) {
  std::vector<std::string> lines;
  RefusalLog log([&](const std::string& line) { lines.push_back(line); });
  for (int size = 5000000; size < 5001000; ++size)
    log.refuse("10.0.0.7", "a frame of " + std::to_string(size) + " bytes");
  EXPECT_EQ(lines.size(), 1u);
  log.refuse("10.0.0.7", "wrong token");
  log.refuse("10.0.0.8", "a frame of 7 bytes");
  EXPECT_EQ(lines.size(), 3u);
  for (int peer = 0; peer < 1000; ++peer)
    log.refuse("10.1.0." + std::to_string(peer), "wrong token");
  EXPECT_EQ(lines.size(), RefusalLog::kMaxRefusalLines + 1);
  EXPECT_NE(lines.back().find("further refusals of any peer go unreported"), std::string::npos)
      << lines.back();
  EXPECT_EQ(log.count(), 1000u + 2 + 1000);
}

// A stuck send or receive names what it moved and its peers (not the store's arrivals: only
// the two ranks take part).
TEST(StuckP2p, NamesTheOperationsAndThePeers) {
  float buffer[4];
  const std::string one = describe_stuck_p2p(
      "g/p", 12, {{false, buffer, 48, DataType::kFloat32, 1}}, "timed out after 3000ms");
  EXPECT_EQ(
      one,
      "recv of 48 x float32 (192 bytes) from rank 1 (point-to-point #12 in group g/p) did "
      "not complete: timed out after 3000ms; the peer (rank 1 of that group) is stopped, dead "
      "or behind");
  const std::string two = describe_stuck_p2p("g", 3,
                                             {{true, buffer, 2, DataType::kFloat64, 2},
                                              {false, buffer, 2, DataType::kFloat64, 0},
                                              {false, buffer, 2, DataType::kFloat64, 2}},
                                             "closed");
  EXPECT_NE(two.find("send of 2 x float64 (16 bytes) to rank 2 and recv of 2 x float64 (16 bytes) "
                     "from rank 0 and recv"),
            std::string::npos)
      << two;
  EXPECT_NE(two.find("the peers (rank 2,0 of that group) are stopped, dead or behind"),
            std::string::npos)
      << two;
}

}  // namespace
}  // namespace ddp
