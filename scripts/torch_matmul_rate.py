#!/usr/bin/env python3
"""cuBLAS time (through PyTorch) for the matrix products of one training step of an MLP:
for every layer the forward, weight-gradient and input-gradient products at the given batch
and precision, each timed with CUDA events (median of repeats). Prints JSON: the summed time
in ms and the FLOP rate, the ceiling against which ddptrain's step is compared."""
import argparse
import json

import torch


def timed(fn, repeats=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="tf32")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    widths = [int(w) for w in args.layers.split(",")]
    b = args.batch_size
    total_ms, flops = 0.0, 0.0
    for i in range(len(widths) - 1):
        k, n = widths[i], widths[i + 1]
        x = torch.randn(b, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype)
        dy = torch.randn(b, n, device="cuda", dtype=dtype)
        total_ms += timed(lambda: x @ w.t())          # forward
        total_ms += timed(lambda: dy.t() @ x)         # weight gradient
        flops += 4.0 * b * k * n
        if i > 0:
            total_ms += timed(lambda: dy @ w)         # input gradient
            flops += 2.0 * b * k * n
    print(json.dumps({"precision": args.precision, "matmul_ms": total_ms,
                      "tflops": flops / total_ms / 1e9}))


if __name__ == "__main__":
    main()
