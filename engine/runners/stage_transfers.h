// Point-to-point between pipeline stages, one module for both runners (as Megatron's
// p2p_communication): a stage's activations forward and gradients back, to another rank over
// the lane of that flow and peer (StageLinks), or to a neighbouring stage of the same rank
// through a hand-over buffer a micro-batch (written by the sender, read by the receiver, in
// order). The transport is the runner's memory: the host's (the CPU: a receive blocks, bounded
// by the link's timeout; sends are waited for at the step's end) or the device's (the GPU: the
// compute stream waits for every transfer, never the host; copies are in stream order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "engine/runners/stage_runner.h"
#include "runtime/memory_port.h"

namespace ddp {

class StageTransfers {
 public:
  // The transfers of stage `spec` (micro-batches of spec.batch samples of `type`), whose sends
  // are kept by the activation slot they were sent from until waited for. `memory` holds the
  // hand-over buffers and copies into them: the host's (a receive blocks, bounded by the
  // link's timeout; sends are waited for at the step's end) or the device's (its stream waits
  // for every transfer, never the host).
  StageTransfers(const StageSpec& spec, MemoryPort memory, DataType type);

  // The stages of this rank just before and after this one (null: another rank's, or none):
  // their messages go through hand-over buffers, this stage's own for what it receives.
  void set_neighbours(StageTransfers* before, StageTransfers* after);
  // The lanes to the neighbouring stages' ranks.
  void attach(const StageLinks& links);

  // Micro-batch `micro`'s activations (`width` wide, at `data`) to the next stage, and from
  // the stage before into `into`; sent from slot `slot`.
  void send_activation(const void* data, int width, int micro, int slot);
  void receive_activation(void* into, int width, int micro);
  // Its gradients (`width` wide) back to the stage before, and from the next one.
  void send_gradient(const void* data, int width, int micro, int slot);
  void receive_gradient(void* into, int width, int micro);
  // The activations (or gradients) sent from slot `slot` done before it is written again
  // (device: the stream waits; the host's sends are waited for at the step's end, their
  // buffers being the runner's own a micro-batch).
  void wait_sent(bool activations, int slot);
  // The step's end: every send done (device: the stream waits), every hand-over taken.
  void end_step();

  // Evaluation (never handed over): `count` elements from the previous stage's rank into
  // `into`, and to the next stage's rank from `data`, each done before it returns (host)
  // or before the stream goes on (device).
  void evaluation_receive(void* into, size_t count);
  void evaluation_send(const void* data, size_t count);

  // Where its transfers go: "activations from rank 0 on world0/split6c0, ..., to stage 2
  // in memory".
  std::string describe() const;

 private:
  size_t count(int width) const { return static_cast<size_t>(spec_.batch) * width; }
  size_t bytes(int width) const { return count(width) * dtype_bytes(type_); }
  // One message to the neighbouring stage: into `handed` (its buffer there, of this rank),
  // or over `lane` to rank `peer`, kept with the slot's sends; and from it into `into`.
  void send(const void* data, int width, void* handed, char* handed_flag, Communicator* lane,
            int peer, std::vector<std::unique_ptr<Work>>* sent);
  void receive(void* into, int width, void* handed, char* handed_flag, Communicator* lane, int peer,
               const char* what, int micro);
  void done(std::unique_ptr<Work> work, Communicator* lane);  // waited for, or the stream waits

  StageSpec spec_;
  MemoryPort memory_;
  DataType type_;                            // a message's elements
  std::vector<std::shared_ptr<void>> held_;  // the hand-over buffers' memory
  StageTransfers* before_ = nullptr;
  StageTransfers* after_ = nullptr;
  Communicator* act_in_ = nullptr;  // the lanes to the neighbouring stages' ranks
  Communicator* act_out_ = nullptr;
  Communicator* grad_in_ = nullptr;
  Communicator* grad_out_ = nullptr;
  // By micro-batch: the activation the stage before (on this rank) handed over, the gradient
  // the stage after handed back, and whether each is handed and not yet taken.
  std::vector<void*> handed_act_, handed_grad_;
  std::vector<char> act_handed_, grad_handed_;
  // By slot: the activations and the gradients sent from it, until waited for.
  std::vector<std::vector<std::unique_ptr<Work>>> act_sent_, grad_sent_;
};

// Several stages a rank: every lane of the pipeline carries one number end to end before
// training, one lane at a time in the same order on every rank (its sender sends the lane's
// code, its receiver checks it), so that NCCL connects the lanes one after the other and a
// lane that reached the wrong communicator is named here, not as a mismatch mid-step. `word`:
// one int32 in the lanes' memory, `put` and `get` its copies from and to the host (done when
// they return); each wait bounded by `timeout_s`; `lead` logs the result.
void check_lanes(const StageLinks& links, int rank, int32_t* word,
                 const std::function<void(int32_t)>& put, const std::function<int32_t()>& get,
                 double timeout_s, bool lead);

}  // namespace ddp
