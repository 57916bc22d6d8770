// Which model a worker serves, as its Health answer reports it: the GGUF file's name, a SHA-256
// of the file's bytes before the tensor data (header, metadata and tensor infos: names, types,
// shapes, offsets) and the shape a KV transfer depends on. The digest tells two models apart
// without reading the weights (cheap at start-up, even for a large file); a scheduler pairs
// prefill and decode workers only when it agrees.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "tripod/v1/common.pb.h"

namespace tripod {

struct ModelIdentityInfo {
  std::string file_name;  // the path's last component
  std::string sha256;     // lowercase hex, 64 characters
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int context_length = 0;
};

// Opens and parses the file (a missing, truncated or malformed file is an error naming it) and
// digests bytes [0, data offset).
absl::StatusOr<ModelIdentityInfo> ComputeModelIdentity(const std::string& gguf_path);

void ToWire(const ModelIdentityInfo& info, tripod::v1::ModelIdentity* out);

}  // namespace tripod
