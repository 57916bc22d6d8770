#include "eval/longctx_tasks.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tripod {
namespace {

std::string Digits(std::mt19937_64& rng, int n) {
  std::string s(1, static_cast<char>('1' + rng() % 9));
  while (static_cast<int>(s.size()) < n) s += static_cast<char>('0' + rng() % 10);
  return s;
}

std::string Letters(std::mt19937_64& rng, int n) {
  std::string s;
  while (static_cast<int>(s.size()) < n) s += static_cast<char>('A' + rng() % 26);
  return s;
}

// `k` distinct corpus words.
std::vector<std::string> PickWords(std::mt19937_64& rng, const LongCtxCorpus& corpus, int k) {
  std::set<size_t> picked;
  const size_t n = corpus.words.size();
  while (picked.size() < std::min<size_t>(k, n)) picked.insert(rng() % n);
  std::vector<std::string> out;
  for (size_t i : picked) out.push_back(corpus.words[i]);
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

// What a task puts around its haystack.
struct Layout {
  std::string intro;                 // before the context
  std::vector<std::string> needles;  // inserted in order at `depths`
  std::vector<double> depths;        // ascending, in [0, 1]
  std::string question;              // after the context
  std::string answer_prefix;         // the assistant's first words
  std::vector<std::string> answers;
  bool recall = false;
  int max_tokens = 16;
};

// Needles at the sentence boundary at or after each depth of the haystack text.
std::string Insert(const std::string& haystack, const Layout& l) {
  std::string out;
  size_t from = 0;
  for (size_t i = 0; i < l.needles.size(); ++i) {
    size_t at = std::max(from, static_cast<size_t>(l.depths[i] * haystack.size()));
    while (at < haystack.size() &&
           !(haystack[at] == '\n' || (at > 0 && haystack[at - 1] == '.' && haystack[at] == ' '))) {
      ++at;
    }
    at = std::min(at, haystack.size());
    out.append(haystack, from, at - from);
    out += (at == 0 || haystack[at - 1] == '\n') ? "" : " ";
    out += l.needles[i];
    out += at < haystack.size() && haystack[at] == '\n' ? "" : " ";
    from = at;
    while (from < haystack.size() && haystack[from] == ' ') ++from;
  }
  out.append(haystack, from, std::string::npos);
  return out;
}

std::vector<int32_t> Render(const std::string& user, const std::string& answer_prefix,
                            const Tokenizer& tok, const ChatTemplate& chat) {
  const std::vector<ChatMessage> messages = {{"user", user}};
  std::vector<int32_t> ids =
      EncodeChat(tok, RenderChatSegments(chat, messages, /*add_generation_prompt=*/true), false);
  const std::vector<int32_t> prefix = tok.Encode(answer_prefix, /*parse_special=*/false);
  ids.insert(ids.end(), prefix.begin(), prefix.end());
  return ids;
}

Layout NeedleLayout(const std::string& task, std::mt19937_64& rng, const LongCtxCorpus& corpus) {
  Layout l;
  std::uniform_real_distribution<double> depth(0.05, 0.95);
  l.intro =
      "There is important information hidden inside a lot of irrelevant text. Find it and "
      "memorize it. I will quiz you about it.\n\n";
  if (task == "niah_single") {
    const std::string v = Digits(rng, 7);
    l.needles = {absl::StrCat("The pass key is ", v, ". Remember it. ", v, " is the pass key.")};
    l.question = "What is the pass key in the text above?";
    l.answer_prefix = "The pass key in the text above is";
    l.answers = {v};
    l.max_tokens = 12;
  } else if (task == "niah_multikey" || task == "niah_multivalue") {
    const bool multikey = task == "niah_multikey";
    const std::vector<std::string> keys = PickWords(rng, corpus, multikey ? 4 : 1);
    std::vector<std::string> values;
    for (int i = 0; i < 4; ++i) {
      values.push_back(Digits(rng, 7));
      l.needles.push_back(absl::StrCat("One of the special magic numbers for ",
                                       keys[multikey ? i : 0], " is: ", values.back(), "."));
    }
    if (multikey) {
      const int asked = static_cast<int>(rng() % 4);
      l.question = absl::StrCat("What is the special magic number for ", keys[asked],
                                " mentioned in the text above?");
      l.answer_prefix =
          absl::StrCat("The special magic number for ", keys[asked], " mentioned above is");
      l.answers = {values[asked]};
      l.max_tokens = 12;
    } else {
      l.question = absl::StrCat("What are all the special magic numbers for ", keys[0],
                                " mentioned in the text above?");
      l.answer_prefix =
          absl::StrCat("The special magic numbers for ", keys[0], " mentioned above are");
      l.answers = values;
      l.recall = true;
      l.max_tokens = 40;
    }
  } else {  // vt
    const std::string v = Digits(rng, 5);
    std::vector<std::string> vars;
    while (vars.size() < 4) {
      std::string name = Letters(rng, 5);
      if (std::find(vars.begin(), vars.end(), name) == vars.end()) vars.push_back(name);
    }
    l.needles.push_back(absl::StrCat("VAR ", vars[0], " = ", v, "."));
    for (size_t i = 1; i < vars.size(); ++i) {
      l.needles.push_back(absl::StrCat("VAR ", vars[i], " = VAR ", vars[i - 1], "."));
    }
    l.intro =
        "Memorize and track the chain of variable assignments hidden in the following text.\n\n";
    l.question =
        absl::StrCat("Find all variables that are assigned the value ", v, " in the text above.");
    l.answer_prefix = absl::StrCat(
        "According to the chain of variable assignments in the text above, 4 variables are "
        "assigned the value ",
        v, ", they are:");
    l.answers = vars;
    l.recall = true;
    l.max_tokens = 32;
  }
  for (size_t i = 0; i < l.needles.size(); ++i) l.depths.push_back(depth(rng));
  std::sort(l.depths.begin(), l.depths.end());
  return l;
}

// cwe: ten words `common` times each, the rest once, shuffled, numbered.
std::vector<int32_t> CommonWords(int uncommon, int common, const std::vector<std::string>& words,
                                 uint64_t order_seed, const Tokenizer& tok,
                                 const ChatTemplate& chat) {
  std::vector<std::string> items;
  for (int i = 0; i < 10; ++i) {
    for (int k = 0; k < common; ++k) items.push_back(words[i]);
  }
  for (int i = 0; i < uncommon && 10 + i < static_cast<int>(words.size()); ++i) {
    items.push_back(words[10 + i]);
  }
  std::mt19937_64 rng(order_seed);
  std::shuffle(items.begin(), items.end(), rng);
  std::string list;
  for (size_t i = 0; i < items.size(); ++i) absl::StrAppend(&list, i + 1, ". ", items[i], "\n");
  const std::string user = absl::StrCat(
      "Below is a numbered list of words. In these words, some appear more often than others. "
      "Memorize the ones that appear most often.\n",
      list, "Question: What are the 10 most common words in the above list?");
  return Render(user, "The top 10 words that appear most often in the list are:", tok, chat);
}

}  // namespace

const std::vector<std::string>& LongCtxTaskNames() {
  static const std::vector<std::string> names = {"niah_single", "niah_multikey", "niah_multivalue",
                                                 "vt", "cwe"};
  return names;
}

LongCtxCorpus MakeLongCtxCorpus(const std::string& text, const Tokenizer& tokenizer) {
  LongCtxCorpus c;
  c.ids = tokenizer.Encode(text, /*parse_special=*/false);
  std::set<std::string> seen;
  std::string w;
  auto flush = [&] {
    if (w.size() >= 4 && w.size() <= 10 && seen.insert(w).second) c.words.push_back(w);
    w.clear();
  };
  for (char ch : text) {
    if (absl::ascii_isalpha(static_cast<unsigned char>(ch))) {
      w += absl::ascii_tolower(static_cast<unsigned char>(ch));
    } else {
      flush();
    }
  }
  flush();
  return c;
}

absl::StatusOr<LongCtxSample> MakeLongCtxSample(const std::string& task, int target_tokens,
                                                int index, uint64_t seed,
                                                const LongCtxCorpus& corpus,
                                                const Tokenizer& tokenizer,
                                                const ChatTemplate& chat) {
  const auto& names = LongCtxTaskNames();
  if (std::find(names.begin(), names.end(), task) == names.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval-longctx: unknown task '", task, "' (", absl::StrJoin(names, ", "), ")"));
  }
  if (target_tokens < 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval-longctx: length ", target_tokens, " is below 256 tokens"));
  }
  std::mt19937_64 rng(
      std::hash<std::string>{}(absl::StrCat(task, "/", target_tokens, "/", index, "/", seed)));
  LongCtxSample s;
  s.task = task;
  s.target_tokens = target_tokens;
  // Build at a size, measure the tokens, scale the size; a few rounds land within 1%.
  std::function<std::vector<int32_t>(int)> build;
  int size;
  if (task == "cwe") {
    if (corpus.words.size() < 200) return absl::FailedPreconditionError("corpus too small");
    const std::vector<std::string> words =
        PickWords(rng, corpus, std::min<int>(static_cast<int>(corpus.words.size()), 4000));
    const int common = std::max(4, target_tokens / 160);
    const uint64_t order_seed = rng();
    build = [=, &tokenizer, &chat](int uncommon) {
      return CommonWords(uncommon, common, words, order_seed, tokenizer, chat);
    };
    s.answers.assign(words.begin(), words.begin() + 10);
    s.recall = true;
    s.max_tokens = 64;
    size = target_tokens / 4;
  } else {
    const Layout l = NeedleLayout(task, rng, corpus);
    const size_t span = corpus.ids.size();
    const size_t offset = rng() % (span / 2);
    build = [=, &tokenizer, &chat, &corpus](int haystack_tokens) {
      const size_t n = std::min<size_t>(haystack_tokens, span - offset);
      const std::string hay =
          tokenizer.Decode(std::span<const int32_t>(corpus.ids.data() + offset, n));
      const std::string user = absl::StrCat(l.intro, Insert(hay, l), "\n\n", l.question);
      return Render(user, l.answer_prefix, tokenizer, chat);
    };
    s.answers = l.answers;
    s.recall = l.recall;
    s.max_tokens = l.max_tokens;
    size = target_tokens;
  }
  const int tolerance = std::max(2, target_tokens / 100);
  for (int round = 0; round < 8; ++round) {
    s.prompt = build(size);
    const int got = static_cast<int>(s.prompt.size());
    if (std::abs(got - target_tokens) <= tolerance) return s;
    const double scale = static_cast<double>(size) / std::max(1, got - 64);
    size = std::max(1, size + static_cast<int>(std::lround((target_tokens - got) * scale)));
  }
  return absl::InternalError(absl::StrCat("eval-longctx: ", task, " at ", target_tokens,
                                          " tokens: could not reach the length (got ",
                                          s.prompt.size(), ")"));
}

double ScoreLongCtxOutput(const LongCtxSample& sample, const std::string& output) {
  const std::string out = absl::AsciiStrToLower(output);
  int found = 0;
  for (const std::string& a : sample.answers) {
    if (absl::StrContains(out, absl::AsciiStrToLower(a))) ++found;
  }
  if (sample.recall) {
    return sample.answers.empty() ? 0.0 : static_cast<double>(found) / sample.answers.size();
  }
  return !sample.answers.empty() && absl::StrContains(out, absl::AsciiStrToLower(sample.answers[0]))
             ? 1.0
             : 0.0;
}

}  // namespace tripod
