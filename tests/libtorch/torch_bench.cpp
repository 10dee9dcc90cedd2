// The LibTorch wrapper's cost: a training step (zero_grad, forward, loss, backward, SGD step)
// of the example's network (cnn, batch 64), of an MLP of 50 M parameters (mlp, batch 512), of
// ResNet-18 as for CIFAR-10 (resnet: 3x3 stem, 4 stages of 2 basic blocks with batch norm,
// 11 M parameters, 32x32 images, batch 128) or of 4 pre-norm transformer blocks (transformer:
// width 1024, 16 heads, 256 tokens, batch 16, 50 M parameters), plain LibTorch or under
// ddp::DistributedDataParallel, timed over --steps after --warmup; tests/libtorch/torch_bench.py
// is the same in Python.
//   ddp_torch_bench --model cnn|mlp|resnet|transformer --mode plain|ddp|both [--cuda]
//       [--steps N] [--rounds N] [--warmup N] [--batch B] [--zero LEVEL] [--adamw]
//       [--dtype fp32|bf16] [--hook none|bf16|powersgd] [--powersgd-rank R] [--units]
// Prints "ms_per_step X rounds ..." (the median of --rounds rounds (5) of N steps, the device
// synchronised around each round, then every round in order) and, wrapped, what the rank holds
// after the last step (optimizer state, parameters, gradients: MiB). --mode both: the plain and
// the wrapped model in one process, their rounds interleaved (a line each). --hook: the wrapped
// model's communication hook (bf16_compress_comm_hook, or powersgd_comm_hook of rank
// --powersgd-rank (1) from the 11th step), with PowerSGD the elements it sent of those it took.
// Under ddprun each rank trains its own batch; alone it is one rank. --zero: ZeRO's level; --adamw:
// AdamW instead of SGD with momentum; --dtype bf16: the model and its input in bfloat16 (the loss
// in float32); --units: the wrapped model's layers (mlp) or blocks (transformer) each a
// ddp::ShardUnit (with --zero 3 on several ranks, sharded a unit at a time).
#include <ddp/torch.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "fashion_net.h"

namespace {

// --units: the wrapped model's layers (mlp) or blocks (transformer) declared as ddp::ShardUnit,
// as a user makes them shard units; set while that model is made (the plain one has none).
bool declare_units = false;

// A layer or block called directly, or through its ddp::ShardUnit (--units).
template <typename Holder>
struct Part {
  Holder module;
  ddp::ShardUnit unit{nullptr};
  torch::Tensor operator()(const torch::Tensor& x) { return unit.is_empty() ? module(x) : unit(x); }
};

template <typename Holder>
Part<Holder> add_part(torch::nn::Module& parent, const std::string& name, Holder module) {
  if (declare_units) return {module, parent.register_module(name, ddp::ShardUnit(module))};
  return {parent.register_module(name, module)};
}

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    const std::vector<int64_t> widths = {2048, 4096, 4096, 4096, 2048};
    for (size_t i = 0; i + 1 < widths.size(); ++i)
      layers.push_back(add_part(*this, "fc" + std::to_string(i + 1),
                                torch::nn::Linear(widths[i], widths[i + 1])));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i)
      x = i + 1 < layers.size() ? torch::relu(layers[i](x)) : layers[i](x);
    return torch::log_softmax(x, 1);
  }
  std::vector<Part<torch::nn::Linear>> layers;
};
TORCH_MODULE(Mlp);

// ResNet's basic block: two 3x3 convolutions with batch norm, and the shortcut (a strided 1x1
// convolution with batch norm where the shape changes).
struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module(
            "conv1",
            torch::nn::Conv2d(
                torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2(register_module(
            "conv2",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      down = register_module(
          "down",
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
      down_bn = register_module("down_bn", torch::nn::BatchNorm2d(out));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (down.is_empty() ? x : down_bn(down(x))));
  }
  torch::nn::Conv2d conv1, conv2, down{nullptr};
  torch::nn::BatchNorm2d bn1, bn2, down_bn{nullptr};
};
TORCH_MODULE(BasicBlock);

// ResNet-18 as for CIFAR-10: a 3x3 stem, stages of 64, 128, 256 and 512 channels, 10 classes.
struct ResNetImpl : torch::nn::Module {
  ResNetImpl()
      : stem(register_module(
            "stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 3).padding(1).bias(false)))),
        stem_bn(register_module("stem_bn", torch::nn::BatchNorm2d(64))),
        fc(register_module("fc", torch::nn::Linear(512, 10))) {
    int64_t in = 64;
    for (const int64_t out : {64, 128, 256, 512})
      for (int b = 0; b < 2; ++b) {
        blocks.push_back(register_module("block" + std::to_string(blocks.size()),
                                         BasicBlock(in, out, b == 0 && out != 64 ? 2 : 1)));
        in = out;
      }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(stem_bn(stem(x)));
    for (BasicBlock& block : blocks)
      x = block(x);
    return torch::log_softmax(fc(x.mean({2, 3})).to(torch::kFloat32), 1);
  }
  torch::nn::Conv2d stem;
  torch::nn::BatchNorm2d stem_bn;
  torch::nn::Linear fc;
  std::vector<BasicBlock> blocks;
};
TORCH_MODULE(ResNet);

// A pre-norm transformer block: attention (written out: LibTorch 1.13 has no fused kernel) and
// a 4x MLP with GELU, each around a residual.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width)
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj(register_module("proj", torch::nn::Linear(width, width))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        up(register_module("up", torch::nn::Linear(width, 4 * width))),
        down(register_module("down", torch::nn::Linear(4 * width, width))) {}
  torch::Tensor forward(torch::Tensor x) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2), heads = 16;
    std::vector<torch::Tensor> parts = qkv(norm1(x)).view({b, t, 3, heads, d / heads}).unbind(2);
    const torch::Tensor q = parts[0].transpose(1, 2), k = parts[1].transpose(1, 2),
                        v = parts[2].transpose(1, 2);  // (b, heads, t, d / heads)
    torch::Tensor a = torch::softmax(
        torch::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(d / heads)), -1);
    x = x + proj(torch::matmul(a, v).transpose(1, 2).reshape({b, t, d}));
    return x + down(torch::gelu(up(norm2(x))));
  }
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

// 4 blocks of width 1024 and a classifier over the mean token (1000 classes).
struct TransformerImpl : torch::nn::Module {
  TransformerImpl() : head(register_module("head", torch::nn::Linear(1024, 1000))) {
    for (int i = 0; i < 4; ++i)
      blocks.push_back(add_part(*this, "block" + std::to_string(i), Block(1024)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (Part<Block>& block : blocks)
      x = block(x);
    return torch::log_softmax(head(x.mean(1)).to(torch::kFloat32), 1);
  }
  torch::nn::Linear head;
  std::vector<Part<Block>> blocks;
};
TORCH_MODULE(Transformer);

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

struct Setup {
  bool cuda = false, adamw = false, units = false;
  std::string mode = "plain";  // plain, ddp or both
  std::string hook = "none";   // the wrapped model's communication hook: none, bf16, powersgd
  torch::Dtype dtype = torch::kFloat32;
  int zero = 0, steps = 100, warmup = 20, rounds = 5, powersgd_rank = 1;
};

// One model as the timed step trains it: plain LibTorch, or under the wrapper when `world` is
// given, with its own optimizer.
template <typename Net>
struct Trainer {
  Trainer(const Setup& setup, ddp::World* world, const torch::Device& device) {
    net->to(device, setup.dtype);
    if (world) {
      model = std::make_unique<ddp::DistributedDataParallel>(
          net, *world, ddp::DistributedDataParallelOptions().zero(setup.zero));
      if (setup.hook == "bf16") model->register_comm_hook(ddp::bf16_compress_comm_hook());
      if (setup.hook == "powersgd") {
        // As the PyTorch run's (torch_bench.py): rank r, compressed after 10 exact steps.
        powersgd =
            std::make_shared<ddp::PowerSGDState>(ddp::PowerSGDOptions()
                                                     .matrix_approximation_rank(setup.powersgd_rank)
                                                     .start_powerSGD_iter(10));
        model->register_comm_hook(ddp::powersgd_comm_hook(powersgd));
      }
    }
    if (setup.adamw)
      optimizer = std::make_unique<torch::optim::AdamW>(net->parameters(),
                                                        torch::optim::AdamWOptions(1e-4));
    else
      optimizer = std::make_unique<torch::optim::SGD>(net->parameters(),
                                                      torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  void step(const torch::Tensor& x, const torch::Tensor& y) {
    optimizer->zero_grad();
    torch::Tensor loss =
        torch::nll_loss((model ? model->forward(x) : net->forward(x)).to(torch::kFloat32), y);
    loss.backward();
    optimizer->step();
  }
  Net net;  // made before the constructor's body: the caller seeds
  std::unique_ptr<ddp::DistributedDataParallel> model;
  std::shared_ptr<ddp::PowerSGDState> powersgd;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

// Times --rounds rounds of --steps steps after --warmup and prints each mode's line: the median
// round, then every round in order. --mode both: a plain and a wrapped copy of the model in one
// process, their rounds interleaved (plain first in even rounds, wrapped first in odd ones), so
// that what drifts over the run (clocks, the machine's other work) hits both alike and round k
// of one can be set against round k of the other. A step's input: [batch, sizes...].
template <typename Net>
void run(const Setup& setup, const std::string& name, const std::vector<int64_t>& input,
         int classes) {
  const int64_t batch = input[0];
  const torch::Device device = setup.cuda ? torch::kCUDA : torch::kCPU;
  std::unique_ptr<ddp::World> world;
  if (setup.mode != "plain") {
    ddp::InitOptions init;
    init.bind_gpu = setup.cuda;
    world = std::make_unique<ddp::World>(ddp::init(init));
  }
  std::vector<std::pair<std::string, std::unique_ptr<Trainer<Net>>>> trainers;
  if (setup.mode != "ddp") {
    torch::manual_seed(0);  // the same weights in every mode
    trainers.emplace_back("plain", std::make_unique<Trainer<Net>>(setup, nullptr, device));
  }
  if (setup.mode != "plain") {
    torch::manual_seed(0);
    declare_units = setup.units;
    trainers.emplace_back("ddp", std::make_unique<Trainer<Net>>(setup, world.get(), device));
    declare_units = false;
  }
  const torch::Tensor x = torch::randn(input, torch::TensorOptions(device).dtype(setup.dtype));
  const torch::Tensor y =
      torch::randint(classes, {batch}, torch::TensorOptions(device).dtype(torch::kLong));
  for (auto& [mode, trainer] : trainers)
    for (int i = 0; i < setup.warmup; ++i)
      trainer->step(x, y);
  std::vector<std::vector<double>> rounds(trainers.size());
  for (int round = 0; round < setup.rounds; ++round)
    for (size_t k = 0; k < trainers.size(); ++k) {
      const size_t which = round % 2 == 0 ? k : trainers.size() - 1 - k;
      synchronize(device);
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < setup.steps; ++i)
        trainers[which].second->step(x, y);
      synchronize(device);
      rounds[which].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count() /
          setup.steps);
    }
  for (size_t k = 0; k < trainers.size(); ++k) {
    std::vector<double> sorted = rounds[k];
    std::sort(sorted.begin(), sorted.end());
    std::string each;
    for (const double ms : rounds[k])
      each += " " + std::to_string(ms);
    const bool wrapped = trainers[k].second->model != nullptr;
    std::printf("libtorch %s %s%s%s%s%s: ms_per_step %.4f rounds%s\n", name.c_str(),
                trainers[k].first.c_str(),
                setup.zero > 0 ? (" zero " + std::to_string(setup.zero)).c_str() : "",
                wrapped && setup.units ? " units" : "",
                wrapped && setup.hook != "none" ? (" hook " + setup.hook).c_str() : "",
                setup.dtype == torch::kBFloat16 ? " bf16" : "", sorted[sorted.size() / 2],
                each.c_str());
  }
  for (auto& [mode, trainer] : trainers) {
    if (!trainer->model) continue;
    const ddp::ShardedMemory held = trainer->model->memory();
    std::printf(
        "rank %d holds: optimizer state %.1f MiB, parameters %.1f MiB, gradients %.1f MiB\n",
        world->rank(), ddp::optimizer_state_bytes(*trainer->optimizer) / 1048576.0,
        held.parameter_bytes / 1048576.0, held.gradient_bytes / 1048576.0);
    if (trainer->powersgd)
      std::printf("rank %d powersgd sent %lld of %lld elements\n", world->rank(),
                  static_cast<long long>(trainer->powersgd->elements_after_compression()),
                  static_cast<long long>(trainer->powersgd->elements_before_compression()));
  }
}

// The flags read, the model timed.
int bench(int argc, char** argv) {
  std::string model = "cnn", dtype = "fp32";
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
      setup.mode = value();
    else if (flag == "--cuda")
      setup.cuda = true;
    else if (flag == "--adamw")
      setup.adamw = true;
    else if (flag == "--units")
      setup.units = true;
    else if (flag == "--zero")
      setup.zero = std::stoi(value());
    else if (flag == "--steps")
      setup.steps = std::stoi(value());
    else if (flag == "--hook")
      setup.hook = value();
    else if (flag == "--powersgd-rank")
      setup.powersgd_rank = std::stoi(value());
    else if (flag == "--rounds")
      setup.rounds = std::stoi(value());
    else if (flag == "--warmup")
      setup.warmup = std::stoi(value());
    else if (flag == "--batch")
      batch = std::stoll(value());
    else if (flag == "--dtype")
      dtype = value();
    else
      throw ddp::UsageError(
          "unknown flag " + flag +
          " (expected --model, --mode, --cuda, --steps, --rounds, --warmup, --batch, --hook, "
          "--powersgd-rank, "
          "--zero, --adamw, --dtype, --units)");
  }
  DDP_USAGE_CHECK(model == "cnn" || model == "mlp" || model == "resnet" || model == "transformer",
                  "--model {}: expected cnn, mlp, resnet or transformer", model);
  DDP_USAGE_CHECK(!setup.units || model == "mlp" || model == "transformer",
                  "--units --model {}: expected mlp or transformer (their layers or blocks)",
                  model);
  DDP_USAGE_CHECK(dtype == "fp32" || dtype == "bf16", "--dtype {}: expected fp32 or bf16", dtype);
  setup.dtype = dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  DDP_USAGE_CHECK(setup.mode == "plain" || setup.mode == "ddp" || setup.mode == "both",
                  "--mode {}: expected plain, ddp or both", setup.mode);
  DDP_USAGE_CHECK(setup.hook == "none" || setup.hook == "bf16" || setup.hook == "powersgd",
                  "--hook {}: expected none, bf16 or powersgd", setup.hook);
  DDP_USAGE_CHECK(setup.powersgd_rank >= 1, "--powersgd-rank {}: expected at least 1",
                  setup.powersgd_rank);
  DDP_USAGE_CHECK(setup.rounds > 0 && setup.steps > 0,
                  "--rounds {} --steps {}: expected at least 1 each", setup.rounds, setup.steps);
  if (model == "cnn")
    run<FashionNet>(setup, model, {batch > 0 ? batch : 64, 1, 28, 28}, 10);
  else if (model == "mlp")
    run<Mlp>(setup, model, {batch > 0 ? batch : 512, 2048}, 2048);
  else if (model == "resnet")
    run<ResNet>(setup, model, {batch > 0 ? batch : 128, 3, 32, 32}, 10);
  else
    run<Transformer>(setup, model, {batch > 0 ? batch : 16, 256, 1024}, 1000);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return bench(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_torch_bench: %s\n", e.what());
    return 2;
  }
}
