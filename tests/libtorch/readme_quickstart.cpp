// README.md's LibTorch quickstart as written: its block (after the README's
// <!-- quickstart-libtorch --> marker, extracted at build time into readme_quickstart.inc) inside a
// function given the names the block takes from the program around it: the model `net`, a
// Sequential `sequential` for the pipeline, a batch `x`, `y`, the `step` and the pipeline's
// `loss_fn`. Readme.LibTorchQuickstartRunsAsWritten runs it on 2 ranks under ddprun: the data-
// parallel step, the asynchronous sharded checkpoint, the pipeline's step.
#include <ddp/torch.h>
#include <torch/torch.h>  // the program's own LibTorch, as any LibTorch program includes it

#include <cstdio>

namespace {

void quickstart(torch::nn::Sequential net, torch::nn::Sequential sequential, const torch::Tensor& x,
                const torch::Tensor& y, int64_t step, const ddp::Pipeline::LossFn& loss_fn) {
#include "readme_quickstart.inc"
  std::printf("rank %d of %d: the quickstart ran; the pipeline's loss %s\n", world.rank(),
              world.size(),
              loss.defined() ? std::to_string(loss.item<double>()).c_str() : "on the last stage");
}

torch::nn::Sequential blocks(int count) {
  torch::nn::Sequential model;
  for (int i = 0; i < count; ++i) {
    model->push_back(torch::nn::Linear(8, 8));
    model->push_back(torch::nn::ReLU());
  }
  model->push_back(torch::nn::Linear(8, 4));
  return model;
}

}  // namespace

int main() {
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor y = torch::randint(0, 4, {16});
  quickstart(blocks(1), blocks(4), x, y, /*step=*/1,
             [](const torch::Tensor& out, const torch::Tensor& target) {
               return torch::nn::functional::cross_entropy(out, target);
             });
  return 0;
}
