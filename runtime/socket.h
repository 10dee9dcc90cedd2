// Small POSIX TCP helpers shared by the store client and server: an owning file descriptor,
// framed messages (u32 length + payload) and reads with a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace ddp {

// Owns a file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

using Deadline = std::chrono::steady_clock::time_point;
inline Deadline deadline_in(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(seconds));
}

// Largest message the store accepts, in bytes; larger frames drop the connection.
constexpr uint32_t kMaxStoreMessageBytes = 64u << 20;

// Connects to host:port, retrying until the deadline (the server may still be starting).
// Throws ddp::Error naming the address on failure.
UniqueFd tcp_connect(const std::string& host, int port, Deadline deadline);

// The peer closed the connection (read_exact found the end of the stream).
class ConnectionClosed : public Error {
 public:
  explicit ConnectionClosed(const std::string& message) : Error(message) {}
};

// The local "address:port" of a connected socket ("" when unknown).
std::string local_address(int fd);

// Writes all bytes or throws.
void write_all(int fd, const void* data, size_t bytes);
// Reads exactly `bytes` before the deadline; returns false on timeout, throws
// ConnectionClosed on EOF and ddp::Error on other errors.
bool read_exact(int fd, void* data, size_t bytes, Deadline deadline);

// Message encoding: strings as u32 length + bytes, integers little-endian.
class MessageWriter {
 public:
  MessageWriter& u8(uint8_t v);
  MessageWriter& u32(uint32_t v);
  MessageWriter& i64(int64_t v);
  MessageWriter& str(const std::string& v);
  MessageWriter& raw(const std::string& bytes);  // appended as is, no length
  // The framed message: u32 payload length, then the payload.
  std::string framed() const;
  const std::string& payload() const { return payload_; }

 private:
  std::string payload_;
};

// Decodes a payload; every read checks bounds and sets ok() false instead of overrunning.
class MessageReader {
 public:
  explicit MessageReader(const std::string& payload) : data_(payload) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string str();
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == data_.size(); }

 private:
  bool take(void* out, size_t bytes);
  const std::string& data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Every network interface with an IPv4 address, as "name=address"; and the address of
// interface `name` ("" when it has none).
std::vector<std::string> interface_addresses();
std::string interface_address(const std::string& name);

}  // namespace ddp
