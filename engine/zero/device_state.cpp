// DeviceWhole: a GPU replica's whole state in the rank's flat buffers.
#include "engine/zero/device_state.h"

namespace ddp {

void DeviceWhole::match_evaluation(int64_t samples, int64_t replicas, int64_t mine, int chunk) {
  (void)samples, (void)replicas, (void)mine, (void)chunk;  // whole replicas gather nothing
}

std::vector<float> DeviceWhole::params(size_t count) {
  std::vector<float> host(count);
  weights_.get(host.data());
  return host;
}

NamedState DeviceWhole::optimizer_state(size_t count) {
  (void)count;  // the buffers'
  return weights_.optimizer_state();
}

std::string DeviceWhole::describe_update(size_t count) const {
  (void)count;
  return "after backward";
}

}  // namespace ddp
