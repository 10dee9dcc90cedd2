// --zero 3's gathers on the GPU as decisions, apart from the device (the runner carries them
// out): a rank's layers are gathered into two slots, layer i into slot i % 2, before each use
// of its parameters; the pass's next layer is gathered meanwhile into the other slot; a slot
// that holds the layer already is not gathered again; every gather is waited for by the
// compute stream once, before its layer's first use or, unused, before its slot is gathered
// into again or everything is forgotten (a step's end, evaluation's end). Pure.
#pragma once

#include <cstddef>
#include <vector>

namespace ddp {

class LayerGathers {
 public:
  enum class Kind {
    kGather,  // issue layer's gather into its slot
    kUse,     // the stream waits for layer's gather, which is then read (bf16: converted)
    kDrop,    // the stream waits for layer's gather, which nobody used (its slot is needed)
  };
  struct Action {
    Kind kind;
    int layer;
    bool operator==(const Action& o) const { return kind == o.kind && layer == o.layer; }
  };

  explicit LayerGathers(int layers) : pending_(static_cast<size_t>(layers), false) {}

  // Before layer `layer`'s parameters are read; `next`: the layer this pass reads next, or -1.
  std::vector<Action> use(int layer, int next);
  // Every gather still pending waited for (kDrop), and what the slots hold forgotten.
  std::vector<Action> forget();
  // The layer slot s holds (gathered or on its way), or -1.
  int holder(int slot) const { return holder_[slot]; }

 private:
  void gather(int layer, std::vector<Action>* out);

  std::vector<bool> pending_;  // by layer: gathered, not yet waited for
  int holder_[2] = {-1, -1};
};

}  // namespace ddp
