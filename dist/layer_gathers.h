// --zero 3's gathers as decisions, apart from the memory (ReplicaState, dist/replica_state.h,
// carries them out, on the host or on a stream): a rank's layers are gathered into ahead + 1
// slots, layer i into slot i % (ahead + 1), before each use of its parameters; the pass's next
// `ahead` layers (--zero-prefetch on the GPU, 1 by default; the CPU's layers gather at their
// use, 0) are gathered meanwhile into the other slots; a slot that holds the layer already is
// not gathered again; every gather is waited for once, before its layer's first use or,
// unused, before its slot is gathered into again or everything is forgotten (a step's end,
// evaluation's end). Pure.
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

  // `layers` layers, gathered up to `ahead` (>= 0) layers ahead of the one in use.
  explicit LayerGathers(int layers, int ahead = 1);

  // Before layer `layer`'s parameters are read; `next`: the layers this pass reads next,
  // nearest first (the first `ahead` of them are gathered meanwhile).
  std::vector<Action> use(int layer, const std::vector<int>& next);
  // Layer `layer`, which a pass will read first, gathered now unless its slot holds it (the
  // schedule's kUnshard: its use then only waits for it).
  std::vector<Action> prefetch(int layer);
  // Layers [first, end) let go (the schedule's kReshard): a gather of theirs still pending waited
  // for (kDrop), their slots free for others.
  std::vector<Action> release(int first, int end);
  // Every gather still pending waited for (kDrop), and what the slots hold forgotten.
  std::vector<Action> forget();
  // The layer slot s holds (gathered or on its way), or -1.
  int holder(int slot) const { return holder_[slot]; }
  int slots() const { return static_cast<int>(holder_.size()); }
  int ahead() const { return slots() - 1; }
  // The slot layer `layer` is gathered into.
  int slot_of(int layer) const { return layer % slots(); }

 private:
  void gather(int layer, std::vector<Action>* out);

  std::vector<bool> pending_;  // by layer: gathered, not yet waited for
  std::vector<int> holder_;    // by slot: the layer it holds, or -1
};

}  // namespace ddp
