// One interface over NCCL (GPU buffers), Gloo (CPU buffers, TCP) and MPI (CPU buffers,
// under mpirun). Buffers are a pointer plus an element count (never bytes) and a data type.
// Every call is collective over the communicator's ranks: all of them must make the same
// calls in the same order with the same counts, or the call fails at its deadline with an
// error naming the operation, its sequence number, its size and, where the rendezvous
// store can tell, the ranks that never arrived.
//
// Completion: the blocking forms return when this rank's part is complete (host backends:
// the buffers are ready; NCCL: the work has finished on the device). The *_async forms
// return a Work to wait on; for NCCL the operation is queued on the communication stream
// after everything already queued on the compute stream (set_compute_stream), and
// Work::then_on(stream) makes a stream wait for it without blocking the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "collectives/backend.h"
#include "collectives/flight_recorder.h"
#include "runtime/device_allocator.h"

namespace ddp {

class StoreClient;
struct ProcessEnv;

// "what #sequence in group G did not complete: cause; rank(s) K never reached it" (the
// last part from the store: every stuck rank records its arrival and waits briefly for the
// others' records, as describe_stuck_operation does).
// `world_ranks` (empty: the group is the world, or its members' world ranks are unknown)
// names each missing rank as the launcher numbers it, with its rank in the group after it.
std::string describe_stuck_step(StoreClient* store, const std::string& group, int rank, int size,
                                const std::string& what, uint64_t sequence,
                                const std::string& cause, const std::vector<int>& world_ranks = {});

// The element types the collectives move.
enum class DataType { kFloat32, kBFloat16, kFloat64, kInt32, kInt64, kFloat16 };
// The bytes of one element of `type`.
size_t dtype_bytes(DataType type);

// A bfloat16 value as stored (its 16 bits), so that typed calls can tell it from an integer.
struct BFloat16 {
  uint16_t bits = 0;  ///< the value's upper 16 bits of float32
};
// An IEEE half (float16) value as stored (its 16 bits).
struct Float16 {
  uint16_t bits = 0;  ///< sign, 5 exponent bits, 10 mantissa bits
};
// The DataType of a C++ element type (float, double, int32_t, int64_t, BFloat16, Float16): typed
// calls take it from the pointer, so that a double* can never pass as float32.
template <typename T>
constexpr DataType data_type_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> ||
                    std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t> ||
                    std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>,
                "the collectives move float, double, int32_t, int64_t, BFloat16 and Float16 "
                "elements");
  if constexpr (std::is_same_v<T, float>) return DataType::kFloat32;
  if constexpr (std::is_same_v<T, double>) return DataType::kFloat64;
  if constexpr (std::is_same_v<T, int32_t>) return DataType::kInt32;
  if constexpr (std::is_same_v<T, int64_t>) return DataType::kInt64;
  if constexpr (std::is_same_v<T, Float16>) return DataType::kFloat16;
  return DataType::kBFloat16;
}
// "float32", "bfloat16", "float16", ... (for messages).
const char* dtype_name(DataType type);

// How a reduction combines the ranks' elements (kAverage: the sum divided by the ranks).
enum class ReduceOp { kSum, kAverage, kMax };
// "sum", "average", "max" (for messages).
const char* reduce_name(ReduceOp op);

// A pending operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until done or timeout_s passes; throws ddp::Error (with the operation, sequence
  // number, size and missing ranks) on timeout or failure.
  virtual void wait(double timeout_s) = 0;
  // NCCL: makes `stream` (a cudaStream_t) wait for the operation on the device; host
  // backends: wait(default timeout).
  virtual void then_on(void* stream) = 0;
  // Whether the operation has finished (then wait() returns at once, or throws its error).
  // Never blocks; callers poll it (a watchdog, an overlap that starts what depends on it).
  virtual bool is_completed() = 0;
};

// A group of ranks and its collectives (see the top of this file for the contract).
class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's index in the group, 0 to size() - 1.
  int rank() const { return rank_; }
  // The ranks in the group.
  int size() const { return size_; }
  // "nccl", "gloo", "mpi" or "self" (one process).
  virtual const char* backend() const = 0;
  // Whether buffers are device (GPU) memory.
  virtual bool device_buffers() const = 0;
  // Seconds a blocking call waits for the other ranks before it fails.
  double timeout() const { return timeout_s_; }
  // Sets timeout().
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  // NCCL: the stream that produces and consumes the buffers (a cudaStream_t); ignored by
  // host backends.
  virtual void set_compute_stream(void* stream) { (void)stream; }
  // The stream set_compute_stream set last (null: none, or a host backend).
  virtual void* compute_stream() const { return nullptr; }

  // In place: buffer[count] becomes the element-wise reduction over ranks.
  virtual std::unique_ptr<Work> all_reduce_async(void* buffer, size_t count, DataType type,
                                                 ReduceOp op) = 0;
  // all_reduce_async, waited for.
  void all_reduce(void* buffer, size_t count, DataType type, ReduceOp op) {
    all_reduce_async(buffer, count, type, op)->wait(timeout_s_);
  }
  // The same, typed: the element type from the pointer (float, double, int32_t, int64_t,
  // BFloat16).
  template <typename T>
  void all_reduce(T* buffer, size_t count, ReduceOp op) {
    all_reduce(static_cast<void*>(buffer), count, data_type_of<T>(), op);
  }
  // In place, float32 data reduced as bfloat16 (half the bytes on the wire, as PyTorch's
  // bf16_compress_hook): buffer[count] is rounded to bf16 into scratch[count], reduced
  // there, and written back as float32. scratch: count bf16 values (2 bytes each) in the
  // buffers' memory, untouched by the caller until the Work completes. kAverage divides each
  // rounded value by the ranks before the bf16 sum (NCCL's average pre-multiplies; PyTorch's
  // hook divides first). NCCL converts on its stream; the host backends (this default) round
  // on the caller's thread and write back when the Work is waited for or seen completed.
  // Device memory without NCCL throws UsageError naming the backend.
  virtual std::unique_ptr<Work> all_reduce_bf16_async(float* buffer, void* scratch, size_t count,
                                                      ReduceOp op);
  // reduce_scatter_async of float32 data reduced as bfloat16: send[size * count] rounded to
  // bf16 into scratch[size * count] (2 bytes each, in the buffers' memory, untouched until
  // the Work completes), reduce-scattered there, and block `rank` written to recv[count] as
  // float32. The backends of all_reduce_bf16_async, the same way.
  virtual std::unique_ptr<Work> reduce_scatter_bf16_async(const float* send, float* recv,
                                                          void* scratch, size_t count, ReduceOp op);
  // Whether the bf16 reductions are supported (host memory, or NCCL); and the UsageError naming
  // the backend when not.
  virtual bool reduces_bf16() const { return !device_buffers(); }
  // Throws that UsageError where reduces_bf16() is false.
  void require_bf16_reduction() const;

  // A registration of device memory with the communicator (NCCL's window), undone when
  // destroyed; it keeps the communicator's resources until then.
  class Window {
   public:
    virtual ~Window() = default;
  };
  // Collective (every rank, the same size): `bytes` at `buffer`, memory of
  // nccl_window_memory(), registered as a symmetric window, so that collectives over ranges at
  // the same offset on every rank may run NCCL's symmetric kernels (ranks of one host that
  // reach each other over NVLink; elsewhere NCCL registers it for its zero-copy paths only).
  // Those kernels only sum, so an average over a range of a window is a sum then a scaling by
  // 1 / size() (bitwise the average where size() is a power of two). A UsageError where the
  // backend has no windows.
  virtual std::unique_ptr<Window> register_window(void* buffer, size_t bytes);
  // In place: every rank's buffer[count] becomes root's. Every rank calls it; the buffer
  // must stay valid (and, off the root, unread) until the Work completes.
  virtual std::unique_ptr<Work> broadcast_async(void* buffer, size_t count, DataType type,
                                                int root) = 0;
  // broadcast_async, waited for.
  void broadcast(void* buffer, size_t count, DataType type, int root) {
    broadcast_async(buffer, count, type, root)->wait(timeout_s_);
  }
  // recv[size * count] holds every rank's send[count], in rank order (counts in elements).
  // Every rank calls it; both buffers stay valid until the Work completes.
  virtual std::unique_ptr<Work> all_gather_async(const void* send, void* recv, size_t count,
                                                 DataType type) = 0;
  // all_gather_async, waited for.
  void all_gather(const void* send, void* recv, size_t count, DataType type) {
    all_gather_async(send, recv, count, type)->wait(timeout_s_);
  }
  // send[size * count]: recv[count] becomes the reduction over ranks of block `rank` of send
  // (count: the elements of one block). Every rank calls it; both buffers stay valid until
  // the Work completes.
  virtual std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, size_t count,
                                                     DataType type, ReduceOp op) = 0;
  // reduce_scatter_async, waited for.
  void reduce_scatter(const void* send, void* recv, size_t count, DataType type, ReduceOp op) {
    reduce_scatter_async(send, recv, count, type, op)->wait(timeout_s_);
  }
  // Point to point: sends buffer[count] to rank `peer`, which must make the matching recv.
  virtual void send(const void* buffer, size_t count, DataType type, int peer) = 0;
  // Receives buffer[count] from rank `peer`, which must make the matching send.
  virtual void recv(void* buffer, size_t count, DataType type, int peer) = 0;
  // Sends send[count] to send_peer while receiving recv[count] from recv_peer, concurrently
  // (a ring step); every rank calls it. The default orders the two by rank parity.
  virtual void send_recv(const void* send_buffer, void* recv_buffer, size_t count, DataType type,
                         int send_peer, int recv_peer) {
    if (rank_ % 2 == 0) {
      send(send_buffer, count, type, send_peer);
      recv(recv_buffer, count, type, recv_peer);
    } else {
      recv(recv_buffer, count, type, recv_peer);
      send(send_buffer, count, type, send_peer);
    }
  }
  // Point to point, asynchronous and grouped (PyTorch's batch_isend_irecv): every send and
  // receive of `ops` is posted at once, so two ranks that each send to the other and
  // receive from it never wait on each other's order; the Work completes when all have. The
  // buffers must stay valid until then. Each peer must post the matching operations, in the
  // same order per pair of ranks. NCCL: one NCCL group on the communication stream.
  struct P2pOp {
    bool send = true;                    // a send (else a receive)
    void* buffer = nullptr;              // what is sent, or where it is received
    size_t count = 0;                    // elements
    DataType type = DataType::kFloat32;  // of the elements
    int peer = 0;                        // the other rank
  };
  // Posts every operation of `ops` at once (above).
  virtual std::unique_ptr<Work> batch_async(const std::vector<P2pOp>& ops) = 0;
  // One asynchronous send or receive (a batch of one): the Work completes when the buffer
  // may be reused (send) or holds the message (recv).
  std::unique_ptr<Work> isend(const void* buffer, size_t count, DataType type, int peer) {
    return batch_async({{true, const_cast<void*>(buffer), count, type, peer}});
  }
  // One asynchronous receive (a batch of one).
  std::unique_ptr<Work> irecv(void* buffer, size_t count, DataType type, int peer) {
    return batch_async({{false, buffer, count, type, peer}});
  }
  // Returns once every rank has called it.
  virtual void barrier() = 0;
  // Every rank calls; ranks with the same colour form a new communicator, ordered by key
  // then by rank. The parent stays usable.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Stops pending operations so that peers stop waiting (on fatal errors). Safe to call
  // from any thread and more than once; the backend's communicator is aborted once.
  virtual void abort() {}
  // The group's name in messages ("world0/split6c0"), where the backend names its groups.
  virtual std::string name() const { return {}; }
  // A message for work that never completed and that this rank cannot name by sequence
  // (e.g. a step replayed from a CUDA graph): `what` #`sequence` with `cause`, and, where
  // the store can tell, the ranks that never reached it. Every stuck rank should call it.
  virtual std::string describe_stuck(const std::string& what, uint64_t sequence,
                                     const std::string& cause) {
    return describe_stuck_step(nullptr, "world", rank_, size_, what, sequence, cause, world_ranks_);
  }

  // The sequence number of the last collective call (messages name operations by it).
  uint64_t sequence() const { return sequence_; }
  // The world rank of this group's rank `group_rank` (the group made by split), so that
  // messages can name a process as the launcher numbers it; -1 where the backend cannot
  // tell (NCCL sub-groups). The world is its own identity.
  int world_rank_of(int group_rank) const {
    if (world_ranks_.empty()) return is_world_ ? group_rank : -1;
    return group_rank >= 0 && group_rank < static_cast<int>(world_ranks_.size())
               ? world_ranks_[group_rank]
               : -1;
  }
  // Sets the world ranks of this group's members, in group-rank order (split() does).
  void set_world_ranks(std::vector<int> ranks) {
    world_ranks_ = std::move(ranks);
    is_world_ = false;
  }
  // A communicator from split() that cannot name its members' world ranks.
  void set_not_world() { is_world_ = false; }
  // Its last collectives, oldest first (the flight recorder: flight_recorder.h); recorded by
  // Gloo, MPI and NCCL (an NCCL call ends when a wait or a poll sees it end).
  std::vector<FlightEntry> flight_record() const { return flight_->entries(); }
  // Every collective since it was made, by kind (recorded as flight_record()'s).
  std::map<std::string, OpTraffic> traffic() const { return flight_->totals(); }
  // The bytes its collectives so far put on each rank's links, as nccl-tests counts a ring's
  // (bus bytes): all_reduce 2(n-1)/n of the buffer, all_gather and reduce_scatter (n-1) pieces,
  // broadcast the buffer.
  uint64_t bus_bytes() const;

 protected:
  // A backend's group: this rank's index and the group's size.
  Communicator(int rank, int size) : rank_(rank), size_(size) {}
  // The next operation's sequence number (every collective call takes one).
  uint64_t next_sequence() { return ++sequence_; }
  // Point-to-point calls (send, recv, batch_async) are numbered apart: only some ranks make
  // them, so they must not shift the collectives' numbers, which every rank must agree on
  // (Gloo's tags, the stuck-rank records). They are described by their peers
  // (describe_stuck_p2p).
  uint64_t next_p2p_sequence() { return ++p2p_sequence_; }

  int rank_;                      // rank()
  int size_;                      // size()
  double timeout_s_ = 300.0;      // timeout()
  uint64_t sequence_ = 0;         // sequence()
  uint64_t p2p_sequence_ = 0;     // the last point-to-point call's number
  std::vector<int> world_ranks_;  // empty: the world itself, or unknown (is_world_ false)
  bool is_world_ = true;          // the group is the world (its ranks are world ranks)
  // flight_record()'s ring, shared with the backends' pending work
  std::shared_ptr<FlightRecorder> flight_ = std::make_shared<FlightRecorder>();
};

// A device communicator's compute stream set for the guard's life, the previous one given back
// at its end, so that a library's collectives leave alone the stream the communicator's other
// users set (ddp::DistributedDataParallel on the world communicator). Nothing on a host one.
class ComputeStreamGuard {
 public:
  // Sets `stream` as `comm`'s compute stream.
  ComputeStreamGuard(Communicator& comm, void* stream)
      : comm_(comm), previous_(comm.compute_stream()) {
    if (comm_.device_buffers()) comm_.set_compute_stream(stream);
  }
  // Gives the previous stream back.
  ~ComputeStreamGuard() {
    if (comm_.device_buffers()) comm_.set_compute_stream(previous_);
  }
  ComputeStreamGuard(const ComputeStreamGuard&) = delete;
  ComputeStreamGuard& operator=(const ComputeStreamGuard&) = delete;

 private:
  Communicator& comm_;
  void* previous_;
};

// Which backend to use (backend.h): auto = NCCL with GPUs, else Gloo, else MPI under mpirun.
struct CommConfig {
  Backend backend = Backend::kAuto;  // which one (kAuto: as above)
  double timeout_s = 300.0;          // Communicator::timeout() of the communicator made
  bool gpu = false;                  // buffers on the GPU (the process has bound its device)
};

// Makes the world communicator. Collective over the job (every rank calls). The backend
// names one that this build lacks -> UsageError saying so. `store` may be null under mpirun.
std::unique_ptr<Communicator> make_communicator(const CommConfig& config, const ProcessEnv& env,
                                                std::shared_ptr<StoreClient> store);

// A communicator that may still be starting: calling it waits and returns it (once).
// Dropping it uncalled abandons the start without waiting.
using CommunicatorStart = std::function<std::unique_ptr<Communicator>()>;
// As make_communicator, but NCCL's initialisation (hundreds of milliseconds) goes on while
// the caller does other work (builds its model); the other backends start at once.
CommunicatorStart start_communicator(const CommConfig& config, const ProcessEnv& env,
                                     std::shared_ptr<StoreClient> store);

// A view of a device communicator (NCCL) that takes host buffers: each call is staged
// through a device buffer and waited for. For bookkeeping (sums of figures, a stage's
// weights gathered for a checkpoint), never for training data. UsageError in a build
// without NCCL.
std::unique_ptr<Communicator> make_host_staged(Communicator& device_comm);

// What this build has: "nccl gloo mpi" (for --version and ddpdoctor).
std::string built_backends();
// The NCCL library's version ("2.28.3"), or "" without NCCL.
std::string nccl_version();
// NCCL's allocator (ncclMemAlloc: memory that Communicator::register_window takes); a UsageError
// naming `what` (a flag) without NCCL or with an NCCL older than 2.27 (no windows).
const DeviceAllocator& nccl_window_memory(const char* what);

// Describes a point-to-point operation that did not complete, naming what it moved and the
// peers: "recv of 48 x float32 (192 bytes) from rank 1 (point-to-point #12 in group G) did
// not complete: CAUSE; the peer (rank 1 of that group) is stopped, dead or behind". Ranks
// are the group's (in a pipeline group, the stage). Only the peers take
// part, so no store record says more. Pure.
// `comm` (may be null) names the peers' world ranks where it knows them.
std::string describe_stuck_p2p(const std::string& group, uint64_t sequence,
                               const std::vector<Communicator::P2pOp>& ops,
                               const std::string& cause, const Communicator* comm = nullptr);

// Describes a timed-out or failed operation and asks the store which ranks never reached
// it: every rank that times out records its arrival under (group, sequence), waits a little
// for the others', and names the ranks whose record is missing. Used by every backend.
// Each stuck rank records what it called (the op, elements and type), so that ranks whose calls
// at one sequence number differ are named with both calls, and what it is stuck in, so that a
// rank that never reached the call is named with the one it waits in, where it waits in one of
// this group. `flight` (may be null): this rank's calls before it are named too.
std::string describe_stuck_operation(StoreClient* store, const std::string& group, int rank,
                                     int size, uint64_t sequence, const char* op, size_t count,
                                     DataType type, const std::string& cause,
                                     const std::vector<int>& world_ranks = {},
                                     const FlightRecorder* flight = nullptr);
// "3 (rank 1 of group G), 5 (rank 2 of group G)" for group ranks {1, 2} of a group whose
// members are world ranks `world_ranks`; "1, 2" when `world_ranks` is empty. Pure.
std::string name_ranks(const std::vector<int>& group_ranks, const std::vector<int>& world_ranks,
                       const std::string& group);

// Sums `count` doubles in host memory over the group, in place; null or a group of one
// leaves them. Needs a host communicator (a device one is an error). Collective.
void sum_over_ranks(Communicator* comm, double* values, size_t count);

}  // namespace ddp
