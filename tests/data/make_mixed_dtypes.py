#!/usr/bin/env python3
"""Writes tests/data/mixed_dtypes.safetensors with the reference Python `safetensors`
package (pip install safetensors numpy): one tensor of every dtype ddp's reader accepts,
with values the C++ test knows in closed form (element i of each tensor is i - 2, stored in
that dtype; BOOL is i % 2). Run once; the file is committed. Usage: make_mixed_dtypes.py OUT
"""
import struct
import sys

import ctypes

import numpy as np
from safetensors import TensorSpec, serialize_file

N = 6  # elements per tensor, shape [2, 3]


def bf16_bytes(values):
    # bfloat16 is the high half of float32 (values here are exact in bf16).
    return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:]
                    for v in values)


values = [float(i - 2) for i in range(N)]
tensors = {
    "f64": {"dtype": "F64", "shape": [2, 3], "data": np.array(values, "<f8").tobytes()},
    "f32": {"dtype": "F32", "shape": [2, 3], "data": np.array(values, "<f4").tobytes()},
    "f16": {"dtype": "F16", "shape": [2, 3], "data": np.array(values, "<f2").tobytes()},
    "bf16": {"dtype": "BF16", "shape": [2, 3], "data": bf16_bytes(values)},
    "i64": {"dtype": "I64", "shape": [2, 3], "data": np.array(values, "<i8").tobytes()},
    "i32": {"dtype": "I32", "shape": [2, 3], "data": np.array(values, "<i4").tobytes()},
    "i16": {"dtype": "I16", "shape": [2, 3], "data": np.array(values, "<i2").tobytes()},
    "i8": {"dtype": "I8", "shape": [2, 3], "data": np.array(values, "i1").tobytes()},
    "u8": {"dtype": "U8", "shape": [2, 3], "data": np.arange(N, dtype="u1").tobytes()},
    "u32": {"dtype": "U32", "shape": [2, 3], "data": np.arange(N, dtype="<u4").tobytes()},
    "u64": {"dtype": "U64", "shape": [2, 3], "data": np.arange(N, dtype="<u8").tobytes()},
    "bool": {"dtype": "BOOL", "shape": [2, 3],
             "data": np.array([i % 2 for i in range(N)], "u1").tobytes()},
}
# The package's own spelling of each dtype; the raw bytes stay alive in `buffers`.
names = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
         "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
         "U32": "uint32", "U64": "uint64", "BOOL": "bool"}
buffers = {}
specs = {}
for name, t in tensors.items():
    buffers[name] = ctypes.create_string_buffer(t["data"], len(t["data"]))
    specs[name] = TensorSpec(dtype=names[t["dtype"]], shape=t["shape"],
                             data_ptr=ctypes.addressof(buffers[name]), data_len=len(t["data"]))
serialize_file(specs, sys.argv[1], metadata={"made_by": "tests/data/make_mixed_dtypes.py"})
