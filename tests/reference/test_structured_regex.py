#!/usr/bin/env python3
"""The structured-output regex engine (common/structured: parser, Thompson NFA, byte DFA) against
Python's `re` (re.fullmatch with re.ASCII, the engine's \\d \\w \\s meaning), on a corpus:

  - listed patterns covering the supported syntax (classes, ranges, escapes, quantifiers, lazy
    forms, alternation, groups, anchors, UTF-8 literals and classes);
  - random patterns over a small alphabet generated from a grammar with a fixed seed;
  - for each pattern: every string over its alphabet up to a length, hand-written strings with
    non-ASCII characters, and random strings the engine's automaton accepts (which `re` must
    accept too).
Every expectation is computed here by `re` at test time. Patterns `re` refuses must be refused
(code "invalid"); patterns the engine refuses as unsupported must be in the documented list.
Exits non-zero on any mismatch.
"""

import itertools
import random
import re
import sys

from structured_tool import StructuredTool

LISTED = [
    r"abc", r"a|b|c", r"(ab|cd)*", r"a*b+c?", r"a{3}", r"a{2,4}", r"a{2,}", r"a{,2}",
    r"a{0}", r"(a|b){1,3}c", r"[abc]+", r"[^abc]*", r"[a-c]{2}", r"[a\-c]", r"[-ac]", r"[ac-]",
    r"[]a]", r"[^]a]", r"\d+", r"\D\d", r"\w+", r"\W", r"\s*x\s*", r"\S+", r"[\d\s]+",
    r"[^\w]", r".", r".*", r"a.c", r"\.", r"\\", r"\(a\)", r"\[\]", r"a\|b", r"\x41\x62",
    r"\u00e9", r"é+", r"[à-ÿ]+", r"[^é]", r"日本", r"[一-龥]{2}", r"😀|a", r"[😀-😂]",
    r"^abc$", r"^a|b$", r"(?:ab)+", r"(?P<name>a+)b", r"a*?b", r"a+?", r"a??b",
    r"a{2,3}?", r"(a*)*", r"(a|)+b", r"()", r"(|a)", r"a{", r"a{x}", r"a{1,x}", r"{", r"x{}",
    r"\n|\t", r"[\n\t ]+", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", r'"([^"\\]|\\.)*"',
    r"[A-Za-z_][A-Za-z0-9_]*", r"(true|false|null)", r"(a{2}){3}",
    r"[a-z]{1,3}@[a-z]{1,3}\.(com|org)", r"\x00|\x7f", r"[\x00-\x1f]", r"\$", r"a\$b",
]
# re refuses these: the engine must refuse them too (code "invalid").
INVALID = [r"(", r")", r"a)", r"(a", r"[", r"[a", r"*", r"+a", r"a**", r"a{3,2}", r"[z-a]",
           r"\q", r"a|*", r"(?", r"(?P<1>a)", r"\x4", r"[\d-z]", r"a{2}{3}"]
# The engine refuses these features (code "unsupported"), whether or not re accepts them.
UNSUPPORTED = [r"(a)\1", r"a(?=b)", r"a(?!b)", r"(?<=a)b", r"(?<!a)b", r"\bword\b", r"\Aa",
               r"a\Z", r"(?i)a", r"a*+", r"a^b", r"a$b", r"a{1001}", r"(?P=n)", r"(?#c)a",
               r"(?>a)", r"\N{DIGIT ONE}", r"\0"]

EXTRA_TEXTS = ["", "é", "éé", "日本", "😀", "a\n", "\n", "\t", " ", "_", "9", "-1.5", '"a\\"b"',
               "ab@cd.com", "x", "a.c", "\x00", "\x7f", "$", "a$b", "{", "a{", "ab", "aaa",
               "ÿ", "à", "一二", "😁", "abc", "A", "Ab", "(a)", "[]", "a|b", "\\"]


def gen_pattern(rng, depth=0):
    """A random pattern over the alphabet a, b, c."""
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice(["a", "b", "c", "[ab]", "[^a]", ".", "[a-b]", "\\w", "(?:)"])
    if r < 0.55:
        return "".join(gen_pattern(rng, depth + 1) for _ in range(rng.randint(2, 3)))
    if r < 0.7:
        return "(" + "|".join(gen_pattern(rng, depth + 1) for _ in range(rng.randint(2, 3))) + ")"
    inner = gen_pattern(rng, depth + 1)
    q = rng.choice(["*", "+", "?", "{2}", "{1,2}", "{0,3}", "{2,}", "*?", "+?"])
    return "(" + inner + ")" + q


def main():
    tool = StructuredTool()
    failures = 0
    checked = 0
    rng = random.Random(20261206)
    base = ["".join(t) for n in range(0, 6) for t in itertools.product("abc", repeat=n)]
    patterns = LISTED + [gen_pattern(rng) for _ in range(300)]
    for p in patterns:
        try:
            rx = re.compile(p, re.ASCII)
        except re.error as e:
            print(f"FAIL: corpus pattern {p!r} is not valid Python: {e}")
            failures += 1
            continue
        texts = list(dict.fromkeys(base + EXTRA_TEXTS))
        ans = tool.ask(op="sample", regex=p, n=20, seed=len(p))
        if "error" in ans:
            print(f"FAIL: {p!r} refused: {ans}")
            failures += 1
            continue
        texts += ans["samples"]
        got = tool.ask(op="match", regex=p, texts=texts)
        for t, m in zip(texts, got["matches"]):
            want = rx.fullmatch(t) is not None
            checked += 1
            if m != want:
                failures += 1
                if failures < 40:
                    print(f"FAIL: fullmatch({p!r}, {t!r}): engine {m}, re {want}")
    for p in INVALID:
        try:
            re.compile(p, re.ASCII)
            print(f"FAIL: {p!r} was expected to be invalid in Python")
            failures += 1
        except re.error:
            pass
        ans = tool.ask(op="match", regex=p, texts=[])
        if ans.get("code") != "invalid":
            print(f"FAIL: invalid pattern {p!r}: engine answered {ans}")
            failures += 1
    for p in UNSUPPORTED:
        ans = tool.ask(op="match", regex=p, texts=[])
        if ans.get("code") not in ("unsupported", "invalid") or "error" not in ans:
            print(f"FAIL: unsupported pattern {p!r}: engine answered {ans}")
            failures += 1
    # Bounds: a pattern whose automaton is too large is refused, quickly, not built.
    for p in [r"(a{1000}){1000}", r"[ab]*a[ab]{20}"]:
        ans = tool.ask(op="match", regex=p, texts=[])
        if ans.get("code") != "too_large":
            print(f"FAIL: {p!r} should be too large: {ans}")
            failures += 1
    tool.close()
    print(f"{len(patterns)} patterns, {checked} (pattern, text) pairs checked, "
          f"{len(INVALID)} invalid and {len(UNSUPPORTED)} unsupported patterns; "
          f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
