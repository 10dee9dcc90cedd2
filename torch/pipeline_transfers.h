// ddp::Pipeline's transfers (torch/pipeline.h): a stage's activations and gradients to the
// stages of other ranks over a communicator a flow, direction and peer, their shapes and
// dtypes sent ahead of the first step's messages (and of every evaluation's), or handed over in
// memory between two stages of one rank. Internal to torch/pipeline.cpp.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/error.h"
#include "torch/comm_hooks.h"

#if DDP_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp {

// "[8, 64] float"
inline std::string shape_of(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d)
    s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "] " + std::string(c10::toString(t.scalar_type()));
}

// The current CUDA stream of `device`, or null (the CPU).
inline void* stream_of(const torch::Device& device) {
#if DDP_TORCH_CUDA
  if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
  (void)device;
  return nullptr;
}

// What travels ahead of a flow's first message (the first step): the dtype and the shape.
constexpr int kHeaderWords = 8;  // dtype, dimensions, up to 6 sizes
constexpr int kMaxDims = kHeaderWords - 2;

// The messages between this rank's stages and the others' (and, between two stages of this
// rank, the hand-over in memory), as the executor's actions post them.
class PipelineTransfers {
 public:
  // `lanes`: (activations?, from rank, to rank) -> its communicator.
  PipelineTransfers(std::map<std::tuple<bool, int, int>, Communicator*> lanes,
                    std::vector<int> stage_rank, int rank)
      : lanes_(std::move(lanes)), stage_rank_(std::move(stage_rank)), rank_(rank) {}

  // Micro-batch `micro`'s tensor from stage `from` to stage `to` (activations or gradients).
  void send(bool activation, int from, int to, int micro, const torch::Tensor& tensor) {
    const torch::Tensor t = tensor.detach().contiguous();
    const Key key{activation, from, micro};
    if (stage_rank_[to] == rank_) {
      handed_[key] = t;
      return;
    }
    Communicator& lane = *lanes_.at({activation, rank_, stage_rank_[to]});
    const ComputeStreamGuard on_stream(lane, stream_of(t));
    auto& cache = evaluating_ ? evaluation_sent_ : sent_;
    auto known = cache.find(key);
    if (known == cache.end()) {  // the first step (or an evaluation): the shape goes first
      DDP_USAGE_CHECK(t.dim() <= kMaxDims,
                      "ddp::Pipeline: stage {} sends a tensor of {} dimensions "
                      "(at most {})",
                      from, t.dim(), kMaxDims);
      std::vector<int64_t> words(kHeaderWords, 0);
      words[0] = static_cast<int64_t>(t.scalar_type());
      words[1] = t.dim();
      for (int64_t d = 0; d < t.dim(); ++d)
        words[2 + d] = t.size(d);
      torch::Tensor header = torch::tensor(words, torch::kInt64).to(t.device());
      post_send(lane, header, stage_rank_[to]);
      cache[key] = {t.sizes().vec(), t.scalar_type()};
    } else {
      DDP_USAGE_CHECK(
          known->second.first == t.sizes().vec() && known->second.second == t.scalar_type(),
          "ddp::Pipeline: stage {} sends {} of micro-batch {} to stage {}, but the "
          "first step sent {}: a pipeline's shapes stay those of its first step "
          "(make a new Pipeline for others)",
          from, shape_of(t), micro, to,
          shape_of(torch::empty(known->second.first,
                                torch::TensorOptions().dtype(known->second.second))));
    }
    post_send(lane, t, stage_rank_[to]);
  }

  // Micro-batch `micro`'s tensor sent by stage `from` to stage `to`, on `device`.
  torch::Tensor receive(bool activation, int from, int to, int micro, const torch::Device& device) {
    const Key key{activation, from, micro};
    if (stage_rank_[from] == rank_) {
      const auto it = handed_.find(key);
      DDP_CHECK(it != handed_.end(),
                "ddp::Pipeline: stage {} has not handed stage {} the {} of "
                "micro-batch {}",
                from, to, activation ? "activation" : "gradient", micro);
      torch::Tensor t = it->second;
      handed_.erase(it);
      return t;
    }
    Communicator& lane = *lanes_.at({activation, stage_rank_[from], rank_});
    const ComputeStreamGuard on_stream(lane, ddp::stream_of(device));
    const int peer = stage_rank_[from];
    auto& cache = evaluating_ ? evaluation_received_ : received_;
    auto known = cache.find(key);
    if (known == cache.end()) {
      torch::Tensor header =
          torch::zeros({kHeaderWords}, torch::TensorOptions().dtype(torch::kInt64).device(device));
      post_receive(lane, header, peer, device);
      const torch::Tensor words = header.cpu();
      const auto* w = words.data_ptr<int64_t>();
      std::vector<int64_t> sizes(w + 2, w + 2 + w[1]);
      known = cache.emplace(key, std::make_pair(sizes, static_cast<torch::ScalarType>(w[0]))).first;
    }
    torch::Tensor t = torch::empty(
        known->second.first, torch::TensorOptions().dtype(known->second.second).device(device));
    post_receive(lane, t, peer, device);
    return t;
  }

  // Evaluation's transfers (on) until it ends (off): every message's shape goes with it, as
  // an evaluation's micro-batches need not be a step's.
  void set_evaluating(bool on) {
    evaluating_ = on;
    evaluation_sent_.clear();
    evaluation_received_.clear();
  }

  // The step's end: every send done (CPU: waited for; CUDA: the current stream waits).
  void end_step() {
    for (auto& [work, tensor, lane] : sending_) {
      if (tensor.is_cuda())
        work->then_on(stream_of(tensor));
      else
        work->wait(lane->timeout());
    }
    sending_.clear();
    DDP_CHECK(handed_.empty(),
              "ddp::Pipeline: {} hand-overs between this rank's stages were "
              "never taken",
              handed_.size());
  }

 private:
  using Key = std::tuple<bool, int, int>;  // activations?, from stage, micro-batch

  static void* stream_of(const torch::Device& device) {
#if DDP_TORCH_CUDA
    if (device.is_cuda()) return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#endif
    (void)device;
    return nullptr;
  }
  static void* stream_of(const torch::Tensor& t) {
    return stream_of(t.device());
  }

  void post_send(Communicator& lane, const torch::Tensor& t, int peer) {
    check_device(lane, t);
    sending_.push_back({lane.isend(t.data_ptr(), static_cast<size_t>(t.numel()),
                                   collective_type_or_int(t.scalar_type()), peer),
                        t, &lane});
  }
  void post_receive(Communicator& lane, torch::Tensor& t, int peer, const torch::Device& device) {
    check_device(lane, t);
    std::unique_ptr<Work> work = lane.irecv(t.data_ptr(), static_cast<size_t>(t.numel()),
                                            collective_type_or_int(t.scalar_type()), peer);
    if (device.is_cuda())
      work->then_on(ddp::stream_of(device));
    else
      work->wait(lane.timeout());
  }
  static void check_device(Communicator& lane, const torch::Tensor& t) {
    DDP_USAGE_CHECK(t.is_cuda() == lane.device_buffers(),
                    "ddp::Pipeline: a {} tensor, but the world's communicator ({}) carries {} "
                    "tensors; give the module the device ddp::init bound",
                    t.device().str(), lane.backend(), lane.device_buffers() ? "CUDA" : "CPU");
  }
  static DataType collective_type_or_int(torch::ScalarType type) {
    if (type == torch::kInt64) return DataType::kInt64;
    if (type == torch::kInt32) return DataType::kInt32;
    return collective_type(type);
  }

  struct Sending {
    std::unique_ptr<Work> work;
    torch::Tensor tensor;  // kept until the send is done
    Communicator* lane;
  };
  std::map<std::tuple<bool, int, int>, Communicator*> lanes_;
  std::vector<int> stage_rank_;
  int rank_;
  std::map<Key, torch::Tensor> handed_;
  std::map<Key, std::pair<std::vector<int64_t>, torch::ScalarType>> sent_, received_;
  bool evaluating_ = false;
  std::map<Key, std::pair<std::vector<int64_t>, torch::ScalarType>> evaluation_sent_,
      evaluation_received_;
  std::vector<Sending> sending_;
};

}  // namespace ddp
