// PagedKvCache: the decode worker's KV store. A pool of fixed-size blocks (block_tokens slots of
// every layer's K and V), one block table per sequence shared by all layers, reference-counted
// blocks and a prefix cache of full blocks (see prefix_cache.h). Positions are not the cache's
// business: a sequence's length is its number of filled slots, which for trimmed KV differs from
// its next RoPE position. Single-threaded: the decode engine's thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_layout.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv/kv_store.h"
#include "common/kv/prefix_cache.h"
#include "common/util/huge_pages.h"

namespace tripod {

struct PagedKvOptions {
  KvLayout layout;  // from the model (layers, kv heads, head_dim, dtype)
  int block_tokens = 16;
  size_t budget_bytes = 0;  // KV memory; num_blocks = budget / (block_tokens * bytes_per_token)
  double watermark = 0.01;  // fraction of all blocks admission keeps free
  // Where the blocks live: host memory (huge pages) when unset, else a GPU backend's
  // (DeviceKvMemory); the cache then copies blocks only through its copies.
  std::optional<KvMemory> device;
};

class PagedKvCache final : public KvStore {
 public:
  static absl::StatusOr<std::unique_ptr<PagedKvCache>> Create(const PagedKvOptions& o);

  KvLayout layout() const override { return layout_; }
  // ONE block table per sequence, shared by all layers; each layer has its own K and V arrays.
  // An unknown sequence or layer gives an empty ref (no blocks).
  KvLayerRef Layer(int32_t seq, int layer) override;
  const KvMemory* memory() const override { return device_ ? &*device_ : nullptr; }
  ~PagedKvCache() override;

  int block_tokens() const { return block_tokens_; }
  int num_blocks() const { return pool_.num_blocks(); }
  int num_free_blocks() const;  // free + cached-but-unreferenced (evictable)
  int num_cached_blocks() const { return prefix_.num_cached(); }  // published, referenced or not
  int watermark_blocks() const { return watermark_blocks_; }
  int refcount(int32_t block) const { return pool_.refcount(block); }  // for inspection
  size_t bytes() const { return bytes_; }                              // memory held for KV
  // What the cache really spends per token slot: bytes() / (num_blocks * block_tokens).
  size_t kv_bytes_per_token() const;
  // Blocks needed to hold n_slots slots.
  int BlocksFor(int n_slots) const {
    return static_cast<int>((int64_t{n_slots} + block_tokens_ - 1) / block_tokens_);
  }

  // A new, empty sequence whose KV the plan with ForwardPlan::KvKey() == plan_key fills.
  // Handles are never reused.
  int32_t NewSequence(uint64_t plan_key);
  bool HasSequence(int32_t seq) const { return seqs_.contains(seq); }
  int num_sequences() const { return static_cast<int>(seqs_.size()); }

  // Prefix cache: on an empty sequence, attaches the longest run of cached FULL blocks whose
  // chained hash (over all token ids up to and including the block, and plan_key) matches
  // tokens; never all of tokens (>= 1 token must still run). Returns the number of slots
  // attached (a multiple of block_tokens); 0 for an unknown or non-empty sequence.
  int AttachCachedPrefix(int32_t seq, std::span<const int32_t> tokens);

  // Admission check: could n_slots more slots be allocated, leaving the watermark free?
  bool CanAdmit(int n_slots) const;

  // Grows seq's block table so it holds n_slots slots in total. False (and nothing changes)
  // when the pool cannot supply the blocks even after evicting unreferenced cached blocks, or
  // the sequence is unknown.
  bool EnsureCapacity(int32_t seq, int n_slots);
  int capacity(int32_t seq) const;  // slots the block table holds (0 when unknown)

  // Slots [length, length + ids.size()) now hold these tokens' K/V (after a forward wrote
  // them); blocks that become full are hashed and published to the prefix cache. False (and
  // nothing changes) for an unknown sequence or when the slots exceed its capacity.
  bool Append(int32_t seq, std::span<const int32_t> ids);
  int length(int32_t seq) const;  // slots filled (0 when unknown)

  // A new sequence with src's KV (the choices of one prompt, n > 1): src's full blocks by
  // reference, its last partly filled block copied, since each will write into its own (the
  // copy-on-write of that block, done at once: the next step writes it anyway). Never more than
  // one block is copied, whatever the prompt's length. Blocks src holds past its length are not
  // taken. -1 (nothing changes) when src is unknown or no block is free for the copy.
  int32_t Fork(int32_t src);

  // Drops the sequence's references; published blocks stay cached (LRU) until evicted.
  // Unknown handles are ignored.
  void FreeSequence(int32_t seq);

  // KV computed elsewhere (a prefill worker's output, maybe trimmed) into an empty sequence:
  // allocates, copies (converting dtype), sets length = s.n_slots and each layer's first visible
  // slot to s.layer_first's. Untrimmed snapshots with
  // token_ids and plan_key == the sequence's key publish their full blocks; trimmed ones never.
  absl::Status Import(int32_t seq, const KvSnapshot& s);

  // A view of seq's blocks for a writer on another thread (a KV transfer landing in a
  // reservation): it holds a COPY of the block table, so that the writer never reads the cache's
  // maps. Its Layer() answers for seq only. Valid while the cache lives and seq holds those
  // blocks: the owner must neither free nor run the sequence while a writer uses it. Null for an
  // unknown sequence.
  std::unique_ptr<KvStore> WriteView(int32_t seq);

  // Finishes a sequence whose slots [0, n_slots) someone else wrote (through WriteView): its
  // length becomes n_slots. As Import: token_ids (the n_slots tokens, untrimmed KV only) with
  // filled_by_plan_key == the sequence's key publish its full blocks to the prefix cache; empty
  // token_ids (trimmed KV, unknown tokens) or another plan's KV are never shared. The sequence
  // must be empty (length 0) with capacity for n_slots.
  // layer_first (trimmed KV with a budget per layer, [n_layers]): each layer's first filled slot;
  // attention then never sees the slots below it (KvLayerRef::first_visible_slot).
  absl::Status FinishExternalFill(int32_t seq, int n_slots, std::span<const int32_t> token_ids,
                                  uint64_t filled_by_plan_key,
                                  std::span<const int32_t> layer_first = {});

  // Refcounts vs block tables, free + cached + owned == all, shared blocks are full.
  absl::Status CheckConsistency() const;

 private:
  struct Seq {
    uint64_t plan_key = 0;
    std::vector<int32_t> blocks;  // the block table
    int length = 0;
    // Per layer, the first slot attention sees (PyramidKV's trimmed KV); empty: 0 everywhere.
    std::vector<int32_t> first_visible;
    // Prefix-cache bookkeeping: token ids of slots [0, length) while the KV may be published.
    bool publishable = true;
    std::vector<int32_t> tokens;
    int chained_blocks = 0;  // leading full blocks already hashed (own or attached)
    uint64_t last_hash = 0;  // chain hash of block chained_blocks - 1 (0 before the first)
    uint64_t last_gen = 0;   // prefix-cache entry of that block's content
  };

  PagedKvCache(const KvLayout& layout, int block_tokens, int num_blocks);
  Seq* Find(int32_t seq);
  const Seq* Find(int32_t seq) const;
  int32_t AllocateBlock();  // evicts an unreferenced cached block when none is free; -1 if none
  void ReleaseBlock(int32_t block);
  void CopyBlock(int32_t to, int32_t from);  // every layer's K and V
  void PublishFullBlocks(Seq& s);
  void Fail(absl::Status st);  // records an internal error for CheckConsistency

  KvLayout layout_;
  int block_tokens_ = 0;
  size_t block_bytes_ = 0;  // one block of one layer's K (or V)
  size_t array_bytes_ = 0;  // num_blocks * block_bytes_
  size_t bytes_ = 0;
  int watermark_blocks_ = 0;
  HugePageBuffer storage_;  // [layer][K|V][block]
  std::optional<KvMemory> device_;
  uint8_t* device_storage_ = nullptr;  // the same in device memory (then storage_ is empty)
  uint8_t* base_ = nullptr;            // whichever holds the blocks
  BlockPool pool_;
  PrefixCache prefix_;
  absl::flat_hash_map<int32_t, Seq> seqs_;
  int32_t next_seq_ = 0;
  absl::Status internal_error_;
};

}  // namespace tripod
