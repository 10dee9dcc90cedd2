// PyTorch's store as ddprun serves it (--torch-store): PyTorch 1.13's TCPStore client bytes,
// as captured from that client talking to torch's own server, get torch's replies; a wait
// for a key not set yet is answered when another connection sets it; bytes may arrive one
// at a time; PyTorch 2.x's dialect is told apart; a malformed query is refused.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "launcher/torch_store.h"
#include "runtime/socket.h"

namespace ddp {
namespace {

std::string hex(const std::string& text) {
  std::string bytes;
  for (size_t i = 0; i + 1 < text.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16)));
  return bytes;
}

TEST(TorchStore, AnswersPyTorch113sQueriesAsItsOwnServer) {
  std::map<std::string, std::string> kv;
  TorchStoreConnection c;
  // set("/k1", "v1"): no reply
  EXPECT_EQ(c.feed(hex("0003000000000000002f6b3102000000000000007631"), kv), "");
  EXPECT_EQ(kv.at("/k1"), "v1");
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
  EXPECT_EQ(kv.at("/cs"), "x");
  // check: ready, not ready
  EXPECT_EQ(c.feed(hex("04010000000000000003000000000000002f6373"), kv), hex("00"));
  EXPECT_EQ(c.feed(hex("04010000000000000002000000000000002f7a"), kv), hex("01"));
  EXPECT_TRUE(c.error().empty()) << c.error();
}

TEST(TorchStore, AWaitIsAnsweredWhenAnotherConnectionSetsItsKey) {
  std::map<std::string, std::string> kv;
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
  std::map<std::string, std::string> kv;
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
  kv["/q"] = "1";
  EXPECT_EQ(c.answer_waits(kv), "");  // cancelled: nothing more to say
}

TEST(TorchStore, MalformedQueriesAreRefused) {
  std::map<std::string, std::string> kv;
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

// The server over real sockets: a client's set wakes another's wait; a bad query closes that
// connection only and is reported once, naming the peer.
TEST(TorchStoreServer, ServesWaitsAcrossConnectionsAndNamesARefusedPeer) {
  std::vector<std::string> refused;
  std::mutex mutex;
  TorchStoreServer server("127.0.0.1", 0, [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex);
    refused.push_back(line);
  });
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
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("127.0.0.1: query type 42"), std::string::npos) << refused[0];
}

}  // namespace
}  // namespace ddp
