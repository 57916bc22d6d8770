"""Builds a Hugging Face `tokenizers.Tokenizer` from the vocabulary in a GGUF file.

The reference for Tripod's tokenizer: the same vocabulary and merges, run through the Hugging
Face Rust implementation configured the way each model's tokenizer.json configures it (the
pre-tokenizer patterns below are those tokenizer.json files' patterns).
"""

import functools

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers

# tokenizer.json Split patterns (Llama 3, Qwen2).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@functools.lru_cache(maxsize=8)
def read_vocab(path):
    """Returns a dict with the tokenizer metadata of a GGUF file (cached: reading a 150k
    vocabulary with GGUFReader takes seconds; callers must not modify it)."""
    r = gguf.GGUFReader(path)
    f = r.fields

    def get(key, default=None):
        return f[key].contents() if key in f else default

    tokens = get("tokenizer.ggml.tokens")
    return {
        "model": get("tokenizer.ggml.model"),
        "pre": get("tokenizer.ggml.pre"),
        "tokens": tokens,
        "types": get("tokenizer.ggml.token_type", [NORMAL] * len(tokens)),
        "scores": get("tokenizer.ggml.scores"),
        "merges": get("tokenizer.ggml.merges"),
        "chat_template": get("tokenizer.chat_template"),
        "bos": get("tokenizer.ggml.bos_token_id"),
        "eos": get("tokenizer.ggml.eos_token_id"),
    }


def _added_tokens(v, types_to_add):
    out = []
    for i, (t, ty) in enumerate(zip(v["tokens"], v["types"])):
        if ty in types_to_add and t:
            out.append((i, AddedToken(t, special=(ty != USER_DEFINED), normalized=False)))
    return out


def build(v, nfc=True):
    """A tokenizers.Tokenizer equivalent to the GGUF vocabulary `v` (from read_vocab).

    nfc=False leaves out Qwen2's NFC normaliser, which Tripod (like llama.cpp) does not apply.
    """
    tokens, types = v["tokens"], v["types"]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    if v["model"] == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
        pre = v["pre"]
        tk = Tokenizer(models.BPE(vocab, merges, ignore_merges=(pre == "llama-bpe"),
                                  fuse_unk=False, byte_fallback=False))
        if pre in ("smollm", "starcoder", "refact"):
            tk.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        elif pre == "gpt-2":
            tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        elif pre in ("llama-bpe", "qwen2"):
            pattern = LLAMA3_PATTERN if pre == "llama-bpe" else QWEN2_PATTERN
            tk.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
            if pre == "qwen2" and nfc:
                tk.normalizer = normalizers.NFC()  # Qwen2's tokenizer.json normalises to NFC
        else:
            raise ValueError(f"no reference configuration for pre-tokenizer {pre!r}")
        tk.decoder = decoders.ByteLevel()
        added = _added_tokens(v, (CONTROL, USER_DEFINED))
    elif v["model"] == "llama":
        # SentencePiece BPE as Hugging Face's converter turns it into a BPE model: merges from the
        # piece scores (highest first), byte fallback, and the normaliser that escapes spaces.
        scores = v["scores"]
        merges = []
        for piece_id, piece in enumerate(tokens):
            if types[piece_id] not in (NORMAL, USER_DEFINED):
                continue
            local = []
            for k in range(1, len(piece)):
                left, right = piece[:k], piece[k:]
                if left in vocab and right in vocab:
                    local.append((vocab[left], vocab[right], left, right))
            local.sort()
            merges.extend((scores[piece_id], piece_id, l, r) for _, _, l, r in local)
        merges.sort(key=lambda m: (-m[0], m[1]))
        unk = next((t for t, ty in zip(tokens, types) if ty == UNKNOWN), None)
        tk = Tokenizer(models.BPE(vocab, [(l, r) for _, _, l, r in merges], unk_token=unk,
                                  fuse_unk=True, byte_fallback=True))
        tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                              normalizers.Replace(" ", "\u2581")])
        tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                        decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        added = _added_tokens(v, (CONTROL, USER_DEFINED, UNKNOWN))
    else:
        raise ValueError(f"unsupported tokenizer model {v['model']!r}")
    tk.add_tokens([a for _, a in added])
    for i, a in added:
        got = tk.token_to_id(a.content)
        if got != i:
            raise RuntimeError(f"added token {a.content!r} got id {got}, want {i}")
    return tk
