// The sharded checkpoint's folder (ddp::Checkpointer, torch/sharded_checkpoint.h): each rank's
// safetensors file and its pieces' description, the index rank 0 writes from them, the commit
// (a rename into place, `latest` replaced, the oldest removed) and the reader of pieces. What a
// rank saves and when is the checkpointer's; the bytes on disk and their checks are here.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/safetensors.h"

namespace ddp {
namespace checkpoint_folder {

constexpr const char* kFormat = "ddp.sharded-checkpoint";
constexpr int kVersion = 1;

// The safetensors name of a dtype ("F32"); UsageError for one safetensors lacks.
std::string dtype_name(torch::ScalarType dtype);

// The dtype of a safetensors name; UsageError naming an unknown one.
torch::ScalarType dtype_from(const std::string& name);

// The elements of a shape.
int64_t elements(const std::vector<int64_t>& shape);

// A line to stderr (ddp::torch has no logger of its own: LibTorch's fmt shadows spdlog's).
void say(const std::string& line);

// A complete checkpoint's folder name: "step-000000100".
std::string step_folder(int64_t step);

// What a tensor of the checkpoint is on this rank: the part it writes or reads.
struct Part {
  std::string name;            // in the checkpoint
  std::vector<int64_t> shape;  // the whole tensor's
  torch::ScalarType dtype = torch::kFloat;
  int64_t offset = 0;    // this part's first element in the flattened whole
  torch::Tensor values;  // its elements (1-D): the live tensor's (a load writes them)
};

// What one rank writes in one save.
struct Snapshot {
  int64_t step = 0;
  int rank = 0, ranks = 1;
  std::string optimizer;                      // its kind
  std::map<std::string, std::string> values;  // the extras' values (rank 0's)
  std::vector<Part> parts;                    // host copies
};

// A rank's file: "rank-00000-of-00002.safetensors".
std::string rank_file(int rank, int ranks);

// Writes `path` whole and durably: a temporary file, fsync, rename.
void write_text(const std::string& path, const std::string& text);

// A folder's entries made durable (fsync of the folder).
void sync_folder(const std::string& dir);

std::string read_text(const std::string& path);

// This rank's file and its description (the pieces' keys, places and CRC-32s).
nlohmann::json write_rank(const std::string& folder, const Snapshot& s);

// Rank 0: the index from every rank's description, the folder renamed into place, `latest`
// replaced, the oldest beyond `keep` removed.
void commit(const std::string& dir, const std::string& folder, int ranks, int keep);

// A folder's index, checked.
nlohmann::json read_index(const std::string& folder);

// The folder to load: `latest`'s, else the newest complete step folder; empty where none.
std::string newest_checkpoint(const std::string& dir);

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
  // Elements [offset, offset + out.numel()) of tensor `name` into `out` (a host tensor of its
  // dtype), each piece read whole and its CRC-32 checked.
  void read(const std::string& name, int64_t offset, const torch::Tensor& out);

 private:
  std::string folder_;
  nlohmann::json tensors_;
  std::map<std::string, std::map<std::string, TensorPlace>> places_;
};

}  // namespace checkpoint_folder
}  // namespace ddp
