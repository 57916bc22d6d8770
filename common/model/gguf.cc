// GGUF v2/v3 parser; see gguf.h. Every count read from the file is bounded by the bytes left
// before anything is allocated for it, so a hostile file cannot drive a large allocation.
#include "common/model/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read little-endian
constexpr int kMaxArrayDepth = 8;        // arrays of arrays nest at most this deep
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
// Smallest encodings, used to bound counts by the bytes left.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                  // key length, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name len, n_dims, 1 dim, type, off

absl::string_view ValueTypeName(uint32_t t) {
  static constexpr absl::string_view kNames[] = {"UINT8",  "INT8",    "UINT16", "INT16",  "UINT32",
                                                 "INT32",  "FLOAT32", "BOOL",   "STRING", "ARRAY",
                                                 "UINT64", "INT64",   "FLOAT64"};
  return t < std::size(kNames) ? kNames[t] : absl::string_view("?");
}

// Encoded size of a scalar value type; 0 for strings and arrays.
uint64_t ScalarSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

bool IsUnsigned(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 || t == GgufValueType::kUint32 ||
         t == GgufValueType::kUint64;
}
bool IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}
bool IsFloat(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

// A little-endian reader over the mapping. Errors name the byte offset; the caller adds what
// was being read.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  template <typename T>
  absl::Status Read(T* out, absl::string_view what) {
    if (left() < sizeof(T)) return Truncated(what, sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, absl::string_view what) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    RETURN_IF_ERROR(Read(&len, what));
    if (len > left()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " at byte ", at, ": string length ", len,
                                                     " exceeds the ", left(),
                                                     " bytes left in the file"));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

  absl::Status Truncated(absl::string_view what, uint64_t need) const {
    return absl::InvalidArgumentError(absl::StrCat("truncated file: ", what, " at byte ", pos_,
                                                   " needs ", need, " bytes, ", left(), " left"));
  }

  // Steps over bytes the caller has checked are there; returns where they start.
  const uint8_t* Skip(uint64_t bytes) {
    const uint8_t* p = data_ + pos_;
    pos_ += bytes;
    return p;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

absl::Status ReadValue(Cursor& c, GgufValueType type, int depth, absl::string_view what,
                       GgufValue* out);

// Elements reserved up front at most; beyond that vectors grow as elements actually parse.
constexpr uint64_t kReserveCap = 1 << 16;

absl::Status ElementError(const absl::Status& s, uint64_t i) {
  return absl::Status(s.code(), absl::StrCat(s.message(), " (array element ", i, ")"));
}

absl::StatusOr<GgufValueType> ReadType(Cursor& c, absl::string_view what) {
  const uint64_t at = c.pos();
  uint32_t t = 0;
  RETURN_IF_ERROR(c.Read(&t, what));
  if (t > static_cast<uint32_t>(GgufValueType::kFloat64)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " at byte ", at, ": unknown value type ", t));
  }
  return static_cast<GgufValueType>(t);
}

absl::Status ReadScalar(Cursor& c, GgufValueType type, absl::string_view what, GgufValue* out) {
  switch (type) {
#define TRIPOD_SCALAR(kType, T, U)     \
  case GgufValueType::kType: {         \
    T x{};                             \
    RETURN_IF_ERROR(c.Read(&x, what)); \
    out->v = static_cast<U>(x);        \
    return absl::OkStatus();           \
  }
    TRIPOD_SCALAR(kUint8, uint8_t, uint64_t)
    TRIPOD_SCALAR(kUint16, uint16_t, uint64_t)
    TRIPOD_SCALAR(kUint32, uint32_t, uint64_t)
    TRIPOD_SCALAR(kUint64, uint64_t, uint64_t)
    TRIPOD_SCALAR(kInt8, int8_t, int64_t)
    TRIPOD_SCALAR(kInt16, int16_t, int64_t)
    TRIPOD_SCALAR(kInt32, int32_t, int64_t)
    TRIPOD_SCALAR(kInt64, int64_t, int64_t)
    TRIPOD_SCALAR(kFloat32, float, double)
    TRIPOD_SCALAR(kFloat64, double, double)
#undef TRIPOD_SCALAR
    case GgufValueType::kBool: {
      const uint64_t at = c.pos();
      uint8_t x = 0;
      RETURN_IF_ERROR(c.Read(&x, what));
      if (x > 1) {
        return absl::InvalidArgumentError(absl::StrCat(what, " at byte ", at, ": bool value ",
                                                       static_cast<int>(x), " is neither 0 nor 1"));
      }
      out->v = x != 0;
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      std::string s;
      RETURN_IF_ERROR(c.ReadString(&s, what));
      out->v = std::move(s);
      return absl::OkStatus();
    }
    case GgufValueType::kArray:
      break;
  }
  return absl::InternalError("ReadScalar on an array");
}

absl::Status ReadArray(Cursor& c, int depth, absl::string_view what, GgufValue* out) {
  const uint64_t at = c.pos();
  if (depth >= kMaxArrayDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " at byte ", at, ": arrays nested deeper than ", kMaxArrayDepth, " levels"));
  }
  ASSIGN_OR_RETURN(out->elem_type, ReadType(c, what));
  uint64_t n = 0;
  RETURN_IF_ERROR(c.Read(&n, what));
  // Every element takes at least this many bytes, which bounds n before anything is allocated.
  const GgufValueType et = out->elem_type;
  const uint64_t min_elem = et == GgufValueType::kString  ? 8
                            : et == GgufValueType::kArray ? 12
                                                          : ScalarSize(et);
  if (n > c.left() / min_elem) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " at byte ", at, ": array of ", n, " ", ValueTypeName(static_cast<uint32_t>(et)),
        " elements needs at least ", min_elem, " bytes each, only ", c.left(), " bytes left"));
  }
  switch (et) {
    case GgufValueType::kUint8:
    case GgufValueType::kUint16:
    case GgufValueType::kUint32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt8:
    case GgufValueType::kInt16:
    case GgufValueType::kInt32:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64:
    case GgufValueType::kBool: {
      const uint64_t start = c.pos();
      GgufScalars v{c.Skip(n * ScalarSize(et)), n, et};
      if (et == GgufValueType::kBool) {
        for (uint64_t i = 0; i < n; ++i) {
          if (v.data[i] > 1) {
            return absl::InvalidArgumentError(absl::StrCat(what, " element ", i, " at byte ",
                                                           start + i, ": bool value ", v.data[i],
                                                           " is neither 0 nor 1"));
          }
        }
      }
      out->v = v;
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      // Grown as elements parse (not sized from n): a string costs more in memory than its
      // 8-byte minimum encoding.
      std::vector<std::string> v;
      v.reserve(std::min<uint64_t>(n, kReserveCap));
      for (uint64_t i = 0; i < n; ++i) {
        absl::Status s = c.ReadString(&v.emplace_back(), what);
        if (!s.ok()) return ElementError(s, i);
      }
      out->v = std::move(v);
      return absl::OkStatus();
    }
    case GgufValueType::kArray: {
      GgufArray v;
      v.reserve(std::min<uint64_t>(n, kReserveCap));
      for (uint64_t i = 0; i < n; ++i) {
        absl::Status s = ReadValue(c, GgufValueType::kArray, depth + 1, what, &v.emplace_back());
        if (!s.ok()) return ElementError(s, i);
      }
      out->v = std::move(v);
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unreachable");
}

absl::Status ReadValue(Cursor& c, GgufValueType type, int depth, absl::string_view what,
                       GgufValue* out) {
  out->type = type;
  if (type == GgufValueType::kArray) return ReadArray(c, depth, what, out);
  return ReadScalar(c, type, what, out);
}

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) absl::StrAppend(&s, i ? ", " : "", dims[i]);
  return s + "]";
}

absl::Status WrongType(const std::string& key, const GgufValue& v, absl::string_view want) {
  std::string have(ValueTypeName(static_cast<uint32_t>(v.type)));
  if (v.type == GgufValueType::kArray) {
    absl::StrAppend(&have, " of ", ValueTypeName(static_cast<uint32_t>(v.elem_type)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("gguf: metadata key '", key, "' is ", have, ", expected ", want));
}

}  // namespace

int64_t GgufTensorInfo::rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < dims.size(); ++i) r *= dims[i];
  return r;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MmapFile> file, MmapFile::Open(path));
  return Parse(std::move(file));
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(std::unique_ptr<MmapFile> file) {
  std::unique_ptr<GgufFile> g(new GgufFile());
  g->file_ = std::move(file);
  const std::string& path = g->file_->path();
  const uint64_t file_size = g->file_->size();
  auto fail = [&path](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("gguf: ", s.message(), " (", path, ")"));
  };
  auto invalid = [&fail](auto&&... parts) {
    return fail(absl::InvalidArgumentError(absl::StrCat(parts...)));
  };

  Cursor c(g->file_->data(), file_size);
  uint32_t magic = 0;
  if (absl::Status s = c.Read(&magic, "magic"); !s.ok()) return fail(s);
  if (magic != kMagic) {
    return invalid("not a GGUF file: magic is 0x", absl::Hex(magic, absl::kZeroPad8),
                   ", expected 0x", absl::Hex(kMagic, absl::kZeroPad8), " (\"GGUF\")");
  }
  if (absl::Status s = c.Read(&g->version_, "version"); !s.ok()) return fail(s);
  const uint32_t v = g->version_;
  if (v == 1) {
    return invalid("GGUF version 1 is not supported (only v2 and v3); re-convert the model");
  }
  if (v == 0x02000000u || v == 0x03000000u) {
    return invalid("big-endian GGUF files are not supported");
  }
  if (v != 2 && v != 3) return invalid("unsupported GGUF version ", v, " (only v2 and v3)");

  uint64_t n_tensors = 0, n_kv = 0;
  if (absl::Status s = c.Read(&n_tensors, "tensor count"); !s.ok()) return fail(s);
  if (absl::Status s = c.Read(&n_kv, "metadata count"); !s.ok()) return fail(s);
  if (n_kv > c.left() / kMinKvBytes) {
    return invalid("metadata count ", n_kv, " cannot fit in the ", c.left(),
                   " bytes left after the header");
  }
  if (n_tensors > c.left() / kMinTensorInfoBytes) {
    return invalid("tensor count ", n_tensors, " cannot fit in the ", c.left(),
                   " bytes left after the header");
  }

  // Metadata.
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = c.pos();
    std::string key;
    if (absl::Status s = c.ReadString(&key, absl::StrCat("metadata key (kv ", i, ")")); !s.ok()) {
      return fail(s);
    }
    const std::string what = absl::StrCat("metadata key '", key, "' (kv ", i, ")");
    auto type = ReadType(c, what);
    if (!type.ok()) return fail(type.status());
    GgufValue value;
    if (absl::Status s = ReadValue(c, *type, 0, what, &value); !s.ok()) return fail(s);
    if (!g->metadata_.emplace(std::move(key), std::move(value)).second) {
      return invalid(what, " at byte ", at, ": duplicate key");
    }
  }

  if (const GgufValue* a = g->Find("general.alignment")) {
    if (!IsUnsigned(a->type) && !IsSigned(a->type)) {
      return invalid("metadata key 'general.alignment' is ",
                     ValueTypeName(static_cast<uint32_t>(a->type)), ", expected an integer");
    }
    if (IsSigned(a->type) && std::get<int64_t>(a->v) <= 0) {
      return invalid("general.alignment ", std::get<int64_t>(a->v),
                     " is not a non-zero power of two");
    }
    const uint64_t align = IsSigned(a->type) ? static_cast<uint64_t>(std::get<int64_t>(a->v))
                                             : std::get<uint64_t>(a->v);
    if (align == 0 || (align & (align - 1)) != 0) {
      return invalid("general.alignment ", align, " is not a non-zero power of two");
    }
    g->alignment_ = align;
  }

  // Tensor infos, grown as they parse (see kReserveCap).
  g->tensors_.reserve(std::min<uint64_t>(n_tensors, kReserveCap));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo& t = g->tensors_.emplace_back();
    const uint64_t at = c.pos();
    if (absl::Status s = c.ReadString(&t.name, absl::StrCat("tensor name (tensor ", i, ")"));
        !s.ok()) {
      return fail(s);
    }
    const std::string what = absl::StrCat("tensor '", t.name, "' (index ", i, ")");
    uint32_t n_dims = 0;
    if (absl::Status s = c.Read(&n_dims, what); !s.ok()) return fail(s);
    if (n_dims == 0 || n_dims > kMaxDims) {
      return invalid(what, " at byte ", at, ": ", n_dims, " dimensions, expected 1 to ", kMaxDims);
    }
    t.dims.resize(n_dims);
    uint64_t product = 1;  // of the non-zero dims, so that rows() * cols() cannot overflow
    bool any_zero = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      if (absl::Status s = c.Read(&dim, what); !s.ok()) return fail(s);
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return invalid(what, ": dimension ", d, " is ", dim, ", larger than 2^63-1");
      }
      t.dims[d] = static_cast<int64_t>(dim);
      if (dim == 0) {
        any_zero = true;
      } else if (__builtin_mul_overflow(product, dim, &product) ||
                 product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return invalid(what, ": element count of dims ", DimsString(t.dims), " overflows");
      }
    }
    t.n_elements = any_zero ? 0 : product;
    uint32_t type_id = 0;
    if (absl::Status s = c.Read(&type_id, what); !s.ok()) return fail(s);
    auto info = LookupGgmlType(type_id);
    if (!info.ok()) return invalid(what, ": ", info.status().message());
    t.type = info->type;
    if (absl::Status s = c.Read(&t.offset, what); !s.ok()) return fail(s);
    if (t.dims[0] % info->block_elems != 0) {
      return invalid(what, ": row length ", t.dims[0], " is not a multiple of ",
                     absl::string_view(info->name.data(), info->name.size()), "'s block size ",
                     info->block_elems);
    }
    // F32 has 4 bytes per element, so n_elements < 2^63 does not bound the byte count.
    if (__builtin_mul_overflow(t.n_elements / info->block_elems,
                               static_cast<uint64_t>(info->block_bytes), &t.n_bytes)) {
      return invalid(what, ": byte size of dims ", DimsString(t.dims), " overflows");
    }
    if (t.offset % g->alignment_ != 0) {
      return invalid(what, ": data offset ", t.offset, " is not a multiple of the alignment ",
                     g->alignment_);
    }
    if (!g->tensor_index_.emplace(t.name, i).second) {
      return invalid(what, " at byte ", at, ": duplicate tensor name (first at index ",
                     g->tensor_index_[t.name], ")");
    }
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t end_of_infos = c.pos();
  const uint64_t pad = (g->alignment_ - end_of_infos % g->alignment_) % g->alignment_;
  if (__builtin_add_overflow(end_of_infos, pad, &g->data_offset_)) {
    return invalid("data section offset overflows with alignment ", g->alignment_);
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo& t = g->tensors_[i];
    uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(g->data_offset_, t.offset, &begin) ||
        __builtin_add_overflow(begin, t.n_bytes, &end) || end > file_size) {
      return invalid("tensor '", t.name, "' (index ", i, "): data [", t.offset, ", ", t.offset,
                     " + ", t.n_bytes, ") of the data section (at byte ", g->data_offset_,
                     ") lies beyond the end of the file (", file_size, " bytes)");
    }
    t.data = g->file_->data() + begin;
  }
  return g;
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::StatusOr<const GgufValue*> FindOr(const GgufFile& g, const std::string& key) {
  const GgufValue* v = g.Find(key);
  if (v == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("gguf: metadata key '", key, "' is missing from ", g.path()));
  }
  return v;
}

}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, FindOr(*this, key));
  if (v->type != GgufValueType::kString) return WrongType(key, *v, "STRING");
  return std::get<std::string>(v->v);
}

absl::StatusOr<int64_t> GgufFile::GetInt(const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, FindOr(*this, key));
  if (IsSigned(v->type)) return std::get<int64_t>(v->v);
  if (!IsUnsigned(v->type)) return WrongType(key, *v, "an integer");
  const uint64_t u = std::get<uint64_t>(v->v);
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf: metadata key '", key, "' value ", u, " does not fit in int64"));
  }
  return static_cast<int64_t>(u);
}

absl::StatusOr<double> GgufFile::GetFloat(const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, FindOr(*this, key));
  if (IsFloat(v->type)) return std::get<double>(v->v);
  if (IsSigned(v->type)) return static_cast<double>(std::get<int64_t>(v->v));
  if (IsUnsigned(v->type)) return static_cast<double>(std::get<uint64_t>(v->v));
  return WrongType(key, *v, "a number");
}

absl::StatusOr<bool> GgufFile::GetBool(const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, FindOr(*this, key));
  if (v->type != GgufValueType::kBool) return WrongType(key, *v, "BOOL");
  return std::get<bool>(v->v);
}

absl::StatusOr<const std::vector<std::string>*> GgufFile::GetStringArray(
    const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, FindOr(*this, key));
  if (v->type != GgufValueType::kArray || v->elem_type != GgufValueType::kString) {
    return WrongType(key, *v, "ARRAY of STRING");
  }
  return &std::get<std::vector<std::string>>(v->v);
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, FindOr(*this, key));
  const auto* a = std::get_if<GgufScalars>(&v->v);
  if (v->type != GgufValueType::kArray || a == nullptr || a->is_float() ||
      v->elem_type == GgufValueType::kBool) {
    return WrongType(key, *v, "ARRAY of integers");
  }
  std::vector<int64_t> out(a->size());
  for (uint64_t i = 0; i < a->size(); ++i) {
    if (a->is_signed()) {
      out[i] = a->signed_at(i);
      continue;
    }
    const uint64_t u = a->unsigned_at(i);
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat("gguf: metadata key '", key, "' element ", i,
                                                     " value ", u, " does not fit in int64"));
    }
    out[i] = static_cast<int64_t>(u);
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(const std::string& key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, FindOr(*this, key));
  const auto* a = std::get_if<GgufScalars>(&v->v);
  if (v->type != GgufValueType::kArray || a == nullptr || v->elem_type == GgufValueType::kBool) {
    return WrongType(key, *v, "ARRAY of numbers");
  }
  std::vector<double> out(a->size());
  for (uint64_t i = 0; i < a->size(); ++i) out[i] = a->float_at(i);
  return out;
}

bool GgufScalars::is_signed() const {
  return elem == GgufValueType::kInt8 || elem == GgufValueType::kInt16 ||
         elem == GgufValueType::kInt32 || elem == GgufValueType::kInt64;
}

bool GgufScalars::is_float() const {
  return elem == GgufValueType::kFloat32 || elem == GgufValueType::kFloat64;
}

namespace {
template <typename T>
T LoadAt(const uint8_t* data, uint64_t i) {
  T v;
  std::memcpy(&v, data + i * sizeof(T), sizeof(T));
  return v;
}
}  // namespace

uint64_t GgufScalars::unsigned_at(uint64_t i) const {
  switch (elem) {
    case GgufValueType::kUint8:
    case GgufValueType::kBool:
      return LoadAt<uint8_t>(data, i);
    case GgufValueType::kUint16:
      return LoadAt<uint16_t>(data, i);
    case GgufValueType::kUint32:
      return LoadAt<uint32_t>(data, i);
    case GgufValueType::kUint64:
      return LoadAt<uint64_t>(data, i);
    default:
      return static_cast<uint64_t>(signed_at(i));
  }
}

int64_t GgufScalars::signed_at(uint64_t i) const {
  switch (elem) {
    case GgufValueType::kInt8:
      return LoadAt<int8_t>(data, i);
    case GgufValueType::kInt16:
      return LoadAt<int16_t>(data, i);
    case GgufValueType::kInt32:
      return LoadAt<int32_t>(data, i);
    case GgufValueType::kInt64:
      return LoadAt<int64_t>(data, i);
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64:
      return static_cast<int64_t>(float_at(i));
    default:
      return static_cast<int64_t>(unsigned_at(i));
  }
}

double GgufScalars::float_at(uint64_t i) const {
  if (elem == GgufValueType::kFloat32) return LoadAt<float>(data, i);
  if (elem == GgufValueType::kFloat64) return LoadAt<double>(data, i);
  if (is_signed()) return static_cast<double>(signed_at(i));
  return static_cast<double>(unsigned_at(i));
}

}  // namespace tripod
