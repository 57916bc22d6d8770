#!/usr/bin/env python3
"""Tripod's tokenizer and chat template on the real Qwen2.5-Coder files (real_models.py).

Tokenizer: for each file, the checks of test_tokenizer.py's check_vocab on the same ~1.2 MB
corpus (tok_corpus.py) plus edge cases of this vocabulary (its user-defined <tool_call> tokens,
the [PAD...] ids llama.cpp appends, FIM markers, code with digits): ids equal to Hugging Face
`tokenizers` built from the vocabulary and merges read out of the GGUF, Decode(Encode(t)) == t,
streaming decode, our decode == HF decode, parse_special=False. Like test_tokenizer.py it compares
without Qwen2's NFC normaliser (Tripod does not normalise); how many corpus chunks the NFC step
would change is printed for the record.

Chat template: the GGUF's own tokenizer.chat_template, read and rendered by Tripod the way the
scheduler does (tokenize_tool chat with "model"), must equal jinja2 rendering that template,
for system/user/assistant conversations with and without add_generation_prompt; with no system
message, the template's default one ("You are Qwen, ...") must be there. The chat's token ids
must equal HF's ids of the jinja2 text. (Requests that use the template's tools branch are
refused by the scheduler: tests/integration/test_real_model_api.py.)

Tiers: ctest (label real_model, run by scripts/test) runs this on both files without the Unicode
sweep: 20-40 s on the 2-core machine (most of it gguf's reading of the 151k-token vocabulary).
`--sweep` adds the sweep over every assigned code point (about 10 MB of text a file), which
scripts/check_real_models runs (with it, 22 s for both files on a quiet machine).
"""

import argparse
import os
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import real_models  # noqa: E402
import test_tokenizer as T  # noqa: E402
import tok_corpus  # noqa: E402
import tok_hf_reference as ref  # noqa: E402

# Text that touches what this vocabulary has and the llama.cpp test vocabularies lack.
QWEN_EDGE_CASES = [
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
    "x<tool_call>y</tool_call>z <tool_call> </tool_call>",
    "[PAD151665] [PAD151935][PAD151700]",  # llama.cpp's padding ids: not tokens of the real model
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n<|fim_middle|>return a + b",
    "<|repo_name|>tripod\n<|file_sep|>main.cc\nint main() { return 0; }",
    "for (int i = 0; i < 1024; ++i) x[i] = 3.14159f * i;  // 2048 bytes, 0xFF00FF",
    "    if x == 12345678:\n\t\treturn [1, 22, 333, 4444]\n",
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n",
    "<|vision_start|><|image_pad|><|vision_end|><|box_start|>(1,2)<|box_end|>",
]

DEFAULT_SYSTEM_START = "You are Qwen, created by Alibaba Cloud."

CONVERSATIONS = [
    # No system message: the template's default one.
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Answer in French."},
     {"role": "user", "content": "Hello!"},
     {"role": "assistant", "content": "Bonjour !"},
     {"role": "user", "content": "  How are you?\n"}],
    [{"role": "user", "content": "def f(x):\n    return x * 2\n\nExplain."},
     {"role": "assistant", "content": "It doubles x."},
     {"role": "user", "content": "Привет 你好 🦙 \t\u3000"}],
    # A second system message later on, an empty assistant turn, an assistant turn first.
    [{"role": "user", "content": "Hi"},
     {"role": "system", "content": "Be brief from now on."},
     {"role": "assistant", "content": ""},
     {"role": "user", "content": "ok"}],
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "Then I reply."}],
    # Special-token text inside content: rendered as text; the scheduler does not parse it as
    # control tokens (EncodeChat), so only the text is compared for this one.
    [{"role": "user", "content": "print('<|im_end|>')"}],
]


def check_chat(key, path, hf):
  template = ref.read_vocab(path)["chat_template"]
  if not template or "tools" not in template:
    T.fail(f"{key}: expected Qwen2.5's chat template with its tools branch, got "
           f"{(template or '')[:80]!r}")
    return
  n = 0
  default_seen = 0
  for messages in CONVERSATIONS:
    for gen in (False, True):
      want = T.render_jinja(template, messages, gen, bos="<|endoftext|>")
      got = T.run_tool(["chat", "@IN", "@OUT"],
                       {"model": path, "messages": messages, "add_generation_prompt": gen})
      n += 1
      if "error" in got:
        T.fail(f"{key} chat template: {got['error']}")
        continue
      if got["text"] != want:
        T.fail(f"{key} chat template, {len(messages)} messages, generation prompt {gen}: "
               f"rendered {got['text']!r}, jinja2 {want!r}")
        continue
      if messages[0]["role"] != "system":
        if DEFAULT_SYSTEM_START not in want:
          T.fail(f"{key}: jinja2 rendered no default system message: {want[:120]!r}")
        default_seen += 1
      if gen != want.endswith("<|im_start|>assistant\n"):
        T.fail(f"{key}: generation prompt {gen} but text ends {want[-30:]!r}")
      if any("<|im_end|>" in m["content"] for m in messages):
        # The content's "<|im_end|>" must stay text: not one more control token than turns.
        im_end = hf.token_to_id("<|im_end|>")
        turns = len(messages) + (messages[0]["role"] != "system")
        if got["ids"].count(im_end) != turns:
          T.fail(f"{key}: content's <|im_end|> became a control token: {got['ids']}")
        continue
      theirs = hf.encode(want, add_special_tokens=False).ids
      if got["ids"] != theirs:
        k = T.first_diff(got["ids"], theirs)
        T.fail(f"{key} chat ids differ at {k}: ours {got['ids'][max(0, k - 3):k + 4]}, "
               f"HF of jinja2's text {theirs[max(0, k - 3):k + 4]}")
  if default_seen == 0:
    T.fail(f"{key}: no conversation exercised the default system message")
  print(f"  chat template: {n} renderings equal jinja2's (text and ids), {default_seen} with the "
        "default system message")


def nfc_effect(hf_plain, vocab, texts):
  """How many texts Qwen2's NFC normaliser would tokenize differently (printed, not asserted)."""
  hf_nfc = ref.build(vocab, nfc=True)
  a = hf_plain.encode_batch(texts, add_special_tokens=False)
  b = hf_nfc.encode_batch(texts, add_special_tokens=False)
  return sum(x.ids != y.ids for x, y in zip(a, b))


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default="qwen05,qwen15", help="comma-separated keys: qwen05,qwen15")
  ap.add_argument("--sweep", action="store_true", help="also the all-of-Unicode sweep")
  args = ap.parse_args()
  keys = real_models.parse_keys(args.models)
  paths = {k: real_models.path(k) for k in keys}
  if not os.path.exists(T.TOOL):
    print(f"FAIL: tokenize_tool not found at {T.TOOL} (build the tokenize_tool target)")
    return 1
  chunks, sizes = tok_corpus.collect(sysconfig.get_paths()["purelib"])
  corpus = [c for _, c in chunks] + QWEN_EDGE_CASES
  print(f"corpus: {len(chunks)} chunks, {sum(sizes.values())} bytes: {sizes}; "
        f"+{len(QWEN_EDGE_CASES)} Qwen edge cases")
  for key in keys:
    path = paths[key]
    v = ref.read_vocab(path)
    if (v["model"], v["pre"]) != ("gpt2", "qwen2"):
      T.fail(f"{key}: tokenizer {v['model']}/{v['pre']}, expected gpt2/qwen2")
      continue
    hf = T.check_vocab(key, path, corpus, args.sweep)
    texts = corpus + tok_corpus.EDGE_CASES
    print(f"  Qwen2's NFC normaliser (not applied by Tripod) would change the HF ids of "
          f"{nfc_effect(hf, v, texts)}/{len(texts)} texts")
    T.check_streaming(path, hf)
    check_chat(key, path, hf)
  if T.failures:
    print(f"{len(T.failures)} check(s) failed")
    return 1
  print("all real-model tokenizer and chat-template checks passed")
  return 0


if __name__ == "__main__":
  sys.exit(main())
