"""Real text for the tokenizer comparison, from files a fresh machine gets from Debian and PyPI.

Sources (all installed by scripts/setup):
  - translated man pages (groff source, UTF-8) from the Debian packages manpages-ru (Russian),
    manpages-ja (Japanese), manpages-zh (Simplified and Traditional Chinese), manpages-el (Greek);
  - English prose: /usr/share/common-licenses (Debian's base-files);
  - code: Python sources of the test virtual environment (tokenizers, gguf, numpy from PyPI).
Files are taken in sorted order, so the corpus is the same on every run of one machine set-up.
"""

import glob
import gzip
import os
import sys

MAN_LANGS = [  # (directory under /usr/share/man, bytes to take)
    ("ru", 260_000), ("ja", 260_000), ("zh_CN", 150_000), ("zh_TW", 100_000), ("el", 60_000),
]
LICENSE_BYTES = 160_000
CODE_BYTES = 220_000
CHUNK_BYTES = 4_000  # chunks end at paragraph breaks near this size


def _chunks(text, size=CHUNK_BYTES):
    """Cuts text at blank lines (or line ends) into pieces of about `size` bytes."""
    out, start = [], 0
    while start < len(text):
        end = start + size // 3  # characters; most are 1-3 bytes
        if end >= len(text):
            out.append(text[start:])
            break
        cut = text.find("\n\n", end, end + size)
        if cut < 0:
            cut = text.find("\n", end, end + size)
        if cut < 0:
            cut = end
        out.append(text[start:cut + 1])
        start = cut + 1
    return [c for c in out if c]


def _take(paths, budget, reader):
    texts, total = [], 0
    for p in paths:
        if total >= budget:
            break
        try:
            t = reader(p)
        except (OSError, UnicodeDecodeError, EOFError):
            continue  # a page in another encoding: skip it
        if not t.strip():
            continue
        room = budget - total
        if len(t.encode("utf-8")) > room:  # a long file: keep whole lines up to the budget
            t = t.encode("utf-8")[:room].decode("utf-8", "ignore")
            t = t[:t.rfind("\n") + 1] or t
        texts.append(t)
        total += len(t.encode("utf-8"))
    return texts, total


def _read_gz(p):
    with gzip.open(p, "rb") as f:
        return f.read().decode("utf-8")


def _read(p):
    with open(p, "rb") as f:
        return f.read().decode("utf-8")


def collect(venv_site_packages):
    """Returns (list of (source, chunk) pairs, {source: bytes}). Raises if a source is missing."""
    chunks, sizes = [], {}
    for lang, budget in MAN_LANGS:
        paths = sorted(glob.glob(f"/usr/share/man/{lang}/man*/*.gz"))
        texts, total = _take(paths, budget, _read_gz)
        if total < budget // 4:
            raise RuntimeError(f"too little text in /usr/share/man/{lang} ({total} bytes): install "
                               "the manpages-* packages (scripts/setup)")
        sizes[f"man/{lang}"] = total
        for t in texts:
            chunks += [(f"man/{lang}", c) for c in _chunks(t)]
    texts, total = _take(sorted(glob.glob("/usr/share/common-licenses/*")), LICENSE_BYTES, _read)
    sizes["common-licenses"] = total
    for t in texts:
        chunks += [("common-licenses", c) for c in _chunks(t)]
    code = []
    for pkg in ("tokenizers", "gguf", "numpy"):
        code += sorted(glob.glob(os.path.join(venv_site_packages, pkg, "**", "*.py"),
                                 recursive=True))
    texts, total = _take(code, CODE_BYTES, _read)
    sizes["python-code"] = total
    for t in texts:
        chunks += [("python-code", c) for c in _chunks(t)]
    return chunks, sizes


# Hand-made edge cases on top of the real text: whitespace runs, digits, contractions, emoji,
# scripts the man pages lack, special-token look-alikes.
EDGE_CASES = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n \n ", "\t\t\n  x", "a  b   c    d",
    "   leading and trailing   ", "12345678901234567890", "3.14159 2,718 1e-9 0x1F 1_000_000",
    "I'm you're we've they'll he'd it's I'M YOU'RE 'S 'Ll", "don’t “quoted” — dash … ellipsis",
    "🦙🦙 llama 👨‍👩‍👧‍👦 family 🇩🇪 flag", "مرحبا بالعالم، هذا نص عربي.", "שלום עולם",
    "नमस्ते दुनिया", "สวัสดีชาวโลก", "안녕하세요 세계", "Ελληνικά κείμενα ΑΒΓ", "Ωмега ω",
    "ｆｕｌｌ ｗｉｄｔｈ １２３", "e\u0301 combining ñ", "\u00a0nbsp\u3000ideographic space",
    "<|im_start|>user\nHi<|im_end|>\n", "<|endoftext|><|endoftext|>", "<|im_start", "<<|im_end|>>",
    "<s> </s> <unk>", "x\u200by zero width", "tab\tsep\tvalues\n1\t2\t3\n",
    "def f(x):\n    return x ** 2  # comment\n\n\n\nclass A:\n\tpass\n",
    "    \n\n    indented\n        more", "ＡＢＣ①②③ⅣⅤ", "١٢٣ ٤٥٦ ०१२", "a" * 300,
    " " * 100 + "x", "\n" * 50, "€100 £50 ¥1000 ₹", "¿Qué? ¡Sí!", "ǅ ǈ ǋ titlecase",
]


if __name__ == "__main__":
    site = sys.argv[1]
    c, s = collect(site)
    print(len(c), "chunks", s, sum(s.values()), "bytes")
