// The CPU runner: CpuStage's layers on OpenBLAS, host buffers per micro-batch, transfers
// through the pipeline group (Gloo or MPI), the host optimizer.
#include <algorithm>
#include <cstring>

#include "engine/ddp.h"
#include "engine/stage_runner.h"
#include "models/cpu_ops.h"
#include "models/mlp_cpu.h"
#include "models/optimizer.h"
#include "runtime/error.h"

namespace ddp {

namespace {

class CpuRunner final : public StageRunner {
 public:
  CpuRunner(const StageSpec& spec, const TrainConfig& config, const Dataset& data, StageLinks links)
      : spec_(spec),
        data_(data),
        links_(links),
        stage_(spec.shape, spec.first, spec.end, spec.max_batch, spec.slots),
        optimizer_(make_optimizer(config.optimizer, stage_.param_count())) {
    const size_t rows = static_cast<size_t>(spec.micro_batches) * spec.batch;
    indices_.resize(rows);
    batch_y_.resize(rows);
    if (spec.is_first()) batch_x_.resize(rows * data.train.dim);
    if (!spec.is_first()) {
      received_x_.resize(rows * spec.in_width());
      sent_dx_.resize(rows * spec.in_width());
      eval_x_.resize(static_cast<size_t>(spec.max_batch) * spec.in_width());
    }
    if (!spec.is_last()) sent_x_.resize(rows * spec.out_width());
    received_dy_.resize(static_cast<size_t>(spec.batch) * spec.out_width());
    output_of_.resize(spec.micro_batches);
  }

  bool on_gpu() const override { return false; }
  float* params() override { return stage_.params(); }
  float* grads() override { return stage_.grads(); }
  void prepare_ddp(Ddp& ddp, uint64_t fingerprint, const std::string& description) override {
    ddp.check_same_layout(fingerprint, description);
  }
  std::vector<float> get_params() override {
    return {stage_.params(), stage_.params() + stage_.param_count()};
  }
  void set_params(const float* host) override {
    std::copy_n(host, stage_.param_count(), stage_.params());
  }
  NamedState optimizer_state() override {
    NamedState state;
    for (const auto& [name, buffer] : optimizer_->state())
      state.emplace_back(name, *buffer);
    return state;
  }
  void set_optimizer_state(const NamedState& state, int64_t steps) override {
    for (auto& [name, buffer] : optimizer_->state())
      for (const auto& [saved_name, values] : state)
        if (saved_name == name) *buffer = values;
    optimizer_->set_steps(steps);
  }
  int64_t optimizer_steps() const override { return optimizer_->steps(); }

  void begin_steps(const int32_t* indices, const float* lrs, int64_t first_step,
                   int steps) override {
    (void)first_step;
    DDP_CHECK(steps == 1, "the CPU runner takes one step at a time, not {}", steps);
    std::copy_n(indices, indices_.size(), indices_.begin());
    lr_ = lrs[0];
    sends_.clear();
  }
  void recv_activation(int micro, int slot) override {
    (void)slot;
    receive(&received_x_[row(micro) * spec_.in_width()], spec_.batch * spec_.in_width(),
            links_.activations, spec_.stage - 1);
  }
  void forward(int micro, int slot) override {
    gather(micro);
    const float* x = spec_.is_first() ? &batch_x_[row(micro) * data_.train.dim]
                                      : &received_x_[row(micro) * spec_.in_width()];
    output_of_[micro] = stage_.forward(x, spec_.batch, slot);
    peak_held_ = std::max(peak_held_, ++held_);
  }
  void send_activation(int micro, int slot) override {
    (void)slot;
    float* out = &sent_x_[row(micro) * spec_.out_width()];
    const size_t count = static_cast<size_t>(spec_.batch) * spec_.out_width();
    std::copy_n(output_of_[micro], count, out);
    sends_.push_back(links_.activations->isend(out, count, DataType::kFloat32, spec_.stage + 1));
  }
  void recv_gradient(int micro, int slot) override {
    (void)micro, (void)slot;
    receive(received_dy_.data(), spec_.batch * spec_.out_width(), links_.gradients,
            spec_.stage + 1);
  }
  LossSum loss(int micro, int slot, float grad_scale) override {
    (void)slot;
    return softmax_xent_cpu(output_of_[micro], &batch_y_[row(micro)], spec_.batch,
                            spec_.shape.num_classes(), grad_scale, received_dy_.data());
  }
  void backward(int micro, int slot, bool accumulate,
                const std::function<void(int)>& on_layer_done) override {
    (void)micro;
    grad_input_ =
        stage_.backward(received_dy_.data(), spec_.batch, slot, accumulate, on_layer_done);
    --held_;
  }
  bool splits_backward() const override { return true; }
  void backward_input(int micro, int slot) override {
    (void)micro;
    grad_input_ = stage_.backward_input(received_dy_.data(), spec_.batch, slot);
  }
  void backward_weight(int micro, int slot, bool accumulate,
                       const std::function<void(int)>& on_layer_done) override {
    (void)micro;
    stage_.backward_weight(slot, accumulate, on_layer_done);
    --held_;
  }
  int peak_held_activations() const override { return peak_held_; }
  void send_gradient(int micro, int slot) override {
    (void)slot;
    float* dx = &sent_dx_[row(micro) * spec_.in_width()];
    const size_t count = static_cast<size_t>(spec_.batch) * spec_.in_width();
    std::copy_n(grad_input_, count, dx);
    sends_.push_back(links_.gradients->isend(dx, count, DataType::kFloat32, spec_.stage - 1));
  }
  void end_schedule() override {
    for (auto& work : sends_)
      work->wait(links_.activations->timeout());
    sends_.clear();
  }
  bool grads_nonfinite() override { return any_nonfinite(stage_.grads(), stage_.param_count()); }
  void optimizer_step() override {
    optimizer_->step(stage_.params(), stage_.grads(), stage_.param_count(), lr_);
  }
  LossSum evaluate(const Split& split, int64_t begin, int64_t end) override {
    LossSum total{};
    const int chunk = spec_.max_batch;
    for (int64_t at = begin; at < end; at += chunk) {
      const int count = static_cast<int>(std::min<int64_t>(chunk, end - at));
      const float* x = &split.x[static_cast<size_t>(at) * split.dim];
      if (!spec_.is_first()) {
        receive(eval_x_.data(), static_cast<size_t>(count) * spec_.in_width(), links_.activations,
                spec_.stage - 1);
        x = eval_x_.data();
      }
      const float* out = stage_.forward(x, count, 0);
      if (!spec_.is_last()) {
        links_.activations
            ->isend(out, static_cast<size_t>(count) * spec_.out_width(), DataType::kFloat32,
                    spec_.stage + 1)
            ->wait(links_.activations->timeout());
        continue;
      }
      const LossSum sum =
          softmax_xent_cpu(out, &split.y[at], count, spec_.shape.num_classes(), 0.0f, nullptr);
      total.loss += sum.loss;
      total.correct += sum.correct;
    }
    return total;
  }

 private:
  size_t row(int micro) const { return static_cast<size_t>(micro) * spec_.batch; }
  // The micro-batch's rows of the data (first stage) and its labels (last stage).
  void gather(int micro) {
    const int dim = data_.train.dim;
    for (int i = 0; i < spec_.batch; ++i) {
      const size_t at = row(micro) + i;
      const int32_t index = indices_[at];
      if (spec_.is_first())
        std::memcpy(&batch_x_[at * dim], &data_.train.x[static_cast<size_t>(index) * dim],
                    sizeof(float) * dim);
      batch_y_[at] = data_.train.y[index];
    }
  }
  static void receive(float* buffer, size_t count, Communicator* from, int peer) {
    from->irecv(buffer, count, DataType::kFloat32, peer)->wait(from->timeout());
  }

  StageSpec spec_;
  const Dataset& data_;
  StageLinks links_;
  CpuStage stage_;
  std::unique_ptr<Optimizer> optimizer_;
  float lr_ = 0;
  std::vector<int32_t> indices_;
  std::vector<float> batch_x_;      // [micro_batches * batch, input width] (first stage)
  std::vector<int32_t> batch_y_;    // [micro_batches * batch]
  std::vector<float> received_x_;   // activations from the previous stage, per micro-batch
  std::vector<float> sent_x_;       // activations to the next stage, per micro-batch
  std::vector<float> received_dy_;  // gradient from the next stage (or of the loss)
  std::vector<float> sent_dx_;      // gradients to the previous stage, per micro-batch
  std::vector<float> eval_x_;       // evaluation: a chunk from the previous stage
  std::vector<const float*> output_of_;
  const float* grad_input_ = nullptr;
  int held_ = 0, peak_held_ = 0;  // micro-batches forwarded, weight gradients not yet written
  std::vector<std::unique_ptr<Work>> sends_;  // waited at the end of the step
};

}  // namespace

std::unique_ptr<StageRunner> make_cpu_runner(const StageSpec& spec, const TrainConfig& config,
                                             const Dataset& data, StageLinks links) {
  return std::make_unique<CpuRunner>(spec, config, data, links);
}

}  // namespace ddp
