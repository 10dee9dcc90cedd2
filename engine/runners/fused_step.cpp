// FusedStep: the trial that chooses the fused whole step, and the step it runs.
#include "engine/runners/fused_step.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "models/autotune_cache.h"
#include "runtime/cuda_check.h"
#include "runtime/device_buffer.h"
#include "runtime/error.h"
#include "runtime/step_graph.h"

namespace ddp {

namespace {

// What the fused step's choice depends on: the GPU, the model, the batch and the precision.
std::string cache_key(const StageSpec& spec, Precision precision) {
  int device = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return fmt::format("fused step v3 | {} sm_{}{} | layers {} | batch {} | {}", prop.name,
                     prop.major, prop.minor, spec.shape.to_string(), spec.batch,
                     precision_name(precision));
}

float* momentum_buffer(const DeviceParameters& weights) {
  for (const auto& [name, buffer] : weights.optimizer().buffers())
    if (name == "momentum") return buffer;
  return nullptr;
}

// What the fused step reads and writes: the stage's buffers and the given schedule.
FusedStepIo fused_io(const FusedStepSetting& s, const int32_t* indices, const int* counter,
                     const OptStep* steps) {
  DeviceParameters& weights = s.stage->weights();
  FusedStepIo io;
  io.x = s.feeder->train_x();
  io.y = s.feeder->train_y();
  io.indices = indices;
  io.counter = counter;
  io.stride = s.spec->batch;
  io.params = weights.params();
  io.grads = weights.grads();
  io.momentum = momentum_buffer(weights);
  io.params16 = weights.params16();
  io.steps = steps;
  io.loss_sum = s.stage->training_loss_sum();
  io.correct = s.stage->training_hits();
  return io;
}

}  // namespace

double fused_step_tolerance(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return 1e-4;
    case Precision::kTf32:
      return 3e-2;
    default:
      return 6e-2;
  }
}

void FusedStep::run() {
  kernel_->run(io_, stream_);
  feeder_->next_step();
}

std::unique_ptr<FusedStep> FusedStep::choose(const FusedStepSetting& s) {
  const RunnerOptions& options = *s.options;
  if (!options.step.fused_step && !options.autotune) return nullptr;
  const StageSpec& spec = *s.spec;
  const bool asked = options.step.fused_step;
  const std::string flag = asked ? "--fused-step" : "--autotune: the fused step";
  bool tried = false;
  const auto not_used = [&](const std::string& why) -> std::unique_ptr<FusedStep> {
    if (s.lead && (asked || tried)) spdlog::info("{}: not used: {}", flag, why);
    return nullptr;
  };
  std::string why;
  if (!s.whole_model || s.data_parallel)
    return not_used("one GPU's whole model only (no data or pipeline parallelism)");
  if (spec.micro_batches > 1) return not_used("one micro-batch a step only (not --accumulate)");
  if (s.feeder->host_staged()) return not_used("the training split must fit on the GPU");
  if (s.overlapped || s.timeline) return not_used("not with --overlap-optimizer or --timeline");
  if (!fused_step_fits(spec.shape, spec.batch, options.optimizer, &why))
    return not_used("it does not take " + why);
  tried = true;
  cudaStream_t stream = s.stream;
  CudaStage& stage = *s.stage;
  DeviceParameters& weights = stage.weights();
  std::unique_ptr<FusedMlpStep> fused;
  const auto make = [&](int blocks) {
    fused = std::make_unique<FusedMlpStep>(spec.shape, spec.batch, options.precision,
                                           options.optimizer, blocks);
  };
  const int batch = spec.batch;
  const size_t count = weights.count();
  // One batch (the split's first samples), at the optimizer's next step.
  std::vector<int32_t> rows(batch);
  for (int i = 0; i < batch; ++i)
    rows[i] = static_cast<int32_t>(i % std::max<int64_t>(1, s.train_rows));
  DeviceBuffer<int32_t> indices(batch, MemoryCategory::kOther);
  copy_to_device(indices.data(), rows.data(), indices.bytes());
  const OptStep scalars = optimizer_scalars(options.optimizer, options.lr, s.optimizer_steps);
  DeviceBuffer<OptStep> steps(1, MemoryCategory::kOther);
  copy_to_device(steps.data(), &scalars, sizeof(scalars));
  float* momentum = momentum_buffer(weights);
  DeviceBuffer<float> saved(count, MemoryCategory::kOther);
  DeviceBuffer<float> saved_momentum(momentum != nullptr ? count : 0, MemoryCategory::kOther);
  const auto copy = [&](float* to, const float* from) {
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(to, from, count * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  };
  copy(saved.data(), weights.params());
  if (momentum != nullptr) copy(saved_momentum.data(), momentum);
  const auto put_back = [&] {
    copy(weights.params(), saved.data());
    if (momentum != nullptr) copy(momentum, saved_momentum.data());
    weights.to_low_precision(stream);
  };
  const auto usual = [&] {
    stage.gather(s.feeder->train_x(), s.feeder->train_y(), spec.shape.input_width(), indices.data(),
                 nullptr, batch, batch, 0);
    stage.forward(0, batch);
    stage.loss(0, batch, 1.0f / static_cast<float>(batch));
    stage.backward(0, batch, false);
    stage.optimizer_step(steps.data(), nullptr);
  };
  const FusedStepIo io = fused_io(s, indices.data(), nullptr, steps.data());
  const auto one = [&] { fused->run(io, stream); };
  // The update each makes from the same weights, against the weights before it.
  const auto update = [&](const std::function<void()>& step) {
    step();
    std::vector<float> after(count), before(count);
    DDP_CUDA_CHECK(cudaMemcpyAsync(after.data(), weights.params(), count * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream));
    DDP_CUDA_CHECK(cudaMemcpyAsync(before.data(), saved.data(), count * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream));
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
    put_back();
    for (size_t i = 0; i < count; ++i)
      after[i] -= before[i];
    return after;
  };
  // --autotune alone: the choice of an earlier run on this GPU, model and precision (whether
  // to use the fused step, and its grid), if kept.
  const std::string cache = asked ? std::string() : autotune_cache_path(options.cache_dir);
  const std::string key = cache_key(spec, options.precision);
  const std::optional<std::vector<int>> cached =
      cache.empty() ? std::nullopt : load_autotune(cache, key);
  const std::vector<int> grids = FusedMlpStep::grids(options.precision);
  const bool from_cache = cached && cached->size() == 2 &&
                          std::find(grids.begin(), grids.end(), (*cached)[1]) != grids.end();
  std::vector<float> want, got;
  double usual_us = 0, fused_us = 0;
  int grid = from_cache ? (*cached)[1] : 0;  // 0: FusedMlpStep's default
  try {
    want = update(usual);
    if (!asked && !from_cache) {
      // --autotune: the fastest of the grids the GPU can hold (the splits follow the grid).
      fused_us = INFINITY;
      for (int blocks : grids) {
        make(blocks);
        const double us = time_steps_us(stream, 50, true, one);
        if (us < fused_us) fused_us = us, grid = blocks;
      }
      put_back();
    }
    make(grid);
    got = update(one);
    if (!from_cache) {
      usual_us = time_steps_us(stream, 50, true, usual);
      if (asked) fused_us = time_steps_us(stream, 50, true, one);
    }
  } catch (const Error& e) {
    // A launch or capture the GPU refused: the capture ended, the weights put back.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
        capture != cudaStreamCaptureStatusNone) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(stream, &broken);
      if (broken != nullptr) cudaGraphDestroy(broken);
    }
    cudaGetLastError();
    put_back();
    stage.take_sums(false);
    return not_used(std::string("it failed on this GPU: ") + e.what());
  }
  double diff = 0, norm = 0;
  for (size_t i = 0; i < count; ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  const double error = std::isfinite(diff) ? std::sqrt(diff / std::max(norm, 1e-30)) : INFINITY;
  const double tolerance = fused_step_tolerance(options.precision);
  put_back();
  stage.take_sums(false);  // the trial's loss sums, not training's
  if (!(error <= tolerance))
    return not_used(fmt::format(
        "its update differs from the usual step's by {:.3g} (tolerance {:.0e}); the usual step",
        error, tolerance));
  const std::string times =
      from_cache ? fmt::format(
                       "the choice kept in {}, its update within {:.2g} of the usual "
                       "step's",
                       cache, error)
                 : fmt::format(
                       "{:.1f} us a step against {:.1f} us for the usual one, its "
                       "update within {:.2g} of it",
                       fused_us, usual_us, error);
  const bool faster = from_cache ? (*cached)[0] == 1 : fused_us < usual_us;
  if (!asked && !from_cache && !cache.empty()) {
    const std::string failed = save_autotune(cache, key, {faster ? 1 : 0, fused->blocks()});
    if (!failed.empty() && s.lead)
      spdlog::warn("--autotune: the fused step's choice was not kept: {}", failed);
  }
  // Where slower, the usual step, unless --fused-step=force.
  if (!faster && !options.step.fused_step_force)
    return not_used(times + (asked ? "; the usual step (--fused-step=force uses it anyway)"
                                   : "; the usual step"));
  if (s.lead)
    spdlog::info(
        "{}: the whole step as one kernel ({} blocks, products split up to {} ways "
        "along k), {}; used{}",
        flag, fused->blocks(), fused->most_splits(), times,
        faster ? "" : " (--fused-step=force, though slower)");
  const FusedStepIo step_io =
      fused_io(s, s.feeder->indices(), s.feeder->counter(), s.feeder->steps());
  return std::unique_ptr<FusedStep>(new FusedStep(std::move(fused), step_io, s.feeder, stream));
}

}  // namespace ddp
