"""Hugging Face `tokenizers` BPE built from a GGUF file's own vocabulary and merges.

An independent tokenizer for the reference tests (the C++ tokenizer is not used to make test
inputs). Covers the gpt2-style byte-level BPE of the Llama-3 / SmolLM / Qwen families; the
pre-split follows the GGUF's `tokenizer.ggml.pre` name.
"""

import functools

import gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, AddedToken

# llama.cpp's token types: 3 = control, 4 = user defined. Both are matched whole in text.
_SPECIAL_TYPES = (3, 4)

# Pre-split regexes by tokenizer.ggml.pre: GPT-2's, Llama 3's, and Qwen2's (Llama 3's with
# single digits, \p{N} for \p{N}{1,3}, as its tokenizer.json has it).
_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                 r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}", 1)


def _pre_tokenizer(pre):
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  if pre in ("smollm", "starcoder", "refact", "codeshell"):
    # Digits one by one, then GPT-2's split.
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(_regex(_GPT2_SPLIT), behavior="isolated"),
        byte_level,
    ])
  if pre in ("llama-bpe", "llama3", "qwen2", "smaug-bpe"):
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(_regex(_QWEN2_SPLIT if pre == "qwen2" else _LLAMA3_SPLIT),
                             behavior="isolated"),
        byte_level,
    ])
  if pre in ("gpt-2", "default", None):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  raise ValueError(f"ref_tokenizer: no pre-tokenizer for tokenizer.ggml.pre={pre!r}")


def _regex(pattern):
  from tokenizers import Regex
  return Regex(pattern)


@functools.lru_cache(maxsize=4)
def load(path):
  """Returns (tokenizer, info) where info has bos/eos ids and the token strings."""
  reader = gguf.GGUFReader(path)

  def field(key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()

  model_kind = field("tokenizer.ggml.model")
  if model_kind != "gpt2":
    raise ValueError(f"ref_tokenizer: only gpt2-style BPE is supported, got {model_kind!r}")
  tokens = field("tokenizer.ggml.tokens")
  types = field("tokenizer.ggml.token_type")
  merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
  vocab = {t: i for i, t in enumerate(tokens)}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
  tok.pre_tokenizer = _pre_tokenizer(field("tokenizer.ggml.pre"))
  tok.decoder = decoders.ByteLevel()
  specials = [AddedToken(t, special=True, normalized=False)
              for t, ty in zip(tokens, types) if ty in _SPECIAL_TYPES]
  tok.add_special_tokens(specials)
  info = {
      "bos": field("tokenizer.ggml.bos_token_id"),
      "eos": field("tokenizer.ggml.eos_token_id"),
      "tokens": tokens,
      "chat_template": field("tokenizer.chat_template"),
  }
  return tok, info


def encode(path, text):
  tok, _ = load(path)
  return tok.encode(text, add_special_tokens=False).ids


def decode(path, ids):
  tok, _ = load(path)
  return tok.decode(list(ids), skip_special_tokens=False)


def token_id(path, text):
  """The id of one whole token (a special token such as <|im_end|>)."""
  tok, _ = load(path)
  i = tok.token_to_id(text)
  if i is None:
    raise KeyError(f"ref_tokenizer: {text!r} is not a token")
  return i
