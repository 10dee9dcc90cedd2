// MpiCommunicator: every operation is a non-blocking MPI call whose request is polled with
// MPI_Test until it completes or the deadline passes.
#include "collectives/mpi/mpi_communicator.h"

#include <algorithm>
#include "collectives/backend_hooks.h"

#include <mpi.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "collectives/host_reduce.h"
#include "runtime/error.h"
#include "runtime/store.h"

namespace ddp {
namespace {

#define DDP_MPI_CHECK(statement)                                    \
  do {                                                              \
    const int ddp_mpi_rc_ = (statement);                            \
    if (ddp_mpi_rc_ != MPI_SUCCESS) {                               \
      char text[MPI_MAX_ERROR_STRING];                              \
      int length = 0;                                               \
      MPI_Error_string(ddp_mpi_rc_, text, &length);                 \
      DDP_CHECK(false, "MPI error: {}", std::string(text, length)); \
    }                                                               \
  } while (0)

MPI_Datatype mpi_type(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    case DataType::kBFloat16:
    case DataType::kFloat16:
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

// MPI has no bfloat16 or float16: user operators that sum or max uint16-stored values.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, inout, in, static_cast<size_t>(*len), DataType::kBFloat16, ReduceOp::kSum);
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, inout, in, static_cast<size_t>(*len), DataType::kBFloat16, ReduceOp::kMax);
}
void fp16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, inout, in, static_cast<size_t>(*len), DataType::kFloat16, ReduceOp::kSum);
}
void fp16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, inout, in, static_cast<size_t>(*len), DataType::kFloat16, ReduceOp::kMax);
}

class MpiWork final : public Work {
 public:
  MpiWork(MPI_Request request, std::function<void()> finish,
          std::function<std::string(const std::string&)> describe)
      : request_(request), finish_(std::move(finish)), describe_(std::move(describe)) {}
  void wait(double timeout_s) override {
    if (done_) return;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    int flag = 0;
    while (true) {
      DDP_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
      if (flag) break;
      if (std::chrono::steady_clock::now() >= deadline)
        throw Error(describe_(fmt::format("no completion within the {:.1f}s deadline", timeout_s)));
      std::this_thread::yield();
    }
    done_ = true;
    if (finish_) finish_();
  }
  void then_on(void*) override { wait(300.0); }
  bool is_completed() override {
    if (done_) return true;
    int flag = 0;
    DDP_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
    if (!flag) return false;
    done_ = true;
    if (finish_) finish_();
    return true;
  }

 private:
  MPI_Request request_;
  std::function<void()> finish_;
  std::function<std::string(const std::string&)> describe_;
  bool done_ = false;
};

// Several requests completed together (batch_async).
class MpiBatchWork final : public Work {
 public:
  MpiBatchWork(std::vector<MPI_Request> requests,
               std::function<std::string(const std::string&)> describe)
      : requests_(std::move(requests)), describe_(std::move(describe)) {}
  void wait(double timeout_s) override {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    int flag = requests_.empty() ? 1 : 0;
    while (!flag) {
      DDP_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                                MPI_STATUSES_IGNORE));
      if (flag) break;
      if (std::chrono::steady_clock::now() >= deadline)
        throw Error(describe_(fmt::format("no completion within the {:.1f}s deadline", timeout_s)));
      std::this_thread::yield();
    }
    requests_.clear();
  }
  void then_on(void*) override { wait(300.0); }
  bool is_completed() override {
    int flag = requests_.empty() ? 1 : 0;
    if (!flag)
      DDP_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                                MPI_STATUSES_IGNORE));
    if (flag) requests_.clear();
    return flag != 0;
  }

 private:
  std::vector<MPI_Request> requests_;
  std::function<std::string(const std::string&)> describe_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owns_mpi, std::shared_ptr<StoreClient> store,
                  double timeout_s, std::string group)
      : Communicator(comm_rank(comm), comm_size(comm)),
        comm_(comm),
        owns_mpi_(owns_mpi),
        store_(std::move(store)),
        group_(std::move(group)) {
    timeout_s_ = timeout_s;
    MPI_Comm_dup(comm_, &diagnosis_);
    MPI_Op_create(bf16_sum, 1, &bf16_sum_);
    MPI_Op_create(bf16_max, 1, &bf16_max_);
    MPI_Op_create(fp16_sum, 1, &fp16_sum_);
    MPI_Op_create(fp16_max, 1, &fp16_max_);
  }
  ~MpiCommunicator() override {
    MPI_Op_free(&bf16_sum_);
    MPI_Op_free(&bf16_max_);
    MPI_Op_free(&fp16_sum_);
    MPI_Op_free(&fp16_max_);
    if (diagnosis_ != MPI_COMM_NULL) MPI_Comm_free(&diagnosis_);
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  const char* backend() const override { return "mpi"; }
  bool device_buffers() const override { return false; }

  std::unique_ptr<Work> all_reduce_async(void* buffer, size_t count, DataType type,
                                         ReduceOp op) override {
    const uint64_t seq = next_sequence();
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer, checked_count(count), mpi_type(type),
                                 mpi_op(type, op), comm_, &request));
    std::function<void()> finish;
    if (op == ReduceOp::kAverage) finish = [=] { scale_by(buffer, count, type, size_); };
    return std::make_unique<MpiWork>(request, recorded(seq, finish),
                                     describer(seq, "all_reduce", count, type));
  }

  std::unique_ptr<Work> broadcast_async(void* buffer, size_t count, DataType type,
                                        int root) override {
    const uint64_t seq = next_sequence();
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ibcast(buffer, checked_count(count), mpi_type(type), root, comm_, &request));
    return std::make_unique<MpiWork>(request, recorded(seq, nullptr),
                                     describer(seq, "broadcast", count, type));
  }

  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, size_t count,
                                         DataType type) override {
    const uint64_t seq = next_sequence();
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Iallgather(send, checked_count(count), mpi_type(type), recv,
                                 checked_count(count), mpi_type(type), comm_, &request));
    return std::make_unique<MpiWork>(request, recorded(seq, nullptr),
                                     describer(seq, "all_gather", count, type));
  }

  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp op) override {
    const uint64_t seq = next_sequence();
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, checked_count(count), mpi_type(type),
                                            mpi_op(type, op), comm_, &request));
    return std::make_unique<MpiWork>(
        request,
        recorded(seq, op == ReduceOp::kAverage
                          ? std::function<void()>([=] { scale_by(recv, count, type, size_); })
                          : nullptr),
        describer(seq, "reduce_scatter", count, type));
  }

  void send(const void* buffer, size_t count, DataType type, int peer) override {
    const uint64_t seq = next_p2p_sequence();
    MPI_Request request;
    DDP_MPI_CHECK(
        MPI_Isend(buffer, checked_count(count), mpi_type(type), peer, 7, comm_, &request));
    MpiWork(request, nullptr,
            p2p_describer(seq, {{true, const_cast<void*>(buffer), count, type, peer}}))
        .wait(timeout_s_);
  }

  void recv(void* buffer, size_t count, DataType type, int peer) override {
    const uint64_t seq = next_p2p_sequence();
    MPI_Request request;
    DDP_MPI_CHECK(
        MPI_Irecv(buffer, checked_count(count), mpi_type(type), peer, 7, comm_, &request));
    MpiWork(request, nullptr, p2p_describer(seq, {{false, buffer, count, type, peer}}))
        .wait(timeout_s_);
  }

  std::unique_ptr<Work> batch_async(const std::vector<P2pOp>& ops) override {
    const uint64_t seq = next_p2p_sequence();
    std::vector<MPI_Request> requests(ops.size());
    size_t total = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2pOp& op = ops[i];
      total += op.count;
      if (op.send)
        DDP_MPI_CHECK(MPI_Isend(op.buffer, checked_count(op.count), mpi_type(op.type), op.peer, 8,
                                comm_, &requests[i]));
      else
        DDP_MPI_CHECK(MPI_Irecv(op.buffer, checked_count(op.count), mpi_type(op.type), op.peer, 8,
                                comm_, &requests[i]));
    }
    return std::make_unique<MpiBatchWork>(std::move(requests), p2p_describer(seq, ops));
  }

  void send_recv(const void* send_buffer, void* recv_buffer, size_t count, DataType type,
                 int send_peer, int recv_peer) override {
    const uint64_t seq = next_sequence();
    MPI_Request requests[2];
    DDP_MPI_CHECK(MPI_Irecv(recv_buffer, checked_count(count), mpi_type(type), recv_peer, 8, comm_,
                            &requests[0]));
    DDP_MPI_CHECK(MPI_Isend(send_buffer, checked_count(count), mpi_type(type), send_peer, 8, comm_,
                            &requests[1]));
    const auto describe = describer(seq, "send_recv", count, type);
    MpiWork(requests[0], nullptr, describe).wait(timeout_s_);
    MpiWork(requests[1], recorded(seq, nullptr), describe).wait(timeout_s_);
  }

  void barrier() override {
    const uint64_t seq = next_sequence();
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ibarrier(comm_, &request));
    MpiWork(request, recorded(seq, nullptr), describer(seq, "barrier", 0, DataType::kFloat32))
        .wait(timeout_s_);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    const uint64_t seq = next_sequence();
    MPI_Comm child;
    DDP_MPI_CHECK(MPI_Comm_split(comm_, color, key, &child));
    auto made = std::make_unique<MpiCommunicator>(child, false, store_, timeout_s_,
                                                  fmt::format("{}/split{}c{}", group_, seq, color));
    // The members' ranks in MPI_COMM_WORLD, for messages.
    MPI_Group child_group, world_group;
    MPI_Comm_group(child, &child_group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    std::vector<int> mine(made->size()), world(made->size());
    for (int r = 0; r < made->size(); ++r)
      mine[r] = r;
    if (MPI_Group_translate_ranks(child_group, made->size(), mine.data(), world_group,
                                  world.data()) == MPI_SUCCESS)
      made->set_world_ranks(std::move(world));
    else
      made->set_not_world();
    MPI_Group_free(&child_group);
    MPI_Group_free(&world_group);
    return made;
  }

  void abort() override { MPI_Abort(comm_, 1); }

 private:
  static int comm_rank(MPI_Comm comm) {
    int r = 0;
    MPI_Comm_rank(comm, &r);
    return r;
  }
  static int comm_size(MPI_Comm comm) {
    int s = 1;
    MPI_Comm_size(comm, &s);
    return s;
  }
  static int checked_count(size_t count) {
    DDP_CHECK(count <= static_cast<size_t>(INT32_MAX),
              "MPI counts are int: {} elements is too many", count);
    return static_cast<int>(count);
  }
  MPI_Op mpi_op(DataType type, ReduceOp op) const {
    if (type == DataType::kBFloat16) return op == ReduceOp::kMax ? bf16_max_ : bf16_sum_;
    if (type == DataType::kFloat16) return op == ReduceOp::kMax ? fp16_max_ : fp16_sum_;
    return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;
  }
  std::function<std::string(const std::string&)> p2p_describer(uint64_t seq,
                                                               std::vector<P2pOp> ops) {
    return [this, seq, ops](const std::string& cause) {
      return describe_stuck_p2p(group_, seq, ops, cause, this);
    };
  }
  // Called as each collective is issued: it is recorded (flight_record()), and described if it
  // never completes.
  std::function<std::string(const std::string&)> describer(uint64_t seq, const char* op,
                                                           size_t count, DataType type) {
    flight_->started(seq, op, count, type);
    return [this, seq, op, count, type](const std::string& cause) {
      if (store_ != nullptr)
        return describe_stuck_operation(store_.get(), group_, rank_, size_, seq, op, count, type,
                                        cause, world_ranks_, flight_.get());
      return describe_stuck_operation(nullptr, group_, rank_, size_, seq, op, count, type, cause,
                                      world_ranks_, flight_.get()) +
             missing_ranks(seq);
    };
  }
  // `finish` (may be null), then the call's end recorded.
  std::function<void()> recorded(uint64_t seq, std::function<void()> finish) {
    return [flight = flight_, seq, finish = std::move(finish)] {
      if (finish) finish();
      flight->ended(seq, true);
    };
  }

  // Without a store (under mpirun): every rank that gives up on operation `seq` tells the
  // others so on a communicator of its own, and waits two seconds to hear from them; the
  // ranks not heard from are named.
  std::string missing_ranks(uint64_t seq) {
    constexpr int kTag = 7411;
    arrived_ = seq;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request request;
      if (MPI_Isend(&arrived_, 1, MPI_UINT64_T, r, kTag, diagnosis_, &request) == MPI_SUCCESS)
        MPI_Request_free(&request);
    }
    std::vector<bool> heard(static_cast<size_t>(size_), false);
    heard[static_cast<size_t>(rank_)] = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < deadline &&
           std::count(heard.begin(), heard.end(), false) > 0) {
      int flag = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kTag, diagnosis_, &flag, &status);
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      uint64_t theirs = 0;
      MPI_Recv(&theirs, 1, MPI_UINT64_T, status.MPI_SOURCE, kTag, diagnosis_, MPI_STATUS_IGNORE);
      if (theirs == seq) heard[static_cast<size_t>(status.MPI_SOURCE)] = true;
    }
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r)
      if (!heard[static_cast<size_t>(r)]) missing.push_back(r);
    return missing.empty() ? "; every rank reached it (a peer failed inside it?)"
                           : fmt::format("; rank(s) {} never reached it",
                                         name_ranks(missing, world_ranks_, group_));
  }

  MPI_Comm comm_;
  MPI_Comm diagnosis_ = MPI_COMM_NULL;  // for missing_ranks(), apart from the job's traffic
  uint64_t arrived_ = 0;                // the send buffer of missing_ranks()
  bool owns_mpi_;
  std::shared_ptr<StoreClient> store_;
  std::string group_;
  MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL;
  MPI_Op fp16_sum_ = MPI_OP_NULL, fp16_max_ = MPI_OP_NULL;
};

}  // namespace

}  // namespace ddp

extern "C" const ddp::MpiBackend* ddp_mpi_backend() {
  static const ddp::MpiBackend backend{ddp::make_mpi_communicator};
  return &backend;
}

namespace ddp {

std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<StoreClient> store,
                                                    double timeout_s) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    DDP_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, !initialized, std::move(store),
                                           timeout_s, "mpi");
}

}  // namespace ddp
