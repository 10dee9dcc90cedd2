// The elastic rendezvous (launcher/elastic.h) over a real store on loopback, nodes as
// threads: a generation closes at MAX nodes at once, or after the last call with MIN; a node
// that comes after it closed is late, and the generation's nodes restart with it (a
// membership end, no failure); a late node stops waiting when the job finishes; too few
// nodes within the timeout is an error naming the counts.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <string>
#include <thread>

#include "launcher/elastic.h"
#include "launcher/store_server.h"
#include "runtime/error.h"
#include "runtime/store.h"

namespace ddp {
namespace {

class Elastic : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<StoreServer>(StoreServerConfig{"127.0.0.1", 0, "secret"});
    server_->start();
  }
  std::unique_ptr<StoreClient> client() {
    return std::make_unique<StoreClient>("127.0.0.1", server_->port(), "secret", 5.0);
  }
  // A node: its own connection and rendezvous.
  struct Node {
    std::unique_ptr<StoreClient> store;
    std::unique_ptr<ElasticRendezvous> rendezvous;
  };
  Node node(int min, int max, double last_call_s, double timeout_s = 10) {
    Node n;
    n.store = client();
    n.rendezvous = std::make_unique<ElasticRendezvous>(*n.store, min, max, last_call_s, timeout_s,
                                                       "127.0.0.1");
    return n;
  }
  static bool join(Node& n, Membership* m, int64_t after = -1) {
    return n.rendezvous->join(m, after, [] {});
  }
  std::unique_ptr<StoreServer> server_;
};

TEST_F(Elastic, AGenerationClosesAtMaxAtOnceAndNumbersItsNodesByArrival) {
  Node a = node(1, 2, 60), b = node(1, 2, 60);  // the last call would take a minute
  Membership ma, mb;
  auto first = std::async(std::launch::async, [&] { return join(a, &ma); });
  ASSERT_TRUE(join(b, &mb));
  ASSERT_TRUE(first.get());
  EXPECT_EQ(ma.generation, 0);
  EXPECT_EQ(mb.generation, 0);
  EXPECT_EQ(ma.nnodes, 2);
  EXPECT_EQ(mb.nnodes, 2);
  EXPECT_EQ(ma.node_rank + mb.node_rank, 1);  // 0 and 1
  EXPECT_EQ(ma.addresses.size(), 2u);
}

TEST_F(Elastic, ALateNodeMakesTheGenerationRestartWithItWithoutAFailure) {
  Node a = node(1, 3, 0.2);
  Membership ma;
  ASSERT_TRUE(join(a, &ma));  // alone after the last call
  EXPECT_EQ(ma.nnodes, 1);
  EXPECT_EQ(a.rendezvous->check(ma), "");
  Node b = node(1, 3, 0.2);
  Membership mb;
  auto late = std::async(std::launch::async, [&] { return join(b, &mb); });
  std::string why;
  for (int i = 0; i < 100 && why.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    why = a.rendezvous->check(ma);
  }
  EXPECT_EQ(why, "1 node waiting to join: restarting the group with it");
  a.rendezvous->end(ma, {why, true});
  EXPECT_TRUE(a.rendezvous->ended(ma).membership);
  Membership next;
  ASSERT_TRUE(join(a, &next, ma.generation));
  ASSERT_TRUE(late.get());
  EXPECT_EQ(next.generation, 1);
  EXPECT_EQ(mb.generation, 1);
  EXPECT_EQ(next.nnodes, 2);
  EXPECT_EQ(mb.nnodes, 2);
  // Another node ended it: the other sees why.
  b.rendezvous->end(mb, {"node 1: rank 1 failed first: exit code 1", false});
  std::string seen;
  for (int i = 0; i < 20 && seen.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    seen = a.rendezvous->check(next);
  }
  EXPECT_EQ(seen, "node 1: rank 1 failed first: exit code 1");
  EXPECT_FALSE(a.rendezvous->ended(next).membership);
}

TEST_F(Elastic, ANodeWaitingWhenTheJobFinishesStopsWaiting) {
  Node a = node(1, 1, 0);  // full at one node: a late one waits for room
  Membership ma;
  ASSERT_TRUE(join(a, &ma));
  Node b = node(1, 1, 0);
  Membership mb;
  auto late = std::async(std::launch::async, [&] { return join(b, &mb); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(a.rendezvous->check(ma), "") << "no room: the generation runs on";
  EXPECT_TRUE(a.rendezvous->finish(ma));
  EXPECT_FALSE(late.get());
}

TEST_F(Elastic, TooFewNodesWithinTheTimeoutIsAnError) {
  Node a = node(2, 4, 0, /*timeout_s=*/0.3);
  Membership m;
  try {
    join(a, &m);
    FAIL() << "joined without MIN nodes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "--nnodes 2:4: 1 of at least 2 nodes joined generation 0 within 0s"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp
