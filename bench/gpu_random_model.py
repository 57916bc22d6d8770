#!/usr/bin/env python3
"""A random-weight GGUF with a real model's shape, tensor types and tokenizer, made where the
real file cannot be carried (the GPU machine takes 64 MiB a call; the Qwen2.5-Coder 1.5B file is
1.1 GB). Two steps:

  gpu_random_model.py header --gguf REAL.gguf --out SHAPE.xz   here: the real file's header (its
      metadata, tokenizer included, and every tensor's name, shape, type and offset), xz-compressed
      (about 2 MB for the 1.5B);
  gpu_random_model.py model --header SHAPE.xz --out RANDOM.gguf  there: the same header, then
      every tensor's bytes made up in its own type with scales chosen so that weights stay within
      about +-0.04 (activations stay finite through every layer): norms are 1, other float
      tensors (biases) 0.

The made-up blocks repeat every few thousand blocks: the file is for timing, where only the
bytes' count and layout matter, and for checking that the service runs a model of that shape. The
GGUF header is parsed by hand here because the GPU machine has Python's standard library only
(the `gguf` package is not there); only the framing is read, the layout follows the GGUF
specification (version 3, little-endian).
"""

import argparse
import lzma
import os
import struct
import sys

# ggml type id: (elements per block, bytes per block).
BLOCKS = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    30: (1, 2),  # BF16
}
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
              12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16"}
# GGUF metadata value types: struct format of the scalars; 8 string, 9 array.
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
PATTERN_BLOCKS = 4096  # blocks made per tensor before repeating


class Reader:
  def __init__(self, data):
    self.data, self.pos = data, 0

  def take(self, fmt):
    v = struct.unpack_from("<" + fmt, self.data, self.pos)
    self.pos += struct.calcsize("<" + fmt)
    return v[0] if len(v) == 1 else v

  def string(self):
    n = self.take("Q")
    s = self.data[self.pos:self.pos + n]
    if len(s) != n:
      raise ValueError("GGUF header: a string runs past the end")
    self.pos += n
    return s.decode("utf-8", errors="replace")

  def value(self, t):
    if t in SCALARS:
      return self.take(SCALARS[t])
    if t == 8:
      return self.string()
    if t == 9:
      et, n = self.take("I"), self.take("Q")
      if et in SCALARS:  # skipped in one step: the tokenizer's arrays are long
        size = struct.calcsize("<" + SCALARS[et]) * n
        self.pos += size
        return None
      for _ in range(n):
        self.value(et)
      return None
    raise ValueError(f"GGUF header: unknown value type {t}")


def parse_header(data):
  """(metadata scalars, tensors [(name, dims, type, offset)], data start) of a GGUF's bytes,
  which need only cover the header."""
  r = Reader(data)
  if data[:4] != b"GGUF":
    raise ValueError("not a GGUF file (no GGUF magic)")
  r.pos = 4
  version = r.take("I")
  if version != 3:
    raise ValueError(f"GGUF version {version}: only version 3 is read here")
  n_tensors, n_kv = r.take("Q"), r.take("Q")
  meta = {}
  for _ in range(n_kv):
    key = r.string()
    meta[key] = r.value(r.take("I"))
  tensors = []
  for _ in range(n_tensors):
    name = r.string()
    n_dims = r.take("I")
    dims = [r.take("Q") for _ in range(n_dims)]
    tensors.append((name, dims, r.take("I"), r.take("Q")))
  align = int(meta.get("general.alignment") or 32)
  start = (r.pos + align - 1) // align * align
  return meta, tensors, start


def tensor_bytes(dims, t):
  if t not in BLOCKS:
    raise ValueError(f"tensor type {t} is not made here (types: {sorted(TYPE_NAMES.values())})")
  elements = 1
  for d in dims:
    elements *= d
  per, size = BLOCKS[t]
  if elements % per:
    raise ValueError(f"{elements} elements are not whole blocks of {per}")
  return elements // per * size


def f16(x):
  return struct.pack("<e", x)


def pattern(name, t, n_blocks):
  """n_blocks made-up blocks of type t (bytes)."""
  per, size = BLOCKS[t]
  if t == 0:
    value = 1.0 if name.endswith("_norm.weight") else 0.0
    return struct.pack("<f", value) * n_blocks
  rnd = bytearray(os.urandom(n_blocks * size))
  if t in (1, 30):  # random values in [-0.02, 0.02)
    out = bytearray()
    for i in range(n_blocks):
      v = (int.from_bytes(rnd[2 * i:2 * i + 2], "little") / 65536.0 - 0.5) * 0.04
      out += f16(v) if t == 1 else struct.pack("<f", v)[2:]
    return bytes(out)
  # Scale fields per type (offset, value), the rest of each block random (any bits are valid).
  fields = {
      2: [(0, 0.02 / 8)],  # Q4_0: d (q - 8)
      3: [(0, 0.04 / 15), (2, -0.02)],  # Q4_1: d q + m
      6: [(0, 0.02 / 16)],  # Q5_0: d (q - 16)
      7: [(0, 0.04 / 31), (2, -0.02)],  # Q5_1
      8: [(0, 0.02 / 127)],  # Q8_0: d q, q int8
      12: [(0, 4e-5), (2, 3e-4)],  # Q4_K: d sc q - dmin m, sc and m 6-bit, q 4-bit
      13: [(0, 2e-5), (2, 3.1e-4)],  # Q5_K: q 5-bit
      14: [(208, 5e-6)],  # Q6_K: d sc (q - 32), sc int8
  }[t]
  for i in range(n_blocks):
    for off, v in fields:
      rnd[i * size + off:i * size + off + 2] = f16(v)
  return bytes(rnd)


def make_model(header_data, out_path):
  meta, tensors, start = parse_header(header_data)
  if len(header_data) < start:
    header_data = header_data + bytes(start - len(header_data))
  align = int(meta.get("general.alignment") or 32)
  with open(out_path, "wb") as f:
    f.write(header_data[:start])
    pos = 0
    for name, dims, t, offset in sorted(tensors, key=lambda x: x[3]):
      if offset < pos or offset % align:
        raise ValueError(f"{name}: offset {offset} overlaps the previous tensor or is unaligned")
      f.write(bytes(offset - pos))
      size = tensor_bytes(dims, t)
      per, block = BLOCKS[t]
      n_blocks = size // block
      chunk = pattern(name, t, min(n_blocks, PATTERN_BLOCKS))
      left = size
      while left:
        piece = chunk[:left]
        f.write(piece)
        left -= len(piece)
      pos = offset + size
    f.write(bytes((-pos) % align))
  return meta, tensors


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = ap.add_subparsers(dest="cmd", required=True)
  h = sub.add_parser("header", help="the real file's header, xz-compressed")
  h.add_argument("--gguf", required=True)
  h.add_argument("--out", required=True)
  m = sub.add_parser("model", help="a random-weight file from a header")
  m.add_argument("--header", required=True)
  m.add_argument("--out", required=True)
  args = ap.parse_args(argv)
  if args.cmd == "header":
    with open(args.gguf, "rb") as f:
      data = f.read(64 << 20)
    _, tensors, start = parse_header(data)
    with lzma.open(args.out, "wb", preset=9) as f:
      f.write(data[:start])
    total = sum(tensor_bytes(d, t) for _, d, t, _ in tensors)
    print(f"gpu_random_model: header of {args.gguf}: {start} bytes, {len(tensors)} tensors, "
          f"{total / 1e6:.1f} MB of weights -> {args.out} ({os.path.getsize(args.out)} bytes)")
  else:
    with lzma.open(args.header, "rb") as f:
      data = f.read()
    meta, tensors = make_model(data, args.out)
    kinds = {}
    for _, d, t, _ in tensors:
      kinds[TYPE_NAMES[t]] = kinds.get(TYPE_NAMES[t], 0) + tensor_bytes(d, t)
    print(f"gpu_random_model: {args.out}: {meta.get('general.architecture')}, "
          f"{len(tensors)} tensors, {os.path.getsize(args.out) / 1e6:.1f} MB; by type (MB): " +
          ", ".join(f"{k} {v / 1e6:.1f}" for k, v in sorted(kinds.items())))
  return 0


if __name__ == "__main__":
  sys.exit(main())
