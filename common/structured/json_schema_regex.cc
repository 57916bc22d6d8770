// JSON Schema -> regex; see json_schema_regex.h.
#include "common/structured/json_schema_regex.h"

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/structured/regex_parser.h"

namespace tripod::structured {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kWs[] = "[ ]?";
constexpr char kStringChar[] = R"(([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}))";
constexpr char kInteger[] = "-?(0|[1-9][0-9]{0,15})";
constexpr char kNumber[] = R"(-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?)";
constexpr char kBoolean[] = "(true|false)";
constexpr char kNull[] = "null";
constexpr size_t kMaxRegexBytes = 1 << 20;
constexpr int kMaxRefDepth = 32;

// Keywords that only annotate: ignored.
const std::set<std::string, std::less<>> kAnnotations = {
    "title",      "description", "default",   "examples", "$schema",     "$id",    "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", "strict", "name"};

// Keywords that constrain a value but are outside the subset: refused, never ignored.
const std::set<std::string, std::less<>> kUnsupported = {"minimum",
                                                         "maximum",
                                                         "exclusiveMinimum",
                                                         "exclusiveMaximum",
                                                         "multipleOf",
                                                         "format",
                                                         "uniqueItems",
                                                         "prefixItems",
                                                         "contains",
                                                         "minContains",
                                                         "maxContains",
                                                         "patternProperties",
                                                         "propertyNames",
                                                         "minProperties",
                                                         "maxProperties",
                                                         "dependentRequired",
                                                         "dependentSchemas",
                                                         "dependencies",
                                                         "not",
                                                         "if",
                                                         "then",
                                                         "else",
                                                         "unevaluatedItems",
                                                         "unevaluatedProperties",
                                                         "$dynamicRef",
                                                         "$recursiveRef",
                                                         "additionalItems",
                                                         "contentEncoding",
                                                         "contentMediaType"};

std::string StringLiteralRegex(std::string_view s) {
  return RegexEscape(Json(std::string(s)).dump());
}

std::string Group(absl::string_view r) { return absl::StrCat("(", r, ")"); }

// A JSON value (enum, const) as a literal, with the whitespace the rest of the output may hold.
std::string LiteralRegex(const Json& v) {
  if (v.is_object()) {
    std::string out = R"(\{)";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) absl::StrAppend(&out, ",", kWs);
      first = false;
      absl::StrAppend(&out, StringLiteralRegex(it.key()), ":", kWs, LiteralRegex(it.value()));
    }
    return out + R"(\})";
  }
  if (v.is_array()) {
    std::string out = R"(\[)";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) absl::StrAppend(&out, ",", kWs);
      absl::StrAppend(&out, LiteralRegex(v[i]));
    }
    return out + R"(\])";
  }
  return RegexEscape(v.dump());
}

std::string Alternatives(const std::vector<std::string>& parts) {
  if (parts.size() == 1) return parts[0];
  std::vector<std::string> grouped;
  for (const std::string& p : parts) grouped.push_back(Group(p));
  return Group(absl::StrJoin(grouped, "|"));
}

// {min,max} as a quantifier; max < 0: unbounded.
std::string Quantifier(int min, int max) {
  if (max < 0) return min == 0 ? "*" : min == 1 ? "+" : absl::StrCat("{", min, ",}");
  if (min == max) return absl::StrCat("{", min, "}");
  return absl::StrCat("{", min, ",", max, "}");
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& root) : root_(root) {}

  absl::StatusOr<std::string> Value(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return AnyValue(kMaxAnyDepth);
      return Unsupported(path, "the schema false (no value is valid)");
    }
    if (!s.is_object()) return Invalid(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (kUnsupported.contains(it.key())) {
        return Unsupported(path, absl::StrCat("the keyword '", it.key(), "'"));
      }
    }
    if (auto ref = s.find("$ref"); ref != s.end()) return Ref(*ref, path);
    if (auto c = s.find("const"); c != s.end()) return LiteralRegex(*c);
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) return Invalid(path, "'enum' must be a non-empty list");
      std::vector<std::string> parts;
      for (const Json& v : *e) parts.push_back(LiteralRegex(v));
      return Alternatives(parts);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto a = s.find(key); a != s.end()) {
        if (!a->is_array() || a->empty()) {
          return Invalid(path, absl::StrCat("'", key, "' must be a non-empty list"));
        }
        std::vector<std::string> parts;
        for (size_t i = 0; i < a->size(); ++i) {
          absl::StatusOr<std::string> r = Value((*a)[i], absl::StrCat(path, "/", key, "/", i));
          if (!r.ok()) return r;
          parts.push_back(*std::move(r));
        }
        return Alternatives(parts);
      }
    }
    if (auto a = s.find("allOf"); a != s.end()) {
      if (!a->is_array() || a->size() != 1) {
        return Unsupported(path, "'allOf' with other than one schema");
      }
      return Value((*a)[0], absl::StrCat(path, "/allOf/0"));
    }
    auto type = s.find("type");
    if (type == s.end()) {
      // The type the keywords imply, else any value.
      if (s.contains("properties") || s.contains("required") ||
          s.contains("additionalProperties")) {
        return Object(s, path);
      }
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
        return Array(s, path);
      }
      if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength")) {
        return String(s, path);
      }
      return AnyValue(kMaxAnyDepth);
    }
    if (type->is_array()) {
      if (type->empty()) return Invalid(path, "'type' must not be an empty list");
      std::vector<std::string> parts;
      for (const Json& t : *type) {
        if (!t.is_string()) return Invalid(path, "'type' must hold strings");
        absl::StatusOr<std::string> r = Typed(t.get<std::string>(), s, path);
        if (!r.ok()) return r;
        parts.push_back(*std::move(r));
      }
      return Alternatives(parts);
    }
    if (!type->is_string()) return Invalid(path, "'type' must be a string or a list of strings");
    return Typed(type->get<std::string>(), s, path);
  }

 private:
  absl::Status Unsupported(const std::string& path, absl::string_view what) const {
    return absl::UnimplementedError(
        absl::StrCat("unsupported JSON schema feature at ", path.empty() ? "/" : path, ": ", what));
  }
  absl::Status Invalid(const std::string& path, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON schema at ", path.empty() ? "/" : path, ": ", what));
  }

  absl::StatusOr<std::string> Typed(const std::string& type, const Json& s,
                                    const std::string& path) {
    if (type == "object") return Object(s, path);
    if (type == "array") return Array(s, path);
    if (type == "string") return String(s, path);
    if (type == "integer") return std::string(kInteger);
    if (type == "number") return std::string(kNumber);
    if (type == "boolean") return std::string(kBoolean);
    if (type == "null") return std::string(kNull);
    return Invalid(path, absl::StrCat("unknown type '", type, "'"));
  }

  absl::StatusOr<std::string> Ref(const Json& ref, const std::string& path) {
    if (!ref.is_string()) return Invalid(path, "'$ref' must be a string");
    const std::string target = ref.get<std::string>();
    std::string_view name;
    const Json* defs = nullptr;
    for (std::string_view prefix : {"#/$defs/", "#/definitions/"}) {
      if (std::string_view(target).starts_with(prefix)) {
        name = std::string_view(target).substr(prefix.size());
        auto d = root_.find(std::string(prefix.substr(2, prefix.size() - 3)));
        if (d != root_.end() && d->is_object()) defs = &*d;
      }
    }
    if (target == "#") return Unsupported(path, "a recursive '$ref' (\"#\")");
    if (name.empty() || name.find('/') != std::string_view::npos) {
      return Unsupported(path, absl::StrCat("the '$ref' \"", target,
                                            "\" (only #/$defs/NAME and #/definitions/NAME)"));
    }
    if (defs == nullptr || !defs->contains(std::string(name))) {
      return Invalid(path, absl::StrCat("'$ref' \"", target, "\" names no definition"));
    }
    if (std::find(refs_.begin(), refs_.end(), target) != refs_.end() ||
        refs_.size() >= kMaxRefDepth) {
      return Unsupported(path, absl::StrCat("a recursive '$ref' (\"", target, "\")"));
    }
    refs_.push_back(target);
    absl::StatusOr<std::string> r = Value((*defs)[std::string(name)], target.substr(1));
    refs_.pop_back();
    return r;
  }

  absl::StatusOr<int> Count(const Json& s, const char* key, const std::string& path, int dflt) {
    auto it = s.find(key);
    if (it == s.end()) return dflt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return Invalid(path, absl::StrCat("'", key, "' must be a whole number >= 0"));
    }
    if (it->get<int64_t>() > kMaxRepeat) {
      return Unsupported(path, absl::StrCat("'", key, "' over ", kMaxRepeat));
    }
    return static_cast<int>(it->get<int64_t>());
  }

  // {min, max} from a schema's pair of count keywords; max -1: unbounded.
  absl::StatusOr<std::pair<int, int>> Bounds(const Json& s, const char* min_key,
                                             const char* max_key, const std::string& path) {
    absl::StatusOr<int> min = Count(s, min_key, path, 0);
    if (!min.ok()) return min.status();
    absl::StatusOr<int> max = Count(s, max_key, path, -1);
    if (!max.ok()) return max.status();
    if (*max >= 0 && *min > *max) {
      return Invalid(path, absl::StrCat(min_key, " is greater than ", max_key));
    }
    return std::make_pair(*min, *max);
  }

  absl::StatusOr<std::string> String(const Json& s, const std::string& path) {
    absl::StatusOr<std::pair<int, int>> bounds = Bounds(s, "minLength", "maxLength", path);
    if (!bounds.ok()) return bounds.status();
    const auto [min, max] = *bounds;
    if (auto p = s.find("pattern"); p != s.end()) {
      if (s.contains("minLength") || s.contains("maxLength")) {
        return Unsupported(path, "'pattern' together with minLength or maxLength");
      }
      if (!p->is_string()) return Invalid(path, "'pattern' must be a string");
      std::string pattern = p->get<std::string>();
      bool start = false, end = false;
      if (!pattern.empty() && pattern.front() == '^') {
        start = true;
        pattern.erase(0, 1);
      }
      size_t slashes = 0;
      for (size_t i = pattern.size(); i-- > 1 && pattern[i - 1] == '\\';) ++slashes;
      if (!pattern.empty() && pattern.back() == '$' && slashes % 2 == 0) {
        end = true;
        pattern.pop_back();
      }
      if (absl::StatusOr<RegexNode> n = ParseRegex(pattern); !n.ok()) {
        return absl::Status(n.status().code(),
                            absl::StrCat("JSON schema at ", path.empty() ? "/" : path,
                                         ": 'pattern': ", n.status().message()));
      }
      const std::string any = absl::StrCat(kStringChar, "*");
      return absl::StrCat("\"", start ? "" : any, "(", pattern, ")", end ? "" : any, "\"");
    }
    return absl::StrCat("\"", kStringChar, Quantifier(min, max), "\"");
  }

  absl::StatusOr<std::string> Array(const Json& s, const std::string& path) {
    absl::StatusOr<std::pair<int, int>> bounds = Bounds(s, "minItems", "maxItems", path);
    if (!bounds.ok()) return bounds.status();
    const auto [min, max] = *bounds;
    std::string item;
    if (auto it = s.find("items"); it != s.end()) {
      absl::StatusOr<std::string> r = Value(*it, absl::StrCat(path, "/items"));
      if (!r.ok()) return r;
      item = *std::move(r);
    } else {
      item = AnyValue(kMaxAnyDepth - 1);
    }
    if (max == 0) return std::string(R"(\[\])");
    const std::string more = absl::StrCat("(,", kWs, Group(item), ")",
                                          Quantifier(std::max(min - 1, 0), max < 0 ? -1 : max - 1));
    const std::string items = absl::StrCat(Group(item), more);
    return absl::StrCat(R"(\[)", min > 0 ? items : absl::StrCat("(", items, ")?"), R"(\])");
  }

  absl::StatusOr<std::string> Object(const Json& s, const std::string& path) {
    auto props = s.find("properties");
    auto additional = s.find("additionalProperties");
    std::set<std::string, std::less<>> required;
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) return Invalid(path, "'required' must be a list of names");
      for (const Json& n : *r) {
        if (!n.is_string()) return Invalid(path, "'required' must be a list of names");
        required.insert(n.get<std::string>());
      }
    }
    if (props == s.end() || (props->is_object() && props->empty())) {
      if (!required.empty()) {
        return Unsupported(path, "'required' names a property 'properties' does not describe");
      }
      if (additional != s.end() && additional->is_boolean() && !additional->get<bool>()) {
        return std::string(R"(\{\})");
      }
      if (additional != s.end() && additional->is_object()) {
        absl::StatusOr<std::string> v =
            Value(*additional, absl::StrCat(path, "/additionalProperties"));
        if (!v.ok()) return v;
        return MapOf(*v);
      }
      return AnyObject(kMaxAnyDepth);
    }
    if (!props->is_object()) return Invalid(path, "'properties' must be an object");
    if (additional != s.end() && !additional->is_boolean()) {
      return Unsupported(path, "'additionalProperties' as a schema beside 'properties'");
    }
    struct Item {
      std::string regex;
      bool required;
    };
    std::vector<Item> items;
    for (auto it = props->begin(); it != props->end(); ++it) {
      absl::StatusOr<std::string> v =
          Value(it.value(), absl::StrCat(path, "/properties/", it.key()));
      if (!v.ok()) return v;
      items.push_back({absl::StrCat(StringLiteralRegex(it.key()), ":", kWs, Group(*v)),
                       required.contains(it.key())});
    }
    for (const std::string& r : required) {
      if (!props->contains(r)) {
        return Unsupported(
            path, absl::StrCat("'required' names '", r, "', which 'properties' does not describe"));
      }
    }
    // after[k][first]: items k.. where `first` says nothing came before (no comma yet). Optional
    // items may be skipped; the size stays quadratic in the number of optional properties.
    const size_t n = items.size();
    std::vector<std::string> rest_later(n + 1), rest_first(n + 1);
    const std::string sep = absl::StrCat(",", kWs);
    for (size_t k = n; k-- > 0;) {
      const Item& item = items[k];
      const std::string with_later = absl::StrCat(sep, item.regex, rest_later[k + 1]);
      const std::string with_first = absl::StrCat(item.regex, rest_later[k + 1]);
      if (item.required) {
        rest_later[k] = with_later;
        rest_first[k] = with_first;
      } else {
        rest_later[k] = absl::StrCat("(", sep, item.regex, ")?", rest_later[k + 1]);
        rest_first[k] = rest_first[k + 1].empty()
                            ? absl::StrCat("(", with_first, ")?")
                            : absl::StrCat("(", with_first, "|", rest_first[k + 1], ")");
      }
      if (rest_first[k].size() > kMaxRegexBytes) {
        return Unsupported(path, "an object this large (its pattern passes 1 MiB)");
      }
    }
    return absl::StrCat(R"(\{)", rest_first[0], R"(\})");
  }

  std::string MapOf(absl::string_view value) {
    const std::string kv = absl::StrCat("\"", kStringChar, "*\"", ":", kWs, Group(value));
    return absl::StrCat(R"(\{()", kv, "(,", kWs, kv, ")*)?", R"(\})");
  }

  std::string AnyObject(int depth) { return MapOf(AnyValue(depth - 1)); }

  // Any JSON value with objects and arrays nested at most `depth` levels.
  std::string AnyValue(int depth) {
    std::vector<std::string> parts = {absl::StrCat("\"", kStringChar, "*\""), kNumber, kBoolean,
                                      kNull};
    if (depth > 0) {
      const std::string inner = AnyValue(depth - 1);
      parts.push_back(MapOf(inner));
      parts.push_back(
          absl::StrCat(R"(\[()", Group(inner), "(,", kWs, Group(inner), ")*)?", R"(\])"));
    }
    return Alternatives(parts);
  }

  const Json& root_;
  std::vector<std::string> refs_;  // the $refs being expanded, outermost first
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToRegex(const nlohmann::ordered_json& schema) {
  SchemaCompiler c(schema);
  absl::StatusOr<std::string> r = c.Value(schema, "");
  if (r.ok() && r->size() > kMaxRegexBytes) {
    return absl::UnimplementedError(
        "unsupported JSON schema: its pattern passes 1 MiB (too many nested or optional parts)");
  }
  return r;
}

std::string JsonObjectRegex() {
  return *JsonSchemaToRegex(nlohmann::ordered_json{{"type", "object"}});
}

std::string ChoiceRegex(const std::vector<std::string>& choices) {
  std::vector<std::string> parts;
  for (const std::string& c : choices) parts.push_back(RegexEscape(c));
  if (parts.empty()) return "";
  return Alternatives(parts);
}

}  // namespace tripod::structured
