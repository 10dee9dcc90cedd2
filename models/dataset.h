// Datasets in memory: Fashion-MNIST (IDX .gz files), .npy files, and a seeded synthetic
// classification set. Features are float32 [n, dim] row-major, labels int32 [n].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

// One split of a data set (train or test).
struct Split {
  std::vector<float> x;     ///< features, [n, dim] row-major
  std::vector<int32_t> y;   ///< labels, [n]
  int64_t n = 0;            ///< samples
  int dim = 0;              ///< features a sample
  std::string labels_file;  // where y came from (for messages); empty for generated data
};

// A data set: its train and test splits.
struct Dataset {
  std::string name;  ///< "fashion-mnist", "npy", "synthetic"
  Split train;       ///< the training split
  Split test;        ///< the test split; n == 0 when there is none
  int classes = 0;   ///< labels are 0 to classes - 1
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
// An IDX file's array of unsigned bytes.
struct IdxArray {
  std::vector<int> dims;      ///< its dimensions
  std::vector<uint8_t> data;  ///< its bytes, row-major
};
// Reads a gzip-compressed (or plain) IDX file of unsigned bytes (type code 0x08).
IdxArray read_idx_gz(const std::string& path);

// A .npy file's array.
struct NpyArray {
  std::string dtype;           // "<f4", "<f8", "<f2", "<i4", "<i8", "<i2", "|u1", "|i1"
  std::vector<int64_t> shape;  ///< its dimensions
  bool fortran_order = false;  // column-major data (NumPy's order='F')
  std::vector<char> data;      ///< its bytes, as stored
};
// Reads a .npy file (the dtypes above); throws UsageError naming the file on a bad one.
NpyArray read_npy(const std::string& path);
// Writes an array of `dtype` as given (used by tests and tools); `fortran_order` only marks
// the header: the bytes are written as they are.
void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
               const void* data, size_t bytes, bool fortran_order = false);

}  // namespace ddp
