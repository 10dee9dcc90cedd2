#!/usr/bin/env python3
"""What one training step of an MLP cannot go below on this GPU, measured in the same run:
the step's matrix-product FLOPs (forward, weight and input gradients) at the GPU's peak
product rate (an 8192-cube product in the precision, timed with CUDA events), plus the SGD
optimizer's bytes (float32 weight, gradient and momentum read, weight and momentum written,
and with bf16 the bf16 copy written: 20 or 22 bytes a parameter) at the device's copy
bandwidth (a 1 GiB device-to-device copy). Prints JSON: the rates, both parts and their sum.
"""
import argparse
import json

import torch


def timed_ms(fn, repeats=20):
    for _ in range(3):
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

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    peak_flops = 2.0 * n ** 3 / (timed_ms(lambda: a @ b) * 1e-3)
    del a, b
    src = torch.empty(1 << 28, device="cuda", dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    copy_bytes_s = 2.0 * src.numel() * 4 / (timed_ms(lambda: dst.copy_(src)) * 1e-3)
    del src, dst

    widths = [int(w) for w in args.layers.split(",")]
    flops, params = 0.0, 0
    for i in range(len(widths) - 1):
        k, m = widths[i], widths[i + 1]
        flops += 4.0 * args.batch_size * k * m  # forward and weight gradient
        if i > 0:
            flops += 2.0 * args.batch_size * k * m  # input gradient
        params += k * m + m
    opt_bytes = params * (22 if args.precision == "bf16" else 20)
    products_ms = 1e3 * flops / peak_flops
    optimizer_ms = 1e3 * opt_bytes / copy_bytes_s
    print(json.dumps({"precision": args.precision, "peak_tflops": peak_flops / 1e12,
                      "copy_gb_s": copy_bytes_s / 1e9, "step_tflop": flops / 1e12,
                      "optimizer_gb": opt_bytes / 1e9, "products_ms": products_ms,
                      "optimizer_ms": optimizer_ms, "limit_ms": products_ms + optimizer_ms}))


if __name__ == "__main__":
    main()
