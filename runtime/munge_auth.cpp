// MUNGE through dlopen: the four calls the store needs, with munge.h's types.
#include "runtime/munge_auth.h"

#include <fmt/format.h>

#if DDP_HAVE_MUNGE
#include <dlfcn.h>
#include <munge.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#endif

namespace ddp {

#if DDP_HAVE_MUNGE
namespace {

// libmunge.so.2's calls, loaded once.
struct MungeLibrary {
  munge_err_t (*encode)(char**, munge_ctx_t, const void*, int) = nullptr;
  munge_err_t (*decode)(const char*, munge_ctx_t, void**, int*, uid_t*, gid_t*) = nullptr;
  const char* (*strerror)(munge_err_t) = nullptr;
  munge_ctx_t (*ctx_create)() = nullptr;
  void (*ctx_destroy)(munge_ctx_t) = nullptr;
  munge_err_t (*ctx_set)(munge_ctx_t, int, ...) = nullptr;
  std::string missing;  // why it cannot be used; empty when loaded
};

const MungeLibrary& library() {
  static MungeLibrary lib;
  static std::once_flag once;
  std::call_once(once, [] {
    void* handle = ::dlopen("libmunge.so.2", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      lib.missing = "libmunge.so.2 is not installed on this host (Debian's libmunge2)";
      return;
    }
    lib.encode = reinterpret_cast<decltype(lib.encode)>(::dlsym(handle, "munge_encode"));
    lib.decode = reinterpret_cast<decltype(lib.decode)>(::dlsym(handle, "munge_decode"));
    lib.strerror = reinterpret_cast<decltype(lib.strerror)>(::dlsym(handle, "munge_strerror"));
    lib.ctx_create =
        reinterpret_cast<decltype(lib.ctx_create)>(::dlsym(handle, "munge_ctx_create"));
    lib.ctx_destroy =
        reinterpret_cast<decltype(lib.ctx_destroy)>(::dlsym(handle, "munge_ctx_destroy"));
    lib.ctx_set = reinterpret_cast<decltype(lib.ctx_set)>(::dlsym(handle, "munge_ctx_set"));
    if (!lib.encode || !lib.decode || !lib.strerror || !lib.ctx_create || !lib.ctx_destroy ||
        !lib.ctx_set)
      lib.missing = "libmunge.so.2 lacks the calls of munge.h";
  });
  return lib;
}

// A context on `socket` where it is given (else libmunge's default); owns it.
class Context {
 public:
  Context(const MungeLibrary& lib, const std::string& socket) : lib_(lib), ctx_(lib.ctx_create()) {
    if (ctx_ && !socket.empty()) lib_.ctx_set(ctx_, MUNGE_OPT_SOCKET, socket.c_str());
  }
  ~Context() {
    if (ctx_) lib_.ctx_destroy(ctx_);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  munge_ctx_t get() const { return ctx_; }

 private:
  const MungeLibrary& lib_;
  munge_ctx_t ctx_;
};

}  // namespace

bool munge_built() {
  return true;
}

std::optional<std::string> munge_credential(const std::string& payload, const std::string& socket,
                                            std::string* why_not) {
  const MungeLibrary& lib = library();
  if (!lib.missing.empty()) {
    *why_not = lib.missing;
    return std::nullopt;
  }
  Context ctx(lib, socket);
  char* credential = nullptr;
  const munge_err_t err =
      lib.encode(&credential, ctx.get(), payload.data(), static_cast<int>(payload.size()));
  if (err != EMUNGE_SUCCESS) {
    *why_not = fmt::format("this host's munged: {}", lib.strerror(err));
    std::free(credential);
    return std::nullopt;
  }
  std::string result = credential;
  std::free(credential);
  return result;
}

std::optional<MungeIdentity> munge_decode_credential(const std::string& credential,
                                                     const std::string& socket,
                                                     std::string* why_not) {
  const MungeLibrary& lib = library();
  if (!lib.missing.empty()) {
    *why_not = lib.missing;
    return std::nullopt;
  }
  Context ctx(lib, socket);
  void* payload = nullptr;
  int length = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  const munge_err_t err = lib.decode(credential.c_str(), ctx.get(), &payload, &length, &uid, &gid);
  std::string data = payload != nullptr ? std::string(static_cast<char*>(payload),
                                                      static_cast<size_t>(std::max(length, 0)))
                                        : std::string();
  std::free(payload);
  if (err != EMUNGE_SUCCESS) {
    *why_not = fmt::format("its MUNGE credential: {}", lib.strerror(err));
    return std::nullopt;
  }
  return MungeIdentity{uid, gid, std::move(data)};
}

#else

bool munge_built() {
  return false;
}

std::optional<std::string> munge_credential(const std::string&, const std::string&,
                                            std::string* why_not) {
  *why_not = "built without MUNGE (install libmunge-dev and rebuild)";
  return std::nullopt;
}

std::optional<MungeIdentity> munge_decode_credential(const std::string&, const std::string&,
                                                     std::string* why_not) {
  *why_not = "built without MUNGE (install libmunge-dev and rebuild)";
  return std::nullopt;
}

#endif

}  // namespace ddp
