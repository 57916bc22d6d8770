// PagedKvCache; see paged_kv_cache.h.
#include "common/kv/paged_kv_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_dtype.h"

namespace tripod {

PagedKvCache::PagedKvCache(const KvLayout& layout, int block_tokens, int num_blocks)
    : layout_(layout), block_tokens_(block_tokens), pool_(num_blocks), prefix_(num_blocks) {}

absl::StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(const PagedKvOptions& o) {
  const KvLayout& l = o.layout;
  if (l.n_layers <= 0 || l.n_kv_heads <= 0 || l.head_dim <= 0) {
    return absl::InvalidArgumentError(
        "paged KV cache: the layout needs layers, KV heads and a "
        "head dimension");
  }
  if (o.block_tokens <= 0 || o.block_tokens > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged KV cache: block_tokens ", o.block_tokens, " is not in [1, 4096]"));
  }
  if (!(o.watermark >= 0 && o.watermark < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged KV cache: watermark ", o.watermark, " is not in [0, 1)"));
  }
  if (absl::Status s = ValidateKvLayout(l); !s.ok()) return s;
  const size_t per_block = size_t{1} * o.block_tokens * l.bytes_per_token();
  const size_t n = o.budget_bytes / per_block;
  if (n == 0) {
    return absl::InvalidArgumentError(absl::StrCat("paged KV cache: a budget of ", o.budget_bytes,
                                                   " bytes holds no block of ", per_block,
                                                   " bytes"));
  }
  if (n >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError("paged KV cache: too many blocks for the budget");
  }
  const int num_blocks = static_cast<int>(n);
  std::unique_ptr<PagedKvCache> c(new PagedKvCache(l, o.block_tokens, num_blocks));
  c->block_bytes_ = size_t{1} * l.n_kv_heads * o.block_tokens * KvRowBytes(l.dtype, l.head_dim);
  c->array_bytes_ = c->block_bytes_ * num_blocks;
  c->bytes_ = c->array_bytes_ * 2 * l.n_layers;
  c->watermark_blocks_ = static_cast<int>(o.watermark * num_blocks);
  if (o.device) {
    c->device_storage_ = o.device->alloc(c->bytes_);
    if (c->device_storage_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("paged KV cache: ", c->bytes_, " bytes of KV do not fit in device memory"));
    }
    c->device_ = o.device;
    c->base_ = c->device_storage_;
    return c;
  }
  // On huge pages (see huge_pages.h); zero pages until written, and a slot is written before
  // any query may read it.
  absl::StatusOr<HugePageBuffer> mem = HugePageBuffer::Allocate(c->bytes_);
  if (!mem.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("paged KV cache: cannot allocate ", c->bytes_,
                                                     " bytes: ", mem.status().message()));
  }
  c->storage_ = std::move(mem).value();
  c->base_ = c->storage_.data();
  return c;
}

PagedKvCache::~PagedKvCache() {
  if (device_storage_ != nullptr) device_->free(device_storage_);
}

size_t PagedKvCache::kv_bytes_per_token() const {
  return bytes_ / (size_t{1} * num_blocks() * block_tokens_);
}

int PagedKvCache::num_free_blocks() const { return pool_.num_free() + prefix_.num_evictable(); }

PagedKvCache::Seq* PagedKvCache::Find(int32_t seq) {
  const auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

const PagedKvCache::Seq* PagedKvCache::Find(int32_t seq) const {
  const auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

void PagedKvCache::Fail(absl::Status st) {
  if (internal_error_.ok()) internal_error_ = std::move(st);
}

KvLayerRef PagedKvCache::Layer(int32_t seq, int layer) {
  KvLayerRef r;
  const Seq* s = Find(seq);
  if (s == nullptr || layer < 0 || layer >= layout_.n_layers) return r;
  uint8_t* base = base_ + size_t{2} * layer * array_bytes_;
  r.k_base = base;
  r.v_base = base + array_bytes_;
  r.block_ids = s->blocks.data();
  r.n_blocks = static_cast<int>(s->blocks.size());
  r.block_tokens = block_tokens_;
  r.block_bytes = block_bytes_;
  r.dtype = layout_.dtype;
  if (!s->first_visible.empty()) r.first_visible_slot = s->first_visible[layer];
  return r;
}

int32_t PagedKvCache::NewSequence(uint64_t plan_key) {
  const int32_t id = next_seq_++;
  seqs_[id].plan_key = plan_key;
  return id;
}

int PagedKvCache::AttachCachedPrefix(int32_t seq, std::span<const int32_t> tokens) {
  Seq* s = Find(seq);
  if (s == nullptr || s->length != 0 || !s->blocks.empty() || !s->publishable) return 0;
  const size_t bt = block_tokens_;
  const size_t max_blocks = tokens.empty() ? 0 : (tokens.size() - 1) / bt;
  uint64_t hash = 0, gen = 0;
  size_t k = 0;
  for (; k < max_blocks; ++k) {
    const std::span<const int32_t> blk = tokens.subspan(k * bt, bt);
    const uint64_t h = PrefixCache::ChainHash(hash, s->plan_key, blk);
    const std::optional<PrefixCache::Hit> hit = prefix_.Find(h, gen, s->plan_key, blk);
    if (!hit) break;
    if (pool_.refcount(hit->block) == 0) prefix_.OnReferenced(hit->block);
    if (absl::Status st = pool_.Ref(hit->block); !st.ok()) {
      Fail(std::move(st));
      break;
    }
    s->blocks.push_back(hit->block);
    hash = h;
    gen = hit->gen;
  }
  s->length = static_cast<int>(k * bt);
  s->chained_blocks = static_cast<int>(k);
  s->last_hash = hash;
  s->last_gen = gen;
  // A prompt of whole blocks, all cached: the last block cannot be shared (its last slot must be
  // written again by the token that runs), so copy it into a private block and reuse all but
  // that slot. Without this a repeated prompt recomputes a whole block instead of one token.
  if (k == max_blocks && !tokens.empty() && tokens.size() % bt == 0) {
    const std::span<const int32_t> blk = tokens.subspan(k * bt, bt);
    const uint64_t h = PrefixCache::ChainHash(hash, s->plan_key, blk);
    if (const std::optional<PrefixCache::Hit> hit = prefix_.Find(h, gen, s->plan_key, blk)) {
      // Hold the source so that allocating the copy cannot evict it.
      if (pool_.refcount(hit->block) == 0) prefix_.OnReferenced(hit->block);
      if (absl::Status st = pool_.Ref(hit->block); !st.ok()) {
        Fail(std::move(st));
      } else {
        const int32_t copy = AllocateBlock();
        if (copy >= 0) {
          CopyBlock(copy, hit->block);
          s->blocks.push_back(copy);
          s->length = static_cast<int>(tokens.size() - 1);
        }
        ReleaseBlock(hit->block);
      }
    }
  }
  s->tokens.assign(tokens.begin(), tokens.begin() + s->length);
  return s->length;
}

void PagedKvCache::CopyBlock(int32_t to_block, int32_t from_block) {
  for (int layer = 0; layer < layout_.n_layers; ++layer) {
    uint8_t* base = base_ + size_t{2} * layer * array_bytes_;
    for (uint8_t* arr : {base, base + array_bytes_}) {
      uint8_t* to = arr + size_t{1} * to_block * block_bytes_;
      const uint8_t* from = arr + size_t{1} * from_block * block_bytes_;
      if (device_) {
        device_->copy(to, from, block_bytes_);
      } else {
        std::memcpy(to, from, block_bytes_);
      }
    }
  }
}

int32_t PagedKvCache::Fork(int32_t src) {
  const Seq* s = Find(src);
  if (s == nullptr) return -1;
  const int full = s->length / block_tokens_;
  const bool partial = s->length % block_tokens_ != 0;
  int32_t copy = -1;
  if (partial) {
    // Allocating may evict an unreferenced cached block: never one of src's, which it holds.
    copy = AllocateBlock();
    if (copy < 0) return -1;
    CopyBlock(copy, s->blocks[full]);
  }
  Seq child = *s;
  child.blocks.resize(full);
  for (const int32_t b : child.blocks) {
    if (absl::Status st = pool_.Ref(b); !st.ok()) Fail(std::move(st));
  }
  if (partial) child.blocks.push_back(copy);
  const int32_t id = next_seq_++;
  seqs_[id] = std::move(child);
  return id;
}

bool PagedKvCache::CanAdmit(int n_slots) const {
  return num_free_blocks() - BlocksFor(std::max(n_slots, 0)) >= watermark_blocks_;
}

int32_t PagedKvCache::AllocateBlock() {
  int32_t b = pool_.Allocate();
  if (b >= 0) return b;
  const int32_t evicted = prefix_.EvictLru();
  if (evicted < 0) return -1;
  if (absl::Status st = pool_.Free(evicted); !st.ok()) {
    Fail(std::move(st));
    return -1;
  }
  return pool_.Allocate();
}

void PagedKvCache::ReleaseBlock(int32_t block) {
  if (absl::Status st = pool_.Unref(block); !st.ok()) {
    Fail(std::move(st));
    return;
  }
  if (pool_.refcount(block) != 0) return;
  if (prefix_.cached(block)) {
    prefix_.OnUnreferenced(block);
  } else if (absl::Status st = pool_.Free(block); !st.ok()) {
    Fail(std::move(st));
  }
}

bool PagedKvCache::EnsureCapacity(int32_t seq, int n_slots) {
  Seq* s = Find(seq);
  if (s == nullptr || n_slots < 0) return false;
  const int need = BlocksFor(n_slots) - static_cast<int>(s->blocks.size());
  if (need <= 0) return true;
  if (need > num_free_blocks()) return false;
  for (int i = 0; i < need; ++i) {
    const int32_t b = AllocateBlock();
    if (b < 0) {
      // Cannot happen when the count above is right; undo so that nothing changes.
      Fail(absl::InternalError("paged KV cache: free-block count was wrong"));
      for (int j = 0; j < i; ++j) {
        ReleaseBlock(s->blocks.back());
        s->blocks.pop_back();
      }
      return false;
    }
    s->blocks.push_back(b);
  }
  return true;
}

int PagedKvCache::capacity(int32_t seq) const {
  const Seq* s = Find(seq);
  return s == nullptr ? 0 : static_cast<int>(s->blocks.size()) * block_tokens_;
}

int PagedKvCache::length(int32_t seq) const {
  const Seq* s = Find(seq);
  return s == nullptr ? 0 : s->length;
}

void PagedKvCache::PublishFullBlocks(Seq& s) {
  const size_t bt = block_tokens_;
  while (s.publishable &&
         static_cast<size_t>(s.chained_blocks + 1) * bt <= static_cast<size_t>(s.length)) {
    const size_t k = s.chained_blocks;
    const std::span<const int32_t> blk(s.tokens.data() + k * bt, bt);
    const uint64_t h = PrefixCache::ChainHash(s.last_hash, s.plan_key, blk);
    const uint64_t gen = prefix_.Publish(s.blocks[k], h, s.last_gen, s.plan_key, blk);
    if (gen == 0) {
      // A hash collision with other content: this sequence's later blocks stay private.
      s.publishable = false;
      s.tokens = {};
      return;
    }
    ++s.chained_blocks;
    s.last_hash = h;
    s.last_gen = gen;
  }
}

bool PagedKvCache::Append(int32_t seq, std::span<const int32_t> ids) {
  Seq* s = Find(seq);
  if (s == nullptr) return false;
  if (static_cast<size_t>(s->length) + ids.size() > s->blocks.size() * block_tokens_) return false;
  s->length += static_cast<int>(ids.size());
  if (s->publishable) {
    s->tokens.insert(s->tokens.end(), ids.begin(), ids.end());
    PublishFullBlocks(*s);
  }
  return true;
}

void PagedKvCache::FreeSequence(int32_t seq) {
  Seq* s = Find(seq);
  if (s == nullptr) return;
  // Last block first: the tail of a prefix is evicted before its head, which later blocks need.
  for (auto it = s->blocks.rbegin(); it != s->blocks.rend(); ++it) ReleaseBlock(*it);
  seqs_.erase(seq);
}

absl::Status PagedKvCache::Import(int32_t seq, const KvSnapshot& snap) {
  Seq* s = Find(seq);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("KV import: no sequence ", seq));
  if (s->length != 0 || !s->blocks.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV import: sequence ", seq, " is not empty"));
  }
  const KvLayout& l = snap.layout;
  if (l.n_layers != layout_.n_layers || l.n_kv_heads != layout_.n_kv_heads ||
      l.head_dim != layout_.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV import: a snapshot of ", l.n_layers, " layers x ", l.n_kv_heads,
                     " heads x ", l.head_dim, " does not fit a cache of ", layout_.n_layers, " x ",
                     layout_.n_kv_heads, " x ", layout_.head_dim));
  }
  int32_t max_position = snap.n_slots;
  if (snap.trimmed()) {
    constexpr int32_t kMaxPosition = 1 << 24;
    const int32_t top = *std::max_element(snap.positions.begin(), snap.positions.end());
    if (top >= kMaxPosition) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV import: position ", top, " is beyond ", kMaxPosition));
    }
    max_position = top + 1;
  }
  if (absl::Status st = ValidateSnapshot(snap, max_position); !st.ok()) return st;
  if (!EnsureCapacity(seq, snap.n_slots)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV import: ", BlocksFor(snap.n_slots), " blocks needed, ", num_free_blocks(), " free"));
  }
  if (absl::Status st = WriteSnapshot(snap, *this, seq); !st.ok()) {
    s = Find(seq);
    for (auto it = s->blocks.rbegin(); it != s->blocks.rend(); ++it) ReleaseBlock(*it);
    s->blocks.clear();
    return st;
  }
  s = Find(seq);
  s->length = snap.n_slots;
  s->first_visible = snap.layer_first;
  if (!snap.trimmed() && !snap.token_ids.empty() && snap.plan_key == s->plan_key) {
    s->tokens = snap.token_ids;
    PublishFullBlocks(*s);
  } else {
    // Trimmed KV (slots are not prompt positions) or KV of unknown tokens is never shared.
    s->publishable = false;
    s->tokens = {};
  }
  return absl::OkStatus();
}

namespace {

// The store a transfer writes through: the cache's memory, a private copy of one block table.
class BlockTableView final : public KvStore {
 public:
  BlockTableView(const KvLayout& layout, const KvMemory* memory, int32_t seq,
                 std::vector<int32_t> blocks, std::vector<KvLayerRef> layers)
      : layout_(layout),
        memory_(memory),
        seq_(seq),
        blocks_(std::move(blocks)),
        layers_(std::move(layers)) {
    for (KvLayerRef& r : layers_) r.block_ids = blocks_.data();
  }
  KvLayout layout() const override { return layout_; }
  KvLayerRef Layer(int32_t seq, int layer) override {
    if (seq != seq_ || layer < 0 || layer >= static_cast<int>(layers_.size())) return {};
    return layers_[layer];
  }
  const KvMemory* memory() const override { return memory_; }

 private:
  KvLayout layout_;
  const KvMemory* memory_;
  int32_t seq_;
  std::vector<int32_t> blocks_;
  std::vector<KvLayerRef> layers_;
};

}  // namespace

std::unique_ptr<KvStore> PagedKvCache::WriteView(int32_t seq) {
  const Seq* s = Find(seq);
  if (s == nullptr) return nullptr;
  std::vector<KvLayerRef> layers;
  layers.reserve(layout_.n_layers);
  for (int l = 0; l < layout_.n_layers; ++l) layers.push_back(Layer(seq, l));
  return std::make_unique<BlockTableView>(layout_, memory(), seq, s->blocks, std::move(layers));
}

absl::Status PagedKvCache::FinishExternalFill(int32_t seq, int n_slots,
                                              std::span<const int32_t> token_ids,
                                              uint64_t filled_by_plan_key,
                                              std::span<const int32_t> layer_first) {
  Seq* s = Find(seq);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("KV fill: no sequence ", seq));
  if (s->length != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV fill: sequence ", seq, " already holds ", s->length, " slots"));
  }
  const int64_t cap = int64_t{1} * s->blocks.size() * block_tokens_;
  if (n_slots < 0 || n_slots > cap) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV fill: ", n_slots, " slots for a capacity of ", cap));
  }
  if (!token_ids.empty() && token_ids.size() != static_cast<size_t>(n_slots)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV fill: ", token_ids.size(), " token ids for ", n_slots, " slots"));
  }
  if (!layer_first.empty()) {
    if (layer_first.size() != static_cast<size_t>(layout_.n_layers) || !token_ids.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV fill: ", layer_first.size(), " per-layer first slots for ",
                       layout_.n_layers, " layers (trimmed KV only, no token ids)"));
    }
    for (int32_t f : layer_first) {
      if (f < 0 || f > n_slots) {
        return absl::InvalidArgumentError(
            absl::StrCat("KV fill: a layer's first slot ", f, " is outside [0, ", n_slots, "]"));
      }
    }
    s->first_visible.assign(layer_first.begin(), layer_first.end());
  }
  s->length = n_slots;
  if (!token_ids.empty() && filled_by_plan_key == s->plan_key && s->publishable) {
    s->tokens.assign(token_ids.begin(), token_ids.end());
    PublishFullBlocks(*s);
  } else {
    // As Import: KV of unknown tokens, trimmed KV or another plan's KV is never shared.
    s->publishable = false;
    s->tokens = {};
  }
  return absl::OkStatus();
}

absl::Status PagedKvCache::CheckConsistency() const {
  if (!internal_error_.ok()) return internal_error_;
  if (absl::Status st = pool_.CheckConsistency(); !st.ok()) return st;
  if (absl::Status st = prefix_.CheckConsistency(pool_); !st.ok()) return st;
  const int n = num_blocks();
  std::vector<int32_t> refs(n, 0);
  std::vector<int32_t> stamp(n, -1);
  for (const auto& [id, s] : seqs_) {
    const int64_t cap = int64_t{1} * s.blocks.size() * block_tokens_;
    if (s.length < 0 || s.length > cap) {
      return absl::InternalError(
          absl::StrCat("sequence ", id, " has length ", s.length, " but capacity ", cap));
    }
    if (s.publishable && s.tokens.size() != static_cast<size_t>(s.length)) {
      return absl::InternalError(absl::StrCat("sequence ", id, " tracks ", s.tokens.size(),
                                              " tokens for ", s.length, " slots"));
    }
    if (int64_t{1} * s.chained_blocks * block_tokens_ > s.length) {
      return absl::InternalError(absl::StrCat("sequence ", id, " hashed a partial block"));
    }
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      const int32_t b = s.blocks[i];
      if (!pool_.valid(b) || pool_.is_free(b)) {
        return absl::InternalError(absl::StrCat("sequence ", id, " holds free/bad block ", b));
      }
      if (stamp[b] == id) {
        return absl::InternalError(absl::StrCat("sequence ", id, " holds block ", b, " twice"));
      }
      stamp[b] = id;
      ++refs[b];
    }
  }
  int owned = 0, leaked = 0;
  for (int b = 0; b < n; ++b) {
    if (refs[b] != pool_.refcount(b)) {
      return absl::InternalError(absl::StrCat("block ", b, " has refcount ", pool_.refcount(b),
                                              " but ", refs[b], " block-table entries"));
    }
    if (refs[b] > 0) ++owned;
    if (refs[b] == 0 && !pool_.is_free(b) && !prefix_.cached(b)) ++leaked;
  }
  if (leaked != 0 || pool_.num_free() + prefix_.num_evictable() + owned != n) {
    return absl::InternalError(absl::StrCat("blocks: ", pool_.num_free(), " free + ",
                                            prefix_.num_evictable(), " cached + ", owned,
                                            " owned != ", n, " (", leaked, " leaked)"));
  }
  // No copy-on-write is needed: a block that is not full (still written) is never shared.
  for (const auto& [id, s] : seqs_) {
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      if (static_cast<int64_t>(i + 1) * block_tokens_ <= s.length) continue;
      const int32_t b = s.blocks[i];
      if (pool_.refcount(b) != 1 || prefix_.cached(b)) {
        return absl::InternalError(absl::StrCat("sequence ", id, " writes into shared block ", b));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tripod
