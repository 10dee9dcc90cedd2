// The MLP on the GPU, as CpuStage is on the CPU: layers [first, end) of the model, the whole
// model being stage 0 of 1. It owns its layers' parameters, gradients and optimizer state
// (one flat buffer each, in the whole model's layout from the stage's first weight), and
// keeps the activations of several micro-batches at once (slots). Linear layers go through
// cuBLASLt with bias+ReLU fused into the forward epilogue (with the ReLU mask as its aux
// output), the ReLU derivative (DRELU) into the input-gradient product and the bias gradient
// (BGRADB) into the weight-gradient product. Every buffer a slot uses is its own allocation,
// so the plans (built once per slot and batch size) bake in fixed pointers and a step can be
// captured in a CUDA graph. Gradients accumulate over micro-batches (beta = 1). The loss
// (fused softmax cross-entropy) is used by the last stage only; the optimizer is the
// one-kernel update over the flat buffers. What feeds it samples is BatchFeeder's.
// Only built with CUDA. All calls are on the stage's compute stream unless stated.
#pragma once

#include <cublasLt.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/cpu_ops.h"
#include "models/cuda_kernels.h"
#include "models/device_loss.h"
#include "models/device_parameters.h"
#include "models/linear_cuda.h"
#include "models/lt_matmul.h"
#include "models/mlp.h"
#include "models/optimizer.h"
#include "models/plan_tuner.h"
#include "models/precision.h"
#include "runtime/device_buffer.h"

namespace ddp {

struct CudaStageOptions {
  Precision precision = Precision::kFp32;
  bool fused_epilogues = true;
  bool sync_debug = false;  // synchronise after every op and name the one that failed
  // The SMs each matrix product may use (cuBLASLt's SM_COUNT_TARGET), the rest left to work
  // on other streams (the overlapped optimizer); 0: all.
  int product_sms = 0;
  size_t workspace_bytes = 32u << 20;
  // autotune(): time every candidate algorithm of every product of slot 0 at max_batch, and
  // the fused epilogues against plain products plus our kernels, and keep the fastest.
  // Results may then differ in the last bits from a run without it (other algorithms sum in
  // another order). `autotune_cache`: where the choices are kept between runs (empty: not).
  bool autotune = false;
  std::string autotune_cache;
  // backward(): each layer's weight gradient on a second stream (with a workspace of its
  // own) beside its input gradient, joined before on_layer_done (WeightGradStream, mlp.h).
  WeightGradStream weight_grad_stream = WeightGradStream::kAuto;
  // backward_input / backward_weight (zero-bubble schedules): every slot keeps each layer's
  // output gradient until its weight half (else two buffers serve every slot's backward).
  bool split_backward = false;
  // The gradients in a ring of slots instead of one buffer (GradientRing; the owner decides).
  GradientRing gradient_ring;
  // Where the stage's own whole gradient buffer comes from (null: cudaMalloc).
  const DeviceAllocator* grads_memory = nullptr;
  // --recompute (activation checkpointing): the layers' outputs but the stage's last live in
  // one working set, of the slot forwarded last; backward (or a half) of another slot first
  // forwards it again from its input, bitwise as before. A slot keeps its input, its output
  // (what goes to the next stage or into the loss) and its gradients.
  bool recompute = false;
  // Several stages of one rank (interleaved-1f1b, zb-v): the stage runs on the rank's stream
  // and keeps its parameters, gradients and optimizer state in the rank's flat buffers, from
  // element `offset` (null: its own stream and buffers).
  struct Shared {
    DeviceParameters* weights = nullptr;
    size_t offset = 0;
    cudaStream_t stream = nullptr;
  } shared;
};

class LtMatmul;

class CudaStage : public StageLayers {
 public:
  // Layers [first, end) of `shape`; micro-batches of at most max_batch samples; `slots`
  // micro-batches in flight. 0 <= first < end <= shape.num_layers().
  CudaStage(MlpShape shape, int first, int end, int max_batch, int slots,
            const OptimizerConfig& optimizer, const CudaStageOptions& options);
  ~CudaStage();
  CudaStage(const CudaStage&) = delete;
  CudaStage& operator=(const CudaStage&) = delete;

  int max_batch() const { return max_batch_; }
  int slots() const { return static_cast<int>(slots_.size()); }
  cudaStream_t stream() const { return stream_; }
  // Activations between stages are bf16 with bf16 precision, else float32.
  bool bf16() const { return options_.precision == Precision::kBf16; }
  size_t act_bytes() const { return bf16() ? 2 : 4; }
  float* params() const { return weights_->params(); }
  float* grads() const { return weights_->grads(); }
  // The flat buffers and their optimizer (whose state its owner may cut to a part).
  DeviceParameters& weights() const { return *weights_; }

  // Host copies of the stage's parameters (synchronous); set_params also makes the bf16 copy.
  void set_params(const float* host);
  void get_params(float* host) const;
  void get_grads(float* host) const;
  // init_params(shape, seed)'s values of the stage's layers made on the device (bitwise the
  // host's), without the host's fill and upload. Synchronises.
  void init_params_on_device(uint64_t seed);
  // After the float32 parameters changed on the device (a broadcast): the bf16 copy again.
  void refresh_low_precision_params();
  // Optimizer state for checkpoints, this stage's slice: SGD "momentum"; AdamW "exp_avg",
  // "exp_avg_sq" (the CPU optimizer's names).
  std::vector<std::pair<std::string, std::vector<float>>> get_optimizer_state() const;
  void set_optimizer_state(const std::vector<std::pair<std::string, std::vector<float>>>& state);

  // A slot's buffers. input: [max_batch, in_width] in activation type (the first stage's
  // gathered batch, else the previous stage's output); labels: [max_batch] (last stage);
  // output: [max_batch, out_width] (float32 logits on the last stage, else activations after
  // ReLU); grad_output: the loss gradient w.r.t. the output (received from the next stage, or
  // written by loss()); grad_input: w.r.t. the input, for the previous stage (null on the
  // first stage).
  void* input(int slot) const { return slots_[slot].input.data(); }
  int32_t* labels(int slot) const { return slots_[slot].labels.data(); }
  void* output(int slot) const;
  void* grad_output(int slot) const { return slots_[slot].grad_output.data(); }
  void* grad_input(int slot) const;

  // The first stage: input(slot) = rows x[indices[*counter * stride + i]] (float32 data,
  // converted); the last stage: labels(slot) = y[same]. Device pointers (counter null:
  // offset 0); the others are ignored (null).
  void gather(const float* x, const int32_t* y, int dim, const int32_t* indices, const int* counter,
              int stride, int batch, int slot);
  // input(slot) = x[batch, in_width] (float32, on the device), converted to bf16 if needed;
  // labels(slot) = y[batch] (device).
  void set_input(const float* x, int batch, int slot);
  void set_labels(const int32_t* y, int batch, int slot);
  void forward(int slot, int batch);
  // Last stage, after forward(slot): softmax cross-entropy of output(slot) against `labels`
  // (default labels(slot)); its gradient, scaled by grad_scale, into grad_output(slot) unless
  // grad_scale is 0 (evaluation). Loss sum and hits accumulate on the device into the
  // training or the evaluation sums (take_sums).
  void loss(int slot, int batch, float grad_scale, const int32_t* labels = nullptr,
            bool evaluation = false);
  // After forward(slot) and grad_output(slot) written: parameter gradients over grads()
  // (added with `accumulate`), grad_input(slot) for the previous stage. on_layer_done(i), i
  // counted from the stage's first layer, is called (host, in stream order) as soon as that
  // layer's gradients are enqueued, last first.
  void backward(int slot, int batch, bool accumulate,
                const std::function<void(int)>& on_layer_done = {});
  // backward() in two halves, bitwise the same gradients (options.split_backward):
  // backward_input writes grad_input(slot) for the previous stage and keeps each layer's
  // output gradient in the slot; backward_weight then writes (or adds) the parameter
  // gradients from them, calling on_layer_done as backward does. The slot is forwarded again
  // only after both.
  void backward_input(int slot, int batch);
  void backward_weight(int slot, int batch, bool accumulate,
                       const std::function<void(int)>& on_layer_done = {});
  // The optimizer on the stage's flat buffers with the scalars steps[*counter] (device
  // memory; counter null: steps[0]).
  void optimizer_step(const OptStep* steps, const int* counter);
  // The same on parameters [offset, offset + count) of the stage's buffers, on `stream`:
  // elementwise, so any partition of the buffer gives bitwise the whole-buffer result.
  void optimizer_range(size_t offset, size_t count, const OptStep* steps, const int* counter,
                       cudaStream_t stream);

  // `acquire(layer, next)` is called (host, in stream order) before each use of a layer's
  // parameters (its forward, its input gradient), `next` being the layer this pass uses next
  // (-1: none), so that the caller fills the layer's slot (DeviceParameters::place_layers) and
  // may start on the next; the plans are made again, on the parameters' new place.
  void set_layer_hook(std::function<void(int layer, int next)> acquire);
  // The layer whose parameters the next forward (`backward` false) or backward, or its input
  // half, of `slot` reads first (with --recompute, a backward forwards again first), as the hook
  // will be told; -1: none (the first stage's one layer has no input gradient to compute).
  int first_read(bool backward, int slot) const;
  // Forwards run again for a backward (--recompute) so far.
  int64_t recomputed() const { return recomputed_; }
  // Loss summed and hits counted since the last call (synchronises the stream).
  LossSum take_sums(bool evaluation);
  // Where the training loss sum and hits accumulate on the device (take_sums(false) reads them).
  double* training_loss_sum() const { return sums_->loss(DeviceLossSums::kTraining); }
  int* training_hits() const { return sums_->correct(DeviceLossSums::kTraining); }
  // "what this process holds vs what the driver sees"
  std::string memory_report() const;
  // Which products use cuBLASLt's fused epilogues (and which fell back), for the log.
  std::string epilogue_summary();
  // Whether backward() runs the weight gradients on a second stream (options, kAuto decided).
  bool weight_grads_beside() const { return side_.has_value(); }

  // With options.autotune (plan_tuner.h): tunes slot 0's products at max_batch; the weights
  // and every slot's buffers are overwritten (call it before the weights are set).
  void autotune();
  bool autotune_cached() const { return tuned_.cached; }
  const std::string& autotune_save_error() const { return tuned_.save_error; }
  // Every slot's activations and activation gradients and the parameter gradients set to
  // `value`: real values for autotuning, NaN for a test that must see every element written.
  void fill_work_buffers(float value);

 private:
  struct Slot {
    DeviceBuffer<char> input, grad_output, grad_input;
    DeviceBuffer<int32_t> labels;
    std::vector<DeviceBuffer<char>> dz;  // split backward: every layer's output gradient but
                                         // the last's (grad_output)
  };
  // Every layer's plans of (slot, batch), once.
  void build(int slot, int batch);
  void after(const char* op) const;
  CudaLinear& layer(int i) const { return *layers_[i - first_]; }
  // Where layer i's output gradient lives during backward.
  void* dz(int slot, int layer) const;
  // The received gradient masked by the stage's last ReLU (not on the last stage).
  void mask_received(int slot, int batch);
  // --recompute: the working set holds the slot's layer outputs (forwarded again if not).
  void ensure_forwarded(int slot);
  bool hidden(int layer) const { return layer + 1 < shape_.num_layers(); }

  int max_batch_;
  CudaStageOptions options_;
  std::optional<CudaStream> own_stream_;  // unless the stage shares its rank's
  cudaStream_t stream_;
  LtHandle lt_;
  std::unique_ptr<DeviceParameters> own_weights_;  // parameters, gradients, bf16 copy, optimizer
  DeviceParameters* weights_;                      // its own, or its rank's
  std::vector<Slot> slots_;
  DeviceBuffer<char> pingpong_[2];  // every slot's output gradients, without split backward
  DeviceBuffer<char> workspace_;
  // backward()'s second stream for the weight gradients, where they run beside (with its
  // workspace, and the events that fork it from the stage's stream and join it back).
  struct Side {
    CudaStream stream;
    DeviceBuffer<char> workspace;
    CudaEvent fork, join;
  };
  std::optional<Side> side_;
  std::vector<std::unique_ptr<CudaLinear>> layers_;  // their plans go before the handle
  std::unique_ptr<DeviceLossSums> sums_;             // the loss's sums, training and evaluation
  TuneResult tuned_;
  std::function<void(int, int)> acquire_;  // fills a placed layer's slot before its use
  // Before layer i's parameters are read, in a pass that goes up (forward) or down.
  void acquire(int i, bool up) const {
    if (acquire_) acquire_(i, up ? (i + 1 < end_ ? i + 1 : -1) : (i > first_ ? i - 1 : -1));
  }
  int working_slot_ = -1;      // --recompute: the slot whose layer outputs the working set holds
  std::vector<int> batch_of_;  // [slot]: its batch at its last forward
  int64_t recomputed_ = 0;
};

}  // namespace ddp
