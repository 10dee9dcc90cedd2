#!/usr/bin/env python3
"""PyTorch's FSDP2 (`fully_shard`) on the model of tests/libtorch/unit_worker.cpp, the reference
of scripts/bench-units-memory.sh: an embedding, a depthwise-convolution block, BLOCKS residual
blocks (layer norm, DIM x DIM linear, tanh) each a `fully_shard` unit, mean pooling and a
classifier, the root sharded too; AdamW (lr 0.01, weight decay 0.01), `--steps` steps of the
global batch `--batch` (4 tokens a sample) split over the ranks. `--bf16-params`: FSDP2's
MixedPrecisionPolicy with bfloat16 parameters (gradients reduced in float32), as ddp's
param_dtype(kBFloat16). Run under ddprun or torchrun (NCCL with --cuda, else Gloo).

Rank 0 prints the unit worker's --peak line over the steps after the first: the most the
step's forward and backward grew above the step's start and the step's peak, counted by the CUDA
caching allocator (0 on the CPU: not counted there), the parameters and gradients this rank held
between steps, the model's bytes, a block's, the optimizer state's, and the mean step time:
"rank 0 window W held H ledger 0 model M block B optimizer O process P step_ms S".
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

VOCABULARY, TOKENS, CLASSES = 16, 4, 4  # unit_worker's kVocabulary, kTokens, kClasses


class ConvBlock(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv = torch.nn.Conv1d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x):  # (B, T, D)
        return x + torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.fc = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class Pool(torch.nn.Module):
    def forward(self, x):
        return x.mean(1)


def make_model(blocks, dim):
    """unit_worker's Sequential, with its module names: (the model, its residual blocks)."""
    body = [Block(dim) for _ in range(blocks)]
    net = torch.nn.Sequential(torch.nn.Embedding(VOCABULARY, dim), ConvBlock(dim), *body, Pool(),
                              torch.nn.Linear(dim, CLASSES))
    return net, body


def tensor_bytes(tensors):
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=60)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--bf16-params", action="store_true")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: expected at least 2 (the first is not counted)")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group("nccl" if args.cuda else "gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    if args.batch % ranks:
        parser.error(f"--batch {args.batch}: expected a multiple of the {ranks} ranks")
    device = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(1234)
    net, blocks = make_model(args.blocks, args.dim)
    model_bytes = tensor_bytes(net.parameters())
    block_bytes = tensor_bytes(blocks[0].parameters())
    net.to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if args.bf16_params else MixedPrecisionPolicy()
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(net, mp_policy=policy)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.01)
    torch.manual_seed(99)  # the data: every rank alike, its own share
    tokens = torch.randint(VOCABULARY, (args.batch, TOKENS)).to(device)
    labels = torch.randint(CLASSES, (args.batch,)).to(device)
    share = args.batch // ranks
    x, y = tokens[share * rank:share * (rank + 1)], labels[share * rank:share * (rank + 1)]

    def current():
        return torch.cuda.memory_allocated(device) if args.cuda else 0

    def peak():
        return torch.cuda.max_memory_allocated(device) if args.cuda else 0

    def sync():
        if args.cuda:
            torch.cuda.synchronize(device)

    window = held = most = 0
    timed = 0.0
    for step in range(args.steps):
        sync()
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        start = current()
        if step > 0:  # where the unit worker counts it: after zero_grad, at the step's start
            held = max(held, tensor_bytes(net.parameters()) +
                       tensor_bytes(p.grad for p in net.parameters()))
        if args.cuda:
            torch.cuda.reset_peak_memory_stats(device)
        loss = torch.nn.functional.cross_entropy(net(x).float(), y)
        loss.backward()
        if step > 0:
            window = max(window, peak() - start)
        optimizer.step()
        sync()
        if step > 0:
            most = max(most, peak())
            timed += time.perf_counter() - began
    state = tensor_bytes(v for s in optimizer.state.values() for v in s.values()
                         if torch.is_tensor(v) and v.dim() > 0)
    if rank == 0:
        print(f"rank 0 window {window} held {held} ledger 0 model {model_bytes} block {block_bytes} "
              f"optimizer {state} process {most} step_ms {1e3 * timed / (args.steps - 1):.3f}",
              flush=True)
    print(f"rank {rank} of {ranks} trained {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
