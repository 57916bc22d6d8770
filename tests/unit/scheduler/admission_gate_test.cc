#include "scheduler/admission_gate.h"

#include <gtest/gtest.h>

#include <thread>
#include <utility>
#include <vector>

namespace tripod::scheduler {
namespace {

TEST(AdmissionGateTest, CountLimitRefusesThenReadmitsAfterRelease) {
  AdmissionGate gate({.max_requests = 2, .max_bytes = 1000});
  std::optional<AdmissionTicket> a = Admit(gate, 10);
  std::optional<AdmissionTicket> b = Admit(gate, 10);
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(b.has_value());
  AdmissionRefusal why = AdmissionRefusal::kBytes;
  EXPECT_FALSE(Admit(gate, 10, &why).has_value());
  EXPECT_EQ(why, AdmissionRefusal::kRequests);
  EXPECT_EQ(gate.refused_requests.load(), 1u);
  EXPECT_EQ(gate.refused_bytes.load(), 0u);
  EXPECT_EQ(gate.requests.load(), 2);  // the refusal left nothing behind
  EXPECT_EQ(gate.bytes.load(), 20);
  a.reset();
  EXPECT_EQ(gate.requests.load(), 1);
  EXPECT_EQ(gate.bytes.load(), 10);
  EXPECT_TRUE(Admit(gate, 10).has_value());
}

TEST(AdmissionGateTest, ByteLimitRefusesWhatWouldPassIt) {
  AdmissionGate gate({.max_requests = 10, .max_bytes = 100});
  std::optional<AdmissionTicket> a = Admit(gate, 40);
  std::optional<AdmissionTicket> b = Admit(gate, 60);  // exactly at the limit: admitted
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(b.has_value());
  AdmissionRefusal why = AdmissionRefusal::kRequests;
  EXPECT_FALSE(Admit(gate, 1, &why).has_value());
  EXPECT_EQ(why, AdmissionRefusal::kBytes);
  EXPECT_EQ(gate.refused_bytes.load(), 1u);
  EXPECT_EQ(gate.bytes.load(), 100);
  EXPECT_TRUE(Admit(gate, 0).has_value());  // an empty body takes no bytes
  b.reset();
  EXPECT_TRUE(Admit(gate, 60).has_value());
}

TEST(AdmissionGateTest, ABodyOverTheByteLimitPassesOnlyAlone) {
  AdmissionGate gate({.max_requests = 10, .max_bytes = 100});
  {
    std::optional<AdmissionTicket> big = Admit(gate, 500);
    ASSERT_TRUE(big.has_value());
    EXPECT_FALSE(Admit(gate, 1).has_value());  // nothing else while it is held
  }
  std::optional<AdmissionTicket> small = Admit(gate, 1);
  ASSERT_TRUE(small.has_value());
  EXPECT_FALSE(Admit(gate, 500).has_value());
}

TEST(AdmissionGateTest, AMovedTicketReleasesOnce) {
  AdmissionGate gate({.max_requests = 1, .max_bytes = 100});
  {
    std::optional<AdmissionTicket> a = Admit(gate, 30);
    ASSERT_TRUE(a.has_value());
    AdmissionTicket moved(std::move(*a));
    a.reset();  // the moved-from ticket gives nothing back
    EXPECT_EQ(gate.requests.load(), 1);
    EXPECT_EQ(gate.bytes.load(), 30);
  }
  EXPECT_EQ(gate.requests.load(), 0);
  EXPECT_EQ(gate.bytes.load(), 0);
}

TEST(AdmissionGateTest, ConcurrentCallersNeverHoldMoreThanTheLimits) {
  constexpr int kThreads = 8, kRounds = 2000, kMax = 3;
  constexpr size_t kBytes = 10, kMaxBytes = 25;  // two at a time by bytes, three by count
  AdmissionGate gate({.max_requests = kMax, .max_bytes = kMaxBytes});
  std::atomic<int> held{0}, most{0}, admitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        std::optional<AdmissionTicket> ticket = Admit(gate, kBytes);
        if (!ticket.has_value()) continue;
        admitted.fetch_add(1);
        const int now = held.fetch_add(1) + 1;
        int m = most.load();
        while (now > m && !most.compare_exchange_weak(m, now)) {
        }
        held.fetch_sub(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(most.load(), 2);
  EXPECT_GE(admitted.load(), 1);
  EXPECT_EQ(static_cast<uint64_t>(admitted.load()) + gate.refused_requests.load() +
                gate.refused_bytes.load(),
            static_cast<uint64_t>(kThreads * kRounds));
  EXPECT_EQ(gate.requests.load(), 0);
  EXPECT_EQ(gate.bytes.load(), 0);
}

}  // namespace
}  // namespace tripod::scheduler
