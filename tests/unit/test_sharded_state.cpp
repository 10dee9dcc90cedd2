// ZeRO's sharded state written once (dist/sharded_state.h) over a home that records
// what it is asked: which memory it gives, what it copies where and in what order. One process
// (a group of one rank, whose pieces are the whole buckets in the plan's order: the last layers
// first), so that each piece's place is known; the multi-rank values are the ZeRO suites'
// (tests/dist/test_zero.cpp, tests/cuda/test_cuda_zero.cpp), which run through it on both homes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/sharded_state.h"
#include "runtime/process_env.h"

namespace ddp {
namespace {

// Host vectors, every call recorded by name.
class RecordingHome final : public ParamStore {
 public:
  explicit RecordingHome(std::vector<float> params) : params_(std::move(params)) {}

  // Host memory whose copies are recorded.
  const MemoryPort* memory() const override { return &memory_; }
  std::vector<GradMemory> param_memory() override { return {{params_.data(), DataType::kFloat32}}; }
  void* stream() override { return nullptr; }
  std::shared_ptr<void> allocate(size_t bytes, bool pieces) override {
    calls.push_back(pieces ? "allocate pieces " + std::to_string(bytes)
                           : "allocate copy " + std::to_string(bytes));
    const auto memory = std::make_shared<std::vector<float>>(bytes / 4, pieces ? 0.0f : -1.0f);
    return std::shared_ptr<void>(memory, memory->data());
  }
  std::vector<float> to_host(const float* src, size_t floats) override {
    calls.push_back("to_host " + std::to_string(floats));
    return std::vector<float>(src, src + floats);
  }
  void from_host(float* dst, const float* host, size_t floats) override {
    calls.push_back("from_host " + std::to_string(floats));
    std::copy_n(host, floats, dst);
  }
  std::vector<float> whole_params() override {
    calls.push_back("whole_params");
    return params_;
  }
  void set_whole_params(const float* host) override {
    calls.push_back("set_whole_params");
    std::copy_n(host, params_.size(), params_.begin());
  }
  void params_gathered() override { calls.push_back("params_gathered"); }

  std::vector<std::string> calls;
  std::vector<float> params_;
  MemoryPort memory_ = [this] {
    MemoryPort port = host_memory_port();
    port.copy = [this](void* dst, const void* src, size_t bytes) {
      calls.push_back("copy " + std::to_string(bytes));
      std::memcpy(dst, src, bytes);
    };
    return port;
  }();
};

std::unique_ptr<Communicator> one_rank() {
  ProcessEnv env;
  CommConfig config;
  return make_communicator(config, env, nullptr);
}

// Two layers of 4 and 6 parameters, a bucket each, the last layer's first.
Reducer two_buckets(Communicator& comm) {
  return Reducer(comm, std::vector<Bucket>{{4, 6, 1, 1}, {0, 4, 0, 0}}, 2, true);
}

std::vector<float> counting(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = from + static_cast<float>(i);
  return v;
}

TEST(ShardedState, LevelThreeKeepsThePiecesInTheStoresMemoryAndCopiesThroughIt) {
  const std::unique_ptr<Communicator> comm = one_rank();
  Reducer ddp = two_buckets(*comm);
  RecordingHome home(counting(10, 1.0f));
  ShardedState state(ddp, 3, home, nullptr);
  // The pieces, in the home's memory, copied bucket by bucket in the plan's order (bytes).
  EXPECT_EQ(home.calls, (std::vector<std::string>{"allocate pieces 40", "copy 24", "copy 16"}));
  ASSERT_EQ(state.piece_floats(), 10u);
  EXPECT_EQ(std::vector<float>(state.pieces(), state.pieces() + 10),
            (std::vector<float>{5, 6, 7, 8, 9, 10, 1, 2, 3, 4}));
  // The update's pieces are places in the pieces, not in the whole parameters.
  const std::vector<OptimizerPiece> pieces = state.owned_pieces();
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].offset, 0u);
  EXPECT_EQ(pieces[1].offset, 6u);
  EXPECT_EQ(pieces[1].state_offset, 6u);
  EXPECT_EQ(pieces[1].count, 4u);
  home.calls.clear();
  state.updated();  // the pieces are the parameters: nothing gathered into the whole ones
  EXPECT_TRUE(home.calls.empty());
  // In and out: the copies the store's own.
  const std::vector<float> loaded = counting(10, 100.0f);
  state.set_params(loaded.data());
  EXPECT_EQ(home.calls, (std::vector<std::string>{"from_host 10"}));
  EXPECT_EQ(state.pieces()[0], 104.0f);
  home.calls.clear();
  EXPECT_EQ(state.params(10), loaded);
  EXPECT_EQ(home.calls, (std::vector<std::string>{"allocate copy 40", "to_host 10"}));
  EXPECT_EQ(home.params_, counting(10, 1.0f));  // the home's whole parameters untouched
}

TEST(ShardedState, LevelsOneAndTwoKeepTheWholeParametersAndGatherThemAfterTheUpdate) {
  for (int level : {1, 2}) {
    const std::unique_ptr<Communicator> comm = one_rank();
    Reducer ddp = two_buckets(*comm);
    RecordingHome home(counting(10, 1.0f));
    ShardedState state(ddp, level, home, nullptr);
    EXPECT_TRUE(home.calls.empty()) << level;
    EXPECT_EQ(state.pieces(), nullptr);
    EXPECT_EQ(state.piece_floats(), 0u);
    const std::vector<OptimizerPiece> pieces = state.owned_pieces();
    ASSERT_EQ(pieces.size(), 2u);
    EXPECT_EQ(pieces[0].offset, 4u);  // places in the whole parameters
    EXPECT_EQ(pieces[0].state_offset, 0u);
    EXPECT_EQ(pieces[1].offset, 0u);
    EXPECT_EQ(pieces[1].state_offset, 6u);
    state.updated();
    EXPECT_EQ(home.calls, (std::vector<std::string>{"params_gathered"})) << level;
    EXPECT_EQ(home.params_, counting(10, 1.0f)) << level;  // one rank: its own pieces back
    home.calls.clear();
    EXPECT_EQ(state.params(10), counting(10, 1.0f));
    const std::vector<float> loaded = counting(10, 50.0f);
    state.set_params(loaded.data());
    EXPECT_EQ(home.calls, (std::vector<std::string>{"whole_params", "set_whole_params"}));
    EXPECT_EQ(home.params_, loaded);
  }
}

TEST(ShardedState, OptimizerStateGoesOutWholeAndComesBackAsThisRanksPieces) {
  const std::unique_ptr<Communicator> comm = one_rank();
  Reducer ddp = two_buckets(*comm);
  RecordingHome home(counting(10, 1.0f));
  ShardedState state(ddp, 2, home, nullptr);
  // Two buffers over the pieces (the last layer's first).
  const std::vector<float> m = counting(10, 10.0f), v = counting(10, 20.0f);
  const NamedState whole = state.optimizer_state(10, {{"m", m.data()}, {"v", v.data()}});
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_EQ(whole[0].first, "m");
  EXPECT_EQ(whole[0].second, (std::vector<float>{16, 17, 18, 19, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(home.calls, (std::vector<std::string>{"allocate copy 40", "to_host 10", "to_host 10"}));
  const NamedState mine = state.pieces_of(whole);
  ASSERT_EQ(mine.size(), 2u);
  EXPECT_EQ(mine[1].first, "v");
  EXPECT_EQ(mine[0].second, m);
  EXPECT_EQ(mine[1].second, v);
}

}  // namespace
}  // namespace ddp
