// The CPU runner: a rank's stages (one, or several with interleaving) as CpuStages on
// OpenBLAS over one flat parameter buffer, host buffers per micro-batch, transfers through
// the pipeline group (Gloo or MPI) or, between two stages of the rank, in memory; the host
// optimizer over the whole buffer.
#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "engine/runners/stage_runner.h"
#include "engine/sync/ddp.h"
#include "engine/sync/gradient_ring.h"
#include "models/cpu_ops.h"
#include "models/mlp_cpu.h"
#include "models/optimizer.h"
#include "runtime/error.h"

namespace ddp {

namespace {

// What the rank's stages share: the pipeline links, this step's samples, the hand-overs
// between two of its stages, the sends to wait for and the count of what they hold.
struct RankState {
  const Dataset& data;
  StageLinks links;
  std::vector<int32_t> indices;  // this replica's samples of the step
  // Hand-overs between two stages of this rank: (receiving stage, micro-batch, activation?).
  std::map<std::tuple<int, int, bool>, std::vector<float>> handed_over;
  std::vector<std::unique_ptr<Work>> sends;  // waited at the end of the step
  int held = 0, peak_held = 0;  // micro-batches forwarded, weight gradients not yet written
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

// --zero 3's parameters (models/linear_cpu.h, LayerParams): the rank holds its pieces of every
// layer (a bucket a layer: engine/sync/zero.h); a layer's whole parameters are all-gathered over
// the data-parallel group for each use and dropped after; while materialised (evaluation, copies
// out) every layer's are gathered once and read from there. Every replica makes the same uses
// in the same order, so the gathers match.
class GatheredLayers final : public LayerParams {
 public:
  // `bucket_of`: the model layer's bucket; `shard`: the rank's pieces (Ddp::shards()).
  GatheredLayers(Ddp& ddp, const std::vector<float>& shard, std::map<int, size_t> bucket_of)
      : ddp_(ddp), shard_(shard), bucket_of_(std::move(bucket_of)) {}

  const float* acquire(int layer) override {
    const size_t b = bucket_of_.at(layer);
    if (materialised_) return whole_.data() + ddp_.shards().parts[b].bucket_offset;
    std::vector<float>& into = held_[layer];
    DDP_CHECK(into.empty(), "--zero 3: layer {} gathered twice", layer);
    into.resize(ddp_.shards().parts[b].piece * static_cast<size_t>(ddp_.shards().ranks));
    ddp_.gather_bucket(b, shard_.data(), into.data());
    held_floats_ += into.size();
    peak_floats_ = std::max(peak_floats_, held_floats_);
    return into.data();
  }
  void release(int layer) override {
    if (materialised_) return;
    const auto it = held_.find(layer);
    DDP_CHECK(it != held_.end(), "--zero 3: layer {} released but not gathered", layer);
    held_floats_ -= it->second.size();
    held_.erase(it);
  }
  // Collective: every layer's parameters (`count`, the rank's flat layout), until drop().
  const std::vector<float>& materialise(size_t count) {
    whole_.assign(count, 0.0f);
    ddp_.gather_shards(shard_.data(), whole_.data());
    materialised_ = true;
    return whole_;
  }
  void drop() {
    materialised_ = false;
    whole_ = {};
  }
  // The most floats of gathered layers held at once in training (materialising aside).
  size_t peak_floats() const { return peak_floats_; }

 private:
  Ddp& ddp_;
  const std::vector<float>& shard_;
  std::map<int, size_t> bucket_of_;
  std::map<int, std::vector<float>> held_;  // the layers in use
  size_t held_floats_ = 0, peak_floats_ = 0;
  bool materialised_ = false;
  std::vector<float> whole_;
};

class CpuChunk final : public ChunkOps {
 public:
  CpuChunk(const StageSpec& spec, RankState& rank, float* params, float* grads, bool recompute)
      : spec_(spec),
        rank_(rank),
        stage_(spec.shape, spec.first, spec.end, spec.max_batch, spec.slots, params, grads,
               recompute) {
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

  void recv_activation(int micro, int slot) override {
    (void)slot;
    receive(&received_x_[row(micro) * spec_.in_width()], spec_.batch * spec_.in_width(),
            rank_.links.activations, spec_.prev_rank, micro, true);
  }
  void forward(int micro, int slot) override {
    gather(micro);
    const float* x = spec_.is_first() ? &batch_x_[row(micro) * rank_.data.train.dim]
                                      : &received_x_[row(micro) * spec_.in_width()];
    output_of_[micro] = stage_.forward(x, spec_.batch, slot);
    rank_.take(micro_bytes_);
  }
  void send_activation(int micro, int slot) override {
    (void)slot;
    float* out = &sent_x_[row(micro) * spec_.out_width()];
    const size_t count = static_cast<size_t>(spec_.batch) * spec_.out_width();
    std::copy_n(output_of_[micro], count, out);
    send(out, count, rank_.links.activations, spec_.next_rank, spec_.stage + 1, micro, true);
  }
  void recv_gradient(int micro, int slot) override {
    (void)slot;
    receive(received_dy_.data(), spec_.batch * spec_.out_width(), rank_.links.gradients,
            spec_.next_rank, micro, false);
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
    (void)slot;
    float* dx = &sent_dx_[row(micro) * spec_.in_width()];
    const size_t count = static_cast<size_t>(spec_.batch) * spec_.in_width();
    std::copy_n(grad_input_, count, dx);
    send(dx, count, rank_.links.gradients, spec_.prev_rank, spec_.stage - 1, micro, false);
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
        receive(eval_x_.data(), static_cast<size_t>(count) * spec_.in_width(),
                rank_.links.activations, spec_.prev_rank, -1, true);
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
    rank_.links.activations
        ->isend(out, static_cast<size_t>(count) * spec_.out_width(), DataType::kFloat32,
                spec_.next_rank)
        ->wait(rank_.links.activations->timeout());
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
  // A transfer to or from `peer`; to or from this rank itself (two of its stages), a
  // hand-over in memory (micro < 0: evaluation, never handed over).
  void send(const float* data, size_t count, Communicator* link, int peer, int to_stage, int micro,
            bool activation) {
    if (peer == spec_.rank) {
      rank_.handed_over[{to_stage, micro, activation}].assign(data, data + count);
      return;
    }
    rank_.sends.push_back(link->isend(data, count, DataType::kFloat32, peer));
  }
  void receive(float* buffer, size_t count, Communicator* link, int peer, int micro,
               bool activation) {
    if (peer == spec_.rank) {
      const auto it = rank_.handed_over.find({spec_.stage, micro, activation});
      DDP_CHECK(it != rank_.handed_over.end() && it->second.size() == count,
                "pipeline: stage {} takes micro-batch {} from its own rank before it was handed "
                "over",
                spec_.stage, micro);
      std::copy_n(it->second.data(), count, buffer);
      rank_.handed_over.erase(it);
      return;
    }
    link->irecv(buffer, count, DataType::kFloat32, peer)->wait(link->timeout());
  }

  StageSpec spec_;
  RankState& rank_;
  CpuStage stage_;
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

class CpuRunner final : public StageRunner {
 public:
  CpuRunner(const RankStages& stages, const TrainConfig& config, const Dataset& data,
            StageLinks links)
      : config_(config),
        stages_(stages),
        rank_{data, links, {}, {}, {}},
        params_(stages.param_count()),
        grads_(stages.param_count()),
        optimizer_(make_optimizer(config.optimizer, stages.param_count())) {
    const StageSpec& first = stages.chunks.front();
    rank_.indices.resize(static_cast<size_t>(first.micro_batches) * first.batch);
    for (size_t c = 0; c < stages.chunks.size(); ++c) {
      const size_t at = stages.offset_of(static_cast<int>(c));
      chunks_.push_back(std::make_unique<CpuChunk>(stages.chunks[c], rank_, &params_[at],
                                                   &grads_[at], config.recompute));
    }
  }

  bool on_gpu() const override { return false; }
  float* params() override { return params_.data(); }
  float* grads() override { return grads_.data(); }
  void prepare_ddp(Ddp& ddp, uint64_t fingerprint, const std::string& description) override {
    ddp.check_same_layout(fingerprint, description);
  }
  void shard_optimizer(Ddp& ddp, int level) override {
    const bool ring = level >= 2 && make_gradient_ring(ddp);
    ddp.shard(level, ring ? &ring_memory_ : nullptr);
    zero_ = &ddp;
    if (ring) move_grads_into_ring(ddp);
    const size_t n = ddp.shards().shard_count;
    optimizer_ = make_optimizer(config_.optimizer, n);
    if (level == 3) shard_parameters(ddp);
  }
  std::vector<float> get_params() override {
    if (!gathered_) return params_;
    std::vector<float> whole = gathered_->materialise(count());
    gathered_->drop();
    return whole;
  }
  void set_params(const float* host) override {
    if (gathered_)
      zero_->take_shard(host, shard_params_.data());
    else
      std::copy_n(host, params_.size(), params_.begin());
  }
  NamedState optimizer_state() override {
    NamedState state;
    for (const auto& [name, buffer] : optimizer_->state()) {
      if (zero_ == nullptr) {
        state.emplace_back(name, *buffer);
        continue;
      }
      // Every rank's pieces of it, gathered (collective over the data-parallel group).
      state.emplace_back(name, std::vector<float>(count()));
      zero_->gather_shards(buffer->data(), state.back().second.data());
    }
    return state;
  }
  void set_optimizer_state(const NamedState& state, int64_t steps) override {
    for (auto& [name, buffer] : optimizer_->state())
      for (const auto& [saved_name, values] : state)
        if (saved_name == name) {
          if (zero_ == nullptr)
            *buffer = values;
          else
            zero_->take_shard(values.data(), buffer->data());
        }
    optimizer_->set_steps(steps);
  }
  int64_t optimizer_steps() const override { return optimizer_->steps(); }

  void begin_steps(const int32_t* indices, const float* lrs, int64_t first_step,
                   int steps) override {
    (void)first_step;
    DDP_CHECK(steps == 1, "the CPU runner takes one step at a time, not {}", steps);
    std::copy_n(indices, rank_.indices.size(), rank_.indices.begin());
    lr_ = lrs[0];
    rank_.sends.clear();
  }
  ChunkOps& chunk(int c) override { return *chunks_.at(c); }
  int peak_held_activations() const override { return rank_.peak_held; }
  int64_t peak_activation_bytes() const override { return rank_.peak_bytes; }
  void end_schedule() override {
    for (auto& work : rank_.sends)
      work->wait(rank_.links.activations->timeout());
    rank_.sends.clear();
    DDP_CHECK(rank_.handed_over.empty(),
              "pipeline: {} hand-overs between this rank's stages "
              "were never taken",
              rank_.handed_over.size());
  }
  bool grads_nonfinite() override {
    return any_nonfinite(grads_.data(), grads_.size()) ||
           (zero_ != nullptr && zero_->zero() >= 2 &&
            any_nonfinite(zero_->reduced_pieces(), zero_->shards().shard_count));
  }
  void optimizer_step() override {
    if (zero_ == nullptr) {
      optimizer_->step(params_.data(), grads_.data(), params_.size(), lr_);
      return;
    }
    // --zero 3: the pieces are the parameters, updated from their averaged gradients (the
    // padding stays zero); the next uses gather them.
    if (gathered_) {
      optimizer_->step(shard_params_.data(), zero_->reduced_pieces(), shard_params_.size(), lr_);
      return;
    }
    // Else this rank's pieces updated in place from their averaged gradients, then every
    // rank's pieces gathered into the whole parameters.
    std::vector<OptimizerPiece> pieces;
    const ShardPlan& plan = zero_->shards();
    for (size_t b = 0; b < plan.parts.size(); ++b)
      if (plan.parts[b].count > 0)
        pieces.push_back({plan.parts[b].offset, zero_->reduced_piece(b), plan.parts[b].shard_at,
                          plan.parts[b].count});
    optimizer_->step_pieces(params_.data(), pieces, lr_);
    zero_->gather_in_place(params_.data(), nullptr);
  }
  std::string memory_report() const override {
    const auto size = [](size_t floats) {
      const double bytes = static_cast<double>(floats) * sizeof(float);
      return bytes < 1048576 ? fmt::format("{:.1f} KiB", bytes / 1024)
                             : fmt::format("{:.1f} MiB", bytes / 1048576);
    };
    const size_t state = optimizer_->state_floats();
    std::string text = fmt::format(
        "parameters {}, gradients {}, optimizer state {}",
        gathered_ ? fmt::format("{} (this rank's pieces; at most {} of layers gathered at once, "
                                "the whole model while evaluating or copying out)",
                                size(shard_params_.size()), size(gathered_->peak_floats()))
                  : size(params_.size()),
        ring_.empty() ? size(grads_.size())
                      : fmt::format("{} ({} bucket slots, written again after each bucket's "
                                    "reduce-scatter)",
                                    size(ring_floats()), ring_.size()),
        size(state));
    if (zero_ != nullptr)
      text += fmt::format(
          " (--zero {}: this rank's 1/{} of it, {} of {} parameters; {} of padded bucket "
          "copies and averaged pieces{})",
          zero_->zero(), zero_->shards().ranks, zero_->shards().owned(), count(),
          size(zero_->scratch_floats()),
          zero_->zero() >= 2 ? ", the averaged gradients as this rank's pieces only" : "");
    return text;
  }
  int64_t held_bytes() const override {
    int64_t total = 0;
    for (const auto& [kind, bytes] : held_by_kind())
      total += bytes;
    return total;
  }
  std::vector<std::pair<std::string, int64_t>> held_by_kind() const override {
    const auto bytes = [](size_t floats) { return static_cast<int64_t>(floats * sizeof(float)); };
    return {
        {"parameters",
         bytes(params_.size() + shard_params_.size() + (gathered_ ? gathered_->peak_floats() : 0))},
        {"gradients",
         bytes(grads_.size() + ring_floats() + (zero_ != nullptr ? zero_->scratch_floats() : 0))},
        {"optimizer state", bytes(optimizer_->state_floats())}};
  }
  LossSum evaluate(const Split& split, int64_t begin, int64_t end) override {
    // --zero 3: the replicas' shares of the split may differ in length, so their uses could
    // not match: the whole model is gathered once, for the evaluation.
    if (gathered_) gathered_->materialise(count());
    LossSum total{};
    const int chunk = stages_.chunks.front().max_batch;
    for (int64_t at = begin; at < end; at += chunk) {
      const int count = static_cast<int>(std::min<int64_t>(chunk, end - at));
      const float* handed = nullptr;  // the previous stage's output, when on this rank
      for (auto& c : chunks_)
        handed = c->evaluate(&split.x[static_cast<size_t>(at) * split.dim], handed, count,
                             &split.y[at], &total);
    }
    if (gathered_) gathered_->drop();
    return total;
  }

 private:
  size_t count() const { return stages_.param_count(); }
  size_t ring_floats() const { return ring_.empty() ? 0 : ring_.size() * ring_[0].size(); }
  // The ring's slots, where it holds less than the whole gradient buffer; false: none.
  bool make_gradient_ring(Ddp& ddp) {
    if (!gradient_ring_applies(static_cast<int>(stages_.chunks.size()),
                               stages_.chunks.front().micro_batches, config_.overlap,
                               ddp.comm().size()))
      return false;
    const size_t slot = gradient_ring_slot(ddp.buckets(), ddp.comm().size(), 1, count());
    if (slot == 0) return false;
    ring_.assign(kRing, std::vector<float>(slot, 0.0f));
    ring_memory_.allocate = [this](size_t floats) {
      ring_pieces_.emplace_back(floats, 0.0f);
      return ring_pieces_.back().data();
    };
    ring_memory_.copy = [](float* dst, const float* src, size_t floats) {
      std::copy_n(src, floats, dst);
    };
    ring_memory_.zero = [](float* dst, size_t floats) { std::fill_n(dst, floats, 0.0f); };
    ring_memory_.ring_slots = kRing;
    ring_memory_.bucket_grads = [this](size_t bucket) { return ring_[bucket % kRing].data(); };
    ring_memory_.slot_floats = slot;
    ring_memory_.align = 1;
    return true;
  }
  // Backward writes each layer's gradients into its bucket's slot; the whole buffer goes.
  void move_grads_into_ring(const Ddp& ddp) {
    const std::vector<Bucket>& buckets = ddp.buckets();
    chunks_.front()->stage().set_grads([this, &buckets](size_t offset) {
      for (size_t b = 0; b < buckets.size(); ++b)
        if (offset >= buckets[b].offset && offset < buckets[b].offset + buckets[b].count)
          return ring_[b % kRing].data() + (offset - buckets[b].offset);
      DDP_CHECK(false, "gradient ring: element {} is in no bucket", offset);
      return static_cast<float*>(nullptr);
    });
    grads_ = {};
  }
  // --zero 3: the parameters become this rank's pieces, and every layer reads its whole
  // parameters from them for each use (GatheredLayers); the whole buffer is freed.
  void shard_parameters(Ddp& ddp) {
    shard_params_.assign(ddp.shards().shard_count, 0.0f);
    ddp.take_shard(params_.data(), shard_params_.data());
    std::vector<ParamSpan> layers;
    for (const auto& [offset, count] : stages_.layer_spans())
      layers.push_back({offset, count});
    const std::vector<size_t> bucket_of_span = layer_buckets(ddp.buckets(), layers);
    std::map<int, size_t> bucket_of;  // the model's layer -> its bucket
    size_t span = 0;
    for (const StageSpec& c : stages_.chunks)
      for (int i = c.first; i < c.end; ++i, ++span)
        bucket_of[i] = bucket_of_span[span];
    gathered_ = std::make_unique<GatheredLayers>(ddp, shard_params_, std::move(bucket_of));
    for (auto& chunk : chunks_)
      chunk->stage().set_params_source(gathered_.get());
    params_ = {};
  }

  TrainConfig config_;
  RankStages stages_;
  RankState rank_;
  std::vector<float> params_;  // every stage's, one after the other
  std::vector<float> grads_;   // none with a gradient ring
  // --zero 2 or 3 where backward runs once a step (one stage, no micro-batches) with overlap:
  // the gradients in kRing bucket slots (bucket b in slot b % kRing, each written again only
  // after its reduce-scatter, which layer_done waits for) and the averaged pieces, as on the
  // GPU (engine/sync/gradient_ring.h).
  static constexpr int kRing = kGradientRingSlots;
  std::vector<std::vector<float>> ring_;
  std::vector<std::vector<float>> ring_pieces_;  // what Ddp allocates: the averaged pieces
  Ddp::DeviceMemory ring_memory_;
  std::vector<std::unique_ptr<CpuChunk>> chunks_;
  std::unique_ptr<Optimizer> optimizer_;
  float lr_ = 0;
  Ddp* zero_ = nullptr;                       // --zero: the data parallelism that shards the state
  std::vector<float> shard_params_;           // --zero 3: this rank's pieces of the parameters
  std::unique_ptr<GatheredLayers> gathered_;  // --zero 3: the layers' parameters for each use
};

}  // namespace

std::unique_ptr<StageRunner> make_cpu_runner(const RankStages& stages, const TrainConfig& config,
                                             const Dataset& data, StageLinks links) {
  return std::make_unique<CpuRunner>(stages, config, data, links);
}

}  // namespace ddp
