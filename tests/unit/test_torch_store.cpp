// PyTorch's store as ddprun serves it (--torch-store): PyTorch 1.13's TCPStore client bytes,
// as captured from that client talking to torch's own server, get torch's replies; a wait
// for a key not set yet is answered when another connection sets it; bytes may arrive one
// at a time; PyTorch 2.x's dialect is told apart; a malformed query is refused.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "launcher/torch_store.h"
#include "runtime/listener.h"
#include "runtime/socket.h"
#include "runtime/store.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

std::string hex(const std::string& text) {
  std::string bytes;
  for (size_t i = 0; i + 1 < text.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16)));
  return bytes;
}

TEST(TorchStore, AnswersPyTorch113sQueriesAsItsOwnServer) {
  TorchStoreKeys kv;
  TorchStoreConnection c;
  // set("/k1", "v1"): no reply
  EXPECT_EQ(c.feed(hex("0003000000000000002f6b3102000000000000007631"), kv), "");
  EXPECT_EQ(kv.values.at("/k1"), "v1");
  // get: a wait for the key, then the get
  EXPECT_EQ(c.feed(hex("05010000000000000003000000000000002f6b31"), kv), hex("00"));
  EXPECT_EQ(c.feed(hex("0203000000000000002f6b31"), kv), hex("02000000000000007631"));
  // add("/n", 5), sent in two pieces as the client does
  EXPECT_EQ(c.feed(hex("03"), kv), "");
  EXPECT_EQ(c.feed(hex("02000000000000002f6e0500000000000000"), kv), hex("0500000000000000"));
  EXPECT_EQ(c.feed(hex("06"), kv), hex("0200000000000000"));                        // num_keys
  EXPECT_EQ(c.feed(hex("0803000000000000002f6b31"), kv), hex("0100000000000000"));  // delete
  // compare_set("/cs", "", "x") on a missing key sets it
  EXPECT_EQ(c.feed(hex("01"), kv), "");
  EXPECT_EQ(c.feed(hex("03000000000000002f63730000000000000000010000000000000078"), kv),
            hex("010000000000000078"));
  EXPECT_EQ(kv.values.at("/cs"), "x");
  // check: ready, not ready
  EXPECT_EQ(c.feed(hex("04010000000000000003000000000000002f6373"), kv), hex("00"));
  EXPECT_EQ(c.feed(hex("04010000000000000002000000000000002f7a"), kv), hex("01"));
  EXPECT_TRUE(c.error().empty()) << c.error();
}

TEST(TorchStore, AWaitIsAnsweredWhenAnotherConnectionSetsItsKey) {
  TorchStoreKeys kv;
  TorchStoreConnection waiter, setter;
  const std::string wait = hex("05010000000000000003000000000000002f6b31");
  std::string reply;
  for (char byte : wait)  // one byte at a time
    reply += waiter.feed(std::string(1, byte), kv);
  EXPECT_EQ(reply, "");
  EXPECT_EQ(waiter.answer_waits(kv), "");
  EXPECT_EQ(setter.feed(hex("0003000000000000002f6b3102000000000000007631"), kv), "");
  EXPECT_EQ(waiter.answer_waits(kv), hex("00"));
  EXPECT_EQ(waiter.answer_waits(kv), "");  // once
}

// PyTorch 2.x (bytes captured from 2.15's client): a validate query with the magic number
// and a ping open the connection; the query types count from validate.
TEST(TorchStore, AnswersPyTorch2sQueriesAsItsOwnServer) {
  TorchStoreKeys kv;
  TorchStoreConnection c;
  EXPECT_EQ(c.feed(hex("00cef7853c0df3270000"), kv), hex("f3270000"));             // validate, ping
  EXPECT_EQ(c.feed(hex("0103000000000000002f6b3102000000000000007631"), kv), "");  // set
  EXPECT_EQ(c.feed(hex("06010000000000000003000000000000002f6b31"), kv), hex("00"));    // wait
  EXPECT_EQ(c.feed(hex("0303000000000000002f6b31"), kv), hex("02000000000000007631"));  // get
  EXPECT_EQ(c.feed(hex("0402000000000000002f6e0500000000000000"), kv), hex("0500000000000000"));
  EXPECT_EQ(c.feed(hex("05010000000000000004000000000000002f2f6b31"), kv), hex("01"));  // check
  EXPECT_EQ(c.feed(hex("07"), kv), hex("0200000000000000"));                            // num_keys
  EXPECT_EQ(c.feed(hex("0803000000000000002f6b31"), kv), hex("0100000000000000"));      // delete
  EXPECT_EQ(c.feed(hex("0203000000000000002f63730000000000000000010000000000000078"), kv),
            hex("010000000000000078"));  // compare_set
  // The releases that put the magic number before a query too: a get of /cs.
  EXPECT_EQ(c.feed(hex("cef7853c0303000000000000002f6373"), kv), hex("010000000000000078"));
  // A wait that times out on the client is cancelled.
  EXPECT_EQ(c.feed(hex("06010000000000000002000000000000002f71"), kv), "");
  EXPECT_EQ(c.feed(hex("0c"), kv), hex("01"));
  EXPECT_TRUE(c.error().empty()) << c.error();
  kv.values["/q"] = "1";
  EXPECT_EQ(c.answer_waits(kv), "");  // cancelled: nothing more to say
}

TEST(TorchStore, MalformedQueriesAreRefused) {
  TorchStoreKeys kv;
  TorchStoreConnection bad, huge, validate;
  bad.feed(hex("2a"), kv);
  EXPECT_NE(bad.error().find("query type 42"), std::string::npos) << bad.error();
  huge.feed(hex("02ffffffffffffff7f"), kv);
  EXPECT_NE(huge.error().find("over 64 MiB"), std::string::npos) << huge.error();
  validate.feed(hex("00cef7853c0010000000000000"), kv);  // 2.x: validate, then another one
  validate.feed(hex("00deadbeef"), kv);
  EXPECT_NE(validate.error().find("validate query with magic number"), std::string::npos)
      << validate.error();
}

// 1.13's bytes for a query of one type and its strings (and an i64 after them, for add).
std::string query(uint8_t type, const std::vector<std::string>& strings,
                  int64_t* number = nullptr) {
  std::string q(1, static_cast<char>(type));
  const auto u64 = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i)
      q.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  for (const std::string& text : strings) {
    u64(text.size());
    q += text;
  }
  if (number != nullptr) u64(static_cast<uint64_t>(*number));
  return q;
}
std::string set_query(const std::string& key, const std::string& value) {
  return query(0, {key, value});
}
std::string add_query(const std::string& key, int64_t delta) {
  return query(3, {key}, &delta);
}
std::string get_query(const std::string& key) {
  return query(2, {key});
}

// PyTorch's compare_set on a key that holds a value: set only when the expected value is the
// held one; otherwise the key keeps its value, which is the reply. And a wait on several keys
// is answered only once every one of them is set. (Checked against torch's own server by the
// Python test too; this one runs where python3-torch is missing.)
TEST(TorchStore, CompareSetOnAHeldKeyAndAWaitOnSeveralKeysAreTorchs) {
  TorchStoreKeys kv;
  TorchStoreConnection c, setter;
  const auto sized = [](const std::string& value) { return query(99, {value}).substr(1); };
  EXPECT_EQ(c.feed(set_query("cs", "held"), kv), "");
  EXPECT_EQ(c.feed(query(1, {"cs", "wrong", "new"}), kv), sized("held"));
  EXPECT_EQ(kv.values.at("cs"), "held");
  EXPECT_EQ(c.feed(query(1, {"cs", "", "new"}), kv), sized("held"));  // empty is not "held"
  EXPECT_EQ(kv.values.at("cs"), "held");
  EXPECT_EQ(c.feed(query(1, {"cs", "held", "new"}), kv), sized("new"));
  EXPECT_EQ(kv.values.at("cs"), "new");
  // A missing key with a non-empty expected value: not set, the expected value answered.
  EXPECT_EQ(c.feed(query(1, {"gone", "x", "y"}), kv), sized("x"));
  EXPECT_EQ(kv.values.count("gone"), 0u);

  // wait(["a", "b"]): 1.13's WAIT (type 5) with a u64 count before the keys.
  const std::string wait =
      std::string(1, '\x05') + hex("0200000000000000") + query(0, {"a", "b"}).substr(1);
  EXPECT_EQ(c.feed(wait, kv), "");
  EXPECT_EQ(setter.feed(set_query("b", "2"), kv), "");  // the last key first
  EXPECT_EQ(c.answer_waits(kv), "") << "answered with one of two keys set";
  EXPECT_EQ(setter.feed(set_query("a", "1"), kv), "");
  EXPECT_EQ(c.answer_waits(kv), hex("00"));
  EXPECT_TRUE(c.error().empty()) << c.error();
}

// check(["c", "d"]) and wait(["c", "d"]) asked while only the last key is set: not ready, and no
// answer yet (a server that read the last key alone answered both at once).
TEST(TorchStore, ACheckOrWaitOfSeveralKeysNeedsEveryKey) {
  TorchStoreKeys kv;
  TorchStoreConnection c, setter;
  const std::string keys = hex("0200000000000000") + query(0, {"c", "d"}).substr(1);
  EXPECT_EQ(setter.feed(set_query("d", "2"), kv), "");
  EXPECT_EQ(c.feed(std::string(1, '\x04') + keys, kv), hex("01")) << "check: not ready";
  EXPECT_EQ(c.feed(std::string(1, '\x05') + keys, kv), "") << "wait: answered early";
  EXPECT_EQ(setter.feed(set_query("c", "1"), kv), "");
  EXPECT_EQ(c.answer_waits(kv), hex("00"));
  EXPECT_EQ(c.feed(std::string(1, '\x04') + keys, kv), hex("00")) << "check: ready";
  EXPECT_TRUE(c.error().empty()) << c.error();
}

// An add to a key holding text that is no integer, or past int64, drops that connection with
// a line (it once ended ddprun through an uncaught std::stoll); other keys stay as they were.
TEST(TorchStore, AnAddToANonIntegerOrPastInt64IsRefused) {
  TorchStoreKeys kv;
  TorchStoreConnection text, huge, negative;
  EXPECT_EQ(text.feed(set_query("k", "abc") + add_query("k", 1), kv), "");
  EXPECT_NE(text.error().find("holds no integer"), std::string::npos) << text.error();
  EXPECT_EQ(kv.values.at("k"), "abc");
  huge.feed(set_query("n", "99999999999999999999") + add_query("n", 1), kv);
  EXPECT_NE(huge.error().find("holds no integer"), std::string::npos) << huge.error();
  huge = TorchStoreConnection();
  huge.feed(set_query("m", "9223372036854775807") + add_query("m", 1), kv);
  EXPECT_NE(huge.error().find("past the largest"), std::string::npos) << huge.error();
  EXPECT_EQ(negative.feed(set_query("c", "-3") + add_query("c", 5), kv), hex("0200000000000000"));
  EXPECT_TRUE(negative.error().empty()) << negative.error();
}

// Replies are built only up to the room the caller gives; the queries past it wait in the
// connection and are answered on a later call with no new bytes.
TEST(TorchStore, RepliesPastTheRoomWaitForTheNextCall) {
  TorchStoreKeys kv;
  TorchStoreConnection c;
  const std::string value(1000, 'v');
  std::string gets;
  for (int i = 0; i < 20; ++i)
    gets += get_query("big");
  EXPECT_EQ(c.feed(set_query("big", value), kv), "");
  const std::string first = c.feed(gets, kv, 2500);
  EXPECT_EQ(first.size(), 3 * (8 + value.size()));  // stops once past the room
  EXPECT_GT(c.pending(), 0u);
  std::string rest;
  while (c.pending() > 0)
    rest += c.feed("", kv, 2500);
  EXPECT_EQ(first.size() + rest.size(), 20 * (8 + value.size()));
  EXPECT_TRUE(c.error().empty()) << c.error();
}

// The store holds a bounded number of bytes in all; a set past it is refused, a delete gives
// its bytes back.
TEST(TorchStore, TheStoreHoldsABoundedNumberOfBytes) {
  TorchStoreKeys kv;
  kv.max_bytes = 100;
  TorchStoreConnection a, b;
  EXPECT_EQ(a.feed(set_query("a", std::string(60, 'x')), kv), "");
  EXPECT_EQ(kv.bytes, 61u);
  EXPECT_EQ(a.feed(set_query("a", std::string(90, 'y')), kv), "");  // replaces: 91 bytes
  EXPECT_EQ(kv.bytes, 91u);
  b.feed(set_query("b", std::string(20, 'z')), kv);
  EXPECT_NE(b.error().find("past the 0 MiB the store holds"), std::string::npos) << b.error();
  EXPECT_EQ(kv.values.count("b"), 0u);
  EXPECT_EQ(a.feed(query(8, {"a"}), kv), hex("0100000000000000"));  // delete
  EXPECT_EQ(kv.bytes, 0u);
}

// The refusals a server reports, collected from its thread.
class Refusals {
 public:
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back(line);
    };
  }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

// The server over real sockets: a client's set wakes another's wait; a bad query closes that
// connection only and is reported once, naming the peer.
TEST(TorchStoreServer, ServesWaitsAcrossConnectionsAndNamesARefusedPeer) {
  Refusals refusals;
  TorchStoreServer server("127.0.0.1", 0, refusals.sink());
  server.start();
  const Deadline deadline = deadline_in(5.0);
  UniqueFd waiter = tcp_connect("127.0.0.1", server.port(), deadline);
  UniqueFd setter = tcp_connect("127.0.0.1", server.port(), deadline);
  UniqueFd bad = tcp_connect("127.0.0.1", server.port(), deadline);
  const std::string wait = hex("05010000000000000003000000000000002f6b31");
  write_all(waiter.get(), wait.data(), wait.size());
  const std::string set = hex("0003000000000000002f6b3102000000000000007631");
  write_all(setter.get(), set.data(), set.size());
  char reply = 9;
  ASSERT_TRUE(read_exact(waiter.get(), &reply, 1, deadline));
  EXPECT_EQ(reply, 0);  // STOP_WAITING
  const std::string junk = hex("2a");
  write_all(bad.get(), junk.data(), junk.size());
  EXPECT_THROW(read_exact(bad.get(), &reply, 1, deadline), ConnectionClosed);
  const std::string get = hex("0203000000000000002f6b31");
  write_all(setter.get(), get.data(), get.size());  // the others still served
  char value[10];
  ASSERT_TRUE(read_exact(setter.get(), value, 10, deadline));
  EXPECT_EQ(std::string(value + 8, 2), "v1");
  server.stop();
  const std::vector<std::string> refused = refusals.lines();
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("127.0.0.1: query type 42"), std::string::npos) << refused[0];
}

// PyTorch's clients give no token, but a process of this host that runs as another user is
// closed at once, named; the job's user is served.
TEST(TorchStoreServer, AProcessOfAnotherUserOnThisHostIsClosed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run a client as another user";
  Refusals refusals;
  TorchStoreServer server("127.0.0.1", 0, refusals.sink());
  server.start();
  const AsNobody nobody = run_as_nobody([&](std::string*) {
    try {
      UniqueFd fd = tcp_connect("127.0.0.1", server.port(), deadline_in(2.0));
      const std::string count = hex("06");  // 1.13's key count: answered with 8 bytes
      write_all(fd.get(), count.data(), count.size());
      char reply[8];
      return read_exact(fd.get(), reply, 8, deadline_in(3.0)) ? 1 : 2;
    } catch (const ConnectionClosed&) {
      return 0;  // closed by the server
    }
  });
  EXPECT_EQ(nobody.status, 0) << "1: served, 2: left open unanswered, 3: setuid, 4: other";
  UniqueFd mine = tcp_connect("127.0.0.1", server.port(), deadline_in(2.0));
  const std::string count = hex("06");
  write_all(mine.get(), count.data(), count.size());
  char reply[8];
  EXPECT_TRUE(read_exact(mine.get(), reply, 8, deadline_in(3.0)));
  server.stop();
  const std::vector<std::string> refused = refusals.lines();
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("127.0.0.1: a process of user 65534 on this host"), std::string::npos)
      << refused[0];
}

// A stranger's two queries (a set of text, an add to it) close that connection alone: the
// server goes on serving everyone else.
TEST(TorchStoreServer, AnAddToTextDropsThatClientOnly) {
  Refusals refusals;
  TorchStoreServer server("127.0.0.1", 0, refusals.sink());
  server.start();
  const Deadline deadline = deadline_in(5.0);
  UniqueFd stranger = tcp_connect("127.0.0.1", server.port(), deadline);
  const std::string bad = set_query("k", "abc") + add_query("k", 1);
  write_all(stranger.get(), bad.data(), bad.size());
  char reply[16];
  EXPECT_THROW(read_exact(stranger.get(), reply, 8, deadline), ConnectionClosed);
  UniqueFd client = tcp_connect("127.0.0.1", server.port(), deadline);
  const std::string add = add_query("n", 2);
  write_all(client.get(), add.data(), add.size());
  ASSERT_TRUE(read_exact(client.get(), reply, 8, deadline));
  EXPECT_EQ(reply[0], 2);
  server.stop();
  const std::vector<std::string> refused = refusals.lines();
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("holds no integer"), std::string::npos) << refused[0];
}

// A client that asks for a large value many times and reads nothing: the server builds a
// bounded queue of replies for it, answers everyone else meanwhile, drops it once it has read
// nothing for the stall deadline, and stops at once when asked.
TEST(TorchStoreServer, AClientThatNeverReadsHoldsNeitherMemoryNorOthers) {
  Refusals refusals;
  TorchStoreServer server("127.0.0.1", 0, refusals.sink(), 1.0);
  server.start();
  const Deadline deadline = deadline_in(20.0);
  UniqueFd hog = tcp_connect("127.0.0.1", server.port(), deadline);
  const std::string set = set_query("big", std::string(size_t{32} << 20, 'v'));
  write_all(hog.get(), set.data(), set.size());
  std::string gets;
  for (int i = 0; i < 20; ++i)
    gets += get_query("big");
  write_all(hog.get(), gets.data(), gets.size());
  UniqueFd client = tcp_connect("127.0.0.1", server.port(), deadline);
  const auto started = std::chrono::steady_clock::now();
  const std::string add = add_query("n", 7);
  write_all(client.get(), add.data(), add.size());
  char reply[8];
  ASSERT_TRUE(read_exact(client.get(), reply, 8, deadline));
  EXPECT_EQ(reply[0], 7);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(1));
  // The hog is dropped after its stall deadline (its socket then reads as closed).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::vector<std::string> refused;
  while (refused.empty() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    refused = refusals.lines();
  }
  ASSERT_FALSE(refused.empty());
  EXPECT_NE(refused[0].find("read none of its replies"), std::string::npos) << refused[0];
  const auto stopping = std::chrono::steady_clock::now();
  server.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - stopping, std::chrono::seconds(3));
}

// Strangers that connect and say nothing cannot push a real client out at the cap: the
// longest-idle silent one makes room.
TEST(TorchStoreServer, SilentConnectionsMakeRoomForClientsAtTheCap) {
  constexpr size_t kCap = 8;
  TorchStoreServer server("127.0.0.1", 0, nullptr, kTorchStoreStallSeconds, kCap);
  server.start();
  const Deadline deadline = deadline_in(20.0);
  UniqueFd speaker = tcp_connect("127.0.0.1", server.port(), deadline);
  const std::string add = add_query("n", 1);
  write_all(speaker.get(), add.data(), add.size());
  char reply[8];
  ASSERT_TRUE(read_exact(speaker.get(), reply, 8, deadline));
  std::vector<UniqueFd> silent;
  for (size_t i = 0; i < kCap + 5; ++i)
    silent.push_back(tcp_connect("127.0.0.1", server.port(), deadline));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // all accepted
  UniqueFd late = tcp_connect("127.0.0.1", server.port(), deadline);
  write_all(late.get(), add.data(), add.size());
  ASSERT_TRUE(read_exact(late.get(), reply, 8, deadline));
  EXPECT_EQ(reply[0], 2);
  write_all(speaker.get(), add.data(), add.size());  // the one that had spoken stays
  ASSERT_TRUE(read_exact(speaker.get(), reply, 8, deadline));
  EXPECT_EQ(reply[0], 3);
  server.stop();
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// ddp's own client of PyTorch's store (what ddp::init uses under torchrun), against the server
// above in each dialect it guesses first: values, counters, removal, waits across clients and
// a wait's timeout naming the keys missing, each process's keys under its prefix.
TEST(TorchStoreClient, SpeaksBothDialectsThroughTheSameCalls) {
  Refusals refusals;
  TorchStoreServer server("127.0.0.1", 0, refusals.sink());
  server.start();
  for (const bool torch2 : {false, true}) {
    const std::string prefix = torch2 ? "ddp/attempt_1/" : "ddp/attempt_0/";
    StoreClient a(StoreProtocol::kTorch, "127.0.0.1", server.port(), prefix, torch2, 5.0, 5.0);
    StoreClient b(StoreProtocol::kTorch, "127.0.0.1", server.port(), prefix, torch2, 5.0, 5.0);
    EXPECT_EQ(a.torch2(), torch2);
    EXPECT_EQ(a.get("k"), std::nullopt);
    std::thread setter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      b.set("k", std::string("v\0w", 3));
    });
    EXPECT_EQ(a.wait_get("k", 5.0), std::string("v\0w", 3));
    setter.join();
    EXPECT_EQ(a.add("n", 2), 2);
    EXPECT_EQ(b.add("n", -5), -3);
    EXPECT_EQ(a.missing({"k", "gone"}), std::vector<std::string>{"gone"});
    EXPECT_TRUE(a.remove("k"));
    EXPECT_FALSE(b.remove("k"));
    try {
      a.wait({"n", "never"}, 0.2);
      ADD_FAILURE() << "the wait did not time out";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("for 1 of 2 keys: never"), std::string::npos)
          << e.what();
    }
  }
  server.stop();
  EXPECT_TRUE(refusals.lines().empty());
}

// A store that announces a value and sends part of it (a stranger's, or one cut off) holds a
// wait_get no longer than its own timeout and a second, not a whole reply timeout (40 s
// under ddp::init), and the message says what happened.
TEST(TorchStoreClient, AValueCutShortHoldsAWaitNoLongerThanItsTimeout) {
  Listener listener = listen_tcp("127.0.0.1", 0, "a test");
  std::thread store([fd = listener.fd.get()] {
    // PyTorch 1.13's replies, one query a read (the client waits for each reply): the key
    // count (the probe), "ready" to every check, and a value of 100 bytes cut after 10.
    for (int connection = 0; connection < 2; ++connection) {
      UniqueFd c(::accept(fd, nullptr, nullptr));
      char buffer[4096];
      ssize_t n;
      while ((n = ::recv(c.get(), buffer, sizeof(buffer), 0)) > 0) {
        std::string reply;
        if (buffer[0] == 6) reply = std::string(8, '\0');
        if (buffer[0] == 4) reply = std::string(1, '\0');
        if (buffer[0] == 2) reply = query(99, {std::string(100, 'v')}).substr(1, 8 + 10);
        if (!reply.empty()) write_all(c.get(), reply.data(), reply.size());
      }
    }
  });
  {
    StoreClient c(StoreProtocol::kTorch, "127.0.0.1", listener.port, "p/", false, 5.0, 30.0);
    const auto started = std::chrono::steady_clock::now();
    try {
      c.wait_get("k", 1.0);
      ADD_FAILURE() << "a value cut short was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("announced a value of 100 bytes and did not send it "
                                           "all within 1.0s"),
                std::string::npos)
          << e.what();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    EXPECT_LT(seconds, 5.0) << "held past the wait's timeout";
  }
  store.join();
}

// Something that accepts and never answers is neither dialect: said so, naming the address.
TEST(TorchStoreClient, AListenerThatNeverAnswersIsNamed) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  socklen_t length = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  const int port = ntohs(addr.sin_port);
  try {
    StoreClient c(StoreProtocol::kTorch, "127.0.0.1", port, "p/", false, 5.0, 5.0);
    ADD_FAILURE() << "a silent listener was taken for a store";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("127.0.0.1:{}", port)), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("neither PyTorch 1.13's nor 2.x's"), std::string::npos)
        << e.what();
  }
  ::close(fd);
}

}  // namespace
}  // namespace ddp
