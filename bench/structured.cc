// bench/structured: the costs of structured outputs (common/structured) on a model's vocabulary
// (default: Qwen2.5-Coder-0.5B's 151k tokens). JSON lines:
//   {"bench":"structured_trie"}: building the vocabulary's byte trie (once per decode worker);
//   {"bench":"structured_compile"} per case: JSON schema -> regex, regex -> DFA (all states),
//     their sum (what a new constraint costs before its first step), the DFA's size;
//   {"bench":"structured_steps"} per case: a valid output's tokens stepped through the
//     constraint as the decode engine does (mask, then advance): cold (each new DFA state walks
//     the trie once) and warm (masks cached), per step;
//   {"bench":"structured_sample"}: one Sampler::Sample over a vocabulary-wide row of random
//     logits, unmasked and masked (greedy and temperature 1): what the mask adds to a step.
// Medians over --repeats runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/model/gguf.h"
#include "common/model/model_resolver.h"
#include "common/model/sampler.h"
#include "common/model/tokenizer.h"
#include "common/structured/byte_dfa.h"
#include "common/structured/json_schema_regex.h"
#include "common/structured/token_constraint.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "qwen2.5-coder-0.5b-instruct",
          "a GGUF file or a model catalogue name (its tokenizer only is read)");
ABSL_FLAG(int, repeats, 5, "runs per figure (the median is reported)");

namespace tripod::structured {
namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Case {
  const char* name;
  const char* schema;  // JSON schema text, or null for a regex
  const char* regex;
  const char* text;  // a valid output
};

const Case kCases[] = {
    {"person_schema",
     R"({"type": "object", "properties": {
          "name": {"type": "string", "maxLength": 40},
          "age": {"type": "integer"},
          "email": {"type": "string", "pattern": "^[a-z0-9.]{1,20}@[a-z0-9]{1,20}\\.(com|org)$"},
          "member": {"type": "boolean"},
          "tags": {"type": "array", "items": {"type": "string", "enum": ["new", "vip", "staff"]},
                   "maxItems": 3},
          "address": {"type": "object", "properties": {
              "street": {"type": "string"}, "city": {"type": "string"},
              "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "city", "zip"], "additionalProperties": false},
          "score": {"anyOf": [{"type": "number"}, {"type": "null"}]}},
        "required": ["name", "age", "email", "member", "tags", "address", "score"],
        "additionalProperties": false})",
     nullptr,
     R"({"name": "Ada Lovelace", "age": 36, "email": "ada@math.org", "member": true, "tags": ["vip", "staff"], "address": {"street": "12 St James's Square", "city": "London", "zip": "12345"}, "score": 9.75})"},
    {"order_schema_defs",
     R"({"$defs": {"item": {"type": "object", "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "qty": {"type": "integer"}, "price": {"type": "number"}},
          "required": ["sku", "qty", "price"], "additionalProperties": false}},
        "type": "object", "properties": {
          "id": {"type": "integer"}, "status": {"enum": ["open", "paid", "shipped"]},
          "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1},
          "note": {"type": ["string", "null"]}},
        "required": ["id", "status", "items", "note"], "additionalProperties": false})",
     nullptr,
     R"({"id": 1042, "status": "paid", "items": [{"sku": "ABC-1234", "qty": 2, "price": 19.99}, {"sku": "XYZ-0001", "qty": 1, "price": 5}], "note": null})"},
    {"json_object", R"({"type": "object"})", nullptr,
     R"({"title": "A list", "items": [1, 2.5, true, null, "x"], "meta": {"a": {"b": "c"}}})"},
    {"regex_phone", nullptr, R"(\(\d{3}\) \d{3}-\d{4})", "(555) 123-4567"},
    {"choice", nullptr, nullptr, "neutral"},
};

int Run() {
  absl::StatusOr<std::string> path = ResolveModel(absl::GetFlag(FLAGS_model));
  if (!path.ok()) {
    std::fprintf(stderr, "%s\n", std::string(path.status().message()).c_str());
    return 1;
  }
  auto file = GgufFile::Open(*path);
  if (!file.ok()) return 1;
  auto tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) return 1;
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));

  std::vector<double> trie_ms;
  std::shared_ptr<const VocabularyTrie> trie;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    trie = BuildVocabularyTrie(**tok);
    trie_ms.push_back(Ms(t0, Clock::now()));
  }
  nlohmann::ordered_json line = {{"bench", "structured_trie"},
                                 {"vocab", trie->vocab_size},
                                 {"tokens_with_text", trie->tokens.size()},
                                 {"trie_nodes", trie->byte.size()},
                                 {"build_ms", Median(trie_ms)}};
  std::printf("%s\n", line.dump().c_str());

  for (const Case& c : kCases) {
    std::vector<double> schema_ms, dfa_ms;
    std::string regex;
    ByteDfa dfa;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = Clock::now();
      if (c.schema != nullptr) {
        absl::StatusOr<std::string> rx = JsonSchemaToRegex(nlohmann::ordered_json::parse(c.schema));
        if (!rx.ok()) {
          std::fprintf(stderr, "%s: %s\n", c.name, std::string(rx.status().message()).c_str());
          return 1;
        }
        regex = *rx;
      } else if (c.regex != nullptr) {
        regex = c.regex;
      } else {
        regex = ChoiceRegex({"positive", "negative", "neutral", "mixed", "unknown"});
      }
      const auto t1 = Clock::now();
      absl::StatusOr<ByteDfa> d = CompileRegex(regex);
      const auto t2 = Clock::now();
      if (!d.ok()) {
        std::fprintf(stderr, "%s: %s\n", c.name, std::string(d.status().message()).c_str());
        return 1;
      }
      dfa = *std::move(d);
      schema_ms.push_back(Ms(t0, t1));
      dfa_ms.push_back(Ms(t1, t2));
    }
    if (!dfa.FullMatch(c.text)) {
      std::fprintf(stderr, "%s: the sample output does not match\n", c.name);
      return 1;
    }
    line = {
        {"bench", "structured_compile"},     {"case", c.name},
        {"regex_bytes", regex.size()},       {"dfa_states", dfa.num_states()},
        {"byte_classes", dfa.num_classes},   {"schema_to_regex_ms", Median(schema_ms)},
        {"regex_to_dfa_ms", Median(dfa_ms)}, {"compile_ms", Median(schema_ms) + Median(dfa_ms)}};
    std::printf("%s\n", line.dump().c_str());

    // The output's tokens, stepped as the engine does: mask (cold: new states walk the trie),
    // then advance; then the same again with every mask cached.
    const std::vector<int32_t> ids = (*tok)->Encode(c.text, /*parse_special=*/false);
    std::vector<double> cold_total, cold_max, warm_step, walks;
    for (int r = 0; r < repeats; ++r) {
      auto tc = TokenConstraint::Compile(regex, trie);
      if (!tc.ok()) return 1;
      double total = 0, worst = 0;
      int32_t s = (*tc)->start();
      for (int32_t id : ids) {
        const auto t0 = Clock::now();
        const TokenMask& m = (*tc)->Mask(s);
        if (!m.Allows(id)) {
          std::fprintf(stderr, "%s: token %d not allowed\n", c.name, id);
          return 1;
        }
        s = (*tc)->Advance(s, id);
        const double ms = Ms(t0, Clock::now());
        total += ms;
        worst = std::max(worst, ms);
      }
      (*tc)->Mask(s);  // the end
      cold_total.push_back(total);
      cold_max.push_back(worst);
      const auto t0 = Clock::now();
      constexpr int kLaps = 200;
      for (int lap = 0; lap < kLaps; ++lap) {
        s = (*tc)->start();
        for (int32_t id : ids) {
          if (!(*tc)->Mask(s).Allows(id)) return 1;
          s = (*tc)->Advance(s, id);
        }
      }
      warm_step.push_back(Ms(t0, Clock::now()) * 1000.0 / (kLaps * ids.size()));
    }
    line = {{"bench", "structured_steps"},
            {"case", c.name},
            {"tokens", ids.size()},
            {"cold_total_ms", Median(cold_total)},
            {"cold_per_token_ms", Median(cold_total) / ids.size()},
            {"cold_worst_step_ms", Median(cold_max)},
            {"warm_per_token_us", Median(warm_step)}};
    std::printf("%s\n", line.dump().c_str());
  }

  // What applying a mask adds to one draw over a vocabulary-wide row.
  const int32_t n = trie->vocab_size;
  std::vector<float> logits(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (float& l : logits) l = normal(rng);
  auto tc = TokenConstraint::Compile(R"([^"\\]*")", trie);  // a JSON string's body: dense
  const std::vector<uint64_t>& dense = (*tc)->Mask((*tc)->start()).bits;
  auto digits = TokenConstraint::Compile("[0-9]+", trie);  // sparse
  const std::vector<uint64_t>& sparse = (*digits)->Mask((*digits)->start()).bits;
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_p = temperature > 0 ? 0.95f : 1.0f;
    Sampler sampler(p, n);
    auto time_us = [&](std::span<const uint64_t> mask) {
      std::vector<double> v;
      for (int r = 0; r < repeats; ++r) {
        const auto t0 = Clock::now();
        constexpr int kDraws = 100;
        for (int i = 0; i < kDraws; ++i) sampler.Sample(logits, {}, 0, {}, mask);
        v.push_back(Ms(t0, Clock::now()) * 1000.0 / kDraws);
      }
      return Median(v);
    };
    line = {{"bench", "structured_sample"},    {"vocab", n},
            {"temperature", temperature},      {"unmasked_us", time_us({})},
            {"dense_mask_us", time_us(dense)}, {"sparse_mask_us", time_us(sparse)}};
    std::printf("%s\n", line.dump().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace tripod::structured

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tripod::structured::Run();
}
