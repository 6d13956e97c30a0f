"""A minimal GGUF reader for the parity scripts (no dependency on the gguf package).

Reads metadata and F32 / F16 / I32 tensors (the generated test models are written in F32) into
torch tensors in PyTorch order (ggml's ne reversed), so a ggml {in, out} matrix becomes a torch
[out, in] matrix and y = W @ x.
"""
import struct

import torch

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class _Cursor:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = bytes(self.data[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.take("<I"), self.take("<Q")
            return [self.value(etype) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {vtype} at byte {self.pos}")


def read_gguf(path):
    """Returns (metadata dict, {name: torch tensor (float64, or int64 for I32)})."""
    with open(path, "rb") as f:
        data = memoryview(f.read())
    c = _Cursor(data)
    if bytes(data[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    c.pos = 4
    version, n_tensors, n_kv = c.take("<I"), c.take("<Q"), c.take("<Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}")
    meta = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        nd = c.take("<I")
        ne = [c.take("<Q") for _ in range(nd)]
        infos.append((name, ne, c.take("<I"), c.take("<Q")))
    align = meta.get("general.alignment", 32)
    start = (c.pos + align - 1) // align * align
    tensors = {}
    for name, ne, ttype, off in infos:
        n = 1
        for d in ne:
            n *= d
        shape = list(reversed(ne)) or [1]
        base = start + off
        if ttype == 0:
            t = torch.frombuffer(bytearray(data[base:base + 4 * n]), dtype=torch.float32).to(torch.float64)
        elif ttype == 1:
            t = torch.frombuffer(bytearray(data[base:base + 2 * n]), dtype=torch.float16).to(torch.float64)
        elif ttype == 26:
            t = torch.frombuffer(bytearray(data[base:base + 4 * n]), dtype=torch.int32).to(torch.int64)
        else:
            raise ValueError(f"{path}: tensor {name} has ggml type {ttype}; generate the model with F32 weights")
        tensors[name] = t.reshape(shape)
    return meta, tensors
