#!/usr/bin/env python3
"""Tripod's tokenizer and chat templates against independent references.

Tokenizer: ids must equal those of the Hugging Face `tokenizers` library (Rust) built from the
same GGUF vocabulary and merges (tok_hf_reference.py), on about 1.2 MB of real text:
  - translated man pages from Debian's manpages-ru, manpages-ja, manpages-zh, manpages-el
    (Russian, Japanese, Simplified/Traditional Chinese, Greek; groff source),
  - English prose from /usr/share/common-licenses,
  - Python code from the test venv (tokenizers, gguf, numpy packages),
plus hand-made edge cases (whitespace runs, digits, Arabic, Hebrew, Devanagari, Thai, emoji...).
Vocabularies: the bundled SmolLM2 model (byte-level BPE, pre "smollm"), and llama.cpp's test
vocabularies from the llama-cpp-python sdist (tok_vocabs.py): llama-spm (Llama 2 SentencePiece
BPE), llama-bpe (Llama 3), qwen2, gpt-2. For those, the ids llama.cpp recorded from each model's
own Hugging Face tokenizer (.inp/.out files) are checked too.
Also: Decode(Encode(t)) == t, streaming decode == whole decode, our Decode == HF decode, every
streamed piece is whole UTF-8, a sweep over every assigned Unicode code point (SmolLM2 and
Llama 3 pre-tokenizers), and chat templates against the GGUF Jinja templates rendered with
jinja2. Qwen2 is compared without its NFC normaliser (Tripod does not normalise; see
check_vocab). Exits non-zero on any mismatch.
"""

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import tok_corpus  # noqa: E402
import tok_hf_reference as ref  # noqa: E402
import tok_vocabs  # noqa: E402

SRC = os.environ.get("TRIPOD_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BIN = os.environ.get("TRIPOD_BIN", os.path.join(SRC, "build", "tok", "tripod"))
TOOL = os.path.join(os.path.dirname(BIN), "tests", "tokenize_tool")
MODEL = os.environ.get("TRIPOD_MODEL",
                       os.path.join(SRC, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, flush=True)


def run_tool(args, payload):
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(inp, "w", encoding="utf-8") as f:
            json.dump(payload, f)
        args = [a.replace("@IN", inp).replace("@OUT", out) for a in args]
        subprocess.run([TOOL] + args, check=True)
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def encode(gguf_path, texts, parse_special=True):
    return run_tool(["encode", gguf_path, "@IN", "@OUT"],
                    {"texts": texts, "parse_special": parse_special})


def decode(gguf_path, ids_lists):
    return run_tool(["decode", gguf_path, "@IN", "@OUT"], {"ids": ids_lists})


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare_ids(label, texts, ours, theirs, hf=None):
    bad = [i for i in range(len(texts)) if ours[i] != theirs[i]]
    if bad:
        i = bad[0]
        k = first_diff(ours[i], theirs[i])
        lo = max(0, k - 3)
        msg = (f"{label}: {len(bad)}/{len(texts)} chunks differ; first: chunk {i} "
               f"{texts[i][:120]!r}... at token {k}: ours {ours[i][lo:k + 4]} "
               f"reference {theirs[i][lo:k + 4]}")
        if hf is not None:
            msg += (f" (ours as text {[hf.id_to_token(t) for t in ours[i][lo:k + 4]]}, "
                    f"reference {[hf.id_to_token(t) for t in theirs[i][lo:k + 4]]})")
        fail(msg)
    return len(bad)


def unicode_sweep_texts():
    """Every assigned Unicode scalar value, in blocks of 256, between letters, digits and spaces.

    Code points unassigned in Python's Unicode tables (category Cn) are left out: the two regex
    engines carry different Unicode versions (PCRE2 10.42: 14.0; Hugging Face's knows digits of
    later scripts such as Kawi and Garay), and unassigned code points do not occur in text.
    """
    texts = []
    for base in range(0, 0x110000, 256):
        parts = []
        for cp in range(base, base + 256):
            if 0xD800 <= cp <= 0xDFFF or unicodedata.category(chr(cp)) == "Cn":
                continue
            c = chr(cp)
            parts.append(f"a{c}b {c}{c}1{c} '{c}\n")
        if parts:
            texts.append("".join(parts))
    return texts


def check_vocab(name, path, corpus_texts, sweep):
    print(f"== {name}: {path}", flush=True)
    v = ref.read_vocab(path)
    hf = ref.build(v, nfc=False)
    if v["pre"] == "qwen2":
        # Known gap: Qwen2's tokenizer.json normalises to NFC first; Tripod does not (nor does
        # llama.cpp). Real text is almost always NFC already; say how much of ours is not.
        not_nfc = sum(unicodedata.normalize("NFC", t) != t for t in corpus_texts)
        print(f"  {name}: compared without NFC; {not_nfc}/{len(corpus_texts)} corpus chunks are "
              "not NFC (where the real tokenizer could differ)")
    hf_vocab = hf.get_vocab()  # a fresh dict each call: slow for a 150k vocabulary
    bytes_complete = v["model"] == "gpt2" and all(
        c in hf_vocab for c in ref.pre_tokenizers.ByteLevel.alphabet())
    # 1. llama.cpp's recorded ids from the real Hugging Face tokenizer of the model.
    if os.path.exists(path + ".out"):
        cases = tok_vocabs.read_cases(path)
        texts = [t for t, _ in cases]
        got = encode(path, texts)["ids"]
        n = compare_ids(f"{name} llama.cpp test cases", texts, got, [e for _, e in cases], hf)
        print(f"  llama.cpp recorded cases: {len(cases) - n}/{len(cases)} identical")
    # 2. The corpus and the edge cases against HF tokenizers built from the same vocabulary.
    texts = corpus_texts + tok_corpus.EDGE_CASES
    res = encode(path, texts)
    theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    n = compare_ids(f"{name} corpus vs HF", texts, res["ids"], theirs, hf)
    nbytes = res["bytes"]
    print(f"  corpus: {len(texts) - n}/{len(texts)} chunks identical, {nbytes} bytes, "
          f"{sum(map(len, res['ids']))} tokens; encode {nbytes / res['encode_seconds'] / 1e6:.2f}"
          f" MB/s")
    # Round trip. SentencePiece puts a space in front of the text after every special token, so
    # there it must hold when special tokens are not parsed, and U+2581 in the text decodes as a
    # space; byte-level BPE is exact either way.
    rt = res if v["model"] == "gpt2" else encode(path, texts, parse_special=False)
    bad_rt = [i for i, ok in enumerate(rt["roundtrip_ok"])
              if not ok and (v["model"] == "gpt2" or "\u2581" not in texts[i])]
    if bad_rt:
        fail(f"{name}: Decode(Encode(t)) != t for {len(bad_rt)} chunks, first "
             f"{texts[bad_rt[0]][:80]!r}")
    print(f"  round trip: {len(texts) - len(bad_rt)}/{len(texts)}")
    bad_stream = [i for i, ok in enumerate(res["stream_ok"]) if not ok]
    if bad_stream:
        fail(f"{name}: streaming decode != Decode for {len(bad_stream)} chunks")
    # Our Decode == HF decode of the same ids.
    dec = decode(path, res["ids"])
    bad_dec = 0
    for i, ids in enumerate(res["ids"]):
        want = hf.decode(ids, skip_special_tokens=False).encode("utf-8")
        if bytes.fromhex(dec["hex"][i]) != want:
            bad_dec += 1
            if bad_dec == 1:
                fail(f"{name}: Decode differs from HF decode on chunk {i} {texts[i][:60]!r}: "
                     f"{bytes.fromhex(dec['hex'][i])[:80]!r} vs {want[:80]!r}")
    print(f"  decode == HF decode: {len(texts) - bad_dec}/{len(texts)}")
    # 3. parse_special=False: special tokens written in text are plain text (HF:
    # encode_special_tokens); user-defined tokens are still matched on both sides.
    hf.encode_special_tokens = True
    res = encode(path, tok_corpus.EDGE_CASES, parse_special=False)
    theirs = [e.ids for e in hf.encode_batch(tok_corpus.EDGE_CASES, add_special_tokens=False)]
    compare_ids(f"{name} parse_special=False", tok_corpus.EDGE_CASES, res["ids"], theirs, hf)
    hf.encode_special_tokens = False
    # 4. All of Unicode.
    if sweep:
        texts = unicode_sweep_texts()
        res = encode(path, texts)
        theirs = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
        n = compare_ids(f"{name} Unicode sweep", texts, res["ids"], theirs, hf)
        print(f"  Unicode sweep: {len(texts) - n}/{len(texts)} blocks of 256 code points identical")
        # Exact only where every byte has a token (SmolLM2 lacks some; HF drops those too) and
        # U+2581 is not SentencePiece's space.
        if bytes_complete and not all(res["roundtrip_ok"]):
            fail(f"{name}: Unicode sweep round trip failed")
    return hf


def check_streaming(path, hf):
    """Characters split over several tokens: every Push hands out whole UTF-8 only."""
    texts = ["🦙🦙 llama", "你好，世界！龘靐齉", "Привет, мир", "👨‍👩‍👧‍👦🇩🇪", "a😀b😀c", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]
    ids = encode(path, texts)["ids"]
    res = decode(path, ids)
    split_seen = 0
    for i, chunks in enumerate(res["stream_chunks_hex"]):
        pieces = [bytes.fromhex(h) for h in chunks]
        for p in pieces:
            try:
                p.decode("utf-8")
            except UnicodeDecodeError:
                fail(f"streamed piece {p!r} of {texts[i]!r} is not whole UTF-8")
        if b"".join(pieces).decode("utf-8") != texts[i]:
            fail(f"streamed text of {texts[i]!r} is {b''.join(pieces)!r}")
        # Count tokens whose own bytes are not whole UTF-8 (the case the decoder exists for).
        for t in ids[i]:
            try:
                hf.decode([t]).encode("utf-8").decode("utf-8")
                if "\ufffd" in hf.decode([t]):
                    split_seen += 1
            except UnicodeDecodeError:
                split_seen += 1
    if split_seen == 0:
        fail(f"{path}: no test string split a character across tokens; the check is vacuous")
    print(f"  streaming: {len(texts)} strings, {split_seen} tokens holding partial characters")


def render_jinja(template, messages, add_generation_prompt, bos="<|begin_of_text|>"):
    import jinja2.sandbox
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages,
                                            add_generation_prompt=add_generation_prompt,
                                            bos_token=bos, eos_token="</s>")


# Meta's Llama 3 Instruct template (tokenizer_config.json of Meta-Llama-3-8B-Instruct).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\n\n' }}{% endif %}")
# The no-tools branch of Qwen2.5 Instruct's template, with its escaped "\n" in string literals.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'system' and loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "  Why?\n"}],
    [{"role": "user", "content": "Привет 你好 🦙"}, {"role": "assistant", "content": ""}],
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "\tspaces \u3000"}],
]


def check_chat_templates(templates):
    n = 0
    for label, template in templates:
        for messages in CONVERSATIONS:
            for gen in (False, True):
                want = render_jinja(template, messages, gen)
                got = run_tool(["chat", "@IN", "@OUT"], {"template": template, "messages": messages,
                                                        "add_generation_prompt": gen})
                n += 1
                if "error" in got:
                    fail(f"chat template {label}: {got['error']}")
                elif got["text"] != want:
                    fail(f"chat template {label}: rendered {got['text']!r}, jinja2 {want!r}")
    got = run_tool(["chat", "@IN", "@OUT"], {"template": "{{ messages }} [INST]", "messages": []})
    if "unsupported" not in got.get("error", ""):
        fail(f"unknown chat template not rejected: {got}")
    print(f"chat templates: {n} renderings compared with jinja2, unknown template rejected")


def main():
    if not os.path.exists(TOOL):
        print(f"tokenize_tool not found at {TOOL} (build the tokenize_tool target)")
        return 1
    site = sysconfig.get_paths()["purelib"]
    chunks, sizes = tok_corpus.collect(site)
    corpus = [c for _, c in chunks]
    total = sum(sizes.values())
    print(f"corpus: {len(corpus)} chunks, {total} bytes: {sizes}")
    vocab_dir = tok_vocabs.ensure(os.path.join(SRC, "build", "tok_vocab"))
    vocabs = [("smollm2", MODEL, True)] + [
        # The Unicode sweep (about 10 MB per vocabulary) runs where the pre-tokenizers differ.
        (n, os.path.join(vocab_dir, f"ggml-vocab-{n}.gguf"), n == "llama-bpe")
        for n in ("llama-bpe", "qwen2", "llama-spm", "gpt-2")]
    hfs = {}
    for name, path, sweep in vocabs:
        hfs[name] = check_vocab(name, path, corpus, sweep)
    check_streaming(MODEL, hfs["smollm2"])
    check_streaming(vocabs[3][1], hfs["llama-spm"])
    templates = [("smollm2", ref.read_vocab(MODEL)["chat_template"]),
                 ("qwen2", ref.read_vocab(vocabs[2][1])["chat_template"]),
                 ("llama3", LLAMA3_TEMPLATE), ("qwen2.5", QWEN25_TEMPLATE)]
    check_chat_templates(templates)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all tokenizer checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
