// The rendezvous store: operations, deadlines, token check, garbage and oversized input,
// port 0 and a port already in use. Server and clients in one process, over loopback.
#include <gtest/gtest.h>

#include <thread>

#include "launcher/store_server.h"
#include "runtime/error.h"
#include "runtime/store.h"
#include "runtime/timer.h"

namespace ddp {
namespace {

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
    MessageWriter hello;
    hello.u8(static_cast<uint8_t>(StoreOp::kHello)).str("secret");
    const std::string frame = hello.framed();
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
    MessageWriter hello;
    hello.u8(static_cast<uint8_t>(StoreOp::kHello)).str("secret");
    MessageWriter truncated;  // a set whose value length runs past the frame
    truncated.u8(static_cast<uint8_t>(StoreOp::kSet)).str("k").u32(1000);
    const std::string frames = hello.framed() + truncated.framed();
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

}  // namespace
}  // namespace ddp
