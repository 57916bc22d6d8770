// PrefixCache: the chain hash, verified lookups (a collision never aliases), LRU eviction.
#include "common/kv/prefix_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace tripod {
namespace {

TEST(PrefixCacheTest, ChainHashCoversParentPlanAndTokens) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  const uint64_t h = PrefixCache::ChainHash(0, 7, a);
  EXPECT_EQ(h, PrefixCache::ChainHash(0, 7, a));
  EXPECT_NE(h, PrefixCache::ChainHash(0, 7, b));
  EXPECT_NE(h, PrefixCache::ChainHash(0, 8, a));
  EXPECT_NE(h, PrefixCache::ChainHash(1, 7, a));
}

TEST(PrefixCacheTest, FindVerifiesContentSoCollisionsNeverAlias) {
  BlockPool pool(4);
  PrefixCache cache(4);
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {9, 9, 9, 9};
  const int32_t ba = pool.Allocate(), bb = pool.Allocate();
  const uint64_t ga = cache.Publish(ba, /*hash=*/42, 0, 7, a);
  ASSERT_NE(ga, 0u);
  EXPECT_TRUE(cache.cached(ba));
  // Same content again: the existing entry answers, the new block stays private.
  EXPECT_EQ(cache.Publish(bb, 42, 0, 7, a), ga);
  EXPECT_FALSE(cache.cached(bb));
  // Other content under the same hash (a forced collision) is not published ...
  EXPECT_EQ(cache.Publish(bb, 42, 0, 7, b), 0u);
  // ... and looking it up does not return a's block.
  EXPECT_FALSE(cache.Find(42, 0, 7, b).has_value());
  EXPECT_FALSE(cache.Find(42, 0, 8, a).has_value());  // other plan
  EXPECT_FALSE(cache.Find(42, 5, 7, a).has_value());  // other parent entry
  EXPECT_FALSE(cache.Find(43, 0, 7, a).has_value());  // other hash
  const auto hit = cache.Find(42, 0, 7, a);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->block, ba);
  EXPECT_EQ(hit->gen, ga);
  EXPECT_TRUE(cache.CheckConsistency(pool).ok());
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUnreferencedFirst) {
  BlockPool pool(4);
  PrefixCache cache(4);
  std::vector<int32_t> blocks;
  for (int i = 0; i < 3; ++i) {
    const int32_t b = pool.Allocate();
    const std::vector<int32_t> ids = {i, i, i, i};
    ASSERT_NE(cache.Publish(b, PrefixCache::ChainHash(0, 1, ids), 0, 1, ids), 0u);
    blocks.push_back(b);
  }
  EXPECT_EQ(cache.num_evictable(), 0);  // all referenced
  for (int32_t b : {blocks[1], blocks[0], blocks[2]}) {
    ASSERT_TRUE(pool.Unref(b).ok());
    cache.OnUnreferenced(b);
  }
  EXPECT_EQ(cache.num_evictable(), 3);
  EXPECT_TRUE(cache.CheckConsistency(pool).ok());
  // blocks[1] is used again and released: it becomes the most recent.
  cache.OnReferenced(blocks[1]);
  ASSERT_TRUE(pool.Ref(blocks[1]).ok());
  EXPECT_TRUE(cache.CheckConsistency(pool).ok());
  ASSERT_TRUE(pool.Unref(blocks[1]).ok());
  cache.OnUnreferenced(blocks[1]);
  EXPECT_EQ(cache.EvictLru(), blocks[0]);
  EXPECT_EQ(cache.EvictLru(), blocks[2]);
  EXPECT_EQ(cache.EvictLru(), blocks[1]);
  EXPECT_EQ(cache.EvictLru(), -1);
  EXPECT_EQ(cache.num_cached(), 0);
  const std::vector<int32_t> ids0 = {0, 0, 0, 0};
  EXPECT_FALSE(cache.Find(PrefixCache::ChainHash(0, 1, ids0), 0, 1, ids0).has_value());
  for (int32_t b : blocks) ASSERT_TRUE(pool.Free(b).ok());
  EXPECT_TRUE(cache.CheckConsistency(pool).ok());
}

}  // namespace
}  // namespace tripod
