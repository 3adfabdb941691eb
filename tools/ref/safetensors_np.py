"""Minimal safetensors reader/writer on numpy (Debian has no python3-safetensors)."""
import json
import struct

import numpy as np

_DTYPES = {"F64": np.float64, "F32": np.float32, "I32": np.int32, "I64": np.int64}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    start = 8 + hlen
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        arr = np.frombuffer(data[start + a:start + b], dtype=_DTYPES[e["dtype"]])
        out[name] = arr.reshape(e["shape"]).copy()
    return out


def save(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        raw = arr.tobytes()
        header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)
