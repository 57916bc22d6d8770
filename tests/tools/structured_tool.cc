// Test driver for tests/reference/test_structured_*.py: the structured-output engine
// (common/structured) driven by JSON lines on stdin, one JSON answer per line on stdout, so that
// Python can compare it with `re` and `jsonschema`.
//   {"op": "match", "regex": R, "texts": [...]}    -> {"matches": [bool, ...], "states": n}
//   {"op": "schema", "schema": S}                  -> {"regex": R}
//   {"op": "sample", "regex": R, "n": N, "seed": s} -> {"samples": [...]}: random texts the
//       automaton accepts (random walks over its live bytes, steered to a match past 64 bytes)
// An error answers {"error": message, "code": "invalid" | "unsupported" | "too_large"}.
#include <deque>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/structured/byte_dfa.h"
#include "common/structured/json_schema_regex.h"
#include "nlohmann/json.hpp"

namespace {

using json = nlohmann::ordered_json;  // a schema keeps its key order
using tripod::structured::ByteDfa;

json Error(const absl::Status& s) {
  const char* code = absl::IsUnimplemented(s)       ? "unsupported"
                     : absl::IsResourceExhausted(s) ? "too_large"
                                                    : "invalid";
  return json{{"error", std::string(s.message())}, {"code", code}};
}

// Bytes to an accepting state, per state (BFS over reversed edges).
std::vector<int> DistanceToMatch(const ByteDfa& d) {
  const int n = d.num_states();
  std::vector<int> dist(n, 1 << 30);
  std::deque<int> q;
  for (int s = 0; s < n; ++s) {
    if (d.accepting[s]) {
      dist[s] = 0;
      q.push_back(s);
    }
  }
  // n is small in tests: a quadratic relaxation is fine.
  bool changed = true;
  while (changed) {
    changed = false;
    for (int s = 0; s < n; ++s) {
      for (int b = 0; b < 256; ++b) {
        const int t = d.Step(s, static_cast<uint8_t>(b));
        if (t >= 0 && dist[t] + 1 < dist[s]) {
          dist[s] = dist[t] + 1;
          changed = true;
        }
      }
    }
  }
  return dist;
}

json Sample(const ByteDfa& d, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<int> dist = DistanceToMatch(d);
  json out = json::array();
  for (int i = 0; i < count && d.start >= 0; ++i) {
    std::string text;
    int s = d.start;
    while (true) {
      if (d.accepting[s] && (text.size() > 64 || rng() % 4 == 0)) break;
      std::vector<int> bytes;
      for (int b = 0; b < 256; ++b) {
        const int t = d.Step(s, static_cast<uint8_t>(b));
        if (t < 0) continue;
        if (text.size() > 64 && dist[t] >= dist[s]) continue;  // steer to a match
        bytes.push_back(b);
      }
      if (bytes.empty()) break;
      const int b = bytes[rng() % bytes.size()];
      text += static_cast<char>(b);
      s = d.Step(s, static_cast<uint8_t>(b));
    }
    out.push_back(text);  // every path of the automaton is well-formed UTF-8
  }
  return out;
}

json Handle(const json& req) {
  const std::string op = req.at("op");
  if (op == "schema") {
    absl::StatusOr<std::string> r = tripod::structured::JsonSchemaToRegex(req.at("schema"));
    if (!r.ok()) return Error(r.status());
    return json{{"regex", *r}};
  }
  absl::StatusOr<ByteDfa> d = tripod::structured::CompileRegex(req.at("regex").get<std::string>());
  if (!d.ok()) return Error(d.status());
  if (op == "match") {
    json m = json::array();
    for (const json& t : req.at("texts")) m.push_back(d->FullMatch(t.get<std::string>()));
    return json{{"matches", m}, {"states", d->num_states()}};
  }
  if (op == "sample") {
    return json{{"samples", Sample(*d, req.value("n", 10), req.value("seed", 1))}};
  }
  return json{{"error", "unknown op"}, {"code", "invalid"}};
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::cout << Handle(json::parse(line)).dump() << std::endl;
  }
  return 0;
}
