// ddpdoctor: checks a machine before a job runs: what this build has, the NVIDIA driver
// and the CUDA runtime (and whether they fit), the GPUs and their architectures against the
// ones compiled in, what CUDA_VISIBLE_DEVICES maps to, NCCL, peer access between GPUs, and
// the launchers. Each line says ok, warn or FAIL with what to do; exit 1 on any FAIL.
// NVML and NCCL are opened with dlopen so that a missing library is reported, not fatal.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/munge_auth.h"
#include "runtime/nvml.h"
#include "runtime/process_env.h"
#include "runtime/socket.h"

#if DDP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace {

bool g_require_gpu = false;  // --require-gpu: no GPU is a failure, not a warning

int g_failures = 0;
int g_warnings = 0;

void report(const char* level, const std::string& what, const std::string& detail) {
  if (std::string(level) == "FAIL") ++g_failures;
  if (std::string(level) == "warn") ++g_warnings;
  std::printf("%-4s  %-22s %s\n", level, what.c_str(), detail.c_str());
}

std::string yes_no(bool built, const char* missing) {
  return built ? "built" : fmt::format("left out ({})", missing);
}

void check_build() {
  report("ok", "ddp", fmt::format("version {}", DDP_VERSION));
  report(DDP_HAVE_CUDA ? "ok" : "warn", "build: CUDA",
         yes_no(DDP_HAVE_CUDA, "no toolkit at configure time: --device cuda unavailable"));
  report(DDP_HAVE_NCCL ? "ok" : "warn", "build: NCCL",
         yes_no(DDP_HAVE_NCCL, "GPU collectives unavailable"));
  report(DDP_HAVE_GLOO ? "ok" : "warn", "build: Gloo",
         yes_no(DDP_HAVE_GLOO, "install libgloo-dev and rebuild for CPU collectives under ddprun"));
  report(DDP_HAVE_MPI ? "ok" : "warn", "build: MPI",
         yes_no(DDP_HAVE_MPI, "install libopenmpi-dev and rebuild for mpirun"));
  const std::string torch = DDP_TORCH;
  report(!torch.empty() ? "ok" : "warn", "build: LibTorch",
         !torch.empty()
             ? fmt::format("built ({}): ddp::DistributedDataParallel, find_package(ddp "
                           "COMPONENTS torch)",
                           torch)
             : std::string("left out (install libtorch-dev, or set Torch_DIR, and rebuild for "
                           "ddp::DistributedDataParallel on LibTorch modules)"));
  report(DDP_HAVE_OPENBLAS ? "ok" : "warn", "build: OpenBLAS",
         yes_no(DDP_HAVE_OPENBLAS, "CPU products use slow loops; install libopenblas-dev"));
  // MUNGE: whether srun's store can admit other hosts' processes by user, here and now.
  if (!ddp::munge_built()) {
    report("warn", "build: MUNGE",
           "left out (install libmunge-dev and rebuild: under srun the store then admits other "
           "hosts' processes by MUNGE, not by token alone)");
    return;
  }
  const ddp::ProcessEnv env = ddp::ProcessEnv::detect();
  std::string why;
  const bool answers = ddp::munge_credential("ddpdoctor", env.munge_socket, &why).has_value();
  report("ok", "build: MUNGE",
         answers ? "built; this host's munged answers: under srun the store admits only the job's "
                   "user"
                 : fmt::format("built; not usable here ({}): under srun the store admits other "
                               "hosts' processes by token alone",
                               why));
}

void check_driver_and_gpus(std::vector<std::string>* uuids) {
  const ddp::Nvml nvml;
  if (!nvml.library_found()) {
    report(g_require_gpu ? "FAIL" : "warn", "NVIDIA driver",
           "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine (CPU training works: "
           "--device cpu; --require-gpu makes this a failure)");
    return;
  }
  if (!nvml.available()) {
    report("FAIL", "NVIDIA driver", nvml.why());
    return;
  }
  const std::string version = nvml.driver_version();
  const unsigned count = static_cast<unsigned>(std::max(0, nvml.device_count()));
  report(count > 0       ? "ok"
         : g_require_gpu ? "FAIL"
                         : "warn",
         "NVIDIA driver", fmt::format("driver {}, {} GPU(s) on this machine", version, count));
  for (unsigned i = 0; i < count; ++i) {
    ddp::Nvml::Device device;
    if (!nvml.device(i, &device)) continue;
    const std::string& name = device.name;
    const std::string& uuid = device.uuid;
    const int major = device.cc_major, minor = device.cc_minor;
    uuids->push_back(uuid);
    const std::string arch = fmt::format("{}{}", major, minor);
#if DDP_HAVE_CUDA
    const std::string built = DDP_CUDA_ARCHITECTURES;
    const bool has = (std::string(",") + built + ",").find("," + arch) != std::string::npos;
    report(has ? "ok" : "FAIL", fmt::format("GPU {}", i),
           fmt::format("{} {} sm_{}{}", name, uuid, arch,
                       has ? fmt::format(" (built for {})", built)
                           : fmt::format(": this build has code for {} only; rebuild with "
                                         "-DCMAKE_CUDA_ARCHITECTURES={}",
                                         built, arch)));
#else
    report("ok", fmt::format("GPU {}", i), fmt::format("{} {} sm_{}", name, uuid, arch));
#endif
  }
}

void check_visible_devices(const ddp::ProcessEnv& env, const std::vector<std::string>& uuids) {
  if (!env.cuda_visible_devices_set) {
    report("ok", "CUDA_VISIBLE_DEVICES",
           fmt::format("unset: all {} GPU(s) visible; ddprun gives each worker one", uuids.size()));
    return;
  }
  std::string mapping;
  bool bad = false;
  int index = 0;
  size_t start = 0;
  const std::string& value = env.cuda_visible_devices;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string::npos) end = value.size();
    const std::string id = value.substr(start, end - start);
    start = end + 1;
    if (id.empty()) continue;
    std::string target = "?";
    if (id.rfind("GPU-", 0) == 0) {
      for (size_t i = 0; i < uuids.size(); ++i)
        if (uuids[i].rfind(id, 0) == 0) target = fmt::format("GPU {}", i);
    } else {
      const int physical = std::atoi(id.c_str());
      if (physical >= 0 && physical < static_cast<int>(uuids.size()))
        target = fmt::format("GPU {} ({})", physical, uuids[physical]);
    }
    bad = bad || target == "?";
    mapping += fmt::format("{}cuda:{} -> {}", mapping.empty() ? "" : ", ", index++,
                           target == "?" ? id + " (no such GPU)" : target);
  }
  report(bad ? "FAIL" : "ok", "CUDA_VISIBLE_DEVICES",
         fmt::format("'{}': {}{}", value, mapping.empty() ? "no GPU visible" : mapping,
                     bad ? "; fix the list (invalid device ordinal otherwise)" : ""));
}

void check_cuda(int gpus) {
#if DDP_HAVE_CUDA
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  if (driver == 0) {
    report(gpus > 0 ? "FAIL" : "warn", "CUDA runtime",
           fmt::format("runtime {}.{}, no CUDA driver", runtime / 1000, runtime % 1000 / 10));
    return;
  }
  const bool fits = driver / 1000 >= runtime / 1000;
  report(fits ? "ok" : "FAIL", "CUDA runtime",
         fmt::format("driver supports CUDA {}.{}, this build's runtime is {}.{}{}", driver / 1000,
                     driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10,
                     fits ? "" : ": update the driver"));
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    report("FAIL", "CUDA devices",
           fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(cudaGetLastError())));
    return;
  }
  std::string pairs;
  bool all = true;
  for (int a = 0; a < count; ++a)
    for (int b = 0; b < count; ++b) {
      if (a == b) continue;
      int can = 0;
      cudaDeviceCanAccessPeer(&can, a, b);
      all = all && can;
      if (!can) pairs += fmt::format("{}{}->{}", pairs.empty() ? "" : " ", a, b);
    }
  if (count > 1)
    report(
        all ? "ok" : "warn", "peer access",
        all ? fmt::format("every pair of the {} visible GPUs", count)
            : fmt::format("missing for {} (NCCL goes through host memory there: slower)", pairs));
#else
  (void)gpus;
  report("warn", "CUDA runtime", "not built");
#endif
}

void check_nccl() {
  void* lib = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    report(DDP_HAVE_NCCL ? "FAIL" : "warn", "NCCL", "libnccl.so.2 not found at run time");
    return;
  }
  auto version = reinterpret_cast<int (*)(int*)>(::dlsym(lib, "ncclGetVersion"));
  int v = 0;
  if (version) version(&v);
  report("ok", "NCCL",
         fmt::format("{}.{}.{} (NCCL_NVLS_ENABLE={})", v / 10000, v / 100 % 100, v % 100,
                     std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "unset"));
  // --nccl-symmetric registers the gradients with ncclCommWindowRegister (NCCL 2.27 and later).
  const bool windows = ::dlsym(lib, "ncclCommWindowRegister") != nullptr;
  report(windows ? "ok" : "warn", "NCCL windows",
         windows ? std::string("ncclCommWindowRegister found (ddptrain --nccl-symmetric)")
                 : std::string("this NCCL has no ncclCommWindowRegister (2.27 and later): "
                               "ddptrain --nccl-symmetric is refused"));
}

void check_launchers(const ddp::ProcessEnv& env) {
  report("ok", "launcher",
         fmt::format("this process: {} (rank {} of {})", ddp::launcher_name(env.launcher), env.rank,
                     env.world_size));
  const bool mpirun = std::system("command -v mpirun >/dev/null 2>&1") == 0;
  report(mpirun || !DDP_HAVE_MPI ? "ok" : "warn", "mpirun",
         mpirun ? "on PATH" : "not on PATH (ddprun works without it)");
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--require-gpu") {
      g_require_gpu = true;
      continue;
    }
    const bool help = arg == "--help" || arg == "-h";
    if (!help) std::fprintf(stderr, "ddpdoctor: error: unknown argument '%s'\n", argv[i]);
    std::printf(
        "usage: ddpdoctor [--require-gpu]\nChecks this machine for ddp: build, driver, runtime, "
        "GPUs and architectures,\n"
        "CUDA_VISIBLE_DEVICES mapping, NCCL, peer access, launchers. Exit 1 on any FAIL.\n"
        "A machine without GPUs is fine for CPU training (warnings only) unless --require-gpu.\n");
    return help ? 0 : 2;
  }
  const ddp::ProcessEnv env = ddp::ProcessEnv::detect();
  check_build();
  std::vector<std::string> uuids;
  check_driver_and_gpus(&uuids);
  check_visible_devices(env, uuids);
  check_cuda(static_cast<int>(uuids.size()));
  check_nccl();
  check_launchers(env);
  // Where Gloo and NCCL's sockets would listen: GLOO_SOCKET_IFNAME, else the host name's
  // address (Debian maps it to 127.0.1.1, fine on one node, not across nodes).
  const std::vector<std::string> interfaces = ddp::interface_addresses();
  if (!env.socket_iface.empty())
    report(ddp::interface_address(env.socket_iface).empty() ? "FAIL" : "ok", "network",
           fmt::format("GLOO_SOCKET_IFNAME={} ({}); interfaces: {}", env.socket_iface,
                       ddp::interface_address(env.socket_iface).empty()
                           ? "no such interface"
                           : ddp::interface_address(env.socket_iface),
                       fmt::join(interfaces, ", ")));
  else
    report("ok", "network",
           fmt::format("interfaces: {}; several nodes: choose one with ddprun --iface NAME",
                       fmt::join(interfaces, ", ")));
  std::printf("%s: %d failure(s), %d warning(s)\n", g_failures ? "FAIL" : "ok", g_failures,
              g_warnings);
  return g_failures ? 1 : 0;
}
