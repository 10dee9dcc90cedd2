// MLP shape parsing, flat layout and initialisation.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <optional>

#include "models/autotune_cache.h"
#include "models/mlp.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

TEST(MlpShape, LayoutIsWeightThenBiasPerLayer) {
  const MlpShape shape = parse_layers("4,3,2");
  ASSERT_EQ(shape.num_layers(), 2);
  EXPECT_EQ(shape.layer(0).weight_offset, 0u);
  EXPECT_EQ(shape.layer(0).bias_offset, 12u);
  EXPECT_EQ(shape.layer(1).weight_offset, 15u);
  EXPECT_EQ(shape.layer(1).bias_offset, 21u);
  EXPECT_EQ(shape.param_count(), 23u);
  EXPECT_EQ(shape.to_string(), "4,3,2");
  EXPECT_EQ(parse_layers("784,512,512,10").param_count(), 669706u);
}

TEST(MlpShape, MalformedListsAreRefusedWithTheFlag) {
  for (const char* bad : {"", "784", "784,,10", "784,x,10", "784,-5,10", "784,0,10", "7.5,2"}) {
    try {
      parse_layers(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--layers"), std::string::npos) << e.what();
    }
  }
}

// --weight-grad-stream auto: a second stream where every backward product has fewer 128 x 128
// output tiles than the GPU has SMs (the benchmarks' tiny model on an H200's 132), not where
// one fills it (medium, large).
TEST(MlpShape, BackwardProductsLeaveSmsIdleOnlyWhenSmall) {
  const MlpShape tiny({784, 512, 512, 10}), medium({1024, 4096, 4096, 4096, 4096, 1000});
  EXPECT_TRUE(backward_products_leave_sms_idle(tiny, 0, 3, 128, 132));
  EXPECT_FALSE(backward_products_leave_sms_idle(tiny, 0, 3, 128, 28));  // layer 0's 7 x 4 tiles
  EXPECT_TRUE(backward_products_leave_sms_idle(tiny, 0, 3, 128, 29));
  EXPECT_TRUE(backward_products_leave_sms_idle(tiny, 1, 3, 128, 17));     // from layer 1: 4 x 4
  EXPECT_FALSE(backward_products_leave_sms_idle(tiny, 0, 3, 4096, 132));  // 32 x 7 input tiles
  EXPECT_FALSE(backward_products_leave_sms_idle(medium, 0, 5, 1024, 132));
  EXPECT_FALSE(backward_products_leave_sms_idle(medium, 4, 5, 128, 132));  // 4096 x 1000: 256
}

TEST(MlpShape, FingerprintDependsOnShape) {
  EXPECT_EQ(parse_layers("4,3,2").fingerprint(), parse_layers("4,3,2").fingerprint());
  EXPECT_NE(parse_layers("4,3,2").fingerprint(), parse_layers("4,2,3").fingerprint());
}

TEST(InitParams, FollowsTorchLinearBoundsAndIsSeeded) {
  const MlpShape shape = parse_layers("100,25,10");
  std::vector<float> a(shape.param_count()), b(shape.param_count()), c(shape.param_count());
  init_params(shape, 42, a.data());
  init_params(shape, 42, b.data());
  init_params(shape, 43, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (int i = 0; i < shape.num_layers(); ++i) {
    const LayerSlice& layer = shape.layer(i);
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    float max_abs = 0;
    for (size_t k = 0; k < layer.count(); ++k) {
      const float v = a[layer.weight_offset + k];
      EXPECT_LE(std::fabs(v), bound);
      max_abs = std::max(max_abs, std::fabs(v));
    }
    EXPECT_GT(max_abs, 0.9f * bound);  // spans the range, not a constant
  }
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

TEST(AutotuneCache, KeepsEveryKeyAndSurvivesABrokenFile) {
  TempDir dir;
  const std::string path = autotune_cache_path(dir.file("cache"));
  EXPECT_EQ(path, dir.file("cache") + "/autotune.json");
  EXPECT_EQ(autotune_cache_path(""), "");
  EXPECT_FALSE(load_autotune(path, "a").has_value());
  EXPECT_EQ(save_autotune(path, "a", {1, 0, 2}), "");  // makes the folder
  EXPECT_EQ(save_autotune(path, "b", {3}), "");
  EXPECT_EQ(load_autotune(path, "a"), (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(load_autotune(path, "b"), (std::vector<int>{3}));
  EXPECT_EQ(save_autotune(path, "a", {4}), "");  // replaced, b kept
  EXPECT_EQ(load_autotune(path, "a"), (std::vector<int>{4}));
  EXPECT_EQ(load_autotune(path, "b"), (std::vector<int>{3}));
  std::ofstream(path) << "{ not json";
  EXPECT_FALSE(load_autotune(path, "a").has_value());
  EXPECT_EQ(save_autotune(path, "c", {5}), "");  // a broken file is replaced, not appended to
  EXPECT_EQ(load_autotune(path, "c"), (std::vector<int>{5}));
}

TEST(AutotuneCache, APathThatCannotBeAFolderSaysWhyAndNoCacheKeepsNothing) {
  TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  const std::string path = autotune_cache_path(dir.file("file") + "/sub");
  EXPECT_NE(save_autotune(path, "a", {1}).find(dir.file("file")), std::string::npos);
  EXPECT_FALSE(load_autotune(path, "a").has_value());
  EXPECT_NE(save_autotune("", "a", {1}).find("DDP_CACHE_DIR"), std::string::npos);
  EXPECT_FALSE(load_autotune("", "a").has_value());
}

}  // namespace
}  // namespace ddp
