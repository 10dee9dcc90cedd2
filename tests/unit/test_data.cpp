// Dataset readers on small files made here (good and broken), synthetic data, sampler.
#include <gtest/gtest.h>

#include <iterator>

#include <zlib.h>
#include <cmath>

#include <algorithm>
#include <fstream>
#include <set>

#include "engine/loop/sampler.h"
#include "engine/loop/trainer.h"
#include "models/dataset.h"
#include "runtime/error.h"
#include "runtime/parallel.h"
#include "tests/support/test_support.h"

namespace ddp {
namespace {

std::vector<uint8_t> idx_bytes(const std::vector<int>& dims, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (int d : dims) {
    bytes.push_back(static_cast<uint8_t>(d >> 24));
    bytes.push_back(static_cast<uint8_t>(d >> 16));
    bytes.push_back(static_cast<uint8_t>(d >> 8));
    bytes.push_back(static_cast<uint8_t>(d));
  }
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(file);
}

// A 3-image, 2x2-pixel Fashion-MNIST look-alike (train and test the same).
void write_tiny_fashion(const TempDir& dir) {
  std::vector<uint8_t> pixels(3 * 4);
  for (size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<uint8_t>(i * 20);
  for (const std::string prefix : {"train", "t10k"}) {
    write_gz(dir.file(prefix + "-images-idx3-ubyte.gz"), idx_bytes({3, 2, 2}, pixels));
    write_gz(dir.file(prefix + "-labels-idx1-ubyte.gz"), idx_bytes({3}, {0, 9, 4}));
  }
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(FashionMnist, ReadsImagesScaledAndLabels) {
  TempDir dir;
  write_tiny_fashion(dir);
  const Dataset data = load_fashion_mnist(dir.path());
  EXPECT_EQ(data.train.n, 3);
  EXPECT_EQ(data.train.dim, 4);
  EXPECT_EQ(data.classes, 10);
  EXPECT_FLOAT_EQ(data.train.x[1], 20.0f / 255.0f);
  EXPECT_EQ(data.train.y, (std::vector<int32_t>{0, 9, 4}));
  EXPECT_EQ(data.test.n, 3);
}

TEST(FashionMnist, MissingFileNamesIt) {
  TempDir dir;
  const std::string message = error_of([&] { load_fashion_mnist(dir.path()); });
  EXPECT_NE(message.find("train-images-idx3-ubyte.gz: no such file"), std::string::npos) << message;
}

TEST(FashionMnist, WrongMagicIsRefused) {
  TempDir dir;
  write_tiny_fashion(dir);
  write_gz(dir.file("train-images-idx3-ubyte.gz"), {0x1f, 0x00, 0x09, 0x03, 0, 0, 0, 1});
  const std::string message = error_of([&] { load_fashion_mnist(dir.path()); });
  EXPECT_NE(message.find("not an IDX file"), std::string::npos) << message;
}

TEST(FashionMnist, TruncatedDataIsRefused) {
  TempDir dir;
  write_tiny_fashion(dir);
  write_gz(dir.file("train-images-idx3-ubyte.gz"), idx_bytes({3, 2, 2}, std::vector<uint8_t>(11)));
  const std::string message = error_of([&] { load_fashion_mnist(dir.path()); });
  EXPECT_NE(message.find("promises 12 bytes, file has 11"), std::string::npos) << message;
}

TEST(FashionMnist, LabelCountMismatchIsRefused) {
  TempDir dir;
  write_tiny_fashion(dir);
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), idx_bytes({2}, {1, 2}));
  const std::string message = error_of([&] { load_fashion_mnist(dir.path()); });
  EXPECT_NE(message.find("has 3 images but"), std::string::npos) << message;
}

TEST(FashionMnist, CorruptGzipIsRefused) {
  TempDir dir;
  write_tiny_fashion(dir);
  std::ofstream(dir.file("train-images-idx3-ubyte.gz"), std::ios::binary)
      << std::string("\x1f\x8b\x08\x00garbage-not-deflate", 23);
  EXPECT_FALSE(error_of([&] { load_fashion_mnist(dir.path()); }).empty());
}

TEST(FashionMnist, AGzipWithoutItsTrailerIsRefused) {
  TempDir dir;
  write_tiny_fashion(dir);
  const std::string path = dir.file("train-labels-idx1-ubyte.gz");
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 8);
  const std::string error = error_of([&] { load_fashion_mnist(dir.path()); });
  EXPECT_NE(error.find("train-labels-idx1-ubyte.gz: truncated or corrupt gzip data"),
            std::string::npos)
      << error;
}

TEST(Npy, ALabelPastTheModelsClassesNamesTheFileAndTheLabel) {
  TempDir dir;
  const std::vector<float> x(8 * 4, 0.5f);
  const std::vector<int64_t> y = {0, 1, 2, 3, 4, 5, 6, 12};
  write_npy(dir.file("train_x.npy"), "<f4", {8, 4}, x.data(), x.size() * 4);
  write_npy(dir.file("train_y.npy"), "<i8", {8}, y.data(), y.size() * 8);
  TrainConfig config;
  config.layers = "4,8,10";
  const Dataset data = load_npy_dataset(dir.path());
  const std::string error =
      error_of([&] { check_model_fits_data(parse_layers(config.layers), config, data); });
  EXPECT_NE(error.find(dir.file("train_y.npy") + ": label 12 at index 7 is out of range for "
                                                 "--layers 4,8,10 (its last width 10 means "
                                                 "labels 0 to 9)"),
            std::string::npos)
      << error;
}

// NumPy's everyday defaults: float64 data (here Fortran-ordered), float16 and uint8 data,
// uint8 and int16 labels, converted on load.
TEST(Npy, EverydayDtypesAndFortranOrderAreConverted) {
  TempDir dir;
  // [[1, 2, 3], [4, 5, 6]] stored column by column.
  const std::vector<double> fortran = {1, 4, 2, 5, 3, 6};
  const std::vector<uint8_t> labels = {1, 0};
  write_npy(dir.file("train_x.npy"), "<f8", {2, 3}, fortran.data(), 48, /*fortran_order=*/true);
  write_npy(dir.file("train_y.npy"), "|u1", {2}, labels.data(), 2);
  Dataset data = load_npy_dataset(dir.path());
  EXPECT_EQ(data.train.x, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(data.train.y, (std::vector<int32_t>{1, 0}));

  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x3800, 0x0000, 0x7bff, 0x0001};
  const std::vector<int16_t> small = {2, 0};
  write_npy(dir.file("train_x.npy"), "<f2", {2, 3}, halves.data(), 12);
  write_npy(dir.file("train_y.npy"), "<i2", {2}, small.data(), 4);
  data = load_npy_dataset(dir.path());
  EXPECT_EQ(data.train.x,
            (std::vector<float>{1.0f, -2.0f, 0.5f, 0.0f, 65504.0f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(data.train.y, (std::vector<int32_t>{2, 0}));

  const std::vector<uint8_t> pixels = {0, 255, 7, 9, 10, 11};
  write_npy(dir.file("train_x.npy"), "|u1", {2, 3}, pixels.data(), 6);
  data = load_npy_dataset(dir.path());
  EXPECT_EQ(data.train.x, (std::vector<float>{0, 255, 7, 9, 10, 11}));  // as stored, unscaled

  write_npy(dir.file("train_x.npy"), "<c8", {2, 1}, pixels.data(), 16);
  EXPECT_NE(error_of([&] { load_npy_dataset(dir.path()); }).find("unsupported dtype '<c8'"),
            std::string::npos);
}

TEST(Npy, RoundTripWithInt64LabelsAndTestSplit) {
  TempDir dir;
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::vector<int64_t> y = {2, 0};
  write_npy(dir.file("train_x.npy"), "<f4", {2, 3}, x.data(), x.size() * 4);
  write_npy(dir.file("train_y.npy"), "<i8", {2}, y.data(), y.size() * 8);
  write_npy(dir.file("test_x.npy"), "<f4", {2, 3}, x.data(), x.size() * 4);
  const std::vector<int32_t> y32 = {1, 4};
  write_npy(dir.file("test_y.npy"), "<i4", {2}, y32.data(), y32.size() * 4);
  const Dataset data = load_npy_dataset(dir.path());
  EXPECT_EQ(data.train.n, 2);
  EXPECT_EQ(data.train.dim, 3);
  EXPECT_EQ(data.train.x, x);
  EXPECT_EQ(data.train.y, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(data.test.y, y32);
  EXPECT_EQ(data.classes, 5);
}

TEST(Npy, HeadersThatClaimMoreThanTheFileHoldsAreRefusedBeforeAllocating) {
  TempDir dir;
  const std::vector<float> x(20, 1.0f);
  const std::vector<int32_t> y = {0};
  write_npy(dir.file("train_y.npy"), "<i4", {1}, y.data(), 4);
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {50000000, 20}, {1000000000000LL, 20}, {4611686018427387904LL, 4}}) {
    write_npy(dir.file("train_x.npy"), "<f4", shape, x.data(), x.size() * 4);
    const std::string error = error_of([&] { load_npy_dataset(dir.path()); });
    EXPECT_NE(error.find("train_x.npy: the .npy header claims shape"), std::string::npos) << error;
  }
  write_npy(dir.file("train_x.npy"), "<f4", {-5, 20}, x.data(), x.size() * 4);
  EXPECT_NE(error_of([&] { load_npy_dataset(dir.path()); }).find("malformed shape"),
            std::string::npos);
  write_npy(dir.file("train_x.npy"), "<f4", {0, 20}, x.data(), 0);
  write_npy(dir.file("train_y.npy"), "<i4", {0}, y.data(), 0);
  EXPECT_NE(error_of([&] { load_npy_dataset(dir.path()); }).find("expected a non-empty [N, D]"),
            std::string::npos);
}

TEST(Npy, NonFiniteInputIsRefusedNamingTheFileAndIndex) {
  TempDir dir;
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> y = {0, 1};
  write_npy(dir.file("train_y.npy"), "<i4", {2}, y.data(), 8);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    x[4] = bad;
    write_npy(dir.file("train_x.npy"), "<f4", {2, 3}, x.data(), x.size() * 4);
    const std::string error = error_of([&] { load_npy_dataset(dir.path()); });
    EXPECT_NE(error.find("train_x.npy: non-finite value"), std::string::npos) << error;
    EXPECT_NE(error.find("at index 4 (sample 1, feature 1)"), std::string::npos) << error;
  }
}

TEST(Npy, WrongDtypeShapeAndTruncationAreRefused) {
  TempDir dir;
  const std::vector<int32_t> xi = {1, 2};
  const std::vector<int32_t> y = {0, 1};
  write_npy(dir.file("train_x.npy"), "<i4", {2, 1}, xi.data(), 8);
  write_npy(dir.file("train_y.npy"), "<i4", {2}, y.data(), 8);
  EXPECT_NE(error_of([&] {
              load_npy_dataset(dir.path());
            }).find("expected dtype float32, float64, float16 or uint8, found '<i4'"),
            std::string::npos);

  const std::vector<float> x = {1, 2, 3};
  write_npy(dir.file("train_x.npy"), "<f4", {3, 1}, x.data(), 12);
  EXPECT_NE(error_of([&] { load_npy_dataset(dir.path()); }).find("expected shape [3]"),
            std::string::npos);

  write_npy(dir.file("train_x.npy"), "<f4", {2, 4}, x.data(), 12);  // promises 32 bytes
  EXPECT_NE(error_of([&] { load_npy_dataset(dir.path()); }).find("truncated .npy data"),
            std::string::npos);

  std::ofstream(dir.file("train_x.npy"), std::ios::binary) << "PK\x03\x04 not numpy";
  EXPECT_NE(error_of([&] { load_npy_dataset(dir.path()); }).find("not a .npy file"),
            std::string::npos);
}

TEST(Synthetic, SameSeedSameData) {
  const Dataset a = make_synthetic(50, 10, 4, 3, 7);
  const Dataset b = make_synthetic(50, 10, 4, 3, 7);
  const Dataset c = make_synthetic(50, 10, 4, 3, 8);
  EXPECT_EQ(a.train.x, b.train.x);
  EXPECT_EQ(a.train.y, b.train.y);
  EXPECT_NE(a.train.x, c.train.x);
  EXPECT_EQ(a.classes, 3);
  for (int32_t label : a.train.y)
    EXPECT_LT(label, 3);
}

// Counter-based: sample i is a function of the seed and i alone, so a set generated on one
// thread (10 samples) is the start of one generated on several (3000 x 400 values), and
// sets whose threads split the work at other places (2999 samples) agree where they overlap.
TEST(Synthetic, SameValuesWhateverTheThreadsAndTheSize) {
  const Dataset small = make_synthetic(10, 2, 400, 5, 3);
  const Dataset large = make_synthetic(3000, 2, 400, 5, 3);
  const Dataset other = make_synthetic(2999, 2, 400, 5, 3);
  ASSERT_EQ(large.train.x.size(), size_t{3000} * 400);
  EXPECT_TRUE(std::equal(small.train.x.begin(), small.train.x.end(), large.train.x.begin()));
  EXPECT_TRUE(std::equal(small.train.y.begin(), small.train.y.end(), large.train.y.begin()));
  EXPECT_TRUE(std::equal(other.train.x.begin(), other.train.x.end(), large.train.x.begin()));
  // Noise of standard deviation 0.5 around each class centre.
  double sum = 0, sum2 = 0;
  for (size_t j = 0; j < large.train.x.size(); j += 2) {
    const double centre_a = large.train.x[j] - large.train.x[j + 1];  // two features, one class
    sum += centre_a;
    sum2 += centre_a * centre_a;
  }
  const double n = large.train.x.size() / 2.0, mean = sum / n;
  EXPECT_LT(std::fabs(mean), 0.1);
  EXPECT_GT(sum2 / n - mean * mean, 0.3);  // variance of a difference of centres plus noise
}

TEST(ParallelFor, CoversEveryIndexOnce) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{999}, size_t{1000003}}) {
    std::vector<int> seen(n, 0);
    parallel_for(n, 1000, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i)
        ++seen[i];
    });
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<std::ptrdiff_t>(n)) << n;
  }
}

TEST(Sampler, EachEpochIsAPermutationAndSeeded) {
  Sampler a(10, 3, true), b(10, 3, true);
  std::vector<int32_t> first(20), second(20);
  a.indices(0, 20, first.data());
  b.indices(0, 20, second.data());
  EXPECT_EQ(first, second);
  const std::set<int32_t> epoch0(first.begin(), first.begin() + 10);
  const std::set<int32_t> epoch1(first.begin() + 10, first.end());
  EXPECT_EQ(epoch0.size(), 10u);
  EXPECT_EQ(epoch1.size(), 10u);
  EXPECT_NE(std::vector<int32_t>(first.begin(), first.begin() + 10),
            std::vector<int32_t>(first.begin() + 10, first.end()));
}

TEST(Sampler, NoShuffleWrapsInFileOrder) {
  Sampler sampler(5, 0, false);
  std::vector<int32_t> out(4);
  sampler.indices(3, 4, out.data());  // batch 1 of size 3 would start at 3
  EXPECT_EQ(out, (std::vector<int32_t>{3, 4, 0, 1}));
}

TEST(Sampler, RankSlicesTileTheGlobalBatch) {
  for (int ranks : {1, 2, 3, 4}) {
    int64_t expected_begin = 5 * 12;
    for (int r = 0; r < ranks; ++r) {
      const BatchSlice slice = rank_slice(5, 12, r, ranks);
      EXPECT_EQ(slice.begin, expected_begin);
      EXPECT_EQ(slice.count, 12 / ranks);
      expected_begin += slice.count;
    }
    EXPECT_EQ(expected_begin, 6 * 12);
  }
}

// With micro-batches, each micro-batch is a contiguous 1/M of the global batch and the
// ranks tile each in turn: the same positions as one rank, in the same order.
TEST(Sampler, MicroBatchSlicesTileTheGlobalBatchMicroBatchByMicroBatch) {
  for (int micro_batches : {1, 2, 3}) {
    for (int ranks : {1, 2}) {
      int64_t expected_begin = 7 * 12;
      for (int m = 0; m < micro_batches; ++m) {
        for (int r = 0; r < ranks; ++r) {
          const BatchSlice slice = rank_slice(7, 12, r, ranks, m, micro_batches);
          EXPECT_EQ(slice.begin, expected_begin) << micro_batches << " " << ranks;
          EXPECT_EQ(slice.count, 12 / micro_batches / ranks);
          expected_begin += slice.count;
        }
      }
      EXPECT_EQ(expected_begin, 8 * 12);
    }
  }
  EXPECT_THROW(rank_slice(0, 12, 0, 2, 0, 4), Error);  // 12 into 4 x 2 does not go
}

}  // namespace
}  // namespace ddp
