// The LibTorch wrapper's cost: a training step (zero_grad, forward, loss, backward, SGD step)
// of the example's network (cnn, batch 64) or of an MLP of 50 M parameters (mlp, batch 512),
// plain LibTorch or under ddp::DistributedDataParallel, timed over --steps after --warmup.
//   ddp_torch_bench --model cnn|mlp --mode plain|ddp [--cuda] [--steps N] [--warmup N]
//       [--batch B] [--zero LEVEL] [--adamw]
// Prints "ms_per_step X" (the median of 5 rounds of N steps, the device synchronised around
// each round) and, with --mode ddp, what the rank holds after the last step (optimizer state,
// parameters, gradients: MiB). Under ddprun each rank trains its own batch; alone it is one
// rank. --zero: ZeRO's level; --adamw: AdamW instead of SGD with momentum.
#include <ddp/torch.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "fashion_net.h"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    const std::vector<int64_t> widths = {2048, 4096, 4096, 4096, 2048};
    for (size_t i = 0; i + 1 < widths.size(); ++i)
      layers.push_back(register_module("fc" + std::to_string(i + 1),
                                       torch::nn::Linear(widths[i], widths[i + 1])));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i)
      x = i + 1 < layers.size() ? torch::relu(layers[i]->forward(x)) : layers[i]->forward(x);
    return torch::log_softmax(x, 1);
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(Mlp);

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

struct Setup {
  bool ddp_mode = false, cuda = false, adamw = false;
  int zero = 0, steps = 100, warmup = 20;
};

template <typename Net>
double run(Net& net, const Setup& setup, int64_t batch, int64_t features_or_image, int classes) {
  const bool ddp_mode = setup.ddp_mode, cuda = setup.cuda;
  const int steps = setup.steps, warmup = setup.warmup;
  const torch::Device device = cuda ? torch::kCUDA : torch::kCPU;
  std::unique_ptr<ddp::World> world;
  std::unique_ptr<ddp::DistributedDataParallel> model;
  if (ddp_mode) {
    ddp::InitOptions init;
    init.bind_gpu = cuda;
    world = std::make_unique<ddp::World>(ddp::init(init));
  }
  net->to(device);
  if (world)
    model = std::make_unique<ddp::DistributedDataParallel>(
        net, *world, ddp::DistributedDataParallelOptions().zero(setup.zero));
  std::unique_ptr<torch::optim::Optimizer> made;
  if (setup.adamw)
    made =
        std::make_unique<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-4));
  else
    made = std::make_unique<torch::optim::SGD>(net->parameters(),
                                               torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::Optimizer& optimizer = *made;
  const torch::Tensor x = features_or_image > 0 ? torch::randn({batch, features_or_image}, device)
                                                : torch::rand({batch, 1, 28, 28}, device);
  const torch::Tensor y =
      torch::randint(classes, {batch}, torch::TensorOptions(device).dtype(torch::kLong));
  const auto step = [&] {
    optimizer.zero_grad();
    torch::Tensor loss = torch::nll_loss(model ? model->forward(x) : net->forward(x), y);
    loss.backward();
    optimizer.step();
  };
  for (int i = 0; i < warmup; ++i)
    step();
  std::vector<double> rounds;
  for (int round = 0; round < 5; ++round) {
    synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i)
      step();
    synchronize(device);
    rounds.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count() /
        steps);
  }
  std::sort(rounds.begin(), rounds.end());
  if (model) {
    const ddp::ShardedMemory held = model->memory();
    std::printf(
        "rank %d holds: optimizer state %.1f MiB, parameters %.1f MiB, gradients %.1f MiB\n",
        world->rank(), ddp::optimizer_state_bytes(optimizer) / 1048576.0,
        held.parameter_bytes / 1048576.0, held.gradient_bytes / 1048576.0);
  }
  return rounds[2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "cnn", mode = "plain";
  Setup setup;
  int64_t batch = 0;  // 0: the model's (64, 512)
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) throw ddp::UsageError(flag + " needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--model")
      model = value();
    else if (flag == "--mode")
      mode = value();
    else if (flag == "--cuda")
      setup.cuda = true;
    else if (flag == "--adamw")
      setup.adamw = true;
    else if (flag == "--zero")
      setup.zero = std::stoi(value());
    else if (flag == "--steps")
      setup.steps = std::stoi(value());
    else if (flag == "--warmup")
      setup.warmup = std::stoi(value());
    else if (flag == "--batch")
      batch = std::stoll(value());
    else
      throw ddp::UsageError("unknown flag " + flag +
                            " (expected --model, --mode, --cuda, --steps, --warmup, --batch, "
                            "--zero, --adamw)");
  }
  DDP_USAGE_CHECK(model == "cnn" || model == "mlp", "--model {}: expected cnn or mlp", model);
  DDP_USAGE_CHECK(mode == "plain" || mode == "ddp", "--mode {}: expected plain or ddp", mode);
  setup.ddp_mode = mode == "ddp";
  torch::manual_seed(0);
  double ms = 0;
  if (model == "cnn") {
    FashionNet net;
    ms = run(net, setup, batch > 0 ? batch : 64, 0, 10);
  } else {
    Mlp net;
    ms = run(net, setup, batch > 0 ? batch : 512, 2048, 2048);
  }
  std::printf("libtorch %s %s%s: ms_per_step %.4f\n", model.c_str(), mode.c_str(),
              setup.zero > 0 ? (" zero " + std::to_string(setup.zero)).c_str() : "", ms);
  return 0;
}
