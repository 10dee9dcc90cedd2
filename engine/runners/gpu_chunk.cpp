// GpuChunk: a GPU pipeline stage's actions (engine/runners/gpu_chunk.h).
#include "engine/runners/gpu_chunk.h"

namespace ddp {

void GpuChunk::recv_activation(int micro, int slot) {
  transfers_.wait_sent(true, slot);  // the slot's output may still be on its way out
  transfers_.receive_activation(stage_->input(slot), spec_.in_width(), micro);
}

void GpuChunk::forward(int micro, int slot) {
  transfers_.wait_sent(true, slot);
  rank_.hooks->busy_begin(SpanKind::kForward, micro, spec_.stage);
  if (spec_.is_first() || spec_.is_last()) rank_.feeder->feed(*stage_, micro, slot);
  stage_->forward(slot, spec_.batch);
  rank_.hooks->busy_end();
}

void GpuChunk::send_activation(int micro, int slot) {
  transfers_.send_activation(stage_->output(slot), spec_.out_width(), micro, slot);
}

void GpuChunk::recv_gradient(int micro, int slot) {
  transfers_.receive_gradient(stage_->grad_output(slot), spec_.out_width(), micro);
}

LossSum GpuChunk::loss(int micro, int slot, float grad_scale) {
  (void)micro;
  stage_->loss(slot, spec_.batch, grad_scale);
  rank_.hooks->forward_done();
  return {};  // kept on the device until take_loss()
}

void GpuChunk::backward(int micro, int slot, bool accumulate,
                        const std::function<void(int)>& on_layer_done) {
  // grad_input(slot) of an earlier micro-batch is sent
  transfers_.wait_sent(false, slot);
  rank_.hooks->busy_begin(SpanKind::kBackward, micro, spec_.stage);
  rank_.hooks->weight_grads(on_layer_done, [&](const std::function<void(int)>& hook) {
    stage_->backward(slot, spec_.batch, accumulate, hook);
  });
  rank_.hooks->busy_end();
}

bool GpuChunk::splits_backward() const {
  return rank_.split;
}

void GpuChunk::backward_input(int micro, int slot) {
  transfers_.wait_sent(false, slot);
  rank_.hooks->busy_begin(SpanKind::kBackwardInput, micro, spec_.stage);
  stage_->backward_input(slot, spec_.batch);
  rank_.hooks->busy_end();
}

void GpuChunk::backward_weight(int micro, int slot, bool accumulate,
                               const std::function<void(int)>& on_layer_done) {
  rank_.hooks->busy_begin(SpanKind::kBackwardWeight, micro, spec_.stage);
  rank_.hooks->weight_grads(on_layer_done, [&](const std::function<void(int)>& hook) {
    stage_->backward_weight(slot, spec_.batch, accumulate, hook);
  });
  rank_.hooks->busy_end();
}

void GpuChunk::send_gradient(int micro, int slot) {
  transfers_.send_gradient(stage_->grad_input(slot), spec_.in_width(), micro, slot);
}

void GpuChunk::unshard(ActionKind kind, int micro, int slot) {
  (void)micro;             // the slot says what recomputation needs
  if (!prefetch_) return;  // the parameters are where they are read
  const int layer = stage_->first_read(kind != ActionKind::kForward, slot);
  if (layer >= 0) prefetch_(layer);
}

void GpuChunk::reshard() {
  if (release_) release_();
}

void GpuChunk::evaluate(const float* x, const int32_t* labels, int n) {
  const size_t in = static_cast<size_t>(n) * spec_.in_width();
  if (spec_.is_first())
    stage_->set_input(x, n, 0);
  else if (before_ != nullptr)  // its output of these samples, just forwarded on this stream
    copy(stage_->input(0), before_->stage().output(0), in * stage_->act_bytes());
  else
    transfers_.evaluation_receive(stage_->input(0), in);
  stage_->forward(0, n);
  if (spec_.is_last())
    stage_->loss(0, n, 0.0f, labels, /*evaluation=*/true);
  else if (after_ == nullptr)
    transfers_.evaluation_send(stage_->output(0), static_cast<size_t>(n) * spec_.out_width());
}

// Each of the rank's stages knows the stages just before and after it on the rank (null:
// another rank's, or none).
void link_neighbours(std::vector<std::unique_ptr<GpuChunk>>& chunks) {
  for (size_t c = 0; c < chunks.size(); ++c) {
    const auto neighbour = [&](size_t at, int stage) {
      return at < chunks.size() && chunks[at]->spec().stage == stage ? chunks[at].get() : nullptr;
    };
    chunks[c]->set_neighbours(c > 0 ? neighbour(c - 1, chunks[c]->spec().stage - 1) : nullptr,
                              neighbour(c + 1, chunks[c]->spec().stage + 1));
  }
}

}  // namespace ddp
