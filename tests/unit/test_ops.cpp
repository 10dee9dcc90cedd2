// CPU reference ops: matrix products against naive loops, gradients against finite
// differences of the loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "models/cpu_ops.h"
#include "models/gemm.h"
#include "models/mlp_cpu.h"
#include "models/rng.h"
#include "runtime/error.h"

namespace ddp {
namespace {

std::vector<float> random_vector(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v)
    x = scale * rng.uniform(-1.0f, 1.0f);
  return v;
}

TEST(Gemm, MatchesNaiveLoopsForEveryTransposition) {
  const int m = 7, n = 5, k = 9;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const auto a = random_vector(m * k, 1);
      const auto b = random_vector(k * n, 2);
      auto c = random_vector(m * n, 3);
      const auto c0 = c;
      const int lda = ta ? m : k;
      const int ldb = tb ? k : n;
      gemm_cpu(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, c.data(), n);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double want = 0;
          for (int p = 0; p < k; ++p)
            want += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
          want = 0.5 * want + 2.0 * c0[i * n + j];
          // Not bitwise: OpenBLAS adds in float, in its kernel's order (chosen per CPU), the
          // loop in double. Whatever the order, 9 products of magnitude <= 1 sum with at most
          // 9 roundings of <= 9 x 2^-24 each (<= 5e-6), halved, plus 2c's one rounding: under
          // 1e-5 on any CPU.
          EXPECT_NEAR(c[i * n + j], want, 1e-5) << "ta=" << ta << " tb=" << tb;
        }
      }
    }
  }
}

TEST(LinearForward, AddsBiasAndAppliesRelu) {
  const float x[2 * 3] = {1, 2, 3, -1, 0, 1};
  const float w[2 * 3] = {1, 0, 0, 0, 1, -1};  // [out=2, in=3]
  const float b[2] = {0.5f, -0.5f};
  float y[4];
  linear_forward_cpu(x, w, b, y, 2, 3, 2, false);
  EXPECT_FLOAT_EQ(y[0], 1.5f);
  EXPECT_FLOAT_EQ(y[1], -1.5f);
  EXPECT_FLOAT_EQ(y[2], -0.5f);
  EXPECT_FLOAT_EQ(y[3], -1.5f);
  linear_forward_cpu(x, w, b, y, 2, 3, 2, true);
  EXPECT_FLOAT_EQ(y[0], 1.5f);
  EXPECT_FLOAT_EQ(y[1], 0.0f);
  EXPECT_FLOAT_EQ(y[2], 0.0f);
}

TEST(SoftmaxXent, LossAndGradientInClosedForm) {
  // Two equal logits: loss log 2, softmax 1/2 each.
  const float logits[2] = {3.0f, 3.0f};
  const int32_t label = 1;
  float grad[2];
  const LossSum sum = softmax_xent_cpu(logits, &label, 1, 2, 1.0f, grad);
  EXPECT_NEAR(sum.loss, std::log(2.0), 1e-6);
  EXPECT_NEAR(grad[0], 0.5f, 1e-6);
  EXPECT_NEAR(grad[1], -0.5f, 1e-6);
}

TEST(SoftmaxXent, StableForLargeLogits) {
  const float logits[3] = {1000.0f, 0.0f, -1000.0f};
  const int32_t label = 0;
  float grad[3];
  const LossSum sum = softmax_xent_cpu(logits, &label, 1, 3, 1.0f, grad);
  EXPECT_NEAR(sum.loss, 0.0, 1e-6);
  EXPECT_EQ(sum.correct, 1);
  for (float g : grad)
    EXPECT_TRUE(std::isfinite(g));
}

// Mean loss of the model on (x, y), in double for the finite differences; `pattern` gets
// which hidden units are active, so that a difference across a ReLU kink can be skipped.
double model_loss(CpuMlp& model, const std::vector<float>& x, const std::vector<int32_t>& y,
                  int batch, std::vector<bool>* pattern) {
  const float* logits = model.forward(x.data(), batch);
  pattern->clear();
  for (int i = 0; i + 1 < model.shape().num_layers(); ++i)
    for (int k = 0; k < batch * model.shape().layer(i).out; ++k)
      pattern->push_back(model.activation(i)[k] > 0.0f);
  return softmax_xent_cpu(logits, y.data(), batch, model.shape().num_classes(), 0.0f, nullptr)
             .loss /
         batch;
}

// Checks every parameter's analytic gradient against a central difference.
void check_gradients(const std::vector<int>& widths, int batch, uint64_t seed) {
  CpuMlp model(MlpShape(widths), batch);
  init_params(model.shape(), seed, model.params());
  const auto x = random_vector(static_cast<size_t>(batch) * widths.front(), seed + 1);
  std::vector<int32_t> y(batch);
  Rng rng(seed + 2);
  for (int32_t& label : y)
    label = static_cast<int32_t>(rng.below(widths.back()));
  model.forward(x.data(), batch);
  model.backward(y.data(), batch, 1.0f / batch);
  const std::vector<float> analytic(model.grads(), model.grads() + model.shape().param_count());
  const float eps = 1e-3f;
  std::vector<bool> base, up_pattern, down_pattern;
  model_loss(model, x, y, batch, &base);
  size_t checked = 0;
  for (size_t i = 0; i < model.shape().param_count(); ++i) {
    float* p = model.params() + i;
    const float saved = *p;
    *p = saved + eps;
    const double up = model_loss(model, x, y, batch, &up_pattern);
    *p = saved - eps;
    const double down = model_loss(model, x, y, batch, &down_pattern);
    *p = saved;
    if (up_pattern != base || down_pattern != base) continue;  // crossed a ReLU kink
    const double numeric = (up - down) / (2.0 * eps);
    EXPECT_NEAR(analytic[i], numeric, 1e-3 + 1e-2 * std::fabs(numeric)) << "parameter " << i;
    ++checked;
  }
  EXPECT_GT(checked, model.shape().param_count() * 9 / 10);
}

TEST(MlpGradients, OneLayerMatchesFiniteDifferences) {
  check_gradients({5, 3}, 4, 11);
}
TEST(MlpGradients, ThreeLayersMatchFiniteDifferences) {
  check_gradients({6, 7, 5, 4}, 3, 12);
}
TEST(MlpGradients, BatchOfOneMatchesFiniteDifferences) {
  check_gradients({3, 9, 2}, 1, 13);
}

TEST(MlpGradients, AccumulateAddsToGradients) {
  CpuMlp model(MlpShape({4, 6, 3}), 2);
  init_params(model.shape(), 5, model.params());
  const auto x = random_vector(8, 6);
  const std::vector<int32_t> y = {0, 2};
  model.forward(x.data(), 2);
  model.backward(y.data(), 2, 0.5f);
  const std::vector<float> once(model.grads(), model.grads() + model.shape().param_count());
  model.forward(x.data(), 2);
  model.backward(y.data(), 2, 0.5f, /*accumulate=*/true);
  for (size_t i = 0; i < once.size(); ++i)
    EXPECT_FLOAT_EQ(model.grads()[i], 2 * once[i]);
}

// Two stages chained (activations forward, the input gradient back) hold exactly the whole
// model's gradients, and a stage keeps micro-batches apart in its slots: two forwarded
// before either is backwarded, in either order, accumulate to the gradient of both.
TEST(CpuStage, ChainedStagesGiveTheWholeModelsGradientsThroughSlots) {
  const MlpShape shape({5, 8, 7, 6, 3});
  const int batch = 4;
  std::vector<float> whole(shape.param_count());
  init_params(shape, 21, whole.data());
  const auto x = random_vector(2 * batch * 5, 22);
  const std::vector<int32_t> y = {0, 1, 2, 0, 2, 2, 1, 0};
  CpuMlp model(shape, batch);
  std::copy(whole.begin(), whole.end(), model.params());
  for (int mb = 0; mb < 2; ++mb) {
    model.forward(&x[mb * batch * 5], batch);
    model.backward(&y[mb * batch], batch, 0.125f, mb > 0);
  }
  CpuStage front(shape, 0, 2, batch, 2);
  CpuStage back(shape, 2, 4, batch, 2);
  EXPECT_EQ(front.param_count() + back.param_count(), shape.param_count());
  EXPECT_EQ(back.param_offset(), front.param_count());
  std::copy_n(whole.begin(), front.param_count(), front.params());
  std::copy_n(whole.begin() + back.param_offset(), back.param_count(), back.params());
  std::vector<float> hidden[2], dlogits(batch * 3);
  for (int mb = 0; mb < 2; ++mb) {
    const float* h = front.forward(&x[mb * batch * 5], batch, mb);
    hidden[mb].assign(h, h + batch * 7);
    back.forward(hidden[mb].data(), batch, mb);
  }
  int done = 0;
  for (int mb : {1, 0}) {  // the later micro-batch first: slots must not mix
    softmax_xent_cpu(back.activation(mb, 3), &y[mb * batch], batch, 3, 0.125f, dlogits.data());
    const float* dh = back.backward(dlogits.data(), batch, mb, done > 0);
    ASSERT_NE(dh, nullptr);
    std::vector<float> grad_hidden(dh, dh + batch * 7);
    EXPECT_EQ(front.backward(grad_hidden.data(), batch, mb, done > 0), nullptr);
    ++done;
  }
  // Not bitwise: the stages accumulate micro-batch 1 then 0 into their gradients with the
  // product's beta = 1 (the sum taken inside the kernel, in its order), the whole model 0
  // then 1; gradients here are below 1, so the orders differ by a few float roundings
  // (~1e-7), a tenth of the margin on any CPU.
  for (size_t i = 0; i < front.param_count(); ++i)
    EXPECT_NEAR(front.grads()[i], model.grads()[i], 1e-6) << "parameter " << i;
  for (size_t i = 0; i < back.param_count(); ++i)
    EXPECT_NEAR(back.grads()[i], model.grads()[back.param_offset() + i], 1e-6)
        << "parameter " << back.param_offset() + i;
}

// backward() split into its input half and its weight half (the zero-bubble schedules) gives
// bitwise backward()'s input gradient and weight gradients, with the halves of several
// micro-batches run apart and out of order (B of both, then W of the later one first), on a
// stage in the middle of a model, on the first and on the last.
TEST(CpuStage, InputAndWeightHalvesAreBitwiseTheWholeBackward) {
  const MlpShape shape({5, 8, 7, 6, 3});
  const int batch = 4;
  std::vector<float> whole(shape.param_count());
  init_params(shape, 31, whole.data());
  for (const auto& [first, end] : {std::pair{1, 3}, std::pair{0, 2}, std::pair{2, 4}}) {
    CpuStage plain(shape, first, end, batch, 2), split(shape, first, end, batch, 2);
    for (CpuStage* s : {&plain, &split})
      std::copy_n(whole.begin() + s->param_offset(), s->param_count(), s->params());
    const int in = shape.widths()[first], out = shape.widths()[end];
    const auto x = random_vector(2 * batch * in, 32 + first);
    const auto dy = random_vector(2 * batch * out, 33 + first);
    std::vector<float> plain_dx[2], split_dx[2];
    for (int mb = 0; mb < 2; ++mb) {
      plain.forward(&x[mb * batch * in], batch, mb);
      split.forward(&x[mb * batch * in], batch, mb);
    }
    for (int mb = 0; mb < 2; ++mb) {
      std::vector<float> g(dy.begin() + mb * batch * out, dy.begin() + (mb + 1) * batch * out);
      const float* dx = plain.backward(g.data(), batch, mb, mb > 0);
      if (dx != nullptr) plain_dx[mb].assign(dx, dx + batch * shape.widths()[first]);
      std::vector<float> h(dy.begin() + mb * batch * out, dy.begin() + (mb + 1) * batch * out);
      const float* sx = split.backward_input(h.data(), batch, mb);
      EXPECT_EQ(h, std::vector<float>(dy.begin() + mb * batch * out,
                                      dy.begin() + (mb + 1) * batch * out));  // dy only read
      EXPECT_EQ(sx == nullptr, first == 0);
      if (sx != nullptr) split_dx[mb].assign(sx, sx + batch * shape.widths()[first]);
    }
    std::vector<int> done;
    for (int mb : {1, 0})
      split.backward_weight(mb, mb == 0, [&](int layer) { done.push_back(layer); });
    EXPECT_EQ(done.size(), 2u * (end - first));
    EXPECT_EQ(done[0], end - first - 1);  // last layer first, as backward()
    for (int mb = 0; mb < 2; ++mb)
      EXPECT_EQ(split_dx[mb], plain_dx[mb]) << "input gradient of micro-batch " << mb;
    // Accumulation in another order adds the same two terms: equal to rounding (and bitwise
    // when the order is kept, which is what the schedules do: see the next block).
    for (size_t i = 0; i < plain.param_count(); ++i)
      EXPECT_NEAR(split.grads()[i], plain.grads()[i], 1e-6f * (1 + std::abs(plain.grads()[i])));
    for (int mb = 0; mb < 2; ++mb) {
      split.forward(&x[mb * batch * in], batch, mb);
      std::vector<float> h(dy.begin() + mb * batch * out, dy.begin() + (mb + 1) * batch * out);
      split.backward_input(h.data(), batch, mb);
      split.backward_weight(mb, mb > 0);
    }
    for (size_t i = 0; i < plain.param_count(); ++i)
      ASSERT_EQ(split.grads()[i], plain.grads()[i]) << "layers " << first << "-" << end << " " << i;
  }
  CpuStage fresh(shape, 0, 2, batch);
  EXPECT_THROW(fresh.backward_weight(0), Error);  // no input half before it
}

}  // namespace
}  // namespace ddp
