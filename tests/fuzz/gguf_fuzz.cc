// libFuzzer target for the GGUF reader: parses arbitrary bytes and, when they parse, checks the
// reader's guarantees (tensor data inside the buffer, sizes consistent) and dequantises row 0.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/model/gguf.h"
#include "common/model/quant_types.h"
#include "common/util/mmap_file.h"

namespace {

// A broken promise of the parser: crash so that libFuzzer records the input.
void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tripod;
  auto parsed = GgufFile::Parse(MmapFile::FromMemory(data, size, "fuzz.gguf"));
  if (!parsed.ok()) {
    Check(parsed.status().message().substr(0, 6) == "gguf: ");
    return 0;
  }
  const GgufFile& g = **parsed;
  Check(g.alignment() != 0 && (g.alignment() & (g.alignment() - 1)) == 0);
  for (const auto& [key, value] : g.metadata()) {
    // Every getter must answer (a value or a Status) for every key, whatever its type.
    (void)g.GetString(key);
    (void)g.GetInt(key);
    (void)g.GetFloat(key);
    (void)g.GetBool(key);
    (void)g.GetStringArray(key);
    (void)g.GetIntArray(key);
    (void)g.GetFloatArray(key);
  }
  std::vector<float> row;
  for (const GgufTensorInfo& t : g.tensors()) {
    Check(g.FindTensor(t.name) == &t);
    Check(t.data >= data && t.n_bytes <= size &&
          t.data - data <= static_cast<ptrdiff_t>(size - t.n_bytes));
    if (t.n_elements == 0) continue;
    Check(static_cast<uint64_t>(t.rows()) * static_cast<uint64_t>(t.cols()) == t.n_elements);
    auto row_bytes = RowBytes(t.type, t.cols());
    Check(row_bytes.ok() && *row_bytes * static_cast<uint64_t>(t.rows()) == t.n_bytes);
    row.resize(static_cast<size_t>(t.cols()));
    DequantizeRow(t.type, t.data, row.data(), t.cols());
    // Read the output so that the work is not optimised away.
    volatile float sink = 0;
    for (float x : row) sink = sink + x;
    (void)sink;
  }
  return 0;
}
