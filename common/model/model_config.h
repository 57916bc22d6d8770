// Hyperparameters of a model, read from GGUF metadata and validated once; the architecture
// differences the forward pass needs, as data (ArchTraits), so that it never switches on names.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/gguf.h"

namespace tripod {

enum class Arch { kLlama, kQwen2, kQwen3 };

// How RoPE pairs the dimensions of a head.
//  kAdjacent: (x[2i], x[2i+1]), as llama.cpp's converter permutes Llama Q/K weights for.
//  kHalves:   (x[i], x[i + d/2]) (GPT-NeoX style), as Qwen2/Qwen3 GGUF files expect.
enum class RopeStyle { kAdjacent, kHalves };

struct ArchTraits {
  RopeStyle rope_style = RopeStyle::kAdjacent;
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen3: per-head RMSNorm of Q and K before RoPE
};

// Llama 3.1-style frequency scaling (when the file carries the keys rather than rope_freqs).
struct RopeScaling {
  bool llama3 = false;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
  float linear_factor = 1.0f;  // "linear" scaling: positions divided by this
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_name;  // general.architecture
  ArchTraits traits;
  int n_layers = 0;
  int d_model = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int d_ff = 0;
  int vocab_size = 0;
  int context_length = 0;
  int rope_dims = 0;  // dimensions of a head that RoPE rotates (the first rope_dims)
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  float rms_eps = 1e-5f;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
};

// Reads and validates the hyperparameters; an unsupported architecture or an inconsistent shape
// is an error naming the key.
absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& gguf);

const char* ArchName(Arch arch);

}  // namespace tripod
