// Tests for common/model/gguf: files built in memory by a small writer (v2 and v3, every value
// type, nested arrays, every tensor type), a table of corruptions, and the bundled real model.
#include "common/model/gguf.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/gguf_writer.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

using ::testing::HasSubstr;
using VT = GgufValueType;
using gguf_writer::Arr;
using gguf_writer::GgufWriter;
using gguf_writer::Le;
using gguf_writer::Str;
using gguf_writer::TensorSpec;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

absl::StatusOr<std::unique_ptr<GgufFile>> ParseBytes(const std::string& bytes) {
  return GgufFile::Parse(MmapFile::FromMemory(bytes.data(), bytes.size(), "mem.gguf"));
}

// A small valid file, the base of the corruption cases.
GgufWriter BaseWriter() {
  GgufWriter w;
  w.Kv("general.architecture", VT::kString, Str("llama"));
  w.Kv("llama.block_count", VT::kUint32, Le<uint32_t>(2));
  w.Kv("tokenizer.ggml.tokens", VT::kArray, Arr(VT::kString, 3, Str("a") + Str("bc") + Str("")));
  w.tensors.push_back({"tok", {32, 2}, 8, RandomBytes(68, 1)});
  w.tensors.push_back({"norm", {8}, 0, RandomBytes(32, 2)});
  return w;
}

class GgufVersionTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufVersionTest, ParsesEveryValueType) {
  GgufWriter w;
  w.version = GetParam();
  w.Kv("u8", VT::kUint8, Le<uint8_t>(200));
  w.Kv("i8", VT::kInt8, Le<int8_t>(-5));
  w.Kv("u16", VT::kUint16, Le<uint16_t>(60000));
  w.Kv("i16", VT::kInt16, Le<int16_t>(-300));
  w.Kv("u32", VT::kUint32, Le<uint32_t>(4000000000u));
  w.Kv("i32", VT::kInt32, Le<int32_t>(-2000000000));
  w.Kv("f32", VT::kFloat32, Le<float>(1.1f));
  w.Kv("bool", VT::kBool, Le<uint8_t>(1));
  w.Kv("str", VT::kString, Str("h\xc3\xa9llo"));
  w.Kv("u64", VT::kUint64, Le<uint64_t>((1ull << 63) + 5));
  w.Kv("i64", VT::kInt64, Le<int64_t>(-(1ll << 40)));
  w.Kv("f64", VT::kFloat64, Le<double>(3.25));
  w.Kv("a_u8", VT::kArray, Arr(VT::kUint8, 3, Le<uint8_t>(1) + Le<uint8_t>(2) + Le<uint8_t>(255)));
  w.Kv("a_i16", VT::kArray, Arr(VT::kInt16, 2, Le<int16_t>(-7) + Le<int16_t>(7)));
  w.Kv("a_u32", VT::kArray, Arr(VT::kUint32, 1, Le<uint32_t>(9)));
  w.Kv("a_i32", VT::kArray, Arr(VT::kInt32, 2, Le<int32_t>(-1) + Le<int32_t>(3)));
  w.Kv("a_u64", VT::kArray, Arr(VT::kUint64, 1, Le<uint64_t>(~0ull)));
  w.Kv("a_i64", VT::kArray, Arr(VT::kInt64, 1, Le<int64_t>(-9)));
  w.Kv("a_f32", VT::kArray, Arr(VT::kFloat32, 2, Le<float>(0.5f) + Le<float>(-0.1f)));
  w.Kv("a_f64", VT::kArray, Arr(VT::kFloat64, 1, Le<double>(1e300)));
  w.Kv("a_bool", VT::kArray, Arr(VT::kBool, 2, Le<uint8_t>(0) + Le<uint8_t>(1)));
  w.Kv("a_str", VT::kArray, Arr(VT::kString, 2, Str("x") + Str("")));
  w.Kv("a_empty", VT::kArray, Arr(VT::kUint16, 0, ""));
  w.Kv("a_nested", VT::kArray,
       Arr(VT::kArray, 2,
           Arr(VT::kInt32, 2, Le<int32_t>(1) + Le<int32_t>(2)) + Arr(VT::kString, 1, Str("z"))));
  w.Kv("a_deep", VT::kArray,
       Arr(VT::kArray, 1, Arr(VT::kArray, 1, Arr(VT::kUint8, 1, Le<uint8_t>(42)))));
  const std::string bytes = w.Build();
  auto g = ParseBytes(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  const GgufFile& f = **g;
  EXPECT_EQ(f.version(), GetParam());
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 25u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_TRUE(f.tensors().empty());

  EXPECT_EQ(f.Find("u8")->type, VT::kUint8);
  EXPECT_EQ(std::get<uint64_t>(f.Find("u8")->v), 200u);
  EXPECT_EQ(*f.GetInt("u8"), 200);
  EXPECT_EQ(*f.GetInt("i8"), -5);
  EXPECT_EQ(*f.GetInt("u16"), 60000);
  EXPECT_EQ(*f.GetInt("i16"), -300);
  EXPECT_EQ(*f.GetInt("u32"), 4000000000);
  EXPECT_EQ(*f.GetInt("i32"), -2000000000);
  EXPECT_EQ(*f.GetInt("i64"), -(1ll << 40));
  EXPECT_EQ(std::get<uint64_t>(f.Find("u64")->v), (1ull << 63) + 5);
  EXPECT_THAT(f.GetInt("u64").status().message(), HasSubstr("does not fit"));
  EXPECT_EQ(*f.GetFloat("f32"), static_cast<double>(1.1f));
  EXPECT_EQ(*f.GetFloat("f64"), 3.25);
  EXPECT_EQ(*f.GetFloat("i16"), -300.0);
  EXPECT_EQ(*f.GetBool("bool"), true);
  EXPECT_EQ(*f.GetString("str"), "h\xc3\xa9llo");
  EXPECT_THAT(f.GetString("u8").status().message(), HasSubstr("'u8' is UINT8, expected STRING"));
  EXPECT_FALSE(f.GetInt("str").ok());
  EXPECT_FALSE(f.GetBool("u8").ok());
  EXPECT_EQ(f.GetInt("missing").status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(*f.GetIntArray("a_u8"), (std::vector<int64_t>{1, 2, 255}));
  EXPECT_EQ(*f.GetIntArray("a_i16"), (std::vector<int64_t>{-7, 7}));
  EXPECT_EQ(*f.GetIntArray("a_u32"), (std::vector<int64_t>{9}));
  EXPECT_EQ(*f.GetIntArray("a_i32"), (std::vector<int64_t>{-1, 3}));
  EXPECT_FALSE(f.GetIntArray("a_u64").ok());
  EXPECT_EQ(*f.GetIntArray("a_i64"), (std::vector<int64_t>{-9}));
  EXPECT_EQ(*f.GetFloatArray("a_f32"), (std::vector<double>{0.5, static_cast<double>(-0.1f)}));
  EXPECT_EQ(*f.GetFloatArray("a_f64"), (std::vector<double>{1e300}));
  EXPECT_EQ(*f.GetFloatArray("a_i32"), (std::vector<double>{-1, 3}));
  EXPECT_EQ(f.Find("a_bool")->elem_type, VT::kBool);
  const auto& bools = std::get<GgufScalars>(f.Find("a_bool")->v);
  ASSERT_EQ(bools.size(), 2u);
  EXPECT_EQ(bools.unsigned_at(0), 0u);
  EXPECT_EQ(bools.unsigned_at(1), 1u);
  EXPECT_FALSE(f.GetIntArray("a_bool").ok());
  EXPECT_EQ(**f.GetStringArray("a_str"), (std::vector<std::string>{"x", ""}));
  EXPECT_FALSE(f.GetStringArray("a_i32").ok());
  EXPECT_FALSE(f.GetIntArray("a_str").ok());
  EXPECT_TRUE(f.GetIntArray("a_empty")->empty());
  EXPECT_EQ(f.Find("a_empty")->elem_type, VT::kUint16);

  const GgufValue* nested = f.Find("a_nested");
  ASSERT_EQ(nested->elem_type, VT::kArray);
  const auto& outer = std::get<GgufArray>(nested->v);
  ASSERT_EQ(outer.size(), 2u);
  EXPECT_EQ(outer[0].type, VT::kArray);
  EXPECT_EQ(outer[0].elem_type, VT::kInt32);
  const auto& pair = std::get<GgufScalars>(outer[0].v);
  ASSERT_EQ(pair.size(), 2u);
  EXPECT_EQ(pair.signed_at(0), 1);
  EXPECT_EQ(pair.signed_at(1), 2);
  EXPECT_EQ(outer[1].elem_type, VT::kString);
  EXPECT_EQ(std::get<std::vector<std::string>>(outer[1].v), (std::vector<std::string>{"z"}));
  const auto& deep = std::get<GgufArray>(std::get<GgufArray>(f.Find("a_deep")->v)[0].v);
  const auto& deepest = std::get<GgufScalars>(deep[0].v);
  ASSERT_EQ(deepest.size(), 1u);
  EXPECT_EQ(deepest.unsigned_at(0), 42u);
}

TEST_P(GgufVersionTest, ParsesEveryTensorType) {
  struct TypeCase {
    GgmlType type;
    uint64_t row;  // elements per row
    size_t row_bytes;
  };
  const TypeCase cases[] = {
      {GgmlType::kF32, 5, 20},     {GgmlType::kF16, 6, 12},     {GgmlType::kBF16, 3, 6},
      {GgmlType::kQ8_0, 64, 68},   {GgmlType::kQ4_0, 32, 18},   {GgmlType::kQ4_1, 96, 60},
      {GgmlType::kQ4_K, 512, 288}, {GgmlType::kQ5_K, 256, 176}, {GgmlType::kQ6_K, 256, 210},
  };
  GgufWriter w;
  w.version = GetParam();
  w.alignment = 64;
  w.Kv("general.alignment", VT::kUint32, Le<uint32_t>(64));
  for (size_t i = 0; i < std::size(cases); ++i) {
    const uint64_t rows = i % 3 + 1;
    std::vector<uint64_t> dims = {cases[i].row, rows};
    if (i == 2) dims.push_back(2);  // a 3-D tensor
    const uint64_t n_rows = rows * (i == 2 ? 2 : 1);
    w.tensors.push_back({"t." + std::string(TypeInfo(cases[i].type).name), dims,
                         static_cast<uint32_t>(cases[i].type),
                         RandomBytes(cases[i].row_bytes * n_rows, static_cast<uint32_t>(i))});
  }
  const std::string bytes = w.Build();
  auto g = ParseBytes(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  const GgufFile& f = **g;
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  ASSERT_EQ(f.tensors().size(), std::size(cases));
  for (size_t i = 0; i < std::size(cases); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    const TensorSpec& spec = w.tensors[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(f.FindTensor(spec.name), &t);
    EXPECT_EQ(t.type, cases[i].type);
    EXPECT_EQ(t.dims, std::vector<int64_t>(spec.dims.begin(), spec.dims.end()));
    EXPECT_EQ(t.cols(), static_cast<int64_t>(cases[i].row));
    EXPECT_EQ(t.n_bytes, spec.data.size());
    EXPECT_EQ(t.n_elements, static_cast<uint64_t>(t.rows() * t.cols()));
    EXPECT_EQ(t.offset % 64, 0u);
    EXPECT_EQ(t.data, reinterpret_cast<const uint8_t*>(bytes.data()) + f.data_offset() + t.offset);
    EXPECT_EQ(std::memcmp(t.data, spec.data.data(), spec.data.size()), 0);
    EXPECT_EQ(*RowBytes(t.type, t.cols()), cases[i].row_bytes);
  }
  EXPECT_EQ(f.tensors()[2].rows(), 6);
  EXPECT_EQ(f.FindTensor("nope"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(V2V3, GgufVersionTest, ::testing::Values(2u, 3u));

TEST(GgufTest, OpensAFileFromDisk) {
  const std::string bytes = BaseWriter().Build();
  char path[] = "/tmp/gguf_test_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  close(fd);
  auto g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->path(), path);
  EXPECT_EQ(*(*g)->GetInt("llama.block_count"), 2);
  EXPECT_EQ((*g)->tensors().size(), 2u);
  unlink(path);
  EXPECT_FALSE(GgufFile::Open("/nonexistent/x.gguf").ok());
}

TEST(GgufTest, ArrayNestingDepthIsBounded) {
  auto nest = [](int levels) {
    std::string v = Arr(VT::kUint8, 1, Le<uint8_t>(1));
    for (int i = 1; i < levels; ++i) v = Arr(VT::kArray, 1, v);
    return v;
  };
  GgufWriter ok;
  ok.Kv("deep", VT::kArray, nest(8));
  EXPECT_TRUE(ParseBytes(ok.Build()).ok());
  GgufWriter bad;
  bad.Kv("deep", VT::kArray, nest(9));
  auto g = ParseBytes(bad.Build());
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("nested deeper than 8"));
  EXPECT_THAT(g.status().message(), HasSubstr("'deep'"));
}

// A number array is a view into the file, not a copy widened to 8 bytes an element: a crafted
// file's 32 MiB uint8 array must not grow the heap by 256 MiB (or at all, beyond the parse's
// own bookkeeping).
TEST(GgufTest, LargeNumberArrayIsAViewNotACopy) {
  constexpr uint64_t kN = 32u << 20;
  GgufWriter w;
  w.Kv("big", VT::kArray, Arr(VT::kUint8, kN, std::string(kN, '\x7f')));
  const std::string bytes = w.Build();
  const size_t before = mallinfo2().uordblks;
  auto g = ParseBytes(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  const size_t after = mallinfo2().uordblks;
  EXPECT_LT(after - std::min(after, before), size_t{1} << 20);
  const auto& a = std::get<GgufScalars>((*g)->Find("big")->v);
  ASSERT_EQ(a.size(), kN);
  EXPECT_GE(a.data, reinterpret_cast<const uint8_t*>(bytes.data()));
  EXPECT_LT(a.data, reinterpret_cast<const uint8_t*>(bytes.data() + bytes.size()));
  EXPECT_EQ(a.unsigned_at(kN - 1), 0x7fu);
}

TEST(GgufTest, EveryTruncationFails) {
  const std::string bytes = BaseWriter().Build();
  ASSERT_TRUE(ParseBytes(bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string prefix = bytes.substr(0, n);
    auto g = ParseBytes(prefix);
    ASSERT_FALSE(g.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_THAT(g.status().message(), HasSubstr("gguf: ")) << n;
    EXPECT_THAT(g.status().message(), HasSubstr("mem.gguf")) << n;
  }
}

struct Corruption {
  std::string name;
  std::function<void(GgufWriter&)> mutate;
  std::string expect;                                 // substring of the error message
  std::function<void(std::string&)> patch = nullptr;  // applied to the built bytes
};

std::vector<Corruption> Corruptions() {
  const uint64_t huge = 1ull << 60;
  return {
      {"bad magic", nullptr, "not a GGUF file", [](std::string& b) { b[0] = 'X'; }},
      {"v1", [](GgufWriter& w) { w.version = 1; }, "GGUF version 1 is not supported"},
      {"v4", [](GgufWriter& w) { w.version = 4; }, "unsupported GGUF version 4"},
      {"big endian", [](GgufWriter& w) { w.version = 0x03000000; }, "big-endian"},
      {"huge tensor count", [=](GgufWriter& w) { w.tensor_count = huge; }, "tensor count"},
      {"huge kv count", [=](GgufWriter& w) { w.kv_count = huge; }, "metadata count"},
      {"kv count too large", [](GgufWriter& w) { w.kv_count = w.n_kv + 1; }, "gguf: "},
      {"tensor count too large", [](GgufWriter& w) { w.tensor_count = 3; }, "gguf: "},
      {"unknown value type", [](GgufWriter& w) { w.Kv("x", 13u, ""); }, "unknown value type 13"},
      {"unknown array type", [](GgufWriter& w) { w.Kv("x", VT::kArray, Arr(77u, 0, "")); },
       "unknown value type 77"},
      {"huge string", [](GgufWriter& w) { w.Kv("x", VT::kString, Le<uint64_t>(1ull << 62)); },
       "string length"},
      {"huge key",
       [](GgufWriter& w) {
         w.kvs += Le<uint64_t>(1ull << 40);
         ++w.n_kv;
       },
       "string length"},
      {"huge array", [=](GgufWriter& w) { w.Kv("x", VT::kArray, Arr(VT::kUint64, huge, "")); },
       "array of"},
      {"huge string array",
       [=](GgufWriter& w) { w.Kv("x", VT::kArray, Arr(VT::kString, huge, "")); }, "array of"},
      {"huge nested array",
       [=](GgufWriter& w) { w.Kv("x", VT::kArray, Arr(VT::kArray, huge, "")); }, "array of"},
      {"short string array",
       [](GgufWriter& w) { w.Kv("x", VT::kArray, Arr(VT::kString, 2, Str("a") + Le(1ull << 40))); },
       "(array element 1)"},
      {"bad bool", [](GgufWriter& w) { w.Kv("b", VT::kBool, Le<uint8_t>(2)); }, "neither 0 nor 1"},
      {"bad bool array",
       [](GgufWriter& w) { w.Kv("b", VT::kArray, Arr(VT::kBool, 1, Le<uint8_t>(7))); },
       "neither 0 nor 1"},
      {"duplicate key",
       [](GgufWriter& w) { w.Kv("llama.block_count", VT::kUint32, Le<uint32_t>(3)); },
       "metadata key 'llama.block_count' (kv 3) at byte"},
      {"alignment 0",
       [](GgufWriter& w) { w.Kv("general.alignment", VT::kUint32, Le<uint32_t>(0)); },
       "general.alignment 0 is not a non-zero power of two"},
      {"alignment 48",
       [](GgufWriter& w) { w.Kv("general.alignment", VT::kUint32, Le<uint32_t>(48)); },
       "power of two"},
      {"alignment negative",
       [](GgufWriter& w) { w.Kv("general.alignment", VT::kInt32, Le<int32_t>(-32)); },
       "power of two"},
      {"alignment string", [](GgufWriter& w) { w.Kv("general.alignment", VT::kString, Str("32")); },
       "general.alignment"},
      {"alignment 2^63",
       [](GgufWriter& w) {
         w.Kv("general.alignment", VT::kUint64, Le<uint64_t>(1ull << 63));
         w.tensors.pop_back();  // keep only the tensor at offset 0, which is aligned
       },
       "beyond the end of the file"},
      {"unsupported tensor type", [](GgufWriter& w) { w.tensors[0].type = 10; },
       "tensor 'tok' (index 0): unsupported tensor type Q2_K (id 10)"},
      {"unknown tensor type", [](GgufWriter& w) { w.tensors[1].type = 99; },
       "tensor 'norm' (index 1): unknown tensor type id 99"},
      {"zero dims", [](GgufWriter& w) { w.tensors[1].dims = {}; }, "0 dimensions"},
      {"five dims",
       [](GgufWriter& w) {
         w.tensors[1].dims = {8, 1, 1, 1, 1};
       },
       "5 dimensions"},
      {"dims product overflows",
       [](GgufWriter& w) {
         w.tensors[1].dims = {1ull << 32, 1ull << 32};
       },
       "element count of dims [4294967296, 4294967296] overflows"},
      {"byte size overflows", [](GgufWriter& w) { w.tensors[1].dims = {1ull << 62}; }, "byte size"},
      {"dim above int64",
       [](GgufWriter& w) {
         w.tensors[1].dims = {8, 1ull << 63};
       },
       "larger than 2^63-1"},
      {"row not a block multiple",
       [](GgufWriter& w) {
         w.tensors[0].dims = {33, 2};
       },
       "row length 33 is not a multiple of Q8_0's block size 32"},
      {"offset beyond file", [](GgufWriter& w) { w.tensors[1].offset = 1 << 20; },
       "tensor 'norm' (index 1): data [1048576, 1048576 + 32)"},
      {"offset overflows", [](GgufWriter& w) { w.tensors[1].offset = ~0ull - 31; },
       "beyond the end of the file"},
      {"misaligned offset", [](GgufWriter& w) { w.tensors[1].offset = 8; },
       "data offset 8 is not a multiple of the alignment 32"},
      {"duplicate tensor", [](GgufWriter& w) { w.tensors[1].name = "tok"; },
       "duplicate tensor name"},
      {"huge tensor name", [](GgufWriter& w) { w.tensors[1].name.clear(); }, "gguf: ",
       [](std::string& b) {
         // The second tensor info starts after the first: its name length is at the byte after
         // tok's offset. Patch it to 2^40.
         const size_t at = b.find(Str("tok")) + 11 + 4 + 16 + 4 + 8;
         const std::string len = Le<uint64_t>(1ull << 40);
         b.replace(at, 8, len);
       }},
      {"data truncated", nullptr, "beyond the end of the file (",
       [](std::string& b) { b.pop_back(); }},
  };
}

TEST(GgufTest, CorruptionsGiveClearErrors) {
  for (const Corruption& c : Corruptions()) {
    SCOPED_TRACE(c.name);
    GgufWriter w = BaseWriter();
    if (c.mutate) c.mutate(w);
    std::string bytes = w.Build();
    if (c.patch) c.patch(bytes);
    auto g = ParseBytes(bytes);
    ASSERT_FALSE(g.ok());
    EXPECT_THAT(g.status().message(), HasSubstr(c.expect));
    EXPECT_THAT(g.status().message(), HasSubstr("gguf: "));
  }
}

TEST(GgufTest, ZeroSizedTensorIsAccepted) {
  GgufWriter w;
  w.tensors.push_back({"empty", {0, 1ull << 40}, 0, ""});
  const std::string bytes = w.Build();
  auto g = ParseBytes(bytes);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->tensors()[0].n_elements, 0u);
  EXPECT_EQ((*g)->tensors()[0].n_bytes, 0u);
}

TEST(GgufTest, RealModel) {
  const std::string path = TestModelPath();
  auto g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status();
  const GgufFile& f = **g;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(*f.GetInt("llama.block_count"), 30);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  const GgufTensorInfo* emb = f.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kQ8_0);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{576, 49152}));
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ((*tokens)->size(), 49152u);
  EXPECT_EQ((*tokens)->front(), "<|endoftext|>");
  auto merges = f.GetStringArray("tokenizer.ggml.merges");
  ASSERT_TRUE(merges.ok()) << merges.status();
  EXPECT_EQ((*merges)->size(), 48900u);
  int q4_1 = 0, f32 = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    q4_1 += t.type == GgmlType::kQ4_1;
    f32 += t.type == GgmlType::kF32;
  }
  EXPECT_EQ(q4_1, 210);
  EXPECT_EQ(f32, 61);
}

}  // namespace
}  // namespace tripod
