// The MLP on the GPU: flat parameter, gradient and optimizer-state buffers allocated once;
// Linear layers through cuBLASLt with bias+ReLU fused into the forward epilogue, the ReLU
// derivative (DRELU) into the input-gradient product and the bias gradient (BGRADB) into the
// weight-gradient product; fused softmax cross-entropy and one optimizer kernel. The whole
// training step (gather, forward, loss, backward, optimizer) runs from device-resident data
// and schedule, so it is captured once in a CUDA graph and replayed.
// Only built with CUDA. All calls are on the model's compute stream unless stated.
#pragma once

#include <cublasLt.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/cuda_kernels.h"
#include "models/dataset.h"
#include "models/device_loss.h"
#include "models/device_parameters.h"
#include "models/lt_matmul.h"
#include "models/mlp.h"
#include "models/optimizer.h"
#include "models/precision.h"
#include "runtime/device_buffer.h"
#include "runtime/step_graph.h"

namespace ddp {

struct CudaMlpOptions {
  Precision precision = Precision::kFp32;
  bool fused_epilogues = true;  // false: plain products + our kernels (comparison, fallback)
  bool cuda_graph = true;
  bool sync_debug = false;  // synchronise after every op and name the one that failed
  size_t workspace_bytes = 32u << 20;
  int max_schedule_steps = 512;  // steps per uploaded schedule chunk
  // Micro-batches per step (gradient accumulation): the model's batch is one micro-batch;
  // a step gathers, forwards and backwards each in turn, gradients accumulated on the
  // device (cuBLASLt beta = 1), then runs the optimizer once; all inside the captured graph.
  int accumulate = 1;
  // At start, time every candidate algorithm of every product, and the fused epilogues
  // against plain products plus our kernels, and keep the fastest. Results may then differ
  // in the last bits from a run without it (other algorithms sum in another order).
  bool autotune = false;
  // Where autotuning keeps its choices between runs (autotune_cache.h); empty: not kept.
  std::string autotune_cache;
};

// One cuBLASLt product with its descriptors and chosen algorithm, for fixed pointers.
class LtMatmul;

class CudaMlp {
 public:
  CudaMlp(MlpShape shape, int max_batch, const OptimizerConfig& optimizer,
          const CudaMlpOptions& options);
  ~CudaMlp();
  CudaMlp(const CudaMlp&) = delete;
  CudaMlp& operator=(const CudaMlp&) = delete;

  const MlpShape& shape() const { return shape_; }
  cudaStream_t stream() const { return stream_.get(); }
  float* device_params() const { return weights_->params(); }
  float* device_grads() const { return weights_->grads(); }

  // Host <-> device copies of the flat buffers (synchronous).
  void set_params(const float* host);
  // init_params(shape, seed) made on the device (bitwise the host's values), without the
  // host's fill and upload. Synchronises.
  void init_params_on_device(uint64_t seed);
  // After the float32 parameters changed on the device (a broadcast): the bf16 copy that
  // bf16 products read, made again from them.
  void refresh_low_precision_params();
  void get_params(float* host) const;
  void get_grads(float* host) const;

  // Uploads a split to the device (once); batches are then gathered on the GPU.
  void set_train_data(const Split& split);
  // For a training set too large for the device: keeps `split` on the host (it must outlive
  // the model); each batch is gathered on the host into pinned memory and copied on the copy
  // stream, one batch ahead (stage_batch), and steps run without a graph.
  void set_train_data_host(const Split& split);
  bool host_staged() const { return host_split_ != nullptr; }
  // Host staging: gathers the batch of the next step to run (its sample indices, batch of
  // them) and starts its copy. Call once before the first step and then once per step, for
  // the step after the one about to run; at most two batches are staged at a time.
  void stage_batch(const int32_t* indices);
  void set_test_data(const Split& split);

  // Uploads the next chunk of the schedule: for each of `steps` steps, accumulate x batch
  // sample indices (into the training split; micro-batch k's batch after micro-batch k-1's)
  // and the optimizer scalars; resets the device step counter.
  void upload_schedule(const int32_t* indices, const OptStep* steps, int num_steps);

  // Forward and backward of micro-batch `micro` of the current step of the schedule:
  // gradients over device_grads() (added with `accumulate`) scaled by grad_scale.
  // Stream-ordered.
  void forward_backward(float grad_scale, bool accumulate = false, int micro = 0);
  // The optimizer on the flat buffers with the current step's scalars, then the step counter
  // moves on. Stream-ordered. With set_optimizer_in_hooks(true) only the counter moves: the
  // caller has updated every parameter with optimizer_range() (and joined those updates back
  // into stream()).
  void optimizer_step();
  // The optimizer on parameters [offset, offset + count) of the flat buffers, on `stream`,
  // with the current step's scalars: elementwise, so any partition of the buffer gives
  // bitwise the whole-buffer result.
  void optimizer_range(size_t offset, size_t count, cudaStream_t stream);
  void set_optimizer_in_hooks(bool on) { optimizer_in_hooks_ = on; }
  // Runs `whole_step` (one step's work on stream()): eagerly for the first step, captured
  // into a CUDA graph for the second and replayed from it afterwards (without calling
  // `whole_step`) when graphs are on; eagerly every time otherwise (host staging, sync_debug).
  void run_step(const std::function<void()>& whole_step);
  int accumulate() const { return options_.accumulate; }
  int max_schedule_steps() const { return options_.max_schedule_steps; }

  // Training loss summed and hits counted since the last call (synchronises the stream).
  LossSum take_sums();

  // Loss sum and hits over test samples [begin, end) (synchronous; no gradients).
  LossSum evaluate_range(int64_t begin, int64_t end);

  // Testing hooks: forward on host input x[batch, in]; returns logits[batch, classes].
  std::vector<float> forward_host(const float* x, int batch);
  // After forward_host: loss gradient for labels (host), backward into device_grads().
  void backward_host(const int32_t* labels, int batch, float grad_scale);
  // Called (on the host, in stream order) as soon as layer i's gradients are enqueued,
  // layers last to first: data parallelism starts that bucket's all-reduce there.
  void set_layer_hook(std::function<void(int)> hook) { layer_hook_ = std::move(hook); }
  // Called (on the host, in stream order) once a micro-batch's forward and loss are enqueued,
  // before its backward (the GPU timeline marks it).
  void set_forward_hook(std::function<void()> hook) { forward_hook_ = std::move(hook); }
  // Optimizer state for checkpoints: SGD "momentum"; AdamW "exp_avg", "exp_avg_sq".
  std::vector<std::pair<std::string, std::vector<float>>> get_optimizer_state() const;
  void set_optimizer_state(const std::vector<std::pair<std::string, std::vector<float>>>& state);
  // Fills activations, activation gradients and parameter gradients with NaN, so that a test
  // sees any element an op failed to write.
  void poison_outputs();
  // Which products use cuBLASLt's fused epilogues (and which fell back), for the log.
  std::string epilogue_summary() const;
  // With options.autotune: whether the choices came from the cache (autotune_cache.h), and
  // why they could not be stored there (empty when they were, or came from it).
  bool autotune_cached() const { return autotune_cached_; }
  const std::string& autotune_save_error() const { return autotune_save_error_; }
  // "what this process holds vs what the driver sees"
  std::string memory_report() const;

 private:
  void build_plans(int batch);
  void forward_layers(int batch, const void* input);
  void backward_layers(int batch, const void* input, bool accumulate);
  void after(const char* op) const;
  bool bf16() const { return options_.precision == Precision::kBf16; }
  size_t act_bytes() const { return bf16() ? 2 : 4; }
  void* act(int layer) const;
  void* grad_buffer(int which) const;

  MlpShape shape_;
  int max_batch_;
  CudaMlpOptions options_;
  CudaStream stream_;
  LtHandle lt_;

  std::unique_ptr<DeviceParameters> weights_;  // parameters, gradients, bf16 copy, optimizer
  std::vector<DeviceBuffer<char>> acts_;       // output of each layer, [max_batch, out]
  std::vector<DeviceBuffer<char>> aux_;        // ReLU bit masks of hidden layers
  std::vector<int64_t> aux_ld_;
  DeviceBuffer<char> grad_a_, grad_b_;  // [max_batch, max_width] activation gradients
  DeviceBuffer<char> x_batch_;          // gathered input [max_batch, in]
  DeviceBuffer<int32_t> y_batch_;
  DeviceBuffer<char> workspace_;
  DeviceBuffer<float> train_x_, test_x_;
  DeviceBuffer<int32_t> train_y_, test_y_;
  int64_t train_n_ = 0, test_n_ = 0;
  DeviceBuffer<int32_t> schedule_indices_;
  DeviceBuffer<OptStep> schedule_steps_;
  PinnedBuffer<int32_t> pinned_indices_;
  PinnedBuffer<OptStep> pinned_steps_;
  DeviceBuffer<int> counter_;
  std::unique_ptr<DeviceLossSums> sums_;  // the loss's sums, training and evaluation
  int schedule_batch_ = 0;

  // Plans per batch size: forward[i], dw[i], dx[i].
  struct Plans {
    std::vector<std::unique_ptr<LtMatmul>> forward, dw, dx;
    std::vector<std::unique_ptr<LtMatmul>> dw_plain, dx_plain;  // alternatives for autotune
    std::vector<std::unique_ptr<LtMatmul>> dw_accumulate;       // beta = 1 (accumulate > 1)
  };
  void autotune(Plans& plans, int batch);
  std::string autotune_key(int batch) const;
  bool apply_autotune(Plans& plans, const std::vector<int>& choices);
  bool autotune_cached_ = false;
  std::string autotune_save_error_;
  float time_ms(const std::function<void()>& work);
  std::map<int, Plans> plans_;

  std::function<void(int)> layer_hook_;
  std::function<void()> forward_hook_;
  bool optimizer_in_hooks_ = false;
  // Host staging: two slots of pinned and device buffers, the copy stream and its events.
  const Split* host_split_ = nullptr;
  PinnedBuffer<float> staged_x_host_[2];
  PinnedBuffer<int32_t> staged_y_host_[2];
  DeviceBuffer<float> staged_x_[2];
  DeviceBuffer<int32_t> staged_y_[2];
  std::unique_ptr<CudaStream> copy_stream_;
  std::unique_ptr<CudaEvent> copied_[2], consumed_[2];
  int64_t staged_ = 0;          // batches staged so far
  int64_t consumed_count_ = 0;  // batches used by steps
  StepGraph graph_;             // the step, captured at the second and replayed
};

}  // namespace ddp
