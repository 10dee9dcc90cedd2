#!/usr/bin/env python3
"""torch_bench.py --model cnn|mlp|resnet|transformer --mode plain|ddp|both [--cuda] [--steps N]
[--rounds N] [--warmup N] [--dtype fp32|bf16]: the step ddp_torch_bench times, in Python: the
example's network (batch 64), the MLP of 50 M parameters (batch 512), ResNet-18 as for CIFAR-10
(batch 128) or 4 transformer blocks of width 1024 (batch 16 of 256 tokens), plain PyTorch or
under PyTorch's DistributedDataParallel on one rank (NCCL on the GPU, Gloo on the CPU), or both
in one process with their rounds interleaved (--mode both); the same median of --rounds rounds
(5). Prints "ms_per_step X rounds ..." (then every round in order). Under torchrun (RANK and
WORLD_SIZE set) each rank trains its own batch. --adamw: AdamW (lr 1e-4) instead of SGD with
momentum; --zero: PyTorch's ZeroRedundancyOptimizer over it (ZeRO 1, with --mode ddp), whose
optimizer-state bytes on this rank are printed; --batch: the batch (the model's by default);
--dtype bf16: the model and its input in bfloat16 (the loss in float32); --hook bf16 or
powersgd: PyTorch's bf16_compress_hook or powerSGD_hook (rank --powersgd-rank, from the 11th
step) on the DDP model. With --cuda under torchrun each process uses its LOCAL_RANK's GPU."""
import math
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


class BasicBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.down = self.down_bn = None
        if stride != 1 or cin != cout:
            self.down = torch.nn.Conv2d(cin, cout, 1, stride, bias=False)
            self.down_bn = torch.nn.BatchNorm2d(cout)

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.down is None else self.down_bn(self.down(x))))


class ResNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.stem_bn = torch.nn.BatchNorm2d(64)
        self.fc = torch.nn.Linear(512, 10)
        blocks, cin = [], 64
        for cout in (64, 128, 256, 512):
            for b in range(2):
                blocks.append(BasicBlock(cin, cout, 2 if b == 0 and cout != 64 else 1))
                cin = cout
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x):
        x = F.relu(self.stem_bn(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return F.log_softmax(self.fc(x.mean((2, 3))).float(), 1)


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, d = x.shape
        heads = 16
        q, k, v = (p.transpose(1, 2) for p in self.qkv(self.norm1(x)).view(b, t, 3, heads, d // heads).unbind(2))
        a = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(d // heads), -1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(1024, 1000)
        self.blocks = torch.nn.ModuleList(Block(1024) for _ in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return F.log_softmax(self.head(x.mean(1)).float(), 1)


def timed_rounds(step_fns, names, steps, rounds, warmup, cuda):
    """Each named step function run `warmup` times, then `rounds` rounds of `steps` steps, the
    functions' rounds interleaved (the first first in even rounds, last first in odd ones):
    ms a step of every round, by name."""
    for name in names:
        for _ in range(warmup):
            step_fns[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                step_fns[name]()
            if cuda:
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) * 1000 / steps)
    return times


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["cnn", "mlp", "resnet", "transformer"], default="cnn")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--mode", choices=["plain", "ddp", "both"], default="plain")
    p.add_argument("--cuda", action="store_true")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--adamw", action="store_true")
    p.add_argument("--zero", action="store_true")
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--hook", choices=["none", "bf16", "powersgd"], default="none")
    p.add_argument("--powersgd-rank", type=int, default=1)
    a = p.parse_args()
    # Under torchrun each process takes its local rank's GPU.
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if a.cuda else torch.device("cpu")
    if a.cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    if a.mode != "plain":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl" if a.cuda else "gloo",
                                rank=int(os.environ.get("RANK", 0)),
                                world_size=int(os.environ.get("WORLD_SIZE", 1)))
    kind, options = ((torch.optim.AdamW, {"lr": 1e-4}) if a.adamw else
                     (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}))
    shape, classes = {"cnn": ((a.batch or 64, 1, 28, 28), 10), "mlp": ((a.batch or 512, 2048), 2048),
                      "resnet": ((a.batch or 128, 3, 32, 32), 10),
                      "transformer": ((a.batch or 16, 256, 1024), 1000)}[a.model]
    names = {"plain": ["plain"], "ddp": ["ddp"], "both": ["plain", "ddp"]}[a.mode]
    step_fns, optimizers = {}, {}
    for name in names:
        torch.manual_seed(0)  # the same weights in every mode
        net = {"cnn": FashionNet, "mlp": Mlp, "resnet": ResNet, "transformer": Transformer}[a.model]()
        net = net.to(device, dtype)
        model = torch.nn.parallel.DistributedDataParallel(net) if name == "ddp" else net
        if name == "ddp" and a.hook == "bf16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            model.register_comm_hook(None, default_hooks.bf16_compress_hook)
        if name == "ddp" and a.hook == "powersgd":  # as ddp_torch_bench's: from the 11th step
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
            powersgd = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=a.powersgd_rank,
                start_powerSGD_iter=10)
            model.register_comm_hook(powersgd, powerSGD_hook.powerSGD_hook)
        if a.zero:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=kind, **options)
        else:
            optimizer = kind(net.parameters(), **options)
        optimizers[name] = optimizer

        def step(model=model, optimizer=optimizer):
            optimizer.zero_grad()
            F.nll_loss(model(x).float(), y).backward()
            optimizer.step()
        step_fns[name] = step
    x = torch.randn(*shape, device=device, dtype=dtype)
    y = torch.randint(classes, (x.shape[0],), device=device)
    times = timed_rounds(step_fns, names, a.steps, a.rounds, a.warmup, a.cuda)
    for name in names:
        hook = f" hook {a.hook}" if name == "ddp" and a.hook != "none" else ""
        print(f"pytorch {a.model} {name}{' zero' if a.zero else ''}{hook}{' bf16' if a.dtype == 'bf16' else ''}: "
              f"ms_per_step {sorted(times[name])[len(times[name]) // 2]:.4f} rounds "
              + " ".join(f"{t:.6f}" for t in times[name]))
    if a.zero:
        inner = optimizers[names[-1]].optim
        state = sum(t.numel() * t.element_size() for s in inner.state.values()
                    for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
        print(f"rank {dist.get_rank()} optimizer state {state / 1048576:.1f} MiB")
    if a.mode != "plain":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
