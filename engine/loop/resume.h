// What a checkpoint records of the run besides the model, and a runner started from the
// newest intact checkpoint of --checkpoint-dir (--resume).
#pragma once

#include <cstdint>

#include "engine/config.h"
#include "engine/loop/checkpoint.h"
#include "engine/runners/stage_runner.h"

namespace ddp {

// What a checkpoint records of the run besides the model (what --resume checks).
RunSettings run_settings(const TrainConfig& config, int64_t total_steps, int world_size);

// --resume: the latest checkpoint of config.checkpoint_dir (the whole model, so any layout
// resumes from it) into `runner`'s stages; its step, or -1 when there is none (said by rank
// 0, `lead`, with the changed settings it allows).
int64_t resume_runner(const TrainConfig& config, const RankStages& stages,
                      const RunSettings& settings, StageRunner& runner, bool lead);

}  // namespace ddp
