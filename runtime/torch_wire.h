// PyTorch's TCPStore wire format, what its server (launcher/torch_store.h) and ddp's client
// of it (runtime/store_torch.cpp) share: integers as u64 little-endian, strings as a u64 length
// and their bytes, and the magic number PyTorch 2.x's validate query carries.
#pragma once

#include <cstdint>
#include <string>

namespace ddp::torch_wire {

// PyTorch 2.x validates a connection with this (little-endian bytes CE F7 85 3C), and some
// 2.x releases put it before every query too.
constexpr uint32_t kTorch2Magic = 0x3C85F7CE;

inline void put_u64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void put_bytes(std::string* out, const std::string& v) {
  put_u64(out, v.size());
  out->append(v);
}
// The u64 at `at` of `in` (which holds at least eight bytes there).
inline uint64_t get_u64(const std::string& in, size_t at = 0) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
  return v;
}

}  // namespace ddp::torch_wire
