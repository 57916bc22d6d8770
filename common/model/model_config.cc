// Reads ModelConfig from GGUF keys "<arch>.*"; see model_config.h.
#include "common/model/model_config.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

absl::StatusOr<Arch> ParseArch(const std::string& name) {
  if (name == "llama" || name == "mistral") return Arch::kLlama;
  if (name == "qwen2") return Arch::kQwen2;
  if (name == "qwen3") return Arch::kQwen3;
  // Refused before any weight is read, so a worker given such a file stops at start.
  return absl::UnimplementedError(
      absl::StrCat("unsupported architecture '", name,
                   "' (general.architecture): Tripod serves llama (and mistral), qwen2 and qwen3"));
}

ArchTraits TraitsOf(Arch arch) {
  ArchTraits t;
  switch (arch) {
    case Arch::kLlama:
      t.rope_style = RopeStyle::kAdjacent;
      break;
    case Arch::kQwen2:
      t.rope_style = RopeStyle::kHalves;
      t.qkv_bias = true;
      break;
    case Arch::kQwen3:
      t.rope_style = RopeStyle::kHalves;
      t.qk_norm = true;
      break;
  }
  return t;
}

absl::StatusOr<int> GetPositiveInt(const GgufFile& gguf, const std::string& key) {
  ASSIGN_OR_RETURN(int64_t v, gguf.GetInt(key));
  if (v <= 0 || v > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("gguf key ", key, " = ", v, " is out of range"));
  }
  return static_cast<int>(v);
}

}  // namespace

const char* ArchName(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "llama";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
  }
  return "?";
}

absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& gguf) {
  ModelConfig c;
  ASSIGN_OR_RETURN(c.arch_name, gguf.GetString("general.architecture"));
  ASSIGN_OR_RETURN(c.arch, ParseArch(c.arch_name));
  c.traits = TraitsOf(c.arch);
  const std::string p = c.arch_name + ".";
  ASSIGN_OR_RETURN(c.n_layers, GetPositiveInt(gguf, p + "block_count"));
  ASSIGN_OR_RETURN(c.d_model, GetPositiveInt(gguf, p + "embedding_length"));
  ASSIGN_OR_RETURN(c.d_ff, GetPositiveInt(gguf, p + "feed_forward_length"));
  ASSIGN_OR_RETURN(c.n_heads, GetPositiveInt(gguf, p + "attention.head_count"));
  c.n_kv_heads = c.n_heads;
  if (gguf.Find(p + "attention.head_count_kv") != nullptr) {
    ASSIGN_OR_RETURN(c.n_kv_heads, GetPositiveInt(gguf, p + "attention.head_count_kv"));
  }
  c.context_length = 4096;
  if (gguf.Find(p + "context_length") != nullptr) {
    ASSIGN_OR_RETURN(c.context_length, GetPositiveInt(gguf, p + "context_length"));
  }
  c.head_dim = c.d_model / c.n_heads;
  if (gguf.Find(p + "attention.key_length") != nullptr) {
    ASSIGN_OR_RETURN(c.head_dim, GetPositiveInt(gguf, p + "attention.key_length"));
  }
  c.rope_dims = c.head_dim;
  if (gguf.Find(p + "rope.dimension_count") != nullptr) {
    ASSIGN_OR_RETURN(c.rope_dims, GetPositiveInt(gguf, p + "rope.dimension_count"));
  }
  if (gguf.Find(p + "rope.freq_base") != nullptr) {
    ASSIGN_OR_RETURN(double theta, gguf.GetFloat(p + "rope.freq_base"));
    c.rope_theta = static_cast<float>(theta);
  }
  if (gguf.Find(p + "attention.layer_norm_rms_epsilon") != nullptr) {
    ASSIGN_OR_RETURN(double eps, gguf.GetFloat(p + "attention.layer_norm_rms_epsilon"));
    c.rms_eps = static_cast<float>(eps);
  }
  if (gguf.Find(p + "rope.scaling.type") != nullptr) {
    ASSIGN_OR_RETURN(std::string type, gguf.GetString(p + "rope.scaling.type"));
    if (type == "llama3") {
      c.rope_scaling.llama3 = true;
      if (gguf.Find(p + "rope.scaling.factor") != nullptr) {
        ASSIGN_OR_RETURN(double f, gguf.GetFloat(p + "rope.scaling.factor"));
        c.rope_scaling.factor = static_cast<float>(f);
      }
      if (gguf.Find(p + "rope.scaling.original_context_length") != nullptr) {
        ASSIGN_OR_RETURN(c.rope_scaling.original_context,
                         GetPositiveInt(gguf, p + "rope.scaling.original_context_length"));
      }
      if (gguf.Find(p + "rope.scaling.low_freq_factor") != nullptr) {
        ASSIGN_OR_RETURN(double lo, gguf.GetFloat(p + "rope.scaling.low_freq_factor"));
        c.rope_scaling.low_freq_factor = static_cast<float>(lo);
      }
      if (gguf.Find(p + "rope.scaling.high_freq_factor") != nullptr) {
        ASSIGN_OR_RETURN(double hi, gguf.GetFloat(p + "rope.scaling.high_freq_factor"));
        c.rope_scaling.high_freq_factor = static_cast<float>(hi);
      }
      const RopeScaling& s = c.rope_scaling;
      // RopeInvFreq divides by (high - low).
      if (!(s.factor > 0 && s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "llama3 rope scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0 (", p,
            "rope.scaling.*)"));
      }
    } else if (type == "linear") {
      // Linear (position interpolation): every frequency divided by the factor.
      ASSIGN_OR_RETURN(double f, gguf.GetFloat(p + "rope.scaling.factor"));
      if (!(f > 0)) return absl::InvalidArgumentError(p + "rope.scaling.factor must be > 0");
      c.rope_scaling.linear_factor = static_cast<float>(f);
    } else if (type != "none") {
      return absl::UnimplementedError(
          absl::StrCat("unsupported rope scaling type '", type, "' (", p, "rope.scaling.type)"));
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::string>* tokens,
                   gguf.GetStringArray("tokenizer.ggml.tokens"));
  c.vocab_size = static_cast<int>(tokens->size());
  if (gguf.Find(p + "vocab_size") != nullptr) {
    ASSIGN_OR_RETURN(c.vocab_size, GetPositiveInt(gguf, p + "vocab_size"));
  }

  if (c.n_heads % c.n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_count ", c.n_heads, " is not a multiple of head_count_kv ", c.n_kv_heads));
  }
  if (c.head_dim % 2 != 0 || c.rope_dims % 2 != 0 || c.rope_dims > c.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", c.head_dim, " / rope dims ", c.rope_dims, " are not usable"));
  }
  return c;
}

}  // namespace tripod
