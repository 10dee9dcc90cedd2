// A LibTorch program trained data-parallel with ddp: pytorch/examples' cpp/mnist network on
// Fashion-MNIST, one process per CPU slot or GPU, started by ddprun, mpirun, srun or torchrun.
//   ddprun --nproc-per-node 2 -- ./libtorch_fashion                 (CPU, Gloo)
//   ddprun --nproc-per-node 8 -- ./libtorch_fashion --cuda          (a GPU each, NCCL)
//   ddprun --nproc-per-node 2 -- ./libtorch_fashion --zero 3        (ZeRO: each rank a share)
//   ddprun --nproc-per-node 2 -- ./libtorch_fashion --powersgd 2    (PowerSGD, rank 2)
//   ddprun --nproc-per-node 2 -- ./libtorch_fashion --precision bf16  (bf16 weights and buckets)
//   ddprun --nproc-per-node 2 -- ./libtorch_fashion --precision autocast  (float32 weights,
//                                                     bf16 products: LibTorch's autocast)
// What it adds to a LibTorch loop: ddp::init(), the DistributedDataParallel wrapper, LibTorch's
// DistributedRandomSampler so that each rank reads its own part of each epoch, and rank 0 saving
// the checkpoint (written aside, read back, then renamed over the last one).
#include <ddp/torch.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <ddp/models.h>  // ddp::load_fashion_mnist
#include "fashion_net.h"

namespace {

// Fashion-MNIST images [n, 1, 28, 28] and labels as a torch::data data set.
class FashionMnist : public torch::data::datasets::Dataset<FashionMnist> {
 public:
  explicit FashionMnist(const ddp::Split& split)
      : images_(torch::from_blob(const_cast<float*>(split.x.data()), {split.n, 1, 28, 28}).clone()),
        labels_(torch::from_blob(const_cast<int32_t*>(split.y.data()), {split.n}, torch::kInt32)
                    .to(torch::kLong)) {}
  torch::data::Example<> get(size_t index) override {
    const int64_t i = static_cast<int64_t>(index);
    return {images_[i], labels_[i]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(images_.size(0)); }
  const torch::Tensor& images() const { return images_; }
  const torch::Tensor& labels() const { return labels_; }

 private:
  torch::Tensor images_, labels_;
};

struct Flags {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string checkpoint;  // empty: none
  int epochs = 1;
  int64_t batch = 64;  // the global batch, split over the ranks
  int64_t max_steps = -1;
  double lr = 0.05;
  bool cuda = false;
  int zero = 0;                    // ZeRO level (DistributedDataParallelOptions::zero)
  int powersgd = 0;                // PowerSGD's rank (0: the exact average)
  std::string precision = "fp32";  // fp32, bf16 (the model in bf16), autocast (bf16 products)
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) throw ddp::UsageError(flag + " needs a value");
      return std::string(argv[++i]);
    };
    if (flag == "--data-dir")
      f.data_dir = value();
    else if (flag == "--checkpoint")
      f.checkpoint = value();
    else if (flag == "--epochs")
      f.epochs = std::stoi(value());
    else if (flag == "--batch")
      f.batch = std::stoll(value());
    else if (flag == "--max-steps")
      f.max_steps = std::stoll(value());
    else if (flag == "--lr")
      f.lr = std::stod(value());
    else if (flag == "--cuda")
      f.cuda = true;
    else if (flag == "--zero")
      f.zero = std::stoi(value());
    else if (flag == "--precision")
      f.precision = value();
    else if (flag == "--powersgd")
      f.powersgd = std::stoi(value());
    else
      throw ddp::UsageError("unknown flag " + flag +
                            " (expected --data-dir, --checkpoint, --epochs, --batch, "
                            "--max-steps, --lr, --cuda, --zero, --powersgd, --precision)");
  }
  if (f.precision != "fp32" && f.precision != "bf16" && f.precision != "autocast")
    throw ddp::UsageError("--precision " + f.precision +
                          ": expected fp32, bf16 (the model in bfloat16) or autocast (float32 "
                          "weights, bfloat16 products)");
  return f;
}

// Rank 0's checkpoint: written aside, read back into a fresh network, then renamed over the
// last one, so that a crash never leaves a half-written file under its name.
void save_checkpoint(const FashionNet& net, const std::string& path) {
  const std::string aside = path + ".tmp";
  torch::save(net, aside);
  FashionNet check;
  torch::load(check, aside);
  std::filesystem::rename(aside, path);
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {  // before ddp::init, whose handler makes later errors `error:` lines and exit 2
    flags = parse(argc, argv);
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  ddp::InitOptions init;
  init.bind_gpu = flags.cuda;  // NCCL for CUDA tensors; Gloo (or MPI under mpirun) otherwise
  ddp::World world = ddp::init(init);
  const torch::Device device = flags.cuda ? torch::kCUDA : torch::kCPU;
  DDP_USAGE_CHECK(flags.batch % world.size() == 0, "--batch {} does not split over {} ranks",
                  flags.batch, world.size());

  torch::manual_seed(1);
  FashionNet net;
  if (!flags.checkpoint.empty() && std::filesystem::exists(flags.checkpoint)) {
    torch::load(net, flags.checkpoint);  // rank 0's copy reaches the others below
    if (world.rank() == 0) std::printf("resumed from %s\n", flags.checkpoint.c_str());
  }
  // bf16: the parameters, their gradients and the buckets' all-reduce in bfloat16.
  const torch::Dtype dtype = flags.precision == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  net->to(device, dtype);
  // Rank 0's weights on every rank; with --zero each rank steps and keeps the optimizer state
  // of its share of the parameters (ZeRO 3: holds only those between steps).
  ddp::DistributedDataParallel model(net, world,
                                     ddp::DistributedDataParallelOptions().zero(flags.zero));
  if (flags.powersgd > 0) {  // gradients as rank-r approximations, after 10 exact steps
    auto state = std::make_shared<ddp::PowerSGDState>(
        ddp::PowerSGDOptions().matrix_approximation_rank(flags.powersgd).start_powerSGD_iter(10));
    model.register_comm_hook(ddp::powersgd_comm_hook(state));
  }
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(flags.lr).momentum(0.5));

  const ddp::Dataset data = ddp::load_fashion_mnist(flags.data_dir);
  FashionMnist train(data.train), test(data.test);
  // Each rank its own part of each epoch (LibTorch's sampler; set_epoch reshuffles).
  torch::data::samplers::DistributedRandomSampler sampler(*train.size(), world.size(),
                                                          world.rank());
  auto loader = torch::data::make_data_loader(
      train.map(torch::data::transforms::Stack<>()), sampler,
      torch::data::DataLoaderOptions(flags.batch / world.size()).drop_last(true));

  int64_t step = 0;
  for (int epoch = 1; epoch <= flags.epochs; ++epoch) {
    sampler.set_epoch(static_cast<size_t>(epoch));
    net->train();
    double loss_sum = 0;
    int64_t batches = 0;
    for (auto& batch : *loader) {
      if (flags.max_steps >= 0 && step >= flags.max_steps) break;
      optimizer.zero_grad();
      torch::Tensor output;
      {
        std::optional<ddp::Autocast> autocast;  // bf16 products while it lives
        if (flags.precision == "autocast") autocast.emplace(device.type(), torch::kBFloat16);
        output = model.forward(batch.data.to(device, dtype));
      }
      torch::Tensor loss = torch::nll_loss(output.to(torch::kFloat32), batch.target.to(device));
      loss.backward();  // the gradients are averaged over the ranks before it returns
      optimizer.step();
      loss_sum += loss.item<double>();
      ++batches;
      ++step;
    }
    model.gather_parameters();  // ZeRO: every parameter as its owner updated it (every rank)
    if (world.rank() == 0) {
      torch::NoGradGuard no_grad;
      net->eval();
      const torch::Tensor predicted = net->forward(test.images().to(device, dtype)).argmax(1);
      const double accuracy =
          predicted.eq(test.labels().to(device)).sum().item<double>() / test.images().size(0);
      std::printf("epoch %d: %lld steps, train loss %.4f, test accuracy %.2f%%\n", epoch,
                  static_cast<long long>(batches), loss_sum / std::max<int64_t>(batches, 1),
                  100 * accuracy);
      std::fflush(stdout);
      if (!flags.checkpoint.empty()) save_checkpoint(net, flags.checkpoint);
    }
  }
  return 0;
}
