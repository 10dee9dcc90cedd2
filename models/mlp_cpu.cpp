// CpuStage: its layers (CpuLinear) over the stage's flat buffers; forward stores every
// layer's output in the micro-batch's slot; backward walks the layers last to first,
// ping-ponging between two gradient buffers.
#include "models/mlp_cpu.h"

#include <algorithm>

#include "runtime/error.h"

namespace ddp {

CpuStage::CpuStage(MlpShape shape, int first, int end, int max_batch, int slots, float* params,
                   float* grads, bool recompute)
    : StageLayers(std::move(shape), first, end), max_batch_(max_batch), recompute_(recompute) {
  DDP_CHECK(slots >= 1, "stage of layers [{}, {}) with {} slots", first_, end_, slots);
  const size_t count = param_count();
  if (params == nullptr) {
    own_params_.resize(count);
    params = own_params_.data();
  }
  if (grads == nullptr) {
    own_grads_.resize(count);
    grads = own_grads_.data();
  }
  params_ = params;
  grads_ = grads;
  for (int i = first_; i < end_; ++i)
    layers_.emplace_back(shape_.layer(i), i + 1 < shape_.num_layers(), params_, grads_,
                         param_offset());
  inputs_.assign(slots, nullptr);
  batch_of_.assign(slots, 0);
  activations_.resize(recompute ? 1 : slots);
  for (auto& slot : activations_)
    for (int i = first_; i < end_; ++i)
      slot.emplace_back(static_cast<size_t>(max_batch) * shape_.layer(i).out);
  grad_a_.resize(static_cast<size_t>(max_batch) * shape_.max_width());
  grad_b_.resize(grad_a_.size());
}

void CpuStage::run_layers(const float* x, int batch, std::vector<std::vector<float>>& out) {
  const float* in = x;
  for (int i = first_; i < end_; ++i) {
    layer(i).forward(in, out[i - first_].data(), batch);
    in = out[i - first_].data();
  }
}

const float* CpuStage::forward(const float* x, int batch, int slot) {
  DDP_CHECK(batch > 0 && batch <= max_batch_, "batch {} outside [1, {}]", batch, max_batch_);
  DDP_CHECK(slot >= 0 && slot < slots(), "slot {} outside [0, {})", slot, slots());
  inputs_[slot] = x;
  batch_of_[slot] = batch;
  std::vector<std::vector<float>>& out = activations_[recompute_ ? 0 : slot];
  run_layers(x, batch, out);
  working_slot_ = slot;
  return out.back().data();
}

std::vector<std::vector<float>>& CpuStage::working(int slot) {
  DDP_CHECK(slot >= 0 && slot < slots() && inputs_[slot] != nullptr, "slot {} was not forwarded",
            slot);
  if (!recompute_) return activations_[slot];
  if (working_slot_ != slot) {
    run_layers(inputs_[slot], batch_of_[slot], activations_[0]);
    working_slot_ = slot;
    ++recomputed_;
  }
  return activations_[0];
}

size_t CpuStage::activation_bytes() const {
  size_t floats = 0;
  for (const auto& set : activations_)
    for (const auto& layer : set)
      floats += layer.size();
  return floats * sizeof(float);
}

const float* CpuStage::backward(float* dy, int batch, int slot, bool accumulate,
                                const std::function<void(int)>& on_layer_done) {
  DDP_CHECK(slot >= 0 && slot < slots() && inputs_[slot] != nullptr,
            "backward() of slot {} before its forward()", slot);
  const std::vector<std::vector<float>>& acts = working(slot);
  float* buffers[2] = {grad_a_.data(), grad_b_.data()};
  int next = 0;
  for (int i = end_ - 1; i >= first_; --i) {
    layer(i).activation_backward(acts[i - first_].data(), dy, batch);
    const float* x = i == first_ ? inputs_[slot] : acts[i - first_ - 1].data();
    float* dx = i == 0 ? nullptr : buffers[next];
    layer(i).backward(x, dy, dx, batch, accumulate);
    if (on_layer_done) on_layer_done(i - first_);
    dy = dx;
    next ^= 1;
  }
  return dy;
}

const float* CpuStage::backward_input(const float* dy, int batch, int slot) {
  DDP_CHECK(slot >= 0 && slot < slots() && inputs_[slot] != nullptr,
            "backward_input() of slot {} before its forward()", slot);
  if (output_grads_.empty()) {
    output_grads_.resize(inputs_.size());
    for (auto& grads : output_grads_)
      for (int i = first_; i < end_; ++i)
        grads.emplace_back(static_cast<size_t>(max_batch_) * shape_.layer(i).out);
    split_batch_.assign(inputs_.size(), 0);
  }
  const std::vector<std::vector<float>>& acts = working(slot);
  std::vector<std::vector<float>>& grads = output_grads_[slot];
  split_batch_[slot] = batch;
  std::copy_n(dy, static_cast<size_t>(batch) * shape_.layer(end_ - 1).out, grads.back().data());
  // Layer i's output gradient is layer i + 1's input gradient: written where layer i keeps it.
  for (int i = end_ - 1; i >= first_; --i) {
    float* g = grads[i - first_].data();
    layer(i).activation_backward(acts[i - first_].data(), g, batch);
    if (i == 0) return nullptr;
    float* dx = i == first_ ? grad_a_.data() : grads[i - first_ - 1].data();
    layer(i).backward_input(g, dx, batch);
  }
  return grad_a_.data();
}

void CpuStage::backward_weight(int slot, bool accumulate,
                               const std::function<void(int)>& on_layer_done) {
  DDP_CHECK(slot >= 0 && slot < static_cast<int>(split_batch_.size()) && split_batch_[slot] > 0,
            "backward_weight() of slot {} before its backward_input()", slot);
  const int batch = split_batch_[slot];
  const std::vector<std::vector<float>>& acts = working(slot);
  for (int i = end_ - 1; i >= first_; --i) {
    const float* x = i == first_ ? inputs_[slot] : acts[i - first_ - 1].data();
    layer(i).backward_weight(x, output_grads_[slot][i - first_].data(), batch, accumulate);
    if (on_layer_done) on_layer_done(i - first_);
  }
  split_batch_[slot] = 0;
}

CpuMlp::CpuMlp(MlpShape shape, int max_batch)
    : stage_(shape, 0, shape.num_layers(), max_batch),
      dlogits_(static_cast<size_t>(max_batch) * shape.num_classes()) {}

const float* CpuMlp::forward(const float* x, int batch) {
  logits_ = stage_.forward(x, batch);
  return logits_;
}

LossSum CpuMlp::backward(const int32_t* labels, int batch, float grad_scale, bool accumulate,
                         const std::function<void(int)>& on_layer_done) {
  DDP_CHECK(logits_ != nullptr, "backward() called before forward()");
  const LossSum sum =
      softmax_xent_cpu(logits_, labels, batch, shape().num_classes(), grad_scale, dlogits_.data());
  stage_.backward(dlogits_.data(), batch, 0, accumulate, on_layer_done);
  return sum;
}

void CpuStage::set_grads(const std::function<float*(size_t offset)>& grad_at) {
  for (CpuLinear& l : layers_)
    l.set_grads(grad_at(l.slice().weight_offset - param_offset()),
                grad_at(l.slice().bias_offset - param_offset()));
  grads_ = nullptr;
}

void CpuStage::set_params_source(LayerParams* source) {
  for (int i = first_; i < end_; ++i)
    layers_[i - first_].set_source(source, i);
}

}  // namespace ddp
