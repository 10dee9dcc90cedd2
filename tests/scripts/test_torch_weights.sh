#!/usr/bin/env bash
# The README's PyTorch snippet, as a user would run it: ddptrain trains on Fashion-MNIST and
# saves its weights; the snippet (taken from the README) builds the model in PyTorch, which
# must reach ddptrain's test accuracy on the same test set. Exit 77 (skipped) without a
# Python that has torch and safetensors, or without the dataset.
# Usage: test_torch_weights.sh DDPTRAIN
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
ddptrain="$1"
data="${DDP_DATA_DIR:-/usr/share/datasets/fashion-mnist}"
source "$root/scripts/deps.sh"
# safetensors from pip in the build's python/ folder (scripts/test.sh puts it there).
build="$(cd "$(dirname "$ddptrain")/.." && pwd)"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
py="$(ddp_python_with torch safetensors numpy)"
[ -n "$py" ] || { echo "skipped: no Python with torch, safetensors and numpy (scripts/test.sh installs safetensors into $build/python with pip)"; exit 77; }
[ -f "$data/t10k-images-idx3-ubyte.gz" ] || { echo "skipped: no Fashion-MNIST in $data"; exit 77; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log="$("$ddptrain" --data-dir "$data" --epochs 1 --quiet --threads 1 \
  --save-weights "$work/w.safetensors" 2>&1)" || { echo "$log"; exit 1; }
ours="$(grep -oE 'test accuracy [0-9.]+' <<<"$log" | awk '{print $3}')"
# The snippet between the docs' marker (docs/ddptrain.md) and the end of its code block.
cat "$root/README.md" "$root"/docs/*.md |
  awk '/<!-- torch-snippet -->/ { on = 1; next } on && /^```python/ { next } on && /^```/ { exit } on' \
  > "$work/snippet.py"
grep -q "load_state_dict" "$work/snippet.py" || { echo "the docs' torch-snippet not found"; exit 1; }
cd "$work"
theirs="$("$py" - "$data" <<'PY'
import gzip, sys
import numpy as np
exec(open("snippet.py").read())
data = sys.argv[1]
with gzip.open(f"{data}/t10k-images-idx3-ubyte.gz") as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
with gzip.open(f"{data}/t10k-labels-idx1-ubyte.gz") as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8)
with torch.no_grad():
    logits = model(torch.from_numpy(images.copy()).float() / 255)
print("%.2f" % (100.0 * (logits.argmax(1).numpy() == labels).mean()))
PY
)" || { echo "the snippet failed"; exit 1; }
echo "ddptrain test accuracy $ours %, PyTorch with the README snippet $theirs %"
awk -v a="$ours" -v b="$theirs" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.05) }'
