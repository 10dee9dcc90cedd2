// Optimizers against steps computed by hand from torch.optim's update rules, and the
// learning-rate schedule. The margins are float's rounding of these few operations against
// the decimal (or double) values written here: no BLAS is involved, so they hold alike on any
// x86-64 CPU.
#include <gtest/gtest.h>

#include <cmath>

#include "models/optimizer.h"

namespace ddp {
namespace {

TEST(Sgd, MomentumAndWeightDecayMatchHandComputedSteps) {
  OptimizerConfig config;
  config.momentum = 0.9f;
  config.weight_decay = 0.1f;
  auto sgd = make_optimizer(config, 1);
  float p = 1.0f;
  const float g = 0.5f;
  sgd->step(&p, &g, 1, 0.1f);  // g' = 0.5 + 0.1*1 = 0.6; buf = 0.6; p = 1 - 0.06
  EXPECT_NEAR(p, 0.94f, 1e-7);
  sgd->step(&p, &g, 1, 0.1f);  // g' = 0.5 + 0.094 = 0.594; buf = 0.54 + 0.594; p -= 0.1134
  EXPECT_NEAR(p, 0.8266f, 1e-6);
  EXPECT_NEAR((*sgd->state()[0].second)[0], 1.134f, 1e-6);
  EXPECT_EQ(sgd->steps(), 2);
}

TEST(Sgd, WithoutMomentumIsPlainGradientDescent) {
  OptimizerConfig config;
  config.momentum = 0.0f;
  auto sgd = make_optimizer(config, 2);
  float p[2] = {1.0f, -2.0f};
  const float g[2] = {0.25f, -1.0f};
  sgd->step(p, g, 2, 0.5f);
  EXPECT_FLOAT_EQ(p[0], 0.875f);
  EXPECT_FLOAT_EQ(p[1], -1.5f);
  EXPECT_TRUE(sgd->state().empty());
}

TEST(AdamW, MatchesHandComputedSteps) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  config.weight_decay = 0.01f;
  auto adamw = make_optimizer(config, 1);
  float p = 1.0f;
  float g = 0.5f;
  // Step 1: p = 0.999; m = 0.05; v = 0.00025; step size 0.1/0.1 = 1;
  // denom = sqrt(0.00025)/sqrt(0.001) + 1e-8 = 0.5; p = 0.999 - 0.1.
  adamw->step(&p, &g, 1, 0.1f);
  EXPECT_NEAR(p, 0.899f, 1e-6);
  // Step 2 with g = -0.5: p = 0.899*(1-0.001); m = 0.045 - 0.05 = -0.005;
  // v = 0.00024975 + 0.00025 = 0.00049975; bc1 = 0.19, bc2 = 0.001999.
  g = -0.5f;
  adamw->step(&p, &g, 1, 0.1f);
  const double m = -0.005, v = 0.00049975;
  const double denom = std::sqrt(v) / std::sqrt(1 - 0.999 * 0.999) + 1e-8;
  const double want = 0.899 * 0.999 - 0.1 / (1 - 0.81) * m / denom;
  EXPECT_NEAR(p, want, 1e-5);
}

// --zero's update of a rank's pieces: step_pieces over pieces of the buffer (their state
// packed one after the other, as a shard) is bitwise step() over the whole, for three steps.
TEST(OptimizerPieces, AreBitwiseTheWholeBufferStep) {
  for (const OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    OptimizerConfig config;
    config.kind = kind;
    config.weight_decay = 0.01f;
    const size_t n = 10;
    std::vector<float> whole(n), pieces(n), grads(n);
    for (size_t i = 0; i < n; ++i) {
      whole[i] = pieces[i] = 0.1f * static_cast<float>(i) - 0.3f;
      grads[i] = 0.05f * static_cast<float>(i * i % 7) - 0.1f;
    }
    auto all = make_optimizer(config, n);
    auto part = make_optimizer(config, n);
    // Pieces [6, 10) and [0, 3), the state of the first at 0, of the second after it; [3, 6)
    // is another rank's and stays.
    const std::vector<OptimizerPiece> mine = {{6, grads.data() + 6, 0, 4}, {0, grads.data(), 4, 3}};
    for (int step = 0; step < 3; ++step) {
      all->step(whole.data(), grads.data(), n, 0.1f);
      part->step_pieces(pieces.data(), mine, 0.1f);
    }
    for (size_t i = 0; i < n; ++i) {
      if (i >= 3 && i < 6)
        EXPECT_EQ(pieces[i], 0.1f * static_cast<float>(i) - 0.3f) << i;
      else
        EXPECT_EQ(pieces[i], whole[i]) << optimizer_name(kind) << " element " << i;
    }
    EXPECT_EQ(part->steps(), 3);
  }
}

TEST(LrSchedule, ConstantCosineAndWarmup) {
  EXPECT_FLOAT_EQ(lr_at(0, 100, 0.1f, LrSchedule::kConstant, 0), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(99, 100, 0.1f, LrSchedule::kConstant, 0), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(0, 100, 0.1f, LrSchedule::kCosine, 0), 0.1f);
  EXPECT_NEAR(lr_at(50, 100, 0.1f, LrSchedule::kCosine, 0), 0.05f, 1e-7);
  EXPECT_NEAR(lr_at(100, 100, 0.1f, LrSchedule::kCosine, 0), 0.0f, 1e-7);
  EXPECT_FLOAT_EQ(lr_at(0, 100, 0.1f, LrSchedule::kCosine, 10), 0.01f);
  EXPECT_FLOAT_EQ(lr_at(9, 100, 0.1f, LrSchedule::kCosine, 10), 0.1f);
  EXPECT_FLOAT_EQ(lr_at(10, 100, 0.1f, LrSchedule::kCosine, 10), 0.1f);
  EXPECT_NEAR(lr_at(55, 100, 0.1f, LrSchedule::kCosine, 10), 0.05f, 1e-7);
}

}  // namespace
}  // namespace ddp
