// The q8_0 KV row codec against its definition, KV type names, and the layout checks.
#include "common/kv/kv_dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/model/quant_types.h"

namespace tripod {
namespace {

TEST(KvDtypeTest, Q8RoundTripWithinHalfAStep) {
  std::mt19937 rng(5);
  const int D = 128;
  std::vector<float> x(D), back(D);
  std::vector<uint8_t> row(KvRowBytes(KvDtype::kQ8_0, D));
  ASSERT_EQ(row.size(), 4u * kKvQ8BlockBytes);
  for (int trial = 0; trial < 200; ++trial) {
    // Scales whose block scale d stays a normal fp16 (KV of a real model is far inside).
    const float scale = std::exp(std::uniform_real_distribution<float>(-4.0f, 8.0f)(rng));
    std::normal_distribution<float> nd(0.0f, scale);
    for (float& v : x) v = nd(rng);
    if (trial % 7 == 0) x[3] = 40.0f * scale;  // an outlier in the first block only
    QuantizeKvQ8Row(x.data(), D, row.data());
    DequantizeKvQ8Row(row.data(), D, back.data());
    for (int b = 0; b < D / kKvQ8Block; ++b) {
      float amax = 0;
      for (int i = 0; i < kKvQ8Block; ++i) amax = std::fmax(amax, std::fabs(x[b * 32 + i]));
      uint16_t h;
      std::memcpy(&h, row.data() + b * kKvQ8BlockBytes, 2);
      const float d = Fp16ToFp32(h);
      // The scale is amax / 127 rounded to fp16.
      ASSERT_NEAR(d, amax / 127.0f, amax / 127.0f * 1e-3f) << "block " << b;
      for (int i = 0; i < kKvQ8Block; ++i) {
        const float v = x[b * 32 + i];
        // Half a step, plus the fp16 rounding of the scale carried through |q| <= 127.
        ASSERT_NEAR(back[b * 32 + i], v, 0.5f * d + 127.0f * d * 1e-3f)
            << "trial " << trial << " element " << b * 32 + i;
      }
    }
  }
}

TEST(KvDtypeTest, Q8ZeroBlockAndExtremes) {
  std::vector<float> x(32, 0.0f), back(32, 1.0f);
  std::vector<uint8_t> row(kKvQ8BlockBytes, 0xff);
  QuantizeKvQ8Row(x.data(), 32, row.data());
  DequantizeKvQ8Row(row.data(), 32, back.data());
  for (float v : back) EXPECT_EQ(v, 0.0f);
  x[0] = 1000.0f;
  x[1] = -1000.0f;
  x[2] = 500.0f;
  QuantizeKvQ8Row(x.data(), 32, row.data());
  EXPECT_EQ(static_cast<int8_t>(row[2]), 127);
  EXPECT_EQ(static_cast<int8_t>(row[3]), -127);
  EXPECT_EQ(static_cast<int8_t>(row[4]), 64);  // 63.5 rounds away from zero
}

TEST(KvDtypeTest, NamesAndSizes) {
  for (KvDtype t : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kQ8_0}) {
    auto parsed = ParseKvDtype(KvDtypeName(t), KvDtype::kF32);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(*ParseKvDtype("auto", KvDtype::kF16), KvDtype::kF16);
  EXPECT_EQ(*ParseKvDtype("", KvDtype::kBF16), KvDtype::kBF16);
  auto bad = ParseKvDtype("q4", KvDtype::kF16);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("q8_0"), std::string::npos) << bad.status();
  EXPECT_EQ(KvRowBytes(KvDtype::kF32, 64), 256u);
  EXPECT_EQ(KvRowBytes(KvDtype::kF16, 64), 128u);
  EXPECT_EQ(KvRowBytes(KvDtype::kQ8_0, 64), 68u);
  // SmolLM2-135M: 30 layers x 3 KV heads x 64; q8_0 is 34/32 bytes an element.
  EXPECT_EQ((KvLayout{30, 3, 64, KvDtype::kQ8_0}.bytes_per_token()), 2u * 30 * 3 * 68);
}

TEST(KvDtypeTest, LayoutChecks) {
  EXPECT_TRUE(ValidateKvLayout(KvLayout{2, 2, 64, KvDtype::kQ8_0}).ok());
  const absl::Status odd = ValidateKvLayout(KvLayout{2, 2, 48, KvDtype::kQ8_0});
  EXPECT_FALSE(odd.ok());
  EXPECT_NE(odd.message().find("multiple of 32"), std::string::npos) << odd;
  EXPECT_TRUE(ValidateKvLayout(KvLayout{2, 2, 48, KvDtype::kF16}).ok());
  EXPECT_FALSE(ValidateKvLayout(KvLayout{0, 2, 64, KvDtype::kF16}).ok());
  EXPECT_FALSE(ValidateKvLayout(KvLayout{2, 2, 64, static_cast<KvDtype>(9)}).ok());
}

}  // namespace
}  // namespace tripod
