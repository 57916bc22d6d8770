// The models `tripod serve` runs: the target (--model) and, for the draft workers, the draft
// (--draft_model; by default the catalogue's draft of the target, else a self-draft), each a
// catalogue name or a path resolved by ResolveModel, and with --fetch a catalogue model that is
// missing fetched first by scripts/fetch_model (scripts/serve sets --fetch).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tripod {

struct ServeModels {
  std::string target;      // absolute path
  std::string draft;       // absolute path of a separate draft model; empty: a self-draft
  std::string draft_name;  // what picked it: a catalogue name or the user's --draft_model
};

// `with_draft`: draft workers will run (else no draft model is chosen or checked). A separate
// draft must share the target's vocabulary (refused here, before any worker starts); the
// self-draft flags (--draft_layers, --lookahead_layers) must then be left at their defaults.
absl::StatusOr<ServeModels> ChooseServeModels(const std::string& model_flag,
                                              const std::string& draft_flag, bool with_draft,
                                              bool fetch);

}  // namespace tripod
