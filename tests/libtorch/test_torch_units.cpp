// The LibTorch component's parts in one process (label unit), over a MirrorCommunicator where
// they reduce over ranks; ddp::checkpoint's recompute against the same blocks without it; ZeRO's
// flat parameters with mixed dtypes, PowerSGD's orthogonalisation and error feedback,
// SyncBatchNorm's count of values a channel for inputs of 3 to 5 dimensions. Each pins a fault the
// multi-process suite let through (issue 77's mutants b, d, e, f).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "dist/buckets.h"
#include "dist/ddp.h"
#include "runtime/error.h"
#include "tests/support/mirror_communicator.h"
#include "torch/autocast.h"
#include "torch/checkpoint.h"
#include "torch/comm_hooks.h"
#include "torch/shard_unit.h"
#include "torch/sync_batch_norm.h"
#include "torch/torch_params.h"

namespace ddp {
namespace {

// ZeRO's parameter store for LibTorch modules: parameters of several dtypes (a bfloat16 one
// before float32, float64 and float16 ones) become views into their dtype's flat buffer, each
// at its gradient's slot (the reducer's layout), keeping their values; under level 3 a rank's
// own parameters view its pieces between steps and come back into the flat buffers at gather.
TEST(TorchParams, MixedDtypesBecomeViewsOfTheirDtypesBufferAtTheirGradientsSlots) {
  torch::manual_seed(3);
  for (const int level : {1, 3}) {
    std::vector<torch::Tensor> params = {torch::randn({3}).to(torch::kBFloat16), torch::randn({5}),
                                         torch::randn({2}).to(torch::kDouble),
                                         torch::randn({1}).to(torch::kHalf), torch::randn({3})};
    std::vector<torch::Tensor> before;
    std::vector<size_t> counts, element_bytes;
    std::vector<int> kinds;
    for (const torch::Tensor& p : params) {
      before.push_back(p.clone());
      counts.push_back(static_cast<size_t>(p.numel()));
      kinds.push_back(static_cast<int>(p.scalar_type()));
      element_bytes.push_back(p.element_size());
    }
    const GroupedBuckets plan = plan_grouped_buckets(counts, kinds, element_bytes, 1 << 20, 8);
    std::vector<TorchParams::Slot> slots(params.size());
    for (const Bucket& b : plan.buckets) {
      int64_t offset = static_cast<int64_t>(b.offset);
      for (int layer = b.first_layer; layer <= b.last_layer; ++layer) {
        const size_t i = plan.order[static_cast<size_t>(layer)];
        slots[i] = {b.buffer, offset, params[i].sizes().vec()};
        offset += params[i].numel();
      }
    }
    std::vector<torch::ScalarType> dtypes;
    std::vector<int64_t> sizes;
    for (size_t k = 0; k < plan.buffer_kinds.size(); ++k) {
      dtypes.push_back(static_cast<torch::ScalarType>(plan.buffer_kinds[k]));
      sizes.push_back(static_cast<int64_t>(plan.buffer_sizes[k]));
    }
    MirrorCommunicator comm(1);
    Reducer ddp(comm, plan.buckets, static_cast<int>(params.size()), true);
    int moves = 0;
    TorchParams store(
        params, slots, dtypes, sizes, ddp, plan.order, level, [&moves](size_t) { ++moves; },
        [] { return nullptr; });
    EXPECT_TRUE(store.current());  // one rank: every parameter is its own
    store.stale();
    store.gather();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(store.owns(i));
      EXPECT_TRUE(torch::equal(params[i], before[i])) << "level " << level << " tensor " << i;
      // The same storage as every other parameter of its dtype, at its gradient's slot.
      for (size_t j = 0; j < params.size(); ++j)
        if (slots[j].buffer == slots[i].buffer)
          EXPECT_TRUE(params[i].storage().is_alias_of(params[j].storage())) << i << " " << j;
      EXPECT_EQ(params[i].storage_offset(), slots[i].offset) << "tensor " << i;
    }
    EXPECT_GE(moves, static_cast<int>(params.size()));
  }
}

// PowerSGD's bucket of one matrix gradient (of `parameter`: the same tensor from step to step,
// or the hook makes the bucket's state afresh), reduced by `hook` over `comm`.
torch::Tensor powersgd_once(const TorchCommHook& hook, Communicator& comm,
                            const torch::Tensor& parameter, const torch::Tensor& gradient) {
  TorchGradBucket bucket;
  bucket.buffer = gradient.reshape(-1).clone();
  bucket.parameters = {parameter};
  bucket.gradients = {bucket.buffer.view(gradient.sizes())};
  hook(comm, bucket);
  return bucket.gradients[0].clone();
}

// A gradient of rank 2 at matrix_approximation_rank 2 is reproduced exactly: P spans its
// columns and is orthonormal, so P P^T projects. Gram-Schmidt that left the first column's
// projection in the second would leave P P^T no projection.
TEST(TorchPowerSgd, ARankTwoGradientIsExactAtRankTwo) {
  MirrorCommunicator comm(2);
  torch::manual_seed(5);
  const torch::Tensor g = torch::mm(torch::randn({7, 2}), torch::randn({2, 6}));
  auto state = std::make_shared<PowerSGDState>(
      PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(0).min_compression_rate(
          1));
  const torch::Tensor out = powersgd_once(powersgd_comm_hook(state), comm, torch::zeros_like(g), g);
  EXPECT_EQ(state->elements_after_compression(), (7 + 6) * 2) << "compressed";
  // float32 products of a 7 x 6 matrix: a few ulps of its largest entries.
  EXPECT_LT((out - g).abs().max().item<float>(), 1e-5 * g.abs().max().item<float>());
}

// Error feedback: what a step's rank-1 approximation leaves out is added to the next step's
// gradient, so over K steps of the same gradient the outputs sum to K times it less one
// bounded error, and their mean tends to the gradient itself. Without it every step sends the
// same rank-1 part and the mean stays a third of the gradient's norm away (singular values 2
// and 1: the part left out has norm 1 of sqrt(5)).
TEST(TorchPowerSgd, ErrorFeedbackMakesTheMeanOfTheStepsTheGradient) {
  MirrorCommunicator comm(2);
  const torch::Tensor u = torch::tensor({{1.0f, 0.0f}, {0.0f, 1.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}});
  const torch::Tensor v =
      torch::tensor({{0.0f, 2.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 1.0f, 0.0f}});
  const torch::Tensor g = torch::mm(u, v);  // singular values 2 and 1
  for (const bool feedback : {true, false}) {
    auto state = std::make_shared<PowerSGDState>(PowerSGDOptions()
                                                     .matrix_approximation_rank(1)
                                                     .start_powerSGD_iter(0)
                                                     .min_compression_rate(1)
                                                     .use_error_feedback(feedback));
    const TorchCommHook hook = powersgd_comm_hook(state);
    const torch::Tensor parameter = torch::zeros_like(g);
    torch::Tensor sum = torch::zeros_like(g);
    constexpr int kSteps = 60;
    for (int k = 0; k < kSteps; ++k)
      sum += powersgd_once(hook, comm, parameter, g);
    const double off = ((sum / kSteps - g).norm() / g.norm()).item<double>();
    if (feedback)
      EXPECT_LT(off, 0.1) << "the mean of the steps stays away from the gradient";
    else
      EXPECT_GT(off, 0.3) << "without error feedback, the mean is the rank-1 part";
  }
}

// SyncBatchNorm over ranks that all hold this input (the mirror) normalises as BatchNorm over
// the input repeated: the same mean and variance, a count of N x the spatial values a channel
// (not N) for inputs of 3, 4 and 5 dimensions, and the running variance unbiased by that count.
TEST(TorchSyncBatchNorm, CountsEveryValueOfAChannelForImageShapedInputs) {
  MirrorCommunicator comm(2);
  torch::manual_seed(11);
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{4, 3, 5}, {2, 3, 4, 2}, {2, 3, 2, 2, 3}}) {
    const torch::Tensor x = torch::randn(shape) * 2 + 1;
    SyncBatchNorm sync(SyncBatchNormOptions(3));
    sync->set_communicator(&comm);
    torch::nn::BatchNorm1d plain(3);  // batch_norm itself takes any of these shapes
    const torch::Tensor ours = sync->forward(x);
    const torch::Tensor theirs =
        torch::batch_norm(torch::cat({x, x}), plain->weight, plain->bias, plain->running_mean,
                          plain->running_var, true, 0.1, 1e-5, false)
            .narrow(0, 0, shape[0]);
    // float64 sums against float32's batch_norm: float32 rounding of values near 1.
    EXPECT_LT((ours - theirs).abs().max().item<float>(), 1e-5) << x.dim() << "-D";
    EXPECT_LT((sync->running_var - plain->running_var).abs().max().item<float>(), 1e-5)
        << x.dim() << "-D";
    EXPECT_LT((sync->running_mean - plain->running_mean).abs().max().item<float>(), 1e-6)
        << x.dim() << "-D";
  }
}

// A block as users write one: linear, GELU, dropout, linear.
struct DropBlockImpl : torch::nn::Module {
  DropBlockImpl()
      : up(register_module("up", torch::nn::Linear(8, 16))),
        drop(register_module("drop", torch::nn::Dropout(0.3))),
        down(register_module("down", torch::nn::Linear(16, 8))) {}
  torch::Tensor forward(torch::Tensor x) { return down(drop(torch::gelu(up(x)))); }
  torch::nn::Linear up;
  torch::nn::Dropout drop;
  torch::nn::Linear down;
};
TORCH_MODULE(DropBlock);

// Every parameter's gradient and the input's, in order.
std::vector<torch::Tensor> gradients(const torch::nn::Module& net, const torch::Tensor& x) {
  std::vector<torch::Tensor> out{x.grad().clone()};
  for (const torch::Tensor& p : net.parameters())
    out.push_back(p.grad().clone());
  return out;
}

// Three blocks with dropout, the middle one checkpointed in each of ddp::checkpoint's forms
// (the module form, ddp::CheckpointWrapper, the general form with a second input that needs no
// gradient (ones, times which the output is itself), and a checkpoint nested in another), against
// the same blocks and seeds without it: the same loss and every gradient bitwise (the same kernels
// on the same values: the recompute draws the same dropout masks from the generator put back, and
// runs under the forward's autocast, here the CPU's bfloat16), for two steps whose gradients
// accumulate. Without the generator put back (preserve_rng_state(false)) the masks and gradients
// differ.
TEST(TorchCheckpoint, GradientsAreThoseWithoutItBitwiseWithDropoutAndAutocast) {
  for (const bool autocast : {false, true}) {
    for (const int form : {0, 1, 2, 3, 4}) {
      torch::manual_seed(5);
      torch::nn::Sequential plain{DropBlock(), DropBlock(), DropBlock()};
      torch::manual_seed(5);
      DropBlock first, middle, last;
      torch::nn::Sequential wrapped(first, CheckpointWrapper(middle), last);
      const torch::Tensor ones = torch::ones({8});  // no gradient: an input all the same
      const auto run = [&](const torch::Tensor& x, bool checkpointed) {
        if (!checkpointed) return plain->forward(x);
        if (form == 1) return wrapped->forward(x);
        torch::Tensor h = first->forward(x);
        if (form == 0) {
          h = checkpoint(middle, h);
        } else if (form == 4) {  // not preserved: expected to differ
          h = checkpoint(
              [&](const torch::autograd::variable_list& in) {
                return torch::autograd::variable_list{middle->forward(in[0])};
              },
              {h}, middle->parameters(), CheckpointOptions().preserve_rng_state(false))[0];
        } else {
          h = checkpoint(
              [&](const torch::autograd::variable_list& in) {
                torch::Tensor inner =
                    form == 3 ? checkpoint(middle, in[0]) : middle->forward(in[0]);
                return torch::autograd::variable_list{inner * in[1]};  // exact: times one
              },
              {h, ones}, middle->parameters())[0];
        }
        return last->forward(h);
      };
      std::vector<torch::Tensor> want, got;
      for (const bool checkpointed : {false, true}) {
        torch::manual_seed(9);
        const torch::Tensor x = torch::randn({6, 8}).requires_grad_();
        for (int step = 0; step < 2; ++step) {
          torch::Tensor loss;
          if (autocast) {
            Autocast on(torch::kCPU, torch::kBFloat16);
            loss = run(x, checkpointed).to(torch::kFloat32).pow(2).mean();
          } else {
            loss = run(x, checkpointed).pow(2).mean();
          }
          loss.backward();
        }
        (checkpointed ? got : want) = gradients(checkpointed ? *wrapped : *plain, x);
      }
      ASSERT_EQ(got.size(), want.size());
      bool same = true;
      for (size_t i = 0; i < got.size(); ++i)
        same = same && torch::equal(got[i], want[i]);
      EXPECT_EQ(same, form != 4) << "form " << form << (autocast ? ", autocast" : "");
    }
  }
}

// Where it cannot give a gradient it refuses by name: a parameter read by the function but not
// given, a tensor computed outside with a gradient read without being an input (both at the
// backward, which would lose their gradients), a ddp::CheckpointWrapper around a ddp::ShardUnit
// (the unit would not be found); under no_grad it is the function alone.
TEST(TorchCheckpoint, RefusesWhatWouldLoseAGradient) {
  torch::nn::Linear a(4, 4), b(4, 4);
  const torch::Tensor x = torch::randn({2, 4}, torch::requires_grad());
  const auto two = [&](const torch::autograd::variable_list& in) {
    return torch::autograd::variable_list{b(a(in[0]))};
  };
  torch::Tensor out = checkpoint(two, {x}, a->parameters())[0];
  try {
    out.sum().backward();
    ADD_FAILURE() << "a parameter not given was not refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("neither among its inputs nor its parameters"),
              std::string::npos)
        << e.what();
  }
  const torch::Tensor outside = a(x);
  out = checkpoint(
      [&](const torch::autograd::variable_list& in) {
        return torch::autograd::variable_list{b(in[0]) + outside};
      },
      {x}, b->parameters())[0];
  try {
    out.sum().backward();
    ADD_FAILURE() << "a tensor computed outside was not refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("computed outside it"), std::string::npos) << e.what();
  }
  EXPECT_THROW(CheckpointWrapper(ShardUnit(a)), UsageError);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(checkpoint(a, x), a(x)));
}

}  // namespace
}  // namespace ddp
