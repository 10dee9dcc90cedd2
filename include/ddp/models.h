// ddp's own MLP for one's own programs: its shape and initialisation (models/mlp.h) and the
// CPU model with its loss (models/mlp_cpu.h).
#pragma once

#include "models/mlp.h"
#include "models/mlp_cpu.h"
