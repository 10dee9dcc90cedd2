// One sharded state over the three parameter stores (dist/param_store.h): the CPU MLP's flat
// vectors (HostParamStore), the GPU MLP's DeviceParameters (DeviceParamStore) and a LibTorch
// module's per-dtype tensors (TorchParams) each hold the same two layers (6 and 2 parameters:
// a Linear(3, 2)'s weight and bias), a bucket a layer, and are sharded at levels 1 to 3 over a
// group of one rank (whose pieces are the whole buckets); the same ShardedState then takes the
// whole parameters out and sets them from a host copy, and the model reads what was set, as each
// store's model reads it (the CPU layers' LayerParams, the GPU's gather slots, the LibTorch
// parameters after a gather). The multi-rank values are the ZeRO suites'.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/replica_state.h"
#include "dist/sharded_state.h"
#include "engine/zero/host_store.h"
#include "runtime/process_env.h"
#include "tests/unit/param_store_subject.h"

#if DDP_STORE_CUDA
#include <cuda_runtime.h>

#include "engine/zero/device_store.h"
#endif

namespace ddp {
namespace store_test {
namespace {

class HostSubject final : public Subject {
 public:
  explicit HostSubject(int level) : comm_(one_rank(false)) {
    HostStoreLayout layout;
    layout.count = kCount;
    layout.layers = {{0, kLayers[0]}, {1, kLayers[1]}};
    layout.stage_layers = {2};
    layout.plan = two_buckets();
    store_ = std::make_unique<HostParamStore>(layout);
    const std::vector<float> initial = counting(kCount, 1.0f);
    std::copy(initial.begin(), initial.end(), store_->params_buffer().begin());
    store_->set_rewire([this](std::function<float*(size_t)>, LayerParams* p) { layers_ = p; });
    ddp_ = std::make_unique<Reducer>(*comm_, layout.plan);
    store_->shard(*ddp_, level, nullptr);
  }
  ShardedState& state() override { return store_->state().pieces(); }
  ParamStore& store() override { return *store_; }
  std::vector<float> model_reads() override {
    if (layers_ == nullptr) return store_->params_buffer();
    std::vector<float> read;  // each layer as CpuLinear acquires it
    for (int layer = 0; layer < 2; ++layer) {
      const float* p = layers_->acquire(layer);
      read.insert(read.end(), p, p + kLayers[layer].count);
      layers_->release(layer);
    }
    return read;
  }

 private:
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<HostParamStore> store_;
  std::unique_ptr<Reducer> ddp_;
  LayerParams* layers_ = nullptr;
};

#if DDP_STORE_CUDA
// A group of one over device memory whose gathers copy (the library's one-process GPU group
// refuses to: the collectives' core links no CUDA, and no run shards over one replica), each
// copy after everything queued before it.
class DeviceGroupOfOne final : public Communicator {
 public:
  DeviceGroupOfOne() : Communicator(0, 1) {}
  const char* backend() const override { return "self"; }
  bool device_buffers() const override { return true; }
  std::unique_ptr<Work> all_reduce_async(void*, size_t, DataType, ReduceOp) override {
    return done();
  }
  std::unique_ptr<Work> broadcast_async(void*, size_t, DataType, int) override { return done(); }
  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, size_t count,
                                         DataType type) override {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (send != recv)
      EXPECT_EQ(cudaMemcpy(recv, send, count * dtype_bytes(type), cudaMemcpyDeviceToDevice),
                cudaSuccess);
    return done();
  }
  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp) override {
    return all_gather_async(send, recv, count, type);
  }
  void send(const void*, size_t, DataType, int) override { ADD_FAILURE() << "send"; }
  void recv(void*, size_t, DataType, int) override { ADD_FAILURE() << "recv"; }
  std::unique_ptr<Work> batch_async(const std::vector<P2pOp>&) override { return done(); }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<DeviceGroupOfOne>();
  }

 private:
  struct Done final : Work {
    void wait(double) override {}
    void then_on(void*) override {}
    bool is_completed() override { return true; }
  };
  std::unique_ptr<Work> done() {
    next_sequence();
    return std::make_unique<Done>();
  }
};

class DeviceSubject final : public Subject {
 public:
  explicit DeviceSubject(int level) : comm_(std::make_unique<DeviceGroupOfOne>()) {
    cudaStreamCreate(&stream_);
    weights_ = std::make_unique<DeviceParameters>(kCount, false, OptimizerConfig{}, stream_);
    const std::vector<float> initial = counting(kCount, 1.0f);
    weights_->set(initial.data());
    DeviceStoreLayout layout;
    layout.count = kCount;
    layout.layers = {{0, 6}, {6, 2}};
    layout.stage_layers = {2};
    layout.plan = two_buckets();
    store_ = std::make_unique<DeviceParamStore>(layout, *weights_, stream_,
                                                [](const OptStep*, const int*) {});
    ddp_ = std::make_unique<Reducer>(*comm_, layout.plan);
    store_->shard(*ddp_, level, nullptr);
  }
  ~DeviceSubject() override {
    cudaStreamSynchronize(stream_);
    store_.reset();
    weights_.reset();
    cudaStreamDestroy(stream_);
  }
  ShardedState& state() override { return store_->state().pieces(); }
  ParamStore& store() override { return *store_; }
  std::vector<float> model_reads() override {
    ReplicaState& state = store_->state();
    if (!state.gathers_layers()) return store_->whole_params();
    // Each layer as a step's first forward reads it: what the slots held is forgotten (as at
    // every step's start; the test sets the pieces through ShardedState, beneath
    // ReplicaState::set_params, which forgets them itself), and each is gathered into its slot.
    state.forget_gathers();
    std::vector<float> read;
    for (int layer = 0; layer < 2; ++layer) {
      state.use_layer(layer, -1);
      const std::vector<float> slot =
          store_->to_host(store_->layer_slot(layer), kLayers[layer].count);
      read.insert(read.end(), slot.begin(), slot.end());
    }
    return read;
  }

 private:
  std::unique_ptr<Communicator> comm_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DeviceParameters> weights_;
  std::unique_ptr<DeviceParamStore> store_;
  std::unique_ptr<Reducer> ddp_;
};
#endif

enum class Store { kHost, kDevice, kTorch };
struct StoreCase {
  Store store;
  int level;
};

std::string describe(const StoreCase& c) {
  const char* names[] = {"Host", "Device", "Torch"};
  return std::string(names[static_cast<int>(c.store)]) + "Level" + std::to_string(c.level);
}
std::string case_name(const ::testing::TestParamInfo<StoreCase>& info) {
  return describe(info.param);
}
void PrintTo(const StoreCase& c, std::ostream* os) {
  *os << describe(c);
}

class OneShardedState : public ::testing::TestWithParam<StoreCase> {
 protected:
  // The store of the case, or null with the reason to skip.
  std::unique_ptr<Subject> make(std::string* skip) {
    const StoreCase& c = GetParam();
    switch (c.store) {
      case Store::kHost:
        return std::make_unique<HostSubject>(c.level);
      case Store::kDevice: {
#if DDP_STORE_CUDA
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
          *skip = "no GPU";
          return nullptr;
        }
        return std::make_unique<DeviceSubject>(c.level);
#else
        *skip = "built without CUDA";
        return nullptr;
#endif
      }
      case Store::kTorch:
#if DDP_STORE_TORCH
        return make_torch_subject(c.level);
#else
        *skip = "built without LibTorch";
        return nullptr;
#endif
    }
    return nullptr;
  }
};

TEST_P(OneShardedState, TakesTheParametersOutAndInAndTheModelReadsWhatWasSet) {
  std::string skip;
  const std::unique_ptr<Subject> subject = make(&skip);
  if (!subject) GTEST_SKIP() << skip;
  const int level = GetParam().level;
  ShardedState& state = subject->state();
  ParamStore& store = subject->store();
  // LibTorch's zero(1) reduce-scatters as zero(2) does (its wrapper keeps the whole gradient
  // buffer apart from that), so that no level sends more than plain DDP's all-reduce.
  ASSERT_EQ(state.level(), GetParam().store == Store::kTorch ? std::max(level, 2) : level);
  EXPECT_EQ(state.plan().owned(), kCount);  // one rank owns every parameter
  // Out: the whole parameters as they were before sharding.
  EXPECT_EQ(state.params(kCount), counting(kCount, 1.0f));
  EXPECT_EQ(subject->model_reads(), counting(kCount, 1.0f));
  // In: the pieces set from a host copy, and out again.
  const std::vector<float> loaded = counting(kCount, 100.0f);
  state.set_params(loaded.data());
  EXPECT_EQ(state.params(kCount), loaded);
  if (level == 3) {
    // This rank's pieces in the store's memory: each of its runs at its place.
    ASSERT_NE(state.pieces(), nullptr);
    const std::vector<float> pieces = store.to_host(state.pieces(), state.piece_floats());
    for (const ShardPart& part : state.plan().parts)
      for (const ShardRun& run : part.runs[0])
        for (size_t i = 0; i < run.count; ++i)
          EXPECT_EQ(pieces[part.shard_at + run.at + i], loaded[run.offset + i])
              << part.bucket_offset << "+" << i;
    // Gathered whole into memory of the store's, as before a forward.
    const std::shared_ptr<void> whole = store.allocate(kCount * sizeof(float), false);
    state.gather_params({whole.get()});
    EXPECT_EQ(store.to_host(static_cast<const float*>(whole.get()), kCount), loaded);
  } else {
    EXPECT_EQ(state.pieces(), nullptr);
    EXPECT_EQ(store.whole_params(), loaded);
    state.updated();  // every rank's pieces gathered into the whole parameters (one: its own)
    EXPECT_EQ(store.whole_params(), loaded);
  }
  // And the model reads what was set.
  EXPECT_EQ(subject->model_reads(), loaded);
}

INSTANTIATE_TEST_SUITE_P(Stores, OneShardedState,
                         ::testing::Values(StoreCase{Store::kHost, 1}, StoreCase{Store::kHost, 2},
                                           StoreCase{Store::kHost, 3}, StoreCase{Store::kDevice, 1},
                                           StoreCase{Store::kDevice, 2},
                                           StoreCase{Store::kDevice, 3},
                                           StoreCase{Store::kTorch, 1}, StoreCase{Store::kTorch, 2},
                                           StoreCase{Store::kTorch, 3}),
                         case_name);

}  // namespace
}  // namespace store_test
}  // namespace ddp
