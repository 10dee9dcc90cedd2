// MLP shape, flat layout and seeded initialisation.
#include "models/mlp.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "models/rng.h"
#include "runtime/error.h"
#include "runtime/parallel.h"
#include "runtime/parse.h"

namespace ddp {

MlpShape::MlpShape(std::vector<int> widths) : widths_(std::move(widths)) {
  DDP_USAGE_CHECK(widths_.size() >= 2,
                  "--layers: expected at least two widths (input and classes), got {}",
                  widths_.size());
  size_t offset = 0;
  for (size_t i = 0; i + 1 < widths_.size(); ++i) {
    LayerSlice slice;
    slice.in = widths_[i];
    slice.out = widths_[i + 1];
    slice.weight_offset = offset;
    slice.bias_offset = offset + static_cast<size_t>(slice.in) * slice.out;
    offset += slice.count();
    layers_.push_back(slice);
  }
  param_count_ = offset;
}

int MlpShape::max_width() const {
  return *std::max_element(widths_.begin(), widths_.end());
}

std::string MlpShape::to_string() const {
  std::string text;
  for (size_t i = 0; i < widths_.size(); ++i)
    text += (i ? "," : "") + std::to_string(widths_[i]);
  return text;
}

uint64_t MlpShape::fingerprint() const {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the widths
  for (int w : widths_) {
    for (int byte = 0; byte < 4; ++byte) {
      hash ^= static_cast<uint64_t>((static_cast<uint32_t>(w) >> (8 * byte)) & 0xff);
      hash *= 1099511628211ull;
    }
  }
  return hash;
}

MlpShape parse_layers(const std::string& text, const std::string& flag) {
  std::vector<int> widths;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const std::optional<int64_t> value = parse_number<int64_t>(item);
    DDP_USAGE_CHECK(
        value && *value > 0,
        "{} {}: expected comma-separated positive widths like 784,512,512,10, found '{}'", flag,
        text, item);
    DDP_USAGE_CHECK(*value <= kMaxLayerWidth,
                    "{} {}: a width of {} is past the largest one, {} (2^24)", flag, text, item,
                    kMaxLayerWidth);
    widths.push_back(static_cast<int>(*value));
  }
  DDP_USAGE_CHECK(widths.size() >= 2,
                  "{} {}: expected at least two widths (input and classes), like 784,512,10", flag,
                  text);
  return MlpShape(std::move(widths));
}

void init_params(const MlpShape& shape, uint64_t seed, float* params) {
  // Counter-based, filled by threads (half a billion weights take seconds on one): the same
  // values for any thread count, and on the GPU (CudaStage::init_params_on_device). Layer i's
  // key is mix_seed(seed, i); its weights are elements 0.. of that stream, its biases the
  // ones after.
  for (int i = 0; i < shape.num_layers(); ++i) {
    const LayerSlice& layer = shape.layer(i);
    const uint64_t key = mix_seed(seed, static_cast<uint64_t>(i));
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    const size_t weights = static_cast<size_t>(layer.in) * layer.out;
    parallel_for(weights, size_t{1} << 18, [&](size_t begin, size_t end) {
      for (size_t k = begin; k < end; ++k)
        params[layer.weight_offset + k] = counter_uniform(key, k, -bound, bound);
    });
    for (int k = 0; k < layer.out; ++k)
      params[layer.bias_offset + k] = counter_uniform(key, weights + k, -bound, bound);
  }
}

StageLayers::StageLayers(MlpShape shape, int first, int end)
    : shape_(std::move(shape)), first_(first), end_(end) {
  DDP_CHECK(0 <= first_ && first_ < end_ && end_ <= shape_.num_layers(),
            "stage of layers [{}, {}) of a {}-layer model", first_, end_, shape_.num_layers());
}

bool backward_products_leave_sms_idle(const MlpShape& shape, int first, int end, int batch,
                                      int sms) {
  const auto tiles = [](int64_t rows, int64_t cols) {
    return ((rows + 127) / 128) * ((cols + 127) / 128);
  };
  for (int i = first; i < end; ++i) {
    const LayerSlice& l = shape.layer(i);
    if (tiles(l.in, l.out) >= sms || tiles(batch, l.in) >= sms) return false;
  }
  return true;
}

std::vector<ParamSpan> param_spans(const MlpShape& shape) {
  std::vector<ParamSpan> spans;
  for (int i = 0; i < shape.num_layers(); ++i)
    spans.push_back({shape.layer(i).weight_offset, shape.layer(i).count()});
  return spans;
}

}  // namespace ddp
