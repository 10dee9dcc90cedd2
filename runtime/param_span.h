// A model's parameters as ranges of one flat buffer: the vocabulary the models describe
// themselves in (models/mlp.h's param_spans) and the core's buckets and reducer read
// (dist/buckets.h), so that neither includes the other.
#pragma once

#include <cstddef>

namespace ddp {

// A layer's parameters as a range of the flat parameter (and gradient) buffer, in elements.
// Any model can describe itself so: a list of spans in forward order, each contiguous.
struct ParamSpan {
  size_t offset = 0;  // where the layer's parameters start (elements)
  size_t count = 0;   // how many it has
};

}  // namespace ddp
