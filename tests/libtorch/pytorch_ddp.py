#!/usr/bin/env python3
"""pytorch_ddp.py INIT OUT [STEPS POWERSGD_RANK], under torchrun: torch_worker's model in Python, trained with PyTorch's
own DistributedDataParallel (Gloo) from the starting weights and data torch_worker wrote to INIT
(safetensors), its steps as torch_worker takes them (12 samples a step split over the ranks,
cross entropy, SGD 0.1 with momentum 0.9); rank 0 writes the weights to OUT (safetensors). The
reader and writer are the format's few lines (a JSON header after its length), so that no
package beyond torch is needed. With STEPS and POWERSGD_RANK: STEPS steps over INIT's batches in
turn, PyTorch's powerSGD_hook at that rank from step 2 (the rank 0: none), and each rank prints
"rank R loss BEFORE -> AFTER" over the whole data set, as torch_worker --loss does."""
import json
import struct
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "I64": torch.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=DTYPES[entry["dtype"]])
        out[name] = flat.reshape(entry["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name, tensor in tensors.items():
        raw = tensor.detach().contiguous().to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class Net(torch.nn.Module):
    def __init__(self, hidden=32, tokens=6, vocabulary=16, classes=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocabulary, 8)
        self.conv = torch.nn.Conv1d(8, 12, 3, padding=1)
        self.norm = torch.nn.LayerNorm([12])
        self.fc1 = torch.nn.Linear(tokens * 12, hidden)
        self.fc2 = torch.nn.Linear(hidden, classes)

    def forward(self, tokens):
        x = self.embed(tokens).transpose(1, 2)
        x = torch.relu(self.conv(x)).transpose(1, 2)
        x = self.norm(x).flatten(1)
        x = torch.relu(self.fc1(x))
        return self.fc2(x)


def main():
    init, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    state = read_safetensors(init)
    tokens, labels = state.pop("data.tokens"), state.pop("data.labels")
    net = Net()
    net.load_state_dict(state)
    model = torch.nn.parallel.DistributedDataParallel(net)
    batch, share = 12, 12 // ranks
    batches = labels.numel() // batch
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else batches
    powersgd = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    if powersgd > 0:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd_hook
        state = powersgd_hook.PowerSGDState(process_group=None, matrix_approximation_rank=powersgd,
                                            start_powerSGD_iter=2)
        model.register_comm_hook(state, powersgd_hook.powerSGD_hook)

    def data_loss():
        with torch.no_grad():
            return F.cross_entropy(net(tokens), labels).item()

    before = data_loss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        first = (step % batches) * batch + rank * share
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens[first:first + share]), labels[first:first + share])
        loss.backward()
        optimizer.step()
    if len(sys.argv) > 3:
        print(f"rank {rank} loss {before:.9g} -> {data_loss():.9g}", flush=True)
    if rank == 0:
        write_safetensors(out, dict(net.named_parameters()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
