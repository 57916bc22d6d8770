// Pre-tokenizers for byte-level BPE: the regex split that runs before the merges, one chain of
// PCRE2 patterns (UTF + UCP, JIT) per `tokenizer.ggml.pre` name. Internal to the tokenizer.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tripod {

// One compiled pattern. Split() keeps both the matches and the text between them, in order
// (the "isolated" behaviour of Hugging Face's Split), so the pieces always cover the input.
// Invalid UTF-8 never matches and so ends up in the gaps, byte for byte.
class RegexSplitter {
 public:
  static absl::StatusOr<std::unique_ptr<RegexSplitter>> Create(std::string_view pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the pieces of `text` to `out`; they view into `text`.
  void Split(std::string_view text, std::vector<std::string_view>* out) const;

 private:
  RegexSplitter() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A chain of splitters: each one splits every piece the one before made.
class Pretokenizer {
 public:
  // Names as in GGUF `tokenizer.ggml.pre`: "smollm" (also "starcoder", "refact"), "llama-bpe"
  // (also "llama3", "llama-v3"), "qwen2", "gpt-2". Anything else is an Unimplemented error.
  static absl::StatusOr<std::unique_ptr<Pretokenizer>> ForName(std::string_view name);
  // A chain of explicit patterns (tests, and models that name their own).
  static absl::StatusOr<std::unique_ptr<Pretokenizer>> FromPatterns(
      const std::vector<std::string>& patterns);
  // The patterns behind a name, for the reference tests; empty if the name is unknown.
  static std::vector<std::string> PatternsForName(std::string_view name);

  void Split(std::string_view text, std::vector<std::string_view>* out) const;

 private:
  std::vector<std::unique_ptr<RegexSplitter>> steps_;
};

}  // namespace tripod
