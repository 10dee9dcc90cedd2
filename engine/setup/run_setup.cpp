// What a run checks and loads before its trainer starts: the data set, the model against
// it, the rank layout, the outputs, the memory the flags ask for.
#include "engine/setup/run_setup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include <spdlog/spdlog.h>
#include "runtime/checksum.h"

#include "engine/pipeline/lanes.h"
#include "models/safetensors.h"
#include "runtime/error.h"

namespace ddp {

RunnerOptions runner_options(const TrainConfig& config) {
  RunnerOptions options;
  options.sync = sync_options(config);
  options.step.cuda_graph = config.cuda_graph;
  options.step.sync_debug = config.sync_debug;
  options.step.fused_step = config.fused_step;
  options.step.fused_step_force = config.fused_step_force;
  options.step.fused_epilogues = config.fused_epilogues;
  options.step.product_sms = config.product_sms;
  options.step.weight_grad_stream = config.weight_grad_stream;
  options.step.overlap_optimizer = config.overlap_optimizer;
  options.step.timeline = !config.timeline.empty();
  options.optimizer = config.optimizer;
  options.lr = config.lr;
  options.precision = config.precision;
  options.recompute = config.recompute;
  options.split_backward = config.pp > 1 && splits_backward(config.schedule);
  options.accumulate = config.accumulate;
  options.seed = config.seed;
  options.init_weights = config.init_weights;
  options.autotune = config.autotune;
  options.cache_dir = config.cache_dir;
  options.stage_from_host = config.stage_from_host;
  options.log_every = config.log_every;
  options.timeout = config.timeout;
  return options;
}

Dataset load_dataset(const TrainConfig& config) {
  if (config.data == DataSource::kFashion) return load_fashion_mnist(config.data_dir);
  if (config.data == DataSource::kNpy) return load_npy_dataset(config.data_dir);
  const MlpShape shape = parse_layers(config.layers);
  return make_synthetic(config.synthetic_samples,
                        std::max<int64_t>(1, config.synthetic_samples / 5), shape.input_width(),
                        shape.num_classes(), config.seed);
}

void check_model_fits_data(const MlpShape& shape, const TrainConfig& config, const Dataset& data) {
  DDP_USAGE_CHECK(shape.input_width() == data.train.dim,
                  "--layers {}: the first width is {} but the {} data has {} features per sample",
                  config.layers, shape.input_width(), data.name, data.train.dim);
  // A label past the model's classes is named where it is, not only as a class count.
  for (const Split* split : {&data.train, &data.test})
    for (int64_t i = 0; i < split->n && !split->labels_file.empty(); ++i)
      DDP_USAGE_CHECK(split->y[i] < shape.num_classes(),
                      "{}: label {} at index {} is out of range for --layers {} (its last width "
                      "{} means labels 0 to {})",
                      split->labels_file, split->y[i], i, config.layers, shape.num_classes(),
                      shape.num_classes() - 1);
  DDP_USAGE_CHECK(shape.num_classes() >= data.classes,
                  "--layers {}: the last width is {} but the {} data has {} classes", config.layers,
                  shape.num_classes(), data.name, data.classes);
}

int local_batch_of(const TrainConfig& config, int micro_batches, int replicas) {
  const char* micro_flag = config.pp > 1 ? "--micro-batches" : "--accumulate";
  DDP_USAGE_CHECK(config.batch_size % micro_batches == 0,
                  "--batch-size {} is not divisible by {} {}", config.batch_size, micro_flag,
                  micro_batches);
  const int micro = config.batch_size / micro_batches;
  DDP_USAGE_CHECK(
      micro % replicas == 0,
      "--batch-size {}: the global batch{} must divide among the {} data-parallel ranks (try {})",
      config.batch_size,
      micro_batches > 1 ? fmt::format(" / {} {}", micro_flag, micro_batches) : "", replicas,
      (micro / replicas + 1) * replicas * micro_batches);
  return micro / replicas;
}

StageSpec stage_cut(const TrainConfig& config, int replicas) {
  StageSpec cut;
  cut.shape = parse_layers(config.layers);
  cut.micro_batches = micro_batches_of(config);
  cut.replicas = replicas;
  cut.batch = local_batch_of(config, cut.micro_batches, replicas);
  cut.max_batch = std::max(cut.batch, std::min(config.batch_size, 1024));
  return cut;
}

RankGroups make_rank_groups(Communicator* world, const PipelineLayout& layout, bool gpu,
                            bool layer_gathers) {
  RankGroups g;
  g.world = world;
  if (world != nullptr && world->device_buffers()) g.host_world = make_host_staged(*world);
  const auto split_gathers = [&] {
    Communicator* replicas = g.replicas();
    if (layer_gathers && gpu && layout.replicas > 1 && replicas != nullptr)
      g.gathers = replicas->split(0, replicas->rank());
  };
  if (layout.stages == 1) {
    split_gathers();
    return g;
  }
  g.pipe = world->split(layout.replica, layout.stage);
  // Gradients on a communicator of their own: the GPU's queues never wait behind each
  // other, and with several stages a rank (whose transfers to one peer carry both flows)
  // each flow's messages match in order.
  if (gpu || layout.chunks() > 1) g.grad = world->split(layout.replica, layout.stage);
  if (layout.replicas > 1) g.dp = world->split(layout.stage, layout.replica);
  if (g.pipe->device_buffers()) g.host_pipe = make_host_staged(*g.pipe);
  // NCCL's queues with several stages a rank: a lane a flow, direction and peer.
  if (gpu && layout.chunks() > 1) {
    PipelineLaneComms lanes = split_lanes(*world, layout.replica, layout.stage, layout.stage_rank);
    g.lane_comms = std::move(lanes.comms);
    g.lanes = std::move(lanes.by_flow);
  }
  split_gathers();
  return g;
}

std::function<void()> RankGroups::abort_all() const {
  std::vector<Communicator*> all{world, pipe.get(), grad.get(), dp.get(), gathers.get()};
  for (const auto& c : lane_comms)
    all.push_back(c.get());
  return [all] {
    for (Communicator* c : all)
      if (c != nullptr) c->abort();
  };
}

void check_replicas_agree(Communicator& replicas, const float* params, size_t count, int64_t step,
                          const PipelineLayout& layout) {
  const int64_t mine = params_checksum(params, count);
  std::vector<int64_t> all(replicas.size());
  replicas.all_gather(&mine, all.data(), 1, DataType::kInt64);
  for (int r = 0; r < replicas.size(); ++r)
    DDP_CHECK(all[r] == all[0],
              "--check-replicas: after step {} replica {} holds different weights than replica "
              "0{} (checksums {:08x} and {:08x})",
              step, r,
              layout.stages > 1 ? fmt::format(" in stage {}", layout.stage) : std::string(),
              static_cast<uint32_t>(all[r]), static_cast<uint32_t>(all[0]));
}

void check_skipped_steps(const TrainConfig& config, int64_t skipped, int64_t steps, int64_t step) {
  const int64_t limit =
      config.max_skipped_steps >= 0 ? config.max_skipped_steps : config.log_every / 10;
  if (skipped <= limit) return;
  throw NonFiniteError(fmt::format(
      "steps up to {}: {} of the last {} steps were skipped (non-finite gradients), more than "
      "--max-skipped-steps {}; stopped before any checkpoint or weights were written (lower --lr "
      "or check the data)",
      step, skipped, steps, limit));
}

StageSpec whole_model_spec(const TrainConfig& config, int replicas) {
  StageSpec spec = stage_cut(config, replicas);
  spec.first = 0;
  spec.end = spec.shape.num_layers();
  return spec;
}

PipelineLayout layout_of(const TrainConfig& config, int world, int rank) {
  const MlpShape shape = parse_layers(config.layers);
  const int chunks = config.pp > 1
                         ? schedule_chunks(config.schedule, config.virtual_stages, config.pp,
                                           shape.num_layers(), micro_batches_of(config))
                         : 1;
  std::vector<int> bounds;
  if (!config.partition.empty()) {
    bounds = parse_partition(config.partition, shape.num_layers());
  } else {
    std::vector<double> flops;  // a layer's multiply-adds per sample
    for (int i = 0; i < shape.num_layers(); ++i)
      flops.push_back(static_cast<double>(shape.layer(i).in) * shape.layer(i).out);
    // One stage a rank: each stage balanced; several: what each rank holds balanced.
    bounds = chunks == 1
                 ? partition_by_cost(flops, config.pp)
                 : partition_for_ranks(flops, stage_ranks(config.schedule, config.pp, chunks));
  }
  DDP_USAGE_CHECK(config.dp == 0 || config.dp * config.pp == world,
                  "--dp {} --pp {}: the world has {} rank{}, not dp x pp = {} (give --dp {}, or "
                  "start {} ranks)",
                  config.dp, config.pp, world, world == 1 ? "" : "s", config.dp * config.pp,
                  world % config.pp == 0 ? std::to_string(world / config.pp) : "0",
                  config.dp * config.pp);
  return plan_layout(world, rank, config.pp, std::move(bounds),
                     stage_ranks(config.schedule, config.pp, chunks));
}

namespace {

// Creates and removes a scratch file in `dir`; false when that fails.
bool folder_takes_files(const std::string& dir) {
  std::string pattern = (dir.empty() ? std::string(".") : dir) + "/.ddp-write-test-XXXXXX";
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(pattern.c_str());
  return true;
}

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void check_outputs_writable(const TrainConfig& config) {
  const std::pair<const char*, std::string> outputs[] = {{"--save-weights", config.save_weights},
                                                         {"--metrics", config.metrics},
                                                         {"--timeline", config.timeline}};
  for (size_t i = 0; i < std::size(outputs); ++i)
    for (size_t j = i + 1; j < std::size(outputs); ++j) {
      const auto& [flag_a, a] = outputs[i];
      const auto& [flag_b, b] = outputs[j];
      struct stat sa {
      }, sb{};
      const bool same_file = ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 &&
                             sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
      DDP_USAGE_CHECK(a.empty() || b.empty() || (a != b && !same_file),
                      "{} {} and {} {}: the same file; each output needs its own path", flag_a, a,
                      flag_b, b);
    }
  for (const auto& [flag, path] : outputs) {
    if (path.empty()) continue;
    struct stat info {};
    DDP_USAGE_CHECK(::stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode),
                    "{} {}: is a folder; expected a file path", flag, path);
    DDP_USAGE_CHECK(folder_takes_files(folder_of(path)),
                    "{} {}: cannot create files in {} ({}); checked before training", flag, path,
                    folder_of(path), std::strerror(errno));
  }
  if (!config.checkpoint_dir.empty()) {
    // mkdir's own error (a read-only filesystem, a missing parent) is the one to name.
    DDP_USAGE_CHECK(::mkdir(config.checkpoint_dir.c_str(), 0755) == 0 || errno == EEXIST,
                    "--checkpoint-dir {}: cannot create it ({}); checked before training",
                    config.checkpoint_dir, std::strerror(errno));
    DDP_USAGE_CHECK(folder_takes_files(config.checkpoint_dir),
                    "--checkpoint-dir {}: cannot create files there ({}); checked before training",
                    config.checkpoint_dir, std::strerror(errno));
  }
}

MemoryNeed estimate_memory(const TrainConfig& config) {
  const MlpShape shape = parse_layers(config.layers);
  MemoryNeed need;
  // A stage holds about its share of the layers; the whole model without a pipeline.
  const double params = static_cast<double>(shape.param_count()) / config.pp;
  const double states = config.optimizer.kind == OptimizerKind::kAdamW ? 2
                        : config.optimizer.momentum > 0                ? 1
                                                                       : 0;
  // Parameters, gradients and optimizer state in float32 (and the bf16 copy).
  need.model_bytes =
      params * 4 * (2 + states) + (config.precision == Precision::kBf16 ? params * 2 : 0);
  double widths = 0;
  for (int w : shape.widths())
    widths += w;
  const int micro = micro_batches_of(config);
  const double batch = static_cast<double>(config.batch_size) / micro;
  // Each layer's output and its gradient, for the micro-batches a stage holds at once.
  const double live = config.pp > 1 ? std::min(micro, config.pp) : 1;
  // --recompute: the inputs of those, and one micro-batch's outputs and gradients.
  need.activation_bytes = config.recompute
                              ? batch * shape.input_width() * 4 * live + batch * widths * 4 * 2
                              : batch * widths * 4 * 2 * live;
  if (config.data == DataSource::kSynthetic) {
    const double samples =
        config.synthetic_samples + std::max<int64_t>(1, config.synthetic_samples / 5);
    need.data_bytes = samples * (shape.input_width() + 1) * 4;
  }
  return need;
}

namespace {
std::string gib(double bytes) {
  return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024));
}
}  // namespace

void check_memory_fits(const TrainConfig& config, const MemoryNeed& need, double available,
                       const std::string& where) {
  if (available <= 0 || need.total() <= available) return;
  const std::pair<double, const char*> parts[] = {{need.model_bytes, "--layers"},
                                                  {need.activation_bytes, "--batch-size"},
                                                  {need.data_bytes, "--synthetic-samples"}};
  const auto* largest = std::max_element(std::begin(parts), std::end(parts));
  throw UsageError(fmt::format(
      "{} {}: this run needs about {} ({} parameters, gradients and optimizer state, {} "
      "activations, {} data) but {} has {}; checked before allocating",
      largest->second,
      largest->second == std::string("--layers")       ? config.layers
      : largest->second == std::string("--batch-size") ? std::to_string(config.batch_size)
                                                       : std::to_string(config.synthetic_samples),
      gib(need.total()), gib(need.model_bytes), gib(need.activation_bytes), gib(need.data_bytes),
      where, gib(available)));
}

double available_host_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;  // unknown: not checked
}

}  // namespace ddp
