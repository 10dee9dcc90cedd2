#!/usr/bin/env python3
"""torch_bench.py --model cnn|mlp --mode plain|ddp [--cuda] [--steps N] [--warmup N]: the step
ddp_torch_bench times, in Python: the example's network (batch 64) or the MLP of 50 M parameters
(batch 512), plain PyTorch or under PyTorch's DistributedDataParallel on one rank (NCCL on the
GPU, Gloo on the CPU), the same median of 5 rounds. Prints "ms_per_step X". Under torchrun
(RANK and WORLD_SIZE set) each rank trains its own batch. --adamw: AdamW (lr 1e-4) instead of
SGD with momentum; --zero: PyTorch's ZeroRedundancyOptimizer over it (ZeRO 1), whose
optimizer-state bytes on this rank are printed; --batch: the batch (the model's by default)."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


class FashionNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 10, 5)
        self.conv2 = torch.nn.Conv2d(10, 20, 5)
        self.dropout = torch.nn.Dropout2d()
        self.fc1 = torch.nn.Linear(320, 50)
        self.fc2 = torch.nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.dropout(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        x = F.dropout(x, 0.5, self.training)
        return F.log_softmax(self.fc2(x), 1)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        widths = [2048, 4096, 4096, 4096, 2048]
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return F.log_softmax(x, 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--mode", choices=["plain", "ddp"], default="plain")
    p.add_argument("--cuda", action="store_true")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--adamw", action="store_true")
    p.add_argument("--zero", action="store_true")
    p.add_argument("--batch", type=int, default=0)
    a = p.parse_args()
    device = torch.device("cuda" if a.cuda else "cpu")
    torch.manual_seed(0)
    net = (FashionNet() if a.model == "cnn" else Mlp()).to(device)
    model = net
    if a.mode == "ddp":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl" if a.cuda else "gloo",
                                rank=int(os.environ.get("RANK", 0)),
                                world_size=int(os.environ.get("WORLD_SIZE", 1)))
        model = torch.nn.parallel.DistributedDataParallel(net)
    kind, options = ((torch.optim.AdamW, {"lr": 1e-4}) if a.adamw else
                     (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}))
    if a.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=kind, **options)
    else:
        optimizer = kind(net.parameters(), **options)
    if a.model == "cnn":
        x, classes = torch.rand(a.batch or 64, 1, 28, 28, device=device), 10
    else:
        x, classes = torch.randn(a.batch or 512, 2048, device=device), 2048
    y = torch.randint(classes, (x.shape[0],), device=device)

    def step():
        optimizer.zero_grad()
        F.nll_loss(model(x), y).backward()
        optimizer.step()

    for _ in range(a.warmup):
        step()
    rounds = []
    for _ in range(5):
        if a.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(a.steps):
            step()
        if a.cuda:
            torch.cuda.synchronize()
        rounds.append((time.perf_counter() - start) * 1000 / a.steps)
    print(f"pytorch {a.model} {a.mode}{' zero' if a.zero else ''}: ms_per_step "
          f"{sorted(rounds)[2]:.4f}")
    if a.zero:
        inner = optimizer.optim
        state = sum(t.numel() * t.element_size() for s in inner.state.values()
                    for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
        print(f"rank {dist.get_rank()} optimizer state {state / 1048576:.1f} MiB")
    if a.mode == "ddp":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
