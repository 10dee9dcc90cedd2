// Host reductions by type.
#include "collectives/host_reduce.h"

#include <algorithm>
#include <cstring>

#include "runtime/error.h"

namespace ddp {
namespace {

template <typename T>
void reduce_typed(T* out, const T* a, const T* b, size_t count, ReduceOp op) {
  if (op == ReduceOp::kMax)
    for (size_t i = 0; i < count; ++i)
      out[i] = std::max(a[i], b[i]);
  else
    for (size_t i = 0; i < count; ++i)
      out[i] = a[i] + b[i];
}

// A 16-bit float type stored as uint16 (bfloat16, float16): each element widened to float,
// combined, rounded back once.
template <float (*widen)(uint16_t), uint16_t (*narrow)(float)>
void reduce_16bit(void* out, const void* a, const void* b, size_t count, ReduceOp op) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < count; ++i) {
    const float fx = widen(x[i]), fy = widen(y[i]);
    o[i] = narrow(op == ReduceOp::kMax ? std::max(fx, fy) : fx + fy);
  }
}

template <float (*widen)(uint16_t), uint16_t (*narrow)(float)>
void scale_16bit(void* buffer, size_t count, double divisor) {
  auto* p = static_cast<uint16_t*>(buffer);
  for (size_t i = 0; i < count; ++i)
    p[i] = narrow(static_cast<float>(widen(p[i]) / divisor));
}

}  // namespace

void reduce_into(void* out, const void* a, const void* b, size_t count, DataType type,
                 ReduceOp op) {
  switch (type) {
    case DataType::kFloat32:
      return reduce_typed(static_cast<float*>(out), static_cast<const float*>(a),
                          static_cast<const float*>(b), count, op);
    case DataType::kFloat64:
      return reduce_typed(static_cast<double*>(out), static_cast<const double*>(a),
                          static_cast<const double*>(b), count, op);
    case DataType::kInt32:
      return reduce_typed(static_cast<int32_t*>(out), static_cast<const int32_t*>(a),
                          static_cast<const int32_t*>(b), count, op);
    case DataType::kInt64:
      return reduce_typed(static_cast<int64_t*>(out), static_cast<const int64_t*>(a),
                          static_cast<const int64_t*>(b), count, op);
    case DataType::kBFloat16:
      return reduce_16bit<bf16_to_float, float_to_bf16>(out, a, b, count, op);
    case DataType::kFloat16:  // each sum in float, rounded once to half (as NCCL's)
      return reduce_16bit<fp16_to_float, float_to_fp16>(out, a, b, count, op);
  }
}

void reduce_blocks_in_order(void* out, const void* blocks, int n, size_t count, DataType type,
                            ReduceOp op) {
  const size_t bytes = count * dtype_bytes(type);
  const auto* base = static_cast<const char*>(blocks);
  std::memcpy(out, base, bytes);
  const ReduceOp combine = op == ReduceOp::kMax ? ReduceOp::kMax : ReduceOp::kSum;
  for (int r = 1; r < n; ++r)
    reduce_into(out, out, base + static_cast<size_t>(r) * bytes, count, type, combine);
  if (op == ReduceOp::kAverage) scale_by(out, count, type, n);
}

void scale_by(void* buffer, size_t count, DataType type, double divisor) {
  switch (type) {
    case DataType::kFloat32: {
      auto* p = static_cast<float*>(buffer);
      for (size_t i = 0; i < count; ++i)
        p[i] = static_cast<float>(p[i] / divisor);
      return;
    }
    case DataType::kFloat64: {
      auto* p = static_cast<double*>(buffer);
      for (size_t i = 0; i < count; ++i)
        p[i] /= divisor;
      return;
    }
    case DataType::kBFloat16:
      return scale_16bit<bf16_to_float, float_to_bf16>(buffer, count, divisor);
    case DataType::kFloat16:
      return scale_16bit<fp16_to_float, float_to_fp16>(buffer, count, divisor);
    default:
      throw UsageError(fmt::format(
          "average of {} values: use sum (integer types cannot be averaged)", dtype_name(type)));
  }
}

}  // namespace ddp
