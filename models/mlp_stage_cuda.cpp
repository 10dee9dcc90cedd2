// CudaStage: its layers (CudaLinear) wired slot by slot. Between stages the output is after
// its ReLU, so the stage that receives a gradient applies its own last layer's ReLU
// derivative (a mask kernel), and a stage's first layer sends its input gradient as is.
#include "models/mlp_stage_cuda.h"

#include <cmath>
#include <limits>

#include <spdlog/spdlog.h>

#include "models/lt_matmul.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

namespace {

// Whether backward() runs the weight gradients beside: options.weight_grad_stream, kAuto
// decided by the products' size against this GPU's SMs.
bool beside(const CudaStageOptions& options, const MlpShape& shape, int first, int end,
            int max_batch) {
  if (options.weight_grad_stream != WeightGradStream::kAuto)
    return options.weight_grad_stream == WeightGradStream::kOn;
  int device = 0, sms = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return backward_products_leave_sms_idle(shape, first, end, max_batch, sms);
}

}  // namespace

CudaStage::CudaStage(MlpShape shape, int first, int end, int max_batch, int slots,
                     const OptimizerConfig& optimizer, const CudaStageOptions& options)
    : StageLayers(std::move(shape), first, end),
      max_batch_(max_batch),
      options_(options),
      stream_(options.shared.weights ? options.shared.stream : own_stream_.emplace().get()) {
  DDP_CHECK(slots >= 1 && max_batch >= 1, "stage with {} slots of {} samples", slots, max_batch);
  if (options.shared.weights == nullptr)
    own_weights_ = std::make_unique<DeviceParameters>(param_count(), bf16(), optimizer, stream(),
                                                      options.gradient_ring, options.grads_memory);
  weights_ = own_weights_ ? own_weights_.get() : options.shared.weights;
  DDP_CHECK(options.shared.offset + param_count() <= weights_->count(),
            "stage of {} parameters from {} of a buffer of {}", param_count(),
            options.shared.offset, weights_->count());
  const size_t rows = static_cast<size_t>(max_batch);
  int widest = 1;
  for (int i = first; i < end; ++i)
    widest = std::max(widest, shape_.layer(i).out);
  for (int s = 0; s < slots; ++s) {
    Slot slot;
    slot.input = DeviceBuffer<char>(rows * in_width() * act_bytes(), MemoryCategory::kActivations);
    slot.grad_output =
        DeviceBuffer<char>(rows * out_width() * act_bytes(), MemoryCategory::kActivations);
    if (!is_first())
      slot.grad_input =
          DeviceBuffer<char>(rows * in_width() * act_bytes(), MemoryCategory::kActivations);
    if (is_last()) slot.labels = DeviceBuffer<int32_t>(rows, MemoryCategory::kActivations);
    if (options.split_backward)
      for (int i = first; i + 1 < end; ++i)
        slot.dz.emplace_back(rows * shape_.layer(i).out * act_bytes(),
                             MemoryCategory::kActivations);
    slots_.push_back(std::move(slot));
  }
  if (!options.split_backward)  // else every slot has its own
    for (auto& buffer : pingpong_)
      buffer = DeviceBuffer<char>(rows * widest * act_bytes(), MemoryCategory::kActivations);
  workspace_ = DeviceBuffer<char>(options.workspace_bytes, MemoryCategory::kWorkspace);
  if (beside(options, shape_, first, end, max_batch)) {
    side_.emplace();
    side_->workspace = DeviceBuffer<char>(options.workspace_bytes, MemoryCategory::kWorkspace);
  }
  const CudaLayerContext context{lt_,
                                 stream(),
                                 workspace_.data(),
                                 workspace_.bytes(),
                                 weights_,
                                 param_offset() - options.shared.offset,
                                 options.precision,
                                 options.fused_epilogues,
                                 options.sync_debug,
                                 options.product_sms};
  for (int i = first; i < end; ++i) {
    // With --recompute every layer but the stage's last writes one working set.
    layers_.push_back(std::make_unique<CudaLinear>(i, shape_.layer(i), hidden(i), slots, max_batch,
                                                   context, options.recompute && i + 1 < end));
    for (int s = 0; s < slots; ++s) {
      CudaLinear::Wiring wiring;
      wiring.input = i == first ? input(s) : layer(i - 1).output(s);
      wiring.grad_output = dz(s, i);
      wiring.grad_input = i > first ? dz(s, i - 1) : grad_input(s);
      wiring.below = i > first ? &layer(i - 1) : nullptr;
      // The stage's last hidden layer needs no mask: the gradient it receives is masked by a
      // kernel from its output.
      wiring.keep_mask = i + 1 < end;
      layer(i).wire(s, wiring);
    }
  }
  sums_ = std::make_unique<DeviceLossSums>(stream());
  batch_of_.assign(slots, 0);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

CudaStage::~CudaStage() {
  // Before the plans and buffers go (then the handle); a failure is logged, never thrown.
  const cudaError_t error = cudaStreamSynchronize(stream());
  if (error != cudaSuccess)
    spdlog::error("a stage's stream did not drain at the end: {}", cudaGetErrorString(error));
}

void* CudaStage::output(int slot) const {
  return layer(end_ - 1).output(slot);
}

void* CudaStage::grad_input(int slot) const {
  return is_first() ? nullptr : slots_[slot].grad_input.data();
}

void* CudaStage::dz(int slot, int layer) const {
  if (layer == end_ - 1) return grad_output(slot);
  if (options_.split_backward) return slots_[slot].dz[layer - first_].data();
  return pingpong_[(end_ - 1 - layer) % 2].data();
}

void CudaStage::after(const char* op) const {
  if (!options_.sync_debug) return;
  const cudaError_t error = cudaStreamSynchronize(stream());
  DDP_CHECK(error == cudaSuccess, "--sync-debug: {} failed: {} ({})", op, cudaGetErrorName(error),
            cudaGetErrorString(error));
}

void CudaStage::build(int slot, int batch) {
  DDP_CHECK(batch >= 1 && batch <= max_batch_, "batch {} outside [1, {}]", batch, max_batch_);
  DDP_CHECK(slot >= 0 && slot < slots(), "slot {} of {}", slot, slots());
  // Autotuning's alternatives: the products without their fused epilogues.
  const bool alternatives = options_.autotune && slot == 0 && batch == max_batch_;
  for (auto& l : layers_)  // below first: a layer's input gradient fuses its ReLU's mask
    l->build(slot, batch, alternatives);
}

void CudaStage::gather(const float* x, const int32_t* y, int dim, const int32_t* indices,
                       const int* counter, int stride, int batch, int slot) {
  launch_gather_batch(x, y, dim, indices, counter, stride, batch,
                      is_first() ? input(slot) : nullptr, bf16(),
                      is_last() ? labels(slot) : nullptr, stream());
  after("gather");
}

void CudaStage::set_input(const float* x, int batch, int slot) {
  const size_t count = static_cast<size_t>(batch) * in_width();
  if (bf16())
    launch_to_bf16(x, input(slot), count, stream());
  else
    DDP_CUDA_CHECK(cudaMemcpyAsync(input(slot), x, count * 4, cudaMemcpyDeviceToDevice, stream()));
}

void CudaStage::set_labels(const int32_t* y, int batch, int slot) {
  DDP_CUDA_CHECK(cudaMemcpyAsync(labels(slot), y, sizeof(int32_t) * batch, cudaMemcpyDeviceToDevice,
                                 stream()));
}

void CudaStage::set_layer_hook(std::function<void(int, int)> acquire) {
  acquire_ = std::move(acquire);
  for (auto& l : layers_)
    l->clear_plans();
}

int CudaStage::first_read(bool backward, int slot) const {
  if (!backward) return first_;
  // Backward and its input half: the forward again below the last layer (ensure_forwarded),
  // then the layers' input gradients from the last down (none for the model's first layer).
  if (options_.recompute && working_slot_ != slot && first_ + 1 < end_) return first_;
  return end_ - 1 > first_ || !is_first() ? end_ - 1 : -1;
}

void CudaStage::forward(int slot, int batch) {
  build(slot, batch);
  for (int i = first_; i < end_; ++i) {
    acquire(i, true);
    layer(i).forward(slot, batch);
  }
  working_slot_ = slot;
  batch_of_[slot] = batch;
}

void CudaStage::ensure_forwarded(int slot) {
  if (!options_.recompute || working_slot_ == slot) return;
  // The layers below the last, whose outputs backward reads (the last one's is the slot's).
  for (int i = first_; i + 1 < end_; ++i) {
    acquire(i, true);
    layer(i).forward(slot, batch_of_[slot]);
  }
  working_slot_ = slot;
  ++recomputed_;
  after("recomputed forward");
}

void CudaStage::loss(int slot, int batch, float grad_scale, const int32_t* labels,
                     bool evaluation) {
  DDP_CHECK(is_last(), "loss() on a stage without the last layer");
  const auto kind = evaluation ? DeviceLossSums::kEvaluation : DeviceLossSums::kTraining;
  launch_softmax_xent(static_cast<const float*>(output(slot)),
                      labels != nullptr ? labels : this->labels(slot), batch, shape_.num_classes(),
                      grad_scale, grad_scale != 0.0f ? grad_output(slot) : nullptr, bf16(),
                      sums_->loss(kind), sums_->correct(kind), stream());
  after("softmax cross-entropy");
}

void CudaStage::mask_received(int slot, int batch) {
  if (is_last()) return;
  // The received gradient is w.r.t. this stage's output after its ReLU.
  launch_relu_mask(grad_output(slot), output(slot), static_cast<size_t>(batch) * out_width(),
                   bf16(), stream());
  after("ReLU mask");
}

void CudaStage::backward(int slot, int batch, bool accumulate,
                         const std::function<void(int)>& on_layer_done) {
  build(slot, batch);
  ensure_forwarded(slot);
  mask_received(slot, batch);
  for (int i = end_ - 1; i >= first_; --i) {
    if (side_) {
      // The weight gradient beside the input gradient: both read the layer's output gradient
      // and neither writes what the other reads; joined before the layer is reported done.
      DDP_CUDA_CHECK(cudaEventRecord(side_->fork.get(), stream()));
      DDP_CUDA_CHECK(cudaStreamWaitEvent(side_->stream.get(), side_->fork.get(), 0));
      const CudaLinear::Lane lane{side_->stream.get(), side_->workspace.data(),
                                  side_->workspace.bytes()};
      // The model's first layer has no input gradient: its bias gradient takes this stream.
      const CudaLinear::Lane here{stream(), workspace_.data(), workspace_.bytes()};
      const bool no_input_gradient = i == first_ && is_first();
      layer(i).backward_weight(slot, batch, accumulate, &lane, no_input_gradient ? &here : nullptr);
      DDP_CUDA_CHECK(cudaEventRecord(side_->join.get(), side_->stream.get()));
    } else {
      layer(i).backward_weight(slot, batch, accumulate);
      if (on_layer_done) on_layer_done(i - first_);
    }
    if (i > first_ || !is_first()) acquire(i, false);  // the first layer's has no product
    layer(i).backward_input(slot, batch);
    if (side_) {
      DDP_CUDA_CHECK(cudaStreamWaitEvent(stream(), side_->join.get(), 0));
      if (on_layer_done) on_layer_done(i - first_);
    }
  }
}

void CudaStage::backward_input(int slot, int batch) {
  DDP_CHECK(options_.split_backward, "backward_input() without CudaStageOptions::split_backward");
  build(slot, batch);
  ensure_forwarded(slot);
  mask_received(slot, batch);
  for (int i = end_ - 1; i >= first_; --i) {
    if (i > first_ || !is_first()) acquire(i, false);
    layer(i).backward_input(slot, batch);
  }
}

void CudaStage::backward_weight(int slot, int batch, bool accumulate,
                                const std::function<void(int)>& on_layer_done) {
  DDP_CHECK(options_.split_backward, "backward_weight() without CudaStageOptions::split_backward");
  build(slot, batch);
  ensure_forwarded(slot);
  for (int i = end_ - 1; i >= first_; --i) {
    layer(i).backward_weight(slot, batch, accumulate);
    if (on_layer_done) on_layer_done(i - first_);
  }
}

void CudaStage::optimizer_step(const OptStep* steps, const int* counter) {
  optimizer_range(0, weights_->count(), steps, counter, stream());
  after("optimizer");
}

void CudaStage::optimizer_range(size_t offset, size_t count, const OptStep* steps,
                                const int* counter, cudaStream_t stream) {
  weights_->update(offset, count, steps, counter, stream);
}

void CudaStage::set_params(const float* host) {
  weights_->set(host);
}

void CudaStage::refresh_low_precision_params() {
  weights_->refresh_low_precision();
}

void CudaStage::get_params(float* host) const {
  weights_->get(host);
}

void CudaStage::get_grads(float* host) const {
  weights_->get_grads(host);
}

void CudaStage::init_params_on_device(uint64_t seed) {
  for (const auto& l : layers_)
    l->init_on_device(seed);
  refresh_low_precision_params();
}

std::vector<std::pair<std::string, std::vector<float>>> CudaStage::get_optimizer_state() const {
  return weights_->optimizer_state();
}

void CudaStage::set_optimizer_state(
    const std::vector<std::pair<std::string, std::vector<float>>>& state) {
  weights_->set_optimizer_state(state);
}

LossSum CudaStage::take_sums(bool evaluation) {
  return sums_->take(evaluation ? DeviceLossSums::kEvaluation : DeviceLossSums::kTraining);
}

std::string CudaStage::memory_report() const {
  return fmt::format("this process holds {}; {}", memory_ledger().describe(), driver_memory_line());
}

std::string CudaStage::epilogue_summary() {
  build(0, max_batch_);
  int fused = 0, total = 0;
  for (const auto& l : layers_)
    l->count_fused(0, max_batch_, &fused, &total);
  return fmt::format(
      "{} of {} products with fused epilogues (bias/ReLU mask, BGRADB, DRELU){}", fused, total,
      side_ ? "; weight gradients beside the input gradients, on a second stream" : "");
}

void CudaStage::fill_work_buffers(float value) {
  for (Slot& slot : slots_) {
    launch_fill(slot.input.data(), slot.input.bytes() / act_bytes(), bf16(), value, stream());
    launch_fill(slot.grad_output.data(), slot.grad_output.bytes() / act_bytes(), bf16(), value,
                stream());
    if (slot.grad_input.bytes() > 0)
      launch_fill(slot.grad_input.data(), slot.grad_input.bytes() / act_bytes(), bf16(), value,
                  stream());
    for (auto& buffer : slot.dz)
      launch_fill(buffer.data(), buffer.bytes() / act_bytes(), bf16(), value, stream());
  }
  for (const auto& l : layers_)
    l->fill(value);
  for (auto& buffer : pingpong_)
    if (buffer.bytes() > 0)
      launch_fill(buffer.data(), buffer.bytes() / act_bytes(), bf16(), value, stream());
  weights_->fill_grads(value, stream());
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void CudaStage::autotune() {
  DDP_CHECK(options_.autotune, "autotune() without CudaStageOptions::autotune");
  build(0, max_batch_);
  // Real values (not garbage, not zeros) in every buffer the products read.
  fill_work_buffers(0.01f);
  launch_fill(weights_->params(), weights_->count(), false, 0.01f, stream());
  if (bf16()) launch_fill(weights_->params16(), weights_->count(), true, 0.01f, stream());
  std::vector<TunableProduct> products;
  for (const auto& l : layers_)
    l->tunables(0, max_batch_, &products);
  const std::string key = fmt::format(
      "layers {} [{}, {}) | batch {} | {} | fused {} | forward without mask | "
      "workspace {}{}",
      shape_.to_string(), first_, end_, max_batch_, precision_name(options_.precision),
      options_.fused_epilogues ? 1 : 0, options_.workspace_bytes,
      options_.product_sms > 0 ? fmt::format(" | sms {}", options_.product_sms) : "");
  tuned_ = tune_products(products, key, options_.autotune_cache, workspace_.data(),
                         workspace_.bytes(), stream());
}

}  // namespace ddp
