// ddp's own MLP for one's own programs: its shape and initialisation (models/mlp.h) and the
// CPU model with its loss (models/mlp_cpu.h); and the data sets ddptrain reads (Fashion-MNIST's
// IDX files, .npy files, a synthetic set: models/dataset.h).
#pragma once

#include "models/dataset.h"
#include "models/mlp.h"
#include "models/mlp_cpu.h"
