"""What test_archs.py adds to numpy_forward.py: Llama 3.1 RoPE frequency scaling from the
`<arch>.rope.scaling.*` keys (numpy_forward.py only knows the rope_freqs.weight tensor), the
converter's rope_freqs formula to cross-check it, and "wrong" variants of a reference model
(negative controls that prove each architecture feature changes the logits).
"""

import copy
import dataclasses
import math

import numpy as np

import gguf
import numpy_forward


def llama3_inv_freq(base, dim, factor, low_freq_factor, high_freq_factor, original_context):
  """Llama 3.1 inverse frequencies as Hugging Face transformers computes them
  (rope_type "llama3"): wavelengths longer than original_context / low_freq_factor are slowed
  by `factor`, shorter than original_context / high_freq_factor kept, and interpolated between.
  """
  inv = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
  low_wavelen = original_context / low_freq_factor
  high_wavelen = original_context / high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
  smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return np.where(medium, smoothed, scaled)


def llama3_rope_factors(base, dim, factor, low_freq_factor, high_freq_factor, original_context):
  """The divisors llama.cpp's converter stores as rope_freqs.weight for the same scaling
  (written independently of llama3_inv_freq, per-frequency as the converter loops)."""
  out = []
  for i in range(dim // 2):
    freq = 1.0 / base ** (2 * i / dim)
    wavelen = 2 * math.pi / freq
    if wavelen < original_context / high_freq_factor:
      out.append(1.0)
    elif wavelen > original_context / low_freq_factor:
      out.append(factor)
    else:
      smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor -
                                                                 low_freq_factor)
      out.append(1.0 / ((1 - smooth) / factor + smooth))
  return np.asarray(out, dtype=np.float64)


class ArchReference(numpy_forward.ReferenceModel):
  """numpy_forward.ReferenceModel plus Llama 3.1 scaling read from the file's keys, and switches
  for negative controls (drop biases / q-k norm, q-k norm after RoPE, override inv_freq)."""

  def __init__(self, path, dtype=np.float64):
    super().__init__(path, dtype)
    reader = gguf.GGUFReader(path)
    a = self.config.arch

    def key(name, default=None):
      f = reader.fields.get(f"{a}.{name}")
      return default if f is None else f.contents()

    self.llama3 = None
    if key("rope.scaling.type") == "llama3":
      self.llama3 = dict(
          factor=float(key("rope.scaling.factor", 1.0)),
          low_freq_factor=float(key("rope.scaling.low_freq_factor", 1.0)),
          high_freq_factor=float(key("rope.scaling.high_freq_factor", 4.0)),
          original_context=int(key("rope.scaling.original_context_length", 8192)))
    self.inv_freq_override = None
    self.qk_norm_after_rope = False

  def inv_freq(self):
    c = self.config
    if self.inv_freq_override is not None:
      return np.asarray(self.inv_freq_override, dtype=np.float64)
    if self.rope_freqs is not None:
      base = c.rope_base ** (-np.arange(c.rope_dim // 2, dtype=np.float64) * 2.0 / c.rope_dim)
      return base / np.asarray(self.rope_freqs[: c.rope_dim // 2], dtype=np.float64)
    if self.llama3 is not None:
      return llama3_inv_freq(c.rope_base, c.rope_dim, **self.llama3)
    return c.rope_base ** (-np.arange(c.rope_dim // 2, dtype=np.float64) * 2.0 / c.rope_dim)

  def _rope_angles(self, n):
    if n not in self._rope_cache:
      pos = np.arange(n, dtype=np.float64) / self.config.rope_linear_factor
      ang = np.outer(pos, self.inv_freq())
      self._rope_cache[n] = (np.cos(ang).astype(self.dtype), np.sin(ang).astype(self.dtype))
    return self._rope_cache[n]

  def _attention(self, x, layer):
    if not self.qk_norm_after_rope or layer["attn_q_norm"] is None:
      return super()._attention(x, layer)
    # Negative control: apply the per-head norms after RoPE instead of before.
    # The base class ropes q first, then k.
    norms = [layer["attn_q_norm"], layer["attn_k_norm"]]
    plain = dict(layer, attn_q_norm=None, attn_k_norm=None)
    rope = self._rope

    def rope_then_norm(t):
      return self._rms_norm(rope(t), norms.pop(0))

    self._rope = rope_then_norm
    try:
      return super()._attention(x, plain)
    finally:
      del self._rope

  # --- negative controls ---------------------------------------------------------------------

  def variant(self, **changes):
    """A copy with reference-only switches or config fields changed (weights shared)."""
    other = copy.copy(self)
    other._rope_cache = {}
    cfg = {k: v for k, v in changes.items() if hasattr(self.config, k)}
    if cfg:
      other.config = dataclasses.replace(self.config, **cfg)
    for k, v in changes.items():
      if k in cfg:
        continue
      if k == "drop_biases" and v:
        other.layers = [{n: (None if n.endswith(".bias") else t) for n, t in l.items()}
                        for l in self.layers]
      elif k == "drop_qk_norm" and v:
        other.layers = [dict(l, attn_q_norm=None, attn_k_norm=None) for l in self.layers]
      elif k in ("llama3", "rope_freqs", "inv_freq_override", "qk_norm_after_rope"):
        setattr(other, k, v)
      else:
        raise ValueError(f"unknown variant switch {k}")
    return other
