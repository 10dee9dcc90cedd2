// The CPU runner: a rank's stages (one, or several with interleaving) as CpuStages on
// OpenBLAS over one flat parameter buffer, host buffers per micro-batch, transfers through
// the pipeline group (Gloo or MPI) or, between two stages of the rank, in memory; the host
// optimizer over the whole buffer.
#include <algorithm>
#include <cstring>
#include <deque>

#include "dist/ddp.h"
#include "dist/gradient_ring.h"
#include "engine/runners/stage_runner.h"
#include "engine/runners/stage_transfers.h"
#include "engine/zero/host_store.h"
#include "models/cpu_ops.h"
#include "models/mlp_cpu.h"
#include "models/optimizer.h"
#include "runtime/error.h"

namespace ddp {

namespace {

// What the rank's stages share: the pipeline links, this step's samples and the count of what
// the micro-batches in flight hold.
struct RankState {
  const Dataset& data;
  StageLinks links;
  std::vector<int32_t> indices;  // this replica's samples of the step
  int held = 0, peak_held = 0;   // micro-batches forwarded, weight gradients not yet written
  // The bytes they hold (their layers' outputs, or with --recompute their inputs) and the
  // working sets of the stages that recompute.
  int64_t held_bytes = 0, working_bytes = 0, peak_bytes = 0;
  void take(int64_t bytes) {
    peak_held = std::max(peak_held, ++held);
    held_bytes += bytes;
    peak_bytes = std::max(peak_bytes, held_bytes + working_bytes);
  }
  void give_back(int64_t bytes) {
    --held;
    held_bytes -= bytes;
  }
};

class CpuChunk final : public PipelineStage {
 public:
  CpuChunk(const StageSpec& spec, RankState& rank, float* params, float* grads, bool recompute)
      : spec_(spec),
        rank_(rank),
        stage_(spec.shape, spec.first, spec.end, spec.max_batch, spec.slots, params, grads,
               recompute),
        transfers_(spec, host_memory_port(), DataType::kFloat32) {
    int64_t outputs = 0;  // one micro-batch's layer outputs
    for (int i = spec.first; i < spec.end; ++i)
      outputs += int64_t{spec.batch} * spec.shape.layer(i).out * int64_t{sizeof(float)};
    micro_bytes_ =
        recompute ? int64_t{spec.batch} * spec.in_width() * int64_t{sizeof(float)} : outputs;
    if (recompute) rank.working_bytes += outputs;
    const size_t rows = static_cast<size_t>(spec.micro_batches) * spec.batch;
    batch_y_.resize(rows);
    if (spec.is_first()) batch_x_.resize(rows * rank.data.train.dim);
    if (!spec.is_first()) {
      received_x_.resize(rows * spec.in_width());
      sent_dx_.resize(rows * spec.in_width());
      eval_x_.resize(static_cast<size_t>(spec.max_batch) * spec.in_width());
    }
    if (!spec.is_last()) sent_x_.resize(rows * spec.out_width());
    received_dy_.resize(static_cast<size_t>(spec.batch) * spec.out_width());
    output_of_.resize(spec.micro_batches);
  }

  const StageSpec& spec() const { return spec_; }
  CpuStage& stage() { return stage_; }
  StageTransfers& transfers() { return transfers_; }

  void recv_activation(int micro, int slot) override {
    (void)slot;
    transfers_.receive_activation(&received_x_[row(micro) * spec_.in_width()], spec_.in_width(),
                                  micro);
  }
  void forward(int micro, int slot) override {
    gather(micro);
    const float* x = spec_.is_first() ? &batch_x_[row(micro) * rank_.data.train.dim]
                                      : &received_x_[row(micro) * spec_.in_width()];
    output_of_[micro] = stage_.forward(x, spec_.batch, slot);
    rank_.take(micro_bytes_);
  }
  void send_activation(int micro, int slot) override {
    float* out = &sent_x_[row(micro) * spec_.out_width()];
    const size_t count = static_cast<size_t>(spec_.batch) * spec_.out_width();
    std::copy_n(output_of_[micro], count, out);
    transfers_.send_activation(out, spec_.out_width(), micro, slot);
  }
  void recv_gradient(int micro, int slot) override {
    (void)slot;
    transfers_.receive_gradient(received_dy_.data(), spec_.out_width(), micro);
  }
  LossSum loss(int micro, int slot, float grad_scale) override {
    (void)slot;
    // The logits as forwarded (forwarded again where the stage recomputes).
    return softmax_xent_cpu(stage_.output(slot), &batch_y_[row(micro)], spec_.batch,
                            spec_.shape.num_classes(), grad_scale, received_dy_.data());
  }
  void backward(int micro, int slot, bool accumulate,
                const std::function<void(int)>& on_layer_done) override {
    (void)micro;
    grad_input_ =
        stage_.backward(received_dy_.data(), spec_.batch, slot, accumulate, on_layer_done);
    rank_.give_back(micro_bytes_);
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
    rank_.give_back(micro_bytes_);
  }
  void send_gradient(int micro, int slot) override {
    float* dx = &sent_dx_[row(micro) * spec_.in_width()];
    const size_t count = static_cast<size_t>(spec_.batch) * spec_.in_width();
    std::copy_n(grad_input_, count, dx);
    transfers_.send_gradient(dx, spec_.in_width(), micro, slot);
  }

  // Evaluation of `count` samples at `x` (first stage) through this stage: its input from
  // the stage before (another rank's, or `handed` from this rank's), its output to the next
  // stage, or (last stage) the loss sums of `labels`. Returns the output for a next stage on
  // this rank.
  const float* evaluate(const float* x, const float* handed, int count, const int32_t* labels,
                        LossSum* sum) {
    if (!spec_.is_first()) {
      if (handed != nullptr) {
        x = handed;
      } else {
        transfers_.evaluation_receive(eval_x_.data(),
                                      static_cast<size_t>(count) * spec_.in_width());
        x = eval_x_.data();
      }
    }
    const float* out = stage_.forward(x, count, 0);
    if (spec_.is_last()) {
      const LossSum s =
          softmax_xent_cpu(out, labels, count, spec_.shape.num_classes(), 0.0f, nullptr);
      sum->loss += s.loss;
      sum->correct += s.correct;
      return nullptr;
    }
    if (spec_.next_rank == spec_.rank) return out;
    transfers_.evaluation_send(out, static_cast<size_t>(count) * spec_.out_width());
    return nullptr;
  }

 private:
  size_t row(int micro) const { return static_cast<size_t>(micro) * spec_.batch; }
  // The micro-batch's rows of the data (first stage) and its labels (last stage).
  void gather(int micro) {
    const int dim = rank_.data.train.dim;
    for (int i = 0; i < spec_.batch; ++i) {
      const size_t at = row(micro) + i;
      const int32_t index = rank_.indices[at];
      if (spec_.is_first())
        std::memcpy(&batch_x_[at * dim], &rank_.data.train.x[static_cast<size_t>(index) * dim],
                    sizeof(float) * dim);
      batch_y_[at] = rank_.data.train.y[index];
    }
  }
  StageSpec spec_;
  RankState& rank_;
  CpuStage stage_;
  StageTransfers transfers_;
  std::vector<float> batch_x_;      // [micro_batches * batch, input width] (first stage)
  std::vector<int32_t> batch_y_;    // [micro_batches * batch]
  std::vector<float> received_x_;   // activations from the previous stage, per micro-batch
  std::vector<float> sent_x_;       // activations to the next stage, per micro-batch
  std::vector<float> received_dy_;  // gradient from the next stage (or of the loss)
  std::vector<float> sent_dx_;      // gradients to the previous stage, per micro-batch
  std::vector<float> eval_x_;       // evaluation: a chunk from the previous stage
  std::vector<const float*> output_of_;
  const float* grad_input_ = nullptr;
  int64_t micro_bytes_ = 0;  // what a micro-batch in flight holds
};

// The store of the rank's stages: their layers (model index and span), buckets and optimizer.
HostStoreLayout store_layout(const RankStages& stages, const RunnerOptions& options) {
  HostStoreLayout layout;
  layout.count = stages.param_count();
  const std::vector<std::pair<size_t, size_t>> spans = stages.layer_spans();
  size_t span = 0;
  for (const StageSpec& c : stages.chunks) {
    for (int i = c.first; i < c.end; ++i, ++span)
      layout.layers.push_back({i, {spans[span].first, spans[span].second}});
    layout.stage_layers.push_back(c.end - c.first);
  }
  layout.plan = stage_bucket_plan(stages, options.sync);
  layout.bf16_grads = options.sync.bf16_grads;
  layout.stages_on_rank = static_cast<int>(stages.chunks.size());
  layout.micro_batches = stages.chunks.front().micro_batches;
  layout.optimizer = options.optimizer;
  return layout;
}

class CpuRunner final : public StageRunner {
 public:
  CpuRunner(const RankStages& stages, const RunnerOptions& options, const Dataset& data,
            StageLinks links)
      : stages_(stages), rank_{data, links, {}}, store_(store_layout(stages, options)) {
    const StageSpec& first = stages.chunks.front();
    rank_.indices.resize(static_cast<size_t>(first.micro_batches) * first.batch);
    for (size_t c = 0; c < stages.chunks.size(); ++c) {
      const size_t at = stages.offset_of(static_cast<int>(c));
      chunks_.push_back(std::make_unique<CpuChunk>(stages.chunks[c], rank_,
                                                   &store_.params_buffer()[at],
                                                   &store_.grads_buffer()[at], options.recompute));
    }
    // Once gradient sync has sharded the state, the model writes its gradients and reads its
    // parameters where the state keeps them.
    store_.set_rewire([this](std::function<float*(size_t)> grads, LayerParams* params) {
      if (grads) chunks_.front()->stage().set_grads(grads);
      if (params != nullptr)
        for (auto& chunk : chunks_)
          chunk->stage().set_params_source(params);
    });
    // Two neighbouring stages of this rank hand over in memory; the others use the links.
    for (size_t c = 0; c < chunks_.size(); ++c) {
      const auto neighbour = [&](size_t at, int stage) -> StageTransfers* {
        return at < chunks_.size() && chunks_[at]->spec().stage == stage ? &chunks_[at]->transfers()
                                                                         : nullptr;
      };
      const int stage = chunks_[c]->spec().stage;
      chunks_[c]->transfers().set_neighbours(c > 0 ? neighbour(c - 1, stage - 1) : nullptr,
                                             neighbour(c + 1, stage + 1));
      chunks_[c]->transfers().attach(links);
    }
  }

  bool on_gpu() const override { return false; }
  ReplicaStore& param_store() override { return store_; }
  float* grads() override { return store_.grads_buffer().data(); }
  void* stream() override { return nullptr; }
  // Made with the data and the links; it makes no weights of its own (the trainer's).
  void attach(const Dataset& data, StageLinks links, Communicator* world,
              std::function<void()> abort_all) override {
    (void)data, (void)links, (void)world, (void)abort_all;
  }
  bool initial_params() override { return false; }
  // The host runs the schedule's actions as they come.
  StepStrategy step_strategy() const override { return {}; }
  void profile(bool on) override {
    DDP_CHECK(false, "--profile-steps: the CPU runner has no CUDA profiler (asked to turn it {})",
              on ? "on" : "off");
  }
  std::vector<float> get_params() override { return store_.state().params(count()); }
  void set_params(const float* host) override { store_.state().set_params(host); }
  NamedState optimizer_state() override { return store_.state().optimizer_state(count()); }
  void set_optimizer_state(const NamedState& state, int64_t steps) override {
    store_.state().set_optimizer_state(state);
    store_.optimizer().set_steps(steps);
  }
  int64_t optimizer_steps() const override { return store_.optimizer().steps(); }

  int steps_ahead() const override { return 1; }

  void begin_steps(const int32_t* indices, const float* lrs, int64_t first_step,
                   int steps) override {
    (void)first_step;
    DDP_CHECK(steps == 1, "the CPU runner takes one step at a time, not {}", steps);
    std::copy_n(indices, rank_.indices.size(), rank_.indices.begin());
    lr_ = lrs[0];
  }
  PipelineStage& chunk(int c) override { return *chunks_.at(c); }
  int peak_held_activations() const override { return rank_.peak_held; }
  int64_t peak_activation_bytes() const override { return rank_.peak_bytes; }
  void run_step(int64_t step, const std::function<void()>& enqueue) override {
    (void)step;
    enqueue();
  }
  // The host's clock times its compute (the executor's spans and costs).
  double last_busy_s() const override { return -1; }
  bool last_costs(ComputeCosts* costs) const override {
    (void)costs;
    return false;
  }
  void add_device_spans(TimelineRecorder& timeline, int64_t step) override {
    (void)timeline, (void)step;
  }
  LossSum take_loss() override { return {}; }  // the executor has the step's sums
  void end_schedule() override {
    for (auto& chunk : chunks_)
      chunk->transfers().end_step();
  }
  bool grads_nonfinite() override {
    const std::vector<float>& grads = store_.grads_buffer();
    return any_nonfinite(grads.data(), grads.size()) || store_.kept_grads_nonfinite();
  }
  void optimizer_step() override {
    store_.set_lr(lr_);
    store_.state().step();
  }
  std::string memory_report() const override {
    const auto size = [](size_t floats) {
      const double bytes = static_cast<double>(floats) * sizeof(float);
      return bytes < 1048576 ? fmt::format("{:.1f} KiB", bytes / 1024)
                             : fmt::format("{:.1f} MiB", bytes / 1048576);
    };
    return store_.memory_report(size);
  }
  int64_t held_bytes() const override {
    int64_t total = 0;
    for (const auto& [kind, bytes] : held_by_kind())
      total += bytes;
    return total;
  }
  std::vector<std::pair<std::string, int64_t>> held_by_kind() const override {
    const auto bytes = [](size_t floats) { return static_cast<int64_t>(floats * sizeof(float)); };
    return {{"parameters", bytes(store_.params_buffer().size() + store_.param_floats())},
            {"gradients", bytes(store_.grads_buffer().size() + store_.grad_floats())},
            {"optimizer state", bytes(store_.optimizer().state_floats())}};
  }
  LossSum evaluate(const Split& split, int64_t begin, int64_t end) override {
    LossSum total{};
    const int chunk = stages_.chunks.front().max_batch;
    for (int64_t at = begin; at < end; at += chunk) {
      const int count = static_cast<int>(std::min<int64_t>(chunk, end - at));
      const float* handed = nullptr;  // the previous stage's output, when on this rank
      for (auto& c : chunks_)
        handed = c->evaluate(&split.x[static_cast<size_t>(at) * split.dim], handed, count,
                             &split.y[at], &total);
    }
    // --zero 3: the replicas' shares of the split may differ by a chunk, so that their layer
    // gathers would not match: the replica with fewer makes the gathers of the ones it lacks.
    store_.state().match_evaluation(split.n, (end - begin + chunk - 1) / chunk, chunk);
    return total;
  }

 private:
  size_t count() const { return stages_.param_count(); }
  RankStages stages_;
  RankState rank_;
  // The parameters and gradients (every stage's, one after the other) and the state gradient
  // sync keeps them in: whole, or sharded over the replicas; it updates them.
  HostParamStore store_;
  std::vector<std::unique_ptr<CpuChunk>> chunks_;
  float lr_ = 0;
};

}  // namespace

std::unique_ptr<StageRunner> make_cpu_runner(const RankStages& stages, const RunnerOptions& options,
                                             const Dataset& data, StageLinks links) {
  return std::make_unique<CpuRunner>(stages, options, data, links);
}

}  // namespace ddp
