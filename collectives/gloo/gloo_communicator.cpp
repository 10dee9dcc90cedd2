// GlooCommunicator: every operation runs on the communicator's operation thread with a tag
// equal to its sequence number and Gloo's own timeout set to our deadline.
#include "collectives/gloo/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "collectives/host_reduce.h"
#include "collectives/host_work.h"
#include "runtime/error.h"
#include "runtime/store.h"

namespace ddp {
namespace {

// Gloo's Store interface over our store client, under a key prefix.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<StoreClient> store, std::string prefix, double timeout_s)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_s_(timeout_s) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string value = store_->wait_get(prefix_ + key, timeout_s_);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000)));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    for (const std::string& key : keys)
      prefixed.push_back(prefix_ + key);
    store_->wait(prefixed, timeout.count() / 1000.0);
  }

 private:
  std::shared_ptr<StoreClient> store_;
  std::string prefix_;
  double timeout_s_;
};

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// The tag of collective call `sequence`: its number and a hash of what it is (the op, elements
// and type), so that ranks whose calls at one number differ never exchange a byte (Gloo's
// transport would end the process from its own thread on a message longer than the one posted:
// "op.preamble.length <= op.nbytes") and both wait to the deadline, where each names its call
// and the others' (describe_stuck_operation). 20 bits of number, 12 of hash: calls 2^20 apart
// never run at once (one queue runs them in turn).
uint32_t call_tag(uint64_t sequence, const char* op, size_t count, DataType type) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  const auto mix = [&hash](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8)
      hash = (hash ^ (v & 0xff)) * 1099511628211ull;
  };
  for (const char* c = op; *c != '\0'; ++c)
    mix(static_cast<unsigned char>(*c));
  mix(count);
  mix(static_cast<uint64_t>(type));
  return static_cast<uint32_t>(((sequence & 0xFFFFF) << 12) | (hash & 0xFFF));
}

// The slot of the n-th message from `sender` to `receiver`: each direction of each pair
// counts its own messages, so sends and receives match whatever order a rank posts them in
// (only messages in one direction must keep their order). Apart from the collectives'
// slots, which are 32-bit tags (call_tag).
uint64_t message_slot(int sender, int receiver, uint64_t n) {
  return (uint64_t{1} << 62) | (static_cast<uint64_t>(sender) << 42) |
         (static_cast<uint64_t>(receiver) << 22) | (n & 0x3FFFFF);
}

// The unbound buffers of one batch_async, waited for together.
class GlooBatchWork final : public Work {
 public:
  explicit GlooBatchWork(std::function<std::string(const std::string&)> describe)
      : describe_(std::move(describe)) {}
  void add(std::unique_ptr<gloo::transport::UnboundBuffer> buffer, bool send) {
    buffers_.push_back({std::move(buffer), send});
  }
  void wait(double timeout_s) override {
    for (auto& [buffer, send] : buffers_) {
      bool done = false;
      try {
        const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
        done = send ? buffer->waitSend(timeout) : buffer->waitRecv(timeout);
      } catch (const std::exception& e) {
        throw Error(describe_(e.what()));
      }
      if (!done)
        throw Error(describe_(fmt::format("no completion within the {:.1f}s deadline", timeout_s)));
    }
    buffers_.clear();
  }
  void then_on(void*) override { wait(300.0); }
  bool is_completed() override {
    // A wait of no time: a buffer that has completed is taken off the list; one that has
    // not (Gloo throws on the timeout) stays for wait() to report.
    for (auto it = buffers_.begin(); it != buffers_.end();) {
      bool done = false;
      try {
        done = it->second ? it->first->waitSend(std::chrono::milliseconds(0))
                          : it->first->waitRecv(std::chrono::milliseconds(0));
      } catch (const std::exception&) {
        done = false;
      }
      if (!done) return false;
      it = buffers_.erase(it);
    }
    return true;
  }

 private:
  std::vector<std::pair<std::unique_ptr<gloo::transport::UnboundBuffer>, bool>> buffers_;
  std::function<std::string(const std::string&)> describe_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, int size, std::shared_ptr<StoreClient> store, std::string prefix,
                   double timeout_s, std::string hostname)
      : Communicator(rank, size),
        store_(std::move(store)),
        prefix_(std::move(prefix)),
        hostname_(std::move(hostname)) {
    timeout_s_ = timeout_s;
    gloo::transport::tcp::attr attr;
    // "iface:NAME" (GLOO_SOCKET_IFNAME, ddprun --iface): listen on that interface's address.
    if (hostname_.rfind("iface:", 0) == 0)
      attr.iface = hostname_.substr(6);
    else
      attr.hostname = hostname_;
    device_ = gloo::transport::tcp::CreateDevice(attr);
    context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context_->setTimeout(ms(timeout_s));
    GlooStore adapter(store_, prefix_, timeout_s);
    try {
      context_->connectFullMesh(adapter, device_);
    } catch (const std::exception& e) {
      throw Error(fmt::format("gloo: rank {} of {} could not connect to its peers under {}: {}",
                              rank, size, prefix_, e.what()));
    }
    queue_ = std::make_unique<OperationQueue>();
  }
  ~GlooCommunicator() override { queue_.reset(); }

  const char* backend() const override { return "gloo"; }
  bool device_buffers() const override { return false; }

  std::unique_ptr<Work> all_reduce_async(void* buffer, size_t count, DataType type,
                                         ReduceOp op) override {
    const uint64_t seq = next_sequence();
    return submit(
        [this, buffer, count, type, op, seq] {
          all_reduce_now(buffer, count, type, op, call_tag(seq, "all_reduce", count, type));
        },
        seq, "all_reduce", count, type);
  }

  std::unique_ptr<Work> broadcast_async(void* buffer, size_t count, DataType type,
                                        int root) override {
    check_rank(root, "broadcast root");
    const uint64_t seq = next_sequence();
    return submit(
        [=] {
          if (count == 0 || size_ == 1) return;
          gloo::BroadcastOptions opts(context_);
          opts.setTag(call_tag(seq, "broadcast", count, type));
          opts.setTimeout(ms(timeout_s_));
          opts.setRoot(root);
          opts.setOutput(static_cast<char*>(buffer), count * dtype_bytes(type));
          gloo::broadcast(opts);
        },
        seq, "broadcast", count, type);
  }

  std::unique_ptr<Work> all_gather_async(const void* send, void* recv, size_t count,
                                         DataType type) override {
    const uint64_t seq = next_sequence();
    return submit(
        [=] {
          const size_t bytes = count * dtype_bytes(type);
          if (bytes == 0) return;
          if (size_ == 1) {
            std::memcpy(recv, send, bytes);
            return;
          }
          gloo::AllgatherOptions opts(context_);
          opts.setTag(call_tag(seq, "all_gather", count, type));
          opts.setTimeout(ms(timeout_s_));
          opts.setInput(const_cast<char*>(static_cast<const char*>(send)), bytes);
          opts.setOutput(static_cast<char*>(recv), bytes * size_);
          gloo::allgather(opts);
        },
        seq, "all_gather", count, type);
  }

  std::unique_ptr<Work> reduce_scatter_async(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp op) override {
    // The copy is taken now, so `send` may change once the call returns.
    const size_t bytes = count * dtype_bytes(type);
    auto whole = std::make_shared<std::vector<char>>(
        static_cast<const char*>(send), static_cast<const char*>(send) + bytes * size_);
    const uint64_t seq = next_sequence();
    return submit(
        [=] {
          reduce_scatter_now(whole->data(), recv, count, type, op,
                             call_tag(seq, "reduce_scatter", count, type));
        },
        seq, "reduce_scatter", count, type);
  }

  void send(const void* buffer, size_t count, DataType type, int peer) override {
    check_rank(peer, "send peer");
    const uint64_t seq = next_p2p_sequence();
    const uint64_t slot = message_slot(rank_, peer, sent_[peer]++);
    submit(
        [=] {
          if (count == 0) return;
          auto buf =
              context_->createUnboundBuffer(const_cast<void*>(buffer), count * dtype_bytes(type));
          buf->send(peer, slot);
          if (!buf->waitSend(ms(timeout_s_))) throw Error("send timed out");
        },
        seq, {{true, const_cast<void*>(buffer), count, type, peer}})
        ->wait(timeout_s_);
  }

  void recv(void* buffer, size_t count, DataType type, int peer) override {
    check_rank(peer, "recv peer");
    const uint64_t seq = next_p2p_sequence();
    const uint64_t slot = message_slot(peer, rank_, received_[peer]++);
    submit(
        [=] {
          if (count == 0) return;
          auto buf = context_->createUnboundBuffer(buffer, count * dtype_bytes(type));
          buf->recv(peer, slot);
          if (!buf->waitRecv(ms(timeout_s_))) throw Error("recv timed out");
        },
        seq, {{false, buffer, count, type, peer}})
        ->wait(timeout_s_);
  }

  // Posted on the caller's thread (Gloo's unbound buffers are asynchronous), not queued
  // behind the worker thread's collectives: a batch completes whatever order the peers
  // post theirs in.
  std::unique_ptr<Work> batch_async(const std::vector<P2pOp>& ops) override {
    const uint64_t seq = next_p2p_sequence();
    auto work = std::make_unique<GlooBatchWork>([this, seq, ops](const std::string& cause) {
      return describe_stuck_p2p(prefix_, seq, ops, cause, this);
    });
    for (const P2pOp& op : ops) {
      check_rank(op.peer, op.send ? "batch_async send peer" : "batch_async recv peer");
      const uint64_t slot = op.send ? message_slot(rank_, op.peer, sent_[op.peer]++)
                                    : message_slot(op.peer, rank_, received_[op.peer]++);
      if (op.count == 0) continue;
      auto buffer = context_->createUnboundBuffer(op.buffer, op.count * dtype_bytes(op.type));
      if (op.send)
        buffer->send(op.peer, slot);
      else
        buffer->recv(op.peer, slot);
      work->add(std::move(buffer), op.send);
    }
    return work;
  }

  void barrier() override {
    const uint64_t seq = next_sequence();
    submit(
        [=] {
          gloo::BarrierOptions opts(context_);
          opts.setTag(call_tag(seq, "barrier", 0, DataType::kFloat32));
          opts.setTimeout(ms(timeout_s_));
          gloo::barrier(opts);
        },
        seq, "barrier", 0, DataType::kFloat32)
        ->wait(timeout_s_);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    const uint64_t seq = next_sequence();
    const std::string base = fmt::format("{}split{}/", prefix_, seq);
    store_->set(base + std::to_string(rank_), fmt::format("{} {}", color, key));
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r)
      keys.push_back(base + std::to_string(r));
    store_->wait(keys, timeout_s_);
    std::vector<std::tuple<int, int>> members;  // (key, rank) of ranks with my colour
    for (int r = 0; r < size_; ++r) {
      int c = 0, k = 0;
      std::sscanf(store_->get(keys[r]).value_or("0 0").c_str(), "%d %d", &c, &k);
      if (c == color) members.emplace_back(k, r);
    }
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    for (size_t i = 0; i < members.size(); ++i)
      if (std::get<1>(members[i]) == rank_) new_rank = static_cast<int>(i);
    auto child = std::make_unique<GlooCommunicator>(new_rank, static_cast<int>(members.size()),
                                                    store_, fmt::format("{}c{}/", base, color),
                                                    timeout_s_, hostname_);
    std::vector<int> world;
    for (const auto& member : members)
      world.push_back(world_rank_of(std::get<1>(member)));
    child->set_world_ranks(std::move(world));
    return child;
  }

 private:
  void check_rank(int peer, const char* what) const {
    DDP_CHECK(peer >= 0 && peer < size_, "{} {} outside [0, {})", what, peer, size_);
  }

  // The reductions below run on the queue's thread (tag `seq`) and combine every element in
  // rank order (reduce_blocks_in_order), never in a ring's order: a ring adds an element's
  // values starting from the rank that owns its chunk, so the same gradient summed in buckets
  // of other lengths (ZeRO 3's one bucket a layer, or another --bucket-mb) would round
  // differently with 3 or more ranks. The bytes on the wire are a ring's: (n-1)/n of the
  // buffer in the all-to-all and again in the all-gather.

  // Rank r's block i (`count` elements) goes to rank i, which combines the n blocks it
  // receives in rank order into `recv`.
  void reduce_scatter_now(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                          uint32_t tag) {
    const size_t bytes = count * dtype_bytes(type);
    if (bytes == 0) return;
    if (size_ == 1) {
      std::memcpy(recv, send, bytes);
      return;
    }
    char* blocks = scratch(blocks_, bytes * size_);
    gloo::AlltoallOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(ms(timeout_s_));
    opts.setInput(const_cast<char*>(static_cast<const char*>(send)), bytes * size_);
    opts.setOutput(blocks, bytes * size_);
    gloo::alltoall(opts);
    reduce_blocks_in_order(recv, blocks, size_, count, type, op);
  }

  // The buffer padded to n equal pieces, reduce-scattered, and the pieces gathered back.
  void all_reduce_now(void* buffer, size_t count, DataType type, ReduceOp op, uint32_t tag) {
    if (count == 0 || size_ == 1) {
      if (op == ReduceOp::kAverage && size_ > 1) scale_by(buffer, count, type, size_);
      return;
    }
    const size_t element = dtype_bytes(type);
    const size_t piece = (count + size_ - 1) / size_;
    const size_t padded = piece * size_ * element;
    char* whole = scratch(whole_, padded);
    std::memcpy(whole, buffer, count * element);
    std::memset(whole + count * element, 0, padded - count * element);
    char* mine = scratch(mine_, piece * element);
    reduce_scatter_now(whole, mine, piece, type, op, tag);
    gloo::AllgatherOptions opts(context_);
    opts.setTag(tag);
    opts.setTimeout(ms(timeout_s_));
    opts.setInput(mine, piece * element);
    opts.setOutput(whole, padded);
    gloo::allgather(opts);
    std::memcpy(buffer, whole, count * element);
  }

  // `kept`, at least `bytes` long: the operations' scratch, kept from one to the next (a fresh
  // buffer a call cost a bucket's page faults and zeroing each time; the queue runs one
  // operation at a time, so one set serves them all).
  static char* scratch(std::vector<char>& kept, size_t bytes) {
    if (kept.size() < bytes) kept.resize(bytes);
    return kept.data();
  }

  std::unique_ptr<Work> submit(std::function<void()> run, uint64_t seq, const char* op,
                               size_t count, DataType type) {
    auto describe = [this, seq, op, count, type](const std::string& cause) {
      return describe_stuck_operation(store_.get(), prefix_, rank_, size_, seq, op, count, type,
                                      cause, world_ranks_, flight_.get());
    };
    flight_->started(seq, op, count, type);
    auto recorded = [flight = flight_, seq, run = std::move(run)] {
      try {
        run();
      } catch (...) {
        flight->ended(seq, false);
        throw;
      }
      flight->ended(seq, true);
    };
    return std::make_unique<HostWork>(queue_->submit(std::move(recorded)), describe);
  }
  // Point to point: the description names the peer instead of asking the store.
  std::unique_ptr<Work> submit(std::function<void()> run, uint64_t seq, std::vector<P2pOp> ops) {
    auto describe = [this, seq, ops](const std::string& cause) {
      return describe_stuck_p2p(prefix_, seq, ops, cause, this);
    };
    return std::make_unique<HostWork>(queue_->submit(std::move(run)), describe);
  }

  std::shared_ptr<StoreClient> store_;
  std::string prefix_;
  std::string hostname_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::map<int, uint64_t> sent_;             // messages sent to each peer (point to point)
  std::map<int, uint64_t> received_;         // messages received from each peer
  std::vector<char> whole_, mine_, blocks_;  // all_reduce_now's and reduce_scatter_now's scratch
  std::unique_ptr<OperationQueue> queue_;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(int rank, int size,
                                                     std::shared_ptr<StoreClient> store,
                                                     const std::string& prefix, double timeout_s,
                                                     const std::string& hostname) {
  DDP_USAGE_CHECK(store != nullptr,
                  "--backend gloo needs the rendezvous store (start the job with ddprun)");
  return std::make_unique<GlooCommunicator>(rank, size, std::move(store), prefix, timeout_s,
                                            hostname);
}

}  // namespace ddp
