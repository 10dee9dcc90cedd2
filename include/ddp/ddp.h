// ddp for one's own programs, in one include: ddp::init() and the World it returns
// (engine/setup/world.h), ddp::Ddp with DdpOptions and the layout check (engine/sync/ddp.h), and
// the communicator for collectives of one's own (collectives/communicator.h). Each header states
// its contract; this one only gathers them.
#pragma once

#include "collectives/communicator.h"
#include "engine/setup/world.h"
#include "engine/sync/ddp.h"
#include "runtime/error.h"
