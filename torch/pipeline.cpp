// ddp::Pipeline: the Sequential cut into stages (torch/pipeline_stage.h) with their transfers
// (torch/pipeline_transfers.h), and the executor run over them once a step.
#include "torch/pipeline.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/pipeline/executor.h"
#include "engine/pipeline/lanes.h"
#include "engine/pipeline/schedule.h"
#include "engine/pipeline/simulate.h"
#include "engine/telemetry/timeline.h"
#include "runtime/error.h"
#include "runtime/log_line.h"
#include "runtime/timer.h"
#include "torch/clip_grad.h"
#include "torch/comm_hooks.h"
#include "torch/device_staging.h"
#include "torch/pipeline_stage.h"
#include "torch/pipeline_transfers.h"

#if DDP_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp {

class Pipeline::Impl final : public PipelineRank {
 public:
  // `owned`: the communicators made for it (kept as long as it is).
  Impl(torch::nn::Sequential model, Communicator& group, Communicator* replicas,
       const PipelineOptions& options, std::vector<std::unique_ptr<Communicator>> owned)
      : model_(std::move(model)),
        group_(group),
        replicas_(replicas),
        options_(options),
        owned_(std::move(owned)) {
    const int ranks = group.size();
    const int rank = group.rank();
    const auto schedule = schedule_from_name(options.schedule());
    DDP_USAGE_CHECK(schedule.has_value(),
                    "PipelineOptions::schedule '{}': expected gpipe, 1f1b, interleaved-1f1b, zb-h1 "
                    "or zb-v",
                    options.schedule());
    DDP_USAGE_CHECK(*schedule != PipelineSchedule::kPairs,
                    "PipelineOptions::schedule 'pairs': ddptrain's test schedule; expected gpipe, "
                    "1f1b, interleaved-1f1b, zb-h1 or zb-v");
    schedule_ = *schedule;
    const int modules = static_cast<int>(model_->size());
    const int m = options.micro_batches();
    DDP_USAGE_CHECK(m >= 1, "PipelineOptions::micro_batches {}: expected 1 or more", m);
    const int asked = options.stages_per_rank();
    DDP_USAGE_CHECK(asked >= 0, "PipelineOptions::stages_per_rank {}: expected 0 or more", asked);
    ScheduleNames names;
    names.schedule = "PipelineOptions::schedule";
    names.ranks = "ranks";
    names.chunks = "PipelineOptions::stages_per_rank";
    names.micro_batches = "PipelineOptions::micro_batches";
    names.layers = "modules";
    names.model = "the Sequential";
    chunks_ = schedule_chunks(schedule_, asked, ranks, modules, m, names);
    const int stages = ranks * chunks_;
    // The stages' modules.
    std::vector<int> balance = options.balance();
    if (balance.empty())
      for (int s = 0; s < stages; ++s)
        balance.push_back(modules / stages + (s < modules % stages ? 1 : 0));
    DDP_USAGE_CHECK(static_cast<int>(balance.size()) == stages,
                    "PipelineOptions::balance: {} entries for {} stages ({} ranks x {} a rank)",
                    balance.size(), stages, ranks, chunks_);
    for (int b : balance)
      DDP_USAGE_CHECK(b >= 1, "PipelineOptions::balance: a stage of {} modules (at least 1)", b);
    DDP_USAGE_CHECK(std::accumulate(balance.begin(), balance.end(), 0) == modules,
                    "PipelineOptions::balance: {} modules in all, but the Sequential has {}",
                    std::accumulate(balance.begin(), balance.end(), 0), modules);
    bounds_.push_back(0);
    for (int b : balance)
      bounds_.push_back(bounds_.back() + b);
    agree(balance);
    stage_rank_ = stage_ranks(schedule_, ranks, chunks_);
    // A communicator a flow, direction and peer (the simulator's lanes), as ddptrain's.
    PipelineLaneComms lanes = split_lanes(group, 0, rank, stage_rank_);
    lane_comms_ = std::move(lanes.comms);
    std::map<std::tuple<bool, int, int>, Communicator*> by_flow = std::move(lanes.by_flow);
    transfers_ = std::make_unique<PipelineTransfers>(std::move(by_flow), stage_rank_, rank);
    // This rank's stages, in order, and the executor over them.
    std::vector<StagePlace> places;
    for (int s = 0; s < stages; ++s) {
      if (stage_rank_[static_cast<size_t>(s)] != rank) continue;
      std::vector<torch::nn::AnyModule> mine;
      for (int i = bounds_[s]; i < bounds_[s + 1]; ++i)
        mine.push_back(*(model_->begin() + i));
      stages_.push_back(std::make_unique<TorchStage>(
          s, stages, bounds_[s], std::move(mine), options.recompute(), *transfers_, data_,
          replicas_, m, options.data_parallel_options()));
      places.push_back({s, stages, m, bounds_[s + 1] - bounds_[s]});
      stage_index_.push_back(s);
    }
    free_other_stages();
    // zero(3) over replicas: the stages' shard units gathered and freed by the schedule.
    std::vector<PipelineAction> actions = plan_rank_schedule(schedule_, rank, ranks, chunks_, m);
    if (replicas_ != nullptr && replicas_->size() > 1 &&
        options.data_parallel_options().zero() == 3)
      actions = add_unshard_reshard(actions, /*weight_half_reads=*/true);
    executor_ = std::make_unique<ScheduleExecutor>(std::move(actions), places);
    for (auto& s : stages_)
      s->set_slots(executor_->slots());
    if (rank == 0 && replica() == 0) log_info_line(describe());
  }

  // Collective over the pipeline's ranks and then over the stage's replicas: the choices that
  // must match (a rank that cut the model elsewhere would run modules another rank runs too,
  // and the job would train a model nobody built), the first difference named on every rank.
  void agree(const std::vector<int>& balance) {
    std::vector<std::string> cut;
    for (const int b : balance)
      cut.push_back(std::to_string(b));
    std::vector<std::string> settings = {
        fmt::format("schedule({})", options_.schedule()),
        fmt::format("micro_batches({})", options_.micro_batches()),
        fmt::format("stages a rank {}", chunks_),
        fmt::format("balance({{{}}}) (modules a stage)", fmt::join(cut, ", ")),
        fmt::format("recompute({})", options_.recompute()),
        fmt::format("data_parallel({})", replicas_ ? replicas_->size() : 1),
        fmt::format("a Sequential of {} modules", model_->size())};
    torch::Device device = torch::kCPU;
    if (group_.device_buffers()) device = torch::Device(torch::kCUDA);
    for (const auto& p : model_->parameters()) {
      device = p.device();
      break;
    }
    torch::Tensor scratch;
    const std::string must = "construct ddp::Pipeline with the same PipelineOptions and model";
    check_same_settings(group_, settings, "ddp::Pipeline: the pipeline's ranks differ", must,
                        torch_staging(device, scratch));
    if (replicas_)
      check_same_settings(*replicas_, settings, "ddp::Pipeline: the replicas differ", must,
                          torch_staging(device, scratch));
  }

  // PipelineRank
  bool on_gpu() const override { return false; }  // the host's clock times the actions
  PipelineStage& chunk(int c) override { return *stages_.at(static_cast<size_t>(c)); }
  float* grads() override { return nullptr; }  // no data-parallel reducer here
  void* stream() override { return nullptr; }
  void end_schedule() override {
    transfers_->end_step();
    for (auto& s : stages_)
      s->finish_reduction();
  }

  torch::Tensor step(const torch::Tensor& input, const torch::Tensor& target, const LossFn& loss) {
    const int m = options_.micro_batches();
    data_ = {};
    data_.loss = &loss;
    int64_t batch = 0;
    if (has_first()) {
      DDP_USAGE_CHECK(input.defined() && input.dim() >= 1 && input.size(0) >= m,
                      "ddp::Pipeline::step: the input ({}) must have at least micro_batches {} "
                      "samples along dimension 0",
                      input.defined() ? shape_of(input) : "undefined", m);
      data_.inputs = input.tensor_split(m, 0);
    }
    if (has_last()) {
      DDP_USAGE_CHECK(target.defined() && target.dim() >= 1 && target.size(0) >= m,
                      "ddp::Pipeline::step: the target ({}) must have at least micro_batches {} "
                      "samples along dimension 0",
                      target.defined() ? shape_of(target) : "undefined", m);
      data_.targets = target.tensor_split(m, 0);
      batch = target.size(0);
    }
    for (auto& s : stages_)
      s->begin_step();
    StepStats stats;
    Stopwatch clock;
    executor_->run(*this, nullptr, timeline_, steps_ + 1,
                   batch > 0 ? static_cast<float>(1.0 / static_cast<double>(batch)) : 0.0f, &stats);
    ++steps_;
    torch::Tensor mean;
    if (has_last()) mean = (data_.loss_sum / static_cast<double>(batch)).to(torch::kFloat32);
    data_ = {};
    if (steps_ == 2) {
      step_s_ = clock.seconds();
      if (group_.rank() == 0 && replica() == 0) log_info_line("ddp::Pipeline: " + report());
    }
    return mean;
  }

  torch::Tensor forward(const torch::Tensor& input) {
    torch::NoGradGuard no_grad;
    const int m = options_.micro_batches();
    std::vector<torch::Tensor> inputs;
    if (has_first()) {
      DDP_USAGE_CHECK(input.defined() && input.dim() >= 1 && input.size(0) >= 1,
                      "ddp::Pipeline::forward: the input ({}) has no samples along dimension 0",
                      input.defined() ? shape_of(input) : "undefined");
      inputs = input.tensor_split(std::min<int64_t>(m, input.size(0)), 0);
    }
    // The micro-batch count, from the first stage's rank (its input's samples may be fewer
    // than micro_batches).
    const int chunks = has_first() ? static_cast<int>(inputs.size()) : 0;
    torch::Tensor scratch;
    const int count = all_reduce_values(group_, {chunks}, ReduceOp::kMax,
                                        torch_staging(stages_.front()->device(), scratch))[0];
    for (auto& stage : stages_)
      stage->begin_evaluation();
    // Each micro-batch through this rank's stages in order (a stage waits only for a lower
    // stage of the same micro-batch or an earlier micro-batch: no cycle); sends not waited for.
    transfers_->set_evaluating(true);
    std::vector<torch::Tensor> outputs;
    for (int micro = 0; micro < count; ++micro)
      for (auto& stage : stages_) {
        torch::Tensor out = stage->evaluate(
            micro, has_first() ? inputs[static_cast<size_t>(micro)] : torch::Tensor());
        if (stage.get() == stages_.back().get() && has_last()) outputs.push_back(out);
      }
    transfers_->end_step();
    transfers_->set_evaluating(false);
    return has_last() ? torch::cat(outputs) : torch::Tensor();
  }

  // The other ranks' stages' parameters freed here (empty tensors; one this rank's stages share
  // is kept): a rank holds its own stages' only, and a whole-model forward or torch::save on one
  // rank fails at first use instead of holding the other stages' untrained weights.
  void free_other_stages() {
    std::set<const c10::TensorImpl*> kept;
    for (const auto& s : stages_)
      for (const torch::Tensor& p : s->parameters())
        kept.insert(p.unsafeGetTensorImpl());
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : model_->parameters())
      if (!kept.count(p.unsafeGetTensorImpl())) p.set_data(torch::empty({0}, p.options()));
  }

  // The rank's stages' data-parallel wrappers, in stage order.
  const std::vector<std::unique_ptr<TorchStage>>& stage_list() const { return stages_; }
  std::vector<DistributedDataParallel*> replicated() const {
    std::vector<DistributedDataParallel*> wrapped;
    for (const auto& s : stages_)
      if (s->replicated()) wrapped.push_back(s->replicated());
    return wrapped;
  }

  void register_comm_hook(const TorchCommHook& hook) {
    const std::vector<DistributedDataParallel*> wrapped = replicated();
    DDP_USAGE_CHECK(wrapped.size() <= 1 || describe_comm_hook(hook).rfind("powerSGD", 0) != 0,
                    "ddp::Pipeline::register_comm_hook: PowerSGD keeps state a model, and this "
                    "rank runs {} stages; give it one stage a rank (stages_per_rank(1))",
                    wrapped.size());
    for (DistributedDataParallel* ddp : wrapped)
      ddp->register_comm_hook(hook);
  }

  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> all;
    for (const auto& s : stages_)
      for (const torch::Tensor& p : s->parameters())
        all.push_back(p);
    return all;
  }
  // The whole model's gradient norm, each stage's part once (its replicas' shares combined
  // where sharded), combined over the pipeline's ranks; every stage's gradients clipped by it.
  double clip_grad_norm(double max_norm, double norm_type) {
    double part = 0.0;
    std::vector<torch::Tensor> grads;
    for (const auto& s : stages_) {
      part = add_norm_parts(part, s->norm_part(norm_type), norm_type);
      for (const torch::Tensor& p : s->parameters())
        grads.push_back(p.grad());
    }
    if (group_.size() > 1) {
      torch::Tensor scratch;
      part = all_reduce_doubles(group_, {part},
                                std::isinf(norm_type) ? ReduceOp::kMax : ReduceOp::kSum,
                                torch_staging(stages_.front()->device(), scratch))[0];
    }
    const double total = norm_of_part(part, norm_type);
    clip_gradients(grads, max_norm, total);
    return total;
  }

  const std::vector<int>& stages() const { return stage_index_; }
  int replica() const { return replicas_ ? replicas_->rank() : 0; }
  int replicas() const { return replicas_ ? replicas_->size() : 1; }
  bool has_first() const { return stage_index_.front() == 0; }
  bool has_last() const { return stage_index_.back() == static_cast<int>(stage_rank_.size()) - 1; }

  std::string describe() const {
    std::string cut;
    for (size_t s = 0; s + 1 < bounds_.size(); ++s)
      cut += fmt::format("{}{}", s ? ", " : "",
                         bounds_[s + 1] - bounds_[s] == 1
                             ? std::to_string(bounds_[s])
                             : fmt::format("{}-{}", bounds_[s], bounds_[s + 1] - 1));
    std::string mine;
    for (size_t k = 0; k < stage_index_.size(); ++k)
      mine += fmt::format("{}{}",
                          k == 0                         ? ""
                          : k + 1 == stage_index_.size() ? " and "
                                                         : ", ",
                          stage_index_[k]);
    return fmt::format(
        "{} over {} ranks, {} stages (modules {}), {} micro-batches{}{}; rank {} runs stage{} {}",
        schedule_name(schedule_), group_.size(), stage_rank_.size(), cut, options_.micro_batches(),
        options_.recompute() ? ", recomputing activations" : "",
        replicas() > 1 ? fmt::format("; {} replicas (data parallel)", replicas()) : "",
        group_.rank(), stage_index_.size() > 1 ? "s" : "", mine);
  }

  std::string report() const {
    SimCosts costs;
    costs.forward = 2;
    costs.backward = 4;
    costs.backward_input = 2;
    costs.backward_weight = 2;
    costs.lane_per_direction = true;
    costs.lane_per_peer = true;
    costs.recompute = options_.recompute();
    const SimResult sim =
        simulate_plan(schedule_, group_.size(), chunks_, options_.micro_batches(), costs);
    std::string line =
        sim.ok ? fmt::format("the simulator's bubble {:.1f} % (unit costs, F = B = 2 W)",
                             100.0 * sim.bubble)
               : "the simulator refused the schedule: " + sim.error;
    if (step_s_ > 0) line += fmt::format("; step {:.1f} ms (the second, measured)", 1e3 * step_s_);
    return line;
  }

 private:
  torch::nn::Sequential model_;
  Communicator& group_;
  Communicator* replicas_;
  PipelineOptions options_;
  std::vector<std::unique_ptr<Communicator>> owned_;
  PipelineSchedule schedule_ = PipelineSchedule::kOneForwardOneBackward;
  int chunks_ = 1;
  std::vector<int> bounds_;      // stage s holds modules [bounds_[s], bounds_[s + 1])
  std::vector<int> stage_rank_;  // stage s runs on pipeline rank stage_rank_[s]
  std::vector<std::unique_ptr<Communicator>> lane_comms_;
  std::unique_ptr<PipelineTransfers> transfers_;
  TorchStage::StepData data_;
  std::vector<std::unique_ptr<TorchStage>> stages_;
  std::vector<int> stage_index_;
  std::unique_ptr<ScheduleExecutor> executor_;
  TimelineRecorder timeline_{false};
  int64_t steps_ = 0;
  double step_s_ = 0;
};

Pipeline::Pipeline(torch::nn::Sequential model, World& world, const PipelineOptions& options) {
  const int replicas = options.data_parallel();
  Communicator& comm = world.comm();
  DDP_USAGE_CHECK(replicas >= 1 && comm.size() % replicas == 0,
                  "PipelineOptions::data_parallel {}: expected a divisor of the world's {} ranks",
                  replicas, comm.size());
  if (replicas == 1) {
    impl_ = std::make_unique<Impl>(std::move(model), comm, nullptr, options,
                                   std::vector<std::unique_ptr<Communicator>>{});
    return;
  }
  // ddptrain's order (place_in_job): rank r is pipeline rank r / D of replica r % D, the ranks
  // of one stage side by side, so that the replicas' all-reduce, the heavier traffic, stays
  // among neighbouring ranks (a node's GPUs).
  const PipelineLayout place = place_in_job(comm.size(), comm.rank(), comm.size() / replicas);
  std::vector<std::unique_ptr<Communicator>> owned;
  owned.push_back(comm.split(place.replica, place.stage));  // this replica's pipeline
  owned.push_back(comm.split(place.stage, place.replica));  // this place's replicas
  Communicator& group = *owned[0];
  Communicator* dp = owned[1].get();
  impl_ = std::make_unique<Impl>(std::move(model), group, dp, options, std::move(owned));
}

Pipeline::Pipeline(torch::nn::Sequential model, Communicator& group, Communicator* replicas,
                   const PipelineOptions& options)
    : impl_(std::make_unique<Impl>(std::move(model), group, replicas, options,
                                   std::vector<std::unique_ptr<Communicator>>{})) {}

Pipeline::~Pipeline() = default;

torch::Tensor Pipeline::step(const torch::Tensor& input, const torch::Tensor& target,
                             const LossFn& loss) {
  return impl_->step(input, target, loss);
}

torch::Tensor Pipeline::forward(const torch::Tensor& input) {
  return impl_->forward(input);
}

double Pipeline::clip_grad_norm_(double max_norm, double norm_type) {
  return impl_->clip_grad_norm(max_norm, norm_type);
}

std::vector<torch::Tensor> Pipeline::parameters() const {
  return impl_->parameters();
}

std::vector<ParameterShard> Pipeline::parameter_shards() const {
  std::vector<ParameterShard> shards;
  for (const auto& s : impl_->stage_list()) {
    if (DistributedDataParallel* wrapper = s->replicated()) {
      for (ParameterShard& shard : wrapper->parameter_shards())
        shards.push_back(std::move(shard));
      continue;
    }
    for (int i = 0; i < s->module_count(); ++i)
      for (const auto& item : s->module(i).named_parameters()) {
        const torch::Tensor& p = item.value();
        if (!p.requires_grad()) continue;
        shards.push_back({std::to_string(s->first_module() + i) + "." + item.key(), p.sizes().vec(),
                          p.scalar_type(), 0, p.detach().view(-1), p, true, true, p.sizes().vec()});
      }
  }
  return shards;
}

std::vector<std::pair<std::string, torch::Tensor>> Pipeline::other_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& s : impl_->stage_list())
    for (int i = 0; i < s->module_count(); ++i) {
      const std::string prefix = std::to_string(s->first_module() + i) + ".";
      for (const auto& item : s->module(i).named_parameters())
        if (!item.value().requires_grad()) tensors.emplace_back(prefix + item.key(), item.value());
      for (const auto& item : s->module(i).named_buffers())
        tensors.emplace_back(prefix + item.key(), item.value());
    }
  return tensors;
}

void Pipeline::shards_written() {
  for (DistributedDataParallel* wrapper : impl_->replicated())
    wrapper->shards_written();
}

ShardedMemory Pipeline::memory() const {
  ShardedMemory sum;
  const std::vector<DistributedDataParallel*> wrapped = impl_->replicated();
  for (const DistributedDataParallel* ddp : wrapped) {
    const ShardedMemory m = ddp->memory();
    sum.parameter_bytes += m.parameter_bytes, sum.gradient_bytes += m.gradient_bytes;
    sum.peak_parameter_bytes += m.peak_parameter_bytes;
    sum.peak_gradient_bytes += m.peak_gradient_bytes;
  }
  if (wrapped.empty())
    for (const torch::Tensor& p : parameters()) {
      const size_t bytes = static_cast<size_t>(p.numel()) * p.element_size();
      sum.parameter_bytes += bytes, sum.peak_parameter_bytes += bytes;
      if (p.grad().defined()) sum.gradient_bytes += bytes, sum.peak_gradient_bytes += bytes;
    }
  return sum;
}

std::vector<int> Pipeline::stages() const {
  return impl_->stages();
}

void Pipeline::record_events(bool on) {
  for (DistributedDataParallel* ddp : impl_->replicated())
    ddp->record_events(on);
}

std::vector<std::vector<DdpEvent>> Pipeline::events() const {
  std::vector<std::vector<DdpEvent>> all;
  for (DistributedDataParallel* ddp : impl_->replicated())
    all.push_back(ddp->events());
  return all;
}

void Pipeline::register_comm_hook(TorchCommHook hook) {
  impl_->register_comm_hook(std::move(hook));
}

int Pipeline::replica() const {
  return impl_->replica();
}

int Pipeline::replicas() const {
  return impl_->replicas();
}

bool Pipeline::has_first() const {
  return impl_->has_first();
}

bool Pipeline::has_last() const {
  return impl_->has_last();
}

std::string Pipeline::describe() const {
  return impl_->describe();
}

std::string Pipeline::report() const {
  return impl_->report();
}

}  // namespace ddp
