#!/usr/bin/env python3
"""compare_weights.py A B BOUND: the relative difference between two safetensors files of
float32 tensors (same names and shapes), max |a - b| / max |b| over every value (as the C++
tests' max_relative_error); exits 1 above BOUND. The shell tests pass 1e-5 where ranks are
compared with one process: kAcrossRanksMargin of tests/support/margins.h, which says why that
cannot be bitwise and what was measured.
No third-party packages: the multi-node tests run it wherever Python 3 is."""
import array
import json
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        values = array.array("f")
        values.frombytes(data[8 + n + begin:8 + n + end])
        out[name] = values
    return out


a, b, bound = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[3])
if sorted(a) != sorted(b):
    sys.exit(f"different tensors: {sorted(a)} and {sorted(b)}")
diff = scale = 0.0
for name in a:
    if len(a[name]) != len(b[name]):
        sys.exit(f"{name}: {len(a[name])} and {len(b[name])} values")
    for x, y in zip(a[name], b[name]):
        diff = max(diff, abs(x - y))
        scale = max(scale, abs(y))
worst = diff / scale if scale > 0 else diff
print(f"max relative error {worst:.3g}")
sys.exit(0 if worst <= bound else 1)
