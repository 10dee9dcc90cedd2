#!/usr/bin/env python3
"""torch_bench.py --model cnn|mlp --mode plain|ddp [--cuda] [--steps N] [--warmup N]: the step
ddp_torch_bench times, in Python: the example's network (batch 64) or the MLP of 50 M parameters
(batch 512), plain PyTorch or under PyTorch's DistributedDataParallel on one rank (NCCL on the
GPU, Gloo on the CPU), the same median of 5 rounds. Prints "ms_per_step X"."""
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
    a = p.parse_args()
    device = torch.device("cuda" if a.cuda else "cpu")
    torch.manual_seed(0)
    net = (FashionNet() if a.model == "cnn" else Mlp()).to(device)
    model = net
    if a.mode == "ddp":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl" if a.cuda else "gloo", rank=0, world_size=1)
        model = torch.nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    if a.model == "cnn":
        x, classes = torch.rand(64, 1, 28, 28, device=device), 10
    else:
        x, classes = torch.randn(512, 2048, device=device), 2048
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
    print(f"pytorch {a.model} {a.mode}: ms_per_step {sorted(rounds)[2]:.4f}")
    if a.mode == "ddp":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
