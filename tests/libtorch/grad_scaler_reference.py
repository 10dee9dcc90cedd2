#!/usr/bin/env python3
"""PyTorch's own torch.amp.GradScaler on the GPU, driven as unit_worker --scaler drives
ddp::GradScaler: init_scale 1024, growth_interval 2, an inf written into the first parameter's
gradient after the backward of the steps named by --overflow. Prints the lines unit_worker
prints ("rank 0 step S scale X stepped 0|1"), so that scripts/check-grad-scaler.sh can compare
the two sequences line by line. Needs PyTorch with CUDA (torch.amp.GradScaler("cuda"))."""
import argparse

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--overflow", default="")
    parser.add_argument("--init-scale", type=float, default=1024.0)
    parser.add_argument("--growth-interval", type=int, default=2)
    args = parser.parse_args()
    overflow = {int(s) for s in args.overflow.split(",") if s}
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).cuda()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", init_scale=args.init_scale,
                                  growth_interval=args.growth_interval)
    x = torch.randn(8, 16, device="cuda")
    y = torch.randint(0, 4, (8,), device="cuda")
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        scaler.scale(loss).backward()
        if step in overflow:
            with torch.no_grad():
                next(net.parameters()).grad.view(-1)[0] = float("inf")
        before = [p.detach().clone() for p in net.parameters()]
        scaler.step(optimizer)
        scaler.update()
        stepped = any(not torch.equal(b, p) for b, p in zip(before, net.parameters()))
        print(f"rank 0 step {step} scale {scaler.get_scale():g} stepped {int(stepped)}")


if __name__ == "__main__":
    main()
