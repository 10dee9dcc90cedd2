// Dataset readers. Every failure names the file and what was expected and found.
#include "models/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>

#include <spdlog/spdlog.h>

#include "models/rng.h"
#include "runtime/error.h"
#include "runtime/parallel.h"

namespace ddp {
namespace {

// Throws UsageError unless `path` is a regular file (or a link to one): a folder, FIFO or
// device is named as what it is, not as missing (a FIFO would block the reader forever).
void check_regular_file(const std::string& path) {
  struct stat info {};
  DDP_USAGE_CHECK(::stat(path.c_str(), &info) == 0, "{}: no such file", path);
  DDP_USAGE_CHECK(S_ISREG(info.st_mode), "{}: is {}; expected a regular file", path,
                  S_ISDIR(info.st_mode)                            ? "a folder"
                  : S_ISFIFO(info.st_mode)                         ? "a FIFO"
                  : S_ISCHR(info.st_mode) || S_ISBLK(info.st_mode) ? "a device"
                                                                   : "not a regular file");
}

// True when something is at `path` (what it is, check_regular_file says).
bool path_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

uint32_t big_endian_u32(const uint8_t* p);

// The bytes an IDX file declares (header and data) once its header has been read; 0 before.
uint64_t idx_declared_bytes(const std::vector<uint8_t>& bytes) {
  if (bytes.size() < 4) return 0;
  const size_t header = 4 + 4u * bytes[3];
  if (bytes.size() < header) return 0;
  uint64_t count = 1;
  for (int i = 0; i < bytes[3]; ++i)
    count *= big_endian_u32(&bytes[4 + 4 * i]);
  return header + count;
}

// Inflates a gzip file, but never past what its IDX header declares plus one byte: a small
// file that inflates to gigabytes (a gzip bomb) is refused once it has said too much.
std::vector<uint8_t> read_gz_file(const std::string& path) {
  check_regular_file(path);
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  DDP_USAGE_CHECK(file != nullptr, "{}: cannot open", path);
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> chunk(1 << 20);
  uint64_t declared = 0;
  while (true) {
    if (declared == 0) declared = idx_declared_bytes(bytes);
    // Before the header is known, read only as far as the header can reach.
    const uint64_t limit = declared > 0 ? declared + 1 : 4 + 4 * 255;
    if (bytes.size() >= limit) break;
    const uint64_t want = std::min<uint64_t>(chunk.size(), limit - bytes.size());
    const int got = gzread(file.get(), chunk.data(), static_cast<unsigned>(want));
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file.get(), &code);
      throw UsageError(fmt::format("{}: corrupt gzip data ({})", path, message));
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + got);
  }
  DDP_USAGE_CHECK(
      declared == 0 || bytes.size() <= declared,
      "{}: oversized IDX data: its header (magic {:02x}{:02x}{:02x}{:02x}: {} "
      "dimension{}) declares {} bytes, the file inflates to more (stopped reading "
      "there){}",
      path, bytes[0], bytes[1], bytes[2], bytes[3], bytes[3], bytes[3] == 1 ? "" : "s", declared,
      bytes[3] == 1 ? "; a labels file (magic 00000801) where images were expected?" : "");
  // A stream cut short (no trailer with its CRC and length) reads as a clean end of data;
  // zlib says so only through gzerror.
  int code = Z_OK;
  const char* message = gzerror(file.get(), &code);
  DDP_USAGE_CHECK(code == Z_OK || code == Z_STREAM_END,
                  "{}: truncated or corrupt gzip data ({}); download or copy it again", path,
                  message);
  return bytes;
}

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

IdxArray read_idx_gz(const std::string& path) {
  const std::vector<uint8_t> bytes = read_gz_file(path);
  DDP_USAGE_CHECK(bytes.size() >= 4, "{}: truncated IDX file ({} bytes, expected a 4-byte magic)",
                  path, bytes.size());
  DDP_USAGE_CHECK(
      bytes[0] == 0 && bytes[1] == 0 && bytes[2] == 0x08 && bytes[3] >= 1 && bytes[3] <= 4,
      "{}: not an IDX file of unsigned bytes (magic {:02x}{:02x}{:02x}{:02x}, expected "
      "000008 then 1 to 4 dimensions)",
      path, bytes[0], bytes[1], bytes[2], bytes[3]);
  const int ndims = bytes[3];
  DDP_USAGE_CHECK(bytes.size() >= 4 + 4u * ndims, "{}: truncated IDX header ({} bytes)", path,
                  bytes.size());
  IdxArray array;
  size_t count = 1;
  for (int i = 0; i < ndims; ++i) {
    const uint32_t dim = big_endian_u32(&bytes[4 + 4 * i]);
    array.dims.push_back(static_cast<int>(dim));
    count *= dim;
  }
  const size_t header = 4 + 4u * ndims;
  DDP_USAGE_CHECK(bytes.size() - header == count,
                  "{}: truncated or oversized IDX data: header promises {} bytes, file has {}",
                  path, count, bytes.size() - header);
  array.data.assign(bytes.begin() + header, bytes.end());
  return array;
}

namespace {

Split load_idx_split(const std::string& images_path, const std::string& labels_path) {
  const IdxArray images = read_idx_gz(images_path);
  const IdxArray labels = read_idx_gz(labels_path);
  DDP_USAGE_CHECK(images.dims.size() == 3, "{}: expected 3 dimensions (n, rows, cols), found {}",
                  images_path, images.dims.size());
  DDP_USAGE_CHECK(labels.dims.size() == 1, "{}: expected 1 dimension (n), found {}", labels_path,
                  labels.dims.size());
  DDP_USAGE_CHECK(images.dims[0] == labels.dims[0], "{} has {} images but {} has {} labels",
                  images_path, images.dims[0], labels_path, labels.dims[0]);
  DDP_USAGE_CHECK(images.dims[0] > 0 && images.dims[1] > 0 && images.dims[2] > 0,
                  "{}: holds no samples (its header says {} x {} x {})", images_path,
                  images.dims[0], images.dims[1], images.dims[2]);
  Split split;
  split.labels_file = labels_path;
  split.n = images.dims[0];
  split.dim = images.dims[1] * images.dims[2];
  split.x.resize(images.data.size());
  for (size_t i = 0; i < images.data.size(); ++i)
    split.x[i] = images.data[i] / 255.0f;
  split.y.assign(labels.data.begin(), labels.data.end());
  return split;
}

int count_classes(const Dataset& data) {
  int32_t max_label = -1;
  for (const Split* split : {&data.train, &data.test}) {
    for (int32_t label : split->y) {
      DDP_USAGE_CHECK(label >= 0, "{}: negative label {}", data.name, label);
      max_label = std::max(max_label, label);
    }
  }
  return max_label + 1;
}

}  // namespace

Dataset load_fashion_mnist(const std::string& dir) {
  Dataset data;
  data.name = "fashion-mnist";
  data.train =
      load_idx_split(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz");
  data.test =
      load_idx_split(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz");
  DDP_USAGE_CHECK(data.train.dim == data.test.dim,
                  "{}: train images have {} pixels, test images {}", dir, data.train.dim,
                  data.test.dim);
  data.classes = std::max(10, count_classes(data));
  return data;
}

NpyArray read_npy(const std::string& path) {
  check_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  DDP_USAGE_CHECK(in && std::memcmp(magic, "\x93NUMPY", 6) == 0,
                  "{}: not a .npy file (expected the magic \\x93NUMPY)", path);
  const int major = static_cast<uint8_t>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    uint8_t len[2] = {};
    in.read(reinterpret_cast<char*>(len), 2);
    header_len = len[0] | (len[1] << 8);
  } else {
    DDP_USAGE_CHECK(major == 2 || major == 3, "{}: unsupported .npy version {}", path, major);
    uint8_t len[4] = {};
    in.read(reinterpret_cast<char*>(len), 4);
    header_len = len[0] | (len[1] << 8) | (len[2] << 16) | (uint32_t{len[3]} << 24);
  }
  DDP_USAGE_CHECK(in && header_len < (1u << 20), "{}: truncated .npy header", path);
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  DDP_USAGE_CHECK(in, "{}: truncated .npy header", path);

  NpyArray array;
  auto value_of = [&](const std::string& key) {
    const size_t at = header.find("'" + key + "'");
    DDP_USAGE_CHECK(at != std::string::npos, "{}: .npy header has no '{}'", path, key);
    size_t start = header.find(':', at) + 1;
    while (start < header.size() && header[start] == ' ')
      ++start;
    return start;
  };
  size_t at = value_of("descr");
  DDP_USAGE_CHECK(header[at] == '\'', "{}: malformed descr in .npy header", path);
  array.dtype = header.substr(at + 1, header.find('\'', at + 1) - at - 1);
  at = value_of("fortran_order");
  DDP_USAGE_CHECK(header.compare(at, 5, "False") == 0 || header.compare(at, 4, "True") == 0,
                  "{}: malformed fortran_order in .npy header", path);
  array.fortran_order = header.compare(at, 4, "True") == 0;
  at = value_of("shape");
  DDP_USAGE_CHECK(header[at] == '(', "{}: malformed shape in .npy header", path);
  const std::string shape = header.substr(at + 1, header.find(')', at) - at - 1);
  size_t pos = 0;
  while (pos < shape.size()) {
    while (pos < shape.size() && (shape[pos] == ' ' || shape[pos] == ','))
      ++pos;
    if (pos >= shape.size()) break;
    size_t used = 0;
    long long dim = -1;
    try {
      dim = std::stoll(shape.substr(pos), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DDP_USAGE_CHECK(used > 0 && dim >= 0, "{}: malformed shape '({})' in .npy header", path, shape);
    array.shape.push_back(dim);
    pos += used;
  }
  size_t item = 0;
  if (array.dtype == "<f4" || array.dtype == "<i4")
    item = 4;
  else if (array.dtype == "<i8" || array.dtype == "<f8")
    item = 8;
  else if (array.dtype == "|u1" || array.dtype == "|i1")
    item = 1;
  else if (array.dtype == "<f2" || array.dtype == "<i2")
    item = 2;
  DDP_USAGE_CHECK(item != 0, "{}: unsupported dtype '{}'", path, array.dtype);
  // The header is checked against the file's size before anything is allocated: a small
  // file must not claim a huge array.
  const std::streamoff data_begin = in.tellg();
  in.seekg(0, std::ios::end);
  const std::streamoff file_bytes = in.tellg();
  in.seekg(data_begin);
  const uint64_t available =
      static_cast<uint64_t>(std::max<std::streamoff>(0, file_bytes - data_begin));
  uint64_t count = 1;
  for (int64_t d : array.shape)
    DDP_USAGE_CHECK(d > 0, "{}: shape ({}) has no elements; expected a non-empty [N, D] array",
                    path, shape);
  for (int64_t d : array.shape) {
    DDP_USAGE_CHECK(
        d == 0 || count <= available / static_cast<uint64_t>(d),
        "{}: the .npy header claims shape ({}) but the file holds only {} bytes of data", path,
        shape, available);
    count *= static_cast<uint64_t>(d);
  }
  DDP_USAGE_CHECK(
      count * item <= available,
      "{}: truncated .npy data: the header claims shape ({}) = {} bytes, the file holds {}", path,
      shape, count * item, available);
  array.data.resize(static_cast<size_t>(count) * item);
  in.read(array.data.data(), static_cast<std::streamsize>(array.data.size()));
  DDP_USAGE_CHECK(in.gcount() == static_cast<std::streamsize>(array.data.size()),
                  "{}: truncated .npy data: expected {} bytes, found {}", path, array.data.size(),
                  in.gcount());
  return array;
}

void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
               const void* data, size_t bytes, bool fortran_order) {
  std::string shape_text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    shape_text += std::to_string(shape[i]);
    if (shape.size() == 1)
      shape_text += ",";
    else if (i + 1 < shape.size())
      shape_text += ", ";
  }
  shape_text += ")";
  std::string header = "{'descr': '" + dtype +
                       "', 'fortran_order': " + (fortran_order ? "True" : "False") +
                       ", 'shape': " + shape_text + ", }";
  while ((10 + header.size() + 1) % 64 != 0)
    header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  DDP_USAGE_CHECK(out, "{}: cannot create", path);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.put(static_cast<char>(len & 0xff));
  out.put(static_cast<char>(len >> 8));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  DDP_USAGE_CHECK(out.good(), "{}: write failed", path);
}

namespace {

// IEEE half to float (normal, subnormal, zero, inf, NaN).
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const int exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ffu;
  float magnitude;
  if (exponent == 0)
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31)
    magnitude = mantissa == 0 ? INFINITY : NAN;
  else
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 1024.0f, exponent - 15);
  return sign ? -magnitude : magnitude;
}

// Element i (in file order) of a numeric .npy array, as a double.
double npy_element(const NpyArray& a, size_t i) {
  const char* p = a.data.data();
  auto as = [&](auto v) {
    std::memcpy(&v, p + i * sizeof(v), sizeof(v));
    return static_cast<double>(v);
  };
  if (a.dtype == "<f4") return as(float{});
  if (a.dtype == "<f8") return as(double{});
  if (a.dtype == "<i4") return as(int32_t{});
  if (a.dtype == "<i8") return as(int64_t{});
  if (a.dtype == "<i2") return as(int16_t{});
  if (a.dtype == "|u1") return as(uint8_t{});
  if (a.dtype == "|i1") return as(int8_t{});
  uint16_t h;  // "<f2"
  std::memcpy(&h, p + 2 * i, 2);
  return half_to_float(h);
}

const char* npy_type_name(const std::string& dtype) {
  if (dtype == "<f4") return "float32";
  if (dtype == "<f8") return "float64";
  if (dtype == "<f2") return "float16";
  if (dtype == "<i4") return "int32";
  if (dtype == "<i8") return "int64";
  if (dtype == "<i2") return "int16";
  if (dtype == "|u1") return "uint8";
  return "int8";
}

Split load_npy_split(const std::string& x_path, const std::string& y_path) {
  const NpyArray x = read_npy(x_path);
  const NpyArray y = read_npy(y_path);
  DDP_USAGE_CHECK(x.dtype == "<f4" || x.dtype == "<f8" || x.dtype == "<f2" || x.dtype == "|u1",
                  "{}: expected dtype float32, float64, float16 or uint8, found '{}'", x_path,
                  x.dtype);
  DDP_USAGE_CHECK(x.shape.size() == 2, "{}: expected shape [N, D], found {} dimensions", x_path,
                  x.shape.size());
  DDP_USAGE_CHECK(y.dtype == "<i4" || y.dtype == "<i8" || y.dtype == "<i2" || y.dtype == "|u1",
                  "{}: expected labels of dtype uint8, int16, int32 or int64, found '{}'", y_path,
                  y.dtype);
  if (x.dtype != "<f4" || x.fortran_order)
    spdlog::info("{}: {}{} data converted to float32 in C order", x_path, npy_type_name(x.dtype),
                 x.fortran_order ? " Fortran-ordered" : "");
  DDP_USAGE_CHECK(y.shape.size() == 1 && y.shape[0] == x.shape[0],
                  "{}: expected shape [{}] to match {}, found {} dimensions{}", y_path, x.shape[0],
                  x_path, y.shape.size(),
                  y.shape.empty() ? "" : fmt::format(" [{}...]", y.shape[0]));
  DDP_USAGE_CHECK(x.shape[0] > 0 && x.shape[1] > 0 && x.shape[1] < (1 << 24),
                  "{}: expected a non-empty [N, D] array, found shape [{}, {}]", x_path, x.shape[0],
                  x.shape[1]);
  Split split;
  split.labels_file = y_path;
  split.n = x.shape[0];
  split.dim = static_cast<int>(x.shape[1]);
  split.x.resize(static_cast<size_t>(split.n) * split.dim);
  if (x.dtype == "<f4" && !x.fortran_order) {
    std::memcpy(split.x.data(), x.data.data(), x.data.size());
  } else {
    const size_t n = static_cast<size_t>(split.n), d = static_cast<size_t>(split.dim);
    for (size_t r = 0; r < n; ++r)
      for (size_t c = 0; c < d; ++c)
        split.x[r * d + c] =
            static_cast<float>(npy_element(x, x.fortran_order ? c * n + r : r * d + c));
  }
  // NaN or Inf in the input would train to NaN weights: refuse it at load.
  for (size_t i = 0; i < split.x.size(); ++i)
    DDP_USAGE_CHECK(std::isfinite(split.x[i]),
                    "{}: non-finite value {} at index {} (sample {}, feature {})", x_path,
                    split.x[i], i, i / split.dim, i % split.dim);
  split.y.resize(split.n);
  for (int64_t i = 0; i < split.n; ++i) {
    const int64_t label = static_cast<int64_t>(npy_element(y, static_cast<size_t>(i)));
    DDP_USAGE_CHECK(label >= 0 && label < (1 << 24), "{}: label {} at index {} is out of range",
                    y_path, label, i);
    split.y[i] = static_cast<int32_t>(label);
  }
  return split;
}

}  // namespace

Dataset load_npy_dataset(const std::string& dir) {
  Dataset data;
  data.name = "npy:" + dir;
  data.train = load_npy_split(dir + "/train_x.npy", dir + "/train_y.npy");
  if (path_exists(dir + "/test_x.npy") || path_exists(dir + "/test_y.npy")) {
    data.test = load_npy_split(dir + "/test_x.npy", dir + "/test_y.npy");
    DDP_USAGE_CHECK(data.test.dim == data.train.dim,
                    "{}/test_x.npy: expected {} features like train_x.npy, found {}", dir,
                    data.train.dim, data.test.dim);
  }
  data.classes = count_classes(data);
  return data;
}

Dataset make_synthetic(int64_t train_n, int64_t test_n, int dim, int classes, uint64_t seed) {
  // Counter-based, filled by threads: the same values for any thread count (large
  // workloads generate gigabytes before their first step).
  const uint64_t base = mix_seed(seed, 0x5157);
  std::vector<float> centers(static_cast<size_t>(classes) * dim);
  for (size_t i = 0; i < centers.size(); ++i)
    centers[i] = -1.0f + 2.0f * counter_uniform01(mix_seed(base, 0), i);
  auto fill = [&](Split& split, int64_t n, uint64_t stream) {
    const uint64_t labels = mix_seed(base, stream), noise = mix_seed(base, stream + 1);
    split.n = n;
    split.dim = dim;
    split.x.resize(static_cast<size_t>(n) * dim);
    split.y.resize(n);
    for (int64_t i = 0; i < n; ++i)
      split.y[i] = static_cast<int>(counter_below(labels, i, static_cast<uint32_t>(classes)));
    const size_t total = split.x.size();
    parallel_for((total + 1) / 2, size_t{1} << 16, [&](size_t begin, size_t end) {
      for (size_t pair = begin; pair < end; ++pair) {
        float z[2];
        counter_normal_pair(noise, pair, &z[0], &z[1]);
        for (size_t k = 0; k < 2 && 2 * pair + k < total; ++k) {
          const size_t j = 2 * pair + k;
          const size_t sample = j / dim, feature = j % dim;
          split.x[j] = centers[static_cast<size_t>(split.y[sample]) * dim + feature] + 0.5f * z[k];
        }
      }
    });
  };
  Dataset data;
  data.name = "synthetic";
  fill(data.train, train_n, 1);
  fill(data.test, test_n, 3);
  data.classes = classes;
  return data;
}

}  // namespace ddp
