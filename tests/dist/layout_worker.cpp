// A program of its own under ddprun: ddp::init, then Ddp's layout check with rank 1's model
// different when asked (argv[1] = "differ"); prints the check's message and exits 2 on it.
#include <cstdio>
#include <cstring>

#include "engine/setup/world.h"
#include "engine/sync/ddp.h"

int main(int argc, char** argv) {
  try {
    ddp::World world = ddp::init();
    const bool differ = argc > 1 && std::strcmp(argv[1], "differ") == 0 && world.rank() == 1;
    ddp::Ddp ddp(world.comm(), {{0, 8}, {8, 4}});
    ddp.check_same_layout({{"fc1.weight", 8}, {differ ? "fc2.bias" : "fc2.weight", 4}});
    std::printf("rank %d: same layout\n", world.rank());
    return 0;
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "layout_worker: error: %s\n", e.what());
    return 2;
  }
}
