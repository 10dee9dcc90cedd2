// The CUDA-free half of device binding: the duplicate-GPU check through the store.
#include <unistd.h>

#include <map>

#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/store.h"

namespace ddp {

std::string duplicate_gpu_message(const std::vector<GpuClaim>& claims) {
  std::map<std::string, std::vector<const GpuClaim*>> by_gpu;
  for (const GpuClaim& claim : claims)
    by_gpu[claim.host + "/" + claim.host_id + "/" + claim.uuid].push_back(&claim);
  std::string message;
  for (const auto& [key, owners] : by_gpu) {
    if (owners.size() < 2) continue;
    std::string ranks;
    for (const GpuClaim* c : owners)
      ranks += fmt::format("{}rank {} (CUDA_VISIBLE_DEVICES='{}')", ranks.empty() ? "" : ", ",
                           c->rank, c->visible_devices);
    message +=
        fmt::format("{}two ranks on one GPU: {} all use {} on host {}{}",
                    message.empty() ? "" : "; ", ranks, owners[0]->uuid, owners[0]->host,
                    owners[0]->host_id.empty()
                        ? ""
                        : fmt::format(" with the same NCCL_HOSTID '{}'", owners[0]->host_id));
  }
  if (!message.empty())
    message +=
        "; give each rank its own GPU (ddprun does; under mpirun set CUDA_VISIBLE_DEVICES "
        "per rank or leave it unset), or, to test several ranks on one GPU, use ddprun "
        "--share-gpu (DDP_SHARE_GPU=1 under mpirun/srun)";
  return message;
}

void check_unique_gpus(StoreClient& store, const ProcessEnv& env, const DeviceInfo& device,
                       double timeout_s) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string prefix = fmt::format("ddp/gpu/{}/", env.restart_count);
  const std::string host_id = env.share_gpu ? env.nccl_host_id : "";
  store.set(prefix + std::to_string(env.rank),
            fmt::format("{}\t{}\t{}\t{}", host, device.uuid, device.visible_devices, host_id));
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r)
    keys.push_back(prefix + std::to_string(r));
  store.wait(keys, timeout_s);
  std::vector<GpuClaim> claims;
  for (int r = 0; r < env.world_size; ++r) {
    const std::string value = store.get(keys[r]).value_or("");
    const size_t a = value.find('\t');
    const size_t b = value.find('\t', a + 1);
    const size_t c = value.find('\t', b + 1);
    DDP_CHECK(a != std::string::npos && b != std::string::npos && c != std::string::npos,
              "malformed GPU claim of rank {}: {}", r, value);
    claims.push_back({r, value.substr(0, a), value.substr(a + 1, b - a - 1),
                      value.substr(b + 1, c - b - 1), value.substr(c + 1)});
  }
  const std::string message = duplicate_gpu_message(claims);
  DDP_CHECK(message.empty(), "{}", message);
}

std::string describe_phases(const DeviceInfo& d) {
  return fmt::format(
      "bound {} ({}, sm_{}{}, {:.1f} GiB, {}) [{}]: driver init {:.1f} ms, context {:.1f} ms, "
      "first "
      "allocation {:.2f} ms, first kernel {:.2f} ms{}",
      d.name, d.uuid, d.cc_major, d.cc_minor, d.total_bytes / double(1u << 30), d.pci_bus_id,
      d.choice, d.phases.driver_ms, d.phases.context_ms, d.phases.first_alloc_ms,
      d.phases.first_kernel_ms,
      d.phases.attempts > 1 ? fmt::format(" ({} attempts)", d.phases.attempts) : "");
}

}  // namespace ddp
