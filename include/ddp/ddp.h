// ddp for one's own programs, in one include: ddp::init() and the World it returns
// (dist/world.h), ddp::Reducer with DdpOptions and the layout check (dist/ddp.h), and
// the communicator for collectives of one's own (collectives/communicator.h). Each header states
// its contract; this one only gathers them.
#pragma once

#include "collectives/communicator.h"
#include "dist/ddp.h"
#include "dist/world.h"
#include "runtime/error.h"
