// ddp for one's own programs, in one include: ddp::init() and the World it returns
// (engine/world.h), ddp::Ddp with DdpOptions and the layout check (engine/ddp.h), and the
// communicator for collectives of one's own (collectives/communicator.h). Each header states
// its contract; this one only gathers them.
#pragma once

#include "collectives/communicator.h"
#include "engine/ddp.h"
#include "engine/world.h"
#include "runtime/error.h"
