"""Tiny random-weight GGUF files for the architecture tests (test_archs.py): one ArchSpec per
variant (Llama / Qwen2 / Qwen3 options, tensor types), written with gguf.GGUFWriter.

Weights are random but scaled so that activations stay O(1) and the logits have a clear top-1;
quantized tensors are stored quantized, so the C++ side and the NumPy reference (which
dequantizes from the file) see the same values.
"""

import dataclasses

import numpy as np

import gguf

Q = gguf.GGMLQuantizationType


@dataclasses.dataclass
class ArchSpec:
  arch: str = "llama"
  n_layer: int = 2
  d_model: int = 64
  n_head: int = 4
  n_head_kv: int = 4
  head_dim: int = 0  # 0: d_model / n_head, with no key_length key written
  d_ff: int = 192
  vocab: int = 300
  rms_eps: float = 1e-5
  rope_base: float = 10000.0
  context_length: int = 256
  tied_head: bool = False
  qkv_bias: bool = False  # Qwen2
  qk_norm: bool = False  # Qwen3
  # Llama 3.1 scaling via keys: dict(factor=, low_freq_factor=, high_freq_factor=,
  # original_context_length=) written as <arch>.rope.scaling.*; None: no keys.
  llama3_keys: dict = None
  rope_freqs: np.ndarray = None  # written as rope_freqs.weight [head_dim / 2] when set
  # Tensor type by role ("attn_q", "ffn_down", "token_embd", "output", ...) or by full tensor
  # name; anything unnamed is F32. Per-layer choices: a list indexed by layer.
  types: dict = dataclasses.field(default_factory=dict)
  omit: tuple = ()  # tensor names left out (negative tests)
  wrong_shape: tuple = ()  # tensor names written with one output row too many
  seed: int = 0

  @property
  def hd(self):
    return self.head_dim or self.d_model // self.n_head


def _bytes_to_unicode():
  """GPT-2's byte -> printable code point map (its byte-level BPE alphabet)."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(
      range(0xAE, 0xFF + 1))
  out, extra = {}, 0
  for b in range(256):
    if b in keep:
      out[b] = chr(b)
    else:
      out[b] = chr(256 + extra)
      extra += 1
  return out


def dummy_tokenizer(vocab):
  """(tokens, types, merges): 256 byte tokens, merged pairs, and <|endoftext|> last."""
  b2u = _bytes_to_unicode()
  tokens = [b2u[b] for b in range(256)]
  types = [gguf.TokenType.NORMAL] * 256
  merges = []
  letters = "etaoinshrdlucmfwypvbgk"
  sp = b2u[ord(" ")]
  pairs = [(sp, c) for c in letters] + [(a, b) for a in letters for b in letters]
  for left, right in pairs:
    if len(tokens) >= vocab - 1:
      break
    merges.append(f"{left} {right}")
    tokens.append(left + right)
    types.append(gguf.TokenType.NORMAL)
  tokens.append("<|endoftext|>")
  types.append(gguf.TokenType.CONTROL)
  assert len(tokens) == vocab, "vocab too small for the byte alphabet"
  return tokens, types, merges


def _type_for(spec, role, name, layer):
  t = spec.types.get(name, spec.types.get(role, Q.F32))
  if isinstance(t, (list, tuple)):
    t = t[layer % len(t)]
  return t


def _add(writer, spec, role, name, array, layer=-1):
  if name in spec.omit:
    return
  qtype = _type_for(spec, role, name, layer)
  array = np.ascontiguousarray(array, dtype=np.float32)
  if qtype == Q.F32:
    writer.add_tensor(name, array)
  elif qtype == Q.F16:
    writer.add_tensor(name, array.astype(np.float16))
  else:
    writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)


def tensors(spec):
  """[(role, name, array [out, in] or [n], layer)] in file order."""
  rng = np.random.default_rng(spec.seed)
  d, hd, ff, v = spec.d_model, spec.hd, spec.d_ff, spec.vocab
  qd, kvd = spec.n_head * hd, spec.n_head_kv * hd

  def mat(out, inp, name):
    rows = out + (1 if name in spec.wrong_shape else 0)
    return rng.standard_normal((rows, inp)) / np.sqrt(inp)

  def norm(n):
    return 1.0 + 0.2 * rng.standard_normal(n)

  out = [("token_embd", "token_embd.weight", 0.5 * rng.standard_normal((v, d)), -1),
         ("output_norm", "output_norm.weight", norm(d), -1)]
  if not spec.tied_head:
    out.append(("output", "output.weight", mat(v, d, "output.weight") * 3.0, -1))
  if spec.rope_freqs is not None:
    out.append(("rope_freqs", "rope_freqs.weight", np.asarray(spec.rope_freqs), -1))
  for i in range(spec.n_layer):
    p = f"blk.{i}."
    out.append(("attn_norm", p + "attn_norm.weight", norm(d), i))
    for role, rows in (("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)):
      out.append((role, p + role + ".weight", mat(rows, d, p + role + ".weight"), i))
      if spec.qkv_bias:
        out.append((role + "_bias", p + role + ".bias", 0.5 * rng.standard_normal(rows), i))
    if spec.qk_norm:
      out.append(("attn_q_norm", p + "attn_q_norm.weight", norm(hd), i))
      out.append(("attn_k_norm", p + "attn_k_norm.weight", norm(hd), i))
    out.append(("attn_output", p + "attn_output.weight", mat(d, qd, p + "attn_output.weight"), i))
    out.append(("ffn_norm", p + "ffn_norm.weight", norm(d), i))
    out.append(("ffn_gate", p + "ffn_gate.weight", mat(ff, d, p + "ffn_gate.weight"), i))
    out.append(("ffn_up", p + "ffn_up.weight", mat(ff, d, p + "ffn_up.weight"), i))
    out.append(("ffn_down", p + "ffn_down.weight", mat(d, ff, p + "ffn_down.weight"), i))
  return out


def write_gguf(path, spec):
  """Writes the model `spec` describes to `path`."""
  a = spec.arch
  w = gguf.GGUFWriter(path, a)
  w.add_name(f"tiny-{a}")
  w.add_block_count(spec.n_layer)
  w.add_context_length(spec.context_length)
  w.add_embedding_length(spec.d_model)
  w.add_feed_forward_length(spec.d_ff)
  w.add_head_count(spec.n_head)
  w.add_head_count_kv(spec.n_head_kv)
  w.add_layer_norm_rms_eps(spec.rms_eps)
  w.add_rope_freq_base(spec.rope_base)
  w.add_rope_dimension_count(spec.hd)
  w.add_vocab_size(spec.vocab)
  if spec.head_dim:
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
  if spec.llama3_keys is not None:
    k = spec.llama3_keys
    w.add_string(f"{a}.rope.scaling.type", "llama3")
    w.add_rope_scaling_factor(k["factor"])
    w.add_float32(f"{a}.rope.scaling.low_freq_factor", k["low_freq_factor"])
    w.add_float32(f"{a}.rope.scaling.high_freq_factor", k["high_freq_factor"])
    w.add_rope_scaling_orig_ctx_len(k["original_context_length"])
  tokens, types, merges = dummy_tokenizer(spec.vocab)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("gpt-2")
  w.add_token_list(tokens)
  w.add_token_types(types)
  w.add_token_merges(merges)
  w.add_bos_token_id(spec.vocab - 1)
  w.add_eos_token_id(spec.vocab - 1)
  for role, name, array, layer in tensors(spec):
    _add(w, spec, role, name, array, layer)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
