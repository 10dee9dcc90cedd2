// --zero 3's gather decisions on the GPU (dist/layer_gathers.h): a forward and a backward
// pass as the runner meets them, one and two layers ahead (--zero-prefetch), and random passes
// checked against a model of the slots, for one to three layers ahead: every use reads its own
// layer, gathered and waited for; no slot is gathered into while its gather is still to be
// waited for (passes that stop short leave prefetches unused); every gather is waited for
// exactly once.
#include <gtest/gtest.h>

#include <random>

#include "dist/gradient_ring.h"
#include "dist/layer_gathers.h"
#include "runtime/error.h"

namespace ddp {
namespace {

using Kind = LayerGathers::Kind;
using Actions = std::vector<LayerGathers::Action>;

TEST(LayerGathers, ThePrefetchOfAPassesFirstLayerLeavesItsUseOnlyTheWaitAndReleaseFreesTheSlots) {
  LayerGathers g(4);
  // The schedule's kUnshard before a forward: layer 0 on its way; its use only waits.
  EXPECT_EQ(g.prefetch(0), (Actions{{Kind::kGather, 0}}));
  EXPECT_EQ(g.prefetch(0), Actions{});  // held already
  EXPECT_EQ(g.use(0, {1}), (Actions{{Kind::kUse, 0}, {Kind::kGather, 1}}));
  EXPECT_EQ(g.use(1, {}), (Actions{{Kind::kUse, 1}}));
  // Before the backward: the last layer read, 1, is held and used: nothing to gather.
  EXPECT_EQ(g.prefetch(1), Actions{});
  // A prefetch into a slot whose gather nobody used waits for it first.
  EXPECT_EQ(g.prefetch(2), (Actions{{Kind::kGather, 2}}));  // into 0's slot
  EXPECT_EQ(g.prefetch(0), (Actions{{Kind::kDrop, 2}, {Kind::kGather, 0}}));
  // kReshard of layers 0 and 1: 0's pending gather waited for, both slots free.
  EXPECT_EQ(g.release(0, 2), (Actions{{Kind::kDrop, 0}}));
  EXPECT_EQ(g.holder(0), -1);
  EXPECT_EQ(g.holder(1), -1);
  EXPECT_EQ(g.release(0, 4), Actions{});
  EXPECT_EQ(g.forget(), Actions{});
  EXPECT_THROW(g.prefetch(4), Error);
  EXPECT_THROW(g.release(3, 5), Error);
}

TEST(LayerGathers, AForwardThenABackwardGathersEachUseOnceAndTheNextMeanwhile) {
  LayerGathers g(4);
  // Forward 0..3: each use waits for its layer, gathered (the first) or prefetched before.
  EXPECT_EQ(g.use(0, {1}), (Actions{{Kind::kGather, 0}, {Kind::kUse, 0}, {Kind::kGather, 1}}));
  EXPECT_EQ(g.use(1, {2}), (Actions{{Kind::kUse, 1}, {Kind::kGather, 2}}));
  EXPECT_EQ(g.use(2, {3}), (Actions{{Kind::kUse, 2}, {Kind::kGather, 3}}));
  EXPECT_EQ(g.use(3, {}), (Actions{{Kind::kUse, 3}}));
  // Backward 3..1 (the first layer's input gradient is not computed): 3 and 2 are held.
  EXPECT_EQ(g.use(3, {2}), Actions{});
  EXPECT_EQ(g.use(2, {1}), (Actions{{Kind::kGather, 1}}));  // into 3's slot, 3 being done
  EXPECT_EQ(g.use(1, {0}), (Actions{{Kind::kUse, 1}, {Kind::kGather, 0}}));
  // Layer 0's prefetch, unused in this step: waited for at its end.
  EXPECT_EQ(g.forget(), (Actions{{Kind::kDrop, 0}}));
  EXPECT_EQ(g.holder(0), -1);
  EXPECT_EQ(g.holder(1), -1);
  // The next step gathers afresh, as the first did.
  EXPECT_EQ(g.use(0, {1}), (Actions{{Kind::kGather, 0}, {Kind::kUse, 0}, {Kind::kGather, 1}}));
}

// --zero-prefetch 2: three slots; each use has the next two layers on their way.
TEST(LayerGathers, TwoAheadGathersTheNextTwoLayersMeanwhile) {
  LayerGathers g(5, 2);
  EXPECT_EQ(g.slots(), 3);
  EXPECT_EQ(g.use(0, {1, 2}),
            (Actions{{Kind::kGather, 0}, {Kind::kUse, 0}, {Kind::kGather, 1}, {Kind::kGather, 2}}));
  EXPECT_EQ(g.use(1, {2, 3}), (Actions{{Kind::kUse, 1}, {Kind::kGather, 3}}));  // into 0's slot
  EXPECT_EQ(g.use(2, {3, 4}), (Actions{{Kind::kUse, 2}, {Kind::kGather, 4}}));
  EXPECT_EQ(g.use(3, {4}), (Actions{{Kind::kUse, 3}}));
  EXPECT_EQ(g.use(4, {}), (Actions{{Kind::kUse, 4}}));
  // Backward: 4, 3 and 2 are held (slots 1, 0 and 2); 1 goes where 4 was once 4 is read.
  EXPECT_EQ(g.use(4, {3, 2}), Actions{});
  EXPECT_EQ(g.use(3, {2, 1}), (Actions{{Kind::kGather, 1}}));
  EXPECT_EQ(g.use(2, {1, 0}), (Actions{{Kind::kGather, 0}}));
  EXPECT_EQ(g.use(1, {0}), (Actions{{Kind::kUse, 1}}));
  EXPECT_EQ(g.forget(), (Actions{{Kind::kDrop, 0}}));
  // Two next layers in one slot (five layers apart in three slots is not a pass) are refused.
  EXPECT_THROW(g.use(0, {3}), Error);
  EXPECT_THROW(LayerGathers(4, -1), Error);
}

TEST(LayerGathers, NoneAheadIsOneSlotGatheredAtEachUseOfAnotherLayer) {
  LayerGathers g(3, 0);  // the CPU's: each layer gathered as it is used
  EXPECT_EQ(g.slots(), 1);
  EXPECT_EQ(g.use(0, {1}), (Actions{{Kind::kGather, 0}, {Kind::kUse, 0}}));  // nothing ahead
  EXPECT_EQ(g.use(1, {}), (Actions{{Kind::kGather, 1}, {Kind::kUse, 1}}));
  EXPECT_EQ(g.use(1, {}), Actions{});  // still in the slot
  EXPECT_EQ(g.use(0, {}), (Actions{{Kind::kGather, 0}, {Kind::kUse, 0}}));
  EXPECT_EQ(g.forget(), Actions{});
  EXPECT_EQ(g.use(0, {}), (Actions{{Kind::kGather, 0}, {Kind::kUse, 0}}));  // forgotten
}

TEST(LayerGathers, APrefetchNobodyUsedIsWaitedForBeforeItsSlotIsGatheredAgain) {
  LayerGathers g(6);
  g.use(2, {3});  // gathers 2, prefetches 3
  // Another pass reads 5 (slot 1, where 3 is still on its way).
  EXPECT_EQ(g.use(5, {}), (Actions{{Kind::kDrop, 3}, {Kind::kGather, 5}, {Kind::kUse, 5}}));
  EXPECT_EQ(g.forget(), Actions{});
  EXPECT_THROW(g.use(6, {}), Error);   // no such layer
  EXPECT_THROW(g.use(2, {4}), Error);  // the next layer is always the other slot's
}

TEST(LayerGathers, RandomPassesReadTheirOwnLayersAndWaitForEveryGatherOnce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int layers = 1 + static_cast<int>(rng() % 9);
    const int ahead = 1 + trial % 3;
    LayerGathers g(layers, ahead);
    std::vector<int> slot_holds(ahead + 1, -1);  // what the slots hold once gathered
    std::vector<int> issued(layers, 0), waited(layers, 0);
    const auto apply = [&](const Actions& actions) {
      for (const auto& a : actions) {
        if (a.kind == Kind::kGather) {
          ASSERT_EQ(issued[a.layer], waited[a.layer]) << "gathered again before waited for";
          const int before = slot_holds[g.slot_of(a.layer)];
          if (before >= 0)
            ASSERT_EQ(issued[before], waited[before])
                << "slot of layer " << before << " gathered into before its gather was waited for";
          ++issued[a.layer];
          slot_holds[g.slot_of(a.layer)] = a.layer;
        } else {
          ++waited[a.layer];
          ASSERT_EQ(issued[a.layer], waited[a.layer]) << "waited for without a gather";
        }
      }
    };
    for (int pass = 0; pass < 12; ++pass) {
      const int a = static_cast<int>(rng() % layers), b = static_cast<int>(rng() % layers);
      const bool up = rng() % 2 == 0;
      for (int i = up ? std::min(a, b) : std::max(a, b);
           up ? i <= std::max(a, b) : i >= std::min(a, b); i += up ? 1 : -1) {
        std::vector<int> next;  // the pass's next layers, as many as asked ahead or left
        for (int n = i + (up ? 1 : -1);
             static_cast<int>(next.size()) < ahead && n >= std::min(a, b) && n <= std::max(a, b);
             n += up ? 1 : -1)
          next.push_back(n);
        apply(g.use(i, next));
        EXPECT_EQ(slot_holds[g.slot_of(i)], i)
            << "layer " << i << " read from a slot holding another";
        EXPECT_EQ(issued[i], waited[i])
            << "layer " << i << " read before its gather was waited for";
        if (rng() % 5 == 0) break;  // a pass that stops short: its prefetch left unused
      }
      if (rng() % 4 == 0) apply(g.forget());
    }
    apply(g.forget());
    for (int i = 0; i < layers; ++i)
      EXPECT_EQ(issued[i], waited[i]) << "layer " << i;
  }
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// The gradient ring's decisions, which both runners take from here: when it applies, a slot's
// size (a bucket's padded pieces, the largest), and none where it would hold as much as the
// whole buffer.
TEST(GradientRing, AppliesOnceAStepAndOnlyWhereItSavesMemory) {
  EXPECT_TRUE(gradient_ring_applies(1, 1, true, 2));
  EXPECT_FALSE(gradient_ring_applies(2, 1, true, 2));  // several stages a rank
  EXPECT_FALSE(gradient_ring_applies(1, 3, true, 2));  // accumulation adds into the buffer
  EXPECT_FALSE(gradient_ring_applies(1, 1, false, 2));
  EXPECT_FALSE(gradient_ring_applies(1, 1, true, 1));
  // 8 layers of 100 elements, a bucket each: slots of 100 (2 ranks x 50), pieces of 400.
  std::vector<ParamSpan> layers;
  for (size_t i = 0; i < 8; ++i)
    layers.push_back({i * 100, 100});
  const std::vector<Bucket> buckets = plan_buckets(layers, 1, 1);
  ASSERT_EQ(buckets.size(), 8u);
  EXPECT_EQ(gradient_ring_slot(buckets, 2, 1, 800), 100u);  // 3 x 100 + 400 < 800
  EXPECT_EQ(gradient_ring_slot(buckets, 2, 64, 800), 0u);   // pieces of 64: 3 x 128 + 512
  EXPECT_EQ(gradient_ring_slot(buckets, 2, 1, 700), 0u);    // as much as the buffer
  // --zero 3's map: a bucket a layer, last layers first.
  const std::vector<size_t> of = layer_buckets(buckets, layers);
  EXPECT_EQ(of, (std::vector<size_t>{7, 6, 5, 4, 3, 2, 1, 0}));
  EXPECT_THROW(layer_buckets(plan_buckets(layers, 1000, 1000), layers), Error);  // 3 a bucket
}

}  // namespace
}  // namespace ddp
