// The test-only transfer fault switch: its flag text is parsed strictly (every rate a probability,
// their sum at most 1, unknown names refused), the drawn faults follow the rates, and a corrupted
// payload differs from the original in exactly one byte.
#include "common/kv_transfer/transfer_faults.h"

#include <gtest/gtest.h>

#include <string>

namespace tripod {
namespace {

TEST(TransferFaultsTest, ParsesRatesAndRefusesNonsense) {
  absl::StatusOr<TransferFaultRates> r =
      ParseTransferFaults("drop=0.1,corrupt=0.2,delay=0.3,delay_ms=250,seed=9");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->drop, 0.1);
  EXPECT_DOUBLE_EQ(r->corrupt, 0.2);
  EXPECT_DOUBLE_EQ(r->delay, 0.3);
  EXPECT_EQ(r->delay_ms, 250);
  EXPECT_EQ(r->seed, 9u);
  EXPECT_TRUE(r->any());
  absl::StatusOr<TransferFaultRates> none = ParseTransferFaults("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->any());
  for (const char* bad : {"drop", "drop=1.5", "drop=-0.1", "drop=x", "lose=0.1", "delay_ms=-1",
                          "delay_ms=70000", "seed=abc", "drop=0.6,corrupt=0.6", "drop=0.1,"}) {
    absl::StatusOr<TransferFaultRates> b = ParseTransferFaults(bad);
    EXPECT_FALSE(b.ok()) << bad;
    if (!b.ok()) {
      EXPECT_NE(std::string(b.status().message()).find("--inject_transfer_faults"),
                std::string::npos)
          << b.status();
    }
  }
}

TEST(TransferFaultsTest, DrawsFollowTheRates) {
  TransferFaultInjector inj({.drop = 0.1, .corrupt = 0.2, .delay = 0.3, .seed = 42});
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) inj.Draw();
  // Binomial standard deviations are at most ~70 draws here: 5 of them either way.
  EXPECT_NEAR(inj.count(ChunkFault::kDrop), 0.1 * kDraws, 350);
  EXPECT_NEAR(inj.count(ChunkFault::kCorrupt), 0.2 * kDraws, 350);
  EXPECT_NEAR(inj.count(ChunkFault::kDelay), 0.3 * kDraws, 350);
  EXPECT_EQ(inj.count(ChunkFault::kNone) + inj.count(ChunkFault::kDrop) +
                inj.count(ChunkFault::kCorrupt) + inj.count(ChunkFault::kDelay),
            static_cast<uint64_t>(kDraws));
  TransferFaultInjector off({});
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(off.Draw(), ChunkFault::kNone);
}

TEST(TransferFaultsTest, CorruptFlipsExactlyOneByte) {
  TransferFaultInjector inj({.corrupt = 1, .seed = 3});
  for (int trial = 0; trial < 50; ++trial) {
    const std::string original(1 + trial * 7, 'a');
    std::string p = original;
    inj.Corrupt(&p);
    ASSERT_EQ(p.size(), original.size());
    int differing = 0;
    for (size_t i = 0; i < p.size(); ++i) differing += p[i] != original[i];
    EXPECT_EQ(differing, 1);
  }
  std::string empty;
  inj.Corrupt(&empty);
  EXPECT_EQ(empty.size(), 1u);
}

}  // namespace
}  // namespace tripod
