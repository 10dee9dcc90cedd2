// ddp::Checkpointer: each rank's pieces copied to the host, written by a thread of its own into
// the save's temporary folder with a description of its pieces beside them (rank-R.json), then
// announced through the rendezvous store; rank 0's thread waits for every rank, writes the
// index, renames the folder into place and replaces `latest`, and announces the result, which
// every rank's thread waits for.
#include "torch/sharded_checkpoint.h"

#include <sys/stat.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include "dist/world.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"
#include "torch/checkpoint_folder.h"
#include "torch/distributed_data_parallel.h"
#include "torch/pipeline.h"

namespace ddp {

namespace fs = std::filesystem;
using namespace checkpoint_folder;  // NOLINT: the folder's parts, used throughout

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The optimizer's per-parameter state (SGD, Adam, AdamW): its kind and, for a parameter, each
// state tensor by name ("step" a 0-dim int64 tensor).
std::string optimizer_kind(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return "AdamW";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return "Adam";
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return "SGD";
  throw UsageError(
      "ddp::Checkpointer: saves the state of SGD, Adam and AdamW, not this optimizer's");
}

// The optimizer's state map's key for parameter `p` (a string in LibTorch 1.13, its address
// after).
template <typename Map>
typename Map::key_type state_key(const torch::Tensor& p) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

std::map<std::string, torch::Tensor> state_of(torch::optim::Optimizer& optimizer,
                                              const torch::Tensor& p) {
  auto& map = optimizer.state();
  const auto it = map.find(state_key<std::decay_t<decltype(map)>>(p));
  std::map<std::string, torch::Tensor> out;
  if (it == map.end()) return out;
  const auto put = [&out](const char* name, const torch::Tensor& t) {
    if (t.defined() && t.numel() > 0) out[name] = t;
  };
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(it->second.get())) {
    put("momentum_buffer", sgd->momentum_buffer());
  } else if (const auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get())) {
    out["step"] = torch::tensor(static_cast<int64_t>(w->step()), torch::kLong);
    put("exp_avg", w->exp_avg()), put("exp_avg_sq", w->exp_avg_sq());
    put("max_exp_avg_sq", w->max_exp_avg_sq());
  } else if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(it->second.get())) {
    out["step"] = torch::tensor(static_cast<int64_t>(a->step()), torch::kLong);
    put("exp_avg", a->exp_avg()), put("exp_avg_sq", a->exp_avg_sq());
    put("max_exp_avg_sq", a->max_exp_avg_sq());
  }
  return out;
}

// Sets parameter p's state from `loaded` (its tensors of p's stepping shape).
void set_state(torch::optim::Optimizer& optimizer, const std::string& kind, const torch::Tensor& p,
               std::map<std::string, torch::Tensor> loaded) {
  if (loaded.empty()) return;
  auto& map = optimizer.state();
  const auto key = state_key<std::decay_t<decltype(map)>>(p);
  const auto tensor = [&loaded](const char* name) {
    const auto it = loaded.find(name);
    return it == loaded.end() ? torch::Tensor() : it->second;
  };
  const int64_t step = loaded.count("step") ? loaded.at("step").item<int64_t>() : 0;
  if (kind == "SGD") {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(tensor("momentum_buffer"));
    map[key] = std::move(state);
  } else if (kind == "AdamW") {
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(step);
    state->exp_avg(tensor("exp_avg")), state->exp_avg_sq(tensor("exp_avg_sq"));
    if (tensor("max_exp_avg_sq").defined()) state->max_exp_avg_sq(tensor("max_exp_avg_sq"));
    map[key] = std::move(state);
  } else {
    auto state = std::make_unique<torch::optim::AdamParamState>();
    state->step(step);
    state->exp_avg(tensor("exp_avg")), state->exp_avg_sq(tensor("exp_avg_sq"));
    if (tensor("max_exp_avg_sq").defined()) state->max_exp_avg_sq(tensor("max_exp_avg_sq"));
    map[key] = std::move(state);
  }
}

// The parameters' shards of a module trained without the wrapper: whole, every rank the same,
// one of `ranks` writing each (spread by bytes).
std::vector<ParameterShard> whole_shards(torch::nn::Module& module, int rank, int ranks) {
  std::vector<ParameterShard> shards;
  std::vector<size_t> load(static_cast<size_t>(ranks), 0);
  for (const auto& item : module.named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    const auto least = std::min_element(load.begin(), load.end());
    *least += static_cast<size_t>(p.numel()) * p.element_size();
    shards.push_back({item.key(), p.sizes().vec(), p.scalar_type(), 0, p.detach().view(-1), p, true,
                      least - load.begin() == rank, p.sizes().vec()});
  }
  return shards;
}

// The module's tensors outside `shards` (buffers, frozen parameters), whole.
std::vector<Part> other_tensors(torch::nn::Module& module,
                                const std::vector<ParameterShard>& shards) {
  std::set<std::string> sharded;
  for (const ParameterShard& s : shards)
    sharded.insert(s.name);
  std::vector<Part> parts;
  for (const auto& item : module.named_parameters())
    if (!sharded.count(item.key()))
      parts.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type(), 0,
                       item.value().detach().reshape(-1)});
  for (const auto& item : module.named_buffers())
    parts.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type(), 0,
                     item.value().detach().reshape(-1)});
  return parts;
}

std::vector<Part> parts_of(const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::vector<Part> parts;
  for (const auto& [name, t] : tensors)
    parts.push_back({name, t.sizes().vec(), t.scalar_type(), 0, t.detach().reshape(-1)});
  return parts;
}

// The host copy of a piece (pinned for a GPU tensor), contiguous and 1-D: into `reuse` where it
// is one of the same size and kind (the staging kept from the last save), else new (and kept
// there where `reuse` is given).
torch::Tensor host_copy(const torch::Tensor& values, torch::Tensor* reuse) {
  const torch::Tensor flat = values.detach().reshape(-1);
  const bool pinned = flat.is_cuda();
  if (reuse && reuse->defined() && reuse->numel() == flat.numel() &&
      reuse->scalar_type() == flat.scalar_type() && reuse->is_pinned() == pinned) {
    reuse->copy_(flat);
    return *reuse;
  }
  torch::Tensor host =
      torch::empty({flat.numel()}, flat.options().device(torch::kCPU).pinned_memory(pinned));
  host.copy_(flat);
  if (reuse) *reuse = host;
  return host;
}

}  // namespace

// A save in flight when SIGTERM or SIGINT comes (ddprun's teardown, a scheduler's preemption,
// Ctrl-C): the handler says so and waits for it to be committed, then ends the process as the
// signal's previous disposition would. Only async-signal-safe calls in the handler.
std::atomic<bool> saving{false};
struct sigaction previous_action[2];
constexpr int kWaitingSignals[2] = {SIGTERM, SIGINT};

void wait_then_end(int signal) {
  if (saving.load()) {
    static const char line[] =
        "ddp::Checkpointer: a signal came while a checkpoint was being saved: waiting for the "
        "save to finish before ending\n";
    (void)!::write(2, line, sizeof(line) - 1);
    while (saving.load()) {
      const struct timespec pause = {0, 10 * 1000 * 1000};
      ::nanosleep(&pause, nullptr);
    }
  }
  ::sigaction(signal, &previous_action[signal == SIGTERM ? 0 : 1], nullptr);
  ::raise(signal);
}

void install_signal_wait() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    for (int k = 0; k < 2; ++k) {
      struct sigaction action {};
      action.sa_handler = wait_then_end;
      sigemptyset(&action.sa_mask);
      ::sigaction(kWaitingSignals[k], &action, &previous_action[k]);
    }
  });
}

struct Checkpointer::Impl {
  World& world;
  std::string dir;
  CheckpointerOptions options;
  std::unique_ptr<StoreClient> store;  // the main thread's
  int instance = 0;
  int saves = 0;
  std::thread writer;
  std::vector<torch::Tensor> staging;  // keep_staging: the last save's host copies
  std::string error;                   // the writer's failure
  int64_t in_flight_step = -1;
  double blocked_s = 0, written_s = 0;

  static int next_instance() {
    static std::atomic<int> count{0};
    return count++;
  }

  Impl(World& w, std::string d, CheckpointerOptions o)
      : world(w),
        dir(std::move(d)),
        options(o),
        store(w.connect_store()),
        instance(next_instance()) {
    DDP_USAGE_CHECK(!dir.empty(), "ddp::Checkpointer: the folder is empty");
    std::error_code ec;
    fs::create_directories(dir, ec);
    DDP_USAGE_CHECK(fs::is_directory(dir), "ddp::Checkpointer: {}: cannot create the folder ({})",
                    dir, ec.message());
  }

  void wait() {
    if (!writer.joinable()) return;
    const Clock::time_point start = Clock::now();
    writer.join();
    if (seconds_since(start) > 0.1)
      say(fmt::format("ddp::Checkpointer: waited {:.2f} s for the save of step {} to finish",
                      seconds_since(start), in_flight_step));
    in_flight_step = -1;
    if (!error.empty()) {
      const std::string e = std::move(error);
      error.clear();
      throw Error(e);
    }
  }

  // Collective: the save's temporary folder, named by rank 0 (which first removes what
  // earlier saves left unfinished) and told to the others through the store.
  std::string begin_save(int64_t step, const std::string& prefix) {
    const int rank = world.rank();
    std::string name;
    if (rank == 0) {
      for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (n.rfind(".step-", 0) == 0 && n.size() > 4 && n.substr(n.size() - 4) == ".tmp") {
          say(fmt::format("ddp::Checkpointer: removing {}, a save that did not finish",
                          e.path().string()));
          fs::remove_all(e.path());
        }
      }
      name = fmt::format(".{}.{}.tmp", step_folder(step),
                         std::chrono::system_clock::now().time_since_epoch().count());
      fs::create_directories(fs::path(dir) / name);
      if (store) store->set(prefix + "folder", name);
    } else {
      DDP_CHECK(store != nullptr, "ddp::Checkpointer: several ranks and no rendezvous store");
      name = store->wait_get(prefix + "folder", options.timeout_s());
    }
    return (fs::path(dir) / name).string();
  }

  void start(Snapshot snapshot, bool async) {
    wait();
    const std::string prefix = fmt::format("ddp.checkpoint.{}.{}.", instance, saves++);
    const std::string folder = begin_save(snapshot.step, prefix);
    in_flight_step = snapshot.step;
    const int ranks = snapshot.ranks;
    const int keep = options.keep();
    const double timeout = options.timeout_s();
    std::shared_ptr<StoreClient> own = world.connect_store();
    install_signal_wait();
    saving = true;
    writer = std::thread([this, snapshot = std::move(snapshot), folder, prefix, ranks, keep,
                          timeout, own, async]() mutable {
      {  // the signals are the main thread's to take (their handler waits for this thread)
        sigset_t signals;
        sigemptyset(&signals);
        for (const int signal : kWaitingSignals)
          sigaddset(&signals, signal);
        pthread_sigmask(SIG_BLOCK, &signals, nullptr);
      }
      const Clock::time_point start = Clock::now();
      try {
        std::string mine = "ok";
        try {
          write_rank(folder, snapshot);
        } catch (const std::exception& e) {
          mine = std::string("error: ") + e.what();
        }
        snapshot.parts.clear();  // the host copies go as soon as they are written
        std::string result = mine;
        if (own) own->set(prefix + "rank" + std::to_string(snapshot.rank), mine);
        if (snapshot.rank == 0) {
          std::vector<std::string> keys;
          for (int r = 0; r < ranks; ++r)
            keys.push_back(prefix + "rank" + std::to_string(r));
          if (own) own->wait(keys, timeout);
          for (int r = 0; r < ranks && own; ++r) {
            const std::string said = *own->get(keys[static_cast<size_t>(r)]);
            if (said != "ok" && result == "ok") result = fmt::format("rank {}: {}", r, said);
          }
          if (result == "ok") {
            try {
              commit(dir, folder, ranks, keep);
            } catch (const std::exception& e) {
              result = std::string("error: committing: ") + e.what();
            }
          }
          if (own) own->set(prefix + "result", result);
        } else if (own) {
          result = own->wait_get(prefix + "result", timeout);
        }
        if (result != "ok")
          error = fmt::format(
              "ddp::Checkpointer: the save of step {} into {} failed ({}); the "
              "previous checkpoint stays",
              snapshot.step, dir, result);
      } catch (const std::exception& e) {
        error = fmt::format(
            "ddp::Checkpointer: the save of step {} into {} failed ({}); the "
            "previous checkpoint stays",
            snapshot.step, dir, e.what());
      }
      written_s = seconds_since(start);
      if (!async) blocked_s += written_s;  // a save() blocks training until it is committed
      saving = false;
      if (error.empty() && snapshot.rank == 0)
        say(fmt::format(
            "ddp::Checkpointer: step {} saved in {} ({:.2f} s blocked, {:.2f} s written)",
            snapshot.step, dir, blocked_s, written_s));
    });
    if (!async) wait();
  }

  // This rank's parts of the parameters (`shards`), their optimizer state and the module's
  // other tensors and the extras, copied to the host.
  Snapshot snapshot(int64_t step, const std::vector<ParameterShard>& shards,
                    std::vector<Part> others, bool write_others, torch::optim::Optimizer& optimizer,
                    const CheckpointExtras& extras) {
    const Clock::time_point start = Clock::now();
    torch::NoGradGuard no_grad;
    size_t staged = 0;  // the host copies in order, each into its place of `staging`
    const auto stage = [this, &staged](const torch::Tensor& values) {
      if (!options.keep_staging()) return host_copy(values, nullptr);
      if (staged == staging.size()) staging.emplace_back();
      return host_copy(values, &staging[staged++]);
    };
    Snapshot s;
    s.step = step;
    s.rank = world.rank();
    s.ranks = world.size();
    s.optimizer = optimizer_kind(optimizer);
    s.values = extras.values;
    for (const ParameterShard& shard : shards) {
      if (!shard.writes || shard.values.numel() == 0) continue;
      s.parts.push_back({shard.name, shard.shape, shard.dtype, shard.offset, stage(shard.values)});
      for (const auto& [what, t] : state_of(optimizer, shard.parameter)) {
        const std::string name = "optimizer." + shard.name + "." + what;
        if (what == "step") {
          if (shard.offset == 0) s.parts.push_back({name, {}, torch::kLong, 0, stage(t)});
        } else {
          s.parts.push_back({name, shard.shape, t.scalar_type(), shard.offset, stage(t)});
        }
      }
    }
    if (write_others)
      for (Part& part : others) {
        part.values = stage(part.values);
        s.parts.push_back(std::move(part));
      }
    if (s.rank == 0) {
      for (const auto& [name, t] : extras.tensors)
        s.parts.push_back({"extra." + name, t.sizes().vec(), t.scalar_type(), 0, stage(t)});
    }
    blocked_s = seconds_since(start);
    return s;
  }

  // A save of `shards` and the other tensors: `module`'s outside them, or `others`; those
  // written by this rank where `write_others`.
  void save(int64_t step, const std::vector<ParameterShard>& shards, torch::nn::Module* module,
            std::vector<Part> others, bool write_others, torch::optim::Optimizer& optimizer,
            const CheckpointExtras& extras, bool async) {
    wait();
    if (module) others = other_tensors(*module, shards);
    start(snapshot(step, shards, std::move(others), write_others, optimizer, extras), async);
  }

  std::optional<LoadedCheckpoint> load(const std::vector<ParameterShard>& shards,
                                       const std::vector<Part>& others,
                                       torch::optim::Optimizer& optimizer) {
    wait();
    const std::string folder = newest_checkpoint(dir);
    if (folder.empty()) return std::nullopt;
    const nlohmann::json index = read_index(folder);
    const std::string kind = optimizer_kind(optimizer);
    DDP_USAGE_CHECK(index.value("optimizer", "") == kind,
                    "{}: a checkpoint of optimizer {}, loaded into a {}", folder,
                    index.value("optimizer", ""), kind);
    PieceReader reader(folder, index);
    torch::NoGradGuard no_grad;
    // Elements [offset, offset + values.numel()) of `name` into `values` (any device).
    const auto fill = [&](const std::string& name, const std::vector<int64_t>& shape,
                          torch::ScalarType dtype, int64_t offset, const torch::Tensor& values) {
      DDP_USAGE_CHECK(reader.has(name), "{}: holds no tensor {} (a checkpoint of another model?)",
                      folder, name);
      const auto [saved_dtype, saved_shape] = reader.describe(name);
      DDP_USAGE_CHECK(saved_shape == shape && saved_dtype == dtype,
                      "{}: tensor {} is {} {} there, {} {} here (a checkpoint of another model?)",
                      folder, name, dtype_name(saved_dtype), shape_text(saved_shape),
                      dtype_name(dtype), shape_text(shape));
      torch::Tensor host = torch::empty({values.numel()}, torch::TensorOptions().dtype(dtype));
      reader.read(name, offset, host);
      values.copy_(host.view(values.sizes()));
    };
    static const char* kStateTensors[] = {"momentum_buffer", "exp_avg", "exp_avg_sq",
                                          "max_exp_avg_sq"};
    for (const ParameterShard& shard : shards) {
      fill(shard.name, shard.shape, shard.dtype, shard.offset, shard.values);
      if (!shard.steps || shard.values.numel() == 0) continue;
      std::map<std::string, torch::Tensor> state;
      for (const char* what : kStateTensors) {
        const std::string name = "optimizer." + shard.name + "." + what;
        if (!reader.has(name)) continue;
        torch::Tensor t = torch::empty(shard.state_shape,
                                       shard.values.options().dtype(reader.describe(name).first));
        fill(name, shard.shape, t.scalar_type(), shard.offset, t.view(-1));
        state[what] = t;
      }
      const std::string step = "optimizer." + shard.name + ".step";
      if (reader.has(step)) {
        torch::Tensor t = torch::empty({}, torch::kLong);
        fill(step, {}, torch::kLong, 0, t);
        state["step"] = t;
      }
      set_state(optimizer, kind, shard.parameter, std::move(state));
    }
    for (const Part& part : others)
      fill(part.name, part.shape, part.dtype, 0, part.values);
    LoadedCheckpoint loaded;
    loaded.step = index.at("step").get<int64_t>();
    loaded.path = folder;
    const nlohmann::json metadata = index.value("metadata", nlohmann::json::object());
    for (const auto& [key, value] : metadata.items())
      loaded.extras.values[key] = value.get<std::string>();
    for (const auto& [name, t] : index.at("tensors").items()) {
      if (name.rfind("extra.", 0) != 0) continue;
      const auto [dtype, shape] = reader.describe(name);
      torch::Tensor host = torch::empty(shape, torch::TensorOptions().dtype(dtype));
      reader.read(name, 0, host.view(-1));
      loaded.extras.tensors[name.substr(6)] = host;
    }
    if (world.rank() == 0)
      say(fmt::format("ddp::Checkpointer: loaded step {} from {}", loaded.step, folder));
    return loaded;
  }
};

Checkpointer::Checkpointer(World& world, std::string dir, CheckpointerOptions options)
    : impl_(std::make_unique<Impl>(world, std::move(dir), options)) {}

Checkpointer::~Checkpointer() {
  try {
    impl_->wait();
  } catch (const std::exception& e) {
    say(fmt::format("{}", e.what()));
  }
}

void Checkpointer::save(int64_t step, DistributedDataParallel& model,
                        torch::optim::Optimizer& optimizer, const CheckpointExtras& extras) {
  impl_->save(step, model.parameter_shards(), &model.module(), {}, impl_->world.rank() == 0,
              optimizer, extras, false);
}

void Checkpointer::save(int64_t step, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                        const CheckpointExtras& extras) {
  impl_->save(step, whole_shards(module, impl_->world.rank(), impl_->world.size()), &module, {},
              impl_->world.rank() == 0, optimizer, extras, false);
}

void Checkpointer::save(int64_t step, Pipeline& pipe, torch::optim::Optimizer& optimizer,
                        const CheckpointExtras& extras) {
  impl_->save(step, pipe.parameter_shards(), nullptr, parts_of(pipe.other_tensors()),
              pipe.replica() == 0, optimizer, extras, false);
}

void Checkpointer::async_save(int64_t step, DistributedDataParallel& model,
                              torch::optim::Optimizer& optimizer, const CheckpointExtras& extras) {
  impl_->save(step, model.parameter_shards(), &model.module(), {}, impl_->world.rank() == 0,
              optimizer, extras, true);
}

void Checkpointer::async_save(int64_t step, torch::nn::Module& module,
                              torch::optim::Optimizer& optimizer, const CheckpointExtras& extras) {
  impl_->save(step, whole_shards(module, impl_->world.rank(), impl_->world.size()), &module, {},
              impl_->world.rank() == 0, optimizer, extras, true);
}

void Checkpointer::async_save(int64_t step, Pipeline& pipe, torch::optim::Optimizer& optimizer,
                              const CheckpointExtras& extras) {
  impl_->save(step, pipe.parameter_shards(), nullptr, parts_of(pipe.other_tensors()),
              pipe.replica() == 0, optimizer, extras, true);
}

void Checkpointer::wait() {
  impl_->wait();
}

std::optional<LoadedCheckpoint> Checkpointer::load(DistributedDataParallel& model,
                                                   torch::optim::Optimizer& optimizer) {
  const std::vector<ParameterShard> shards = model.parameter_shards();
  std::optional<LoadedCheckpoint> loaded =
      impl_->load(shards, other_tensors(model.module(), shards), optimizer);
  if (loaded) model.shards_written();
  return loaded;
}

std::optional<LoadedCheckpoint> Checkpointer::load(torch::nn::Module& module,
                                                   torch::optim::Optimizer& optimizer) {
  const std::vector<ParameterShard> shards =
      whole_shards(module, impl_->world.rank(), impl_->world.size());
  return impl_->load(shards, other_tensors(module, shards), optimizer);
}

std::optional<LoadedCheckpoint> Checkpointer::load(Pipeline& pipe,
                                                   torch::optim::Optimizer& optimizer) {
  std::optional<LoadedCheckpoint> loaded =
      impl_->load(pipe.parameter_shards(), parts_of(pipe.other_tensors()), optimizer);
  if (loaded) pipe.shards_written();
  return loaded;
}

double Checkpointer::last_blocked_s() const {
  return impl_->blocked_s;
}
double Checkpointer::last_written_s() const {
  return impl_->written_s;
}

}  // namespace ddp
