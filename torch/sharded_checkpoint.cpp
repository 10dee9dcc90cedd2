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
#include "torch/distributed_data_parallel.h"
#include "torch/pipeline.h"

// LibTorch's own CRC-32 (zlib's polynomial; header-only, used here alone): ddp::torch links no
// zlib. Last, as it defines byte-order macros.
#include <caffe2/serialize/crc_alt.h>

namespace ddp {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "ddp.sharded-checkpoint";
constexpr int kVersion = 1;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat:
      return "F32";
    case torch::kDouble:
      return "F64";
    case torch::kHalf:
      return "F16";
    case torch::kBFloat16:
      return "BF16";
    case torch::kLong:
      return "I64";
    case torch::kInt:
      return "I32";
    case torch::kShort:
      return "I16";
    case torch::kChar:
      return "I8";
    case torch::kByte:
      return "U8";
    case torch::kBool:
      return "BOOL";
    default:
      break;
  }
  throw UsageError(fmt::format("ddp::Checkpointer: a tensor of dtype {} (not a safetensors one)",
                               c10::toString(dtype)));
}

torch::ScalarType dtype_from(const std::string& name) {
  static const std::map<std::string, torch::ScalarType> known = {
      {"F32", torch::kFloat},     {"F64", torch::kDouble}, {"F16", torch::kHalf},
      {"BF16", torch::kBFloat16}, {"I64", torch::kLong},   {"I32", torch::kInt},
      {"I16", torch::kShort},     {"I8", torch::kChar},    {"U8", torch::kByte},
      {"BOOL", torch::kBool}};
  const auto it = known.find(name);
  DDP_USAGE_CHECK(it != known.end(), "ddp::Checkpointer: unknown dtype {} in the index", name);
  return it->second;
}

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape)
    n *= d;
  return n;
}

// A line to stderr (ddp::torch has no logger of its own: LibTorch's fmt shadows spdlog's).
void say(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
}

std::string step_folder(int64_t step) {
  return fmt::format("step-{:09d}", step);
}

// What a tensor of the checkpoint is on this rank: the part it writes or reads.
struct Part {
  std::string name;            // in the checkpoint
  std::vector<int64_t> shape;  // the whole tensor's
  torch::ScalarType dtype = torch::kFloat;
  int64_t offset = 0;    // this part's first element in the flattened whole
  torch::Tensor values;  // its elements (1-D): the live tensor's (a load writes them)
};

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

// What one rank writes in one save.
struct Snapshot {
  int64_t step = 0;
  int rank = 0, ranks = 1;
  std::string optimizer;                      // its kind
  std::map<std::string, std::string> values;  // the extras' values (rank 0's)
  std::vector<Part> parts;                    // host copies
};

std::string rank_file(int rank, int ranks) {
  return fmt::format("rank-{:05d}-of-{:05d}.safetensors", rank, ranks);
}

// Writes `path` whole and durably: a temporary file, fsync, rename.
void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  DDP_USAGE_CHECK(out != nullptr, "{}: cannot create ({})", tmp, std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), out) == text.size();
  ok = ok && std::fflush(out) == 0 && ::fsync(::fileno(out)) == 0;
  ok = std::fclose(out) == 0 && ok;
  if (!ok) {
    const int error = errno;
    std::remove(tmp.c_str());
    throw UsageError(fmt::format("{}: write failed ({}; disk full?)", tmp, std::strerror(error)));
  }
  DDP_USAGE_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "{}: cannot rename {} over it: {}",
                  path, tmp, std::strerror(errno));
}

void sync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DDP_USAGE_CHECK(in, "{}: cannot open ({})", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// This rank's file and its description (the pieces' keys, places and CRC-32s).
nlohmann::json write_rank(const std::string& folder, const Snapshot& s) {
  const std::string file = rank_file(s.rank, s.ranks);
  std::vector<TensorRef> refs;
  std::vector<std::string> keys;
  nlohmann::json pieces = nlohmann::json::array();
  for (const Part& part : s.parts) {
    const bool whole = part.offset == 0 && part.values.numel() == elements(part.shape);
    keys.push_back(whole ? part.name : fmt::format("{}@{}", part.name, part.offset));
    const size_t bytes = static_cast<size_t>(part.values.numel()) * part.values.element_size();
    refs.push_back({keys.back(), dtype_name(part.dtype),
                    whole ? part.shape : std::vector<int64_t>{part.values.numel()},
                    part.values.data_ptr(), bytes});
    pieces.push_back({{"name", part.name},
                      {"key", keys.back()},
                      {"dtype", dtype_name(part.dtype)},
                      {"shape", part.shape},
                      {"offset", part.offset},
                      {"numel", part.values.numel()},
                      {"crc32", crc32_fast(part.values.data_ptr(), bytes)}});
  }
  write_safetensors(folder + "/" + file, refs);
  nlohmann::json description = {{"file", file}, {"pieces", pieces}};
  if (s.rank == 0) {
    description["step"] = s.step;
    description["optimizer"] = s.optimizer;
    description["values"] = s.values;
  }
  write_text(fmt::format("{}/rank-{:05d}.json", folder, s.rank), description.dump());
  return description;
}

// Rank 0: the index from every rank's description, the folder renamed into place, `latest`
// replaced, the oldest beyond `keep` removed.
void commit(const std::string& dir, const std::string& folder, int ranks, int keep) {
  nlohmann::json index = {{"format", kFormat}, {"version", kVersion}, {"world_size", ranks}};
  nlohmann::json tensors = nlohmann::json::object(), weight_map = nlohmann::json::object();
  int64_t step = 0;
  for (int r = 0; r < ranks; ++r) {
    const nlohmann::json d =
        nlohmann::json::parse(read_text(fmt::format("{}/rank-{:05d}.json", folder, r)));
    if (r == 0) {
      step = d.at("step").get<int64_t>();
      index["step"] = step;
      index["optimizer"] = d.at("optimizer");
      index["metadata"] = d.at("values");
    }
    const std::string file = d.at("file").get<std::string>();
    for (const nlohmann::json& p : d.at("pieces")) {
      const std::string name = p.at("name").get<std::string>();
      nlohmann::json& t = tensors[name];
      if (t.is_null())
        t = {{"dtype", p.at("dtype")},
             {"shape", p.at("shape")},
             {"pieces", nlohmann::json::array()}};
      t["pieces"].push_back({{"file", file},
                             {"key", p.at("key")},
                             {"offset", p.at("offset")},
                             {"numel", p.at("numel")},
                             {"crc32", p.at("crc32")}});
      if (p.at("key") == name && name.rfind("optimizer.", 0) != 0 && name.rfind("extra.", 0) != 0)
        weight_map[name] = file;
    }
  }
  // Every tensor's pieces cover it exactly once.
  for (auto& [name, t] : tensors.items()) {
    auto& pieces = t["pieces"];
    std::sort(pieces.begin(), pieces.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a.at("offset").get<int64_t>() < b.at("offset").get<int64_t>();
    });
    int64_t at = 0;
    for (const nlohmann::json& p : pieces) {
      DDP_CHECK(p.at("offset").get<int64_t>() == at,
                "ddp::Checkpointer: tensor {}'s pieces leave a gap or overlap at element {}", name,
                at);
      at += p.at("numel").get<int64_t>();
    }
    DDP_CHECK(at == elements(t.at("shape").get<std::vector<int64_t>>()),
              "ddp::Checkpointer: tensor {}'s pieces hold {} of its elements", name, at);
  }
  index["tensors"] = tensors;
  index["weight_map"] = weight_map;
  write_text(folder + "/index.json", index.dump(1));
  for (int r = 0; r < ranks; ++r)  // their content is in the index now
    fs::remove(fmt::format("{}/rank-{:05d}.json", folder, r));
  sync_folder(folder);
  const fs::path final_path = fs::path(dir) / step_folder(step);
  if (fs::exists(final_path)) {  // the same step saved again: the older one goes
    const fs::path old = fs::path(dir) / ("." + step_folder(step) + ".old");
    fs::remove_all(old);
    fs::rename(final_path, old);
    fs::rename(folder, final_path);
    fs::remove_all(old);
  } else {
    fs::rename(folder, final_path);
  }
  sync_folder(dir);
  write_text(dir + "/latest", step_folder(step) + "\n");
  sync_folder(dir);
  // The newest `keep` stay.
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0 && name.size() == 14)
      complete.emplace_back(std::stoll(name.substr(5)), e.path());
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < complete.size(); ++i)
    if (complete[i].first != step) fs::remove_all(complete[i].second);
}

// A folder's index, checked.
nlohmann::json read_index(const std::string& folder) {
  const std::string path = folder + "/index.json";
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: not a checkpoint index ({})", path, e.what()));
  }
  DDP_USAGE_CHECK(index.value("format", "") == kFormat && index.value("version", 0) == kVersion,
                  "{}: not a ddp sharded checkpoint of version {} (format '{}', version {})", path,
                  kVersion, index.value("format", ""), index.value("version", 0));
  return index;
}

// The folder to load: `latest`'s, else the newest complete step folder; empty where none.
std::string newest_checkpoint(const std::string& dir) {
  std::ifstream latest(dir + "/latest");
  std::string name;
  if (latest && std::getline(latest, name) && !name.empty() &&
      fs::exists(fs::path(dir) / name / "index.json"))
    return (fs::path(dir) / name).string();
  std::vector<std::string> complete;
  if (fs::is_directory(dir))
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind("step-", 0) == 0 && fs::exists(e.path() / "index.json"))
        complete.push_back(e.path().string());
    }
  std::sort(complete.begin(), complete.end());
  if (!complete.empty() && !name.empty())
    say(fmt::format("ddp::Checkpointer: {}/latest names {}, which is not complete: loading {}", dir,
                    name, complete.back()));
  return complete.empty() ? std::string() : complete.back();
}

// Reads elements [offset, offset + count) of tensor `name` from the folder's pieces into `out`
// (a host tensor of `count` elements of the tensor's dtype), each piece read whole and checked.
class PieceReader {
 public:
  PieceReader(std::string folder, const nlohmann::json& index)
      : folder_(std::move(folder)), tensors_(index.at("tensors")) {}
  bool has(const std::string& name) const { return tensors_.contains(name); }
  // The tensor's dtype and shape in the checkpoint.
  std::pair<torch::ScalarType, std::vector<int64_t>> describe(const std::string& name) const {
    const nlohmann::json& t = tensors_.at(name);
    return {dtype_from(t.at("dtype").get<std::string>()),
            t.at("shape").get<std::vector<int64_t>>()};
  }
  void read(const std::string& name, int64_t offset, const torch::Tensor& out) {
    const int64_t count = out.numel(), end = offset + count;
    const size_t item = out.element_size();
    for (const nlohmann::json& p : tensors_.at(name).at("pieces")) {
      const int64_t from = p.at("offset").get<int64_t>(), n = p.at("numel").get<int64_t>();
      const int64_t lo = std::max(offset, from), hi = std::min(end, from + n);
      if (lo >= hi) continue;
      const std::string path = folder_ + "/" + p.at("file").get<std::string>();
      const std::string key = p.at("key").get<std::string>();
      auto& places = places_[path];
      if (places.empty()) places = read_safetensors_places(path);
      const auto place = places.find(key);
      DDP_USAGE_CHECK(place != places.end(), "{}: has no tensor {} (the index names it)", path,
                      key);
      DDP_USAGE_CHECK(place->second.end - place->second.begin == static_cast<uint64_t>(n) * item,
                      "{}: tensor {} holds {} bytes, the index says {} elements of {}", path, key,
                      place->second.end - place->second.begin, n, item);
      std::vector<char> bytes(static_cast<size_t>(n) * item);
      read_file_range(path, place->second.begin, bytes.size(), bytes.data());
      DDP_USAGE_CHECK(crc32_fast(bytes.data(), bytes.size()) == p.at("crc32").get<uint32_t>(),
                      "{}: tensor {}'s bytes do not match their checksum (a damaged file)", path,
                      key);
      std::memcpy(static_cast<char*>(out.data_ptr()) + (lo - offset) * item,
                  bytes.data() + (lo - from) * item, static_cast<size_t>(hi - lo) * item);
    }
  }

 private:
  std::string folder_;
  nlohmann::json tensors_;
  std::map<std::string, std::map<std::string, TensorPlace>> places_;
};

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
