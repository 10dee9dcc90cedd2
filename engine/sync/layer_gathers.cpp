#include "engine/sync/layer_gathers.h"

#include "runtime/error.h"

namespace ddp {

std::vector<LayerGathers::Action> LayerGathers::use(int layer, int next) {
  DDP_CHECK(layer >= 0 && layer < static_cast<int>(pending_.size()) &&
                next < static_cast<int>(pending_.size()) && (next < 0 || next % 2 != layer % 2),
            "--zero 3: use of layer {} (next {}) of {}", layer, next, pending_.size());
  std::vector<Action> out;
  if (holder_[layer % 2] != layer) gather(layer, &out);
  if (pending_[layer]) {
    out.push_back({Kind::kUse, layer});
    pending_[layer] = false;
  }
  if (next >= 0 && holder_[next % 2] != next) gather(next, &out);
  return out;
}

void LayerGathers::gather(int layer, std::vector<Action>* out) {
  int& holder = holder_[layer % 2];
  if (holder >= 0 && pending_[holder]) {
    out->push_back({Kind::kDrop, holder});
    pending_[holder] = false;
  }
  out->push_back({Kind::kGather, layer});
  pending_[layer] = true;
  holder = layer;
}

std::vector<LayerGathers::Action> LayerGathers::forget() {
  std::vector<Action> out;
  for (size_t i = 0; i < pending_.size(); ++i)
    if (pending_[i]) {
      out.push_back({Kind::kDrop, static_cast<int>(i)});
      pending_[i] = false;
    }
  holder_[0] = holder_[1] = -1;
  return out;
}

}  // namespace ddp
