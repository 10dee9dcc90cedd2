#!/usr/bin/env python3
"""Draws one or several ddptrain runs from their --metrics files (JSON Lines).

Usage: plot_metrics.py RUN.jsonl [RUN2.jsonl ...] -o run.png

Four panels against the step: training loss (and test loss where --eval-every logged it),
accuracy (training, and test), learning rate, and samples/s; two more, GPU utilization and
memory per rank, when the runs' records carry the GPU monitor's fields (--device cuda). Each run's legend names the
settings in which the runs differ (from their first record), or the file when none do.
Needs matplotlib (Debian: python3-matplotlib; another interpreter: DDP_PYTHON).
Prints the legend labels and the PNG's path.
"""
import argparse
import json
import os
import sys

from ddp_python import require

matplotlib = require("matplotlib", "python3-matplotlib")
matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402


def read_run(path):
    config, steps, evals = {}, [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics.py: {path}:{number}: not JSON ({e})")
            event = record.get("event")
            if event in ("start", "resume") and not config:
                config = record.get("config", {})
            elif event == "step":
                steps.append(record)
            elif event == "eval":
                evals.append(record)
    if not steps:
        sys.exit(f"plot_metrics.py: {path}: no step records (was it written by ddptrain --metrics?)")
    return config, steps, evals


def labels_for(paths, configs):
    keys = sorted({k for c in configs for k in c})
    differing = [k for k in keys if len({json.dumps(c.get(k)) for c in configs}) > 1]
    differing = [k for k in differing if k not in ("checkpoint-dir", "init-weights")]
    labels = []
    for path, config in zip(paths, configs):
        if differing:
            labels.append(", ".join(f"{k}={config.get(k)}" for k in differing))
        else:
            labels.append(os.path.basename(path))
    return labels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="metrics files (JSON Lines) of ddptrain")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    args = parser.parse_args()
    runs = [read_run(p) for p in args.runs]
    labels = labels_for(args.runs, [r[0] for r in runs])
    gpu = any("gpu" in s for _, steps, _ in runs for s in steps)
    fig, axes = plt.subplots(3 if gpu else 2, 2, figsize=(12, 12 if gpu else 8))
    (loss_ax, acc_ax), (lr_ax, rate_ax) = axes[0], axes[1]
    panels = [(loss_ax, "loss", ""), (acc_ax, "accuracy", "%"), (lr_ax, "learning rate", ""),
              (rate_ax, "throughput", "k samples/s")]
    if gpu:
        util_ax, mem_ax = axes[2]
        panels += [(util_ax, "GPU utilization (window mean)", "%"),
                   (mem_ax, "GPU memory in use (window peak)", "GiB")]
    for (config, steps, evals), label in zip(runs, labels):
        x = [s["step"] for s in steps]
        line, = loss_ax.plot(x, [s["loss"] for s in steps], label=f"{label} (train)")
        acc_ax.plot(x, [100 * s["accuracy"] for s in steps], color=line.get_color(),
                    label=f"{label} (train)")
        lr_ax.plot(x, [s["lr"] for s in steps], color=line.get_color(), label=label)
        rate_ax.plot(x, [s["samples_per_s"] / 1e3 for s in steps], color=line.get_color(),
                     label=label)
        gpu_steps = [s for s in steps if "gpu" in s]
        if gpu and gpu_steps:
            gx = [s["step"] for s in gpu_steps]
            ranks = len(gpu_steps[0]["gpu"]["util"]["mean"])
            for rank in range(ranks):
                style = ["-", ":", "-.", "--"][rank % 4]
                util = [s["gpu"]["util"]["mean"][rank] for s in gpu_steps]
                mem = [s["gpu"]["mem_used_mib"]["max"][rank] for s in gpu_steps]
                util_ax.plot(gx, [u if u is not None else float("nan") for u in util], style,
                             color=line.get_color(), label=f"{label} rank {rank}")
                mem_ax.plot(gx, [m / 1024 if m is not None else float("nan") for m in mem], style,
                            color=line.get_color(), label=f"{label} rank {rank}")
        if evals:
            ex = [e["step"] for e in evals]
            loss_ax.plot(ex, [e["test_loss"] for e in evals], "--", color=line.get_color(),
                         label=f"{label} (test)")
            acc_ax.plot(ex, [100 * e["test_accuracy"] for e in evals], "--",
                        color=line.get_color(), label=f"{label} (test)")
    for ax, title, unit in panels:
        ax.set_title(title)
        ax.set_xlabel("step")
        if unit:
            ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(", ".join(os.path.basename(p) for p in args.runs))
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    for label in labels:
        print(f"run: {label}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
