#!/usr/bin/env python3
"""The PyTorch reference for ddptrain's benchmarks: the same MLP (Linear + ReLU, logits out),
softmax cross-entropy, SGD with momentum 0.9, on Fashion-MNIST read from the same IDX files or
on random inputs kept on the device. On the CPU it times whole epochs; on CUDA it times
`--steps` steps after `--warmup` steps with torch.cuda.synchronize(), with --precision fp32,
tf32 (allow_tf32) or bf16 (autocast, float32 weights), in one of three modes: `eager`; `graph`
(PyTorch at its best on one GPU: fused SGD, the whole step, forward, loss, backward and
optimizer, captured in one CUDA graph and replayed, each step's batch copied into its static
input); `compile` (forward and loss through torch.compile, mode max-autotune-no-cudagraphs,
then the step captured as in `graph`). Under torchrun (eager only) it wraps the model in
DistributedDataParallel (NCCL). Prints one JSON line.
"""
import argparse
import gzip
import json
import math
import os
import time

import numpy as np
import torch


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndims = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims).reshape(dims)


def build_model(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", default="784,512,512,10")
    p.add_argument("--data", choices=["fashion", "random"], default="fashion")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--batch-size", type=int, default=128, help="per process")
    p.add_argument("--epochs", type=int, default=1, help="cpu: epochs to time")
    p.add_argument("--steps", type=int, default=200, help="cuda: steps to time")
    p.add_argument("--warmup", type=int, default=20, help="cuda: steps before timing")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", choices=["eager", "graph", "compile"], default="eager",
                   help="cuda: eager, the step in a CUDA graph, or compiled and in a graph")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="cuda: after the warm-up, this many steps inside a CUDA profiler capture "
                        "range (cudaProfilerStart/Stop, for ncu --profile-from-start off or nsys "
                        "--capture-range=cudaProfilerApi) before the timed steps")
    args = p.parse_args()
    if args.profile_steps < 0:
        raise SystemExit(f"--profile-steps {args.profile_steps}: expected 0 or more")

    t_start = time.perf_counter()
    widths = [int(w) for w in args.layers.split(",")]
    torch.manual_seed(args.seed)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
        return run_cpu(args, widths)
    return run_cuda(args, widths, t_start)


def run_cpu(args, widths):
    model = build_model(widths)
    x = torch.from_numpy(read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz"))
                         .reshape(-1, widths[0]).astype(np.float32) / 255.0)
    y = torch.from_numpy(read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz"))
                         .astype(np.int64))
    tx = torch.from_numpy(read_idx(os.path.join(args.data_dir, "t10k-images-idx3-ubyte.gz"))
                          .reshape(-1, widths[0]).astype(np.float32) / 255.0)
    ty = torch.from_numpy(read_idx(os.path.join(args.data_dir, "t10k-labels-idx1-ubyte.gz"))
                          .astype(np.int64))
    steps = args.epochs * x.shape[0] // args.batch_size
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    step = 0
    while step < steps:
        perm = torch.randperm(x.shape[0], generator=g)
        for b in range(x.shape[0] // args.batch_size):
            if step >= steps:
                break
            idx = perm[b * args.batch_size:(b + 1) * args.batch_size]
            loss = loss_fn(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
    seconds = time.perf_counter() - start
    with torch.no_grad():
        acc = (model(tx).argmax(1) == ty).float().mean().item()
    print(json.dumps({"impl": "pytorch " + torch.__version__, "threads": args.threads,
                      "steps": steps, "seconds": seconds,
                      "samples_per_s": steps * args.batch_size / seconds,
                      "test_accuracy": acc}))


def run_cuda(args, widths, t_start):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    model = build_model(widths).to(dev)
    if world > 1:
        if args.mode != "eager":
            raise SystemExit(f"--mode {args.mode}: one GPU only (under torchrun: eager)")
        torch.distributed.init_process_group("nccl", device_id=dev)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    n = max(4 * args.batch_size, 8192)
    x = torch.randn(n, widths[0], device=dev)
    y = torch.randint(0, widths[-1], (n,), device=dev)
    opt = make_sgd(model.parameters(), args, fused=args.mode != "eager")
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = n // args.batch_size
    B = args.batch_size

    def forward_loss(xb, yb):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            return loss_fn(model(xb), yb)

    if args.mode == "compile":
        forward_loss = torch.compile(forward_loss, mode="max-autotune-no-cudagraphs")

    if args.mode == "eager":
        def step(i):
            b = i % batches
            loss = forward_loss(x[b * B:(b + 1) * B], y[b * B:(b + 1) * B])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    else:
        step = captured_step(forward_loss, opt, x, y, B, batches)

    step(0)
    torch.cuda.synchronize()
    first_step_s = time.perf_counter() - t_start
    for i in range(1, args.warmup):
        step(i)
    torch.cuda.synchronize()
    if args.profile_steps > 0:
        torch.cuda.profiler.start()
        for i in range(args.profile_steps):
            step(i)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    start = time.perf_counter()
    for i in range(args.steps):
        step(i)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if world > 1:
        torch.distributed.destroy_process_group()
    if rank == 0:
        print(json.dumps({"impl": "pytorch " + torch.__version__, "world": world,
                          "mode": args.mode, "precision": args.precision, "steps": args.steps,
                          "ms_per_step": 1e3 * seconds / args.steps,
                          "samples_per_s": world * args.batch_size * args.steps / seconds,
                          "first_step_s": first_step_s}))


def make_sgd(params, args, fused):
    """SGD with momentum; `fused`: the one-kernel CUDA implementation where this PyTorch has it,
    else the multi-tensor one."""
    params = list(params)
    if fused:
        try:
            return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, fused=True)
        except (TypeError, RuntimeError):
            pass
    return torch.optim.SGD(params, lr=args.lr, momentum=args.momentum, foreach=True)


def captured_step(forward_loss, opt, x, y, batch, batches):
    """The whole step (forward, loss, backward, optimizer) captured in one CUDA graph, as
    PyTorch's documentation captures a whole network; warmed up on a side stream first. Each
    call copies batch i into the static input and replays the graph."""
    static_x = x[:batch].clone()
    static_y = y[:batch].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            forward_loss(static_x, static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = forward_loss(static_x, static_y)
        loss.backward()
        opt.step()

    def step(i):
        b = i % batches
        static_x.copy_(x[b * batch:(b + 1) * batch])
        static_y.copy_(y[b * batch:(b + 1) * batch])
        graph.replay()

    return step


if __name__ == "__main__":
    main()
