// train_on_gpu(): the host walks the sampler's stream in chunks (one per logging window),
// uploads each chunk's sample indices (this rank's share) and optimizer scalars, then runs
// one step per step: replayed from the captured graph on one GPU; with data parallelism,
// bucket all-reduces are enqueued on NCCL's stream as backward finishes each bucket and the
// optimizer waits for them on the device. The host synchronises only at window boundaries.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

#include "engine/checkpoint.h"
#include "engine/ddp.h"
#include "engine/gpu_timeline.h"
#include "engine/gpu_trainer.h"
#include "engine/optimizer_overlap.h"
#include "engine/progress.h"
#include "engine/sampler.h"
#include "engine/step_watchdog.h"
#include "engine/timeline.h"
#include "models/autotune_cache.h"
#include "models/mlp_cuda.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "runtime/timer.h"

namespace ddp {

namespace {
// Sums a few doubles over the group through `buffer` (NCCL needs device memory; the
// buffer is allocated once, outside the steps).
void sum_on_device(Communicator* comm, CudaMlp& model, DeviceBuffer<double>& buffer, double* values,
                   size_t count) {
  if (comm == nullptr || comm->size() == 1) return;
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(buffer.data(), values, count * 8, cudaMemcpyHostToDevice, model.stream()));
  comm->all_reduce(buffer.data(), count, DataType::kFloat64, ReduceOp::kSum);
  DDP_CUDA_CHECK(cudaMemcpy(values, buffer.data(), count * 8, cudaMemcpyDeviceToHost));
}
}  // namespace

TrainResult train_on_gpu(const TrainConfig& config,
                         const std::function<const Dataset&()>& data_ready, const GroupStart& group,
                         MetricsWriter* metrics_in, std::vector<float>* final_params,
                         GpuMonitor* monitor) {
  const MlpShape shape = parse_layers(config.layers);
  const int rank = group.rank;
  const int ranks = group.size;
  const bool lead = rank == 0;
  DDP_USAGE_CHECK(!config.check_replicas, "--check-replicas: runs on the CPU path only so far");
  DDP_USAGE_CHECK(config.on_nonfinite == OnNonfinite::kStop,
                  "--on-nonfinite {}: runs on the CPU path only so far (the GPU path stops)",
                  on_nonfinite_name(config.on_nonfinite));
  // Each rank's micro-batch: its share of each of the step's --accumulate micro-batches.
  const int micro_batches = config.accumulate;
  const int micro_batch = local_batch_of(config, micro_batches, ranks);
  const int local_batch = micro_batch * micro_batches;  // this rank's samples a step

  CudaMlpOptions options;
  options.precision = config.precision;
  options.cuda_graph = config.cuda_graph;  // with data parallelism the NCCL calls are captured too
  options.fused_epilogues = config.fused_epilogues;
  options.sync_debug = config.sync_debug;
  options.autotune = config.autotune;
  options.autotune_cache = autotune_cache_path(config.cache_dir);
  options.max_schedule_steps = std::min(config.log_every, 512);
  options.accumulate = micro_batches;
  // --init-weights are read on another thread while the model builds its plans (and
  // autotunes) on the GPU; initial weights are made on the GPU (the host's values, bitwise).
  // Both while the communicator starts.
  Stopwatch start_clock;
  std::vector<float> params;
  std::future<void> weights;
  if (!config.init_weights.empty())
    weights = std::async(std::launch::async, [&] {
      params.resize(shape.param_count());
      load_mlp_weights(config.init_weights, shape, params.data());
    });
  CudaMlp model(shape, micro_batch, config.optimizer, options);
  const double model_s = start_clock.seconds();
  const Dataset& data = data_ready();  // loading on its own thread meanwhile
  check_model_fits_data(shape, config, data);
  if (weights.valid()) {
    weights.get();
    model.set_params(params.data());
  } else {
    model.init_params_on_device(config.seed);
  }
  const double weights_s = start_clock.seconds();
  if (lead && config.autotune && !model.autotune_save_error().empty())
    spdlog::warn("--autotune: the choices were not kept for the next run: {}",
                 model.autotune_save_error());
  Communicator* comm = group.get ? group.get() : nullptr;
  const bool data_parallel = comm != nullptr;
  if (lead)
    spdlog::info(
        "model ready in {:.2f}s (cuBLASLt plans{}), weights {} by {:.2f}s, "
        "communicator by {:.2f}s",
        model_s,
        !config.autotune          ? ""
        : model.autotune_cached() ? " and autotuning, from " + options.autotune_cache
                                  : std::string(" and autotuning"),
        config.init_weights.empty() ? "initialised on the GPU" : "read and uploaded", weights_s,
        start_clock.seconds());
  int64_t done = 0;
  bool resumed = false;
  const std::string optimizer_name =
      config.optimizer.kind == OptimizerKind::kAdamW ? "adamw" : "sgd";
  const int64_t total_steps =
      config.steps > 0
          ? config.steps
          : std::max<int64_t>(1, int64_t{config.epochs} * data.train.n / config.batch_size);
  const RunSettings settings{config.seed, config.lr, total_steps, schedule_name(config.lr_schedule),
                             ranks};
  if (config.resume && std::ifstream(checkpoint_path(config.checkpoint_dir)).good()) {
    const Checkpoint c = load_checkpoint(checkpoint_path(config.checkpoint_dir), shape,
                                         optimizer_name, config.batch_size, settings);
    if (lead && !c.changed.empty())
      spdlog::warn("resuming with changed settings (allowed): {}",
                   fmt::format("{}", fmt::join(c.changed, "; ")));
    model.set_params(c.params.data());
    model.set_optimizer_state(c.optimizer_state);
    done = c.step;
    resumed = true;
    if (lead)
      spdlog::info("resumed from {} at step {}", checkpoint_path(config.checkpoint_dir), c.step);
  }
  std::unique_ptr<Ddp> ddp;
  DeviceBuffer<uint16_t> bf16_grads;  // the gradients on the wire with --grad-reduce bf16
  if (data_parallel) {
    comm->set_compute_stream(model.stream());
    ddp = std::make_unique<Ddp>(
        *comm, param_spans(shape), static_cast<size_t>(config.bucket_mb * 1048576),
        static_cast<size_t>(config.first_bucket_mb * 1048576), config.overlap);
    // Every rank must hold the same model: compare shape fingerprints through the group.
    ddp->set_device_copies(
        [](void* dst, const void* src, size_t bytes) {
          DDP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
        },
        [](void* dst, const void* src, size_t bytes) {
          DDP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
        });
    DeviceBuffer<int64_t> scratch(static_cast<size_t>(ranks) + 1, MemoryCategory::kOther);
    ddp->check_same_layout(shape.fingerprint(), shape.to_string(), scratch.data());
    ddp->broadcast_parameters(model.device_params(), shape.param_count());
    model.refresh_low_precision_params();  // the bf16 copy, from the broadcast weights
    if (config.grad_reduce == GradReduce::kBf16) {
      bf16_grads = DeviceBuffer<uint16_t>(shape.param_count(), MemoryCategory::kGradients);
      ddp->reduce_in_bf16(bf16_grads.data());
    }

    if (lead)
      spdlog::info(
          "data parallel over {} GPUs ({}): {} buckets, overlap {}, gradients reduced in {}", ranks,
          comm->backend(), ddp->buckets().size(), config.overlap ? "on" : "off",
          grad_reduce_name(config.grad_reduce));
  }
  // The optimizer overlapped with backward (--overlap-optimizer; else one pass after it).
  std::unique_ptr<OptimizerOverlap> overlapped;
  if (config.overlap_optimizer && !(ddp && !config.overlap))
    overlapped = std::make_unique<OptimizerOverlap>(
        model,
        ddp ? OptimizerOverlap::of_buckets(ddp->buckets()) : OptimizerOverlap::of_layers(shape),
        ddp.get());
  TimelineRecorder timeline_spans(!config.timeline.empty());
  std::unique_ptr<GpuTimeline> timeline;
  if (timeline_spans.on()) {
    timeline =
        std::make_unique<GpuTimeline>(model, shape.num_layers(), ddp ? ddp->buckets().size() : 0);
    model.set_forward_hook([&] { timeline->forward_done(); });
  }
  if (ddp || overlapped || timeline)
    model.set_layer_hook([&](int layer) {
      if (ddp) {
        const size_t before = ddp->issued();
        ddp->layer_done(layer);
        for (size_t b = before; timeline && b < ddp->issued(); ++b)
          timeline->bucket_issued(b);
      }
      if (timeline) timeline->layer_done(layer);
      if (overlapped) overlapped->layer_done(layer);
    });
  if (lead)
    spdlog::info("optimizer {}",
                 overlapped ? fmt::format("overlapped with backward ({} ranges on a side stream)",
                                          ddp ? ddp->buckets().size() : shape.num_layers())
                            : std::string("after backward"));
  if (!data_parallel && config.grad_reduce == GradReduce::kBf16 && lead)
    spdlog::warn("--grad-reduce bf16: one process and no --backend, so nothing is reduced");
  size_t free_bytes = 0, total_bytes = 0;
  DDP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t data_bytes =
      data.train.x.size() * sizeof(float) + data.train.y.size() * sizeof(int32_t);
  if (config.stage_from_host || data_bytes > free_bytes / 2) {
    DDP_USAGE_CHECK(
        micro_batches == 1,
        "--accumulate {}: the training set {} on the host{}, and host staging takes one "
        "batch a step; drop --accumulate (or --stage-from-host) or use --device cpu",
        micro_batches, config.stage_from_host ? "stays" : "must stay",
        config.stage_from_host ? " (--stage-from-host)"
                               : " (it does not fit in half "
                                 "the free device memory)");
    model.set_train_data_host(data.train);
    if (lead)
      spdlog::info(
          "training set ({:.1f} MiB) stays on the host; batches are staged through pinned memory",
          data_bytes / 1048576.0);
  } else {
    model.set_train_data(data.train);
  }
  if (data.test.n > 0) model.set_test_data(data.test);
  spdlog::info("memory at start: {}", model.memory_report());
  if (lead) spdlog::info("{}", model.epilogue_summary());

  MetricsWriter own_metrics = metrics_in != nullptr || config.metrics.empty() || !lead
                                  ? MetricsWriter()
                                  : MetricsWriter(config.metrics);
  MetricsWriter& metrics = metrics_in != nullptr ? *metrics_in : own_metrics;
  Sampler sampler(data.train.n, config.seed, config.shuffle);
  ProgressReporter progress(config, total_steps, data.train.n, &metrics);
  if (resumed) metrics.write({{"event", "resumed"}, {"step", done}});
  TrainResult result;
  const int chunk = options.max_schedule_steps;
  std::vector<int32_t> indices(static_cast<size_t>(chunk) * local_batch);
  std::vector<OptStep> steps(chunk);
  int64_t window_samples = 0;
  DeviceBuffer<double> window_buffer(3, MemoryCategory::kOther);
  // The GPU monitor's windows of every rank, gathered as a sum of rank-placed slots.
  DeviceBuffer<double> gpu_buffer(monitor ? static_cast<size_t>(ranks) * kGpuWindowFields : 1,
                                  MemoryCategory::kOther);
  std::set<std::string> gpu_warned;
  auto gather_gpu = [&](const GpuWindow& mine) {
    std::vector<double> all(static_cast<size_t>(ranks) * kGpuWindowFields, 0.0);
    pack_window(mine, &all[static_cast<size_t>(rank) * kGpuWindowFields]);
    sum_on_device(data_parallel ? comm : nullptr, model, gpu_buffer, all.data(), all.size());
    std::vector<GpuWindow> windows;
    for (int r = 0; r < ranks; ++r)
      windows.push_back(unpack_window(&all[static_cast<size_t>(r) * kGpuWindowFields]));
    return windows;
  };
  // Every rank holds the same weights, so every rank decides alike; nothing non-finite is
  // ever written over a good checkpoint or weights file.
  auto check_finite_params = [&](const char* before) {
    params.resize(shape.param_count());  // the host copy, made when first needed
    model.get_params(params.data());
    for (size_t i = 0; i < params.size(); ++i)
      DDP_CHECK(std::isfinite(params[i]),
                "after step {}: non-finite weight {} at index {} on rank {}; stopped before {} "
                "(lower --lr or check the data)",
                done, params[i], i, rank, before);
  };
  auto save = [&] {
    check_finite_params("writing the checkpoint (the previous one is kept)");
    if (lead) {
      Checkpoint c;
      c.step = done;
      c.optimizer_steps = done;
      c.optimizer = optimizer_name;
      c.batch_size = config.batch_size;
      c.settings = settings;
      c.params.resize(shape.param_count());
      model.get_params(c.params.data());
      c.optimizer_state = model.get_optimizer_state();
      save_checkpoint(config.checkpoint_dir, shape, c, config.keep_checkpoints);
      spdlog::info("checkpoint at step {} written to {}", done,
                   checkpoint_path(config.checkpoint_dir));
    }
    if (data_parallel) comm->barrier();
  };
  // With peers, every host wait on the stream is bounded: a dead or stopped rank makes the
  // others fail within --timeout with a message naming it, instead of hanging in a sync.
  std::unique_ptr<StepWatchdog> watchdog;
  if (data_parallel && ranks > 1)
    watchdog = std::make_unique<StepWatchdog>(model.stream(), config.timeout,
                                              abort_on_stall(
                                                  comm, [comm] { comm->abort(); }, config.timeout));
  auto wait_idle = [&] {
    if (watchdog) watchdog->wait_idle();
  };
  std::vector<int32_t> staged_indices(local_batch);
  auto stage = [&](int64_t step) {
    const BatchSlice slice = rank_slice(step, config.batch_size, rank, ranks);
    sampler.indices(slice.begin, slice.count, staged_indices.data());
    model.stage_batch(staged_indices.data());
  };
  if (model.host_staged() && done < total_steps) stage(done);
  if (monitor != nullptr) monitor->begin_training();
  while (done < total_steps) {
    // A chunk never crosses a logging or checkpoint boundary, so each window ends on a chunk.
    int64_t limit =
        std::min<int64_t>({chunk, total_steps - done, config.log_every - done % config.log_every});
    if (config.checkpoint_every > 0)
      limit = std::min<int64_t>(limit, config.checkpoint_every - done % config.checkpoint_every);
    if (config.eval_every > 0)
      limit = std::min<int64_t>(limit, config.eval_every - done % config.eval_every);
    const int n = static_cast<int>(limit);
    for (int k = 0; k < n; ++k) {
      const int64_t step = done + k;
      // Micro-batch j of step t is the j-th 1/accumulate of the global batch; this rank takes
      // its contiguous share of each, as on the CPU.
      for (int j = 0; j < micro_batches; ++j) {
        const BatchSlice slice = rank_slice(step, config.batch_size, rank, ranks, j, micro_batches);
        sampler.indices(slice.begin, slice.count,
                        indices.data() + static_cast<size_t>(k) * local_batch +
                            static_cast<size_t>(j) * micro_batch);
      }
      OptStep& s = steps[k];
      s.lr = lr_at(step, total_steps, config.lr, config.lr_schedule, config.warmup_steps);
      s.first = step == 0;
      const double t = static_cast<double>(step + 1);
      s.step_size = static_cast<float>(
          s.lr / (1.0 - std::pow(static_cast<double>(config.optimizer.beta1), t)));
      s.bc2_sqrt = static_cast<float>(
          std::sqrt(1.0 - std::pow(static_cast<double>(config.optimizer.beta2), t)));
    }
    model.upload_schedule(indices.data(), steps.data(), n);
    for (int k = 0; k < n; ++k) {
      if (ddp) ddp->begin_backward(model.device_grads());
      if (overlapped) overlapped->begin_step();
      if (timeline) timeline->step_begins();
      if (ddp || overlapped || timeline) {
        model.train_step([&] {
          if (ddp) {
            const size_t before = ddp->issued();
            ddp->end_backward();
            for (size_t b = before; timeline && b < ddp->issued(); ++b)
              timeline->bucket_issued(b);
            if (timeline) timeline->buckets_issued(*ddp);
          }
          if (overlapped)
            overlapped->end_backward();  // the updates, joined into the model's stream
          else if (ddp)
            ddp->finish(model.stream());  // the optimizer waits on the device for every bucket
        });
      } else {
        model.train_step();
      }
      if (timeline) timeline->step_ends(timeline_spans, done + k + 1);
      // Host staging: gather the next batch on the host while the GPU runs this one.
      if (watchdog) {
        watchdog->mark(done + k);
        watchdog->check();
      }
      if (model.host_staged() && done + k + 1 < total_steps) stage(done + k + 1);
      if (done + k == 0) {
        wait_idle();
        DDP_CUDA_CHECK(cudaStreamSynchronize(model.stream()));
        progress.first_step_done();
      }
    }
    done += n;
    window_samples += static_cast<int64_t>(n) * local_batch;
    wait_idle();  // before any synchronising call at the window's end
    if (done % config.log_every == 0 || done == total_steps) {
      const CudaMlp::Metrics m = model.take_metrics();
      double window[3] = {m.loss_sum, static_cast<double>(m.correct),
                          static_cast<double>(window_samples)};
      sum_on_device(data_parallel ? comm : nullptr, model, window_buffer, window, 3);
      DDP_CHECK(std::isfinite(window[0]),
                "steps up to {}: non-finite loss on rank {}; stopped before any checkpoint or "
                "weights were written (lower --lr or check the data)",
                done, rank);
      nlohmann::json gpu_fields;
      std::string gpu_note;
      if (monitor != nullptr) {
        const std::vector<GpuWindow> gpus = gather_gpu(monitor->take_window());
        if (lead) {
          for (const std::string& warning : gpu_warnings(gpus, &gpu_warned))
            spdlog::warn("{}", warning);
          gpu_fields = {{"gpu", gpu_windows_json(gpus)}};
          gpu_note = gpu_compact(gpus[0]);
        }
      }
      progress.window(done, window[0], static_cast<int64_t>(window[1]),
                      static_cast<int64_t>(window[2]), &result, gpu_fields, gpu_note);
      window_samples = 0;
    }
    if (config.eval_every > 0 && done % config.eval_every == 0 && data.test.n > 0) {
      // Every rank holds the same weights and the whole test split: the results agree.
      const CudaMlp::Eval e = model.evaluate_test();
      progress.evaluation(done, e.loss * static_cast<double>(e.samples),
                          std::llround(e.accuracy * static_cast<double>(e.samples)), e.samples);
    }
    if (!config.checkpoint_dir.empty() && config.checkpoint_every > 0 &&
        done % config.checkpoint_every == 0)
      save();
  }
  model.take_metrics();
  const double seconds = progress.seconds();
  result.steps = done;
  const CudaMlp::Eval eval = model.evaluate_test();
  result.test.loss = eval.loss;
  result.test.accuracy = eval.accuracy;
  result.test.samples = eval.samples;
  progress.finish(seconds, &result);
  if (monitor != nullptr) {
    const std::vector<GpuWindow> gpus = gather_gpu(monitor->whole_run());
    if (lead) {
      spdlog::info("GPUs over the run (NVML, every {:.1f}s):", monitor->period_s());
      for (const std::string& line : gpu_summary_table(gpus))
        spdlog::info("  {}", line);
      metrics.write({{"event", "gpu_summary"}, {"gpu", gpu_windows_json(gpus)}});
    }
  }
  spdlog::info("memory at end: {}", model.memory_report());
  if (metrics.enabled())
    metrics.write({{"event", "memory"},
                   {"report", model.memory_report()},
                   {"held_bytes", memory_ledger().total()}});
  if (!config.checkpoint_dir.empty() &&
      (config.checkpoint_every == 0 || done % config.checkpoint_every != 0))
    save();
  if (timeline) {
    const std::vector<std::vector<Span>> all = gather_spans_on_gpu(comm, timeline_spans.spans());
    if (lead) {
      std::vector<std::string> names;
      for (int r = 0; r < ranks; ++r)
        names.push_back(fmt::format("rank {} GPU", r));
      write_chrome_trace(config.timeline, all, names);
      spdlog::info("timeline of {} ranks written to {} (open it in https://ui.perfetto.dev)", ranks,
                   config.timeline);
    }
  }
  if (!config.save_weights.empty()) check_finite_params("writing --save-weights");
  params.resize(shape.param_count());
  model.get_params(params.data());
  if (!config.save_weights.empty() && lead) {
    save_mlp_weights(config.save_weights, shape, params.data());
    spdlog::info("weights written to {}", config.save_weights);
  }
  if (final_params != nullptr) *final_params = params;
  return result;
}

}  // namespace ddp
