// ddp for LibTorch programs (the package component `torch`, target ddp::torch):
// ddp::DistributedDataParallel over a torch::nn::Module (torch/distributed_data_parallel.h),
// its communication hooks, PowerSGD among them (torch/comm_hooks.h), ddp::SyncBatchNorm
// (torch/sync_batch_norm.h), ddp::Pipeline over a Sequential (torch/pipeline.h), shard units
// (torch/shard_unit.h), ddp::GradScaler (torch/grad_scaler.h), activation checkpointing
// (torch/checkpoint.h), sharded checkpoints (ddp::Checkpointer, torch/sharded_checkpoint.h), with
// ddp::init() and the World it returns, in one include.
#pragma once

#include "dist/world.h"
#include "runtime/error.h"
#include "torch/autocast.h"
#include "torch/checkpoint.h"
#include "torch/comm_hooks.h"
#include "torch/distributed_data_parallel.h"
#include "torch/grad_scaler.h"
#include "torch/pipeline.h"
#include "torch/shard_unit.h"
#include "torch/sharded_checkpoint.h"
#include "torch/sync_batch_norm.h"
