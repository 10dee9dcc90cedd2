// ddp::Error and the DDP_CHECK* macros: every failure carries the process context (rank/world,
// device), and the failing statement and file:line apart (where(), for DDP_DEBUG=1 and the
// debug log: a user reads no build paths or assert text); user errors carry only a message.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace ddp {

// An error with context. what() is the one-line message a user reads: the cause first, then
// "[rank r/w, device d]" for internal failures; where() says where in the source it failed.
class Error : public std::runtime_error {
 public:
  // An error whose what() is `message`.
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  // The same, failed at `where` ("file:line: statement").
  Error(const std::string& message, std::string where)
      : std::runtime_error(message), where_(std::move(where)) {}
  // Where in the source a check failed ("file:line: statement"), or empty.
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// What a program prints of `e`: what(), and with DDP_DEBUG=1 in the environment where a check
// failed in the source (" [at file:line: statement]").
std::string error_text(const std::exception& e);

// A bad flag, value or input file. what() names the flag or file, what was expected and
// what was found; no source location is added since the user cannot act on it.
class UsageError : public Error {
 public:
  // A usage error whose what() is `message`.
  explicit UsageError(const std::string& message) : Error(message) {}
};

// A NaN or Inf found in a loss, a gradient or the weights: the run stops, and nothing it
// computed since its last good step is written (no checkpoint, no weights).
class NonFiniteError : public Error {
 public:
  // A non-finite value's error whose what() is `message`.
  explicit NonFiniteError(const std::string& message) : Error(message) {}
};

// Process-wide context added to every error and log line; set once at start by main
// (or by the runtime when the rank and the device are known).
struct ProcessContext {
  int rank = 0;                // this process's rank
  int world = 1;               // the job's ranks
  std::string device = "cpu";  // "cpu", or the GPU it bound ("cuda:0 (H200)")
};
// Sets the context every later error and log line carries.
void set_process_context(const ProcessContext& context);
// The context set last (rank 0 of 1 on the CPU until then).
const ProcessContext& process_context();

namespace detail {
[[noreturn]] void throw_check_failed(const char* file, int line, const char* statement,
                                     const std::string& message);
}  // namespace detail

}  // namespace ddp

// Throws ddp::Error with the statement, file:line and rank when `cond` is false.
// The remaining arguments are an fmt format string and its values.
#define DDP_CHECK(cond, ...)                                                                  \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      ::ddp::detail::throw_check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
    }                                                                                         \
  } while (0)

// Throws ddp::UsageError (no source location): for bad flags and input files.
#define DDP_USAGE_CHECK(cond, ...)                                  \
  do {                                                              \
    if (!(cond)) throw ::ddp::UsageError(fmt::format(__VA_ARGS__)); \
  } while (0)
