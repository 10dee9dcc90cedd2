// LayerGathers: which layer to gather into which slot, and when the stream waits for it.
#include "dist/layer_gathers.h"

#include <algorithm>

#include "runtime/error.h"

namespace ddp {

LayerGathers::LayerGathers(int layers, int ahead)
    : pending_(static_cast<size_t>(layers), false), holder_(static_cast<size_t>(ahead) + 1, -1) {
  DDP_CHECK(layers >= 0 && ahead >= 0, "--zero 3: {} layers gathered {} ahead", layers, ahead);
}

std::vector<LayerGathers::Action> LayerGathers::use(int layer, const std::vector<int>& next) {
  const int layers = static_cast<int>(pending_.size());
  const size_t ahead = std::min(next.size(), holder_.size() - 1);
  DDP_CHECK(layer >= 0 && layer < layers, "--zero 3: use of layer {} of {}", layer, layers);
  // The layers gathered at once (this one and the next `ahead`) need slots of their own.
  std::vector<bool> taken(holder_.size(), false);
  taken[slot_of(layer)] = true;
  for (size_t k = 0; k < ahead; ++k) {
    const int n = next[k];
    DDP_CHECK(n >= 0 && n < layers && !taken[slot_of(n)],
              "--zero 3: use of layer {} with layer {} next (of {}, {} slots)", layer, n, layers,
              holder_.size());
    taken[slot_of(n)] = true;
  }
  std::vector<Action> out;
  if (holder_[slot_of(layer)] != layer) gather(layer, &out);
  if (pending_[layer]) {
    out.push_back({Kind::kUse, layer});
    pending_[layer] = false;
  }
  for (size_t k = 0; k < ahead; ++k)
    if (holder_[slot_of(next[k])] != next[k]) gather(next[k], &out);
  return out;
}

void LayerGathers::gather(int layer, std::vector<Action>* out) {
  int& holder = holder_[slot_of(layer)];
  if (holder >= 0 && pending_[holder]) {
    out->push_back({Kind::kDrop, holder});
    pending_[holder] = false;
  }
  out->push_back({Kind::kGather, layer});
  pending_[layer] = true;
  holder = layer;
}

std::vector<LayerGathers::Action> LayerGathers::prefetch(int layer) {
  DDP_CHECK(layer >= 0 && layer < static_cast<int>(pending_.size()),
            "--zero 3: prefetch of layer {} of {}", layer, pending_.size());
  std::vector<Action> out;
  if (holder_[slot_of(layer)] != layer) gather(layer, &out);
  return out;
}

std::vector<LayerGathers::Action> LayerGathers::release(int first, int end) {
  DDP_CHECK(first >= 0 && first <= end && end <= static_cast<int>(pending_.size()),
            "--zero 3: release of layers {} to {} of {}", first, end, pending_.size());
  std::vector<Action> out;
  for (int layer = first; layer < end; ++layer) {
    int& holder = holder_[slot_of(layer)];
    if (holder != layer) continue;
    if (pending_[layer]) {
      out.push_back({Kind::kDrop, layer});
      pending_[layer] = false;
    }
    holder = -1;
  }
  return out;
}

std::vector<LayerGathers::Action> LayerGathers::forget() {
  std::vector<Action> out;
  for (size_t i = 0; i < pending_.size(); ++i)
    if (pending_[i]) {
      out.push_back({Kind::kDrop, static_cast<int>(i)});
      pending_[i] = false;
    }
  std::fill(holder_.begin(), holder_.end(), -1);
  return out;
}

}  // namespace ddp
