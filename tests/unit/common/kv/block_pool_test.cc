// BlockPool: allocation order, reference counts, and misuse reported as errors.
#include "common/kv/block_pool.h"

#include <gtest/gtest.h>

#include <set>

namespace tripod {
namespace {

TEST(BlockPoolTest, AllocatesEveryBlockOnceThenRunsOut) {
  BlockPool pool(5);
  std::set<int32_t> got;
  for (int i = 0; i < 5; ++i) {
    const int32_t b = pool.Allocate();
    EXPECT_EQ(b, i);  // a fresh pool hands out low ids first
    EXPECT_EQ(pool.refcount(b), 1);
    got.insert(b);
  }
  EXPECT_EQ(got.size(), 5u);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.Allocate(), -1);
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

TEST(BlockPoolTest, ReferenceCountsAndFree) {
  BlockPool pool(3);
  const int32_t b = pool.Allocate();
  ASSERT_TRUE(pool.Ref(b).ok());
  EXPECT_EQ(pool.refcount(b), 2);
  // Freed with references: refused.
  EXPECT_EQ(pool.Free(b).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pool.Unref(b).ok());
  ASSERT_TRUE(pool.Unref(b).ok());
  EXPECT_EQ(pool.refcount(b), 0);
  EXPECT_FALSE(pool.is_free(b));  // unreferenced is not free: the owner decides
  EXPECT_EQ(pool.Unref(b).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pool.Free(b).ok());
  EXPECT_TRUE(pool.is_free(b));
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.Free(b).code(), absl::StatusCode::kFailedPrecondition);  // double free
  EXPECT_EQ(pool.Ref(b).code(), absl::StatusCode::kFailedPrecondition);   // ref of a free block
  EXPECT_TRUE(pool.CheckConsistency().ok());
  // The freed block is reused next.
  EXPECT_EQ(pool.Allocate(), b);
}

TEST(BlockPoolTest, RejectsBadIds) {
  BlockPool pool(2);
  EXPECT_EQ(pool.Ref(-1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Unref(2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Free(7).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

}  // namespace
}  // namespace tripod
