#!/usr/bin/env python3
"""Where a step's time goes, from a ddptrain --timeline trace (GPU or CPU): per rank, the
median over steps of the forward, the backward (its layers' spans summed), the time from the
end of backward to the end of the step (waiting for the reductions, then the optimizer), the
all-reduces (their spans summed, and how much of them ran after backward ended), and the step.
A pipeline's GPU trace has no optimizer span: its step runs from its first span to the next
step's first span on that rank, so "after backward" is the optimizer and the step boundary.
Usage: scripts/timeline_stats.py TRACE.json [--skip N]   (N first steps left out, default 2)"""
import json
import statistics
import sys
from collections import defaultdict


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    skip = int(args[args.index("--skip") + 1]) if "--skip" in args else 2
    trace = json.load(open(args[0]))
    names, steps = {}, defaultdict(lambda: defaultdict(list))
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[e["tid"]] = e["args"]["name"]
        elif e["ph"] == "X":
            steps[(e["tid"], e["args"]["step"])][e["cat"]].append((e["ts"], e["ts"] + e["dur"]))
    ranks = sorted(t for t, n in names.items() if not n.endswith("communication"))
    comm_of = {r: t for r in ranks for t, n in names.items() if n == names[r] + " communication"}
    print("| track | steps | step ms | forward ms | backward ms | after backward ms | all-reduce ms | all-reduce after backward ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in ranks:
        rows = defaultdict(list)
        numbers = sorted(s for (t, s) in steps if t == r)[skip:]
        for s in numbers:
            spans = steps[(r, s)]
            forward = spans.get("forward", [])
            backward = spans.get("backward layer", []) + spans.get("backward", [])
            optimizer = spans.get("optimizer", [])
            following = [a for v in steps.get((r, s + 1), {}).values() for a, _ in v]
            if not forward or not backward or not (optimizer or following):
                continue
            start = min(a for a, _ in forward)
            end = max(b for _, b in optimizer) if optimizer else min(following)
            backward_end = max(b for _, b in backward)
            rows["step"].append(end - start)
            rows["forward"].append(sum(b - a for a, b in forward))
            rows["backward"].append(sum(b - a for a, b in backward))
            rows["after"].append(end - backward_end)
            reduces = steps.get((comm_of.get(r), s), {}).get("all-reduce bucket", [])
            rows["reduce"].append(sum(b - a for a, b in reduces))
            rows["exposed"].append(sum(max(0.0, b - max(a, backward_end)) for a, b in reduces))
        if not rows["step"]:
            continue
        m = {k: statistics.median(v) / 1e3 for k, v in rows.items()}
        print(f"| {names[r]} | {len(rows['step'])} | {m['step']:.3f} | {m['forward']:.3f} | {m['backward']:.3f} | "
              f"{m['after']:.3f} | {m['reduce']:.3f} | {m['exposed']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
