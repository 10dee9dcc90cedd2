// The training loop on the CPU: determinism, learning, weights in and out, bad shapes.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/zero.h"
#include "engine/loop/trainer.h"
#include "engine/runners/stage_runner.h"
#include "engine/setup/run_setup.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "runtime/process_env.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

TrainConfig synthetic_config() {
  TrainConfig config;
  config.layers = "12,16,4";
  config.data = DataSource::kSynthetic;
  config.synthetic_samples = 400;
  config.batch_size = 20;
  config.epochs = 3;
  config.lr = 0.1f;
  config.seed = 5;
  config.quiet = true;
  config.log_every = 1000;
  return config;
}

std::vector<float> train_weights(const TrainConfig& config) {
  const Dataset data = load_dataset(config);
  Trainer trainer(config, data);
  trainer.run();
  return {trainer.params(), trainer.params() + trainer.shape().param_count()};
}

TEST(Trainer, SameSeedGivesBitwiseSameWeights) {
  const TrainConfig config = synthetic_config();
  EXPECT_EQ(train_weights(config), train_weights(config));
  TrainConfig other = config;
  other.seed = 6;
  EXPECT_NE(train_weights(config), train_weights(other));
}

TEST(Trainer, AdamWIsDeterministicToo) {
  TrainConfig config = synthetic_config();
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.lr = 0.01f;
  EXPECT_EQ(train_weights(config), train_weights(config));
}

TEST(Trainer, LearnsSeparableClusters) {
  const TrainConfig config = synthetic_config();
  const Dataset data = load_dataset(config);
  Trainer trainer(config, data);
  const double before = trainer.evaluate(data.test).accuracy;
  const TrainResult result = trainer.run();
  EXPECT_EQ(result.steps, 3 * 400 / 20);
  EXPECT_GT(result.test.accuracy, 0.95);
  EXPECT_GT(result.test.accuracy, before);
}

TEST(Trainer, StepsOverrideEpochs) {
  TrainConfig config = synthetic_config();
  config.steps = 7;
  const Dataset data = load_dataset(config);
  Trainer trainer(config, data);
  EXPECT_EQ(trainer.total_steps(), 7);
}

TEST(Trainer, SavedWeightsRestartTheSameModel) {
  TempDir dir;
  TrainConfig config = synthetic_config();
  config.save_weights = dir.file("w.safetensors");
  const std::vector<float> trained = train_weights(config);
  TrainConfig evaluate = synthetic_config();
  evaluate.init_weights = config.save_weights;
  const Dataset data = load_dataset(evaluate);
  Trainer trainer(evaluate, data);
  EXPECT_EQ(std::vector<float>(trainer.params(), trainer.params() + trained.size()), trained);
}

TEST(Trainer, LayersThatDoNotFitTheDataAreRefused) {
  TrainConfig config = synthetic_config();
  const Dataset data = load_dataset(config);  // 12 features, 4 classes
  config.layers = "13,16,4";
  try {
    Trainer trainer(config, data);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("first width is 13"), std::string::npos) << e.what();
  }
  config.layers = "12,16,3";
  EXPECT_THROW(Trainer(config, data), UsageError);
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// Buckets over any model's layers (spans of one flat buffer), last layers first.
TEST(PlanBuckets, AnyModelsLayersLastFirstNeverSplit) {
  const std::vector<ParamSpan> layers = {{0, 100}, {100, 50}, {150, 10}, {160, 300}};
  const std::vector<Bucket> buckets = plan_buckets(layers, 60 * 4, 250 * 4);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].first_layer, 3);  // 300 elements >= 250: alone
  EXPECT_EQ(buckets[0].offset, 160u);
  EXPECT_EQ(buckets[0].count, 300u);
  EXPECT_EQ(buckets[1].first_layer, 1);  // layers 2 and 1 together reach 60 elements
  EXPECT_EQ(buckets[1].last_layer, 2);
  EXPECT_EQ(buckets[1].offset, 100u);
  EXPECT_EQ(buckets[1].count, 60u);
  EXPECT_EQ(buckets[2].first_layer, 0);
  EXPECT_EQ(buckets[2].count, 100u);
  // The MLP's spans, the last layer first; together the buckets cover every parameter.
  const MlpShape shape = parse_layers("12,32,16,4");
  const std::vector<Bucket> mlp = plan_buckets(param_spans(shape), 2000, 500);
  ASSERT_FALSE(mlp.empty());
  EXPECT_EQ(mlp.front().last_layer, shape.num_layers() - 1);
  size_t covered = 0;
  for (const Bucket& bucket : mlp)
    covered += bucket.count;
  EXPECT_EQ(covered, shape.param_count());
  // Layers that do not tile the buffer in order are refused.
  EXPECT_THROW(plan_buckets({{0, 10}, {20, 5}}, 100, 100), Error);
}

// A stage's buckets are planned once (stage_bucket_plan): the flags' sizes, or --zero 3's bucket
// a layer (its gathers take a layer at a time); the Reducer made from the plan reduces those very
// buckets, and a runner's gradient ring is cut from the same value.
TEST(StageBucketPlan, TheFlagsSizesOrALayerABucketAndTheDdpTakesThemAsTheyAre) {
  TrainConfig config = synthetic_config();
  config.layers = "12,32,32,16,4";
  config.bucket_mb = 1200 * 4 / 1048576.0;  // about 1200 elements a bucket
  config.first_bucket_mb = 0;
  const RankStages stages{{whole_model_spec(config, 1)}};
  const BucketPlan plan = stage_bucket_plan(stages, sync_options(config));
  std::vector<ParamSpan> spans;
  for (const auto& [offset, count] : stages.layer_spans())
    spans.push_back({offset, count});
  const std::vector<Bucket> asked = plan_buckets(spans, 1200 * 4, 0);
  ASSERT_EQ(plan.buckets.size(), asked.size());
  ASSERT_LT(plan.buckets.size(), spans.size());  // some bucket holds two layers
  for (size_t b = 0; b < asked.size(); ++b)
    EXPECT_EQ(plan.buckets[b].offset, asked[b].offset) << b;
  EXPECT_EQ(plan.layer_count, static_cast<int>(spans.size()));
  config.zero = 3;
  const BucketPlan layered = stage_bucket_plan(stages, sync_options(config));
  ASSERT_EQ(layered.buckets.size(), spans.size());
  for (size_t b = 0; b < spans.size(); ++b)
    EXPECT_EQ(layered.buckets[b].first_layer, layered.buckets[b].last_layer) << b;
  ProcessEnv env;
  CommConfig comm_config;
  std::unique_ptr<Communicator> comm = make_communicator(comm_config, env, nullptr);
  const Reducer ddp(*comm, layered);
  ASSERT_EQ(ddp.buckets().size(), layered.buckets.size());
  for (size_t b = 0; b < layered.buckets.size(); ++b)
    EXPECT_EQ(ddp.buckets()[b].offset, layered.buckets[b].offset) << b;
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// Reducer's misuse as a library user meets it: a UsageError that says what to call, not a crash
// inside the backend. One process (a communicator of one rank).
TEST(DdpMisuse, HooksOutOfOrderOrOutOfRangeSayWhatToCall) {
  ProcessEnv env;
  CommConfig config;
  config.backend = Backend::kAuto;
  std::unique_ptr<Communicator> comm = make_communicator(config, env, nullptr);
  std::vector<float> grads(12, 1.0f);
  Reducer ddp(*comm, {{0, 8}, {8, 4}}, DdpOptions{});
  const auto message = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              ddp.layer_done(1);
            }).find("Reducer::layer_done(1) before begin_backward: call begin_backward(grads)"),
            std::string::npos);
  EXPECT_NE(
      message([&] { ddp.end_backward(); }).find("Reducer::end_backward before begin_backward"),
      std::string::npos);
  ddp.begin_backward(grads.data());
  EXPECT_NE(message([&] {
              ddp.layer_done(2);
            }).find("Reducer::layer_done(2): the model has layers 0 to 1 (as given to Reducer)"),
            std::string::npos);
  ddp.layer_done(1);
  ddp.layer_done(0);
  ddp.end_backward();
  ddp.finish(nullptr);
  EXPECT_NE(message([&] { ddp.end_backward(); }).find("before begin_backward"), std::string::npos);
  EXPECT_NE(message([] {
              ProcessEnv e;
              CommConfig c;
              std::unique_ptr<Communicator> one = make_communicator(c, e, nullptr);
              DdpOptions bad;
              bad.bucket_mb = 0;
              Reducer d(*one, {{0, 4}}, bad);
            }).find("DdpOptions: bucket_mb 0"),
            std::string::npos);
}

// Buckets over layers of several dtypes (LibTorch modules with bf16, float16 or float64
// parameters): each bucket holds one kind, each kind starts with a first bucket of its own, and
// the buckets are reduced in the order a backward from the last layer completes them; the
// reducer's numbering makes each a contiguous run. With one kind: plan_buckets exactly.
TEST(PlanGroupedBuckets, OneKindABucketOrderedByWhenBackwardCompletesThem) {
  // Layers 0..5: float32 (4 bytes), bf16 (2 bytes), float32, bf16, float32, float64.
  const std::vector<size_t> counts = {100, 40, 30, 60, 10, 5};
  const std::vector<int> kinds = {0, 1, 0, 1, 0, 2};
  const std::vector<size_t> bytes = {4, 2, 4, 2, 4, 8};
  const GroupedBuckets plan = plan_grouped_buckets(counts, kinds, bytes, 200, 40);
  // Walking 5..0: float64 {5} (40 bytes: the first's limit) closes; float32 {4} 40 bytes closes;
  // bf16 {3} 120 bytes closes; float32 {2, 0} (120, 520 bytes) closes at layer 0; bf16 {1}
  // stays open until the end.
  std::vector<std::vector<size_t>> layers;
  for (const Bucket& b : plan.buckets) {
    layers.emplace_back();
    size_t count = 0;
    for (int j = b.first_layer; j <= b.last_layer; ++j) {
      layers.back().push_back(plan.order[static_cast<size_t>(j)]);
      count += counts[plan.order[static_cast<size_t>(j)]];
      EXPECT_EQ(kinds[plan.order[static_cast<size_t>(j)]],
                kinds[plan.order[static_cast<size_t>(b.first_layer)]]);
    }
    EXPECT_EQ(b.count, count);
  }
  EXPECT_EQ(layers, (std::vector<std::vector<size_t>>{{5}, {4}, {3}, {1}, {0, 2}}));
  // The buckets tile the reducer's layers from the top down; each is the next range of its
  // kind's buffer (the buffers numbered as the reducer's order meets the kinds: float32 {0, 2},
  // bf16 {1}, {3}, float32 {4}, float64 {5}).
  ASSERT_EQ(plan.buckets.back().first_layer, 0);
  for (size_t b = 0; b + 1 < plan.buckets.size(); ++b)
    EXPECT_EQ(plan.buckets[b].first_layer, plan.buckets[b + 1].last_layer + 1);
  EXPECT_EQ(plan.buffer_kinds, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(plan.buffer_sizes, (std::vector<size_t>{140, 100, 5}));
  std::vector<size_t> filled(plan.buffer_kinds.size(), 0);
  for (size_t b = plan.buckets.size(); b-- > 0;) {
    const Bucket& bucket = plan.buckets[b];
    EXPECT_EQ(plan.buffer_kinds[bucket.buffer],
              kinds[plan.order[static_cast<size_t>(bucket.first_layer)]]);
    EXPECT_EQ(bucket.offset, filled[bucket.buffer]) << b;
    filled[bucket.buffer] += bucket.count;
  }
  EXPECT_EQ(filled, plan.buffer_sizes);
  // One kind: plan_buckets' buckets over the layers in their own order.
  const std::vector<size_t> same = {100, 50, 10, 300};
  const GroupedBuckets one =
      plan_grouped_buckets(same, {0, 0, 0, 0}, {4, 4, 4, 4}, 60 * 4, 250 * 4);
  EXPECT_EQ(one.order, (std::vector<size_t>{0, 1, 2, 3}));
  const std::vector<Bucket> cut =
      plan_buckets({{0, 100}, {100, 50}, {150, 10}, {160, 300}}, 60 * 4, 250 * 4);
  ASSERT_EQ(one.buckets.size(), cut.size());
  for (size_t b = 0; b < cut.size(); ++b) {
    EXPECT_EQ(one.buckets[b].offset, cut[b].offset);
    EXPECT_EQ(one.buckets[b].count, cut[b].count);
    EXPECT_EQ(one.buckets[b].first_layer, cut[b].first_layer);
    EXPECT_EQ(one.buckets[b].last_layer, cut[b].last_layer);
  }
  // An arrival order recorded by a first step (layers 1 and 3 first): the buckets follow it.
  const GroupedBuckets rebuilt =
      plan_grouped_buckets({10, 10, 10, 10}, {0, 0, 0, 0}, {4, 4, 4, 4}, 80, 80, {1, 3, 0, 2});
  EXPECT_EQ(rebuilt.order, (std::vector<size_t>{0, 2, 1, 3}));
  ASSERT_EQ(rebuilt.buckets.size(), 2u);
  EXPECT_EQ(rebuilt.buckets[0].first_layer, 2);  // the reducer's layers 2, 3: layers 1 and 3
  EXPECT_THROW(plan_grouped_buckets({1, 1}, {0, 0}, {4, 4}, 8, 8, {1, 1}), Error);
  EXPECT_THROW(plan_grouped_buckets({1, 1}, {0, 0}, {4, 4}, 8, 8, {1}), Error);
  // A Reducer over a plan of the caller's: one that leaves a layer out is refused.
  ProcessEnv env;
  CommConfig config;
  std::unique_ptr<Communicator> comm = make_communicator(config, env, nullptr);
  Reducer ddp(*comm, plan.buckets, 6, true);
  EXPECT_EQ(ddp.buckets().size(), 5u);
  EXPECT_THROW(Reducer(*comm, {{0, 10, 1, 2}}, 3, true), Error);
}

// Gradients in autograd's order (LibTorch's hooks): layer_ready takes layers in any order, and a
// bucket starts only once all of its layers are ready, the buckets in order (every rank issues
// the same sequence); a layer ready twice in a step is a UsageError naming it.
TEST(DdpLayerReady, AnyOrderStartsEachBucketWhenItsLayersAreAllReady) {
  ProcessEnv env;
  CommConfig config;
  std::unique_ptr<Communicator> comm = make_communicator(config, env, nullptr);
  // Four layers of 4 elements (16 bytes each), buckets of 32 bytes: {3, 2} then {1, 0}.
  Reducer ddp(*comm, {{0, 4}, {4, 4}, {8, 4}, {12, 4}}, 32, 32, true);
  ASSERT_EQ(ddp.buckets().size(), 2u);
  ASSERT_EQ(ddp.buckets()[0].first_layer, 2);
  std::vector<float> grads(16, 1.0f);
  ddp.record_events(true);
  ddp.begin_backward(grads.data());
  ddp.layer_ready(1);  // the second bucket's, first: nothing may start yet
  ddp.layer_ready(3);
  EXPECT_EQ(ddp.issued(), 0u);
  ddp.layer_ready(0);  // the second bucket is complete, but the first is not
  EXPECT_EQ(ddp.issued(), 0u);
  try {
    ddp.layer_ready(3);
    ADD_FAILURE() << "a layer ready twice was taken";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 3 was already ready in this step"),
              std::string::npos)
        << e.what();
  }
  ddp.layer_ready(2);  // both, in order
  EXPECT_EQ(ddp.issued(), 2u);
  ddp.end_backward();
  ddp.finish(nullptr);
  std::vector<std::string> issued;
  for (const DdpEvent& e : ddp.events())
    if (e.what == "allreduce_issued") issued.push_back(std::to_string(e.bucket));
  EXPECT_EQ(issued, (std::vector<std::string>{"0", "1"}));
  // The next step starts afresh.
  ddp.begin_backward(grads.data());
  for (const int layer : {0, 1, 2, 3})
    ddp.layer_ready(layer);
  EXPECT_EQ(ddp.issued(), 2u);
  ddp.end_backward();
  ddp.finish(nullptr);
}

// A bucket reduction of one's own in place of the averaging all-reduce (as c10d's
// communication hooks): Reducer starts it for each bucket as backward completes it, in order, waits
// for its Work in finish(), and names it in its record; null gives the all-reduce back. A
// reduction that keeps the gradients itself lets backward pass no flat buffer.
TEST(DdpBucketReduction, RunsInPlaceOfTheAllReduceForEachBucketInOrder) {
  ProcessEnv env;
  CommConfig config;
  std::unique_ptr<Communicator> comm = make_communicator(config, env, nullptr);
  // Three layers of 4, 2 and 3 elements, a bucket each (last layers first).
  Reducer ddp(*comm, {{0, 4}, {4, 2}, {6, 3}}, 1, 1, true);
  ASSERT_EQ(ddp.buckets().size(), 3u);
  struct Doubling final : BucketReduction {
    Communicator& comm;
    const Reducer& ddp;
    std::vector<size_t> asked;
    bool keeps = false;
    Doubling(Communicator& c, const Reducer& d) : comm(c), ddp(d) {}
    std::unique_ptr<Work> reduce(size_t bucket, const GradMemory& memory) override {
      asked.push_back(bucket);
      float* grads = static_cast<float*>(memory.data);
      const Bucket& b = ddp.buckets()[bucket];
      for (size_t i = 0; i < b.count; ++i)
        grads[b.offset + i] *= 2;
      return comm.all_reduce_async(grads + b.offset, b.count, DataType::kFloat32,
                                   ReduceOp::kAverage);
    }
    const char* issued_event() const override { return "doubled_issued"; }
    bool keeps_gradients() const override { return keeps; }
  } doubling(*comm, ddp);
  std::vector<float> grads(9, 1.0f);
  const auto step = [&] {
    ddp.record_events(true);
    ddp.begin_backward(grads.data());
    for (int layer = 2; layer >= 0; --layer)
      ddp.layer_done(layer);
    ddp.end_backward();
    ddp.finish(nullptr);
  };
  ddp.set_reduction(&doubling);
  step();
  EXPECT_EQ(doubling.asked, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(grads, std::vector<float>(9, 2.0f));  // each bucket once, through the hook
  int issued = 0;
  for (const DdpEvent& e : ddp.events()) {
    EXPECT_NE(e.what, "allreduce_issued");
    issued += e.what == "doubled_issued";
  }
  EXPECT_EQ(issued, 3);
  ddp.set_reduction(nullptr);  // the averaging all-reduce again: one rank leaves them be
  step();
  EXPECT_EQ(doubling.asked.size(), 3u);
  EXPECT_EQ(grads, std::vector<float>(9, 2.0f));
  EXPECT_THROW(ddp.begin_backward(nullptr), UsageError);
  doubling.keeps = true;
  ddp.set_reduction(&doubling);
  EXPECT_NO_THROW(ddp.begin_backward(nullptr));
}

// Gradients of several element types (a LibTorch model's float32, bfloat16 and float64
// parameters): a buffer a type, each bucket a range of its type's buffer, reduced in its own
// type; a hook sees each bucket's memory, type and place.
TEST(DdpTypedBuffers, EachBucketIsReducedInItsBuffersTypeWhereItLies) {
  ProcessEnv env;
  CommConfig config;
  std::unique_ptr<Communicator> comm = make_communicator(config, env, nullptr);
  // Layers 0..4: float32, bf16, float32, float64, bf16, a bucket each.
  const std::vector<size_t> counts = {6, 4, 3, 2, 5};
  const std::vector<int> kinds = {
      static_cast<int>(DataType::kFloat32), static_cast<int>(DataType::kBFloat16),
      static_cast<int>(DataType::kFloat32), static_cast<int>(DataType::kFloat64),
      static_cast<int>(DataType::kBFloat16)};
  const GroupedBuckets plan = plan_grouped_buckets(counts, kinds, {4, 2, 4, 8, 2}, 1, 1);
  ASSERT_EQ(plan.buckets.size(), 5u);
  std::vector<float> f32(plan.buffer_sizes[0], 1.0f);
  std::vector<uint16_t> bf16(plan.buffer_sizes[1], 0x3f80);
  std::vector<double> f64(plan.buffer_sizes[2], 1.0);
  std::vector<GradMemory> memory = {{f32.data(), DataType::kFloat32},
                                    {bf16.data(), DataType::kBFloat16},
                                    {f64.data(), DataType::kFloat64}};
  ASSERT_EQ(plan.buffer_kinds, (std::vector<int>{kinds[0], kinds[1], kinds[3]}));
  Reducer ddp(*comm, plan.buckets, 5, true);
  const auto step = [&] {
    ddp.begin_backward(memory);
    for (int layer = 4; layer >= 0; --layer)
      ddp.layer_ready(layer);
    ddp.end_backward();
    ddp.finish(nullptr);
  };
  step();  // the averaging all-reduce in each type: one rank leaves them be
  EXPECT_EQ(f64, std::vector<double>(f64.size(), 1.0));
  EXPECT_EQ(bf16, std::vector<uint16_t>(bf16.size(), 0x3f80));
  std::vector<GradBucket> seen;
  ddp.register_comm_hook([&seen](Communicator&, const GradBucket& bucket) {
    seen.push_back(bucket);
    return std::unique_ptr<Work>();
  });
  step();
  ASSERT_EQ(seen.size(), 5u);
  for (size_t b = 0; b < seen.size(); ++b) {
    const Bucket& planned = plan.buckets[b];
    const GradMemory& buffer = memory[planned.buffer];
    EXPECT_EQ(seen[b].index, b);
    EXPECT_EQ(seen[b].type, buffer.type) << b;
    EXPECT_EQ(seen[b].buffer, planned.buffer);
    EXPECT_EQ(seen[b].count, planned.count);
    EXPECT_EQ(seen[b].data,
              static_cast<char*>(buffer.data) + planned.offset * dtype_bytes(buffer.type))
        << b;
  }
  EXPECT_EQ(ddp.grads(), nullptr);                      // no single float32 buffer
  EXPECT_THROW(ddp.begin_backward(f32.data()), Error);  // one buffer for buckets over three
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// ZeRO's pieces: every rank's pieces of a bucket tile it in order (the last ones short or
// empty where the bucket is not a multiple), each rank owns about 1/D, pieces are multiples of
// the alignment, and a bucket that divides evenly by D (alignment 1) needs no padding.
TEST(ShardPlan, PiecesTileEveryBucketAndOwnAboutAShare) {
  const std::vector<Bucket> buckets = {{100, 12, 2, 2}, {0, 100, 0, 1}};  // last layers first
  for (const int ranks : {1, 2, 3, 4})
    for (const size_t align : {size_t{1}, size_t{16}}) {
      size_t owned = 0;
      for (int r = 0; r < ranks; ++r) {
        const ShardPlan plan = plan_shards(buckets, ranks, r, align);
        ASSERT_EQ(plan.parts.size(), 2u);
        size_t at = 0;
        for (size_t b = 0; b < 2; ++b) {
          const ShardPart& p = plan.parts[b];
          EXPECT_EQ(p.piece % align, 0u);
          const size_t share = (buckets[b].count + ranks - 1) / ranks;
          EXPECT_EQ(p.piece, (share + align - 1) / align * align);  // the least that covers it
          EXPECT_EQ(p.offset, buckets[b].offset + std::min(buckets[b].count, p.piece * r));
          EXPECT_LE(p.count, p.piece);
          EXPECT_EQ(p.shard_at, at);
          at += p.piece;
          owned += p.count;
        }
        EXPECT_EQ(plan.shard_count, at);
      }
      EXPECT_EQ(owned, 112u) << ranks << " ranks, alignment " << align;
    }
  EXPECT_EQ(plan_shards(buckets, 4, 1, 1).parts[1].piece, 25u);   // 100 = 4 x 25: in place
  EXPECT_EQ(plan_shards(buckets, 3, 1, 1).parts[1].piece, 34u);   // 3 x 34 > 100: padded
  EXPECT_EQ(plan_shards(buckets, 4, 1, 16).parts[1].piece, 32u);  // aligned
}

// Whole layers to owners (LibTorch's partitioner: the user's optimizer steps whole tensors):
// each bucket's layers split about evenly, the largest first, to the rank holding the least of
// the bucket (ties: of the model); a rank's layers in a bucket are its runs there, packed into
// its piece, which is the largest rank's share; every element of a bucket is in exactly one
// rank's runs; equal shares that fall at piece x rank stay one copy of the bucket (strided),
// as ddptrain's equal pieces are; a bucket too uneven for equal pieces is `whole`.
TEST(ShardPlan, WholeLayersGoToOwnersAndEachRanksLayersArePackedIntoItsPiece) {
  // Layers 0-4 of 10, 30, 20, 20, 20 elements; bucket 0 (reduced first) holds layers 3-4,
  // bucket 1 layers 0-2, each from its offset in ascending layer order.
  const std::vector<size_t> counts = {10, 30, 20, 20, 20};
  const std::vector<Bucket> buckets = {{60, 40, 3, 4}, {0, 60, 0, 2}};
  const std::vector<int> owners = balanced_owners(buckets, counts, 2);
  // Bucket 0: 20 each; bucket 1: layer 1 (30) to rank 0, then layers 2 and 0 to rank 1.
  EXPECT_EQ(owners, (std::vector<int>{1, 0, 1, 0, 1}));
  const ShardPlan plan = plan_owned_shards(buckets, counts, owners, 2, 1);
  ASSERT_EQ(plan.parts.size(), 2u);
  const ShardPart& second = plan.parts[0];  // layers 3 (rank 0) and 4 (rank 1): 20 each
  EXPECT_EQ(second.piece, 20u);
  EXPECT_TRUE(second.strided());
  EXPECT_TRUE(second.in_place());
  EXPECT_FALSE(second.whole);
  EXPECT_EQ(second.offset, 80u);
  EXPECT_EQ(second.count, 20u);
  const ShardPart& first = plan.parts[1];  // layer 1 (rank 0: 30), layers 0 and 2 (rank 1: 30)
  EXPECT_EQ(first.piece, 30u);
  EXPECT_FALSE(first.strided());  // rank 1's two runs, packed
  EXPECT_FALSE(first.whole);
  ASSERT_EQ(first.runs[0].size(), 1u);
  EXPECT_EQ(first.runs[0][0].offset, 10u);
  EXPECT_EQ(first.runs[0][0].count, 30u);
  ASSERT_EQ(first.runs[1].size(), 2u);
  EXPECT_EQ(first.runs[1][0].offset, 0u);
  EXPECT_EQ(first.runs[1][0].at, 0u);
  EXPECT_EQ(first.runs[1][1].offset, 40u);
  EXPECT_EQ(first.runs[1][1].at, 10u);
  EXPECT_EQ(first.count, 30u);
  EXPECT_EQ(first.shard_at, 20u);
  EXPECT_EQ(plan.shard_count, 50u);
  EXPECT_EQ(plan.owned(), 50u);
  // Buckets of one layer each (large layers, as an MLP's weights) take turns, so that the
  // ranks' shares of the model stay even; each such bucket is whole (all-reduced, broadcast).
  const std::vector<Bucket> single = {{40, 8, 3, 3}, {24, 16, 2, 2}, {8, 16, 1, 1}, {0, 8, 0, 0}};
  EXPECT_EQ(balanced_owners(single, {8, 16, 16, 8}, 2), (std::vector<int>{1, 0, 1, 0}));
  const ShardPlan turns = plan_owned_shards(single, {8, 16, 16, 8}, {1, 0, 1, 0}, 2, 0);
  for (const ShardPart& p : turns.parts)
    EXPECT_TRUE(p.whole);
  EXPECT_EQ(turns.owned(), 24u);
  // A whole bucket's space in the rank's shard is its own runs only (rank 0 owns layers 3 and
  // 1, 24 elements): its owners send them from the whole buffer, nobody gathers into a piece,
  // so the shard is this rank's share of the model, not every bucket's largest share.
  EXPECT_EQ(turns.shard_count, 24u);
  EXPECT_EQ(turns.parts[0].shard_at, 0u);  // layer 3's 8, then layer 1's 16
  EXPECT_EQ(turns.parts[2].shard_at, 8u);
  EXPECT_EQ(turns.parts[3].shard_at, 24u);  // nothing of layer 0
  EXPECT_EQ(plan_owned_shards(single, {8, 16, 16, 8}, {1, 0, 1, 0}, 2, 1, 64).shard_count, 128u);
  // Every element of a bucket in exactly one rank's runs.
  size_t covered = 0;
  for (const auto& runs : first.runs)
    for (const ShardRun& run : runs)
      covered += run.count;
  EXPECT_EQ(covered, 60u);
  // Aligned pieces, and an owner out of range named.
  EXPECT_EQ(plan_owned_shards(buckets, counts, owners, 2, 0, 64).parts[1].piece, 64u);
  EXPECT_THROW(plan_owned_shards(buckets, counts, {0, 0, 2, 0, 1}, 2, 0), Error);
}

}  // namespace
}  // namespace ddp
