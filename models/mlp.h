// The MLP's shape and its flat parameter layout: layer i owns weight [out, in] (row-major,
// as PyTorch stores nn.Linear.weight) followed by bias [out], layers one after another, so
// that parameters and gradients each live in one buffer and a range of it is a view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

struct LayerSlice {
  int in = 0;
  int out = 0;
  size_t weight_offset = 0;  // elements from the start of the flat buffer
  size_t bias_offset = 0;    // elements
  size_t count() const { return static_cast<size_t>(in) * out + out; }
};

class MlpShape {
 public:
  MlpShape() = default;
  // widths = {input, hidden..., classes}; at least two entries, each positive.
  explicit MlpShape(std::vector<int> widths);

  const std::vector<int>& widths() const { return widths_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const LayerSlice& layer(int i) const { return layers_[i]; }
  int input_width() const { return widths_.front(); }
  int num_classes() const { return widths_.back(); }
  int max_width() const;
  size_t param_count() const { return param_count_; }  // elements
  std::string to_string() const;                       // "784,512,512,10"
  // A hash of the layer shapes, the same on every rank that holds the same model.
  uint64_t fingerprint() const;

 private:
  std::vector<int> widths_;
  std::vector<LayerSlice> layers_;
  size_t param_count_ = 0;
};

// Parses "784,512,512,10"; throws UsageError naming `flag` on malformed input.
MlpShape parse_layers(const std::string& text, const std::string& flag = "--layers");

// Fills `params` (shape.param_count() elements) following torch.nn.Linear's default
// initialisation: weight and bias uniform in [-1/sqrt(in), 1/sqrt(in)], seeded.
void init_params(const MlpShape& shape, uint64_t seed, float* params);

}  // namespace ddp
