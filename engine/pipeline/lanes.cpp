#include "engine/pipeline/lanes.h"

#include <algorithm>

#include "engine/pipeline/schedule.h"

namespace ddp {

PipelineLaneComms split_lanes(Communicator& from, int color, int key,
                              const std::vector<int>& stage_rank) {
  const std::map<PipelineLane, int> lanes = pipeline_lanes(stage_rank);
  int numbers = 0;
  for (const auto& [lane, number] : lanes)
    numbers = std::max(numbers, number + 1);
  PipelineLaneComms made;
  for (int k = 0; k < numbers; ++k)
    made.comms.push_back(from.split(color, key));
  for (const auto& [lane, number] : lanes)
    made.by_flow[{lane.activations, lane.from, lane.to}] =
        made.comms[static_cast<size_t>(number)].get();
  return made;
}

}  // namespace ddp
