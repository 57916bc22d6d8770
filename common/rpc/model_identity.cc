// The model's identity: file name, header digest and KV shape; see model_identity.h.
#include "common/rpc/model_identity.h"

#include <openssl/evp.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/gguf.h"
#include "common/model/model_config.h"
#include "common/util/mmap_file.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

absl::StatusOr<std::string> Sha256Hex(std::span<const uint8_t> bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("SHA-256: EVP_Digest failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

}  // namespace

absl::StatusOr<ModelIdentityInfo> ComputeModelIdentity(const std::string& gguf_path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MmapFile> file, MmapFile::Open(gguf_path));
  // The parsed file owns the mapping from here on; `bytes` stays valid as long as `gguf` lives.
  const MmapFile* bytes = file.get();
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Parse(std::move(file)));
  absl::StatusOr<ModelConfig> config = ReadModelConfig(*gguf);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(gguf_path, ": ", config.status().message()));
  }

  // A file without tensors may end before the padding that would lead to the data section.
  const uint64_t end = std::min<uint64_t>(gguf->data_offset(), bytes->size());
  ASSIGN_OR_RETURN(std::span<const uint8_t> header, bytes->Range(0, end));

  ModelIdentityInfo info;
  info.file_name = std::filesystem::path(gguf_path).filename().string();
  ASSIGN_OR_RETURN(info.sha256, Sha256Hex(header));
  info.n_layers = config->n_layers;
  info.n_kv_heads = config->n_kv_heads;
  info.head_dim = config->head_dim;
  info.vocab_size = config->vocab_size;
  info.context_length = config->context_length;
  return info;
}

void ToWire(const ModelIdentityInfo& info, tripod::v1::ModelIdentity* out) {
  out->set_file_name(info.file_name);
  out->set_sha256(info.sha256);
  out->set_n_layers(info.n_layers);
  out->set_n_kv_heads(info.n_kv_heads);
  out->set_head_dim(info.head_dim);
  out->set_vocab_size(info.vocab_size);
  out->set_context_length(info.context_length);
}

}  // namespace tripod
