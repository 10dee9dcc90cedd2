// CudaMlp: cuBLASLt plans built once per batch size for fixed pointers, kernels for the rest.
//
// Row-major tensors are read by cuBLASLt as column-major transposes, so with Y[B,out],
// X[B,in], W[out,in] (all row-major):
//   forward  Y^T[out,B]  = W^T'[in,out]^T * X^T[in,B]           (A = W, transposed)
//   dW       dW^T[in,out] = X^T[in,B] * (dZ^T[out,B])^T          (bias grad: BGRADB over B)
//   dX       dX^T[in,B]  = W^T'[in,out] * dZ^T[out,B]            (DRELU with the layer below's
//   mask)
#include "models/mlp_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <spdlog/spdlog.h>

#include "models/autotune_cache.h"
#include "models/lt_matmul.h"
#include "models/rng.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace ddp {

CudaMlp::CudaMlp(MlpShape shape, int max_batch, const OptimizerConfig& optimizer,
                 const CudaMlpOptions& options)
    : shape_(std::move(shape)), max_batch_(max_batch), options_(options) {
  const size_t count = shape_.param_count();
  weights_ = std::make_unique<DeviceParameters>(count, bf16(), optimizer, stream());
  for (int i = 0; i < shape_.num_layers(); ++i) {
    const int out = shape_.layer(i).out;
    const bool last = i + 1 == shape_.num_layers();
    acts_.emplace_back(static_cast<size_t>(max_batch) * out * (last ? 4 : act_bytes()),
                       MemoryCategory::kActivations);
    aux_ld_.push_back(round_up(out, 128));
    aux_.emplace_back(last ? 0 : static_cast<size_t>(aux_ld_.back() / 8) * max_batch,
                      MemoryCategory::kActivations);
  }
  const size_t grad_bytes = static_cast<size_t>(max_batch) * shape_.max_width() * act_bytes();
  grad_a_ = DeviceBuffer<char>(grad_bytes, MemoryCategory::kActivations);
  grad_b_ = DeviceBuffer<char>(grad_bytes, MemoryCategory::kActivations);
  x_batch_ = DeviceBuffer<char>(static_cast<size_t>(max_batch) * shape_.input_width() * act_bytes(),
                                MemoryCategory::kActivations);
  y_batch_ = DeviceBuffer<int32_t>(max_batch, MemoryCategory::kActivations);
  workspace_ = DeviceBuffer<char>(options.workspace_bytes, MemoryCategory::kWorkspace);
  DDP_CHECK(options.accumulate >= 1, "accumulate {}", options.accumulate);
  schedule_indices_ = DeviceBuffer<int32_t>(
      static_cast<size_t>(options.max_schedule_steps) * options.accumulate * max_batch,
      MemoryCategory::kOther);
  schedule_steps_ = DeviceBuffer<OptStep>(options.max_schedule_steps, MemoryCategory::kOther);
  pinned_indices_ = PinnedBuffer<int32_t>(schedule_indices_.count());
  pinned_steps_ = PinnedBuffer<OptStep>(schedule_steps_.count());
  counter_ = DeviceBuffer<int>(1, MemoryCategory::kOther);
  sums_ = std::make_unique<DeviceLossSums>(stream());
  DDP_CUDA_CHECK(cudaMemsetAsync(counter_.data(), 0, sizeof(int), stream()));
  build_plans(max_batch);
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

CudaMlp::~CudaMlp() {
  cudaStreamSynchronize(stream());  // before the plans and buffers go (then the handle)
}

void* CudaMlp::act(int layer) const {
  return acts_[layer].data();
}
void* CudaMlp::grad_buffer(int which) const {
  return which == 0 ? grad_a_.data() : grad_b_.data();
}

void CudaMlp::build_plans(int batch) {
  if (plans_.count(batch)) return;
  Plans plans;
  const ProductTypes types = product_types(options_.precision);
  const size_t ws = workspace_.bytes();
  const bool fused = options_.fused_epilogues;
  // Weights as the products read them: the bf16 copy in bf16 precision.
  auto weight = [&](int i) -> void* {
    const LayerSlice& l = shape_.layer(i);
    return weights_->for_products(l.weight_offset);
  };
  const int last = shape_.num_layers() - 1;
  for (int i = 0; i <= last; ++i) {
    const LayerSlice& l = shape_.layer(i);
    const bool hidden = i < last;
    const void* input = i == 0 ? x_batch_.data() : act(i - 1);
    // The layer's gradient lands in grad buffer (last - i) % 2; its input gradient in the other.
    void* dz = grad_buffer((last - i) % 2);
    void* dx = grad_buffer((last - i + 1) % 2);

    const LinearProducts p{l.in, l.out, batch, types.act, types.compute, hidden};
    const MatmulSpec f =
        linear_forward_spec(p, weight(i), input, act(i),
                            hidden ? weights_->for_products(l.bias_offset)
                                   : static_cast<void*>(weights_->params() + l.bias_offset),
                            hidden ? aux_[i].data() : nullptr, aux_ld_[i]);
    // Without the mask output the forward still fuses bias and ReLU; backward then masks
    // with a kernel.
    plans.forward.push_back(
        make_plan(lt_, f, ws, true, hidden ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS));
    if (!fused && hidden)
      plans.forward.back() = make_plan(lt_, f, ws, false, CUBLASLT_EPILOGUE_RELU_BIAS);

    const MatmulSpec w = linear_weight_grad_spec(p, input, dz, weights_->grads() + l.weight_offset,
                                                 weights_->grads() + l.bias_offset);
    plans.dw.push_back(make_plan(lt_, w, ws, fused, CUBLASLT_EPILOGUE_DEFAULT));
    plans.dw_plain.push_back(options_.autotune && batch == max_batch_
                                 ? make_plan(lt_, w, ws, false, CUBLASLT_EPILOGUE_DEFAULT)
                                 : nullptr);
    // Accumulation: the product adds to the gradient (beta = 1); the bias gradient is our
    // kernel's, since the BGRADB epilogue overwrites.
    MatmulSpec wa = w;
    wa.beta = 1.0f;
    plans.dw_accumulate.push_back(options_.accumulate > 1
                                      ? make_plan(lt_, wa, ws, false, CUBLASLT_EPILOGUE_DEFAULT)
                                      : nullptr);

    if (i > 0) {
      const bool below_has_mask =
          plans.forward[i - 1]->epilogue() == CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
      const MatmulSpec x =
          linear_input_grad_spec(p, weight(i), dz, dx, aux_[i - 1].data(), aux_ld_[i - 1]);
      plans.dx.push_back(make_plan(lt_, x, ws, fused && below_has_mask, CUBLASLT_EPILOGUE_DEFAULT));
      plans.dx_plain.push_back(options_.autotune && batch == max_batch_
                                   ? make_plan(lt_, x, ws, false, CUBLASLT_EPILOGUE_DEFAULT)
                                   : nullptr);
    } else {
      plans.dx.push_back(nullptr);
      plans.dx_plain.push_back(nullptr);
    }
  }
  if (options_.autotune && batch == max_batch_) autotune(plans, batch);
  plans_.emplace(batch, std::move(plans));
}

float CudaMlp::time_ms(const std::function<void()>& work) {
  CudaEvent start(true), stop(true);
  for (int i = 0; i < 2; ++i)
    work();
  DDP_CUDA_CHECK(cudaEventRecord(start.get(), stream()));
  constexpr int kRepeats = 5;
  for (int i = 0; i < kRepeats; ++i)
    work();
  DDP_CUDA_CHECK(cudaEventRecord(stop.get(), stream()));
  DDP_CUDA_CHECK(cudaEventSynchronize(stop.get()));
  float ms = 0;
  DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms / kRepeats;
}

// What an autotuning result depends on: the GPU, cuBLASLt, the products and their options.
std::string CudaMlp::autotune_key(int batch) const {
  int device = 0;
  DDP_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return fmt::format("{} sm_{}{} cublasLt {} | layers {} | batch {} | {} | fused {} | workspace {}",
                     prop.name, prop.major, prop.minor, cublasLtGetVersion(), shape_.to_string(),
                     batch, precision_name(options_.precision), options_.fused_epilogues ? 1 : 0,
                     options_.workspace_bytes);
}

// Applies cached choices (per layer: forward candidate, weight-gradient plain-or-fused and
// candidate, input-gradient plain-or-fused and candidate); false, changing nothing, when
// they do not fit these plans.
bool CudaMlp::apply_autotune(Plans& plans, const std::vector<int>& choices) {
  const int layers = shape_.num_layers();
  if (choices.size() != static_cast<size_t>(5 * layers)) return false;
  auto fits = [](const std::unique_ptr<LtMatmul>& plan, int index) {
    return plan && index >= 0 && static_cast<size_t>(index) < plan->candidates();
  };
  for (int i = 0; i < layers; ++i) {
    const int* c = &choices[5 * i];
    if (!fits(plans.forward[i], c[0])) return false;
    if (!fits(c[1] ? plans.dw_plain[i] : plans.dw[i], c[2])) return false;
    if (i > 0 && !fits(c[3] ? plans.dx_plain[i] : plans.dx[i], c[4])) return false;
  }
  for (int i = 0; i < layers; ++i) {
    const int* c = &choices[5 * i];
    plans.forward[i]->select(c[0]);
    if (c[1]) std::swap(plans.dw[i], plans.dw_plain[i]);
    plans.dw[i]->select(c[2]);
    if (i == 0) continue;
    if (c[3]) std::swap(plans.dx[i], plans.dx_plain[i]);
    plans.dx[i]->select(c[4]);
  }
  return true;
}

void CudaMlp::autotune(Plans& plans, int batch) {
  const std::string key = autotune_key(batch);
  if (const auto cached = load_autotune(options_.autotune_cache, key);
      cached && apply_autotune(plans, *cached)) {
    autotune_cached_ = true;
    return;
  }
  std::vector<int> choices;
  // Real values (not garbage, not zeros) in every buffer the products read.
  launch_fill(weights_->params(), weights_->count(), false, 0.01f, stream());
  if (bf16()) launch_fill(weights_->params16(), weights_->count(), true, 0.01f, stream());
  for (int i = 0; i < shape_.num_layers(); ++i) {
    const bool last = i + 1 == shape_.num_layers();
    launch_fill(act(i), acts_[i].bytes() / (last ? 4 : act_bytes()), !last && bf16(), 0.01f,
                stream());
  }
  launch_fill(grad_a_.data(), grad_a_.bytes() / act_bytes(), bf16(), 0.01f, stream());
  launch_fill(grad_b_.data(), grad_b_.bytes() / act_bytes(), bf16(), 0.01f, stream());
  launch_fill(x_batch_.data(), x_batch_.bytes() / act_bytes(), bf16(), 0.01f, stream());
  // Try every candidate algorithm of a plan; keep the fastest. Returns its time and index.
  auto tune = [&](LtMatmul& plan, const std::function<void()>& extra) {
    size_t best = 0;
    float best_ms = 1e30f;
    for (size_t c = 0; c < plan.candidates(); ++c) {
      plan.select(c);
      const float ms = time_ms([&] {
        plan.run(workspace_.data(), workspace_.bytes(), stream());
        if (extra) extra();
      });
      if (ms < best_ms) best_ms = ms, best = c;
    }
    plan.select(best);
    return std::make_pair(best_ms, static_cast<int>(best));
  };
  const int last = shape_.num_layers() - 1;
  for (int i = 0; i <= last; ++i) {
    const LayerSlice& l = shape_.layer(i);
    choices.push_back(tune(*plans.forward[i], nullptr).second);
    void* dz = grad_buffer((last - i) % 2);
    // Weight gradient: fused bias gradient (BGRADB) against the plain product + our kernel.
    if (plans.dw[i]->epilogue() == CUBLASLT_EPILOGUE_BGRADB && plans.dw_plain[i]) {
      const auto fused = tune(*plans.dw[i], nullptr);
      const auto plain = tune(*plans.dw_plain[i], [&] {
        launch_bias_grad(dz, batch, l.out, bf16(), weights_->grads() + l.bias_offset, false,
                         stream());
      });
      if (plain.first < fused.first) std::swap(plans.dw[i], plans.dw_plain[i]);
      choices.push_back(plain.first < fused.first);
      choices.push_back(plain.first < fused.first ? plain.second : fused.second);
    } else {
      choices.push_back(0);
      choices.push_back(tune(*plans.dw[i], nullptr).second);
    }
    if (i == 0) {
      choices.insert(choices.end(), {0, 0});
      continue;
    }
    // Input gradient: fused ReLU derivative (DRELU) against the plain product + our mask.
    if (plans.dx[i]->epilogue() == CUBLASLT_EPILOGUE_DRELU && plans.dx_plain[i]) {
      const auto fused = tune(*plans.dx[i], nullptr);
      const auto plain = tune(*plans.dx_plain[i], [&] {
        launch_relu_mask(grad_buffer((last - i + 1) % 2), act(i - 1),
                         static_cast<size_t>(batch) * shape_.layer(i - 1).out, bf16(), stream());
      });
      if (plain.first < fused.first) std::swap(plans.dx[i], plans.dx_plain[i]);
      choices.push_back(plain.first < fused.first);
      choices.push_back(plain.first < fused.first ? plain.second : fused.second);
    } else {
      choices.push_back(0);
      choices.push_back(tune(*plans.dx[i], nullptr).second);
    }
  }
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream()));
  autotune_save_error_ = save_autotune(options_.autotune_cache, key, choices);
}

std::string CudaMlp::epilogue_summary() const {
  const Plans& plans = plans_.at(max_batch_);
  int fused = 0, total = 0;
  for (const auto* list : {&plans.forward, &plans.dw, &plans.dx})
    for (const auto& plan : *list) {
      if (!plan) continue;
      ++total;
      const auto e = plan->epilogue();
      fused += e == CUBLASLT_EPILOGUE_RELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_BGRADB ||
               e == CUBLASLT_EPILOGUE_DRELU || (e == CUBLASLT_EPILOGUE_BIAS);
    }
  return fmt::format("{} of {} products with fused epilogues (bias/ReLU mask, BGRADB, DRELU)",
                     fused, total);
}

void CudaMlp::after(const char* op) const {
  if (!options_.sync_debug) return;
  const cudaError_t error = cudaStreamSynchronize(stream());
  DDP_CHECK(error == cudaSuccess, "--sync-debug: {} failed: {} ({})", op, cudaGetErrorName(error),
            cudaGetErrorString(error));
}

void CudaMlp::forward_layers(int batch, const void* input) {
  (void)input;
  const Plans& plans = plans_.at(batch);
  for (int i = 0; i < shape_.num_layers(); ++i) {
    plans.forward[i]->run(workspace_.data(), workspace_.bytes(), stream());
    after("forward matmul");
  }
}

void CudaMlp::backward_layers(int batch, const void* input, bool accumulate) {
  (void)input;
  const Plans& plans = plans_.at(batch);
  const int last = shape_.num_layers() - 1;
  for (int i = last; i >= 0; --i) {
    const LayerSlice& l = shape_.layer(i);
    void* dz = grad_buffer((last - i) % 2);
    DDP_CHECK(!accumulate || plans.dw_accumulate[i] != nullptr,
              "gradient accumulation needs CudaMlpOptions::accumulate > 1");
    const LtMatmul& dw = accumulate ? *plans.dw_accumulate[i] : *plans.dw[i];
    dw.run(workspace_.data(), workspace_.bytes(), stream());
    after("weight-gradient matmul");
    if (dw.epilogue() != CUBLASLT_EPILOGUE_BGRADB) {
      launch_bias_grad(dz, batch, l.out, bf16(), weights_->grads() + l.bias_offset, accumulate,
                       stream());
      after("bias gradient");
    }
    if (layer_hook_) layer_hook_(i);
    if (i > 0) {
      plans.dx[i]->run(workspace_.data(), workspace_.bytes(), stream());
      after("input-gradient matmul");
      if (plans.dx[i]->epilogue() != CUBLASLT_EPILOGUE_DRELU) {
        launch_relu_mask(grad_buffer((last - i + 1) % 2), act(i - 1),
                         static_cast<size_t>(batch) * shape_.layer(i - 1).out, bf16(), stream());
        after("ReLU mask");
      }
    }
  }
}

void CudaMlp::set_params(const float* host) {
  weights_->set(host);
}

void CudaMlp::init_params_on_device(uint64_t seed) {
  for (int i = 0; i < shape_.num_layers(); ++i) {
    const LayerSlice& layer = shape_.layer(i);
    const uint64_t key = mix_seed(seed, static_cast<uint64_t>(i));  // as init_params
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    const size_t weights = static_cast<size_t>(layer.in) * layer.out;
    launch_counter_uniform(weights_->params() + layer.weight_offset, weights, key, 0, -bound, bound,
                           stream());
    launch_counter_uniform(weights_->params() + layer.bias_offset, layer.out, key, weights, -bound,
                           bound, stream());
  }
  refresh_low_precision_params();
}

void CudaMlp::refresh_low_precision_params() {
  weights_->refresh_low_precision();
}

void CudaMlp::get_params(float* host) const {
  weights_->get(host);
}

void CudaMlp::get_grads(float* host) const {
  weights_->get_grads(host);
}

namespace {
void upload_split(const Split& split, DeviceBuffer<float>* x, DeviceBuffer<int32_t>* y,
                  cudaStream_t stream) {
  *x = DeviceBuffer<float>(split.x.size(), MemoryCategory::kData);
  *y = DeviceBuffer<int32_t>(split.y.size(), MemoryCategory::kData);
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(x->data(), split.x.data(), x->bytes(), cudaMemcpyHostToDevice, stream));
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(y->data(), split.y.data(), y->bytes(), cudaMemcpyHostToDevice, stream));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
}
}  // namespace

void CudaMlp::set_train_data(const Split& split) {
  upload_split(split, &train_x_, &train_y_, stream());
  train_n_ = split.n;
}

void CudaMlp::set_train_data_host(const Split& split) {
  host_split_ = &split;
  train_n_ = split.n;
  const size_t in_count = static_cast<size_t>(max_batch_) * shape_.input_width();
  copy_stream_ = std::make_unique<CudaStream>();
  for (int slot = 0; slot < 2; ++slot) {
    staged_x_host_[slot] = PinnedBuffer<float>(in_count);
    staged_y_host_[slot] = PinnedBuffer<int32_t>(max_batch_);
    staged_x_[slot] = DeviceBuffer<float>(in_count, MemoryCategory::kData);
    staged_y_[slot] = DeviceBuffer<int32_t>(max_batch_, MemoryCategory::kData);
    copied_[slot] = std::make_unique<CudaEvent>();
    consumed_[slot] = std::make_unique<CudaEvent>();
  }
}

void CudaMlp::stage_batch(const int32_t* indices) {
  DDP_CHECK(host_split_ != nullptr, "stage_batch() needs set_train_data_host()");
  DDP_CHECK(staged_ - consumed_count_ < 2, "two batches are staged already");
  const int slot = static_cast<int>(staged_ % 2);
  // The pinned slot is free once its previous copy has finished.
  if (staged_ >= 2) DDP_CUDA_CHECK(cudaEventSynchronize(copied_[slot]->get()));
  const int dim = shape_.input_width();
  float* x = staged_x_host_[slot].data();
  int32_t* y = staged_y_host_[slot].data();
  for (int i = 0; i < max_batch_; ++i) {
    std::memcpy(x + static_cast<size_t>(i) * dim,
                host_split_->x.data() + static_cast<size_t>(indices[i]) * dim, sizeof(float) * dim);
    y[i] = host_split_->y[indices[i]];
  }
  cudaStream_t copy = copy_stream_->get();
  // The device slot is free once the step that used it has read it.
  if (staged_ >= 2) DDP_CUDA_CHECK(cudaStreamWaitEvent(copy, consumed_[slot]->get(), 0));
  DDP_CUDA_CHECK(cudaMemcpyAsync(staged_x_[slot].data(), x, staged_x_[slot].bytes(),
                                 cudaMemcpyHostToDevice, copy));
  DDP_CUDA_CHECK(cudaMemcpyAsync(staged_y_[slot].data(), y, staged_y_[slot].bytes(),
                                 cudaMemcpyHostToDevice, copy));
  DDP_CUDA_CHECK(cudaEventRecord(copied_[slot]->get(), copy));
  ++staged_;
}

void CudaMlp::set_test_data(const Split& split) {
  upload_split(split, &test_x_, &test_y_, stream());
  test_n_ = split.n;
}

void CudaMlp::upload_schedule(const int32_t* indices, const OptStep* steps, int num_steps) {
  DDP_CHECK(num_steps >= 1 && num_steps <= options_.max_schedule_steps,
            "schedule chunk of {} steps", num_steps);
  // The previous chunk's steps must have read the pinned buffers before they are rewritten.
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream()));
  const size_t count = static_cast<size_t>(num_steps) * options_.accumulate * max_batch_;
  std::memcpy(pinned_indices_.data(), indices, sizeof(int32_t) * count);
  std::memcpy(pinned_steps_.data(), steps, sizeof(OptStep) * num_steps);
  DDP_CUDA_CHECK(cudaMemcpyAsync(schedule_indices_.data(), pinned_indices_.data(),
                                 sizeof(int32_t) * count, cudaMemcpyHostToDevice, stream()));
  DDP_CUDA_CHECK(cudaMemcpyAsync(schedule_steps_.data(), pinned_steps_.data(),
                                 sizeof(OptStep) * num_steps, cudaMemcpyHostToDevice, stream()));
  DDP_CUDA_CHECK(cudaMemsetAsync(counter_.data(), 0, sizeof(int), stream()));
}

void CudaMlp::forward_backward(float grad_scale, bool accumulate, int micro) {
  DDP_CHECK(train_n_ > 0, "set_train_data() must come before training");
  DDP_CHECK(micro >= 0 && micro < options_.accumulate, "micro-batch {} of {}", micro,
            options_.accumulate);
  if (host_split_ != nullptr) {
    DDP_CHECK(options_.accumulate == 1, "host staging takes one batch a step");
    DDP_CHECK(consumed_count_ < staged_, "step {} has no staged batch: call stage_batch() first",
              consumed_count_);
    const int slot = static_cast<int>(consumed_count_ % 2);
    const size_t in_count = static_cast<size_t>(max_batch_) * shape_.input_width();
    DDP_CUDA_CHECK(cudaStreamWaitEvent(stream(), copied_[slot]->get(), 0));
    if (bf16())
      launch_to_bf16(staged_x_[slot].data(), x_batch_.data(), in_count, stream());
    else
      DDP_CUDA_CHECK(cudaMemcpyAsync(x_batch_.data(), staged_x_[slot].data(), in_count * 4,
                                     cudaMemcpyDeviceToDevice, stream()));
    DDP_CUDA_CHECK(cudaMemcpyAsync(y_batch_.data(), staged_y_[slot].data(), staged_y_[slot].bytes(),
                                   cudaMemcpyDeviceToDevice, stream()));
    DDP_CUDA_CHECK(cudaEventRecord(consumed_[slot]->get(), stream()));
    ++consumed_count_;
  } else {
    launch_gather_batch(train_x_.data(), train_y_.data(), shape_.input_width(),
                        schedule_indices_.data() + static_cast<size_t>(micro) * max_batch_,
                        counter_.data(), options_.accumulate * max_batch_, max_batch_,
                        x_batch_.data(), bf16(), y_batch_.data(), stream());
  }
  after("gather");
  forward_layers(max_batch_, x_batch_.data());
  const int last = shape_.num_layers() - 1;
  launch_softmax_xent(static_cast<const float*>(act(last)), y_batch_.data(), max_batch_,
                      shape_.num_classes(), grad_scale, grad_buffer(0), bf16(),
                      sums_->loss(DeviceLossSums::kTraining),
                      sums_->correct(DeviceLossSums::kTraining), stream());
  after("softmax cross-entropy");
  if (forward_hook_) forward_hook_();
  backward_layers(max_batch_, x_batch_.data(), accumulate);
}

void CudaMlp::optimizer_range(size_t offset, size_t count, cudaStream_t stream) {
  weights_->update(offset, count, schedule_steps_.data(), counter_.data(), stream);
}

void CudaMlp::optimizer_step() {
  if (!optimizer_in_hooks_) optimizer_range(0, shape_.param_count(), stream());
  after("optimizer");
  launch_increment(counter_.data(), stream());
}

void CudaMlp::run_step(const std::function<void()>& whole_step) {
  graph_.run(stream(), options_.cuda_graph && !options_.sync_debug && host_split_ == nullptr,
             whole_step);
}

LossSum CudaMlp::take_sums() {
  return sums_->take(DeviceLossSums::kTraining);
}

LossSum CudaMlp::evaluate_range(int64_t begin, int64_t end) {
  DDP_CHECK(begin >= 0 && begin <= end && end <= test_n_, "test samples [{}, {}) of {}", begin, end,
            test_n_);
  const int dim = shape_.input_width();
  const int last = shape_.num_layers() - 1;
  for (int64_t at = begin; at < end; at += max_batch_) {
    const int count = static_cast<int>(std::min<int64_t>(max_batch_, end - at));
    build_plans(count);
    const float* x = test_x_.data() + at * dim;
    if (bf16())
      launch_to_bf16(x, x_batch_.data(), static_cast<size_t>(count) * dim, stream());
    else
      DDP_CUDA_CHECK(cudaMemcpyAsync(x_batch_.data(), x, sizeof(float) * count * dim,
                                     cudaMemcpyDeviceToDevice, stream()));
    forward_layers(count, x_batch_.data());
    launch_softmax_xent(static_cast<const float*>(act(last)), test_y_.data() + at, count,
                        shape_.num_classes(), 0.0f, nullptr, bf16(),
                        sums_->loss(DeviceLossSums::kEvaluation),
                        sums_->correct(DeviceLossSums::kEvaluation), stream());
  }
  return sums_->take(DeviceLossSums::kEvaluation);
}

std::vector<float> CudaMlp::forward_host(const float* x, int batch) {
  DDP_CHECK(batch >= 1 && batch <= max_batch_, "batch {} outside [1, {}]", batch, max_batch_);
  build_plans(batch);
  const size_t in_count = static_cast<size_t>(batch) * shape_.input_width();
  DeviceBuffer<float> staging(in_count, MemoryCategory::kOther);
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(staging.data(), x, in_count * 4, cudaMemcpyHostToDevice, stream()));
  if (bf16())
    launch_to_bf16(staging.data(), x_batch_.data(), in_count, stream());
  else
    DDP_CUDA_CHECK(cudaMemcpyAsync(x_batch_.data(), staging.data(), in_count * 4,
                                   cudaMemcpyDeviceToDevice, stream()));
  forward_layers(batch, x_batch_.data());
  std::vector<float> logits(static_cast<size_t>(batch) * shape_.num_classes());
  DDP_CUDA_CHECK(cudaMemcpyAsync(logits.data(), act(shape_.num_layers() - 1), logits.size() * 4,
                                 cudaMemcpyDeviceToHost, stream()));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream()));
  return logits;
}

void CudaMlp::backward_host(const int32_t* labels, int batch, float grad_scale) {
  build_plans(batch);
  DDP_CUDA_CHECK(cudaMemcpyAsync(y_batch_.data(), labels, sizeof(int32_t) * batch,
                                 cudaMemcpyHostToDevice, stream()));
  const int last = shape_.num_layers() - 1;
  launch_softmax_xent(static_cast<const float*>(act(last)), y_batch_.data(), batch,
                      shape_.num_classes(), grad_scale, grad_buffer(0), bf16(),
                      sums_->loss(DeviceLossSums::kTraining),
                      sums_->correct(DeviceLossSums::kTraining), stream());
  backward_layers(batch, x_batch_.data(), false);
  take_sums();
}

std::vector<std::pair<std::string, std::vector<float>>> CudaMlp::get_optimizer_state() const {
  return weights_->optimizer_state();
}

void CudaMlp::set_optimizer_state(
    const std::vector<std::pair<std::string, std::vector<float>>>& state) {
  weights_->set_optimizer_state(state);
}

void CudaMlp::poison_outputs() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < shape_.num_layers(); ++i) {
    const bool last = i + 1 == shape_.num_layers();
    launch_fill(act(i), acts_[i].bytes() / (last ? 4 : act_bytes()), !last && bf16(), nan,
                stream());
  }
  launch_fill(grad_a_.data(), grad_a_.bytes() / act_bytes(), bf16(), nan, stream());
  launch_fill(grad_b_.data(), grad_b_.bytes() / act_bytes(), bf16(), nan, stream());
  launch_fill(weights_->grads(), weights_->count(), false, nan, stream());
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

std::string CudaMlp::memory_report() const {
  return fmt::format("this process holds {}; {}", memory_ledger().describe(), driver_memory_line());
}

}  // namespace ddp
