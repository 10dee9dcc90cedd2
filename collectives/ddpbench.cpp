// ddpbench collectives: bandwidth of our collectives, in the format of nccl-tests (size,
// count, time, algbw, busbw with the same bus factors, wrong elements checked against
// closed-form values). Run under ddprun (gloo, nccl) or mpirun (mpi, nccl).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include "collectives/communicator.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/process_env.h"
#include "runtime/store.h"
#include "runtime/timer.h"

#if DDP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ddp {
namespace {

struct BenchConfig {
  std::string op = "all_reduce";
  Backend backend = Backend::kAuto;
  std::string device = "cpu";
  size_t min_bytes = 8;
  size_t max_bytes = 64u << 20;
  double factor = 2;
  int iters = 20;
  int warmup = 5;
  bool json = false;
  bool symmetric = false;  // NCCL: both buffers registered as symmetric windows
};

// nccl-tests' bus bandwidth factors.
double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter") return double(n - 1) / n;
  return 1.0;
}

class Buffers {
 public:
  // `window` (GPU only): where both buffers come from (null: cudaMalloc).
  Buffers(size_t bytes, bool gpu, const DeviceAllocator* window = nullptr)
      : bytes_(std::max<size_t>(bytes, 4)), gpu_(gpu), window_(window) {
#if DDP_HAVE_CUDA
    if (gpu_ && window_ != nullptr) {
      send_ = window_->allocate(bytes_);
      recv_ = window_->allocate(bytes_);
      return;
    }
    if (gpu_) {
      DDP_CHECK(
          cudaMalloc(&send_, bytes_) == cudaSuccess && cudaMalloc(&recv_, bytes_) == cudaSuccess,
          "cudaMalloc of {} bytes failed", bytes_);
      return;
    }
#endif
    host_send_.resize(bytes_);
    host_recv_.resize(bytes_);
    send_ = host_send_.data();
    recv_ = host_recv_.data();
  }
  ~Buffers() {
#if DDP_HAVE_CUDA
    if (gpu_ && window_ != nullptr) {
      window_->release(send_);
      window_->release(recv_);
    } else if (gpu_) {
      cudaFree(send_);
      cudaFree(recv_);
    }
#endif
  }
  void upload(void* dst, const std::vector<float>& values) {
#if DDP_HAVE_CUDA
    if (gpu_) {
      cudaMemcpy(dst, values.data(), values.size() * 4, cudaMemcpyHostToDevice);
      return;
    }
#endif
    std::memcpy(dst, values.data(), values.size() * 4);
  }
  std::vector<float> download(const void* src, size_t count) {
    std::vector<float> values(count);
#if DDP_HAVE_CUDA
    if (gpu_) {
      cudaMemcpy(values.data(), src, count * 4, cudaMemcpyDeviceToHost);
      return values;
    }
#endif
    std::memcpy(values.data(), src, count * 4);
    return values;
  }
  void* send() const {
    return send_;
  }
  bool gpu() const {
    return gpu_;
  }
  size_t bytes() const {
    return bytes_;
  }
  void* recv() const {
    return recv_;
  }

 private:
  size_t bytes_;
  bool gpu_;
  const DeviceAllocator* window_;
  void* send_ = nullptr;
  void* recv_ = nullptr;
  std::vector<char> host_send_, host_recv_;
};

// One operation on `total` bytes of float32 (nccl-tests' size: the larger buffer).
void run_op(Communicator& comm, const std::string& op, Buffers& b, size_t total_count) {
  const int n = comm.size();
  const int next = (comm.rank() + 1) % n, prev = (comm.rank() + n - 1) % n;
  if (op == "all_reduce")
    comm.all_reduce_async(b.recv(), total_count, DataType::kFloat32, ReduceOp::kSum)
        ->wait(comm.timeout());
  else if (op == "broadcast")
    comm.broadcast(b.recv(), total_count, DataType::kFloat32, 0);
  else if (op == "all_gather")
    comm.all_gather(b.send(), b.recv(), total_count / n, DataType::kFloat32);
  else if (op == "reduce_scatter")
    comm.reduce_scatter(b.send(), b.recv(), total_count / n, DataType::kFloat32, ReduceOp::kSum);
  else
    comm.send_recv(b.send(), b.recv(), total_count, DataType::kFloat32, next, prev);
}

// Fills inputs with closed-form values, runs once, counts wrong elements.
int64_t check_op(Communicator& comm, const std::string& op, Buffers& b, size_t total) {
  const int n = comm.size(), r = comm.rank();
  const int prev = (r + n - 1) % n;
  const size_t block = total / n;
  std::vector<float> in(total);
  for (size_t i = 0; i < total; ++i)
    in[i] = float(r + 1 + int(i % 13));
  b.upload(op == "all_reduce" || op == "broadcast" ? b.recv() : b.send(), in);
  run_op(comm, op, b, total);
  size_t out_count = op == "reduce_scatter" ? block : total;
  const std::vector<float> out = b.download(b.recv(), out_count);
  int64_t wrong = 0;
  for (size_t i = 0; i < out_count; ++i) {
    double want = 0;
    if (op == "all_reduce")
      want = n * (n + 1) / 2.0 + n * double(i % 13);
    else if (op == "broadcast")
      want = 1 + double(i % 13);
    else if (op == "all_gather")
      want = double(i / std::max<size_t>(block, 1) + 1 + (i % std::max<size_t>(block, 1)) % 13);
    else if (op == "reduce_scatter")
      want = n * (n + 1) / 2.0 + n * double((r * block + i) % 13);
    else
      want = prev + 1 + double(i % 13);
    wrong += std::fabs(out[i] - want) > 1e-3 * std::fabs(want);
  }
  return wrong;
}

// Whether start_op can start `op` without waiting (the others only block).
bool queueable(const std::string& op, int ranks) {
  return op == "all_reduce" || op == "all_gather" || op == "reduce_scatter" || op == "broadcast" ||
         (op == "sendrecv" && ranks > 1);
}

// Starts one operation without waiting (queueable ops only).
std::unique_ptr<Work> start_op(Communicator& comm, const std::string& op, Buffers& b,
                               size_t total_count) {
  const int n = comm.size();
  const int next = (comm.rank() + 1) % n, prev = (comm.rank() + n - 1) % n;
  if (op == "all_reduce")
    return comm.all_reduce_async(b.recv(), total_count, DataType::kFloat32, ReduceOp::kSum);
  if (op == "all_gather")
    return comm.all_gather_async(b.send(), b.recv(), total_count / n, DataType::kFloat32);
  if (op == "reduce_scatter")
    return comm.reduce_scatter_async(b.send(), b.recv(), total_count / n, DataType::kFloat32,
                                     ReduceOp::kSum);
  if (op == "broadcast") return comm.broadcast_async(b.recv(), total_count, DataType::kFloat32, 0);
  if (op == "sendrecv" && n > 1)
    return comm.batch_async({{true, b.send(), total_count, DataType::kFloat32, next},
                             {false, b.recv(), total_count, DataType::kFloat32, prev}});
  DDP_CHECK(false, "{} cannot be queued", op);
  return nullptr;
}

struct Timings {
  double queued_us = 0;  // per operation, queued back to back, one wait at the end
  double device_us = 0;  // the same on the GPU, by events (0: not measured)
  double call_us = 0;    // per operation, each waited before the next is started
};

Timings time_op(Communicator& comm, const BenchConfig& c, Buffers& b, size_t total) {
  Timings t;
  comm.barrier();
  {
    Stopwatch clock;
    for (int i = 0; i < c.iters; ++i)
      run_op(comm, c.op, b, total);
    t.call_us = clock.seconds() * 1e6 / c.iters;
  }
  if (!queueable(c.op, comm.size())) {
    t.queued_us = t.call_us;
    return t;
  }
  comm.barrier();
#if DDP_HAVE_CUDA
  cudaEvent_t start = nullptr, stop = nullptr;
  if (b.gpu()) {
    DDP_CHECK(cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess,
              "cudaEventCreate failed");
    cudaEventRecord(start, nullptr);  // the compute stream (the default one here)
  }
#endif
  Stopwatch clock;
  // Every Work is kept until the end: a host backend's pending transfer must outlive it.
  std::vector<std::unique_ptr<Work>> works;
  works.reserve(c.iters);
  for (int i = 0; i < c.iters; ++i)
    works.push_back(start_op(comm, c.op, b, total));
#if DDP_HAVE_CUDA
  if (b.gpu()) {
    works.back()->then_on(nullptr);  // one stream: the last one done means all are
    cudaEventRecord(stop, nullptr);
  }
#endif
  for (auto& work : works)
    work->wait(comm.timeout());
  t.queued_us = clock.seconds() * 1e6 / c.iters;
#if DDP_HAVE_CUDA
  if (b.gpu()) {
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    t.device_us = ms * 1e3 / c.iters;
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
#endif
  return t;
}

int bench(const BenchConfig& c, int argc, char** argv) {
  (void)argc;
  (void)argv;
  ProcessEnv env = ProcessEnv::detect();
  const bool gpu = c.device == "cuda";
  set_process_context({env.rank, env.world_size, c.device});
  if (gpu) {
    if (env.launcher == Launcher::kMpirun || env.launcher == Launcher::kSrun)
      narrow_visible_devices(&env);
    const DeviceInfo device = bind_device(env, {});
    if (env.rank == 0) std::fprintf(stderr, "# rank 0: %s\n", describe_phases(device).c_str());
  }
  std::shared_ptr<StoreClient> store;
  if (env.master_port > 0)
    store = std::make_shared<StoreClient>(env.master_addr, env.master_port, env.store_token, 30.0,
                                          40.0, env.run_id);
  CommConfig config;
  config.backend = c.backend;
  config.gpu = gpu;
  config.timeout_s = 120;
  auto comm = make_communicator(config, env, store);
  const int n = comm->size();
  const DeviceAllocator* window = c.symmetric ? &nccl_window_memory("--symmetric") : nullptr;
  nlohmann::json rows = nlohmann::json::array();
  if (comm->rank() == 0 && !c.json) {
    std::printf(
        "# ddpbench collectives: %s, backend %s, %d ranks, float32, %d iterations after %d "
        "warm-up%s\n",
        c.op.c_str(), comm->backend(), n, c.iters, c.warmup,
        c.symmetric ? ", buffers in NCCL symmetric windows" : "");
    std::printf(
        "# time: %d operations queued back to back, then one wait (as nccl-tests times them);\n"
        "# device: the same on the GPU, by events; call: each operation waited before the next\n"
        "# (what a caller that waits sees); bandwidths from time\n",
        c.iters);
    std::printf("# %12s %12s %10s %10s %10s %10s %10s %8s\n", "size(B)", "count", "time(us)",
                "device(us)", "call(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  }
  for (double bytes = double(c.min_bytes); bytes <= double(c.max_bytes); bytes *= c.factor) {
    size_t total = static_cast<size_t>(bytes) / 4;
    if (c.op == "all_gather" || c.op == "reduce_scatter")
      total = std::max<size_t>(total / n * n, size_t(n));
    total = std::max<size_t>(total, 1);
    Buffers buffers(total * 4, gpu, window);
    // Registered after the buffers, so undone before they are freed.
    std::vector<std::unique_ptr<Communicator::Window>> windows;
    if (window != nullptr)
      for (void* buffer : {buffers.send(), buffers.recv()})
        windows.push_back(comm->register_window(buffer, buffers.bytes()));
    const int64_t wrong = check_op(*comm, c.op, buffers, total);
    for (int i = 0; i < c.warmup; ++i)
      run_op(*comm, c.op, buffers, total);
    const Timings t = time_op(*comm, c, buffers, total);
    const double us = t.queued_us;
    const double algbw = total * 4.0 / (us * 1e3);
    // With one rank nothing crosses a bus: there is no bus bandwidth to report.
    const bool alone = n == 1;
    const double busbw = algbw * bus_factor(c.op, n);
    if (comm->rank() == 0) {
      if (c.json)
        rows.push_back(
            {{"op", c.op},
             {"backend", comm->backend()},
             {"ranks", n},
             {"bytes", total * 4},
             {"count", total},
             {"time_us", us},
             {"device_us", t.device_us > 0 ? nlohmann::json(t.device_us) : nlohmann::json(nullptr)},
             {"call_us", t.call_us},
             {"algbw_gbs", alone ? nlohmann::json(nullptr) : nlohmann::json(algbw)},
             {"busbw_gbs", alone ? nlohmann::json(nullptr) : nlohmann::json(busbw)},
             {"wrong", wrong},
             {"symmetric", c.symmetric}});
      else
        std::printf("  %12zu %12zu %10.1f %10s %10.1f %10s %10s %8lld\n", total * 4, total, us,
                    t.device_us > 0 ? fmt::format("{:.1f}", t.device_us).c_str() : "-", t.call_us,
                    alone ? "n/a" : fmt::format("{:.2f}", algbw).c_str(),
                    alone ? "n/a" : fmt::format("{:.2f}", busbw).c_str(),
                    static_cast<long long>(wrong));
      std::fflush(stdout);
    }
  }
  if (comm->rank() == 0 && c.json) std::printf("%s\n", rows.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  try {
    const std::string command = argc < 2 ? "" : argv[1];
    if (command == "--help" || command == "-h" || command == "help") {
      std::printf(
          "usage: ddpbench collectives [options]\n"
          "  collectives  bus bandwidth of all_reduce, all_gather, reduce_scatter, broadcast and\n"
          "               send/recv, like nccl-tests; run under ddprun or mpirun\n"
          "               (see ddpbench collectives --help)\n");
      return 0;
    }
    if (command != "collectives") {
      std::fprintf(stderr,
                   "ddpbench: error: %s; usage: ddpbench collectives [options] (see ddpbench "
                   "--help)\n",
                   command.empty() ? "no command" : ("unknown command '" + command + "'").c_str());
      return 2;
    }
    ddp::BenchConfig c;
    cxxopts::Options options("ddpbench collectives",
                             "Collective bandwidth, like nccl-tests; run under ddprun or mpirun.");
    // clang-format off
    options.add_options()
      ("op", "all_reduce | all_gather | reduce_scatter | broadcast | sendrecv", cxxopts::value<std::string>()->default_value(c.op))
      ("backend", "auto | nccl | gloo | mpi", cxxopts::value<std::string>()->default_value(backend_name(c.backend)))
      ("device", "cpu or cuda (buffers on the GPU)", cxxopts::value<std::string>()->default_value(c.device))
      ("min-bytes", "smallest size", cxxopts::value<size_t>()->default_value(std::to_string(c.min_bytes)))
      ("max-bytes", "largest size", cxxopts::value<size_t>()->default_value(std::to_string(c.max_bytes)))
      ("factor", "size multiplier", cxxopts::value<double>()->default_value("2"))
      ("iters", "timed iterations per size", cxxopts::value<int>()->default_value(std::to_string(c.iters)))
      ("warmup", "untimed iterations per size", cxxopts::value<int>()->default_value(std::to_string(c.warmup)))
      ("json", "print one JSON array instead of the table")
      ("symmetric", "cuda, nccl: both buffers from ncclMemAlloc, registered as symmetric windows (as nccl-tests -R 2), where NCCL may run its symmetric kernels")
      ("h,help", "print this help");
    // clang-format on
    auto result = options.parse(argc - 1, argv + 1);
    if (result.count("help")) {
      std::printf("%s\n", options.help().c_str());
      return 0;
    }
    c.op = result["op"].as<std::string>();
    const std::string backend = result["backend"].as<std::string>();
    const std::optional<ddp::Backend> named = ddp::backend_from_name(backend);
    if (!named)
      throw ddp::UsageError(fmt::format("--backend {}: expected auto, nccl, gloo or mpi", backend));
    c.backend = *named;
    c.device = result["device"].as<std::string>();
    c.min_bytes = result["min-bytes"].as<size_t>();
    c.max_bytes = result["max-bytes"].as<size_t>();
    c.factor = result["factor"].as<double>();
    c.iters = result["iters"].as<int>();
    c.warmup = result["warmup"].as<int>();
    c.json = result.count("json") > 0;
    c.symmetric = result.count("symmetric") > 0;
    DDP_USAGE_CHECK(
        c.op == "all_reduce" || c.op == "all_gather" || c.op == "reduce_scatter" ||
            c.op == "broadcast" || c.op == "sendrecv",
        "--op {}: expected all_reduce, all_gather, reduce_scatter, broadcast or sendrecv", c.op);
    DDP_USAGE_CHECK(c.device == "cpu" || c.device == "cuda", "--device {}: expected cpu or cuda",
                    c.device);
    DDP_USAGE_CHECK(!c.symmetric || (c.device == "cuda" && c.backend != ddp::Backend::kGloo &&
                                     c.backend != ddp::Backend::kMpi),
                    "--symmetric: NCCL's windows are GPU memory; use --device cuda with --backend "
                    "nccl (or auto)");
    DDP_USAGE_CHECK(c.factor > 1, "--factor {}: expected more than 1", c.factor);
    DDP_USAGE_CHECK(c.min_bytes >= 4 && c.min_bytes <= c.max_bytes,
                    "--min-bytes {}: expected 4 to --max-bytes {}", c.min_bytes, c.max_bytes);
    DDP_USAGE_CHECK(c.iters >= 1 && c.warmup >= 0,
                    "--iters {} --warmup {}: expected at least 1 and 0", c.iters, c.warmup);
    return ddp::bench(c, argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    std::fprintf(stderr, "ddpbench: error: %s\n", ddp::error_text(e).c_str());
    return 2;
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "ddpbench: error: %s\n", ddp::error_text(e).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddpbench: error: %s\n", ddp::error_text(e).c_str());
    return 1;
  }
}
