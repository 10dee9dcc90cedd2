// Pipeline parallelism for a LibTorch model with ddp::Pipeline: 8 blocks of linear + layer norm
// + GELU (a Sequential of 26 modules) classifying Fashion-MNIST, cut into stages over the ranks
// and trained on one of ddp's schedules; with --data-parallel 2 two replicas of the pipeline
// (dp x pp), each on its half of every batch. The LibTorch loop and optimizer are LibTorch's;
// the lines ddp adds are marked "ddp:".
//
//   ddprun --nproc-per-node 2 -- libtorch_pipeline                       # pp 2, 1f1b
//   ddprun --nproc-per-node 2 -- libtorch_pipeline --schedule zb-v       # 4 stages in a V
//   ddprun --nproc-per-node 4 -- libtorch_pipeline --data-parallel 2     # dp 2 x pp 2
//   ddprun --nproc-per-node gpu -- libtorch_pipeline --cuda              # NCCL between GPUs
//
// The last stage's rank of replica 0 prints each epoch's train loss and test accuracy.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include <ddp/models.h>  // ddp::load_fashion_mnist
#include <ddp/torch.h>

namespace {

struct Flags {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string schedule = "1f1b";
  int epochs = 1, micro_batches = 4, data_parallel = 1, width = 256;
  int64_t batch = 128;  // a replica's batch
  int64_t max_steps = -1;
  bool cuda = false;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ddp::UsageError(flag + " needs a value");
      return argv[++i];
    };
    auto number = [&]() -> int64_t {
      const std::string v = value();
      try {
        return std::stoll(v);
      } catch (const std::exception&) {
        throw ddp::UsageError(flag + " " + v + ": expected a number");
      }
    };
    if (flag == "--data-dir")
      f.data_dir = value();
    else if (flag == "--schedule")
      f.schedule = value();
    else if (flag == "--epochs")
      f.epochs = static_cast<int>(number());
    else if (flag == "--micro-batches")
      f.micro_batches = static_cast<int>(number());
    else if (flag == "--data-parallel")
      f.data_parallel = static_cast<int>(number());
    else if (flag == "--batch")
      f.batch = number();
    else if (flag == "--max-steps")
      f.max_steps = number();
    else if (flag == "--cuda")
      f.cuda = true;
    else
      throw ddp::UsageError("unknown flag " + flag +
                            " (expected --data-dir, --schedule, "
                            "--epochs, --micro-batches, --data-parallel, --batch, --max-steps, "
                            "--cuda)");
  }
  return f;
}

// 8 blocks of linear + layer norm + GELU, then the classifier: 26 modules in one Sequential.
torch::nn::Sequential make_model(int width) {
  torch::nn::Sequential model;
  model->push_back(torch::nn::Flatten());
  int in = 28 * 28;
  for (int block = 0; block < 8; ++block) {
    model->push_back(torch::nn::Linear(in, width));
    model->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    model->push_back(torch::nn::GELU());
    in = width;
  }
  model->push_back(torch::nn::Linear(width, 10));
  return model;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags flags = parse(argc, argv);
    ddp::InitOptions init;       // ddp: join the job (ddprun, mpirun, srun or torchrun)
    init.bind_gpu = flags.cuda;  // the rank's GPU and NCCL for CUDA tensors; else Gloo or MPI
    ddp::World world = ddp::init(init);
    const torch::Device device = flags.cuda ? torch::Device(torch::kCUDA) : torch::kCPU;
    torch::manual_seed(1);  // the same first weights on every rank
    torch::nn::Sequential model = make_model(flags.width);
    model->to(device);
    ddp::Pipeline pipe(model, world,  // ddp: this rank's stages of the model
                       ddp::PipelineOptions()
                           .schedule(flags.schedule)
                           .micro_batches(flags.micro_batches)
                           .data_parallel(flags.data_parallel));
    torch::optim::AdamW optimizer(pipe.parameters(), torch::optim::AdamWOptions(1e-3));

    const ddp::Dataset data = ddp::load_fashion_mnist(flags.data_dir);
    const torch::Tensor images =
        torch::from_blob(const_cast<float*>(data.train.x.data()), {data.train.n, 1, 28, 28});
    const torch::Tensor labels =
        torch::from_blob(const_cast<int32_t*>(data.train.y.data()), {data.train.n}, torch::kInt32)
            .to(torch::kLong);
    const auto loss_fn = [](const torch::Tensor& out, const torch::Tensor& target) {
      return torch::nn::functional::cross_entropy(out, target);
    };
    const int64_t global = flags.batch * pipe.replicas();
    int64_t step = 0;
    for (int epoch = 1; epoch <= flags.epochs; ++epoch) {
      // Every rank draws the same order; each replica takes its part of every global batch.
      torch::manual_seed(100 + epoch);
      const torch::Tensor order = torch::randperm(data.train.n);
      double loss_sum = 0;
      int64_t steps = 0;
      const auto start = std::chrono::steady_clock::now();
      for (int64_t at = 0; at + global <= data.train.n; at += global) {
        if (flags.max_steps >= 0 && step >= flags.max_steps) break;
        const torch::Tensor mine = order.narrow(0, at + pipe.replica() * flags.batch, flags.batch);
        optimizer.zero_grad();
        const torch::Tensor loss = pipe.step(images.index_select(0, mine).to(device),  // ddp:
                                             labels.index_select(0, mine).to(device), loss_fn);
        optimizer.step();
        if (pipe.has_last()) loss_sum += loss.item<double>();
        ++steps;
        ++step;
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // Test accuracy: the test images through the pipeline (every rank of each replica takes
      // part; the output is on the last stage's rank).
      model->eval();
      const torch::Tensor test_x =
          torch::from_blob(const_cast<float*>(data.test.x.data()), {data.test.n, 1, 28, 28});
      const torch::Tensor output = pipe.forward(test_x.to(device));  // ddp:
      model->train();
      if (pipe.has_last() && pipe.replica() == 0) {
        const torch::Tensor test_y =
            torch::from_blob(const_cast<int32_t*>(data.test.y.data()), {data.test.n}, torch::kInt32)
                .to(torch::kLong);
        const double accuracy = output.argmax(1).cpu().eq(test_y).sum().item<double>() /
                                static_cast<double>(data.test.n);
        std::printf(
            "epoch %d: %lld steps, train loss %.4f, test accuracy %.2f%% (%.2f ms a step)\n", epoch,
            static_cast<long long>(steps), loss_sum / std::max<int64_t>(steps, 1), 100 * accuracy,
            1e3 * seconds / static_cast<double>(std::max<int64_t>(steps, 1)));
        std::fflush(stdout);
      }
    }
    return 0;
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "libtorch_pipeline: error: %s\n", e.what());
    return 2;
  }
}
