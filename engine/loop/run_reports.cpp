// What the trainer reports and gathers over the ranks: the pipeline's window record, the
// timeline file, the GPU monitor's windows, and the whole model on rank 0.
#include "engine/loop/run_reports.h"

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "collectives/communicator.h"
#include "runtime/error.h"

namespace ddp {

void gather_whole_model(StageRunner& runner, const PipelineLayout& layout, const RankStages& stages,
                        Communicator* pipe, bool lead, std::vector<float>* params,
                        NamedState* state) {
  // Every rank asks: with --zero the state (and with --zero 3 the parameters) is gathered
  // over the data-parallel group.
  NamedState named = runner.optimizer_state();
  std::vector<float> mine = runner.get_params();
  if (layout.stages == 1) {
    if (!lead) return;
    *params = std::move(mine);
    *state = std::move(named);
    return;
  }
  if (layout.replica != 0) return;  // replicas hold the same weights as replica 0
  // Replica 0's pipeline ranks send their parameters and state to rank 0, in rank order.
  if (layout.stage > 0) {
    pipe->send(mine.data(), mine.size(), DataType::kFloat32, 0);
    for (const auto& entry : named)
      pipe->send(entry.second.data(), mine.size(), DataType::kFloat32, 0);
    return;
  }
  const MlpShape& shape = stages.shape();
  params->assign(shape.param_count(), 0.0f);
  stages.put(mine.data(), params->data());
  for (const auto& [name, values] : named) {
    state->emplace_back(name, std::vector<float>(shape.param_count()));
    stages.put(values.data(), state->back().second.data());
  }
  for (int r = 1; r < layout.stages; ++r) {
    const RankStages theirs = rank_stages(layout, r, stages.chunks.front());
    std::vector<float> buffer(theirs.param_count());
    pipe->recv(buffer.data(), buffer.size(), DataType::kFloat32, r);
    theirs.put(buffer.data(), params->data());
    for (auto& entry : *state) {
      pipe->recv(buffer.data(), buffer.size(), DataType::kFloat32, r);
      theirs.put(buffer.data(), entry.second.data());
    }
  }
}

SimResult simulate_layout(PipelineSchedule schedule, const PipelineLayout& layout,
                          int micro_batches, const std::vector<SimCosts>& costs) {
  return simulate_schedule(plan_all_ranks(schedule, layout.stages, micro_batches, layout.chunks()),
                           layout.stage_rank, costs);
}

void write_pipeline_record(MetricsWriter& metrics, Communicator* world,
                           const PipelineLayout& layout, int micro_batches,
                           PipelineSchedule schedule, bool recompute, bool lead, bool quiet,
                           int64_t step, int64_t steps, double busy_s, double step_s,
                           const ComputeCosts& costs) {
  const int ranks = world ? world->size() : 1;
  // Every rank's compute and step time over the window and its compute by kind, gathered so
  // that every stage's share is known; the bubble is the mean idle fraction.
  constexpr int kFields = 10;
  double mine[kFields] = {busy_s, step_s};
  for (int k = 0; k < 4; ++k) {
    mine[2 + k] = costs.seconds[k];
    mine[6 + k] = static_cast<double>(costs.count[k]);
  }
  std::vector<double> all(kFields * static_cast<size_t>(ranks));
  world->all_gather(mine, all.data(), kFields, DataType::kFloat64);
  if (!lead) return;
  nlohmann::json busy = nlohmann::json::array();
  nlohmann::json idle = nlohmann::json::array();
  std::string busy_text;
  double idle_sum = 0;
  double longest = 0;  // the slowest stage's window
  std::vector<SimCosts> measured(layout.stages);
  bool all_measured = true;
  for (int s = 0; s < layout.stages; ++s) {
    double b = 0, t = 0;
    double kind_s[4] = {0, 0, 0, 0}, kind_n[4] = {0, 0, 0, 0};
    for (int d = 0; d < layout.replicas; ++d) {
      const double* r = &all[kFields * static_cast<size_t>(layout.rank_of(s, d))];
      b += r[0];
      t += r[1];
      for (int k = 0; k < 4; ++k) {
        kind_s[k] += r[2 + k];
        kind_n[k] += r[6 + k];
      }
    }
    longest = std::max(longest, t / layout.replicas);
    const double fraction = t > 0 ? b / t : 0;
    busy.push_back(b / layout.replicas);
    idle.push_back((t - b) / layout.replicas);
    idle_sum += 1 - fraction;
    busy_text += fmt::format("{}{:.0f}%", s ? " " : "", 100 * fraction);
    // The mean cost of each kind on this pipeline rank (over its replicas and stages).
    const auto mean = [&](int k) { return kind_n[k] > 0 ? kind_s[k] / kind_n[k] : 0.0; };
    all_measured = all_measured && kind_n[0] > 0;
    measured[s].forward = mean(0);
    measured[s].backward = mean(1);
    measured[s].backward_input = mean(2);
    measured[s].backward_weight = mean(3);
    measured[s].lane_per_direction = measured[s].lane_per_peer = true;
  }
  const double bubble = idle_sum / layout.stages;
  SimCosts unit;
  unit.forward = unit.backward_input = unit.backward_weight = 1;
  unit.backward = 2;
  unit.lane_per_direction = unit.lane_per_peer = true;
  unit.recompute = recompute;  // the measured costs hold the forwards run again already
  const SimResult equal =
      simulate_layout(schedule, layout, micro_batches, std::vector<SimCosts>(layout.stages, unit));
  const double ideal = equal.ok ? equal.bubble : -1;
  // From the window's measured costs: the bubble, and the step time the schedule would take
  // with free transfers (what a step on fast links should come within a few percent of).
  SimResult from_costs;
  if (all_measured) from_costs = simulate_layout(schedule, layout, micro_batches, measured);
  const double simulated = from_costs.ok ? from_costs.bubble : -1;
  if (!quiet)
    spdlog::info("pipeline: bubble {:.1f}% ({}ideal {:.1f}%), stages busy {}", 100 * bubble,
                 simulated >= 0
                     ? fmt::format("simulated from measured costs {:.1f}%, ", 100 * simulated)
                     : std::string(),
                 100 * ideal, busy_text);
  nlohmann::json record = {{"event", "pipeline"},
                           {"step", step},
                           {"stages", layout.stages},
                           {"chunks", layout.chunks()},
                           {"micro_batches", micro_batches},
                           {"schedule", schedule_name(schedule)},
                           {"busy_s", busy},
                           {"idle_s", idle},
                           {"bubble", bubble},
                           {"ideal_bubble", ideal},
                           {"steps", steps},
                           {"step_s", steps > 0 ? longest / static_cast<double>(steps) : 0.0}};
  if (simulated >= 0) {
    record["simulated_bubble"] = simulated;
    record["simulated_step_s"] = from_costs.step_time;
  }
  metrics.write(record);
}

void write_ddp_timeline(MetricsWriter& metrics, const Reducer& ddp, int64_t step) {
  if (!metrics.enabled()) return;
  nlohmann::json events = nlohmann::json::array();
  for (const DdpEvent& e : ddp.events())
    events.push_back({{"what", e.what}, {"layer", e.layer}, {"bucket", e.bucket}});
  metrics.write({{"event", "ddp_timeline"},
                 {"step", step},
                 {"buckets", ddp.buckets().size()},
                 {"events", events}});
}

void write_timeline(const TimelineRecorder& timeline, Communicator* world,
                    const PipelineLayout& layout, bool gpu, bool lead, const std::string& path) {
  const int ranks = world ? world->size() : 1;
  if (timeline.dropped() > 0)
    spdlog::warn("--timeline: kept the first {} spans, {} more not recorded",
                 timeline.spans().size(), timeline.dropped());
  const std::vector<std::vector<Span>> all = gather_spans(world, timeline.spans());
  if (!lead) return;
  std::vector<std::string> names;
  for (int r = 0; r < ranks; ++r) {
    const int stage = r / layout.replicas;
    names.push_back(layout.stages > 1 ? fmt::format("rank {} (stage {}, replica {})", r, stage,
                                                    r % layout.replicas)
                    : gpu             ? fmt::format("rank {} GPU", r)
                                      : fmt::format("rank {}", r));
  }
  write_chrome_trace(path, all, names);
  spdlog::info("timeline of {} ranks written to {} (open it in https://ui.perfetto.dev)", ranks,
               path);
}

std::vector<GpuWindow> gather_gpu_windows(Communicator* world, const GpuWindow& mine) {
  const int ranks = world ? world->size() : 1;
  const int rank = world ? world->rank() : 0;
  // Every rank's window in its own slot; a sum over the world gathers them.
  std::vector<double> all(static_cast<size_t>(ranks) * kGpuWindowFields, 0.0);
  pack_window(mine, &all[static_cast<size_t>(rank) * kGpuWindowFields]);
  sum_over_ranks(world, all.data(), all.size());
  std::vector<GpuWindow> windows;
  for (int r = 0; r < ranks; ++r)
    windows.push_back(unpack_window(&all[static_cast<size_t>(r) * kGpuWindowFields]));
  return windows;
}

void write_end_reports(MetricsWriter& metrics, Communicator* world, const PipelineLayout& layout,
                       const TrainConfig& config, int micro_batches, int64_t peak_live,
                       StageRunner& runner) {
  if (layout.stages > 1) {
    const int ranks = world->size();
    const int64_t mine[2] = {peak_live, runner.peak_activation_bytes()};
    std::vector<int64_t> all(2 * static_cast<size_t>(ranks));
    world->all_gather(mine, all.data(), 2, DataType::kInt64);
    std::vector<int64_t> peaks, bytes;
    for (int r = 0; r < ranks; ++r) {
      peaks.push_back(all[2 * r]);
      bytes.push_back(all[2 * r + 1]);
    }
    metrics.write({{"event", "pipeline_summary"},
                   {"stages", layout.stages},
                   {"replicas", layout.replicas},
                   {"micro_batches", micro_batches},
                   {"schedule", schedule_name(config.schedule)},
                   {"layout", describe_layout(layout)},
                   {"recompute", config.recompute},
                   {"peak_live_activations", peaks},
                   {"peak_activation_bytes", bytes}});
  }
  const std::string memory = runner.memory_report();
  if (memory.empty()) return;
  spdlog::info("memory at end: {}", memory);
  if (!metrics.enabled()) return;
  nlohmann::json held = nlohmann::json::object();
  for (const auto& [kind, bytes] : runner.held_by_kind())
    held[kind] = bytes;
  metrics.write({{"event", "memory"},
                 {"report", memory},
                 {"held_bytes", runner.held_bytes()},
                 {"held", held}});
}

void write_gpu_summary(MetricsWriter& metrics, Communicator* world, GpuMonitor& monitor,
                       bool lead) {
  const std::vector<GpuWindow> gpus = gather_gpu_windows(world, monitor.whole_run());
  if (!lead) return;
  spdlog::info("GPUs over the run (NVML, every {:.1f}s):", monitor.period_s());
  for (const std::string& line : gpu_summary_table(gpus))
    spdlog::info("  {}", line);
  metrics.write({{"event", "gpu_summary"}, {"gpu", gpu_windows_json(gpus)}});
}

GpuWindowReport report_gpu_window(Communicator* world, GpuMonitor* monitor, bool lead,
                                  std::set<std::string>* warned) {
  GpuWindowReport report;
  if (monitor == nullptr) return report;
  const std::vector<GpuWindow> gpus = gather_gpu_windows(world, monitor->take_window());
  if (!lead) return report;
  for (const std::string& warning : gpu_warnings(gpus, warned))
    spdlog::warn("{}", warning);
  report.fields = {{"gpu", gpu_windows_json(gpus)}};
  report.note = gpu_compact(gpus[0]);
  return report;
}

}  // namespace ddp
