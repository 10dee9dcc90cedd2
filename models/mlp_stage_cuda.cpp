// CudaStage: cuBLASLt plans built once per slot and batch size for fixed pointers, kernels
// for the rest.
//
// Row-major tensors are read by cuBLASLt as column-major transposes, so with Y[B,out],
// X[B,in], W[out,in] (all row-major):
//   forward  Y^T[out,B]  = W^T'[in,out]^T * X^T[in,B]           (A = W, transposed)
//   dW       dW^T[in,out] = X^T[in,B] * (dZ^T[out,B])^T          (bias grad: BGRADB over B)
//   dX       dX^T[in,B]  = W^T'[in,out] * dZ^T[out,B]            (DRELU with the layer below's
//   mask)
// Between stages the output is after its ReLU, so the stage that receives a gradient applies
// its own last layer's ReLU derivative (a mask kernel), and a stage's first layer sends its
// input gradient as is.
#include "models/mlp_stage_cuda.h"

#include <cmath>
#include <limits>

#include "models/lt_matmul.h"
#include "models/rng.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

CudaStage::CudaStage(MlpShape shape, int first, int end, int max_batch, int slots,
                     const OptimizerConfig& optimizer, const CudaStageOptions& options)
    : StageLayers(std::move(shape), first, end), max_batch_(max_batch), options_(options) {
  DDP_CHECK(slots >= 1 && max_batch >= 1, "stage with {} slots of {} samples", slots, max_batch);
  const LayerSlice& last = shape_.layer(end - 1);
  const size_t count = last.bias_offset + last.out - param_offset();
  weights_ = std::make_unique<DeviceParameters>(count, bf16(), optimizer, stream());
  const size_t rows = static_cast<size_t>(max_batch);
  int widest = 1;
  for (int i = first; i < end; ++i) {
    aux_ld_.push_back(round_up(shape_.layer(i).out, 128));
    widest = std::max(widest, shape_.layer(i).out);
  }
  for (int s = 0; s < slots; ++s) {
    Slot slot;
    slot.input = DeviceBuffer<char>(rows * in_width() * act_bytes(), MemoryCategory::kActivations);
    slot.grad_output =
        DeviceBuffer<char>(rows * out_width() * act_bytes(), MemoryCategory::kActivations);
    if (!is_first())
      slot.grad_input =
          DeviceBuffer<char>(rows * in_width() * act_bytes(), MemoryCategory::kActivations);
    if (is_last()) slot.labels = DeviceBuffer<int32_t>(rows, MemoryCategory::kActivations);
    for (int i = first; i < end; ++i) {
      const int out = shape_.layer(i).out;
      slot.acts.emplace_back(rows * out * (hidden(i) ? act_bytes() : 4),
                             MemoryCategory::kActivations);
      slot.aux.emplace_back(hidden(i) ? static_cast<size_t>(aux_ld_[i - first] / 8) * rows : 0,
                            MemoryCategory::kActivations);
      if (options.split_backward && i + 1 < end)
        slot.dz.emplace_back(rows * out * act_bytes(), MemoryCategory::kActivations);
    }
    slots_.push_back(std::move(slot));
  }
  if (!options.split_backward)  // else every slot has its own
    for (auto& buffer : pingpong_)
      buffer = DeviceBuffer<char>(rows * widest * act_bytes(), MemoryCategory::kActivations);
  workspace_ = DeviceBuffer<char>(options.workspace_bytes, MemoryCategory::kWorkspace);
  sums_ = std::make_unique<DeviceLossSums>(stream());
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

CudaStage::~CudaStage() {
  cudaStreamSynchronize(stream());  // before the plans and buffers go (then the handle)
}

void* CudaStage::output(int slot) const {
  return act(slot, end_ - 1);
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

CudaStage::Plans& CudaStage::plans(int slot, int batch) {
  const auto key = std::make_pair(slot, batch);
  if (auto found = plans_.find(key); found != plans_.end()) return found->second;
  DDP_CHECK(batch >= 1 && batch <= max_batch_, "batch {} outside [1, {}]", batch, max_batch_);
  Plans plans;
  const ProductTypes types = product_types(options_.precision);
  const size_t ws = workspace_.bytes();
  const bool fused = options_.fused_epilogues;
  const size_t base = param_offset();
  // Autotuning's alternatives: the products without their fused epilogues.
  const bool alternatives = options_.autotune && slot == 0 && batch == max_batch_;
  auto alternative = [&](const MatmulSpec& spec) {
    return alternatives ? make_plan(lt_, spec, ws, false, CUBLASLT_EPILOGUE_DEFAULT) : nullptr;
  };
  auto weight = [&](int i) -> void* {
    const size_t at = shape_.layer(i).weight_offset - base;
    return weights_->for_products(at);
  };
  for (int i = first_; i < end_; ++i) {
    const LayerSlice& l = shape_.layer(i);
    const int local = i - first_;
    const LinearProducts p{l.in, l.out, batch, types.act, types.compute, hidden(i)};
    const MatmulSpec f = linear_forward_spec(
        p, weight(i), layer_input(slot, i), act(slot, i),
        hidden(i) ? weights_->for_products(l.bias_offset - base)
                  : static_cast<void*>(weights_->params() + l.bias_offset - base),
        hidden(i) ? slots_[slot].aux[local].data() : nullptr, aux_ld_[local]);
    // The stage's last hidden layer needs no mask: the gradient it receives is masked by a
    // kernel from its output.
    const bool mask = hidden(i) && fused && i + 1 < end_;
    plans.forward.push_back(make_plan(
        lt_, f, ws, mask, hidden(i) ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS));

    const MatmulSpec w = linear_weight_grad_spec(p, layer_input(slot, i), dz(slot, i),
                                                 weights_->grads() + l.weight_offset - base,
                                                 weights_->grads() + l.bias_offset - base);
    plans.dw.push_back(make_plan(lt_, w, ws, fused, CUBLASLT_EPILOGUE_DEFAULT));
    plans.dw_plain.push_back(alternative(w));
    // Accumulation adds the product (beta = 1); the bias gradient is then our kernel's.
    MatmulSpec wa = w;
    wa.beta = 1.0f;
    plans.dw_accumulate.push_back(make_plan(lt_, wa, ws, false, CUBLASLT_EPILOGUE_DEFAULT));

    if (i > first_ || !is_first()) {
      if (i > first_) {
        // The layer below's ReLU derivative, fused when its forward wrote the mask.
        const bool below_has_mask =
            plans.forward[local - 1]->epilogue() == CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
        const MatmulSpec x =
            linear_input_grad_spec(p, weight(i), dz(slot, i), dz(slot, i - 1),
                                   slots_[slot].aux[local - 1].data(), aux_ld_[local - 1]);
        plans.dx.push_back(
            make_plan(lt_, x, ws, fused && below_has_mask, CUBLASLT_EPILOGUE_DEFAULT));
        plans.dx_plain.push_back(alternative(x));
      } else {
        // For the previous stage, which masks it.
        const MatmulSpec x =
            linear_input_grad_spec(p, weight(i), dz(slot, i), grad_input(slot), nullptr, 0);
        plans.dx.push_back(make_plan(lt_, x, ws, false, CUBLASLT_EPILOGUE_DEFAULT));
        plans.dx_plain.push_back(nullptr);
      }
    } else {
      plans.dx.push_back(nullptr);
      plans.dx_plain.push_back(nullptr);
    }
  }
  return plans_.emplace(key, std::move(plans)).first->second;
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

void CudaStage::forward(int slot, int batch) {
  const Plans& p = plans(slot, batch);
  for (const auto& plan : p.forward) {
    plan->run(workspace_.data(), workspace_.bytes(), stream());
    after("forward matmul");
  }
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

void CudaStage::weight_grads(const Plans& p, int slot, int layer, int batch, bool accumulate) {
  const int local = layer - first_;
  const LayerSlice& l = shape_.layer(layer);
  const LtMatmul& dw = accumulate ? *p.dw_accumulate[local] : *p.dw[local];
  dw.run(workspace_.data(), workspace_.bytes(), stream());
  after("weight-gradient matmul");
  if (dw.epilogue() != CUBLASLT_EPILOGUE_BGRADB) {
    launch_bias_grad(dz(slot, layer), batch, l.out, bf16(),
                     weights_->grads() + l.bias_offset - param_offset(), accumulate, stream());
    after("bias gradient");
  }
}

void CudaStage::input_grad(const Plans& p, int slot, int layer, int batch) {
  const int local = layer - first_;
  if (!p.dx[local]) return;
  p.dx[local]->run(workspace_.data(), workspace_.bytes(), stream());
  after("input-gradient matmul");
  if (layer > first_ && p.dx[local]->epilogue() != CUBLASLT_EPILOGUE_DRELU) {
    launch_relu_mask(dz(slot, layer - 1), act(slot, layer - 1),
                     static_cast<size_t>(batch) * shape_.layer(layer - 1).out, bf16(), stream());
    after("ReLU mask");
  }
}

void CudaStage::backward(int slot, int batch, bool accumulate,
                         const std::function<void(int)>& on_layer_done) {
  const Plans& p = plans(slot, batch);
  mask_received(slot, batch);
  for (int i = end_ - 1; i >= first_; --i) {
    weight_grads(p, slot, i, batch, accumulate);
    if (on_layer_done) on_layer_done(i - first_);
    input_grad(p, slot, i, batch);
  }
}

void CudaStage::backward_input(int slot, int batch) {
  DDP_CHECK(options_.split_backward, "backward_input() without CudaStageOptions::split_backward");
  const Plans& p = plans(slot, batch);
  mask_received(slot, batch);
  for (int i = end_ - 1; i >= first_; --i)
    input_grad(p, slot, i, batch);
}

void CudaStage::backward_weight(int slot, int batch, bool accumulate,
                                const std::function<void(int)>& on_layer_done) {
  DDP_CHECK(options_.split_backward, "backward_weight() without CudaStageOptions::split_backward");
  const Plans& p = plans(slot, batch);
  for (int i = end_ - 1; i >= first_; --i) {
    weight_grads(p, slot, i, batch, accumulate);
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
  const size_t base = param_offset();
  for (int i = first_; i < end_; ++i) {
    const LayerSlice& layer = shape_.layer(i);
    const uint64_t key = mix_seed(seed, static_cast<uint64_t>(i));  // as init_params
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    const size_t weights = static_cast<size_t>(layer.in) * layer.out;
    launch_counter_uniform(weights_->params() + layer.weight_offset - base, weights, key, 0, -bound,
                           bound, stream());
    launch_counter_uniform(weights_->params() + layer.bias_offset - base, layer.out, key, weights,
                           -bound, bound, stream());
  }
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
  const Plans& p = plans(0, max_batch_);
  int fused = 0, total = 0;
  for (const auto* list : {&p.forward, &p.dw, &p.dx})
    for (const auto& plan : *list) {
      if (!plan) continue;
      ++total;
      const auto e = plan->epilogue();
      fused += e == CUBLASLT_EPILOGUE_RELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_BGRADB ||
               e == CUBLASLT_EPILOGUE_DRELU || e == CUBLASLT_EPILOGUE_BIAS;
    }
  return fmt::format("{} of {} products with fused epilogues (bias/ReLU mask, BGRADB, DRELU)",
                     fused, total);
}

void CudaStage::fill_work_buffers(float value) {
  for (Slot& slot : slots_) {
    launch_fill(slot.input.data(), slot.input.bytes() / act_bytes(), bf16(), value, stream());
    launch_fill(slot.grad_output.data(), slot.grad_output.bytes() / act_bytes(), bf16(), value,
                stream());
    if (slot.grad_input.bytes() > 0)
      launch_fill(slot.grad_input.data(), slot.grad_input.bytes() / act_bytes(), bf16(), value,
                  stream());
    for (int i = first_; i < end_; ++i) {
      DeviceBuffer<char>& act = slot.acts[i - first_];
      const bool low = hidden(i) && bf16();  // the logits are float32
      launch_fill(act.data(), act.bytes() / (low ? 2 : 4), low, value, stream());
    }
    for (auto& buffer : slot.dz)
      launch_fill(buffer.data(), buffer.bytes() / act_bytes(), bf16(), value, stream());
  }
  for (auto& buffer : pingpong_)
    if (buffer.bytes() > 0)
      launch_fill(buffer.data(), buffer.bytes() / act_bytes(), bf16(), value, stream());
  launch_fill(weights_->grads(), weights_->count(), false, value, stream());
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void CudaStage::autotune() {
  DDP_CHECK(options_.autotune, "autotune() without CudaStageOptions::autotune");
  Plans& p = plans(0, max_batch_);
  // Real values (not garbage, not zeros) in every buffer the products read.
  fill_work_buffers(0.01f);
  launch_fill(weights_->params(), weights_->count(), false, 0.01f, stream());
  if (bf16()) launch_fill(weights_->params16(), weights_->count(), true, 0.01f, stream());
  const int batch = max_batch_;
  const size_t base = param_offset();
  std::vector<TunableProduct> products;
  for (int i = first_; i < end_; ++i) {
    const int local = i - first_;
    const LayerSlice& l = shape_.layer(i);
    products.push_back({&p.forward[local], nullptr, {}});
    // Weight gradient: the fused bias gradient (BGRADB) against the plain product + our kernel.
    TunableProduct dw{&p.dw[local], nullptr, {}};
    if (p.dw[local]->epilogue() == CUBLASLT_EPILOGUE_BGRADB && p.dw_plain[local]) {
      dw.plain = &p.dw_plain[local];
      dw.plain_extra = [this, i, l, batch, base] {
        launch_bias_grad(dz(0, i), batch, l.out, bf16(), weights_->grads() + l.bias_offset - base,
                         false, stream());
      };
    }
    products.push_back(std::move(dw));
    if (!p.dx[local]) continue;
    // Input gradient: the fused ReLU derivative (DRELU) against the plain product + our mask.
    TunableProduct dx{&p.dx[local], nullptr, {}};
    if (p.dx[local]->epilogue() == CUBLASLT_EPILOGUE_DRELU && p.dx_plain[local]) {
      dx.plain = &p.dx_plain[local];
      dx.plain_extra = [this, i, batch] {
        launch_relu_mask(dz(0, i - 1), act(0, i - 1),
                         static_cast<size_t>(batch) * shape_.layer(i - 1).out, bf16(), stream());
      };
    }
    products.push_back(std::move(dx));
  }
  const std::string key =
      fmt::format("layers {} [{}, {}) | batch {} | {} | fused {} | workspace {}",
                  shape_.to_string(), first_, end_, batch, precision_name(options_.precision),
                  options_.fused_epilogues ? 1 : 0, options_.workspace_bytes);
  tuned_ = tune_products(products, key, options_.autotune_cache, workspace_.data(),
                         workspace_.bytes(), stream());
}

}  // namespace ddp
