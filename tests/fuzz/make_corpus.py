#!/usr/bin/env python3
"""Writes the seed corpus for gguf_fuzz: small valid GGUF v2/v3 files with every tensor type
and metadata of every value type (nested arrays too), at several alignments.
Standard library only, so that scripts/fuzz needs no virtual environment.
Usage: make_corpus.py OUT_DIR
"""

import random
import struct
import sys
from pathlib import Path

# GGUF value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
# GGML tensor types: id -> (elements per block, bytes per block).
TENSOR_TYPES = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 3: (32, 20),
                12: (256, 144), 13: (256, 176), 14: (256, 210)}


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def value(t: int, v) -> bytes:
    if t == STR:
        return s(v)
    if t == ARR:
        elem, items = v
        return struct.pack("<IQ", elem, len(items)) + b"".join(value(elem, x) for x in items)
    return struct.pack(SCALAR_FMT[t], v)


def gguf(version: int, kvs: list, tensors: list, alignment: int = 32) -> bytes:
    """kvs: [(key, type, value)]; tensors: [(name, dims, type id, data bytes)]."""
    if alignment != 32:
        kvs = kvs + [("general.alignment", U32, alignment)]
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += s(key) + struct.pack("<I", t) + value(t, v)
    offsets, off = [], 0
    for _, _, _, data in tensors:
        offsets.append(off)
        off = (off + len(data) + alignment - 1) // alignment * alignment
    for (name, dims, t, _), o in zip(tensors, offsets):
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", t, o)
    out += b"\0" * (-len(out) % alignment)
    for (_, _, _, data), o in zip(tensors, offsets):
        out += data + b"\0" * (-len(data) % alignment)
    return out


def tensor(rng: random.Random, name: str, t: int, rows: int, blocks: int):
    per, size = TENSOR_TYPES[t]
    data = bytes(rng.getrandbits(8) for _ in range(rows * blocks * size))
    return (name, [per * blocks, rows], t, data)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(42)
    every_value = [
        ("general.architecture", STR, "llama"), ("u8", U8, 7), ("i8", I8, -7), ("u16", U16, 9),
        ("i16", I16, -9), ("u32", U32, 30), ("i32", I32, -30), ("f32", F32, 0.5),
        ("bool", BOOL, True), ("u64", U64, 1 << 40), ("i64", I64, -(1 << 40)), ("f64", F64, 2.5),
        ("tokens", ARR, (STR, ["<s>", "a", "Ġb"])), ("scores", ARR, (F32, [0.0, -1.0, -2.0])),
        ("types", ARR, (I32, [3, 1, 1])), ("flags", ARR, (BOOL, [True, False])),
        ("nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["x"])])), ("empty", ARR, (U64, [])),
    ]
    seeds = {}
    for version in (2, 3):
        for t in TENSOR_TYPES:
            seeds[f"v{version}_type{t}"] = gguf(version, every_value[:3],
                                                [tensor(rng, f"w.{t}", t, 2, 1)])
        seeds[f"v{version}_values"] = gguf(version, every_value, [])
    seeds["all_types"] = gguf(3, every_value, [tensor(rng, f"blk.{i}.w", t, 1 + i % 2, 1)
                                               for i, t in enumerate(TENSOR_TYPES)])
    for alignment in (1, 8, 64):
        seeds[f"align{alignment}"] = gguf(3, every_value[:2],
                                          [tensor(rng, "a", 3, 1, 1), tensor(rng, "b", 0, 1, 3)],
                                          alignment)
    seeds["zero_size"] = gguf(3, [], [("z", [0, 5], 0, b"")])
    seeds["three_dims"] = gguf(3, [], [("c", [4, 2, 2], 1, bytes(32))])
    for name, data in seeds.items():
        (out / f"seed_{name}.gguf").write_bytes(data)
    print(f"make_corpus: {len(seeds)} seeds in {out}")


if __name__ == "__main__":
    main()
