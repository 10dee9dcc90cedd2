// ddp_fused_mlp_bench: one GPU, the whole training step of an MLP two ways, each captured in a
// CUDA graph and replayed: the CudaStage step ddptrain runs today (the batch gathered,
// cuBLASLt products with fused epilogues, the loss, the optimizer: about twenty kernels) and
// the fused step (models/fused_mlp.h: one cooperative kernel). Prints a Markdown row a
// precision: microseconds a step, median of five timed runs of --steps replays each.
// Usage: ddp_fused_mlp_bench [--layers 784,512,512,10] [--batch 128] [--steps 2000]
//        [--precision fp32,tf32,bf16] [--blocks N (default: one an SM)] [--trace]
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine/loop/sampler.h"
#include "models/batch_feeder.h"
#include "models/cuda_kernels.h"
#include "models/dataset.h"
#include "models/fused_mlp.h"
#include "models/mlp_stage_cuda.h"
#include "runtime/error.h"
#include "runtime/step_graph.h"

namespace ddp {
namespace {

// Median microseconds a step over five timed runs of `steps` runs of `step` (time_steps_us).
double median_us(cudaStream_t stream, int steps, bool captured, const std::function<void()>& step) {
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r)
    runs.push_back(time_steps_us(stream, steps, captured, step));
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

// --trace: where a step's time goes, from the kernel's own stamps (FusedMlpStep::trace_phases),
// medians of 21 eager runs: each phase's work (from its start in block 0 to the last block's
// end of it; the first block's end beside it) and the barrier after it.
void print_phases(FusedMlpStep& fused, int layers, cudaStream_t stream,
                  const std::function<void()>& step) {
  DeviceBuffer<unsigned long long> buffer(fused.trace_size(), MemoryCategory::kOther);
  fused.trace_phases(buffer.data());
  const int phases = 2 * layers, blocks = fused.blocks();
  std::vector<std::vector<double>> work(phases), first(phases), barrier(phases);
  std::vector<unsigned long long> t(fused.trace_size());
  for (int run = 0; run < 21; ++run) {
    step();
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
    DDP_CUDA_CHECK(cudaMemcpy(t.data(), buffer.data(), buffer.bytes(), cudaMemcpyDeviceToHost));
    for (int p = 0; p < phases; ++p) {
      const auto* end = &t[phases + static_cast<size_t>(p) * blocks];
      const unsigned long long last = *std::max_element(end, end + blocks);
      const unsigned long long soonest = *std::min_element(end, end + blocks);
      work[p].push_back(1e-3 * static_cast<double>(last - t[p]));
      first[p].push_back(1e-3 * static_cast<double>(soonest - t[p]));
      barrier[p].push_back(p + 1 < phases ? 1e-3 * static_cast<double>(t[p + 1] - last) : 0.0);
    }
  }
  fused.trace_phases(nullptr);
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double total = 0;
  for (int p = 0; p < phases; ++p) {
    const std::string name = p < layers ? "forward " + std::to_string(p)
                                        : "backward " + std::to_string(2 * layers - 1 - p);
    std::printf("  phase %d (%s): work %.2f us (first block done at %.2f), barrier %.2f us\n", p,
                name.c_str(), median(work[p]), median(first[p]), median(barrier[p]));
    total += median(work[p]) + median(barrier[p]);
  }
  std::printf("  phases and barriers: %.2f us\n", total);
}

int run(int argc, char** argv) {
  std::string layers = "784,512,512,10", precisions = "fp32,tf32,bf16";
  int batch = 128, steps = 2000;
  bool trace = false;
  int blocks = 0;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--trace") {
      trace = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) throw UsageError("ddp_fused_mlp_bench: " + flag + " needs a value");
    const std::string value = argv[i + 1];
    if (flag == "--layers")
      layers = value;
    else if (flag == "--batch")
      batch = std::stoi(value);
    else if (flag == "--steps")
      steps = std::stoi(value);
    else if (flag == "--precision")
      precisions = value;
    else if (flag == "--blocks")
      blocks = std::stoi(value);
    else
      throw UsageError("ddp_fused_mlp_bench: unknown flag " + flag +
                       " (expected --layers, --batch, --steps, --precision, --blocks or --trace)");
  }
  const MlpShape shape = parse_layers(layers);
  const OptimizerConfig opt;
  std::string why;
  if (!fused_step_fits(shape, batch, opt, &why))
    throw UsageError("--layers " + layers + " --batch " + std::to_string(batch) +
                     ": the fused step does not take " + why);
  // Samples enough for every step's batch without repeating a schedule chunk.
  const Dataset data = make_synthetic(8192, 10, shape.input_width(), shape.num_classes(), 3);
  const int chunk = 5 * (3 + steps);  // BatchFeeder's steps: five timed runs and their warm-ups
  Sampler sampler(data.train.n, 3, true);
  std::vector<int32_t> indices(static_cast<size_t>(chunk) * batch);
  sampler.indices(0, indices.size(), indices.data());
  std::vector<OptStep> opt_steps(chunk);
  for (int t = 0; t < chunk; ++t)
    opt_steps[t] = optimizer_scalars(opt, 0.01f, t);
  std::printf(
      "| layers | batch | precision | CudaStage step us (graph) | fused step us (graph) | fused "
      "step us (eager) | fused blocks | most splits |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  size_t at = 0;
  while (at <= precisions.size()) {
    const size_t comma = std::min(precisions.find(',', at), precisions.size());
    const std::string name = precisions.substr(at, comma - at);
    at = comma + 1;
    if (name != "fp32" && name != "tf32" && name != "bf16")
      throw UsageError("--precision " + precisions + ": expected fp32, tf32 or bf16, or a list");
    const Precision precision = name == "fp32"   ? Precision::kFp32
                                : name == "tf32" ? Precision::kTf32
                                                 : Precision::kBf16;
    CudaStageOptions options;
    options.precision = precision;
    CudaStage stage(shape, 0, shape.num_layers(), batch, 1, opt, options);
    std::vector<float> init(shape.param_count());
    init_params(shape, 7, init.data());
    stage.set_params(init.data());
    BatchFeeder feeder(batch, 1, chunk, stage.stream());
    feeder.set_train_data(data.train, true, true);
    const auto reset = [&] { feeder.upload_schedule(indices.data(), opt_steps.data(), chunk); };
    // Each timed run starts from the chunk's first step again (the counter is reset).
    const auto stage_step = [&] {
      feeder.feed(stage, 0, 0);
      stage.forward(0, batch);
      stage.loss(0, batch, 1.0f / static_cast<float>(batch));
      stage.backward(0, batch, false);
      stage.optimizer_step(feeder.steps(), feeder.counter());
      feeder.next_step();
    };
    reset();
    const double stage_us = median_us(stage.stream(), steps, true, stage_step);
    FusedMlpStep fused(shape, batch, precision, opt, blocks);
    DeviceBuffer<float> momentum(shape.param_count(), MemoryCategory::kOptimizerState);
    DeviceBuffer<double> loss(1, MemoryCategory::kOther);
    DeviceBuffer<int> correct(1, MemoryCategory::kOther);
    DeviceBuffer<float> x(data.train.x.size(), MemoryCategory::kData);
    DeviceBuffer<int32_t> y(data.train.y.size(), MemoryCategory::kData);
    DeviceBuffer<int32_t> d_indices(indices.size(), MemoryCategory::kData);
    copy_to_device(x.data(), data.train.x.data(), x.bytes());
    copy_to_device(y.data(), data.train.y.data(), y.bytes());
    copy_to_device(d_indices.data(), indices.data(), d_indices.bytes());
    FusedStepIo io;
    io.x = x.data();
    io.y = y.data();
    io.indices = d_indices.data();
    io.counter = feeder.counter();
    io.stride = batch;
    io.params = stage.params();
    io.grads = stage.grads();
    io.momentum = momentum.data();
    io.params16 = precision == Precision::kBf16 ? stage.weights().params16() : nullptr;
    io.steps = feeder.steps();
    io.loss_sum = loss.data();
    io.correct = correct.data();
    const auto fused_step = [&] {
      fused.run(io, stage.stream());
      feeder.next_step();
    };
    stage.set_params(init.data());
    reset();
    const double eager_us = median_us(stage.stream(), steps, false, fused_step);
    stage.set_params(init.data());
    reset();
    std::string graph_us = "-";
    try {
      graph_us = fmt::format("{:.2f}", median_us(stage.stream(), steps, true, fused_step));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ddp_fused_mlp_bench: the fused step in a CUDA graph: %s\n", e.what());
    }
    std::printf("| %s | %d | %s | %.2f | %s | %.2f | %d | %d |\n", layers.c_str(), batch,
                name.c_str(), stage_us, graph_us.c_str(), eager_us, fused.blocks(),
                fused.most_splits());
    std::fflush(stdout);
    if (trace)
      print_phases(fused, shape.num_layers(), stage.stream(), [&] {
        reset();
        fused_step();
      });
  }
  return 0;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  try {
    return ddp::run(argc, argv);
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_fused_mlp_bench: error: %s\n", e.what());
    return 1;
  }
}
