#!/usr/bin/env python3
"""cuBLAS time (through PyTorch) for the matrix products of one training step of an MLP:
for every layer the forward, weight-gradient and input-gradient products at the given batch
and precision, each timed with CUDA events (median of repeats): the ceiling against which
ddptrain's step is compared. And what the step cannot go below on this GPU, measured in the
same run: its FLOPs at the GPU's peak product rate (an 8192-cube product in the precision)
plus the SGD optimizer's bytes (float32 weight, gradient and momentum read, weight and
momentum written, with bf16 the bf16 copy written too: 20 or 22 bytes a parameter) at the
device's copy bandwidth (a 1 GiB device-to-device copy). Prints JSON."""
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


def limits(dtype, flops, params, bf16):
    """The peak product rate and the copy bandwidth of this GPU, and the step's limit."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    peak_flops = 2.0 * n ** 3 / (timed(lambda: a @ b, repeats=20) * 1e-3)
    del a, b
    src = torch.empty(1 << 28, device="cuda", dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    copy_bytes_s = 2.0 * src.numel() * 4 / (timed(lambda: dst.copy_(src), repeats=20) * 1e-3)
    del src, dst
    opt_bytes = params * (22 if bf16 else 20)
    products_ms = 1e3 * flops / peak_flops
    optimizer_ms = 1e3 * opt_bytes / copy_bytes_s
    return {"peak_tflops": peak_flops / 1e12, "copy_gb_s": copy_bytes_s / 1e9,
            "limit_products_ms": products_ms, "limit_optimizer_ms": optimizer_ms,
            "limit_ms": products_ms + optimizer_ms}


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
    total_ms, flops, params = 0.0, 0.0, 0
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
        params += k * n + n
        del x, w, dy
    result = {"precision": args.precision, "matmul_ms": total_ms,
              "tflops": flops / total_ms / 1e9, "step_tflop": flops / 1e12}
    result.update(limits(dtype, flops, params, args.precision == "bf16"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
