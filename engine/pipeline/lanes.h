// The pipeline's communicators, made the same way for ddptrain and ddp::Pipeline: a lane a flow,
// direction and peer (pipeline_lanes, the simulator's lanes), the lanes of one number on one
// communicator of the pipeline's ranks.
#pragma once

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "collectives/communicator.h"

namespace ddp {

// The lanes' communicators and, for each flow (activations, from, to), the one it travels on.
struct PipelineLaneComms {
  std::vector<std::unique_ptr<Communicator>> comms;  // one a lane number
  std::map<std::tuple<bool, int, int>, Communicator*> by_flow;
};

// One communicator a lane number of the stages placed by `stage_rank`, each
// `from.split(color, key)` (the pipeline's ranks: one color a pipeline, ordered by their place
// in it). Collective over `from`, in the same order on every rank.
PipelineLaneComms split_lanes(Communicator& from, int color, int key,
                              const std::vector<int>& stage_rank);

}  // namespace ddp
