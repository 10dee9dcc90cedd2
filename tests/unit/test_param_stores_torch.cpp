// LibTorch's subject of test_param_stores.cpp: TorchParams over a Linear(3, 2)'s weight and bias.
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "tests/unit/param_store_subject.h"
#include "torch/torch_params.h"

namespace ddp {
namespace store_test {
namespace {

class TorchSubject final : public Subject {
 public:
  explicit TorchSubject(int level) : comm_(one_rank(false)), linear_(3, 2) {
    {
      torch::NoGradGuard no_grad;
      linear_->weight.copy_(torch::arange(1, 7, torch::kFloat32).view({2, 3}));
      linear_->bias.copy_(torch::arange(7, 9, torch::kFloat32));
    }
    ddp_ = std::make_unique<Reducer>(*comm_, two_buckets());
    params_ = std::make_unique<TorchParams>(
        std::vector<torch::Tensor>{linear_->weight, linear_->bias},
        std::vector<TorchParams::Slot>{{0, 0, {2, 3}}, {0, 6, {2}}},
        std::vector<torch::ScalarType>{torch::kFloat32}, std::vector<int64_t>{kCount}, *ddp_,
        std::vector<size_t>{0, 1}, level, [](size_t) {}, [] { return nullptr; });
  }
  ShardedState& state() override { return params_->state(); }
  ParamStore& store() override { return *params_; }
  std::vector<float> model_reads() override {
    params_->stale();  // as after the optimizer's step: the next forward gathers
    params_->gather();
    const torch::Tensor flat =
        torch::cat({linear_->weight.detach().flatten(), linear_->bias.detach().flatten()});
    return std::vector<float>(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
  }

 private:
  std::unique_ptr<Communicator> comm_;
  torch::nn::Linear linear_;
  std::unique_ptr<Reducer> ddp_;
  std::unique_ptr<TorchParams> params_;
};

}  // namespace

std::unique_ptr<Subject> make_torch_subject(int level) {
  return std::make_unique<TorchSubject>(level);
}

}  // namespace store_test
}  // namespace ddp
