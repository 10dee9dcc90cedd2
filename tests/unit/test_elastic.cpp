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

#include <fmt/format.h>

#include "launcher/elastic.h"
#include "runtime/error.h"
#include "runtime/store.h"
#include "runtime/store_server.h"

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

// A node started with another --nnodes than the job's first is refused at its first join,
// naming both (admitted, it closed generations at its own MIN and MAX).
TEST_F(Elastic, ANodeWithAnotherNnodesIsRefused) {
  Node a = node(1, 2, 0.2), b = node(1, 3, 0.2);
  Membership ma, mb;
  ASSERT_TRUE(join(a, &ma));
  try {
    join(b, &mb);
    ADD_FAILURE() << "a node with --nnodes 1:3 joined a 1:2 job";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--nnodes 1:3: the job's nodes were started with "
                                         "--nnodes 1:2"),
              std::string::npos)
        << e.what();
  }
}

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

// Three nodes arriving together under --nnodes 1:2: the generation closes with two, the
// third is late (it waits for the next generation, never a member beyond MAX).
TEST_F(Elastic, AClosingGenerationNeverTakesMoreThanMax) {
  Node a = node(1, 2, 0.2), b = node(1, 2, 0.2), c = node(1, 2, 0.2);
  Membership ma, mb, mc;
  auto ja = std::async(std::launch::async, [&] { return join(a, &ma); });
  auto jb = std::async(std::launch::async, [&] { return join(b, &mb); });
  auto jc = std::async(std::launch::async, [&] { return join(c, &mc); });
  // Two return in generation 0; the third waits (until the job moves on).
  std::future<bool>* joins[] = {&ja, &jb, &jc};
  Node* nodes[] = {&a, &b, &c};
  Membership* ms[] = {&ma, &mb, &mc};
  bool joined[3] = {false, false, false};
  std::this_thread::sleep_for(std::chrono::seconds(2));
  for (int i = 0; i < 3; ++i)
    if (joins[i]->wait_for(std::chrono::seconds(0)) == std::future_status::ready)
      joined[i] = joins[i]->get();
  int members = 0;
  for (int i = 0; i < 3; ++i) {
    if (!joined[i]) continue;
    ++members;
    EXPECT_EQ(ms[i]->generation, 0);
    EXPECT_EQ(ms[i]->nnodes, 2);
  }
  EXPECT_EQ(members, 2) << "a generation of --nnodes 1:2 took " << members << " nodes";
  // The generation's members finish: the waiting node stops waiting.
  for (int i = 0; i < 3; ++i)
    if (joined[i]) nodes[i]->rendezvous->finish(*ms[i]);
  for (int i = 0; i < 3; ++i)
    if (joins[i]->valid()) EXPECT_FALSE(joins[i]->get());
}

// Every join came before any vote (a store that answers the joins first, as under load): the
// generation still closes with MAX nodes, and the one over waits for room no longer than the
// timeout, saying why. (Two joins are made by hand before the node's own, so the order cannot
// vary.)
TEST_F(Elastic, AGenerationClosesWithMaxEvenWhenEveryJoinCameBeforeTheVote) {
  std::unique_ptr<StoreClient> others = client();
  for (int k = 0; k < 2; ++k) {
    others->add("ddprun/elastic/0/joined", 1);
    others->set(fmt::format("ddprun/elastic/0/addr/{}", k), "10.0.0." + std::to_string(k + 1));
  }
  Node c = node(1, 2, 0, /*timeout_s=*/0.5);
  Membership mc;
  try {
    join(c, &mc);
    ADD_FAILURE() << "a third node joined a generation of at most 2, with " << mc.nnodes;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--nnodes 1:2: generation 0 closed with 2 nodes before "
                                         "this one came (the most --nnodes allows), and made no "
                                         "room for it within 0s (--timeout)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(others->get("ddprun/elastic/0/closed").value_or(""), "2");
}

// After a node's workers failed: a member whose heartbeat goes on (from its Heartbeat thread,
// as while it stops its own workers) is not lost; one whose heartbeat stopped is, by name; a
// generation ended as lost says so to every node.
TEST_F(Elastic, ALostMemberIsToldApartFromALiveOne) {
  Node a = node(2, 2, 0), b = node(2, 2, 0);
  Membership ma, mb;
  auto ja = std::async(std::launch::async, [&] { return join(a, &ma); });
  ASSERT_TRUE(join(b, &mb));
  ASSERT_TRUE(ja.get());
  {
    Heartbeat beating(client(), mb.generation, mb.node_rank);
    EXPECT_EQ(a.rendezvous->lost_member(ma, 5.0), "");
  }
  const std::string lost = a.rendezvous->lost_member(ma, 0.5);
  EXPECT_EQ(lost, fmt::format("node {} (127.0.0.1)", mb.node_rank));
  a.rendezvous->end(ma, {lost + " lost", false, true});
  const GenerationEnd seen = b.rendezvous->ended(mb);
  EXPECT_TRUE(seen.lost);
  EXPECT_FALSE(seen.membership);
  EXPECT_EQ(seen.why, lost + " lost");
}

// A node whose workers finished stops beating: its peer, still saving, does not declare it
// lost after the timeout.
TEST_F(Elastic, ANodeThatFinishedIsNotDeclaredLost) {
  Node a = node(2, 2, 0, 0.5), b = node(2, 2, 0, 0.5);
  Membership ma, mb;
  auto ja = std::async(std::launch::async, [&] { return join(a, &ma); });
  ASSERT_TRUE(join(b, &mb));
  ASSERT_TRUE(ja.get());
  EXPECT_EQ(a.rendezvous->check(ma), "");
  EXPECT_EQ(b.rendezvous->check(mb), "");
  b.rendezvous->finish(mb);  // b is done and stops beating
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    EXPECT_EQ(a.rendezvous->check(ma), "") << "after " << (i + 1) * 150 << " ms";
  }
  // Without finishing, a silent node is lost after the timeout.
  Node c = node(2, 2, 0, 0.5), d = node(2, 2, 0, 0.5);
  Membership mc, md;
  auto jc = std::async(std::launch::async, [&] { return join(c, &mc, ma.generation); });
  ASSERT_TRUE(join(d, &md, ma.generation));
  ASSERT_TRUE(jc.get());
  std::string why;
  for (int i = 0; i < 20 && why.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    why = c.rendezvous->check(mc);
  }
  EXPECT_NE(why.find("stopped answering"), std::string::npos) << why;
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
