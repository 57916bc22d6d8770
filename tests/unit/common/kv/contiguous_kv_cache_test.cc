// ContiguousKvCache: views address disjoint memory per sequence, layer, K and V.
#include "common/kv/contiguous_kv_cache.h"

#include <gtest/gtest.h>

#include <set>

namespace tripod {
namespace {

TEST(ContiguousKvCacheTest, ViewsAreDisjointAndInBounds) {
  KvLayout layout{3, 2, 8, KvDtype::kF16};
  EXPECT_EQ(layout.bytes_per_token(), 2u * 3 * 2 * 8 * 2);
  auto cache = ContiguousKvCache::Create(layout, 2, 16);
  ASSERT_TRUE(cache.ok());
  std::set<const uint8_t*> starts;
  for (int s = 0; s < 2; ++s) {
    for (int l = 0; l < 3; ++l) {
      KvLayerRef r = (*cache)->Layer(s, l);
      EXPECT_EQ(r.block_tokens, 16);
      starts.insert(r.k_at(0, 0, 8));
      starts.insert(r.v_at(0, 0, 8));
      // Last element of the last slot of the last head lies inside the storage.
      EXPECT_EQ(r.k_at(15, 1, 8) + 8 * 2, r.k_base + r.block_bytes);
    }
  }
  EXPECT_EQ(starts.size(), 12u);
  EXPECT_EQ((*cache)->bytes(), 2u * 16 * layout.bytes_per_token());
}

TEST(ContiguousKvCacheTest, RejectsEmptyShapes) {
  KvLayout layout{3, 2, 8, KvDtype::kF32};
  EXPECT_FALSE(ContiguousKvCache::Create(layout, 0, 16).ok());
  EXPECT_FALSE(ContiguousKvCache::Create(layout, 1, 0).ok());
}

}  // namespace
}  // namespace tripod
