// gguf_dump: a test tool over GgufFile. Prints a GGUF's header, metadata and tensor infos as JSON,
// and writes tensors dequantised to raw little-endian fp32 for comparison with other readers.
//   gguf_dump FILE                          JSON on stdout
//   gguf_dump FILE --tensor NAME --out PATH  one tensor, dequantised, to PATH
//   gguf_dump FILE --dump-all DIR            every tensor i to DIR/<i>.f32
//   gguf_dump FILE --time N                  parses N times, prints {"parse_ms_min": ...}
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/model/gguf.h"
#include "common/model/quant_types.h"
#include "nlohmann/json.hpp"

namespace tripod {
namespace {

const char* ValueTypeName(GgufValueType t) {
  static const char* kNames[] = {"UINT8",  "INT8",    "UINT16", "INT16",  "UINT32",
                                 "INT32",  "FLOAT32", "BOOL",   "STRING", "ARRAY",
                                 "UINT64", "INT64",   "FLOAT64"};
  return kNames[static_cast<int>(t)];
}

nlohmann::json ArrayToJson(const GgufValue& v) {
  nlohmann::json out = nlohmann::json::array();
  if (const auto* a = std::get_if<GgufScalars>(&v.v)) {
    for (uint64_t i = 0; i < a->size(); ++i) {
      if (a->elem == GgufValueType::kBool) {
        out.push_back(a->unsigned_at(i) != 0);
      } else if (a->is_float()) {
        out.push_back(a->float_at(i));
      } else if (a->is_signed()) {
        out.push_back(a->signed_at(i));
      } else {
        out.push_back(a->unsigned_at(i));
      }
    }
  } else if (const auto* str = std::get_if<std::vector<std::string>>(&v.v)) {
    for (const std::string& x : *str) out.push_back(x);
  } else if (const auto* arr = std::get_if<GgufArray>(&v.v)) {
    for (const GgufValue& x : *arr) out.push_back(ArrayToJson(x));
  }
  return out;
}

nlohmann::json ValueToJson(const GgufValue& v) {
  nlohmann::json j;
  j["type"] = ValueTypeName(v.type);
  if (v.type == GgufValueType::kArray) {
    j["elem_type"] = ValueTypeName(v.elem_type);
    j["value"] = ArrayToJson(v);
    return j;
  }
  std::visit(
      [&j](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, uint64_t> || std::is_same_v<T, int64_t> ||
                      std::is_same_v<T, double> || std::is_same_v<T, bool> ||
                      std::is_same_v<T, std::string>) {
          j["value"] = x;
        }
      },
      v.v);
  return j;
}

nlohmann::json FileToJson(const GgufFile& g) {
  nlohmann::json j;
  j["version"] = g.version();
  j["alignment"] = g.alignment();
  j["data_offset"] = g.data_offset();
  nlohmann::json md = nlohmann::json::object();
  for (const auto& [key, value] : g.metadata()) md[key] = ValueToJson(value);
  j["metadata"] = std::move(md);
  nlohmann::json ts = nlohmann::json::array();
  for (const GgufTensorInfo& t : g.tensors()) {
    ts.push_back({{"name", t.name},
                  {"type", std::string(TypeInfo(t.type).name)},
                  {"dims", t.dims},
                  {"offset", t.offset},
                  {"n_elements", t.n_elements},
                  {"n_bytes", t.n_bytes}});
  }
  j["tensors"] = std::move(ts);
  return j;
}

bool WriteTensor(const GgufTensorInfo& t, const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::fprintf(stderr, "gguf_dump: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  bool ok = true;
  if (t.n_elements > 0) {
    const int64_t cols = t.cols();
    const size_t row_bytes = *RowBytes(t.type, cols);  // checked by the parser
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < t.rows() && ok; ++r) {
      DequantizeRow(t.type, t.data + r * row_bytes, row.data(), cols);
      ok = std::fwrite(row.data(), sizeof(float), row.size(), f) == row.size();
    }
  }
  ok = std::fclose(f) == 0 && ok;
  if (!ok) std::fprintf(stderr, "gguf_dump: error writing %s\n", path.c_str());
  return ok;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: gguf_dump FILE [--tensor NAME --out PATH | --dump-all DIR | --time N]\n");
    return 2;
  }
  const std::string path = argv[1];
  auto g = GgufFile::Open(path);
  if (!g.ok()) {
    std::fprintf(stderr, "gguf_dump: %s\n", std::string(g.status().message()).c_str());
    return 1;
  }
  const std::string mode = argc > 2 ? argv[2] : "";
  if (mode.empty()) {
    const std::string s = FileToJson(**g).dump(-1, ' ', /*ensure_ascii=*/true,
                                               nlohmann::json::error_handler_t::replace);
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  if (mode == "--tensor" && argc == 6 && std::strcmp(argv[4], "--out") == 0) {
    const GgufTensorInfo* t = (*g)->FindTensor(argv[3]);
    if (t == nullptr) {
      std::fprintf(stderr, "gguf_dump: no tensor '%s' in %s\n", argv[3], path.c_str());
      return 1;
    }
    return WriteTensor(*t, argv[5]) ? 0 : 1;
  }
  if (mode == "--dump-all" && argc == 4) {
    const auto& ts = (*g)->tensors();
    for (size_t i = 0; i < ts.size(); ++i) {
      if (!WriteTensor(ts[i], std::string(argv[3]) + "/" + std::to_string(i) + ".f32")) return 1;
    }
    return 0;
  }
  if (mode == "--time" && argc == 4) {
    const int n = std::max(1, std::atoi(argv[3]));
    double best_ms = 1e30;
    for (int i = 0; i < n; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      auto again = GgufFile::Open(path);
      const auto t1 = std::chrono::steady_clock::now();
      if (!again.ok()) return 1;
      best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::printf("{\"parse_ms_min\": %.3f, \"runs\": %d}\n", best_ms, n);
    return 0;
  }
  std::fprintf(stderr, "gguf_dump: bad arguments\n");
  return 2;
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) { return tripod::Main(argc, argv); }
