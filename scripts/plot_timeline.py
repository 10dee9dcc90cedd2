#!/usr/bin/env python3
"""Draws a ddptrain --timeline file (a Chrome trace) as one row per rank.

Usage: plot_timeline.py TRACE.json -o timeline.png [--steps A-B]

Forward, backward (or its input and weight halves), send, recv, all-reduce and optimizer
spans are bars in their own colours, micro-batch numbers written on forward and backward bars wide enough to hold
them. A GPU trace's rows are each rank and, under it, its communication (the all-reduce of
each gradient bucket beside backward); layer and bucket numbers are written on the bars. --steps keeps a range of steps (default: the last two recorded, after warm-up).
Needs matplotlib (Debian: python3-matplotlib; another interpreter: DDP_PYTHON).
Prints the ranks, the steps drawn and the
PNG's path.
"""
import argparse
import json
import sys

from ddp_python import require

matplotlib = require("matplotlib", "python3-matplotlib")
matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLOURS = {
    "forward": "#4c72b0",
    "backward": "#dd8452",
    "backward input": "#e8a33d",
    "backward weight": "#937860",
    "send": "#55a868",
    "recv": "#8c8c8c",
    "all-reduce": "#c44e52",
    "optimizer": "#8172b3",
}
# The GPU's kinds, drawn as their CPU counterparts.
SAME_AS = {"backward layer": "backward", "all-reduce bucket": "all-reduce"}


def read_trace(path):
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"plot_timeline.py: {path}: not a readable Chrome trace ({e})")
    names, order, spans = {}, {}, []
    for event in trace.get("traceEvents", []):
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            names[event["tid"]] = event["args"]["name"]
        elif event.get("ph") == "M" and event.get("name") == "thread_sort_index":
            order[event["tid"]] = event["args"]["sort_index"]
        elif event.get("ph") == "X":
            spans.append(event)
    if not spans:
        sys.exit(f"plot_timeline.py: {path}: no spans (was --timeline given to a run that trained?)")
    return names, order, spans


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--steps", help="A-B: the steps to draw (default: the last two)")
    args = parser.parse_args()
    names, order, spans = read_trace(args.trace)
    steps = sorted({s["args"]["step"] for s in spans})
    if args.steps:
        try:
            first, last = (int(x) for x in args.steps.split("-"))
        except ValueError:
            sys.exit(f"plot_timeline.py: --steps {args.steps}: expected A-B, like 3-4")
    else:
        first, last = steps[-2] if len(steps) > 1 else steps[-1], steps[-1]
    shown = [s for s in spans if first <= s["args"]["step"] <= last]
    if not shown:
        sys.exit(f"plot_timeline.py: --steps {first}-{last}: none recorded (have {steps[0]}-{steps[-1]})")
    origin = min(s["ts"] for s in shown)
    ranks = sorted({s["tid"] for s in spans}, key=lambda tid: (order.get(tid, tid), tid))
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(ranks) + 1.4))
    width_ms = (max(s["ts"] + s["dur"] for s in shown) - origin) / 1e3
    for s in shown:
        row = ranks.index(s["tid"])
        start, dur = (s["ts"] - origin) / 1e3, s["dur"] / 1e3
        kind = SAME_AS.get(s["cat"], s["cat"])
        ax.broken_barh([(start, max(dur, width_ms * 1e-4))], (row - 0.4, 0.8),
                       facecolors=COLOURS.get(kind, "black"), edgecolors="white", linewidth=0.5)
        if (s["cat"] in ("forward", "backward", "backward input", "backward weight")
                or s["cat"] in SAME_AS) and \
                s["args"]["micro_batch"] >= 0 and dur > width_ms / 60:
            ax.text(start + dur / 2, row, str(s["args"]["micro_batch"]), ha="center",
                    va="center", color="white", fontsize=7)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([names.get(r, f"rank {r}") for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(f"steps {first}-{last}" if first != last else f"step {first}")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], ncol=6,
              loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(ranks) < 4 else -0.12),
              fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"ranks: {len(ranks)}; steps {first}-{last}; wrote {args.output}")


if __name__ == "__main__":
    main()
