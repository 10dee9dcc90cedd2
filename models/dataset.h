// Datasets in memory: Fashion-MNIST (IDX .gz files), .npy files, and a seeded synthetic
// classification set. Features are float32 [n, dim] row-major, labels int32 [n].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

struct Split {
  std::vector<float> x;    // [n, dim]
  std::vector<int32_t> y;  // [n]
  int64_t n = 0;
  int dim = 0;
  std::string labels_file;  // where y came from (for messages); empty for generated data
};

struct Dataset {
  std::string name;
  Split train;
  Split test;  // n == 0 when there is none
  int classes = 0;
};

// Reads train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-*.gz from `dir`;
// pixels scaled to [0, 1]. Throws UsageError naming the file on a missing, truncated or
// malformed file.
Dataset load_fashion_mnist(const std::string& dir);

// Reads train_x.npy (float32 [N, D]), train_y.npy (int32 or int64 [N]) and, when present,
// test_x.npy/test_y.npy from `dir`. classes = 1 + the largest label.
Dataset load_npy_dataset(const std::string& dir);

// Seeded synthetic classification data: `classes` Gaussian clusters in `dim` dimensions.
Dataset make_synthetic(int64_t train_n, int64_t test_n, int dim, int classes, uint64_t seed);

// Lower-level readers (exposed for tests).
struct IdxArray {
  std::vector<int> dims;
  std::vector<uint8_t> data;
};
// Reads a gzip-compressed (or plain) IDX file of unsigned bytes (type code 0x08).
IdxArray read_idx_gz(const std::string& path);

struct NpyArray {
  std::string dtype;  // "<f4", "<f8", "<f2", "<i4", "<i8", "<i2", "|u1", "|i1"
  std::vector<int64_t> shape;
  bool fortran_order = false;  // column-major data (NumPy's order='F')
  std::vector<char> data;
};
NpyArray read_npy(const std::string& path);
// Writes an array of `dtype` as given (used by tests and tools); `fortran_order` only marks
// the header: the bytes are written as they are.
void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
               const void* data, size_t bytes, bool fortran_order = false);

}  // namespace ddp
