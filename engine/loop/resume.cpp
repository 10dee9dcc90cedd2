// run_settings and resume_runner.
#include "engine/loop/resume.h"

#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "runtime/error.h"

namespace ddp {

RunSettings run_settings(const TrainConfig& config, int64_t total_steps, int world_size) {
  RunSettings s;
  s.seed = config.seed;
  s.lr = config.lr;
  s.total_steps = total_steps;
  s.lr_schedule = schedule_name(config.lr_schedule);
  s.world_size = world_size;
  s.data = data_name(config.data);
  const bool synthetic = config.data == DataSource::kSynthetic;
  s.synthetic_samples = synthetic ? config.synthetic_samples : 0;
  s.shuffle = config.shuffle;
  s.data_dir = synthetic ? "" : config.data_dir;
  s.momentum = config.optimizer.momentum;
  s.weight_decay = config.optimizer.weight_decay;
  s.warmup_steps = config.warmup_steps;
  return s;
}

int64_t resume_runner(const TrainConfig& config, const RankStages& stages,
                      const RunSettings& settings, StageRunner& runner, bool lead) {
  const std::string path = checkpoint_path(config.checkpoint_dir);
  const std::vector<std::string> candidates = resume_candidates(config.checkpoint_dir);
  if (candidates.empty()) {
    if (lead) spdlog::info("no checkpoint at {}: starting afresh", path);
    return -1;
  }
  // The newest file that loads; where the first fails (corrupt, truncated), an older step
  // file is used, saying so; where none does, the first one's error stands.
  std::optional<Checkpoint> loaded;
  std::string first_error, from;
  for (const std::string& candidate : candidates) {
    try {
      loaded = load_checkpoint(candidate, stages.shape(), config.optimizer.kind, config.batch_size,
                               settings);
    } catch (const UsageError& e) {
      if (first_error.empty()) first_error = e.what();
      continue;
    }
    from = candidate;
    if (lead && !first_error.empty())
      spdlog::warn("{}; resuming from the newest intact checkpoint, {} (step {})", first_error,
                   candidate, loaded->step);
    break;
  }
  if (!loaded) throw UsageError(first_error);
  const Checkpoint& c = *loaded;
  if (lead && !c.changed.empty())
    spdlog::warn("resuming with changed settings (allowed): {}",
                 fmt::format("{}", fmt::join(c.changed, "; ")));
  runner.set_params(stages.take(c.params.data()).data());
  NamedState state;
  for (const auto& [name, values] : c.optimizer_state)
    state.emplace_back(name, stages.take(values.data()));
  runner.set_optimizer_state(state, c.optimizer_steps);
  if (lead) spdlog::info("resumed from {} at step {}", from, c.step);
  return c.step;
}

}  // namespace ddp
