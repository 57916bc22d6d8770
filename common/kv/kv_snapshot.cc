// KvSnapshot export, import and validation; see kv_snapshot.h.
#include "common/kv/kv_snapshot.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_dtype.h"
#include "common/kv/kv_staging.h"
#include "common/model/quant_types.h"

namespace tripod {

size_t KvSnapshot::kept_bytes() const {
  size_t slots = 0;
  for (int layer = 0; layer < layout.n_layers; ++layer) slots += n_slots - first_slot(layer);
  return 2 * slots * layout.n_kv_heads * row_bytes();
}

absl::Status ValidateSnapshot(const KvSnapshot& s, int32_t max_position) {
  const KvLayout& l = s.layout;
  if (l.n_layers <= 0 || l.n_kv_heads <= 0 || l.head_dim <= 0 || s.n_slots < 0) {
    return absl::InvalidArgumentError("KV snapshot: empty or negative shape");
  }
  if (absl::Status st = ValidateKvLayout(l); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("KV snapshot: ", st.message()));
  }
  const size_t want = size_t{1} * l.n_layers * l.n_kv_heads * s.n_slots * s.row_bytes();
  if (s.k.size() != want || s.v.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("KV snapshot: K/V hold ", s.k.size(), "/",
                                                   s.v.size(), " bytes, the shape needs ", want));
  }
  if (!s.token_ids.empty() && static_cast<int>(s.token_ids.size()) != s.n_slots) {
    return absl::InvalidArgumentError("KV snapshot: token ids do not match the slot count");
  }
  if (s.positions.empty()) {
    if (!s.layer_first.empty()) {
      return absl::InvalidArgumentError("KV snapshot: per-layer first slots on untrimmed KV");
    }
    return absl::OkStatus();
  }
  if (s.positions.size() != size_t{1} * l.n_layers * l.n_kv_heads * s.n_slots) {
    return absl::InvalidArgumentError("KV snapshot: positions do not match the shape");
  }
  if (!s.layer_first.empty()) {
    if (s.layer_first.size() != static_cast<size_t>(l.n_layers)) {
      return absl::InvalidArgumentError(absl::StrCat("KV snapshot: ", s.layer_first.size(),
                                                     " per-layer first slots for ", l.n_layers,
                                                     " layers"));
    }
    for (int layer = 0; layer < l.n_layers; ++layer) {
      if (s.layer_first[layer] < 0 || s.layer_first[layer] > s.n_slots) {
        return absl::InvalidArgumentError(absl::StrCat("KV snapshot: layer ", layer,
                                                       " starts at slot ", s.layer_first[layer],
                                                       ", outside [0, ", s.n_slots, "]"));
      }
    }
  }
  std::vector<uint8_t> seen(static_cast<size_t>(max_position > 0 ? max_position : 0));
  for (int lh = 0; lh < l.n_layers * l.n_kv_heads; ++lh) {
    std::fill(seen.begin(), seen.end(), 0);
    const int first = s.first_slot(lh / l.n_kv_heads);
    for (int j = 0; j < s.n_slots; ++j) {
      const int32_t p = s.positions[size_t{1} * lh * s.n_slots + j];
      if (j < first) {
        if (p != -1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "KV snapshot: layer ", lh / l.n_kv_heads, " slot ", j,
              " is padding (below the layer's first slot ", first, ") but names position ", p));
        }
        continue;
      }
      if (p < 0 || p >= max_position) {
        return absl::InvalidArgumentError(
            absl::StrCat("KV snapshot: position ", p, " outside [0, ", max_position, ")"));
      }
      if (seen[p]++) {
        return absl::InvalidArgumentError(absl::StrCat("KV snapshot: layer ", lh / l.n_kv_heads,
                                                       " head ", lh % l.n_kv_heads,
                                                       " keeps position ", p, " twice"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KvSnapshot> ExportSnapshot(KvStore& store, int32_t kv_seq, int n_slots) {
  if (n_slots < 0) return absl::InvalidArgumentError("KV export: negative slot count");
  KvSnapshot s;
  s.layout = store.layout();
  s.n_slots = n_slots;
  const KvLayout& l = s.layout;
  const size_t bytes = size_t{1} * l.n_layers * l.n_kv_heads * n_slots * s.row_bytes();
  s.k.resize(bytes);
  s.v.resize(bytes);
  for (int layer = 0; layer < l.n_layers; ++layer) {
    const KvLayerRef ref = store.Layer(kv_seq, layer);
    if (int64_t{ref.n_blocks} * ref.block_tokens < n_slots) {
      return absl::OutOfRangeError(absl::StrCat("KV export: sequence holds ",
                                                ref.n_blocks * ref.block_tokens,
                                                " slots, asked for ", n_slots));
    }
    const StagedKvLayer staged(ref, store.memory(), 0, n_slots, StagedKvLayer::Use::kRead);
    const KvLayerRef& in = staged.ref();
    for (int h = 0; h < l.n_kv_heads; ++h) {
      for (int j = 0; j < n_slots; ++j) {
        in.ReadK(j, h, l.head_dim, s.k.data() + s.offset(layer, h, j));
        std::memcpy(s.v.data() + s.offset(layer, h, j), in.v_at(j, h, l.head_dim), s.row_bytes());
      }
    }
  }
  return s;
}

absl::Status WriteSnapshot(const KvSnapshot& s, KvStore& store, int32_t kv_seq) {
  const KvLayout dst = store.layout();
  const KvLayout& src = s.layout;
  if (dst.n_layers != src.n_layers || dst.n_kv_heads != src.n_kv_heads ||
      dst.head_dim != src.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV snapshot of ", src.n_layers, " layers x ", src.n_kv_heads, " heads x ", src.head_dim,
        " does not fit a cache of ", dst.n_layers, " x ", dst.n_kv_heads, " x ", dst.head_dim));
  }
  for (int layer = 0; layer < src.n_layers; ++layer) {
    const KvLayerRef ref = store.Layer(kv_seq, layer);
    if (int64_t{ref.n_blocks} * ref.block_tokens < s.n_slots) {
      return absl::OutOfRangeError("KV import: the sequence has no room for the snapshot");
    }
    std::vector<uint8_t> row(KvRowBytes(dst.dtype, dst.head_dim));
    StagedKvLayer staged(ref, store.memory(), s.first_slot(layer), s.n_slots,
                         StagedKvLayer::Use::kWrite);
    const KvLayerRef& out = staged.ref();
    for (int h = 0; h < src.n_kv_heads; ++h) {
      for (int j = s.first_slot(layer); j < s.n_slots; ++j) {
        ConvertKvRow(s.k.data() + s.offset(layer, h, j), src.dtype, row.data(), dst.dtype,
                     dst.head_dim);
        out.WriteK(j, h, dst.head_dim, row.data());
        ConvertKvRow(s.v.data() + s.offset(layer, h, j), src.dtype, out.v_at(j, h, dst.head_dim),
                     dst.dtype, dst.head_dim);
      }
    }
    staged.Commit();
  }
  return absl::OkStatus();
}

}  // namespace tripod
