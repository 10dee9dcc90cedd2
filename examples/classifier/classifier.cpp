// An 8-32-3 classifier trained data-parallel in the fewest lines: ddp::init joins the job,
// ddp::Reducer averages the gradients. Run: ddprun --nproc-per-node 2 -- ./classifier
#include <cmath>
#include <cstdio>

#include <ddp/ddp.h>
#include <ddp/models.h>

int main() {
  ddp::World world = ddp::init();
  const int batch = 48 / world.size();  // this rank's share of a global batch of 48
  const ddp::MlpShape shape({8, 32, 3});
  ddp::CpuMlp model(shape, batch);
  ddp::init_params(shape, /*seed=*/1, model.params());
  ddp::Reducer ddp(world.comm(), ddp::param_spans(shape));
  ddp.check_same_layout({{"hidden", shape.layer(0).count()}, {"out", shape.layer(1).count()}});
  ddp.broadcast_parameters(model.params(), shape.param_count());
  std::vector<float> x(batch * 8);
  std::vector<int32_t> y(batch);
  for (int step = 0; step < 100; ++step) {
    for (int i = 0; i < batch * 8; ++i)  // sample i / 8 of the rank's share: 8 features
      x[i] = std::sin(0.7f * (step * 48 + world.rank() * batch + i / 8) + i % 8);
    for (int i = 0; i < batch; ++i)  // and its class
      y[i] = (x[i * 8] + x[i * 8 + 1] > 0) + (x[i * 8 + 2] > 0.5f);
    model.forward(x.data(), batch);
    ddp.begin_backward(model.grads());
    model.backward(y.data(), batch, 1.0f / batch, false, [&](int l) { ddp.layer_done(l); });
    ddp.end_backward();
    ddp.finish(nullptr);
    for (size_t i = 0; i < shape.param_count(); ++i)
      model.params()[i] -= 0.5f * model.grads()[i];
  }
  std::printf("rank %d of %d: weights %.7f %.7f %.7f\n", world.rank(), world.size(),
              model.params()[0], model.params()[300], model.params()[370]);
}
