// LibTorch programs as their users write them, for the tests that hold ddp to a user's first
// lines (round 6's regressions): the model made the four ways LibTorch's own examples make one,
// wrapped by ddp::DistributedDataParallel, trained K steps with SGD on seeded data (the global
// batch of each step split over the ranks), rank 0's parameters written to --out (safetensors,
// float32, the module's names). --single: the same loop in one process, no ddp at all.
//   user_program --model stack|holder|shared|sequential [--single] [--steps K] [--out FILE]
//                [--load FILE] [--save-start FILE] [--cuda]
// stack: `Net model;` on main's stack (pytorch/examples' cpp/mnist), wrapped by reference, the
// module's own forward; holder: TORCH_MODULE's Net, model.forward(x); shared: a
// std::make_shared<NetImpl>(), model.forward(x); sequential: a torch::nn::Sequential holder,
// model.forward(x). --load: torch::load of the whole model after the wrapper and the optimizer
// are made (resume code), then the loop as written (no sync_buffers(): the model has no buffers);
// --save-start: a model of another seed saved there, for --load. --cuda: the model and the data
// on the GPU (moved before the wrapper is made, loaded onto it), as a GPU user writes it.
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <ddp/torch.h>
#include "models/safetensors.h"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(6, 16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

torch::nn::Sequential make_sequential() {
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 3));
}

struct Args {
  std::string model = "holder", out, load, save_start;
  bool single = false, cuda = false;
  int steps = 6;
  torch::Device device() const { return cuda ? torch::kCUDA : torch::kCPU; }
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) throw ddp::UsageError(f + " needs a value");
      return std::string(argv[++i]);
    };
    if (f == "--model")
      a.model = value();
    else if (f == "--out")
      a.out = value();
    else if (f == "--load")
      a.load = value();
    else if (f == "--save-start")
      a.save_start = value();
    else if (f == "--steps")
      a.steps = std::stoi(value());
    else if (f == "--single")
      a.single = true;
    else if (f == "--cuda")
      a.cuda = true;
    else
      throw ddp::UsageError("user_program: unknown flag " + f);
  }
  return a;
}

void save(const std::string& path, torch::nn::Module& module) {
  std::vector<torch::Tensor> keep;
  std::vector<ddp::TensorRef> refs;
  for (const auto& p : module.named_parameters()) {
    keep.push_back(p.value().detach().cpu().to(torch::kFloat32).contiguous());
    const torch::Tensor& t = keep.back();
    refs.push_back({p.key(), "F32", std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                    t.data_ptr(), static_cast<size_t>(t.numel()) * sizeof(float)});
  }
  ddp::write_safetensors(path, refs);
}

constexpr int64_t kGlobalBatch = 12;

// The training loop every mode shares: `forward` is the user's line for it.
template <typename Forward>
void train(torch::nn::Module& module, const Args& args, int rank, int ranks, Forward forward) {
  torch::manual_seed(1234);  // the data: the same on every rank
  const torch::Tensor x = torch::randn({kGlobalBatch * args.steps, 6}).to(args.device());
  const torch::Tensor y = torch::randn({kGlobalBatch * args.steps, 3}).to(args.device());
  torch::optim::SGD optimizer(module.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  if (!args.load.empty()) {
    torch::serialize::InputArchive archive;
    archive.load_from(args.load, args.device());
    module.load(archive);  // what torch::load(holder, file) does to the module
  }
  const int64_t share = kGlobalBatch / ranks;
  for (int step = 0; step < args.steps; ++step) {
    const int64_t first = step * kGlobalBatch + rank * share;
    optimizer.zero_grad();
    torch::Tensor loss =
        torch::mse_loss(forward(x.narrow(0, first, share)), y.narrow(0, first, share));
    loss.backward();
    optimizer.step();
  }
  if (rank == 0 && !args.out.empty()) save(args.out, module);
}

template <typename Model>
void run(Model& net, const Args& args, ddp::World* world, torch::nn::Module& module) {
  const int rank = world ? world->rank() : 0, ranks = world ? world->size() : 1;
  if (!world)
    return train(module, args, rank, ranks, [&](torch::Tensor x) { return net->forward(x); });
  ddp::DistributedDataParallel model(net, *world);
  train(module, args, rank, ranks, [&](torch::Tensor x) { return model.forward(x); });
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  if (!args.save_start.empty()) {
    torch::manual_seed(99);
    Net other;
    torch::save(other, args.save_start);
    return 0;
  }
  std::unique_ptr<ddp::World> world;
  if (!args.single) {
    ddp::InitOptions init;
    init.bind_gpu = args.cuda;  // CUDA tensors: the rank's GPU and NCCL
    world = std::make_unique<ddp::World>(ddp::init(init));
  }
  torch::manual_seed(7 + (world ? world->rank() : 0));  // the wrapper makes them rank 0's
  if (args.model == "stack") {
    NetImpl model;  // as pytorch/examples' cpp/mnist: `Net model;`
    model.to(args.device());
    if (!world) {
      train(model, args, 0, 1, [&](torch::Tensor x) { return model.forward(x); });
    } else {
      ddp::DistributedDataParallel ddp_model(model, *world);
      train(model, args, world->rank(), world->size(),
            [&](torch::Tensor x) { return model.forward(x); });
    }
  } else if (args.model == "holder") {
    Net net;
    net->to(args.device());
    run(net, args, world.get(), *net);
  } else if (args.model == "shared") {
    auto net = std::make_shared<NetImpl>();
    net->to(args.device());
    run(net, args, world.get(), *net);
  } else if (args.model == "sequential") {
    torch::nn::Sequential seq = make_sequential();
    seq->to(args.device());
    run(seq, args, world.get(), *seq);
  } else {
    throw ddp::UsageError("user_program: --model stack, holder, shared or sequential");
  }
  std::printf("rank %d trained\n", world ? world->rank() : 0);
  return 0;
}
