#!/usr/bin/env bash
# A ddp::Checkpointer checkpoint read from Python as a user would (issue 74): unit_worker trains
# its model (an embedding, a depthwise convolution, residual blocks of layer norm and linear, a
# pooling, a linear head) and saves a checkpoint at its last step, once in one process (with
# the batch's tokens and the model's output on them as extras) and once on 2 ranks under zero(3)
# with shard units (each tensor in pieces over the ranks); scripts/consolidate-checkpoint.py
# joins each into one safetensors file, and the README's Python lines load it into the same
# model written in PyTorch, with the module's own names: the one process's output is LibTorch's
# within 1e-6, and the 2 ranks' weights are those LibTorch gathered at the end, bitwise. Exit 77
# (skipped) without a Python that has torch and safetensors.
# Usage: test_checkpoint_python.sh BUILD_DIR
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "$1" && pwd)"
source "$root/scripts/deps.sh"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
py="$(cd / && ddp_python_with torch safetensors)"  # not from the repository (its torch/ folder)
[ -n "$py" ] || { echo "skipped: no Python with torch and safetensors (scripts/test.sh installs safetensors into $build/python with pip)"; exit 77; }
worker="$build/bin/ddp_torch_unit_worker"
[ -x "$worker" ] || { echo "skipped: no $worker (built with LibTorch)"; exit 77; }
export CUDA_VISIBLE_DEVICES=
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
model=(--blocks 4 --dim 16 --batch 6 --steps 3 --adamw)
"$worker" --single "${model[@]}" --checkpoint-dir "$work/one" --save-at 2 --save-logits \
  > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
"$build/bin/ddprun" --nproc-per-node 2 -- "$worker" "${model[@]}" --zero 3 --units \
  --checkpoint-dir "$work/units" --save-at 2 --out "$work/units-gathered.safetensors" \
  > "$work/units.log" 2>&1 || { cat "$work/units.log"; exit 1; }
grep -q '"key": "2.fc.weight@' "$work/units/step-000000002/index.json" ||
  { echo "the units' checkpoint holds no piece of 2.fc.weight"; exit 1; }
for run in one units; do  # the model alone (as the README says), and everything
  python3 "$root/scripts/consolidate-checkpoint.py" "$work/$run" "$work/$run.safetensors" &&
    python3 "$root/scripts/consolidate-checkpoint.py" "$work/$run" "$work/$run-all.safetensors" \
      --all || exit 1
done
# The docs' lines (docs/libtorch.md), between their marker and the end of their code block.
cat "$root/README.md" "$root"/docs/*.md |
  awk '/<!-- checkpoint-python -->/ { on = 1; next } on && /^ *```python/ { next }
       on && /^ *```/ { exit } on { sub(/^  /, ""); print }' > "$work/snippet.py"
grep -q "load_state_dict" "$work/snippet.py" || { echo "the docs' checkpoint-python lines not found"; exit 1; }
cd "$work"
DDP_ROOT="$root" "$py" - <<'PY'
import os
import shutil
import sys
import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.join(os.environ["DDP_ROOT"], "scripts"))
from torch_units import make_model  # unit_worker's model written in PyTorch

for run in ("one", "units"):
    model, _ = make_model(4, 16)
    shutil.copy(f"{run}.safetensors", "model.safetensors")
    exec(open("snippet.py").read())  # the README's lines: model.load_state_dict(...)
    extras = load_file(f"{run}-all.safetensors")
    if run == "one":
        with torch.no_grad():
            ours = model(extras["extra.tokens"])
        worst = (ours - extras["extra.logits"]).abs().max().item()
        print(f"one process: PyTorch's output against LibTorch's: {worst:.3g}")
        assert worst < 1e-6, worst
    else:
        gathered = load_file("units-gathered.safetensors")
        for name, value in model.state_dict().items():
            assert torch.equal(value, gathered[name]), name
        print(f"2 ranks, zero(3) units: {len(gathered)} tensors from the pieces, bitwise LibTorch's")
PY
