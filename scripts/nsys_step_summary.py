#!/usr/bin/env python3
"""Where a training step's GPU time goes, from Nsight Systems' kernel summary of a capture
range of STEPS steps (`nsys stats --report cuda_gpu_kern_sum --format csv`, of a run under
`ddptrain --profile-steps`): each kind of kernel's milliseconds a step (the matrix products,
the optimizer, the bf16 copies, the loss, the backward's small kernels, the batch gather,
NCCL, ddptrain's fused step, the rest), their sum against the step's wall time (--step-ms:
what the GPU left idle, or, when negative, kernels that overlapped), the products and the
optimizer against their limits (--limits: scripts/torch_matmul_rate.py's JSON; in bf16 the
optimizer's limit holds the bf16 copy's bytes, so its share is of both rows), and the
costliest kernels. Prints Markdown. Pure Python, no third-party modules."""
import argparse
import csv
import io
import json
import re
import sys

# The first kind whose pattern a kernel's name matches (case-insensitive) is its kind.
KINDS = [
    ("products (cuBLASLt)", r"nvjet|gemm|xmma|cutlass|magma|splitk|gemv|cublas|sm90_|sm80_"),
    ("fused step", r"fused_step"),
    ("optimizer", r"sgd_kernel|adamw_kernel"),
    ("bf16 copies", r"to_bf16|from_bf16|to_float"),
    ("loss", r"softmax_xent"),
    ("bias and ReLU masks", r"bias_grad|relu_mask"),
    ("batch gather", r"gather_kernel"),
    ("NCCL", r"nccl"),
]
OTHER = "other"


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return OTHER


def read_kernels(text):
    """(name, total ns, instances) of each row of the summary; the CSV may follow other lines
    (nsys prints what it processes first)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if "Total Time (ns)" in line and "Name" in line), None)
    if start is None:
        raise SystemExit("no kernel summary here: expected the CSV of nsys stats --report "
                         "cuda_gpu_kern_sum --format csv (a header with 'Total Time (ns)')")
    rows = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("Name"):
            continue
        rows.append((row["Name"], float(row["Total Time (ns)"]), int(float(row["Instances"]))))
    if not rows:
        raise SystemExit("the kernel summary has no kernels: was the capture range empty "
                         "(ddptrain --profile-steps under nsys --capture-range=cudaProfilerApi)?")
    return rows


def short(name, width=70):
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("csv", help="nsys stats --report cuda_gpu_kern_sum --format csv output "
                               "('-': stdin)")
    p.add_argument("--steps", type=int, required=True, help="steps in the capture range")
    p.add_argument("--step-ms", type=float, help="the step's wall time, ms (unprofiled run)")
    p.add_argument("--limits", help="scripts/torch_matmul_rate.py's JSON for this workload")
    p.add_argument("--top", type=int, default=8, help="costliest kernels to list")
    args = p.parse_args()
    if args.steps < 1:
        raise SystemExit(f"--steps {args.steps}: expected at least 1")
    text = sys.stdin.read() if args.csv == "-" else open(args.csv).read()
    rows = read_kernels(text)
    limits = json.load(open(args.limits)) if args.limits else {}
    per_kind = {}
    for name, ns, count in rows:
        total, kernels, launches = per_kind.get(kind_of(name), (0.0, 0, 0))
        per_kind[kind_of(name)] = (total + ns, kernels + 1, launches + count)
    all_ms = sum(ns for _, ns, _ in rows) / 1e6 / args.steps
    limit_of = {"products (cuBLASLt)": limits.get("limit_products_ms"),
                "optimizer": limits.get("limit_optimizer_ms")}
    print("| kind | kernels | launches a step | ms a step | share of the kernels | limit ms | "
          "at % of the limit |")
    print("|---|---|---|---|---|---|---|")
    for kind in [k for k, _ in KINDS] + [OTHER]:
        if kind not in per_kind:
            continue
        ns, kernels, launches = per_kind[kind]
        ms = ns / 1e6 / args.steps
        limit = limit_of.get(kind)
        # The optimizer's limit counts the bf16 copy's bytes too (torch_matmul_rate.py).
        against = ms + (per_kind.get("bf16 copies", (0.0,))[0] / 1e6 / args.steps
                        if kind == "optimizer" and limits.get("precision") == "bf16" else 0.0)
        print(f"| {kind} | {kernels} | {launches / args.steps:.1f} | {ms:.3f} | "
              f"{100 * ms / all_ms:.0f} % | {'-' if limit is None else f'{limit:.3f}'} | "
              f"{'-' if limit is None else f'{100 * limit / against:.0f} %'} |")
    limit = limits.get("limit_ms")
    print(f"| all kernels | {len(rows)} | {sum(c for _, _, c in rows) / args.steps:.1f} | "
          f"{all_ms:.3f} | 100 % | {'-' if limit is None else f'{limit:.3f}'} | "
          f"{'-' if limit is None else f'{100 * limit / all_ms:.0f} %'} |")
    if args.step_ms is not None:
        gap = args.step_ms - all_ms
        print(f"\nstep {args.step_ms:.3f} ms, its kernels {all_ms:.3f} ms: "
              + (f"{gap:.3f} ms ({100 * gap / args.step_ms:.0f} %) with the GPU idle "
                 "(launch gaps, host waits) or kernels overlapping less" if gap >= 0 else
                 f"kernels overlap by {-gap:.3f} ms (several streams)"))
    print(f"\ncostliest kernels (of {len(rows)}), ms a step:")
    for name, ns, count in sorted(rows, key=lambda r: -r[1])[:args.top]:
        print(f"- {ns / 1e6 / args.steps:.3f} ms, {count / args.steps:.1f} a step, "
              f"{ns / count / 1e3:.1f} us each [{kind_of(name)}]: {short(name)}")


if __name__ == "__main__":
    main()
