// A program of its own under ddprun: ddp::init, then Reducer's layout check with rank 1's model
// different when asked (argv[1] = "differ"); prints the check's message and exits 2 on it.
// argv[1] = "uncaught": the same difference, the error left to ddp::init's terminate handler.
#include <cstdio>
#include <cstring>

#include "dist/ddp.h"
#include "dist/world.h"

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "uncaught") == 0) {
    ddp::World world = ddp::init();
    ddp::Reducer ddp(world.comm(), {{0, 8}, {8, 4}});
    ddp.check_same_layout({{"fc1.weight", 8}, {world.rank() == 1 ? "fc2.bias" : "fc2.weight", 4}});
    return 0;
  }
  try {
    ddp::World world = ddp::init();
    const bool differ = argc > 1 && std::strcmp(argv[1], "differ") == 0 && world.rank() == 1;
    ddp::Reducer ddp(world.comm(), {{0, 8}, {8, 4}});
    ddp.check_same_layout({{"fc1.weight", 8}, {differ ? "fc2.bias" : "fc2.weight", 4}});
    std::printf("rank %d: same layout\n", world.rank());
    return 0;
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "layout_worker: error: %s\n", e.what());
    return 2;
  }
}
