// GGUF v2/v3 reader over an mmap: metadata of every value type (nested arrays included),
// tensor infos, alignment and the data section. Every offset and size is checked; a malformed
// file gives a Status that says what is wrong and where. Model semantics live in model_config.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/quant_types.h"
#include "common/util/mmap_file.h"

namespace tripod {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

struct GgufValue;
using GgufArray = std::vector<GgufValue>;

// An array of numbers or bools as the file stores them: a view into the mapping (bounds checked
// at parse, bools checked to be 0 or 1), decoded on access. Held as a view so that a crafted
// file's large uint8 array costs nothing, not 8 bytes an element.
struct GgufScalars {
  const uint8_t* data = nullptr;
  uint64_t n = 0;
  GgufValueType elem = GgufValueType::kUint8;  // an integer, float or bool type

  uint64_t size() const { return n; }
  bool is_signed() const;
  bool is_float() const;
  // Element i as the widest type of its kind (unsigned and bools as uint64, signed as int64).
  uint64_t unsigned_at(uint64_t i) const;
  int64_t signed_at(uint64_t i) const;
  double float_at(uint64_t i) const;  // any element type, converted
};

// One metadata value. Arrays of strings (the vocabulary) are stored as vectors, arrays of numbers
// as views (GgufScalars), arrays of arrays as GgufArray.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType elem_type = GgufValueType::kUint8;  // for arrays
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<std::string>, GgufScalars,
               GgufArray>
      v;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the innermost (row length)
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping, bounds already checked

  int64_t rows() const;  // product of dims[1..]
  int64_t cols() const { return dims.empty() ? 0 : dims[0]; }
};

class GgufFile {
 public:
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a buffer the caller keeps alive (fuzzing, tests).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(std::unique_ptr<MmapFile> file);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::string& path() const { return file_->path(); }
  // Drops the process's pages of a tensor's bytes (they stay in the file; see
  // MmapFile::ReleasePages).
  void ReleasePages(const GgufTensorInfo& t) const { file_->ReleasePages(t.data, t.n_bytes); }

  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const GgufValue* Find(const std::string& key) const;
  // Typed getters: NotFound if absent, InvalidArgument if of another type. Integer getters accept
  // any integer type whose value fits.
  absl::StatusOr<std::string> GetString(const std::string& key) const;
  absl::StatusOr<int64_t> GetInt(const std::string& key) const;
  absl::StatusOr<double> GetFloat(const std::string& key) const;  // any float or integer type
  absl::StatusOr<bool> GetBool(const std::string& key) const;
  absl::StatusOr<const std::vector<std::string>*> GetStringArray(const std::string& key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(const std::string& key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(const std::string& name) const;

 private:
  GgufFile() = default;
  std::unique_ptr<MmapFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace tripod
