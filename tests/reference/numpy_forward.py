#!/usr/bin/env python3
"""Independent NumPy reference forward pass over a GGUF file (Llama, Qwen2, Qwen3).

Written from the architectures' definitions, sharing no code with the C++ side: weights are read
with the `gguf` package (GGUFReader + gguf.quants.dequantize) and every layer is computed plainly
(full causal softmax attention, no caches, no fusion) in float64 by default, or float32.

Conventions it encodes (each is a place where an implementation can silently go wrong):
  * GGUF stores a matrix with ne0 = input features, so the numpy array is [out, in]: y = x @ W.T.
  * Llama GGUF files hold Q/K weights permuted by the converter so that RoPE rotates ADJACENT
    pairs (x[2i], x[2i+1]) ("normal" RoPE in llama.cpp); Qwen2/Qwen3 rotate pairs (i, i + d/2)
    (NEOX style).
  * Llama 3 frequency scaling: divide each pair's frequency by rope_freqs.weight[i] when that
    tensor is present; `<arch>.rope.scaling.type == linear` divides positions by the factor.
  * Grouped-query attention: query head h reads KV head h // (n_head / n_head_kv).
  * FFN: down(silu(gate(x)) * up(x)); the output head is token_embd when output.weight is absent.
  * Qwen2: Q/K/V biases. Qwen3: RMSNorm over each head of Q and K (attn_q_norm / attn_k_norm)
    before RoPE.

Usable as a library (ReferenceModel) or a command:
  numpy_forward.py --model M --ids 1,2,3 [--greedy 32] [--dtype float32] [--out logits.f32]
"""

import argparse
import copy
import dataclasses
import os
import sys

import numpy as np

import gguf


@dataclasses.dataclass
class Config:
  arch: str
  n_layer: int
  n_embd: int
  n_head: int
  n_head_kv: int
  head_dim: int
  n_ff: int
  vocab: int
  rms_eps: float
  rope_base: float
  rope_dim: int
  rope_neox: bool
  rope_linear_factor: float


_NEOX_ARCHS = {"qwen2", "qwen3", "qwen2moe", "qwen3moe"}
_SUPPORTED_ARCHS = {"llama", "qwen2", "qwen3"}


def _field(reader, key, default=None):
  f = reader.fields.get(key)
  if f is None:
    return default
  v = f.contents()
  return v


def read_config(reader):
  arch = _field(reader, "general.architecture")
  if arch not in _SUPPORTED_ARCHS:
    raise ValueError(f"numpy reference: unsupported architecture {arch!r}")

  def key(name, default=None):
    return _field(reader, f"{arch}.{name}", default)

  n_embd = int(key("embedding_length"))
  n_head = int(key("attention.head_count"))
  n_head_kv = int(key("attention.head_count_kv", n_head))
  head_dim = int(key("attention.key_length", n_embd // n_head))
  tokens = _field(reader, "tokenizer.ggml.tokens")
  vocab = int(key("vocab_size", len(tokens) if tokens is not None else 0))
  scaling = key("rope.scaling.type")
  factor = float(key("rope.scaling.factor", 1.0) or 1.0)
  return Config(
      arch=arch,
      n_layer=int(key("block_count")),
      n_embd=n_embd,
      n_head=n_head,
      n_head_kv=n_head_kv,
      head_dim=head_dim,
      n_ff=int(key("feed_forward_length")),
      vocab=vocab,
      rms_eps=float(key("attention.layer_norm_rms_epsilon")),
      rope_base=float(key("rope.freq_base", 10000.0)),
      rope_dim=int(key("rope.dimension_count", head_dim)),
      rope_neox=arch in _NEOX_ARCHS,
      rope_linear_factor=factor if scaling == "linear" else 1.0,
  )


def _dequant(tensor, dtype):
  """The tensor as numpy in its logical shape, outermost dimension first ([out, in] for a matrix)."""
  data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
  shape = tuple(int(d) for d in reversed(tensor.shape))
  return np.asarray(data, dtype=np.float32).reshape(shape).astype(dtype, copy=False)


class ReferenceModel:
  """Weights dequantized once into numpy; forward() computes logits for a token id sequence."""

  def __init__(self, path, dtype=np.float64):
    self.path = path
    self.dtype = np.dtype(dtype)
    reader = gguf.GGUFReader(path)
    self.config = read_config(reader)
    self._tensors = {t.name: t for t in reader.tensors}
    c = self.config
    self.token_embd = self._get("token_embd.weight")  # [vocab, n_embd]
    if self.token_embd.shape != (c.vocab, c.n_embd):
      raise ValueError(f"token_embd shape {self.token_embd.shape}, expected {(c.vocab, c.n_embd)}")
    self.output_norm = self._get("output_norm.weight")
    self.output = self._get("output.weight", optional=True)
    if self.output is None:
      self.output = self.token_embd  # tied head
    self.rope_freqs = self._get("rope_freqs.weight", optional=True)
    self.layers = []
    for i in range(c.n_layer):
      p = f"blk.{i}."
      layer = {
          name: self._get(p + name + ".weight", optional=name in ("attn_q_norm", "attn_k_norm"))
          for name in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                       "ffn_gate", "ffn_up", "ffn_down", "attn_q_norm", "attn_k_norm")
      }
      for b in ("attn_q", "attn_k", "attn_v", "attn_output"):
        layer[b + ".bias"] = self._get(p + b + ".bias", optional=True)
      self._check_layer(i, layer)
      self.layers.append(layer)
    self._rope_cache = {}

  def _get(self, name, optional=False):
    t = self._tensors.get(name)
    if t is None:
      if optional:
        return None
      raise ValueError(f"numpy reference: tensor {name} missing from {self.path}")
    return _dequant(t, self.dtype)

  def _check_layer(self, i, layer):
    c = self.config
    q_out = c.n_head * c.head_dim
    kv_out = c.n_head_kv * c.head_dim
    want = {
        "attn_q": (q_out, c.n_embd),
        "attn_k": (kv_out, c.n_embd),
        "attn_v": (kv_out, c.n_embd),
        "attn_output": (c.n_embd, q_out),
        "ffn_gate": (c.n_ff, c.n_embd),
        "ffn_up": (c.n_ff, c.n_embd),
        "ffn_down": (c.n_embd, c.n_ff),
    }
    for name, shape in want.items():
      if layer[name].shape != shape:
        raise ValueError(f"blk.{i}.{name}.weight shape {layer[name].shape}, expected {shape}")

  # --- building blocks -------------------------------------------------------------------------

  def _rms_norm(self, x, w):
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + self.config.rms_eps) * w

  def _rope_angles(self, n):
    """cos/sin of shape [n, rope_dim/2] for positions 0..n-1."""
    if n not in self._rope_cache:
      c = self.config
      half = c.rope_dim // 2
      inv_freq = c.rope_base ** (-np.arange(half, dtype=np.float64) * 2.0 / c.rope_dim)
      if self.rope_freqs is not None:
        inv_freq = inv_freq / np.asarray(self.rope_freqs[:half], dtype=np.float64)
      pos = np.arange(n, dtype=np.float64) / c.rope_linear_factor
      ang = np.outer(pos, inv_freq)
      self._rope_cache[n] = (np.cos(ang).astype(self.dtype), np.sin(ang).astype(self.dtype))
    return self._rope_cache[n]

  def _rope(self, x):
    """x: [n, heads, head_dim]; rotates the first rope_dim features of each head."""
    c = self.config
    n = x.shape[0]
    cos, sin = self._rope_angles(n)
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    out = x.copy()
    r = x[..., : c.rope_dim]
    if c.rope_neox:
      half = c.rope_dim // 2
      a, b = r[..., :half], r[..., half:]
      out[..., :half] = a * cos - b * sin
      out[..., half : c.rope_dim] = a * sin + b * cos
    else:
      a, b = r[..., 0::2], r[..., 1::2]
      out[..., 0 : c.rope_dim : 2] = a * cos - b * sin
      out[..., 1 : c.rope_dim : 2] = a * sin + b * cos
    return out

  def _qkv(self, x, layer):
    """Q, K (per-head norms and RoPE applied) and V of the normed stream x: [n, heads, head_dim]."""
    c = self.config
    n = x.shape[0]
    q = x @ layer["attn_q"].T
    k = x @ layer["attn_k"].T
    v = x @ layer["attn_v"].T
    for name, t in (("attn_q", q), ("attn_k", k), ("attn_v", v)):
      if layer[name + ".bias"] is not None:
        t += layer[name + ".bias"]
    q = q.reshape(n, c.n_head, c.head_dim)
    k = k.reshape(n, c.n_head_kv, c.head_dim)
    v = v.reshape(n, c.n_head_kv, c.head_dim)
    if layer["attn_q_norm"] is not None:
      q = self._rms_norm(q, layer["attn_q_norm"])
    if layer["attn_k_norm"] is not None:
      k = self._rms_norm(k, layer["attn_k_norm"])
    return self._rope(q), self._rope(k), v

  def _attention(self, x, layer):
    c = self.config
    n = x.shape[0]
    q, k, v = self._qkv(x, layer)
    group = c.n_head // c.n_head_kv
    scale = 1.0 / np.sqrt(c.head_dim)
    mask = np.triu(np.full((n, n), -np.inf, dtype=self.dtype), k=1)
    out = np.empty((n, c.n_head, c.head_dim), dtype=self.dtype)
    for h in range(c.n_head):
      kv = h // group
      s = (q[:, h, :] @ k[:, kv, :].T) * scale + mask  # [n, n]
      s = s - s.max(axis=-1, keepdims=True)
      p = np.exp(s)
      p /= p.sum(axis=-1, keepdims=True)
      out[:, h, :] = p @ v[:, kv, :]
    y = out.reshape(n, c.n_head * c.head_dim) @ layer["attn_output"].T
    if layer["attn_output.bias"] is not None:
      y += layer["attn_output.bias"]
    return y

  def _ffn(self, x, layer):
    g = x @ layer["ffn_gate"].T
    u = x @ layer["ffn_up"].T
    return (g / (1.0 + np.exp(-g)) * u) @ layer["ffn_down"].T

  # --- public ----------------------------------------------------------------------------------

  def cast(self, dtype):
    """A copy computing in another dtype, from the same dequantized weights (no reload)."""
    other = copy.copy(self)
    other.dtype = np.dtype(dtype)
    conv = lambda a: None if a is None else a.astype(other.dtype)  # noqa: E731
    other.token_embd = conv(self.token_embd)
    other.output = other.token_embd if self.output is self.token_embd else conv(self.output)
    other.output_norm = conv(self.output_norm)
    other.rope_freqs = conv(self.rope_freqs)
    other.layers = [{k: conv(v) for k, v in layer.items()} for layer in self.layers]
    other._rope_cache = {}
    return other

  def with_config(self, **changes):
    """A copy sharing the weights with config fields changed (for negative controls)."""
    other = copy.copy(self)
    other.config = dataclasses.replace(self.config, **changes)
    other._rope_cache = {}
    return other

  def mean_nll(self, ids):
    """Mean negative log-likelihood (nats) of ids[1:] given their prefixes."""
    logits = self.logits(ids, all_positions=True)[:-1].astype(np.float64)
    m = logits.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))[:, 0]
    target = logits[np.arange(len(ids) - 1), np.asarray(ids[1:])]
    return float(np.mean(lse - target))

  def hidden(self, ids):
    """Final normalised hidden states [n, n_embd] for token ids (teacher-forced, causal)."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or len(ids) == 0:
      raise ValueError("ids must be a non-empty 1-D sequence")
    if ids.min() < 0 or ids.max() >= self.config.vocab:
      raise ValueError(f"token id out of range [0, {self.config.vocab})")
    x = self.token_embd[ids].astype(self.dtype)
    for layer in self.layers:
      x = x + self._attention(self._rms_norm(x, layer["attn_norm"]), layer)
      x = x + self._ffn(self._rms_norm(x, layer["ffn_norm"]), layer)
    return self._rms_norm(x, self.output_norm)

  def logits(self, ids, all_positions=False):
    """Logits [vocab] of the last position, or [n, vocab] of every position."""
    h = self.hidden(ids)
    if not all_positions:
      h = h[-1:]
    out = h @ self.output.T
    return out if all_positions else out[0]

  def greedy(self, ids, max_tokens, eos=None):
    """Greedy continuation (argmax, ties -> lowest id), recomputing the full prefix each step."""
    seq = list(int(i) for i in ids)
    out = []
    for _ in range(max_tokens):
      t = int(np.argmax(self.logits(seq)))
      out.append(t)
      seq.append(t)
      if eos is not None and t in eos:
        break
    return out


def rel_l2(a, b):
  """||a - b|| / ||b|| in float64."""
  a = np.asarray(a, dtype=np.float64)
  b = np.asarray(b, dtype=np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", default=os.environ.get("TRIPOD_MODEL"))
  ap.add_argument("--ids", required=True, help="comma-separated token ids")
  ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
  ap.add_argument("--greedy", type=int, default=0, help="generate this many tokens greedily")
  ap.add_argument("--all", action="store_true", help="write every position's logits")
  ap.add_argument("--out", help="write logits as raw little-endian float32")
  args = ap.parse_args(argv)
  if not args.model:
    sys.exit("numpy_forward: --model or TRIPOD_MODEL is required")
  ids = [int(s) for s in args.ids.split(",") if s.strip()]
  model = ReferenceModel(args.model, np.dtype(args.dtype))
  if args.greedy:
    print(" ".join(str(t) for t in model.greedy(ids, args.greedy)))
    return 0
  logits = model.logits(ids, all_positions=args.all)
  if args.out:
    logits.astype("<f4").tofile(args.out)
  last = logits[-1] if args.all else logits
  print(f"argmax {int(np.argmax(last))} max {float(np.max(last)):.6f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
