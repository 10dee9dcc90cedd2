// The Gloo backend: CPU buffers over TCP; rendezvous through our store.
#pragma once

#include <memory>
#include <string>

#include "collectives/communicator.h"

namespace ddp {

// Collective over `size` ranks: connects a full mesh through `store` under key `prefix`,
// listening on `hostname` (127.0.0.1 for a single-node job), or on interface NAME when
// `hostname` is "iface:NAME".
std::unique_ptr<Communicator> make_gloo_communicator(int rank, int size,
                                                     std::shared_ptr<StoreClient> store,
                                                     const std::string& prefix, double timeout_s,
                                                     const std::string& hostname);

}  // namespace ddp
