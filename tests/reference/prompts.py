"""Test prompts for the reference tests, as token ids of real English text.

Texts are tokenized at test time with Hugging Face `tokenizers` built from the GGUF's own
vocabulary and merges (ref_tokenizer), never with the C++ tokenizer under test. Sources: a few
paragraphs written here, ChatML chat prompts, and the license texts every Debian system ships in
/usr/share/common-licenses (package base-files).
"""

import os

import ref_tokenizer

LICENSE_DIR = "/usr/share/common-licenses"

# Prose for the short prompts, so that they do not depend on files outside the repository.
LIGHTHOUSE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a can of "
    "oil and a rag. From the gallery at the top he could see the fishing boats returning to the "
    "harbour, their wakes drawing white lines across the grey water. When the lamp was lit, its "
    "beam swept over the rocks where, a century earlier, a merchant ship had broken apart in a "
    "winter storm. The keeper kept a logbook of the weather, the ships that passed, and the "
    "birds that rested on the railings during their long migrations south.")

BREAD = (
    "To bake a simple loaf of bread, mix 500 grams of flour with 10 grams of salt and 7 grams "
    "of dried yeast. Add 320 millilitres of warm water and stir until no dry flour remains. "
    "Knead the dough for ten minutes, until it is smooth and springs back when pressed, then "
    "leave it covered in a warm place for about an hour. Shape it, let it rise again, and bake "
    "it at 220 degrees Celsius for thirty to thirty-five minutes.")


def chat(user, system=None):
  """A ChatML prompt ending where the assistant's answer begins."""
  text = ""
  if system is not None:
    text += f"<|im_start|>system\n{system}<|im_end|>\n"
  return text + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


FRANCE = chat("What is the capital of France?")


def read_license(name):
  path = os.path.join(LICENSE_DIR, name)
  with open(path, encoding="utf-8") as f:
    return f.read()


def _clip(ids, n):
  if len(ids) < n:
    raise ValueError(f"text has only {len(ids)} tokens, need {n}")
  return ids[:n]


def reference_prompts(model):
  """[(name, ids)]: six prompts of 16..512 tokens, for the logits comparison."""
  enc = lambda text: ref_tokenizer.encode(model, text)  # noqa: E731
  gpl3 = enc(read_license("GPL-3"))
  apache = enc(read_license("Apache-2.0"))
  prompts = [
      ("chat-france", enc(FRANCE)),
      ("lighthouse", enc(LIGHTHOUSE)),
      ("chat-bread", enc(chat("Summarise this recipe in one sentence.\n\n" + BREAD,
                              system="You are a helpful AI assistant named SmolLM, trained by "
                              "Hugging Face"))),
      ("apache-2.0[:200]", _clip(apache, 200)),
      ("gpl-3[1000:1333]", _clip(gpl3[1000:], 333)),
      ("gpl-3[:512]", _clip(gpl3, 512)),
  ]
  for name, ids in prompts:
    if not 16 <= len(ids) <= 512:
      raise ValueError(f"prompt {name} has {len(ids)} tokens, outside 16..512")
  return prompts


def chunking_prompts(model):
  """[(name, ids)]: two prompts whose greedy continuations run long."""
  enc = lambda text: ref_tokenizer.encode(model, text)  # noqa: E731
  return [
      ("lighthouse", enc(LIGHTHOUSE)),
      ("chat-story", enc(chat("Write a short story about a lighthouse keeper who finds a "
                              "message in a bottle."))),
  ]


CORPUS_FILES = ("GPL-3", "Apache-2.0", "MPL-2.0", "LGPL-2.1")


def corpus_ids(model, min_tokens):
  """Token ids of Debian's license texts (CORPUS_FILES, joined by blank lines), >= min_tokens."""
  text = "\n\n".join(read_license(name) for name in CORPUS_FILES)
  ids = ref_tokenizer.encode(model, text)
  if len(ids) < min_tokens:
    raise ValueError(f"corpus has {len(ids)} tokens, need {min_tokens}")
  return ids
