// The runners' own options, translated from ddptrain's flags once at the edge
// (runner_options in engine/config.h), so that neither runner, the GPU's step hooks nor the
// fused step reads the whole TrainConfig: gradient sync's (SyncOptions), the step's (how the
// GPU carries a step out) and the runner's (the model's numbers, its first weights, time
// limits).
#pragma once

#include <cstdint>
#include <string>

#include "dist/sync_options.h"
#include "models/mlp.h"
#include "models/optimizer.h"
#include "models/precision.h"

namespace ddp {

// How the GPU carries out a step: a CUDA graph or eagerly, the fused step, the products'
// epilogues and SMs, the weight gradients' stream, the optimizer overlapped with backward,
// the per-layer spans of the timeline (--cuda-graph, --sync-debug, --fused-step,
// --fused-epilogues, --product-sms, --weight-grad-stream, --overlap-optimizer, --timeline).
struct StepOptions {
  bool cuda_graph = true;
  bool sync_debug = false;  // eager, the device checked after every kernel
  bool fused_step = false;  // asked for (--autotune may also try it)
  bool fused_step_force = false;
  bool fused_epilogues = true;
  int product_sms = 0;  // 0: all
  WeightGradStream weight_grad_stream = WeightGradStream::kAuto;
  bool overlap_optimizer = false;
  bool timeline = false;  // a trace is written: the GPU records its layers' spans
};

// What a runner (CPU or GPU) is asked to do besides its stages' shapes (RankStages).
struct RunnerOptions {
  SyncOptions sync;  // gradient sync's
  StepOptions step;  // the GPU's
  OptimizerConfig optimizer;
  float lr = 0.05f;  // the base learning rate (the fused step's trial)
  Precision precision = Precision::kFp32;
  bool recompute = false;        // forward a micro-batch again for its backward
  bool split_backward = false;   // backward in two halves (the zero-bubble schedules)
  int accumulate = 1;            // micro-steps per optimizer step
  uint64_t seed = 0;             // the first weights' (without init_weights)
  std::string init_weights;      // a file of the first weights, or empty
  bool autotune = false;         // the GPU times candidate algorithms (and the fused step)
  std::string cache_dir;         // where the autotuned choices are kept
  bool stage_from_host = false;  // the GPU's training set stays on the host
  int log_every = 100;           // steps a logging window (the whole model's chunk of steps)
  double timeout = 300;          // seconds a step may take with peers
};

}  // namespace ddp
