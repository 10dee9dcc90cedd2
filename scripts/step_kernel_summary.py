#!/usr/bin/env python3
"""Where a training step's GPU time goes, from the kernels a profiler saw over STEPS steps:
Nsight Compute's per-kernel CSV (`ncu --metrics gpu__time_duration.sum --csv`, the profiler
that works on the GPU machine) or Nsight Systems' kernel summary (`nsys stats --report
cuda_gpu_kern_sum --format csv`), of a run under `ddptrain --profile-steps` or
`torch_mlp.py --profile-steps`. Prints each kind of kernel's milliseconds a step (the matrix
products, the optimizer, the bf16 casts, the loss, the backward's small kernels, the batch
gather, NCCL, ddptrain's fused step, the rest), their sum against the step's wall time
(--step-ms: what the GPU left idle, or, when negative, kernels that overlapped), the products
and the optimizer against their limits (--limits: scripts/torch_matmul_rate.py's JSON; in bf16
the optimizer's limit holds the bf16 casts' bytes, so its share is of both rows), and the
costliest kernels. With --beside, a second run's kernels (PyTorch's step) kind by kind beside
the first's; with --order, each run's first step kernel by kernel in launch order (Nsight
Compute's CSV). Prints Markdown. Pure Python, no third-party modules."""
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
    ("optimizer", r"sgd|adam|multi_tensor_apply"),
    ("bf16 casts and copies", r"to_bf16|from_bf16|to_float|copy_kernel"),
    ("loss", r"softmax|nll_loss|cross_entropy"),
    ("bias and ReLU masks", r"bias_grad|relu|threshold|clamp"),
    ("reductions (bias gradients)", r"reduce_kernel|bgrad"),
    ("fills and zeroing", r"fill|zero"),
    ("batch gather", r"gather_kernel|index_select|indexselect"),
    ("NCCL", r"nccl"),
]
OTHER = "other"


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return OTHER


# Nanoseconds in one of Nsight Compute's time units.
NS_PER_UNIT = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
               "s": 1e9, "second": 1e9}


def number(text):
    """A profiler's number, thousands separators and all ("10,196,000")."""
    return float(text.replace(",", ""))


def read_launches(text):
    """Nsight Compute's launches in their order, (name, ns) each; None for nsys' summary (one
    row a kernel name, no order). The CSV may follow other lines (the profiler's own, the
    program's output)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if '"Kernel Name"' in line and '"Metric Name"' in line), None)
    if start is None:
        return None
    launches = []
    csv_lines = [line for line in lines[start:] if line.startswith('"')]
    for row in csv.DictReader(io.StringIO("\n".join(csv_lines))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "ns") or "ns"
        if unit not in NS_PER_UNIT:
            raise SystemExit(f"gpu__time_duration.sum in '{unit}': expected one of "
                             f"{', '.join(NS_PER_UNIT)}")
        launches.append((row["Kernel Name"], number(row["Metric Value"]) * NS_PER_UNIT[unit]))
    return launches


def read_kernels(text):
    """(name, total ns, instances) of each kernel name: the rows of nsys' summary, or Nsight
    Compute's one row per launch summed by name."""
    launches = read_launches(text)
    if launches is not None:
        per_name = {}
        for name, ns in launches:
            total, count = per_name.get(name, (0.0, 0))
            per_name[name] = (total + ns, count + 1)
        rows = [(name, ns, count) for name, (ns, count) in per_name.items()]
    else:
        lines = text.splitlines()
        start = next((i for i, line in enumerate(lines)
                      if "Total Time (ns)" in line and "Name" in line), None)
        if start is None:
            raise SystemExit("no kernel summary here: expected Nsight Compute's CSV (ncu --csv "
                             "--metrics gpu__time_duration.sum: a header with 'Kernel Name' and "
                             "'Metric Name') or nsys stats --report cuda_gpu_kern_sum --format "
                             "csv (a header with 'Total Time (ns)')")
        rows = []
        for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
            if not row.get("Name"):
                continue
            rows.append((row["Name"], number(row["Total Time (ns)"]),
                         int(number(row["Instances"]))))
    if not rows:
        raise SystemExit("the kernel summary has no kernels: was the capture range empty "
                         "(--profile-steps under nsys --capture-range=cudaProfilerApi or "
                         "ncu --profile-from-start off)?")
    return rows


def launch_order(text, steps, name):
    """The first step's kernels in launch order (Nsight Compute's CSV only)."""
    launches = read_launches(text)
    if launches is None:
        print(f"\n{name}: no launch order in nsys' summary (Nsight Compute's CSV has it)")
        return
    per_step = len(launches) // steps
    note = ("" if per_step * steps == len(launches) else
            f"; {len(launches)} launches over {steps} steps is no whole number a step")
    print(f"\n{name}'s first step, kernel by kernel in launch order "
          f"({per_step} a step{note}):\n")
    print("| # | us | kind | kernel |")
    print("|---|---|---|---|")
    for i, (kernel, ns) in enumerate(launches[:per_step]):
        print(f"| {i + 1} | {ns / 1e3:.1f} | {kind_of(kernel)} | {short(kernel)} |")


def by_kind(rows, steps):
    """kind -> (ms a step, kernels, launches a step)."""
    per_kind = {}
    for name, ns, count in rows:
        total, kernels, launches = per_kind.get(kind_of(name), (0.0, 0, 0))
        per_kind[kind_of(name)] = (total + ns, kernels + 1, launches + count)
    return {kind: (ns / 1e6 / steps, kernels, launches / steps)
            for kind, (ns, kernels, launches) in per_kind.items()}


def short(name, width=70):
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[:width - 3] + "..."


def costliest(rows, steps, top):
    for name, ns, count in sorted(rows, key=lambda r: -r[1])[:top]:
        print(f"- {ns / 1e6 / steps:.3f} ms, {count / steps:.1f} a step, "
              f"{ns / count / 1e3:.1f} us each [{kind_of(name)}]: {short(name)}")


def idle_line(step_ms, all_ms):
    gap = step_ms - all_ms
    return (f"step {step_ms:.3f} ms, its kernels {all_ms:.3f} ms: "
            + (f"{gap:.3f} ms ({100 * gap / step_ms:.0f} %) with the GPU idle "
               "(launch gaps, host waits), kernels overlapping less, or kernels slower in the "
               "run than profiled (ncu times each alone: no neighbours, clocks not held down "
               "by the step's power)" if gap >= 0 else
               f"kernels overlap by {-gap:.3f} ms (several streams)"))


def read_csv_arg(path):
    return sys.stdin.read() if path == "-" else open(path).read()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("csv", help="ncu's or nsys' CSV, as above ('-': stdin)")
    p.add_argument("--steps", type=int, required=True, help="steps in the capture range")
    p.add_argument("--step-ms", type=float, help="the step's wall time, ms (unprofiled run)")
    p.add_argument("--limits", help="scripts/torch_matmul_rate.py's JSON for this workload")
    p.add_argument("--top", type=int, default=8, help="costliest kernels to list")
    p.add_argument("--name", default="ddptrain", help="the first run's name in the tables")
    p.add_argument("--beside", help="a second run's CSV, shown kind by kind beside the first")
    p.add_argument("--beside-steps", type=int, help="steps in the second run's capture range")
    p.add_argument("--beside-step-ms", type=float, help="the second run's step wall time, ms")
    p.add_argument("--beside-name", default="PyTorch", help="the second run's name")
    p.add_argument("--order", action="store_true",
                   help="also each run's first step kernel by kernel, in launch order (ncu)")
    args = p.parse_args()
    for flag, steps in (("--steps", args.steps), ("--beside-steps", args.beside_steps)):
        if steps is not None and steps < 1:
            raise SystemExit(f"{flag} {steps}: expected at least 1")
    if args.beside and args.beside_steps is None:
        raise SystemExit("--beside: give --beside-steps too (the steps in its capture range)")
    text = read_csv_arg(args.csv)
    rows = read_kernels(text)
    limits = json.load(open(args.limits)) if args.limits else {}
    per_kind = by_kind(rows, args.steps)
    all_ms = sum(ns for _, ns, _ in rows) / 1e6 / args.steps
    limit_of = {"products (cuBLASLt)": limits.get("limit_products_ms"),
                "optimizer": limits.get("limit_optimizer_ms")}
    order = [k for k, _ in KINDS] + [OTHER]
    print("| kind | kernels | launches a step | ms a step | share of the kernels | limit ms | "
          "at % of the limit |")
    print("|---|---|---|---|---|---|---|")
    for kind in order:
        if kind not in per_kind:
            continue
        ms, kernels, launches = per_kind[kind]
        limit = limit_of.get(kind)
        # The optimizer's limit counts the bf16 casts' bytes too (torch_matmul_rate.py).
        against = ms + (per_kind.get("bf16 casts and copies", (0.0,))[0]
                        if kind == "optimizer" and limits.get("precision") == "bf16" else 0.0)
        print(f"| {kind} | {kernels} | {launches:.1f} | {ms:.3f} | "
              f"{100 * ms / all_ms:.0f} % | {'-' if limit is None else f'{limit:.3f}'} | "
              f"{'-' if limit is None else f'{100 * limit / against:.0f} %'} |")
    limit = limits.get("limit_ms")
    print(f"| all kernels | {len(rows)} | {sum(c for _, _, c in rows) / args.steps:.1f} | "
          f"{all_ms:.3f} | 100 % | {'-' if limit is None else f'{limit:.3f}'} | "
          f"{'-' if limit is None else f'{100 * limit / all_ms:.0f} %'} |")
    if args.step_ms is not None:
        print("\n" + idle_line(args.step_ms, all_ms))
    print(f"\ncostliest kernels (of {len(rows)}), ms a step:")
    costliest(rows, args.steps, args.top)
    if args.order:
        launch_order(text, args.steps, args.name)
    if not args.beside:
        return
    other_text = read_csv_arg(args.beside)
    other = read_kernels(other_text)
    other_kind = by_kind(other, args.beside_steps)
    other_ms = sum(ns for _, ns, _ in other) / 1e6 / args.beside_steps
    a, b = args.name, args.beside_name
    print(f"\n{a} beside {b}, ms a step (launches a step):\n")
    print(f"| kind | {a} | {b} | {a} - {b} |")
    print("|---|---|---|---|")
    for kind in order:
        if kind not in per_kind and kind not in other_kind:
            continue
        mine = per_kind.get(kind, (0.0, 0, 0.0))
        theirs = other_kind.get(kind, (0.0, 0, 0.0))
        print(f"| {kind} | {mine[0]:.3f} ({mine[2]:.1f}) | {theirs[0]:.3f} ({theirs[2]:.1f}) | "
              f"{mine[0] - theirs[0]:+.3f} |")
    print(f"| all kernels | {all_ms:.3f} ({sum(c for _, _, c in rows) / args.steps:.1f}) | "
          f"{other_ms:.3f} ({sum(c for _, _, c in other) / args.beside_steps:.1f}) | "
          f"{all_ms - other_ms:+.3f} |")
    if args.step_ms is not None and args.beside_step_ms is not None:
        print(f"| the step (wall) | {args.step_ms:.3f} | {args.beside_step_ms:.3f} | "
              f"{args.step_ms - args.beside_step_ms:+.3f} |")
        print(f"| outside the kernels | {args.step_ms - all_ms:.3f} | "
              f"{args.beside_step_ms - other_ms:.3f} | "
              f"{(args.step_ms - all_ms) - (args.beside_step_ms - other_ms):+.3f} |")
    print(f"\n{b}'s costliest kernels (of {len(other)}), ms a step:")
    costliest(other, args.beside_steps, args.top)
    if args.order:
        launch_order(other_text, args.beside_steps, b)


if __name__ == "__main__":
    main()
