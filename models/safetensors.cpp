// The MLP's weights as safetensors files.
#include "models/safetensors.h"

#include "runtime/error.h"

namespace ddp {

std::vector<TensorRef> mlp_tensor_refs(const MlpShape& shape, const float* params) {
  std::vector<TensorRef> refs;
  for (int i = 0; i < shape.num_layers(); ++i) {
    const LayerSlice& layer = shape.layer(i);
    refs.push_back({fmt::format("layers.{}.weight", i),
                    "F32",
                    {layer.out, layer.in},
                    params + layer.weight_offset,
                    sizeof(float) * layer.in * layer.out});
    refs.push_back({fmt::format("layers.{}.bias", i),
                    "F32",
                    {layer.out},
                    params + layer.bias_offset,
                    sizeof(float) * layer.out});
  }
  return refs;
}

void save_mlp_weights(const std::string& path, const MlpShape& shape, const float* params) {
  write_safetensors(path, mlp_tensor_refs(shape, params), {{"layers", shape.to_string()}});
}

void mlp_params_from(const SafetensorsFile& file, const std::string& path, const MlpShape& shape,
                     float* params) {
  const std::vector<TensorRef> expected = mlp_tensor_refs(shape, params);
  for (const TensorRef& want : expected) {
    const auto found = file.tensors.find(want.name);
    DDP_USAGE_CHECK(found != file.tensors.end(),
                    "{}: no tensor {} (the model --layers {} needs {} tensors)", path, want.name,
                    shape.to_string(), expected.size());
    const Tensor& have = found->second;
    DDP_USAGE_CHECK(have.dtype == "F32", "{}: tensor {} has dtype {}, expected F32", path,
                    want.name, have.dtype);
    DDP_USAGE_CHECK(have.shape == want.shape,
                    "{}: tensor {} has shape {}, expected {} for --layers {}", path, want.name,
                    shape_text(have.shape), shape_text(want.shape), shape.to_string());
    std::memcpy(const_cast<void*>(want.data), have.data.data(), want.bytes);
  }
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind("layers.", 0) != 0) continue;
    bool known = false;
    for (const TensorRef& want : expected)
      known = known || want.name == name;
    DDP_USAGE_CHECK(known, "{}: unexpected tensor {} for --layers {} ({} layers)", path, name,
                    shape.to_string(), shape.num_layers());
  }
}

void load_mlp_weights(const std::string& path, const MlpShape& shape, float* params) {
  mlp_params_from(read_safetensors(path), path, shape, params);
}

}  // namespace ddp
