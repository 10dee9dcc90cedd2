// What a sharded state hands an optimizer and takes back from a checkpoint, in the layer's own
// words so that it needs no optimizer: a piece of the flat parameters to update (OptimizerPiece)
// and named host copies of state (NamedState). models/optimizer.h's optimizers take them.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

// Optimizer state (or any named buffers) as host copies: each buffer's name and values.
using NamedState = std::vector<std::pair<std::string, std::vector<float>>>;

// A piece of a flat buffer for an optimizer's step over pieces: `count` parameters from element
// `offset` of the parameters, their gradients at `grads`, their state from the state's element
// `state_offset`.
struct OptimizerPiece {
  size_t offset = 0;             // into the parameters
  const float* grads = nullptr;  // the piece's gradients
  size_t state_offset = 0;       // into the state
  size_t count = 0;              // its elements
};

}  // namespace ddp
