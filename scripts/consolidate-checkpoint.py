#!/usr/bin/env python3
"""One safetensors file of whole tensors from a ddp sharded checkpoint (ddp::Checkpointer).

Usage: scripts/consolidate-checkpoint.py CHECKPOINT [OUT] [--all]

CHECKPOINT: a checkpoint folder (step-000000100, holding index.json) or the folder of
checkpoints (its `latest` is taken). OUT: the file to write (default CHECKPOINT's
model.safetensors). The model's tensors only (parameters and buffers, under the module's own
names), unless --all (the optimizer's state and the extras too). Each piece's CRC-32 is checked.
Needs nothing but Python's standard library; the result loads with
safetensors.torch.load_file(OUT) into a torch.nn.Module with the same names.
"""
import json
import os
import struct
import sys
import zlib


def read_header(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return header, 8 + length


def consolidate(folder, out, everything):
    with open(os.path.join(folder, "index.json")) as f:
        index = json.load(f)
    if index.get("format") != "ddp.sharded-checkpoint":
        sys.exit(f"consolidate-checkpoint: {folder}/index.json is not a ddp sharded checkpoint's index")
    headers = {}
    tensors = {}
    for name, entry in index["tensors"].items():
        if not everything and (name.startswith("optimizer.") or name.startswith("extra.")):
            continue
        data = bytearray()
        for piece in sorted(entry["pieces"], key=lambda p: p["offset"]):
            path = os.path.join(folder, piece["file"])
            if path not in headers:
                headers[path] = read_header(path)
            header, start = headers[path]
            begin, end = header[piece["key"]]["data_offsets"]
            with open(path, "rb") as f:
                f.seek(start + begin)
                chunk = f.read(end - begin)
            if zlib.crc32(chunk) != piece["crc32"]:
                sys.exit(f"consolidate-checkpoint: {path}: tensor {piece['key']} does not match its checksum")
            data += chunk
        tensors[name] = (entry["dtype"], entry["shape"], bytes(data))
    header = {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    header["__metadata__"] = {"format": "pt", "step": str(index["step"])}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(out + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors.values():
            f.write(data)
    os.replace(out + ".tmp", out)
    print(f"{out}: {len(tensors)} tensors of step {index['step']} from {folder}")


def main():
    args = [a for a in sys.argv[1:] if a != "--all"]
    if not args or len(args) > 2:
        sys.exit(__doc__)
    folder = args[0]
    if not os.path.exists(os.path.join(folder, "index.json")):
        latest = os.path.join(folder, "latest")
        if not os.path.exists(latest):
            sys.exit(f"consolidate-checkpoint: {folder}: neither a checkpoint (index.json) nor a folder of them (latest)")
        with open(latest) as f:
            folder = os.path.join(folder, f.read().strip())
    out = args[1] if len(args) > 1 else os.path.join(folder, "model.safetensors")
    consolidate(folder, out, "--all" in sys.argv[1:])


if __name__ == "__main__":
    main()
