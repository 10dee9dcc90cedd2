// ddp_collectives_check BACKEND MODE: run under ddprun (gloo) or mpirun (mpi) or on GPUs
// (nccl). Every value is known in closed form, so every element is checked.
//   all        every operation, sizes 0, 1, odd and several million, every data type,
//              sub-groups; prints "collectives ok" or the first mismatch and exits 1
//   straggler  rank 1 never calls; the others must fail with the timeout message
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/host_reduce.h"
#include "runtime/error.h"
#include "runtime/process_env.h"
#include "runtime/store.h"

#if DDP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ddp {
namespace {

struct Checker {
  Communicator& comm;
  bool gpu;
  int failures = 0;

  // Host or device staging so the same checks run on every backend.
  void* to_comm(std::vector<char>& host) {
#if DDP_HAVE_CUDA
    if (gpu) {
      void* device = nullptr;
      cudaMalloc(&device, std::max<size_t>(host.size(), 1));
      cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice);
      return device;
    }
#endif
    return host.data();
  }
  void from_comm(void* ptr, std::vector<char>& host) {
#if DDP_HAVE_CUDA
    if (gpu) {
      cudaMemcpy(host.data(), ptr, host.size(), cudaMemcpyDeviceToHost);
      cudaFree(ptr);
    }
#endif
    (void)ptr;
  }

  static void put(std::vector<char>& buffer, size_t i, DataType type, double value) {
    char* p = buffer.data() + i * dtype_bytes(type);
    switch (type) {
      case DataType::kFloat32: {
        float v = static_cast<float>(value);
        std::memcpy(p, &v, 4);
        break;
      }
      case DataType::kFloat64:
        std::memcpy(p, &value, 8);
        break;
      case DataType::kInt32: {
        int32_t v = static_cast<int32_t>(value);
        std::memcpy(p, &v, 4);
        break;
      }
      case DataType::kInt64: {
        int64_t v = static_cast<int64_t>(value);
        std::memcpy(p, &v, 8);
        break;
      }
      case DataType::kBFloat16: {
        uint16_t v = float_to_bf16(static_cast<float>(value));
        std::memcpy(p, &v, 2);
        break;
      }
      case DataType::kFloat16: {
        uint16_t v = float_to_fp16(static_cast<float>(value));
        std::memcpy(p, &v, 2);
        break;
      }
    }
  }
  static double get(const std::vector<char>& buffer, size_t i, DataType type) {
    const char* p = buffer.data() + i * dtype_bytes(type);
    switch (type) {
      case DataType::kFloat32: {
        float v;
        std::memcpy(&v, p, 4);
        return v;
      }
      case DataType::kFloat64: {
        double v;
        std::memcpy(&v, p, 8);
        return v;
      }
      case DataType::kInt32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        return v;
      }
      case DataType::kInt64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        return static_cast<double>(v);
      }
      case DataType::kBFloat16: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return bf16_to_float(v);
      }
      case DataType::kFloat16: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return fp16_to_float(v);
      }
    }
    return 0;
  }

  template <typename Want>
  void expect(const char* what, const std::vector<char>& buffer, size_t count, DataType type,
              Want want) {
    for (size_t i = 0; i < count; ++i) {
      const double expected = want(i);
      const double got = get(buffer, i, type);
      // The closed forms are computed in double; the backends add float32 (or bfloat16,
      // float16) values of up to 8 ranks in their own order: at most 8 roundings of 2^-24
      // (2^-8 for bfloat16, 2^-11 for float16) relative each, whatever the order or CPU;
      // integers are exact.
      const double tolerance = type == DataType::kBFloat16  ? 1e-2 * std::fabs(expected)
                               : type == DataType::kFloat16 ? 4e-3 * std::fabs(expected)
                                                            : 1e-6 * std::fabs(expected);
      if (std::fabs(got - expected) > tolerance) {
        std::printf("MISMATCH %s %s count %zu element %zu: got %g want %g (rank %d)\n", what,
                    dtype_name(type), count, i, got, expected, comm.rank());
        ++failures;
        return;
      }
    }
  }

  void run(size_t count, DataType type) {
    const int S = comm.size(), R = comm.rank();
    const size_t b = dtype_bytes(type);
    const bool floating = type == DataType::kFloat32 || type == DataType::kFloat64 ||
                          type == DataType::kBFloat16 || type == DataType::kFloat16;
    {  // all_reduce sum / average
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        if (op == ReduceOp::kAverage && !floating) continue;
        std::vector<char> h(count * b);
        for (size_t i = 0; i < count; ++i)
          put(h, i, type, R + 1 + double(i % 7));
        void* d = to_comm(h);
        comm.all_reduce(d, count, type, op);
        from_comm(d, h);
        const double div = op == ReduceOp::kAverage ? S : 1;
        expect(op == ReduceOp::kSum ? "all_reduce sum" : "all_reduce average", h, count, type,
               [&](size_t i) { return (S * (S + 1) / 2.0 + S * double(i % 7)) / div; });
      }
    }
    {  // all_reduce max
      std::vector<char> h(count * b);
      for (size_t i = 0; i < count; ++i)
        put(h, i, type, (R + 1) * double(i % 3 + 1));
      void* d = to_comm(h);
      comm.all_reduce(d, count, type, ReduceOp::kMax);
      from_comm(d, h);
      expect("all_reduce max", h, count, type, [&](size_t i) { return S * double(i % 3 + 1); });
    }
    {  // broadcast from the last rank
      std::vector<char> h(count * b);
      for (size_t i = 0; i < count; ++i)
        put(h, i, type, R == S - 1 ? double(i % 11 + 3) : -1.0);
      void* d = to_comm(h);
      comm.broadcast(d, count, type, S - 1);
      from_comm(d, h);
      expect("broadcast", h, count, type, [&](size_t i) { return double(i % 11 + 3); });
    }
    if (count > 100000) return;  // the rest at small and odd sizes
    {                            // all_gather
      std::vector<char> send(count * b), recv(count * b * S);
      for (size_t i = 0; i < count; ++i)
        put(send, i, type, R * 10 + double(i % 5));
      void* ds = to_comm(send);
      void* dr = to_comm(recv);
      comm.all_gather(ds, dr, count, type);
      from_comm(dr, recv);
      std::vector<char> dummy(send.size());
      from_comm(ds, dummy);
      expect("all_gather", recv, count * S, type, [&](size_t j) {
        return (j / std::max<size_t>(count, 1)) * 10 + double(j % std::max<size_t>(count, 1) % 5);
      });
    }
    {  // reduce_scatter sum
      std::vector<char> send(count * b * S), recv(count * b);
      for (int block = 0; block < S; ++block)
        for (size_t i = 0; i < count; ++i)
          put(send, block * count + i, type, R + block + double(i % 5));
      void* ds = to_comm(send);
      void* dr = to_comm(recv);
      comm.reduce_scatter(ds, dr, count, type, ReduceOp::kSum);
      from_comm(dr, recv);
      std::vector<char> dummy(send.size());
      from_comm(ds, dummy);
      expect("reduce_scatter", recv, count, type,
             [&](size_t i) { return S * (S - 1) / 2.0 + S * (R + double(i % 5)); });
    }
    if (S > 1) {  // ring send/recv: even ranks send first
      std::vector<char> out(count * b), in(count * b);
      for (size_t i = 0; i < count; ++i)
        put(out, i, type, R * 3 + double(i % 4));
      void* dout = to_comm(out);
      void* din = to_comm(in);
      const int next = (R + 1) % S, prev = (R + S - 1) % S;
      if (R % 2 == 0) {
        comm.send(dout, count, type, next);
        comm.recv(din, count, type, prev);
      } else {
        comm.recv(din, count, type, prev);
        comm.send(dout, count, type, next);
      }
      from_comm(din, in);
      std::vector<char> dummy(out.size());
      from_comm(dout, dummy);
      expect("send/recv", in, count, type, [&](size_t i) { return prev * 3 + double(i % 4); });
    }
    if (S > 1) {  // batched async send/recv with both neighbours, all sends posted first
      const int next = (R + 1) % S, prev = (R + S - 1) % S;
      std::vector<char> to_next(count * b), to_prev(count * b), from_prev(count * b),
          from_next(count * b);
      for (size_t i = 0; i < count; ++i) {
        put(to_next, i, type, R * 100 + 1 + double(i % 3));
        put(to_prev, i, type, R * 100 + 2 + double(i % 3));
      }
      void* d_to_next = to_comm(to_next);
      void* d_to_prev = to_comm(to_prev);
      void* d_from_prev = to_comm(from_prev);
      void* d_from_next = to_comm(from_next);
      comm.batch_async({{true, d_to_next, count, type, next},
                        {true, d_to_prev, count, type, prev},
                        {false, d_from_prev, count, type, prev},
                        {false, d_from_next, count, type, next}})
          ->wait(comm.timeout());
      from_comm(d_from_prev, from_prev);
      from_comm(d_from_next, from_next);
      std::vector<char> dummy(count * b);
      from_comm(d_to_next, dummy);
      from_comm(d_to_prev, dummy);
      expect("batch_async from prev", from_prev, count, type,
             [&](size_t i) { return prev * 100 + 1 + double(i % 3); });
      expect("batch_async from next", from_next, count, type,
             [&](size_t i) { return next * 100 + 2 + double(i % 3); });
    }
    comm.barrier();
  }
};

int run_all(Communicator& comm, bool gpu) {
  Checker checker{comm, gpu};
  for (DataType type : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat64,
                        DataType::kInt32, DataType::kInt64, DataType::kFloat16})
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}})
      checker.run(count, type);
  checker.run(3'000'001, DataType::kFloat32);
  // float32 reduced as bfloat16 (NCCL on the device, the host backends in host memory; the
  // one-process GPU communicator refuses it with UsageError). Odd elements are small integers
  // (exact in bf16), even ones 1 + 2^-10 on every rank, which bf16 rounds to 1: the sum is then
  // exactly the rank count, not the float32 sum.
  for (size_t count : {size_t{1001}, size_t{3'000'001}}) {
    const int S = comm.size();
    std::vector<char> h(count * 4), scratch_host(count * 2);
    for (size_t i = 0; i < count; ++i)
      Checker::put(h, i, DataType::kFloat32,
                   i % 2 ? comm.rank() + 1 + double(i % 7) : 1.0 + 1.0 / 1024);
    void* d = checker.to_comm(h);
    void* scratch = checker.to_comm(scratch_host);
    if (!comm.reduces_bf16()) {
      try {
        comm.all_reduce_bf16_async(static_cast<float*>(d), scratch, count, ReduceOp::kSum);
        std::printf("MISMATCH all_reduce_bf16: the %s backend did not refuse it\n", comm.backend());
        ++checker.failures;
      } catch (const UsageError&) {
      }
      break;
    }
    comm.all_reduce_bf16_async(static_cast<float*>(d), scratch, count, ReduceOp::kSum)
        ->wait(comm.timeout());
    checker.from_comm(scratch, scratch_host);  // frees it
    checker.from_comm(d, h);
    checker.expect("all_reduce_bf16 sum", h, count, DataType::kFloat32, [&](size_t i) {
      return i % 2 ? S * (S + 1) / 2.0 + S * double(i % 7) : double(S);
    });
  }
  if (comm.reduces_bf16()) {
    // reduce_scatter_bf16_async, averaged: block b of rank r holds S * (r + 1 + b + i % 7)
    // at odd i (divided by S before the bf16 sum: exact) and S * (1 + 2^-10) at even i (bf16
    // rounds it to S, so each rank's share is 1 and the average S exactly, where float32's
    // would be S * (1 + 2^-10)).
    const int S = comm.size(), R = comm.rank();
    const size_t count = 1001;
    std::vector<char> send(count * 4 * S), recv(count * 4), scratch_host(count * 2 * S);
    for (int block = 0; block < S; ++block)
      for (size_t i = 0; i < count; ++i)
        Checker::put(send, block * count + i, DataType::kFloat32,
                     i % 2 ? S * double(R + 1 + block + i % 7) : S * (1.0 + 1.0 / 1024));
    void* d_send = checker.to_comm(send);
    void* d_recv = checker.to_comm(recv);
    void* scratch = checker.to_comm(scratch_host);
    comm.reduce_scatter_bf16_async(static_cast<const float*>(d_send), static_cast<float*>(d_recv),
                                   scratch, count, ReduceOp::kAverage)
        ->wait(comm.timeout());
    checker.from_comm(scratch, scratch_host);
    checker.from_comm(d_send, send);
    checker.from_comm(d_recv, recv);
    checker.expect("reduce_scatter_bf16 average", recv, count, DataType::kFloat32, [&](size_t i) {
      return i % 2 ? S * (S + 1) / 2.0 + S * double(R + i % 7) : double(S);
    });
  }
  {
    // broadcast, all-gather and reduce-scatter in flight together, each its own Work: polled
    // with is_completed (never blocking) until every one is done, then checked.
    const int S = comm.size(), R = comm.rank();
    const size_t count = 1001;
    const DataType f32 = DataType::kFloat32;
    std::vector<char> bcast(count * 4), gsend(count * 4), grecv(count * 4 * S),
        rsend(count * 4 * S), rrecv(count * 4);
    for (size_t i = 0; i < count; ++i) {
      Checker::put(bcast, i, f32, R == 0 ? double(i % 13) : -7.0);
      Checker::put(gsend, i, f32, R * 10 + double(i % 5));
    }
    for (int block = 0; block < S; ++block)
      for (size_t i = 0; i < count; ++i)
        Checker::put(rsend, block * count + i, f32, R + 2 * block + double(i % 3));
    void* d_bcast = checker.to_comm(bcast);
    void* d_gsend = checker.to_comm(gsend);
    void* d_grecv = checker.to_comm(grecv);
    void* d_rsend = checker.to_comm(rsend);
    void* d_rrecv = checker.to_comm(rrecv);
    std::vector<std::unique_ptr<Work>> works;
    works.push_back(comm.broadcast_async(d_bcast, count, f32, 0));
    works.push_back(comm.all_gather_async(d_gsend, d_grecv, count, f32));
    works.push_back(comm.reduce_scatter_async(d_rsend, d_rrecv, count, f32, ReduceOp::kSum));
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(comm.timeout());
    bool all_done = false;
    while (!all_done && std::chrono::steady_clock::now() < deadline) {
      all_done = true;
      for (auto& work : works)
        all_done = work->is_completed() && all_done;
      if (!all_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!all_done) {
      std::printf("MISMATCH async collectives: is_completed never became true\n");
      ++checker.failures;
    }
    for (auto& work : works)
      work->wait(comm.timeout());
    std::vector<char> dummy(count * 4 * S);
    checker.from_comm(d_bcast, bcast);
    checker.from_comm(d_grecv, grecv);
    checker.from_comm(d_rrecv, rrecv);
    checker.from_comm(d_gsend, dummy);
    checker.from_comm(d_rsend, dummy);
    checker.expect("broadcast_async", bcast, count, f32, [&](size_t i) { return double(i % 13); });
    checker.expect("all_gather_async", grecv, count * S, f32,
                   [&](size_t j) { return (j / count) * 10 + double(j % count % 5); });
    checker.expect("reduce_scatter_async", rrecv, count, f32,
                   [&](size_t i) { return S * (S - 1) / 2.0 + S * (2 * R + double(i % 3)); });
  }
  // The typed all_reduce takes the element type from the pointer: doubles that float32 could
  // not hold (2^40 + rank) sum exactly, as double.
  if (!gpu) {
    std::vector<double> typed(7, std::ldexp(1.0, 40) + comm.rank());
    comm.all_reduce(typed.data(), typed.size(), ReduceOp::kSum);
    const double want = std::ldexp(1.0, 40) * comm.size() + comm.size() * (comm.size() - 1) / 2.0;
    for (size_t i = 0; i < typed.size(); ++i)
      if (typed[i] != want) {
        std::printf("MISMATCH typed all_reduce<double>[%zu]: %.17g, want %.17g\n", i, typed[i],
                    want);
        ++checker.failures;
        break;
      }
  }
  // Gloo sums every element in rank order, whatever the length of the buffer it travels in: a
  // value whose sum rounds differently in another order ((big + small) + -big is 0, big +
  // (small + -big) is not) gives rank order's float result in an all-reduce of 1000 elements,
  // one of 7 and a reduce-scatter, at every position (a ring's order depends on the position).
  if (std::string(comm.backend()) == "gloo" && comm.size() > 2) {
    const int S = comm.size(), R = comm.rank();
    const auto value = [](int rank, size_t i) {
      const float big = 1e8f + float(i % 11);
      return rank % 3 == 0 ? big : rank % 3 == 1 ? 0.75f + float(i % 5) : -big;
    };
    const auto in_rank_order = [&](size_t i) {
      float sum = value(0, i);
      for (int r = 1; r < S; ++r)
        sum += value(r, i);
      return sum;
    };
    for (const size_t count : {size_t{1000}, size_t{7}}) {
      std::vector<float> mine(count);
      for (size_t i = 0; i < count; ++i)
        mine[i] = value(R, i);
      comm.all_reduce(mine.data(), count, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i)
        if (const float want = in_rank_order(i); std::memcmp(&mine[i], &want, 4) != 0) {
          std::printf("MISMATCH rank-order all_reduce of %zu [%zu]: %.9g, want %.9g\n", count, i,
                      mine[i], want);
          ++checker.failures;
          break;
        }
    }
    const size_t piece = 5;
    std::vector<float> send(piece * S), recv(piece);
    for (size_t i = 0; i < send.size(); ++i)
      send[i] = value(R, i);
    comm.reduce_scatter(send.data(), recv.data(), piece, DataType::kFloat32, ReduceOp::kSum);
    for (size_t i = 0; i < piece; ++i) {
      const float want = in_rank_order(R * piece + i);
      if (std::memcmp(&recv[i], &want, 4) != 0) {
        std::printf("MISMATCH rank-order reduce_scatter [%zu]: %.9g, want %.9g\n", i, recv[i],
                    want);
        ++checker.failures;
        break;
      }
    }
  }
  // Sub-groups: even and odd ranks.
  auto sub = comm.split(comm.rank() % 2, comm.rank());
  std::vector<char> h(4 * 5);
  for (size_t i = 0; i < 5; ++i)
    Checker::put(h, i, DataType::kFloat32, comm.rank());
  void* d = checker.to_comm(h);
  sub->all_reduce(d, 5, DataType::kFloat32, ReduceOp::kSum);
  checker.from_comm(d, h);
  double want = 0;
  for (int r = comm.rank() % 2; r < comm.size(); r += 2)
    want += r;
  Checker sub_checker{*sub, gpu};
  sub_checker.expect("split all_reduce", h, 5, DataType::kFloat32, [&](size_t) { return want; });
  const int expected_size = (comm.size() + 1 - comm.rank() % 2) / 2;
  if (sub->size() != expected_size || sub->rank() != comm.rank() / 2) {
    std::printf("MISMATCH split: size %d rank %d, want %d %d\n", sub->size(), sub->rank(),
                expected_size, comm.rank() / 2);
    ++sub_checker.failures;
  }
  const int failures = checker.failures + sub_checker.failures;
  if (failures == 0)
    std::printf("collectives ok: %s rank %d of %d, %llu operations\n", comm.backend(), comm.rank(),
                comm.size(), static_cast<unsigned long long>(comm.sequence()));
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  std::unique_ptr<ddp::Communicator> comm;
  try {
    const std::string backend = argc > 1 ? argv[1] : "auto";
    const std::string mode = argc > 2 ? argv[2] : "all";
    ddp::ProcessEnv env = ddp::ProcessEnv::detect();
    ddp::set_process_context({env.rank, env.world_size, backend == "nccl" ? "cuda" : "cpu"});
    const bool gpu = backend == "nccl";
#if DDP_HAVE_CUDA
    if (gpu) {
      if (env.launcher == ddp::Launcher::kMpirun) ddp::narrow_visible_devices(&env);
      cudaSetDevice(0);
    }
#endif
    std::shared_ptr<ddp::StoreClient> store;
    if (env.master_port > 0)
      store = std::make_shared<ddp::StoreClient>(env.master_addr, env.master_port, env.store_token);
    ddp::CommConfig config;
    const std::optional<ddp::Backend> named = ddp::backend_from_name(backend);
    if (!named) throw ddp::UsageError("collectives_worker: unknown backend " + backend);
    config.backend = *named;
    config.gpu = gpu;
    config.timeout_s = mode == "straggler" || mode == "mismatch" ? 3.0 : 120.0;
    comm = ddp::make_communicator(config, env, store);
    if (mode == "straggler") {
      if (comm->rank() == 1) {
        std::this_thread::sleep_for(std::chrono::seconds(30));
        return 0;
      }
      std::vector<float> buffer(10, 1.0f);
      comm->all_reduce(buffer.data(), buffer.size(), ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
      std::printf("straggler: all_reduce returned without rank 1\n");
      return 3;
    }
    if (mode == "mismatch") {  // one all-reduce #2 of 10 floats on rank 0, 20 on the others
      std::vector<float> buffer(comm->rank() == 0 ? 10 : 20, 1.0f);
      comm->all_reduce(buffer.data(), 4, ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
      comm->all_reduce(buffer.data(), buffer.size(), ddp::DataType::kFloat32, ddp::ReduceOp::kSum);
      std::printf("mismatch: all_reduce returned\n");
      return 3;
    }
    return ddp::run_all(*comm, gpu);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_collectives_check: error: %s\n", e.what());
    std::fflush(stderr);
    if (comm) comm->abort();  // so that peers stop waiting (MPI: ends the job)
    return 1;
  }
}
