// What the trainer reports and gathers over the ranks (each function collective over
// `world` or `pipe`, host buffers: the trainer passes its host views of device
// communicators): the pipeline's busy and idle time per window, the --timeline file, every
// rank's GPU monitor window, and the whole model's weights and optimizer state on rank 0.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "engine/config.h"
#include "engine/pipeline/executor.h"
#include "engine/pipeline/schedule.h"
#include "engine/pipeline/simulate.h"
#include "engine/runners/stage_runner.h"
#include "engine/telemetry/gpu_monitor.h"
#include "engine/telemetry/metrics.h"
#include "engine/telemetry/timeline.h"

namespace ddp {

// The whole model's parameters and optimizer state on rank 0 (`lead`; empty elsewhere):
// with a pipeline, replica 0's pipeline ranks send theirs (all their stages) to rank 0 over
// `pipe`, in rank order.
void gather_whole_model(StageRunner& runner, const PipelineLayout& layout, const RankStages& stages,
                        Communicator* pipe, bool lead, std::vector<float>* params,
                        NamedState* state);

// Every stage's busy and idle time over a window of `steps` steps (this rank's busy_s and
// step_s), logged and written to `metrics` by rank 0, beside two predictions of the
// simulator: from this window's measured compute of each action kind on each rank (`costs`,
// where the host's clock measured them: the CPU), with free transfers, so that a bubble
// above it is the machine's (transfers, contention), and the schedule's ideal (equal stages,
// F = B = W = 1).
void write_pipeline_record(MetricsWriter& metrics, Communicator* world,
                           const PipelineLayout& layout, int micro_batches,
                           PipelineSchedule schedule, bool recompute, bool lead, bool quiet,
                           int64_t step, int64_t steps, double busy_s, double step_s,
                           const ComputeCosts& costs);

// The simulator's run of one step of `schedule` on `layout` with every rank's costs (per
// pipeline rank), free transfers: its bubble and step time (ok false when it cannot run them).
// Pure.
SimResult simulate_layout(PipelineSchedule schedule, const PipelineLayout& layout,
                          int micro_batches, const std::vector<SimCosts>& costs);

// The first step's data-parallel events (buckets issued and reduced, layer by layer), as the
// `ddp_timeline` record.
void write_ddp_timeline(MetricsWriter& metrics, const Reducer& ddp, int64_t step);

// Every rank's spans in one Chrome trace at `path`, written by rank 0.
void write_timeline(const TimelineRecorder& timeline, Communicator* world,
                    const PipelineLayout& layout, bool gpu, bool lead, const std::string& path);

// Every rank's GPU monitor window, at every rank.
std::vector<GpuWindow> gather_gpu_windows(Communicator* world, const GpuWindow& mine);

// The end of a run's records: with a pipeline, `pipeline_summary` (every rank's most
// micro-batches held, `peak_live` here, and their bytes where the runner counts them;
// collective over `world`); the runner's memory line and `memory` record (where it has one).
void write_end_reports(MetricsWriter& metrics, Communicator* world, const PipelineLayout& layout,
                       const TrainConfig& config, int micro_batches, int64_t peak_live,
                       StageRunner& runner);
// The GPUs over the whole run (every rank's monitor, collective over `world`): rank 0 logs a
// table and writes `gpu_summary`.
void write_gpu_summary(MetricsWriter& metrics, Communicator* world, GpuMonitor& monitor, bool lead);

// A logging window's GPU figures (every rank's monitor, collective over `world`; none
// without a monitor): rank 0 warns of each cause once (`warned`), and gets the metrics
// fields and the progress line's note.
struct GpuWindowReport {
  nlohmann::json fields;
  std::string note;
};
GpuWindowReport report_gpu_window(Communicator* world, GpuMonitor* monitor, bool lead,
                                  std::set<std::string>* warned);

}  // namespace ddp
