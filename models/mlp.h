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
  // The parameters of layers [first, end) in the flat buffer: where they start, how many.
  size_t params_offset(int first) const { return layers_[first].weight_offset; }
  size_t params_count(int first, int end) const {
    return layers_[end - 1].weight_offset + layers_[end - 1].count() - params_offset(first);
  }
  std::string to_string() const;  // "784,512,512,10"
  // A hash of the layer shapes, the same on every rank that holds the same model.
  uint64_t fingerprint() const;

 private:
  std::vector<int> widths_;
  std::vector<LayerSlice> layers_;
  size_t param_count_ = 0;
};

// Layers [first, end) of a model: what a pipeline stage is made of (on the CPU or the GPU)
// and where it sits: its widths and its part of the whole model's flat parameters. The
// whole model is the stage [0, layers).
class StageLayers {
 public:
  // Throws ddp::Error unless 0 <= first < end <= shape.num_layers().
  StageLayers(MlpShape shape, int first, int end);

  const MlpShape& shape() const { return shape_; }
  int first_layer() const { return first_; }
  int end_layer() const { return end_; }
  bool is_first() const { return first_ == 0; }
  bool is_last() const { return end_ == shape_.num_layers(); }
  int in_width() const { return shape_.widths()[first_]; }
  int out_width() const { return shape_.widths()[end_]; }
  // Where this stage's parameters start in the whole model's flat buffer, and how many.
  size_t param_offset() const { return shape_.params_offset(first_); }
  size_t param_count() const { return shape_.params_count(first_, end_); }

 protected:
  MlpShape shape_;
  int first_, end_;
};

// Parses "784,512,512,10"; throws UsageError naming `flag` on malformed input.
MlpShape parse_layers(const std::string& text, const std::string& flag = "--layers");

// Fills `params` (shape.param_count() elements) following torch.nn.Linear's default
// initialisation: weight and bias uniform in [-1/sqrt(in), 1/sqrt(in)], seeded.
void init_params(const MlpShape& shape, uint64_t seed, float* params);

}  // namespace ddp
