// PCRE2 pre-split patterns of the byte-level BPE tokenizers, and the isolated-split loop.
// The patterns are those of each model's Hugging Face tokenizer.json (onig syntax, which PCRE2
// reads the same way for these constructs).
#include "common/model/pretokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tripod {
namespace {

// GPT-2's pattern as Hugging Face's ByteLevel pre-tokenizer uses it (use_regex = true).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's Split pattern: case-insensitive contractions, digits in groups of up to three.
constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2's: Llama 3's with single digits.
constexpr char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Hugging Face's Digits(individual_digits = true): every numeric character on its own.
constexpr char kDigitsPattern[] = R"(\p{N})";

// A JIT stack for the rare subject that overflows the default one (very long runs).
constexpr size_t kJitStackStart = 64 * 1024;
constexpr size_t kJitStackMax = 16 * 1024 * 1024;

}  // namespace

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

RegexSplitter::~RegexSplitter() = default;

absl::StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(std::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // MATCH_INVALID_UTF: arbitrary bytes are legal subjects; invalid sequences simply never match.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: bad pre-tokenizer regex at offset ",
                                                   error_offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  // JIT is only a speed-up: without it (unsupported platform) the interpreter gives the same.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  std::unique_ptr<RegexSplitter> splitter(new RegexSplitter());
  splitter->impl_ = std::make_unique<Impl>();
  splitter->impl_->code = code;
  return splitter;
}

void RegexSplitter::Split(std::string_view text, std::vector<std::string_view>* out) const {
  if (text.empty()) return;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;      // where the next search starts
  size_t emitted = 0;  // end of the last piece handed out
  while (pos < text.size()) {
    int rc = pcre2_match(impl_->code, subject, text.size(), pos, 0, md, mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit_stack == nullptr) {
      jit_stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
      mctx = pcre2_match_context_create(nullptr);
      if (jit_stack != nullptr && mctx != nullptr) {
        pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
        continue;
      }
    }
    if (rc < 0) break;  // no match (or an engine error): the rest is one gap
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t start = ov[0], end = ov[1];
    if (end <= start) {
      // An empty match cannot happen with our patterns; step one byte so it cannot loop.
      pos = start + 1;
      continue;
    }
    if (start > emitted) out->push_back(text.substr(emitted, start - emitted));
    out->push_back(text.substr(start, end - start));
    emitted = pos = end;
  }
  if (emitted < text.size()) out->push_back(text.substr(emitted));
  pcre2_match_data_free(md);
  if (mctx != nullptr) pcre2_match_context_free(mctx);
  if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
}

std::vector<std::string> Pretokenizer::PatternsForName(std::string_view name) {
  if (name == "smollm" || name == "starcoder" || name == "refact") {
    return {kDigitsPattern, kGpt2Pattern};
  }
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") return {kLlama3Pattern};
  if (name == "qwen2") return {kQwen2Pattern};
  if (name == "gpt-2" || name == "gpt2") return {kGpt2Pattern};
  return {};
}

absl::StatusOr<std::unique_ptr<Pretokenizer>> Pretokenizer::ForName(std::string_view name) {
  std::vector<std::string> patterns = PatternsForName(name);
  if (patterns.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer: unsupported pre-tokenizer '", std::string(name),
        "' (tokenizer.ggml.pre); supported: smollm, starcoder, refact, llama-bpe, qwen2, gpt-2"));
  }
  return FromPatterns(patterns);
}

absl::StatusOr<std::unique_ptr<Pretokenizer>> Pretokenizer::FromPatterns(
    const std::vector<std::string>& patterns) {
  auto pre = std::make_unique<Pretokenizer>();
  for (const std::string& p : patterns) {
    auto splitter = RegexSplitter::Create(p);
    if (!splitter.ok()) return splitter.status();
    pre->steps_.push_back(*std::move(splitter));
  }
  return pre;
}

void Pretokenizer::Split(std::string_view text, std::vector<std::string_view>* out) const {
  if (steps_.size() <= 1) {
    if (steps_.empty()) {
      if (!text.empty()) out->push_back(text);
    } else {
      steps_[0]->Split(text, out);
    }
    return;
  }
  // Later steps re-split each piece of the earlier ones (Hugging Face's Sequence semantics).
  std::vector<std::string_view> pieces, next;
  steps_[0]->Split(text, &pieces);
  for (size_t s = 1; s < steps_.size(); ++s) {
    std::vector<std::string_view>* dst = s + 1 == steps_.size() ? out : &next;
    for (std::string_view piece : pieces) steps_[s]->Split(piece, dst);
    if (dst == &next) {
      pieces.swap(next);
      next.clear();
    }
  }
}

}  // namespace tripod
