// A user's own model trained data-parallel with ddp::Reducer: a two-layer network written here
// (not ddp's MLP): y = W2 tanh(W1 x + b1) + b2, fitted to a fixed target function by SGD on
// the CPU. Its parameters live in one flat buffer; Reducer gets the layers as spans of it,
// averages the gradients in buckets during backward, and every rank ends with the weights
// one process would have. Run: ddprun --nproc-per-node 2 -- ./own_model
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <ddp/ddp.h>

namespace {

constexpr int kIn = 4, kHidden = 16, kOut = 1;
constexpr int kGlobalBatch = 64, kSteps = 200;

// Offsets of the flat buffer: layer 1 (W1 [hidden, in], b1), then layer 2 (W2 [out, hidden], b2).
constexpr size_t kW1 = 0, kB1 = kW1 + kHidden * kIn, kW2 = kB1 + kHidden,
                 kB2 = kW2 + kOut * kHidden, kCount = kB2 + kOut;

float target(const float* x) {
  return std::sin(x[0]) + 0.5f * x[1] * x[2] - 0.25f * x[3];
}

// Sample i of the endless data set, the same on every rank.
void sample(int64_t i, float* x) {
  std::mt19937 rng(static_cast<uint32_t>(i));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int k = 0; k < kIn; ++k)
    x[k] = u(rng);
}

}  // namespace

int main() {
  ddp::World world = ddp::init();  // gloo under ddprun, mpi under mpirun, one process alone
  ddp::Communicator& comm = world.comm();
  const int ranks = comm.size(), rank = comm.rank();
  const int local = kGlobalBatch / ranks;
  std::vector<float> params(kCount), grads(kCount);
  std::mt19937 init(7);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (float& p : params)
    p = normal(init);
  ddp::Reducer ddp(comm, {{kW1, kW2 - kW1}, {kW2, kCount - kW2}}, 1 << 20, 64,
                   /*overlap=*/true);
  ddp.check_same_layout(kCount, "own_model 4-16-1");
  ddp.broadcast_parameters(params.data(), kCount);

  std::vector<float> x(kIn), h(kHidden);
  double loss = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    ddp.begin_backward(grads.data());
    loss = 0;
    std::vector<float> dh(kHidden);
    for (int s = 0; s < local; ++s) {  // this rank's contiguous share of the global batch
      sample(int64_t{step} * kGlobalBatch + rank * local + s, x.data());
      float y = params[kB2];
      for (int j = 0; j < kHidden; ++j) {
        float z = params[kB1 + j];
        for (int k = 0; k < kIn; ++k)
          z += params[kW1 + j * kIn + k] * x[k];
        h[j] = std::tanh(z);
        y += params[kW2 + j] * h[j];
      }
      const float err = y - target(x.data());
      loss += 0.5 * err * err;
      const float g = err / static_cast<float>(local);  // mean over this rank's samples
      grads[kB2] += g;
      for (int j = 0; j < kHidden; ++j) {
        grads[kW2 + j] += g * h[j];
        dh[j] = g * params[kW2 + j] * (1 - h[j] * h[j]);
        grads[kB1 + j] += dh[j];
        for (int k = 0; k < kIn; ++k)
          grads[kW1 + j * kIn + k] += dh[j] * x[k];
      }
    }
    // Backward is done layer by layer (last first): Reducer starts each bucket's average.
    ddp.layer_done(1);
    ddp.layer_done(0);
    ddp.end_backward();
    ddp.finish(nullptr);
    for (size_t i = 0; i < kCount; ++i)
      params[i] -= 0.1f * grads[i];
  }
  double sums[2] = {loss, static_cast<double>(local)};
  comm.all_reduce(sums, 2, ddp::ReduceOp::kSum);
  const uint32_t checksum = ddp::params_checksum(params.data(), kCount);
  std::printf("rank %d of %d: final loss %.5f, weights checksum %08x\n", rank, ranks,
              sums[0] / sums[1], checksum);
  return 0;
}
