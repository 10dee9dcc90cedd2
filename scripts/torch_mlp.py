#!/usr/bin/env python3
"""The PyTorch reference for ddptrain's benchmarks: the same MLP (Linear + ReLU, logits out),
softmax cross-entropy, SGD with momentum, on Fashion-MNIST read from the same IDX files or on
random inputs. Prints one JSON line with samples/s so that scripts can compare side by side.
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


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", default="784,512,512,10")
    p.add_argument("--data", choices=["fashion", "random"], default="fashion")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    widths = [int(w) for w in args.layers.split(",")]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)

    if args.data == "fashion":
        x = torch.from_numpy(read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz"))
                             .reshape(-1, widths[0]).astype(np.float32) / 255.0)
        y = torch.from_numpy(read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz"))
                             .astype(np.int64))
        tx = torch.from_numpy(read_idx(os.path.join(args.data_dir, "t10k-images-idx3-ubyte.gz"))
                              .reshape(-1, widths[0]).astype(np.float32) / 255.0)
        ty = torch.from_numpy(read_idx(os.path.join(args.data_dir, "t10k-labels-idx1-ubyte.gz"))
                              .astype(np.int64))
    else:
        x = torch.randn(60000, widths[0])
        y = torch.randint(0, widths[-1], (60000,))
        tx, ty = x[:10000], y[:10000]

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


if __name__ == "__main__":
    main()
