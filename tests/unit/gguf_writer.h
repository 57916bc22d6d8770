// Writes GGUF files byte by byte for tests: every field can be set, to a bad value too (the
// corruption cases of gguf_test.cc), and small models' metadata can be made up (an architecture
// Tripod does not serve, a vocabulary of one's choosing).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/model/gguf.h"

namespace tripod::gguf_writer {

using VT = GgufValueType;

template <typename T>
std::string Le(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}
inline std::string Str(const std::string& s) { return Le<uint64_t>(s.size()) + s; }
inline std::string Arr(uint32_t elem, uint64_t n, const std::string& elems) {
  return Le<uint32_t>(elem) + Le<uint64_t>(n) + elems;
}
inline std::string Arr(VT elem, uint64_t n, const std::string& elems) {
  return Arr(static_cast<uint32_t>(elem), n, elems);
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  std::string data;
  std::optional<uint64_t> offset;  // default: the next aligned place in the data section
};

// Writes GGUF files byte by byte; every field can be set to a bad value for the corruption tests.
struct GgufWriter {
  uint32_t version = 3;
  uint64_t alignment = 32;  // layout only; general.alignment must be added as a KV to change it
  std::optional<uint64_t> tensor_count, kv_count;
  std::string kvs;
  uint64_t n_kv = 0;
  std::vector<TensorSpec> tensors;

  void Kv(const std::string& key, uint32_t type, const std::string& payload) {
    kvs += Str(key) + Le<uint32_t>(type) + payload;
    ++n_kv;
  }
  void Kv(const std::string& key, VT type, const std::string& payload) {
    Kv(key, static_cast<uint32_t>(type), payload);
  }

  std::string Build() const {
    std::string out = "GGUF" + Le(version) + Le<uint64_t>(tensor_count.value_or(tensors.size())) +
                      Le<uint64_t>(kv_count.value_or(n_kv)) + kvs;
    auto align = [this](uint64_t x) { return (x + alignment - 1) / alignment * alignment; };
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const TensorSpec& t : tensors) {
      const uint64_t off = t.offset.value_or(next);
      if (!t.offset) next = align(off + t.data.size());
      offsets.push_back(off);
      out += Str(t.name) + Le<uint32_t>(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) out += Le(d);
      out += Le(t.type) + Le(off);
    }
    const uint64_t data_start = align(out.size());
    out.resize(data_start, '\0');
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].offset) continue;
      const uint64_t at = data_start + offsets[i];
      if (out.size() < at + tensors[i].data.size()) out.resize(at + tensors[i].data.size(), '\0');
      std::memcpy(out.data() + at, tensors[i].data.data(), tensors[i].data.size());
    }
    return out;
  }
};

// The metadata ReadModelConfig needs (no tensors) for architecture `arch`, a 2-layer model with
// vocabulary `tokens`: enough to be refused or accepted before any weight is read.
inline std::string ModelMetadata(const std::string& arch, const std::vector<std::string>& tokens) {
  GgufWriter w;
  w.Kv("general.architecture", VT::kString, Str(arch));
  w.Kv(arch + ".block_count", VT::kUint32, Le<uint32_t>(2));
  w.Kv(arch + ".embedding_length", VT::kUint32, Le<uint32_t>(64));
  w.Kv(arch + ".feed_forward_length", VT::kUint32, Le<uint32_t>(128));
  w.Kv(arch + ".attention.head_count", VT::kUint32, Le<uint32_t>(4));
  std::string elems;
  for (const std::string& t : tokens) elems += Str(t);
  w.Kv("tokenizer.ggml.tokens", VT::kArray, Arr(VT::kString, tokens.size(), elems));
  return w.Build();
}

}  // namespace tripod::gguf_writer
