// What `--model` means, in one place for every program (tripod, the workers, the scheduler, the
// benchmarks): empty, the catalogue's default model (the bundled SmolLM2-135M-Instruct); a name of
// the model catalogue (common/model/model_catalogue.h), its file found in a models/ directory or
// in the cache scripts/fetch_model fills; anything else, a path to a GGUF file.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_catalogue.h"

namespace tripod {

// Where a named model's file is looked for, in order: each of models_dirs, then cache_dir.
struct ModelSearch {
  std::vector<std::string> models_dirs;
  std::string cache_dir;
};

// The directories that may be a Tripod checkout, in order: the working directory, the directories
// above the running binary (build/<preset>/, build/<preset>/bench/), the source tree the binary
// was built from. Where BundledModelPath and the fetch script are looked for.
std::vector<std::string> CheckoutDirs();

// $TRIPOD_MODELS_DIR if set, then <checkout>/models for each of CheckoutDirs(); the cache:
// ${XDG_CACHE_HOME:-$HOME/.cache}/tripod/models (an unset, empty or relative XDG_CACHE_HOME
// means the default, as the XDG specification says).
ModelSearch DefaultModelSearch();

// Resolves `name_or_path` to a file path against `catalogue` and `search`:
//  - empty: the catalogue's default model, found as a name is;
//  - a catalogue name (no '/', no .gguf ending): the first <dir>/<file> that exists; a file of
//    another size than the catalogue's is refused (a partial copy); none found is NotFound with
//    the command that fetches it (scripts/fetch_model NAME);
//  - a path (it has a '/' or ends in .gguf, or names an existing file): returned as given, for
//    the loader to open and report on;
//  - any other word: InvalidArgument naming the catalogue's models.
absl::StatusOr<std::string> ResolveModelIn(std::string_view name_or_path,
                                           const ModelCatalogue& catalogue,
                                           const ModelSearch& search);

// ResolveModelIn against the compiled-in catalogue and DefaultModelSearch().
absl::StatusOr<std::string> ResolveModel(std::string_view name_or_path);

// True when `name_or_path` is resolved as a catalogue name (or is empty: the default model).
bool IsCatalogueName(const ModelCatalogue& catalogue, std::string_view name_or_path);

// The fetch script of the first of CheckoutDirs() that has one (scripts/fetch_model); empty if
// none has.
std::string FetchModelScript();

}  // namespace tripod
