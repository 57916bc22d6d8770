// The profiling decorator changes no result and accounts for every call.
#include "common/compute/profiling_backend.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/forward.h"
#include "common/compute/model.h"
#include "common/kv/contiguous_kv_cache.h"
#include "tests/unit/test_model.h"

namespace tripod {
namespace {

// Logits of a 6-token prefill and of one decode step after it.
std::vector<float> PrefillThenDecode(Backend& backend) {
  auto model = LoadModel(TestModelPath(), backend);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  const ModelConfig& c = (*model)->config;
  auto kv = *ContiguousKvCache::Create(
      KvLayout{c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF32}, 1, 16);
  ForwardWorkspace ws(backend);
  const ForwardPlan plan = ForwardPlan::Full(c.n_layers);
  const std::vector<int32_t> ids = {1, 504, 3458, 282, 260, 4011, 30};
  std::vector<float> out, logits;
  StepBatch prefill;
  prefill.AddSequence(0, ids.data(), 6, 0, 0, true);
  EXPECT_TRUE(Forward(**model, backend, plan, prefill, *kv, ws, &logits).ok());
  out = logits;
  StepBatch decode;
  decode.AddSequence(0, ids.data() + 6, 1, 6, 6, true);
  EXPECT_TRUE(Forward(**model, backend, plan, decode, *kv, ws, &logits).ok());
  out.insert(out.end(), logits.begin(), logits.end());
  return out;
}

TEST(ProfilingBackendTest, SameLogitsAndEveryOpCounted) {
  std::unique_ptr<Backend> plain = MakeCpuBackend(*CpuOptionsForPrecision("fp32"));
  const std::vector<float> want = PrefillThenDecode(*plain);

  std::FILE* table = std::tmpfile();
  ASSERT_NE(table, nullptr);
  std::unique_ptr<Backend> profiled =
      MakeProfilingBackend(MakeCpuBackend(*CpuOptionsForPrecision("fp32")), table);
  EXPECT_NE(profiled->name().find("(profiled)"), std::string::npos);
  const std::vector<float> got = PrefillThenDecode(*profiled);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "logit " << i;
  profiled.reset();  // prints the table

  std::rewind(table);
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), table)) > 0;) text.append(buf, n);
  std::fclose(table);
  // 30 layers: one prefill and one decode attention call each; the QKV matrix (960 x 576) once
  // per layer per step; the head (vocab x 576) once per step.
  auto count_of = [&](const std::string& op) -> long {
    const size_t at = text.find("  " + op + " ");
    if (at == std::string::npos) return -1;
    return std::strtol(text.c_str() + at + 2 + op.size(), nullptr, 10);
  };
  EXPECT_EQ(count_of("attention prefill"), 30) << text;
  EXPECT_EQ(count_of("attention decode"), 30) << text;
  EXPECT_EQ(count_of("linear 960x576 m<=16"), 60) << text;
  EXPECT_EQ(count_of(absl::StrCat("linear ", 49152, "x576 m<=16")), 2) << text;
  EXPECT_NE(text.find("TRIPOD_PROFILE"), std::string::npos) << text;

  // Every op but the first follows a gap, counted in one of the three classes.
  // The op rows follow the column heads; calls is the fourth field from the right.
  long calls = 0;
  std::istringstream lines(text.substr(text.find('\n', text.find("share")) + 1));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    ASSERT_GE(f.size(), 5u) << line;
    calls += std::stol(f[f.size() - 4]);
  }
  long gaps[3];
  double gap_s[3];
  const size_t between = text.find("between ops:");
  ASSERT_NE(between, std::string::npos) << text;
  ASSERT_EQ(std::sscanf(text.c_str() + between,
                        "between ops: %lf s in %ld gaps under 1 ms, %lf s in %ld of 1 ms to 1 s, "
                        "%lf s in %ld over 1 s",
                        &gap_s[0], &gaps[0], &gap_s[1], &gaps[1], &gap_s[2], &gaps[2]),
            6)
      << text;
  EXPECT_GT(calls, 300) << text;
  EXPECT_EQ(gaps[0] + gaps[1] + gaps[2], calls - 1) << text;
  for (double s : gap_s) EXPECT_GE(s, 0.0) << text;
}

}  // namespace
}  // namespace tripod
