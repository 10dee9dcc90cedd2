// StageTransfers: a stage's messages to its neighbours, over lanes or hand-over buffers.
#include "engine/runners/stage_transfers.h"

#include <tuple>

#include <spdlog/spdlog.h>

#include "runtime/error.h"

namespace ddp {

StageTransfers::StageTransfers(const StageSpec& spec, MemoryPort memory, DataType type)
    : spec_(spec),
      memory_(std::move(memory)),
      type_(type),
      act_sent_(static_cast<size_t>(spec.slots)),
      grad_sent_(static_cast<size_t>(spec.slots)) {}

void StageTransfers::set_neighbours(StageTransfers* before, StageTransfers* after) {
  before_ = before;
  after_ = after;
  const auto buffers = [&](std::vector<void*>* into, std::vector<char>* flags, int width) {
    for (int m = 0; m < spec_.micro_batches; ++m) {
      held_.push_back(memory_.allocate(bytes(width)));
      into->push_back(held_.back().get());
    }
    flags->assign(static_cast<size_t>(spec_.micro_batches), 0);
  };
  if (before_ != nullptr) buffers(&handed_act_, &act_handed_, spec_.in_width());
  if (after_ != nullptr) buffers(&handed_grad_, &grad_handed_, spec_.out_width());
}

void StageTransfers::attach(const StageLinks& links) {
  const int me = spec_.rank;
  if (spec_.prev_rank >= 0 && before_ == nullptr) {
    act_in_ = links.lane(true, spec_.prev_rank, me);
    grad_out_ = links.lane(false, me, spec_.prev_rank);
  }
  if (spec_.next_rank >= 0 && after_ == nullptr) {
    act_out_ = links.lane(true, me, spec_.next_rank);
    grad_in_ = links.lane(false, spec_.next_rank, me);
  }
}

void StageTransfers::send_activation(const void* data, int width, int micro, int slot) {
  send(data, width, after_ ? after_->handed_act_[micro] : nullptr,
       after_ ? &after_->act_handed_[micro] : nullptr, act_out_, spec_.next_rank, &act_sent_[slot]);
}

void StageTransfers::receive_activation(void* into, int width, int micro) {
  receive(into, width, before_ ? handed_act_[micro] : nullptr,
          before_ ? &act_handed_[micro] : nullptr, act_in_, spec_.prev_rank, "activations", micro);
}

void StageTransfers::send_gradient(const void* data, int width, int micro, int slot) {
  send(data, width, before_ ? before_->handed_grad_[micro] : nullptr,
       before_ ? &before_->grad_handed_[micro] : nullptr, grad_out_, spec_.prev_rank,
       &grad_sent_[slot]);
}

void StageTransfers::receive_gradient(void* into, int width, int micro) {
  receive(into, width, after_ ? handed_grad_[micro] : nullptr,
          after_ ? &grad_handed_[micro] : nullptr, grad_in_, spec_.next_rank, "gradients", micro);
}

void StageTransfers::send(const void* data, int width, void* handed, char* handed_flag,
                          Communicator* lane, int peer, std::vector<std::unique_ptr<Work>>* sent) {
  if (handed != nullptr) {
    memory_.copy(handed, data, bytes(width));
    *handed_flag = 1;
    return;
  }
  DDP_CHECK(lane != nullptr, "pipeline: stage {} sends to rank {} without a link", spec_.stage,
            peer);
  sent->push_back(lane->isend(data, count(width), type_, peer));
}

void StageTransfers::receive(void* into, int width, void* handed, char* handed_flag,
                             Communicator* lane, int peer, const char* what, int micro) {
  if (handed != nullptr) {
    DDP_CHECK(*handed_flag != 0,
              "pipeline: stage {} takes micro-batch {}'s {} from its own rank before they were "
              "handed over",
              spec_.stage, micro, what);
    memory_.copy(into, handed, bytes(width));
    *handed_flag = 0;
    return;
  }
  DDP_CHECK(lane != nullptr, "pipeline: stage {} receives from rank {} without a link", spec_.stage,
            peer);
  done(lane->irecv(into, count(width), type_, peer), lane);
}

void StageTransfers::done(std::unique_ptr<Work> work, Communicator* lane) {
  if (memory_.stream != nullptr)
    work->then_on(memory_.stream);
  else
    work->wait(lane->timeout());
}

void StageTransfers::wait_sent(bool activations, int slot) {
  if (memory_.stream == nullptr) return;  // the host's: at the step's end
  for (auto& work : (activations ? act_sent_ : grad_sent_)[slot])
    work->then_on(memory_.stream);
  (activations ? act_sent_ : grad_sent_)[slot].clear();
}

void StageTransfers::end_step() {
  for (auto* flow : {&act_sent_, &grad_sent_})
    for (auto& slot : *flow) {
      for (auto& work : slot)
        done(std::move(work), flow == &act_sent_ ? act_out_ : grad_out_);
      slot.clear();
    }
  size_t left = 0;
  for (const auto* flags : {&act_handed_, &grad_handed_})
    for (const char f : *flags)
      left += f != 0 ? 1 : 0;
  DDP_CHECK(left == 0, "pipeline: {} hand-overs to stage {} were never taken", left, spec_.stage);
}

void StageTransfers::evaluation_receive(void* into, size_t count) {
  done(act_in_->irecv(into, count, type_, spec_.prev_rank), act_in_);
}

void StageTransfers::evaluation_send(const void* data, size_t count) {
  done(act_out_->isend(data, count, type_, spec_.next_rank), act_out_);
}

std::string StageTransfers::describe() const {
  std::vector<std::string> parts;
  const auto add = [&](const char* what, Communicator* lane, int peer, const StageTransfers* local,
                       int stage) {
    if (local != nullptr)
      parts.push_back(fmt::format("{} stage {} in memory", what, stage));
    else if (lane != nullptr)
      parts.push_back(fmt::format("{} rank {} on {}", what, peer, lane->name()));
  };
  add("activations from", act_in_, spec_.prev_rank, before_, spec_.stage - 1);
  add("gradients to", grad_out_, spec_.prev_rank, before_, spec_.stage - 1);
  add("activations to", act_out_, spec_.next_rank, after_, spec_.stage + 1);
  add("gradients from", grad_in_, spec_.next_rank, after_, spec_.stage + 1);
  std::string text;
  for (const std::string& p : parts)
    text += (text.empty() ? "" : ", ") + p;
  return text;
}

void check_lanes(const StageLinks& links, int rank, int32_t* word,
                 const std::function<void(int32_t)>& put, const std::function<int32_t()>& get,
                 double timeout_s, bool lead) {
  if (links.lanes.empty()) return;
  const auto code = [](const std::tuple<bool, int, int>& lane) {
    return (std::get<0>(lane) ? 1 : 2) * 1000000 + std::get<1>(lane) * 1000 + std::get<2>(lane);
  };
  const auto name = [](const std::tuple<bool, int, int>& lane) {
    return fmt::format("{} {} -> {}", std::get<0>(lane) ? "activations" : "gradients",
                       std::get<1>(lane), std::get<2>(lane));
  };
  for (const auto& [lane, comm] : links.lanes) {
    const auto [activations, from, to] = lane;
    (void)activations;
    if (rank != from && rank != to) continue;
    put(rank == from ? code(lane) : -1);
    std::unique_ptr<Work> work = rank == from ? comm->isend(word, 1, DataType::kInt32, to)
                                              : comm->irecv(word, 1, DataType::kInt32, from);
    work->wait(timeout_s);
    if (rank != to) continue;
    const int32_t got = get();
    for (const auto& [other, c] : links.lanes)
      DDP_CHECK(got == code(lane) || got != code(other),
                "pipeline lane {} (on {}) received the check of lane {}: the lanes' "
                "communicators are crossed",
                name(lane), comm->name(), name(other));
    DDP_CHECK(got == code(lane), "pipeline lane {} (on {}) received {} instead of its check {}",
              name(lane), comm->name(), got, code(lane));
  }
  if (lead)
    spdlog::info(
        "pipeline: {} lanes (NCCL communicators a flow, direction and peer) checked end "
        "to end",
        links.lanes.size());
}

}  // namespace ddp
