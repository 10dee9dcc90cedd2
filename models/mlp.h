// The MLP's shape and its flat parameter layout: layer i owns weight [out, in] (row-major,
// as PyTorch stores nn.Linear.weight) followed by bias [out], layers one after another, so
// that parameters and gradients each live in one buffer and a range of it is a view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/param_span.h"

namespace ddp {

// One layer's shape and where its parameters are in the flat buffer.
struct LayerSlice {
  int in = 0;                // input features
  int out = 0;               // output features
  size_t weight_offset = 0;  // elements from the start of the flat buffer
  size_t bias_offset = 0;    // elements
  // Its parameters: in x out weights and out biases.
  size_t count() const { return static_cast<size_t>(in) * out + out; }
};

// An MLP's widths and the layout of its parameters (above).
class MlpShape {
 public:
  MlpShape() = default;
  // widths = {input, hidden..., classes}; at least two entries, each positive.
  explicit MlpShape(std::vector<int> widths);

  // {input, hidden..., classes}, as given.
  const std::vector<int>& widths() const { return widths_; }
  // The Linear layers: widths().size() - 1.
  int num_layers() const { return static_cast<int>(layers_.size()); }
  // Layer i (0 <= i < num_layers()).
  const LayerSlice& layer(int i) const { return layers_[i]; }
  // The features of a sample.
  int input_width() const { return widths_.front(); }
  // The classes (the last layer's outputs).
  int num_classes() const { return widths_.back(); }
  // The widest layer's width, input included.
  int max_width() const;
  // Every layer's parameters (elements).
  size_t param_count() const { return param_count_; }
  // Where the parameters of layers [first, ...) start in the flat buffer.
  size_t params_offset(int first) const { return layers_[first].weight_offset; }
  // How many parameters layers [first, end) have.
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

  // The whole model's shape.
  const MlpShape& shape() const { return shape_; }
  // Its layers: [first_layer(), end_layer()).
  int first_layer() const { return first_; }
  // One past its last layer.
  int end_layer() const { return end_; }
  // Whether it holds the model's first layer (it reads the samples).
  bool is_first() const { return first_ == 0; }
  // Whether it holds the model's last layer (it computes the loss).
  bool is_last() const { return end_ == shape_.num_layers(); }
  // The features it takes in.
  int in_width() const { return shape_.widths()[first_]; }
  // The features it puts out.
  int out_width() const { return shape_.widths()[end_]; }
  // Where this stage's parameters start in the whole model's flat buffer.
  size_t param_offset() const { return shape_.params_offset(first_); }
  // How many parameters this stage has.
  size_t param_count() const { return shape_.params_count(first_, end_); }

 protected:
  MlpShape shape_;  // shape()
  int first_;       // first_layer()
  int end_;         // end_layer()
};

// The widest layer --layers takes (2^24: a layer's element counts stay exact in float and in
// the kernels' int indices).
constexpr int64_t kMaxLayerWidth = int64_t{1} << 24;

// Parses "784,512,512,10"; throws UsageError naming `flag` on malformed input.
MlpShape parse_layers(const std::string& text, const std::string& flag = "--layers");

// Fills `params` (shape.param_count() elements) following torch.nn.Linear's default
// initialisation: weight and bias uniform in [-1/sqrt(in), 1/sqrt(in)], seeded.
void init_params(const MlpShape& shape, uint64_t seed, float* params);

// backward() on the GPU: each layer's weight gradient on a second stream beside its input
// gradient (kOn), or after it on the one stream (kOff); kAuto: beside where
// backward_products_leave_sms_idle (the gradients are bitwise the same either way).
enum class WeightGradStream { kAuto, kOn, kOff };

// Whether every weight- and input-gradient product of layers [first, end) of `shape` at
// `batch` has fewer 128 x 128 output tiles than the GPU has SMs (`sms`): products that leave
// most of the GPU idle, so that a layer's two run side by side in about the time of one.
bool backward_products_leave_sms_idle(const MlpShape& shape, int first, int end, int batch,
                                      int sms);

// The MLP's layers (weight then bias of layer i) as spans of its flat buffer (the core's
// buckets and Reducer take them).
std::vector<ParamSpan> param_spans(const MlpShape& shape);

}  // namespace ddp
