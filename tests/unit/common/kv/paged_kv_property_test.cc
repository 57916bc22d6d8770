// PagedKvCache under random workloads: requests arrive (computed, or imported untrimmed or
// trimmed), share prompt prefixes, grow chunk by chunk, get preempted (freed, recomputed later)
// and cancelled, on a small pool so that eviction and preemption are frequent. After every
// operation the cache must be consistent and every live sequence must read back exactly the
// K/V it was given (a prefix hit reads the bytes its first owner wrote; no allocation
// overwrites a live sequence); at the end every block is back in the pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <random>
#include <vector>

#include "common/kv/paged_kv_cache.h"

namespace tripod::paged_kv_property_test {
namespace {

const KvLayout kLayout{2, 2, 4, KvDtype::kF32};
constexpr int kBt = 4;
constexpr int kBlocks = 48;

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The K (kv 0) or V (kv 1) element e of a slot whose content is `key`; exact in fp32.
float Val(uint64_t key, int l, int h, int kv, int e) {
  return static_cast<float>(Mix(key, ((l * 8 + h) * 2 + kv) * 64 + e) & 0xFFFFFF);
}

struct Req {
  uint64_t plan = 0;
  uint64_t salt = 0;  // trimmed KV: slot content keyed by (salt, slot), not by the prefix
  std::vector<int32_t> tokens;
  size_t target = 0;               // stop when tokens reach this many
  std::optional<KvSnapshot> snap;  // imported requests resume from it
  size_t snap_tokens = 0;          // the prompt tokens it covers
  int32_t seq = -1;
  size_t next = 0;       // index of the next token to run
  int slots = 0;         // cache slots filled
  int64_t admitted = 0;  // admission order, for "preempt the newest"

  uint64_t Key(int slot) const {
    if (salt != 0) return Mix(salt, slot);
    uint64_t k = plan;  // content of slot j = everything up to token j under this plan
    for (int j = 0; j <= slot; ++j) k = Mix(k, tokens[j]);
    return k;
  }
};

class Harness {
 public:
  explicit Harness(uint32_t seed) : rng_(seed) {
    PagedKvOptions o;
    o.layout = kLayout;
    o.block_tokens = kBt;
    o.budget_bytes = size_t{1} * kBlocks * kBt * kLayout.bytes_per_token();
    o.watermark = 0.05;
    cache_ = std::move(*PagedKvCache::Create(o));
    for (int f = 0; f < 4; ++f) {
      std::vector<int32_t> base(40);
      for (int32_t& t : base) t = Rand(1, 50);
      bases_.push_back(base);
    }
  }

  int Rand(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  void Step() {
    const int op = Rand(0, 99);
    if (op < 12) {
      Arrive();
    } else if (op < 30) {
      Schedule();
    } else if (op < 88) {
      Run();
    } else if (op < 93) {
      Cancel();
    } else if (op < 97) {
      if (!live_.empty()) Preempt(Rand(0, static_cast<int>(live_.size()) - 1));
    } else {
      BadAppend();
    }
  }

  // Every live sequence reads back its content; the cache is consistent.
  void Verify() {
    const absl::Status st = cache_->CheckConsistency();
    ASSERT_TRUE(st.ok()) << st;
    for (const Req& r : live_) VerifyReq(r);
  }

  void Drain() {
    for (Req& r : live_) cache_->FreeSequence(r.seq);
    live_.clear();
    waiting_.clear();
  }

  PagedKvCache& cache() { return *cache_; }
  int hits = 0, preemptions = 0, evictions = 0, imports = 0, finished = 0;

 private:
  void VerifyReq(const Req& r) {
    ASSERT_EQ(cache_->length(r.seq), r.slots);
    for (int l = 0; l < kLayout.n_layers; ++l) {
      const KvLayerRef ref = cache_->Layer(r.seq, l);
      ASSERT_GE(ref.n_blocks * kBt, r.slots);
      uint64_t key = r.plan;
      for (int s = 0; s < r.slots; ++s) {
        key = r.salt != 0 ? Mix(r.salt, s) : Mix(key, r.tokens[s]);
        for (int h = 0; h < kLayout.n_kv_heads; ++h) {
          const float* k = reinterpret_cast<const float*>(ref.k_at(s, h, kLayout.head_dim));
          const float* v = reinterpret_cast<const float*>(ref.v_at(s, h, kLayout.head_dim));
          bool same = true;
          for (int e = 0; e < kLayout.head_dim; ++e) {
            same = same && k[e] == Val(key, l, h, 0, e) && v[e] == Val(key, l, h, 1, e);
          }
          ASSERT_TRUE(same) << "seq " << r.seq << " slot " << s << " layer " << l << " head " << h;
        }
      }
    }
  }

  void Arrive() {
    if (live_.size() + waiting_.size() >= 16) return;
    Req r;
    r.plan = Rand(0, 3) == 0 ? 22 : 11;
    const std::vector<int32_t>& base = bases_[Rand(0, 3)];
    r.tokens.assign(base.begin(), base.begin() + Rand(0, 40));
    const int suffix = Rand(1, 12);
    for (int i = 0; i < suffix; ++i) r.tokens.push_back(Rand(1000, 1100));
    r.target = r.tokens.size() + Rand(1, 20);
    const int n = static_cast<int>(r.tokens.size()) - 1;  // a prefill worker's share
    const int mode = Rand(0, 99);
    r.snap_tokens = n;
    if (n >= 1 && mode < 15) {
      r.snap = MakeUntrimmed(r, n);
    } else if (n >= 1 && mode < 30) {
      r.salt = Mix(0x5A17, ++salts_);
      r.snap = MakeTrimmed(r, n, Rand(1, n));
    }
    waiting_.push_back(std::move(r));
  }

  KvSnapshot Empty(int n) const {
    KvSnapshot s;
    s.layout = kLayout;
    s.n_slots = n;
    const size_t bytes = size_t{1} * kLayout.n_layers * kLayout.n_kv_heads * n * s.row_bytes();
    s.k.resize(bytes);
    s.v.resize(bytes);
    return s;
  }

  void FillSnapshot(KvSnapshot& s, const Req& r) const {
    for (int l = 0; l < kLayout.n_layers; ++l) {
      for (int h = 0; h < kLayout.n_kv_heads; ++h) {
        uint64_t key = r.plan;
        for (int j = 0; j < s.n_slots; ++j) {
          key = r.salt != 0 ? Mix(r.salt, j) : Mix(key, r.tokens[j]);
          float* k = reinterpret_cast<float*>(s.k.data() + s.offset(l, h, j));
          float* v = reinterpret_cast<float*>(s.v.data() + s.offset(l, h, j));
          for (int e = 0; e < kLayout.head_dim; ++e) {
            k[e] = Val(key, l, h, 0, e);
            v[e] = Val(key, l, h, 1, e);
          }
        }
      }
    }
  }

  KvSnapshot MakeUntrimmed(const Req& r, int n) {
    KvSnapshot s = Empty(n);
    FillSnapshot(s, r);
    if (Rand(0, 4) != 0) s.token_ids.assign(r.tokens.begin(), r.tokens.begin() + n);
    s.plan_key = Rand(0, 9) != 0 ? r.plan : 33;  // another plan's KV is kept, never shared
    return s;
  }

  KvSnapshot MakeTrimmed(const Req& r, int n, int kept) {
    KvSnapshot s = Empty(kept);
    FillSnapshot(s, r);
    std::vector<int32_t> all(n);
    for (int i = 0; i < n; ++i) all[i] = i;
    for (int lh = 0; lh < kLayout.n_layers * kLayout.n_kv_heads; ++lh) {
      std::shuffle(all.begin(), all.end(), rng_);
      s.positions.insert(s.positions.end(), all.begin(), all.begin() + kept);
    }
    s.plan_key = r.plan;
    return s;
  }

  void Schedule() {
    if (waiting_.empty()) return;
    Req r = std::move(waiting_.front());
    waiting_.pop_front();
    r.seq = cache_->NewSequence(r.plan);
    if (r.snap) {
      if (!cache_->CanAdmit(r.snap->n_slots + 1)) {
        Requeue(std::move(r));
        return;
      }
      const absl::Status st = cache_->Import(r.seq, *r.snap);
      if (!st.ok()) {
        ASSERT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
        Requeue(std::move(r));
        return;
      }
      ++imports;
      r.slots = r.snap->n_slots;
      r.next = r.snap_tokens;  // the tokens the snapshot stands for do not run again
    } else {
      const int attached = cache_->AttachCachedPrefix(r.seq, r.tokens);
      // Whole blocks, or all but the last token of a prompt of whole blocks (a private copy).
      const bool whole_prompt_but_one =
          attached == static_cast<int>(r.tokens.size()) - 1 && r.tokens.size() % kBt == 0;
      ASSERT_TRUE(attached % kBt == 0 || whole_prompt_but_one) << attached;
      ASSERT_LT(attached, static_cast<int>(r.tokens.size()));
      hits += attached / kBt;
      r.slots = attached;
      r.next = attached;
      if (!cache_->CanAdmit(static_cast<int>(r.tokens.size()) - attached)) {
        Requeue(std::move(r));
        return;
      }
    }
    r.admitted = ++clock_;
    live_.push_back(std::move(r));
  }

  // Back to the head of the queue with no KV (recomputed or re-imported later).
  void Requeue(Req r) {
    cache_->FreeSequence(r.seq);
    r.seq = -1;
    r.slots = 0;
    r.next = 0;
    waiting_.push_front(std::move(r));
  }

  void Preempt(int i) {
    ++preemptions;
    Req r = std::move(live_[i]);
    live_.erase(live_.begin() + i);
    Requeue(std::move(r));
  }

  void Run() {
    if (live_.empty()) return;
    const int i = Rand(0, static_cast<int>(live_.size()) - 1);
    Req& r = live_[i];
    if (r.next == r.tokens.size()) {
      if (r.tokens.size() >= r.target) {
        cache_->FreeSequence(r.seq);
        live_.erase(live_.begin() + i);
        ++finished;
        return;
      }
      r.tokens.push_back(Rand(1, 2000));  // a sampled token
    }
    const int chunk = std::min<int>(Rand(1, 9), static_cast<int>(r.tokens.size() - r.next));
    const int cached_before = cache_->num_cached_blocks();
    if (!cache_->EnsureCapacity(r.seq, r.slots + chunk)) {
      ASSERT_EQ(cache_->capacity(r.seq) < r.slots + chunk, true);
      // Out of blocks mid-decode: preempt the newest sequence.
      const auto newest =
          std::max_element(live_.begin(), live_.end(),
                           [](const Req& a, const Req& b) { return a.admitted < b.admitted; });
      Preempt(static_cast<int>(newest - live_.begin()));
      return;
    }
    if (cache_->num_cached_blocks() < cached_before) ++evictions;
    for (int l = 0; l < kLayout.n_layers; ++l) {
      const KvLayerRef ref = cache_->Layer(r.seq, l);
      for (int s = r.slots; s < r.slots + chunk; ++s) {
        const uint64_t key =
            r.salt != 0 ? Mix(r.salt, s) : r.Key(s);  // untrimmed: slot s holds token s
        for (int h = 0; h < kLayout.n_kv_heads; ++h) {
          float* k = reinterpret_cast<float*>(ref.k_at(s, h, kLayout.head_dim));
          float* v = reinterpret_cast<float*>(ref.v_at(s, h, kLayout.head_dim));
          for (int e = 0; e < kLayout.head_dim; ++e) {
            k[e] = Val(key, l, h, 0, e);
            v[e] = Val(key, l, h, 1, e);
          }
        }
      }
    }
    ASSERT_TRUE(cache_->Append(
        r.seq, std::span<const int32_t>(r.tokens.data() + r.next, static_cast<size_t>(chunk))));
    r.next += chunk;
    r.slots += chunk;
  }

  void Cancel() {
    if (live_.empty()) return;
    const int i = Rand(0, static_cast<int>(live_.size()) - 1);
    cache_->FreeSequence(live_[i].seq);
    live_.erase(live_.begin() + i);
  }

  void BadAppend() {
    if (live_.empty()) return;
    const Req& r = live_[Rand(0, static_cast<int>(live_.size()) - 1)];
    const int room = cache_->capacity(r.seq) - r.slots;
    const std::vector<int32_t> ids(room + 1, 7);
    ASSERT_FALSE(cache_->Append(r.seq, ids));
    ASSERT_EQ(cache_->length(r.seq), r.slots);
  }

  std::mt19937 rng_;
  std::unique_ptr<PagedKvCache> cache_;
  std::vector<std::vector<int32_t>> bases_;
  std::vector<Req> live_;
  std::deque<Req> waiting_;
  int64_t clock_ = 0;
  uint64_t salts_ = 0;
};

TEST(PagedKvPropertyTest, RandomWorkloadsKeepDataAndCountsConsistent) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Harness h(seed);
    for (int step = 0; step < 4000; ++step) {
      h.Step();
      ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "step " << step;
      h.Verify();
      ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "step " << step;
    }
    // The workload really exercised sharing, eviction, preemption and import.
    EXPECT_GT(h.hits, 0);
    EXPECT_GT(h.evictions, 0);
    EXPECT_GT(h.preemptions, 0);
    EXPECT_GT(h.imports, 0);
    EXPECT_GT(h.finished, 0);
    h.Drain();
    ASSERT_TRUE(h.cache().CheckConsistency().ok()) << h.cache().CheckConsistency();
    EXPECT_EQ(h.cache().num_free_blocks(), kBlocks);  // free + cached, nothing referenced
    std::printf("seed %u: %d block hits, %d evictions, %d preemptions, %d imports, %d done\n", seed,
                h.hits, h.evictions, h.preemptions, h.imports, h.finished);
  }
}

}  // namespace
}  // namespace tripod::paged_kv_property_test
