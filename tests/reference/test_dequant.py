#!/usr/bin/env python3
"""Checks Tripod's GGUF reader and dequantisation against the gguf Python package.

1. Writes GGUF files (v3, and the same bytes patched to v2; alignments 32 and 64) with gguf's
   GGUFWriter: metadata of every value type (nested arrays too) and random tensors of every
   type Tripod supports. Quantised types use gguf.quants.quantize where the package can quantise
   them, plus random valid block bytes (the only way for the K-quants).
2. Runs tests/tools/gguf_dump (env TRIPOD_GGUF_DUMP, else <dir of TRIPOD_BIN>/tests/gguf_dump):
   its JSON must match what was written and gguf.GGUFReader's view; every tensor it dequantises
   must equal gguf.quants.dequantize (exactly, or within 1e-6 relative).
3. Compares all metadata and tensor infos of the real model (TRIPOD_MODEL) the same way, and
   dequantises a few of its tensors.
Exits non-zero on any mismatch.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as VT

TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# Byte offsets of the fp16 scale fields inside one block, per type.
FP16_FIELDS = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2],
               Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}

failures: list[str] = []


def fail(msg: str) -> None:
    failures.append(msg)
    print("FAIL:", msg)


def find_dump() -> Path:
    env = os.environ.get("TRIPOD_GGUF_DUMP")
    if env:
        return Path(env)
    tripod_bin = os.environ.get("TRIPOD_BIN")
    if not tripod_bin:
        sys.exit("test_dequant: set TRIPOD_GGUF_DUMP (or TRIPOD_BIN) to find gguf_dump")
    return Path(tripod_bin).parent / "tests" / "gguf_dump"


def dump_json(tool: Path, path: Path) -> dict:
    out = subprocess.run([str(tool), str(path)], check=True, capture_output=True)
    return json.loads(out.stdout)


def random_blocks(rng: np.random.Generator, qtype: Q, rows: int, cols: int,
                  finite_scales: bool) -> np.ndarray:
    """Random block bytes of a quantised type; scales made finite fp16 unless told otherwise."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block
    data = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    if finite_scales:
        for off in FP16_FIELDS[qtype]:
            scale = (rng.standard_normal(nb) * 0.05).astype(np.float16)
            scale[::7] = np.float16(6e-6)  # a subnormal fp16 now and then
            data[:, off:off + 2] = scale.view(np.uint8).reshape(nb, 2)
    return data.reshape(rows, cols // block * size)


def make_tensors(rng: np.random.Generator) -> list[tuple[str, Q, np.ndarray, tuple]]:
    """(name, type, array for GGUFWriter, numpy shape) for every supported type."""
    out = []
    rows, cols = 3, 512
    for qt in TYPES:
        x = (rng.standard_normal((rows, cols)) * 2).astype(np.float32)
        if qt == Q.F32:
            out.append(("f32", qt, x, x.shape))
            x3 = rng.standard_normal((2, 3, 32)).astype(np.float32)
            out.append(("f32.3d", qt, x3, x3.shape))
            continue
        if qt == Q.F16:
            h = x.astype(np.float16)
            h[0, :4] = [np.inf, -np.inf, 6e-8, -0.0]
            out.append(("f16", qt, h, h.shape))
            continue
        name = qt.name.lower()
        try:
            q = gguf.quants.quantize(x, qt)
            out.append((f"{name}.quantized", qt, q, x.shape))
        except NotImplementedError:
            pass  # K-quants: the package dequantises but cannot quantise them
        if qt == Q.BF16:
            bits = rng.integers(0, 1 << 16, size=(rows, cols), dtype=np.uint16)
            out.append((f"{name}.random", qt, bits.view(np.uint8), x.shape))
            continue
        out.append((f"{name}.random", qt, random_blocks(rng, qt, rows, cols, True), x.shape))
        out.append((f"{name}.wild", qt, random_blocks(rng, qt, 1, cols, False), (1, cols)))
    return out


def f32(v: float) -> float:
    return float(np.float32(v))


# key -> (type, elem type or None, value as Tripod's JSON shows it, how GGUFWriter writes it)
METADATA = {
    "t.u8": ("UINT8", None, 200, VT.UINT8),
    "t.i8": ("INT8", None, -100, VT.INT8),
    "t.u16": ("UINT16", None, 65535, VT.UINT16),
    "t.i16": ("INT16", None, -32768, VT.INT16),
    "t.u32": ("UINT32", None, 4294967295, VT.UINT32),
    "t.i32": ("INT32", None, -2147483648, VT.INT32),
    "t.f32": ("FLOAT32", None, f32(0.1), VT.FLOAT32),
    "t.bool": ("BOOL", None, True, VT.BOOL),
    "t.str": ("STRING", None, "grüße, 世界", VT.STRING),
    "t.u64": ("UINT64", None, 18446744073709551615, VT.UINT64),
    "t.i64": ("INT64", None, -9223372036854775808, VT.INT64),
    "t.f64": ("FLOAT64", None, 1e-300, VT.FLOAT64),
    "a.u8": ("ARRAY", "UINT8", [0, 7, 255], VT.UINT8),
    "a.i16": ("ARRAY", "INT16", [-1, 2], VT.INT16),
    "a.u32": ("ARRAY", "UINT32", [1, 2, 3], VT.UINT32),
    "a.i32": ("ARRAY", "INT32", [-5], VT.INT32),
    "a.u64": ("ARRAY", "UINT64", [2**64 - 1], VT.UINT64),
    "a.i64": ("ARRAY", "INT64", [-(2**63)], VT.INT64),
    "a.f32": ("ARRAY", "FLOAT32", [f32(1.5), f32(-0.3)], VT.FLOAT32),
    "a.f64": ("ARRAY", "FLOAT64", [2.5, -1e100], VT.FLOAT64),
    "a.bool": ("ARRAY", "BOOL", [True, False, True], VT.BOOL),
    "a.str": ("ARRAY", "STRING", ["a", "", "Ġt"], VT.STRING),
    "a.nested": ("ARRAY", "ARRAY", [[1, 2], [3]], VT.ARRAY),
    "a.nested_str": ("ARRAY", "ARRAY", [["x"], ["y", "z"]], VT.ARRAY),
}


def write_synthetic(path: Path, tensors, alignment: int) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment != 32:
        w.add_custom_alignment(alignment)
    for key, (type_name, elem, value, vt) in METADATA.items():
        if type_name == "ARRAY":
            w.add_key_value(key, value, VT.ARRAY, sub_type=vt)
        else:
            w.add_key_value(key, value, vt)
    for name, qt, arr, _ in tensors:
        raw = None if qt in (Q.F32, Q.F16) else qt
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def compare_metadata_with_reader(label: str, ours: dict, reader: gguf.GGUFReader) -> None:
    md = ours["metadata"]
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    if set(md) != set(fields):
        fail(f"{label}: keys differ: only ours {sorted(set(md) - set(fields))}, "
             f"only reader {sorted(set(fields) - set(md))}")
    for key, field in fields.items():
        if key not in md:
            continue
        mine = md[key]
        main = field.types[0]
        if mine["type"] != main.name:
            fail(f"{label}: {key}: type {mine['type']} != reader {main.name}")
            continue
        if main == VT.ARRAY:
            elem = VT(int(field.parts[3][0]))  # parts: key length, key, type, elem type, ...
            if mine["elem_type"] != elem.name:
                fail(f"{label}: {key}: elem type {mine['elem_type']} != reader {elem.name}")
            if elem == VT.ARRAY:
                continue  # the reader flattens nested arrays; checked against METADATA instead
        want = field.contents()
        if mine["value"] != want:
            fail(f"{label}: {key}: value differs from the reader's "
                 f"({str(mine['value'])[:80]} vs {str(want)[:80]})")


def compare_tensor_infos(label: str, ours: dict, reader: gguf.GGUFReader) -> None:
    mine = ours["tensors"]
    if len(mine) != len(reader.tensors):
        fail(f"{label}: {len(mine)} tensors, reader has {len(reader.tensors)}")
        return
    for t, r in zip(mine, reader.tensors):
        want = (r.name, r.tensor_type.name, [int(d) for d in r.shape], int(r.n_elements),
                int(r.n_bytes), int(r.data_offset))
        got = (t["name"], t["type"], t["dims"], t["n_elements"], t["n_bytes"],
               ours["data_offset"] + t["offset"])
        if got != want:
            fail(f"{label}: tensor info {got} != reader {want}")


def compare_values(label: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.shape != want.shape:
        fail(f"{label}: {got.size} values, reference has {want.size}")
        return
    if np.array_equal(got, want, equal_nan=True):
        return
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite) or not np.allclose(
            got, want, rtol=1e-6, atol=0, equal_nan=True):
        diff = np.abs(got[finite] - want[finite])
        fail(f"{label}: max abs diff {diff.max() if diff.size else 'n/a'}, "
             f"{int(np.sum(got != want))} of {want.size} differ")


def dequantize(r) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):  # the "wild" blocks have inf/NaN scales
        return np.asarray(gguf.quants.dequantize(r.data, r.tensor_type), dtype=np.float32)


def check_tensors(label: str, tool: Path, path: Path, reader: gguf.GGUFReader, tmp: Path,
                  names=None) -> int:
    outdir = tmp / f"dump_{label}"
    outdir.mkdir(exist_ok=True)
    checked = 0
    for i, r in enumerate(reader.tensors):
        if names is not None and r.name not in names:
            continue
        out = outdir / f"{i}.f32"
        subprocess.run([str(tool), str(path), "--tensor", r.name, "--out", str(out)], check=True)
        got = np.fromfile(out, dtype=np.float32)
        want = dequantize(r)
        compare_values(f"{label}: tensor {r.name} ({r.tensor_type.name})", got, want.reshape(-1))
        out.unlink()
        checked += 1
    return checked


def check_synthetic(tool: Path, tmp: Path) -> None:
    rng = np.random.default_rng(1234)
    tensors = make_tensors(rng)
    for alignment in (32, 64):
        path = tmp / f"synthetic_a{alignment}.gguf"
        write_synthetic(path, tensors, alignment)
        for version in (3, 2):
            if version == 2:  # v2 and v3 share the little-endian layout; only the field differs
                data = bytearray(path.read_bytes())
                data[4:8] = (2).to_bytes(4, "little")
                path.write_bytes(bytes(data))
            label = f"synthetic v{version} align {alignment}"
            ours = dump_json(tool, path)
            if ours["version"] != version or ours["alignment"] != alignment:
                fail(f"{label}: version/alignment {ours['version']}/{ours['alignment']}")
            for key, (type_name, elem, value, _) in METADATA.items():
                got = ours["metadata"].get(key)
                want = {"type": type_name, "value": value}
                if elem:
                    want["elem_type"] = elem
                if got != want:
                    fail(f"{label}: {key}: {got} != written {want}")
            reader = gguf.GGUFReader(path)
            compare_metadata_with_reader(label, ours, reader)
            compare_tensor_infos(label, ours, reader)
            n = check_tensors(f"v{version}a{alignment}", tool, path, reader, tmp)
            # Unquantised types must also equal what was written.
            for name, qt, arr, shape in tensors:
                if qt != Q.F32:
                    continue
                t = reader.tensors[[r.name for r in reader.tensors].index(name)]
                compare_values(f"{label}: {name} vs written", np.asarray(t.data).reshape(-1),
                               arr.reshape(-1))
            print(f"{label}: {len(ours['metadata'])} keys, {n} tensors checked")


def check_real_model(tool: Path, tmp: Path) -> None:
    model = os.environ.get("TRIPOD_MODEL")
    if not model or not Path(model).exists():
        fail(f"TRIPOD_MODEL is unset or missing ({model})")
        return
    path = Path(model)
    ours = dump_json(tool, path)
    reader = gguf.GGUFReader(path)
    compare_metadata_with_reader("model", ours, reader)
    compare_tensor_infos("model", ours, reader)
    names = {"token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight",
             "blk.0.attn_k.weight", "blk.29.ffn_down.weight", "blk.29.attn_norm.weight"}
    n = check_tensors("model", tool, path, reader, tmp, names)
    if n != len(names):
        fail(f"model: only {n} of the tensors {sorted(names)} found")
    timing = subprocess.run([str(tool), str(path), "--time", "10"], check=True,
                            capture_output=True, text=True).stdout.strip()
    print(f"model: {len(ours['metadata'])} keys, {len(ours['tensors'])} tensors, {n} dequantised;"
          f" parse {timing}")


def main() -> int:
    tool = find_dump()
    if not tool.exists():
        print(f"test_dequant: gguf_dump not found at {tool}")
        return 1
    with tempfile.TemporaryDirectory(prefix="tripod_dequant_") as d:
        tmp = Path(d)
        check_synthetic(tool, tmp)
        check_real_model(tool, tmp)
    if failures:
        print(f"test_dequant: {len(failures)} failure(s)")
        return 1
    print("test_dequant: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
