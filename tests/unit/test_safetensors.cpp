// Safetensors: round trip, and refusal of wrong names, shapes, dtypes and broken files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "models/mlp.h"
#include "models/safetensors.h"
#include "runtime/error.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

std::string load_error(const std::string& path, const MlpShape& shape) {
  std::vector<float> params(shape.param_count());
  try {
    load_mlp_weights(path, shape, params.data());
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// Element i of a tensor in the fixture, decoded from its dtype.
double element(const Tensor& t, size_t i) {
  const char* p = t.data.data();
  auto as = [&](auto v) {
    std::memcpy(&v, p + i * sizeof(v), sizeof(v));
    return static_cast<double>(v);
  };
  if (t.dtype == "F64") return as(double{});
  if (t.dtype == "F32") return as(float{});
  if (t.dtype == "I64") return as(int64_t{});
  if (t.dtype == "I32") return as(int32_t{});
  if (t.dtype == "I16") return as(int16_t{});
  if (t.dtype == "I8") return as(int8_t{});
  if (t.dtype == "U8" || t.dtype == "BOOL") return as(uint8_t{});
  if (t.dtype == "U32") return as(uint32_t{});
  if (t.dtype == "U64") return as(uint64_t{});
  uint16_t half;
  std::memcpy(&half, p + 2 * i, 2);
  if (t.dtype == "BF16") {
    const uint32_t bits = uint32_t{half} << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  if (t.dtype == "F16") {  // values here are small integers: normal numbers or zero
    const int exponent = (half >> 10) & 0x1f;
    const double magnitude =
        exponent == 0 ? 0.0 : std::ldexp(1.0 + (half & 0x3ff) / 1024.0, exponent - 15);
    return (half & 0x8000) ? -magnitude : magnitude;
  }
  ADD_FAILURE() << "dtype " << t.dtype;
  return 0;
}

// A file written by the reference Python package (tests/data/make_mixed_dtypes.py): every
// dtype the reader accepts, with the element size, shape and values it must see.
TEST(Safetensors, ReadsEveryDtypeWrittenByTheReferencePackage) {
  const SafetensorsFile file =
      read_safetensors(std::string(TEST_DATA_DIR) + "/mixed_dtypes.safetensors");
  const std::map<std::string, std::pair<std::string, size_t>> want = {
      {"f64", {"F64", 8}}, {"f32", {"F32", 4}}, {"f16", {"F16", 2}}, {"bf16", {"BF16", 2}},
      {"i64", {"I64", 8}}, {"i32", {"I32", 4}}, {"i16", {"I16", 2}}, {"i8", {"I8", 1}},
      {"u8", {"U8", 1}},   {"u32", {"U32", 4}}, {"u64", {"U64", 8}}, {"bool", {"BOOL", 1}}};
  ASSERT_EQ(file.tensors.size(), want.size());
  for (const auto& [name, dtype_size] : want) {
    const Tensor& t = file.tensors.at(name);
    EXPECT_EQ(t.dtype, dtype_size.first) << name;
    EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3})) << name;
    ASSERT_EQ(t.data.size(), 6 * dtype_size.second) << name;
    for (size_t i = 0; i < 6; ++i) {
      const double expected = name == "bool"   ? double(i % 2)
                              : name[0] == 'u' ? double(i)
                                               : double(i) - 2;
      EXPECT_EQ(element(t, i), expected) << name << "[" << i << "]";
    }
  }
}

TEST(Safetensors, EveryDtypeRoundTripsThroughOurWriter) {
  TempDir dir;
  const SafetensorsFile fixture =
      read_safetensors(std::string(TEST_DATA_DIR) + "/mixed_dtypes.safetensors");
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : fixture.tensors)
    refs.push_back({name, t.dtype, t.shape, t.data.data(), t.data.size()});
  write_safetensors(dir.file("all.safetensors"), refs, {{"k", "v"}});
  const SafetensorsFile back = read_safetensors(dir.file("all.safetensors"));
  ASSERT_EQ(back.tensors.size(), fixture.tensors.size());
  for (const auto& [name, t] : fixture.tensors) {
    EXPECT_EQ(back.tensors.at(name).dtype, t.dtype) << name;
    EXPECT_EQ(back.tensors.at(name).shape, t.shape) << name;
    EXPECT_EQ(back.tensors.at(name).data, t.data) << name;
  }
  EXPECT_EQ(back.metadata.at("k"), "v");
}

TEST(Safetensors, MlpWeightsRoundTrip) {
  TempDir dir;
  const MlpShape shape = parse_layers("5,4,3");
  std::vector<float> params(shape.param_count());
  init_params(shape, 9, params.data());
  save_mlp_weights(dir.file("w.safetensors"), shape, params.data());
  std::vector<float> loaded(shape.param_count(), -1.0f);
  load_mlp_weights(dir.file("w.safetensors"), shape, loaded.data());
  EXPECT_EQ(params, loaded);

  const SafetensorsFile file = read_safetensors(dir.file("w.safetensors"));
  EXPECT_EQ(file.tensors.size(), 4u);
  EXPECT_EQ(file.tensors.at("layers.0.weight").shape, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(file.tensors.at("layers.1.bias").dtype, "F32");
  EXPECT_EQ(file.metadata.at("layers"), "5,4,3");
}

TEST(Safetensors, HeaderIsAlignedAndDataFollowsIt) {
  TempDir dir;
  const float value = 1.5f;
  write_safetensors(dir.file("a.safetensors"), {{"x", "F32", {1}, &value, 4}});
  std::ifstream in(dir.file("a.safetensors"), std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  EXPECT_EQ(len % 8, 0u);
  in.seekg(static_cast<std::streamoff>(8 + len));
  float read = 0;
  in.read(reinterpret_cast<char*>(&read), 4);
  EXPECT_EQ(read, value);
}

TEST(Safetensors, WrongShapeNameAndDtypeAreRefused) {
  TempDir dir;
  const MlpShape shape = parse_layers("5,4,3");
  std::vector<float> params(shape.param_count());
  save_mlp_weights(dir.file("w.safetensors"), shape, params.data());
  EXPECT_NE(load_error(dir.file("w.safetensors"), parse_layers("5,6,3"))
                .find("has shape [4, 5], expected [6, 5]"),
            std::string::npos);
  auto refs = mlp_tensor_refs(shape, params.data());
  refs.pop_back();  // drop layers.1.bias
  write_safetensors(dir.file("partial.safetensors"), refs);
  EXPECT_NE(load_error(dir.file("partial.safetensors"), shape).find("no tensor layers.1.bias"),
            std::string::npos);
  EXPECT_NE(load_error(dir.file("w.safetensors"), parse_layers("5,3")).find("has shape"),
            std::string::npos);

  std::vector<double> wide(20);
  write_safetensors(dir.file("f64.safetensors"),
                    {{"layers.0.weight", "F64", {4, 5}, wide.data(), 160}});
  EXPECT_NE(
      load_error(dir.file("f64.safetensors"), parse_layers("5,4")).find("dtype F64, expected F32"),
      std::string::npos);
}

TEST(Safetensors, ExtraLayerIsRefused) {
  TempDir dir;
  const MlpShape big = parse_layers("5,4,4,3");
  std::vector<float> params(big.param_count());
  save_mlp_weights(dir.file("w.safetensors"), big, params.data());
  // "5,4,3" would take layers.0 and ... layers.1 has shape [4,4] so shape differs first;
  // use a file with layers 0..1 of the right shapes plus a stray layers.2.
  const MlpShape small = parse_layers("5,4,4");
  std::vector<float> small_params(small.param_count());
  auto refs = mlp_tensor_refs(small, small_params.data());
  const float stray[3] = {};
  refs.push_back({"layers.2.bias", "F32", {3}, stray, 12});
  write_safetensors(dir.file("extra.safetensors"), refs);
  EXPECT_NE(
      load_error(dir.file("extra.safetensors"), small).find("unexpected tensor layers.2.bias"),
      std::string::npos);
}

TEST(Safetensors, BrokenFilesAreRefused) {
  TempDir dir;
  const MlpShape shape = parse_layers("2,2");
  EXPECT_NE(load_error(dir.file("missing.safetensors"), shape).find("cannot open"),
            std::string::npos);

  std::ofstream(dir.file("short.safetensors"), std::ios::binary) << "abc";
  EXPECT_NE(load_error(dir.file("short.safetensors"), shape).find("truncated"), std::string::npos);

  std::ofstream(dir.file("garbage.safetensors"), std::ios::binary) << std::string(64, 'x');
  EXPECT_NE(load_error(dir.file("garbage.safetensors"), shape).find("not a safetensors file"),
            std::string::npos);

  std::vector<float> params(shape.param_count());
  save_mlp_weights(dir.file("w.safetensors"), shape, params.data());
  std::ifstream in(dir.file("w.safetensors"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir.file("cut.safetensors"), std::ios::binary) << bytes.substr(0, bytes.size() - 4);
  EXPECT_NE(load_error(dir.file("cut.safetensors"), shape).find("offsets outside"),
            std::string::npos);

  std::string bad_json = bytes;
  bad_json[8] = '[';
  std::ofstream(dir.file("json.safetensors"), std::ios::binary) << bad_json;
  EXPECT_FALSE(load_error(dir.file("json.safetensors"), shape).empty());
}

TEST(Safetensors, FailedWriteLeavesTheOldFile) {
  TempDir dir;
  const float value = 2.0f;
  write_safetensors(dir.file("keep.safetensors"), {{"x", "F32", {1}, &value, 4}});
  EXPECT_THROW(
      write_safetensors(dir.file("no-such-dir/keep.safetensors"), {{"x", "F32", {1}, &value, 4}}),
      UsageError);
  EXPECT_EQ(read_safetensors(dir.file("keep.safetensors")).tensors.size(), 1u);
}

}  // namespace
}  // namespace ddp
