// Every GPU op against the CPU reference, on fresh random inputs of awkward sizes, with
// outputs poisoned first; K training steps against the CPU; graph replay against eager
// launches. Skips (with the reason) where no GPU is usable.
//
// Tolerances (norm-wise relative error ||gpu - cpu|| / ||cpu||): fp32 1e-5; tf32 5e-3 for
// outputs and 3e-2 for gradients (10-bit mantissa products; a pre-activation that rounds to
// the other side of zero flips a ReLU mask, seen at 2e-2 on 784-512-512-10 on an H200);
// bf16 6e-2 (8-bit mantissa operands and activations).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "engine/loop/sampler.h"
#include "models/batch_feeder.h"
#include "models/cpu_ops.h"
#include "models/cuda_kernels.h"
#include "models/fused_mlp.h"
#include "models/mlp_cpu.h"
#include "models/mlp_stage_cuda.h"
#include "models/optimizer.h"
#include "models/rng.h"
#include "runtime/step_graph.h"
#include "tests/support/gpu_support.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;  // an unwritten (poisoned) element
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

double tolerance(Precision p) {
  return p == Precision::kFp32 ? 1e-5 : p == Precision::kTf32 ? 5e-3 : 6e-2;
}
double gradient_tolerance(Precision p) {
  return p == Precision::kTf32 ? 3e-2 : tolerance(p);
}

// Each layer's gradients within `tol` of the CPU's, so that a small layer's error is not hidden
// by a large one: its biases' (`bias_only`) or all its parameters'.
void expect_each_layer(const MlpShape& shape, const std::vector<float>& got,
                       const std::vector<float>& want, double tol, bool bias_only) {
  for (int i = 0; i < shape.num_layers(); ++i) {
    const LayerSlice& l = shape.layer(i);
    const size_t from = bias_only ? l.bias_offset : l.weight_offset, to = l.bias_offset + l.out;
    const std::vector<float> g(got.begin() + from, got.begin() + to);
    const std::vector<float> w(want.begin() + from, want.begin() + to);
    EXPECT_LE(relative_error(g, w), tol)
        << (bias_only ? "bias " : "") << "gradients of layer " << i;
  }
}

// Rows idx[0, batch) of the training split into x[batch, dim] and y[batch].
void gather_rows(const Dataset& data, const int32_t* idx, int batch, int dim, float* x,
                 int32_t* y) {
  for (int i = 0; i < batch; ++i) {
    std::copy_n(&data.train.x[static_cast<size_t>(idx[i]) * dim], dim,
                &x[static_cast<size_t>(i) * dim]);
    y[i] = data.train.y[idx[i]];
  }
}

std::vector<float> random_vector(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v)
    x = rng.uniform(-1.0f, 1.0f);
  return v;
}

struct Case {
  std::vector<int> widths;
  int batch;
  Precision precision;
  bool fused;
};

void PrintTo(const Case& c, std::ostream* os) {
  for (int w : c.widths)
    *os << w << ",";
  *os << " batch " << c.batch << " " << precision_name(c.precision)
      << (c.fused ? " fused" : " plain");
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name;
  for (int w : info.param.widths)
    name += std::to_string(w) + "_";
  return name + "b" + std::to_string(info.param.batch) + "_" +
         precision_name(info.param.precision) + (info.param.fused ? "_fused" : "_plain");
}

class CudaMlpOps : public ::testing::TestWithParam<Case> {};

// Forward logits and every parameter gradient against CpuMlp.
TEST_P(CudaMlpOps, ForwardAndBackwardMatchTheCpu) {
  REQUIRE_GPU();
  const Case& c = GetParam();
  const MlpShape shape(c.widths);
  const uint64_t seed = 1000 + c.batch * 7 + c.widths.size();
  std::vector<float> params(shape.param_count());
  init_params(shape, seed, params.data());
  const auto x = random_vector(static_cast<size_t>(c.batch) * shape.input_width(), seed + 1);
  std::vector<int32_t> y(c.batch);
  Rng rng(seed + 2);
  for (int32_t& label : y)
    label = static_cast<int32_t>(rng.below(shape.num_classes()));

  CpuMlp cpu(shape, c.batch);
  std::copy(params.begin(), params.end(), cpu.params());
  const float* cpu_logits = cpu.forward(x.data(), c.batch);
  const std::vector<float> want_logits(cpu_logits, cpu_logits + c.batch * shape.num_classes());
  cpu.backward(y.data(), c.batch, 1.0f / c.batch);
  const std::vector<float> want_grads(cpu.grads(), cpu.grads() + shape.param_count());

  // The whole model: stage 0 of 1.
  CudaStageOptions options;
  options.precision = c.precision;
  options.fused_epilogues = c.fused;
  CudaStage gpu(shape, 0, shape.num_layers(), c.batch, 1, OptimizerConfig{}, options);
  gpu.set_params(params.data());
  gpu.fill_work_buffers(std::numeric_limits<float>::quiet_NaN());
  DeviceBuffer<float> dx(x.size(), MemoryCategory::kOther);
  DeviceBuffer<int32_t> dy(y.size(), MemoryCategory::kOther);
  copy_to_device(dx.data(), x.data(), dx.bytes());
  copy_to_device(dy.data(), y.data(), dy.bytes());
  gpu.set_input(dx.data(), c.batch, 0);
  gpu.forward(0, c.batch);
  ASSERT_EQ(cudaStreamSynchronize(gpu.stream()), cudaSuccess);
  std::vector<float> logits(static_cast<size_t>(c.batch) * shape.num_classes());
  ASSERT_EQ(cudaMemcpy(logits.data(), gpu.output(0), logits.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  gpu.loss(0, c.batch, 1.0f / c.batch, dy.data());
  gpu.backward(0, c.batch, false);
  std::vector<float> grads(shape.param_count());
  gpu.get_grads(grads.data());

  EXPECT_LE(relative_error(logits, want_logits), tolerance(c.precision)) << gpu.epilogue_summary();
  EXPECT_LE(relative_error(grads, want_grads), gradient_tolerance(c.precision))
      << gpu.epilogue_summary();
  expect_each_layer(shape, grads, want_grads, gradient_tolerance(c.precision), true);
}

INSTANTIATE_TEST_SUITE_P(AwkwardSizes, CudaMlpOps,
                         ::testing::Values(Case{{1, 1}, 1, Precision::kFp32, true},
                                           Case{{5, 3}, 7, Precision::kFp32, true},
                                           Case{{17, 33, 7}, 13, Precision::kFp32, true},
                                           Case{{17, 33, 7}, 13, Precision::kFp32, false},
                                           Case{{31, 129, 65, 10}, 129, Precision::kFp32, true},
                                           Case{{784, 512, 512, 10}, 128, Precision::kFp32, true},
                                           Case{{784, 512, 512, 10}, 128, Precision::kFp32, false},
                                           Case{{31, 129, 65, 10}, 129, Precision::kTf32, true},
                                           Case{{784, 512, 512, 10}, 128, Precision::kTf32, true},
                                           Case{{32, 64, 16}, 24, Precision::kBf16, true},
                                           Case{{31, 129, 65, 10}, 129, Precision::kBf16, true},
                                           Case{{784, 512, 512, 10}, 128, Precision::kBf16, true},
                                           Case{{784, 512, 512, 10}, 128, Precision::kBf16, false}),
                         case_name);

// Initial weights made on the GPU are bitwise the host's (the counter-based generator in
// double, rounded once), also in a layer of more than one block's grid and in bf16.
TEST(CudaMlpInit, DeviceInitialisationIsBitwiseTheHosts) {
  REQUIRE_GPU();
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const MlpShape shape({300, 1100, 7});
    std::vector<float> host(shape.param_count()), device(shape.param_count());
    init_params(shape, 42, host.data());
    CudaStageOptions options;
    options.precision = precision;
    CudaStage gpu(shape, 0, shape.num_layers(), 8, 1, OptimizerConfig{}, options);
    gpu.init_params_on_device(42);
    gpu.get_params(device.data());
    EXPECT_EQ(device, host);
    // A stage of the last layer: its slice of the whole model's values.
    CudaStage last(shape, 1, 2, 8, 1, OptimizerConfig{}, options);
    last.init_params_on_device(42);
    std::vector<float> slice(last.param_count());
    last.get_params(slice.data());
    EXPECT_TRUE(std::equal(slice.begin(), slice.end(), host.begin() + last.param_offset()));
  }
}

// backward_input then backward_weight (zero-bubble schedules) give bitwise the gradients
// of backward() whole, for a middle stage with two micro-batches in flight, each half of one
// slot run between the other slot's, and with accumulation.
TEST(CudaStageSplit, InputAndWeightHalvesAreBitwiseTheWholeBackward) {
  REQUIRE_GPU();
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const MlpShape shape({20, 48, 40, 24, 7});
    const int batch = 9;
    CudaStageOptions options;
    options.precision = precision;
    CudaStage whole(shape, 1, 3, batch, 2, OptimizerConfig{}, options);
    options.split_backward = true;
    CudaStage split(shape, 1, 3, batch, 2, OptimizerConfig{}, options);
    std::vector<float> params(shape.param_count());
    init_params(shape, 77, params.data());
    const float* mine = params.data() + whole.param_offset();
    whole.set_params(mine);
    split.set_params(mine);
    const size_t in = static_cast<size_t>(batch) * whole.in_width();
    const size_t out = static_cast<size_t>(batch) * whole.out_width();
    DeviceBuffer<float> x(2 * in, MemoryCategory::kOther), dy(2 * out, MemoryCategory::kOther);
    const auto hx = random_vector(2 * in, 78), hdy = random_vector(2 * out, 79);
    copy_to_device(x.data(), hx.data(), x.bytes());
    copy_to_device(dy.data(), hdy.data(), dy.bytes());
    auto read = [](const CudaStage& stage, const void* device, size_t bytes) {
      EXPECT_EQ(cudaStreamSynchronize(stage.stream()), cudaSuccess);
      std::vector<char> host(bytes);
      EXPECT_EQ(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      return host;
    };
    const size_t act = precision == Precision::kBf16 ? 2 : 4;
    std::vector<std::vector<char>> inputs[2];
    for (CudaStage* stage : {&whole, &split}) {
      for (int slot = 0; slot < 2; ++slot) {
        stage->set_input(x.data() + slot * in, batch, slot);
        stage->forward(slot, batch);
        // The received gradient, as the next stage sends it (in the activation type).
        if (precision == Precision::kBf16)
          launch_to_bf16(dy.data() + slot * out, stage->grad_output(slot), out, stage->stream());
        else
          ASSERT_EQ(cudaMemcpyAsync(stage->grad_output(slot), dy.data() + slot * out, out * 4,
                                    cudaMemcpyDeviceToDevice, stage->stream()),
                    cudaSuccess);
      }
    }
    whole.backward(0, batch, false);
    inputs[0].push_back(read(whole, whole.grad_input(0), in * act));
    whole.backward(1, batch, true);
    inputs[0].push_back(read(whole, whole.grad_input(1), in * act));
    split.backward_input(0, batch);
    inputs[1].push_back(read(split, split.grad_input(0), in * act));
    split.backward_input(1, batch);
    inputs[1].push_back(read(split, split.grad_input(1), in * act));
    split.backward_weight(0, batch, false);
    split.backward_weight(1, batch, true);
    std::vector<float> want(whole.param_count()), got(split.param_count());
    whole.get_grads(want.data());
    split.get_grads(got.data());
    EXPECT_EQ(got, want) << precision_name(precision);
    EXPECT_EQ(inputs[1], inputs[0]) << precision_name(precision);
    EXPECT_NE(want, std::vector<float>(want.size(), 0.0f));
  }
}

TEST(CudaKernels, SoftmaxCrossEntropyMatchesTheCpu) {
  REQUIRE_GPU();
  for (int classes : {1, 3, 10, 1000}) {
    const int batch = 9;
    auto logits = random_vector(static_cast<size_t>(batch) * classes, classes);
    for (float& v : logits)
      v *= 20.0f;  // wide range: stability matters
    std::vector<int32_t> labels(batch);
    for (int i = 0; i < batch; ++i)
      labels[i] = (i * 7) % classes;
    std::vector<float> want(logits.size());
    const LossSum cpu =
        softmax_xent_cpu(logits.data(), labels.data(), batch, classes, 0.5f, want.data());

    DeviceBuffer<float> d_logits(logits.size(), MemoryCategory::kOther),
        d_grad(logits.size(), MemoryCategory::kOther);
    DeviceBuffer<int32_t> d_labels(batch, MemoryCategory::kOther);
    DeviceBuffer<double> d_loss(1, MemoryCategory::kOther);
    DeviceBuffer<int> d_correct(1, MemoryCategory::kOther);
    cudaMemcpy(d_logits.data(), logits.data(), d_logits.bytes(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_labels.data(), labels.data(), d_labels.bytes(), cudaMemcpyHostToDevice);
    cudaMemset(d_loss.data(), 0, 8);
    cudaMemset(d_correct.data(), 0, 4);
    launch_fill(d_grad.data(), d_grad.count(), false, NAN, nullptr);
    launch_softmax_xent(d_logits.data(), d_labels.data(), batch, classes, 0.5f, d_grad.data(),
                        false, d_loss.data(), d_correct.data(), nullptr);
    std::vector<float> got(logits.size());
    double loss = 0;
    int correct = 0;
    ASSERT_EQ(cudaMemcpy(got.data(), d_grad.data(), d_grad.bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    cudaMemcpy(&loss, d_loss.data(), 8, cudaMemcpyDeviceToHost);
    cudaMemcpy(&correct, d_correct.data(), 4, cudaMemcpyDeviceToHost);
    EXPECT_LE(relative_error(got, want), 1e-5) << classes << " classes";
    EXPECT_NEAR(loss, cpu.loss, 1e-5 * std::max(1.0, std::fabs(cpu.loss))) << classes << " classes";
    EXPECT_EQ(correct, cpu.correct) << classes << " classes";
  }
}

// The batch gather: the rows `indices` names at the counter's step, bitwise (bf16: each value
// rounded to nearest even), on the vector path (rows of a multiple of 4 values, aligned) and
// the scalar one (63 values, or an output one value off alignment).
TEST(CudaKernels, GatherCopiesTheIndexedRowsBitwise) {
  REQUIRE_GPU();
  const int rows = 40, batch = 6, stride = 7, step = 2;
  for (int dim : {64, 63, 8192})
    for (bool bf16 : {false, true})
      for (int skew : {0, 1}) {
        const auto x = random_vector(static_cast<size_t>(rows) * dim, dim);
        std::vector<int32_t> y(rows), indices(static_cast<size_t>(stride) * 3);
        for (int i = 0; i < rows; ++i)
          y[i] = 100 + i;
        for (size_t i = 0; i < indices.size(); ++i)
          indices[i] = static_cast<int32_t>((i * 17 + 5) % rows);
        DeviceBuffer<float> d_x(x.size(), MemoryCategory::kOther);
        DeviceBuffer<int32_t> d_y(rows, MemoryCategory::kOther),
            d_indices(indices.size(), MemoryCategory::kOther),
            d_labels(batch, MemoryCategory::kOther);
        DeviceBuffer<int> counter(1, MemoryCategory::kOther);
        DeviceBuffer<float> out(static_cast<size_t>(batch) * dim + 1, MemoryCategory::kOther);
        copy_to_device(d_x.data(), x.data(), d_x.bytes());
        copy_to_device(d_y.data(), y.data(), d_y.bytes());
        copy_to_device(d_indices.data(), indices.data(), d_indices.bytes());
        copy_to_device(counter.data(), &step, sizeof(int));
        launch_fill(out.data(), out.count(), false, NAN, nullptr);
        // An output `skew` values in: off the 16-byte alignment the vector path needs.
        char* x_out = reinterpret_cast<char*>(out.data()) + skew * (bf16 ? 2 : 4);
        launch_gather_batch(d_x.data(), d_y.data(), dim, d_indices.data(), counter.data(), stride,
                            batch, x_out, bf16, d_labels.data(), nullptr);
        std::vector<char> got(out.bytes());
        std::vector<int32_t> labels(batch);
        ASSERT_EQ(cudaMemcpy(got.data(), out.data(), out.bytes(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        ASSERT_EQ(
            cudaMemcpy(labels.data(), d_labels.data(), d_labels.bytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
        const std::string where = "dim " + std::to_string(dim) + (bf16 ? " bf16" : " fp32") +
                                  " skew " + std::to_string(skew);
        for (int r = 0; r < batch; ++r) {
          const int src = indices[static_cast<size_t>(step) * stride + r];
          ASSERT_EQ(labels[r], y[src]) << where << " row " << r;
          for (int d = 0; d < dim; ++d) {
            const float want = x[static_cast<size_t>(src) * dim + d];
            const size_t at = static_cast<size_t>(r) * dim + d + skew;
            uint32_t bits;
            std::memcpy(&bits, &want, 4);
            if (bf16) {
              uint16_t low;
              std::memcpy(&low, got.data() + 2 * at, 2);
              ASSERT_EQ(low, static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16))
                  << where << " row " << r << " value " << d;
            } else {
              uint32_t have;
              std::memcpy(&have, got.data() + 4 * at, 4);
              ASSERT_EQ(have, bits) << where << " row " << r << " value " << d;
            }
          }
        }
      }
}

TEST(CudaKernels, OptimizersMatchTheCpu) {
  REQUIRE_GPU();
  const size_t count = 1001;
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    std::vector<float> p = random_vector(count, 1), a(count, 0.0f), b(count, 0.0f);
    DeviceBuffer<float> dp(count, MemoryCategory::kOther), dg(count, MemoryCategory::kOther),
        da(count, MemoryCategory::kOther), db(count, MemoryCategory::kOther);
    DeviceBuffer<OptStep> dsteps(3, MemoryCategory::kOther);
    cudaMemcpy(dp.data(), p.data(), count * 4, cudaMemcpyHostToDevice);
    cudaMemset(da.data(), 0, count * 4);
    cudaMemset(db.data(), 0, count * 4);
    std::vector<OptStep> steps(3);
    for (int t = 0; t < 3; ++t) {
      steps[t].lr = 0.01f * (t + 1);
      steps[t].first = t == 0;
      steps[t].step_size = static_cast<float>(steps[t].lr / (1.0 - std::pow(0.9, t + 1.0)));
      steps[t].bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, t + 1.0)));
    }
    cudaMemcpy(dsteps.data(), steps.data(), sizeof(OptStep) * 3, cudaMemcpyHostToDevice);
    DeviceBuffer<int> counter(1, MemoryCategory::kOther);
    for (int t = 0; t < 3; ++t) {
      const auto g = random_vector(count, 10 + t);
      cudaMemcpy(dg.data(), g.data(), count * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(counter.data(), &t, 4, cudaMemcpyHostToDevice);
      if (kind == OptimizerKind::kSgd) {
        sgd_update(p.data(), g.data(), a.data(), count, steps[t].lr, 0.9f, 0.01f, t == 0);
        launch_sgd(dp.data(), dg.data(), da.data(), nullptr, count, dsteps.data(), counter.data(),
                   0.9f, 0.01f, nullptr);
      } else {
        adamw_update(p.data(), g.data(), a.data(), b.data(), count, steps[t].lr, 0.9f, 0.999f,
                     1e-8f, 0.01f, t + 1);
        launch_adamw(dp.data(), dg.data(), da.data(), db.data(), nullptr, count, dsteps.data(),
                     counter.data(), 0.9f, 0.999f, 1e-8f, 0.01f, nullptr);
      }
    }
    std::vector<float> got(count);
    ASSERT_EQ(cudaMemcpy(got.data(), dp.data(), count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_LE(relative_error(got, p), 1e-6) << (kind == OptimizerKind::kSgd ? "sgd" : "adamw");
  }
}

// K steps through the device-resident schedule against K steps of CpuMlp + Optimizer.
std::vector<float> gpu_steps(const MlpShape& shape, const Dataset& data, const OptimizerConfig& opt,
                             int batch, int k, bool graph, const std::vector<float>& init,
                             bool staged = false, const CudaStageOptions& options = {},
                             bool* from_cache = nullptr, bool* beside = nullptr) {
  CudaStage gpu(shape, 0, shape.num_layers(), batch, 1, opt, options);
  if (beside != nullptr) *beside = gpu.weight_grads_beside();
  if (options.autotune) gpu.autotune();
  if (from_cache != nullptr) *from_cache = gpu.autotune_cached();
  gpu.set_params(init.data());
  BatchFeeder feeder(batch, 1, k, gpu.stream());
  if (staged)
    feeder.set_train_data_host(data.train);
  else
    feeder.set_train_data(data.train, true, true);
  Sampler sampler(data.train.n, 3, true);
  std::vector<int32_t> indices(static_cast<size_t>(k) * batch);
  sampler.indices(0, indices.size(), indices.data());
  std::vector<OptStep> steps(k);
  for (int t = 0; t < k; ++t)
    steps[t] = optimizer_scalars(opt, lr_at(t, k, 0.05f, LrSchedule::kCosine, 0), t);
  feeder.upload_schedule(indices.data(), steps.data(), k);
  if (staged) feeder.stage_batch(indices.data());
  StepGraph step_graph;
  for (int t = 0; t < k; ++t) {
    // One step as the whole model's runner runs it: the batch fed, forward, loss, backward,
    // then the optimizer; captured at the second step and replayed when `graph`.
    step_graph.run(gpu.stream(), graph && !staged, [&] {
      feeder.feed(gpu, 0, 0);
      gpu.forward(0, batch);
      gpu.loss(0, batch, 1.0f / static_cast<float>(batch));
      gpu.backward(0, batch, false);
      gpu.optimizer_step(feeder.steps(), feeder.counter());
      feeder.next_step();
    });
    if (staged && t + 1 < k)
      feeder.stage_batch(indices.data() + static_cast<size_t>(t + 1) * batch);
  }
  std::vector<float> params(shape.param_count());
  gpu.get_params(params.data());
  return params;
}

std::vector<float> cpu_steps(const MlpShape& shape, const Dataset& data, const OptimizerConfig& opt,
                             int batch, int k, const std::vector<float>& init) {
  CpuMlp cpu(shape, batch);
  std::copy(init.begin(), init.end(), cpu.params());
  auto optimizer = make_optimizer(opt, shape.param_count());
  Sampler sampler(data.train.n, 3, true);
  std::vector<int32_t> idx(batch), y(batch);
  std::vector<float> x(static_cast<size_t>(batch) * shape.input_width());
  for (int t = 0; t < k; ++t) {
    sampler.indices(static_cast<int64_t>(t) * batch, batch, idx.data());
    gather_rows(data, idx.data(), batch, shape.input_width(), x.data(), y.data());
    cpu.forward(x.data(), batch);
    cpu.backward(y.data(), batch, 1.0f / batch);
    optimizer->step(cpu.params(), cpu.grads(), shape.param_count(),
                    lr_at(t, k, 0.05f, LrSchedule::kCosine, 0));
  }
  return {cpu.params(), cpu.params() + shape.param_count()};
}

TEST(CudaTraining, KStepsMatchTheCpu) {
  REQUIRE_GPU();
  const MlpShape shape({23, 37, 11, 5});
  const Dataset data = make_synthetic(300, 10, 23, 5, 9);
  std::vector<float> init(shape.param_count());
  init_params(shape, 4, init.data());
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    OptimizerConfig opt;
    opt.kind = kind;
    opt.weight_decay = 0.01f;
    const auto want = cpu_steps(shape, data, opt, 19, 8, init);
    const auto got = gpu_steps(shape, data, opt, 19, 8, false, init);
    EXPECT_LE(relative_error(got, want), 1e-5) << (kind == OptimizerKind::kSgd ? "sgd" : "adamw");
  }
}

TEST(CudaTraining, GraphReplayEqualsEagerLaunches) {
  REQUIRE_GPU();
  const MlpShape shape({64, 96, 10});
  const Dataset data = make_synthetic(500, 10, 64, 10, 2);
  std::vector<float> init(shape.param_count());
  init_params(shape, 5, init.data());
  OptimizerConfig opt;
  const auto eager = gpu_steps(shape, data, opt, 32, 12, false, init);
  const auto graph = gpu_steps(shape, data, opt, 32, 12, true, init);
  EXPECT_EQ(eager, graph);
  EXPECT_NE(eager, init);
}

// The tuning tests' model (256-512-384-10 on synthetic data), its initial weights, and the
// CPU's weights after 6 steps of 128.
struct TuningCase {
  MlpShape shape{std::vector<int>{256, 512, 384, 10}};
  Dataset data = make_synthetic(1024, 10, 256, 10, 11);
  OptimizerConfig opt;
  std::vector<float> init, want;
  TuningCase() : init(shape.param_count()) {
    init_params(shape, 12, init.data());
    want = cpu_steps(shape, data, opt, 128, 6, init);
  }
  // The stage's options with --autotune (its choices kept in `cache`, if given), and
  // --product-sms.
  static CudaStageOptions tuned(bool autotune = true, const std::string& cache = "", int sms = 0) {
    CudaStageOptions options;
    options.autotune = autotune;
    options.autotune_cache = cache;
    options.product_sms = sms;
    return options;
  }
};

TEST(CudaTraining, AutotunedStepsMatchTheCpu) {
  REQUIRE_GPU();
  const TuningCase c;
  const auto got =
      gpu_steps(c.shape, c.data, c.opt, 128, 6, true, c.init, false, TuningCase::tuned());
  EXPECT_LE(relative_error(got, c.want), 1e-5);
}

// Every way autotuning may compute a hidden layer's forward (ReLU and its mask in the epilogue,
// ReLU without the mask, the bias alone and our ReLU after) and an input gradient (DRELU from
// the mask, or the plain product and our mask from the output), each put in the cache as the
// choice, gives the CPU's weights; a choice that drops a mask the layer above reads is refused
// and tuned again.
TEST(CudaTraining, EveryAutotuneAlternativeMatchesTheCpu) {
  REQUIRE_GPU();
  TempDir dir;
  const std::string cache = dir.file("autotune.json");
  const TuningCase c;
  const std::vector<float>& want = c.want;
  auto run = [&](bool* cached) {
    return gpu_steps(c.shape, c.data, c.opt, 128, 6, true, c.init, false,
                     TuningCase::tuned(true, cache), cached);
  };
  bool cached = true;
  EXPECT_LE(relative_error(run(&cached), want), 1e-5) << "tuned";
  EXPECT_FALSE(cached);
  nlohmann::json stored;
  std::ifstream(cache) >> stored;
  ASSERT_EQ(stored.size(), 1u) << stored.dump();
  const std::string key = stored.begin().key();
  // The products in order: layer 0's forward and weight gradient; layers 1 and 2's forward,
  // weight gradient and input gradient (which reads the layer below's mask).
  ASSERT_EQ(stored[key].size(), 16u) << stored.dump();
  enum { kForward0 = 0, kForward1 = 2, kInput1 = 4, kInput2 = 7 };
  auto choose = [&](std::vector<std::pair<int, int>> picks) {
    nlohmann::json choices = stored[key];
    for (const auto& [product, pick] : picks) {
      choices[2 * product] = pick;
      choices[2 * product + 1] = 0;  // the first candidate of that plan
    }
    nlohmann::json file;
    file[key] = choices;
    std::ofstream(cache) << file.dump();
  };
  // Layer 0: bias alone and our ReLU; layer 1: ReLU without its mask; neither mask read.
  choose({{kForward0, 2}, {kInput1, 1}, {kForward1, 1}, {kInput2, 1}});
  EXPECT_LE(relative_error(run(&cached), want), 1e-5) << "no masks";
  EXPECT_TRUE(cached) << "the choices without masks were not taken from the cache";
  // Both masks kept and read (DRELU).
  choose({{kForward0, 0}, {kInput1, 0}, {kForward1, 0}, {kInput2, 0}});
  EXPECT_LE(relative_error(run(&cached), want), 1e-5) << "masks";
  EXPECT_TRUE(cached) << "the choices with masks were not taken from the cache";
  // Layer 0's mask dropped while layer 1's input gradient reads it: refused, tuned again.
  choose({{kForward0, 1}, {kInput1, 0}});
  EXPECT_LE(relative_error(run(&cached), want), 1e-5) << "retuned";
  EXPECT_FALSE(cached) << "a dropped mask that is read was taken from the cache";
}

// --product-sms: the products told to leave SMs free (cuBLASLt's SM count target) still match
// the CPU, tuned or not.
TEST(CudaTraining, ProductsOnFewerSmsMatchTheCpu) {
  REQUIRE_GPU();
  const TuningCase c;
  for (const bool tuned : {false, true}) {
    const auto got = gpu_steps(c.shape, c.data, c.opt, 128, 6, true, c.init, false,
                               TuningCase::tuned(tuned, "", 16));
    EXPECT_LE(relative_error(got, c.want), 1e-5) << (tuned ? "autotuned" : "heuristic");
  }
}

// Each layer's weight gradient on a second stream beside its input gradient: bitwise the
// weights of the one stream, eager and replayed, in every precision, tuned or not; and where
// --weight-grad-stream auto puts it (these products leave the GPU's SMs idle).
TEST(CudaTraining, WeightGradientsBesideAreBitwiseTheOneStream) {
  REQUIRE_GPU();
  TempDir dir;
  const TuningCase c;
  for (Precision precision : {Precision::kFp32, Precision::kTf32, Precision::kBf16})
    for (bool tuned : {false, true}) {
      // The tuned runs share their choices through the cache (timings alone may pick others).
      CudaStageOptions options = TuningCase::tuned(tuned, tuned ? dir.file("tuned.json") : "");
      options.precision = precision;
      const std::string what = std::string(precision_name(precision)) + (tuned ? " tuned" : "");
      options.weight_grad_stream = WeightGradStream::kOff;
      bool beside = true;
      const auto one =
          gpu_steps(c.shape, c.data, c.opt, 128, 6, true, c.init, false, options, nullptr, &beside);
      EXPECT_FALSE(beside) << what;
      if (precision == Precision::kFp32) EXPECT_LE(relative_error(one, c.want), 1e-5) << what;
      options.weight_grad_stream = WeightGradStream::kOn;
      for (bool graph : {false, true}) {
        beside = false;
        const auto two = gpu_steps(c.shape, c.data, c.opt, 128, 6, graph, c.init, false, options,
                                   nullptr, &beside);
        EXPECT_TRUE(beside) << what;
        EXPECT_EQ(two, one) << what << (graph ? " replayed" : " eager");
      }
    }
  CudaStageOptions options;
  bool beside = false;
  gpu_steps(c.shape, c.data, c.opt, 128, 1, false, c.init, false, options, nullptr, &beside);
  EXPECT_TRUE(beside) << "auto, 256-512-384-10 at 128";
}

TEST(CudaTraining, HostStagedBatchesEqualDeviceGather) {
  REQUIRE_GPU();
  const MlpShape shape({64, 96, 10});
  const Dataset data = make_synthetic(500, 10, 64, 10, 7);
  std::vector<float> init(shape.param_count());
  init_params(shape, 8, init.data());
  OptimizerConfig opt;
  const auto device = gpu_steps(shape, data, opt, 32, 12, false, init);
  const auto staged = gpu_steps(shape, data, opt, 32, 12, false, init, /*staged=*/true);
  EXPECT_EQ(device, staged);
}

// The fused step (models/fused_mlp.h): `k` SGD steps of `batch` samples from `data`'s training
// split through the device-resident schedule (the sampler's order, lr_at's cosine), from
// `init`, eager or captured at the second step and replayed; returns the parameters, and the
// last step's gradients and the steps' loss sum in `grads` and `loss`.
std::vector<float> fused_steps(const MlpShape& shape, const Dataset& data,
                               const OptimizerConfig& opt, int batch, int k, Precision precision,
                               bool graph, const std::vector<float>& init,
                               std::vector<float>* grads = nullptr, double* loss = nullptr) {
  CudaStream stream;
  const FusedMlpStep fused(shape, batch, precision, opt);
  const size_t count = shape.param_count();
  DeviceBuffer<float> x(data.train.x.size(), MemoryCategory::kOther);
  DeviceBuffer<int32_t> y(data.train.y.size(), MemoryCategory::kOther);
  copy_to_device(x.data(), data.train.x.data(), x.bytes());
  copy_to_device(y.data(), data.train.y.data(), y.bytes());
  Sampler sampler(data.train.n, 3, true);
  std::vector<int32_t> indices(static_cast<size_t>(k) * batch);
  sampler.indices(0, indices.size(), indices.data());
  DeviceBuffer<int32_t> d_indices(indices.size(), MemoryCategory::kOther);
  copy_to_device(d_indices.data(), indices.data(), d_indices.bytes());
  std::vector<OptStep> steps(k);
  for (int t = 0; t < k; ++t)
    steps[t] = optimizer_scalars(opt, lr_at(t, k, 0.05f, LrSchedule::kCosine, 0), t);
  DeviceBuffer<OptStep> d_steps(k, MemoryCategory::kOther);
  copy_to_device(d_steps.data(), steps.data(), d_steps.bytes());
  DeviceBuffer<int> counter(1, MemoryCategory::kOther);
  DeviceBuffer<float> params(count, MemoryCategory::kParameters);
  DeviceBuffer<float> d_grads(count, MemoryCategory::kGradients);
  DeviceBuffer<float> momentum(count, MemoryCategory::kOptimizerState);
  DeviceBuffer<uint16_t> params16(precision == Precision::kBf16 ? count : 0,
                                  MemoryCategory::kParameters);
  DeviceBuffer<double> loss_sum(1, MemoryCategory::kOther);
  DeviceBuffer<int> correct(1, MemoryCategory::kOther);
  copy_to_device(params.data(), init.data(), params.bytes());
  const int zero = 0;
  copy_to_device(counter.data(), &zero, sizeof(zero));
  FusedStepIo io;
  io.x = x.data();
  io.y = y.data();
  io.indices = d_indices.data();
  io.counter = counter.data();
  io.stride = batch;
  io.params = params.data();
  io.grads = d_grads.data();
  io.momentum = momentum.data();
  io.params16 = params16.data();
  io.steps = d_steps.data();
  io.loss_sum = loss_sum.data();
  io.correct = correct.data();
  const double nothing = 0;
  copy_to_device(loss_sum.data(), &nothing, sizeof(nothing));
  StepGraph step_graph;
  for (int t = 0; t < k; ++t) {
    step_graph.run(stream.get(), graph, [&] {
      fused.run(io, stream.get());
      launch_increment(counter.data(), stream.get());
    });
  }
  EXPECT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  std::vector<float> out(count);
  EXPECT_EQ(cudaMemcpy(out.data(), params.data(), params.bytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  if (grads != nullptr) {
    grads->resize(count);
    EXPECT_EQ(cudaMemcpy(grads->data(), d_grads.data(), d_grads.bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
  if (loss != nullptr)
    EXPECT_EQ(cudaMemcpy(loss, loss_sum.data(), sizeof(double), cudaMemcpyDeviceToHost),
              cudaSuccess);
  if (precision == Precision::kBf16) {  // the bf16 copy follows the parameters
    std::vector<uint16_t> low(count);
    EXPECT_EQ(cudaMemcpy(low.data(), params16.data(), params16.bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t i = 0; i < count; i += 97) {
      uint32_t bits;
      std::memcpy(&bits, &out[i], 4);
      const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // to nearest even
      EXPECT_EQ(low[i], static_cast<uint16_t>(rounded)) << "bf16 copy of parameter " << i;
    }
  }
  return out;
}

class FusedStep : public ::testing::TestWithParam<Case> {};

// One step: its gradients, loss and updated parameters against CpuMlp and the CPU's SGD.
TEST_P(FusedStep, OneStepMatchesTheCpu) {
  REQUIRE_GPU();
  const Case& c = GetParam();
  const MlpShape shape(c.widths);
  const Dataset data =
      make_synthetic(3 * c.batch, 10, shape.input_width(), shape.num_classes(), 21);
  std::vector<float> init(shape.param_count());
  init_params(shape, 22, init.data());
  OptimizerConfig opt;
  opt.weight_decay = 0.01f;

  CpuMlp cpu(shape, c.batch);
  std::copy(init.begin(), init.end(), cpu.params());
  Sampler sampler(data.train.n, 3, true);
  std::vector<int32_t> idx(c.batch), y(c.batch);
  std::vector<float> x(static_cast<size_t>(c.batch) * shape.input_width());
  sampler.indices(0, c.batch, idx.data());
  gather_rows(data, idx.data(), c.batch, shape.input_width(), x.data(), y.data());
  cpu.forward(x.data(), c.batch);
  const LossSum want_loss = cpu.backward(y.data(), c.batch, 1.0f / c.batch);
  const std::vector<float> want_grads(cpu.grads(), cpu.grads() + shape.param_count());
  std::vector<float> momentum(shape.param_count());
  sgd_update(cpu.params(), cpu.grads(), momentum.data(), shape.param_count(),
             lr_at(0, 1, 0.05f, LrSchedule::kCosine, 0), opt.momentum, opt.weight_decay, true);
  const std::vector<float> want(cpu.params(), cpu.params() + shape.param_count());

  std::vector<float> grads;
  double loss = 0;
  const std::vector<float> got =
      fused_steps(shape, data, opt, c.batch, 1, c.precision, false, init, &grads, &loss);
  EXPECT_LE(relative_error(grads, want_grads), gradient_tolerance(c.precision));
  expect_each_layer(shape, grads, want_grads, gradient_tolerance(c.precision), false);
  EXPECT_NEAR(loss, want_loss.loss, tolerance(c.precision) * want_loss.loss);
  EXPECT_LE(relative_error(got, want), tolerance(c.precision));
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedStep,
                         ::testing::Values(Case{{3, 2}, 1, Precision::kFp32, true},
                                           Case{{5, 3}, 7, Precision::kFp32, true},
                                           Case{{31, 129, 65, 10}, 37, Precision::kFp32, true},
                                           Case{{784, 512, 512, 10}, 128, Precision::kFp32, true},
                                           Case{{784, 512, 512, 10}, 128, Precision::kTf32, true},
                                           Case{{31, 129, 65, 10}, 37, Precision::kBf16, true},
                                           Case{{784, 512, 512, 10}, 128, Precision::kBf16, true}),
                         case_name);

// K steps against K steps of CpuMlp + SGD (fp32: 1e-5), and the captured step replayed bitwise
// as its eager launches.
TEST(FusedStep, KStepsMatchTheCpuAndReplayBitwise) {
  REQUIRE_GPU();
  const MlpShape shape({23, 37, 11, 5});
  const Dataset data = make_synthetic(300, 10, 23, 5, 9);
  std::vector<float> init(shape.param_count());
  init_params(shape, 4, init.data());
  OptimizerConfig opt;
  opt.weight_decay = 0.01f;
  const auto want = cpu_steps(shape, data, opt, 19, 8, init);
  const auto eager = fused_steps(shape, data, opt, 19, 8, Precision::kFp32, false, init);
  const auto graph = fused_steps(shape, data, opt, 19, 8, Precision::kFp32, true, init);
  EXPECT_LE(relative_error(eager, want), 1e-5);
  EXPECT_EQ(graph, eager);
  EXPECT_NE(eager, init);
}

// What the fused step does not take is said, not run.
TEST(FusedStep, RefusesWhatItDoesNotTake) {
  std::string why;
  EXPECT_FALSE(fused_step_fits(MlpShape({784, 2048, 10}), 128, OptimizerConfig{}, &why));
  EXPECT_EQ(why, "a width of 2048 (at most 1024)");
  OptimizerConfig adamw;
  adamw.kind = OptimizerKind::kAdamW;
  EXPECT_FALSE(fused_step_fits(MlpShape({784, 512, 10}), 128, adamw, &why));
  EXPECT_EQ(why, "an optimizer other than SGD");
  EXPECT_FALSE(fused_step_fits(MlpShape({784, 512, 33}), 128, OptimizerConfig{}, &why));
  EXPECT_EQ(why, "33 classes (at most 32)");
  EXPECT_TRUE(fused_step_fits(MlpShape({784, 512, 512, 10}), 128, OptimizerConfig{}, &why));
  EXPECT_EQ(why, "");
}

}  // namespace
}  // namespace ddp
