// StepTape and StepGraphCache; see step_tape.h.
#include "common/compute/step_tape.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "absl/hash/hash.h"

namespace tripod {
namespace {

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

void StepTape::Begin() {
  recording_ = true;
  ops_.clear();
  staged_.clear();
  tables_.clear();
  fixups_.clear();
  scratch_ = 0;
  layout_ = Layout{};
}

uint64_t StepTape::Stage(const void* p, size_t bytes) {
  const size_t off = AlignUp(staged_.size(), 16);
  staged_.resize(off + bytes);
  if (bytes > 0) std::memcpy(staged_.data() + off, p, bytes);
  return off;
}

uint64_t StepTape::StageTable(std::span<const int32_t> ids) {
  const size_t off = AlignUp(tables_.size(), 16);
  tables_.resize(off + ids.size_bytes());
  if (!ids.empty()) std::memcpy(tables_.data() + off, ids.data(), ids.size_bytes());
  return off;
}

uint64_t StepTape::Scratch(size_t bytes) {
  const size_t off = AlignUp(scratch_, kRegionAlign);
  scratch_ = off + bytes;
  return off;
}

void StepTape::PointAt(uint64_t field, StepRegion region, uint64_t off) {
  fixups_.push_back(Fixup{field, region, off});
}

StepTape::Layout StepTape::End() {
  recording_ = false;
  Layout l;
  l.tables_at = AlignUp(staged_.size(), kRegionAlign);
  l.upload_bytes = l.tables_at + tables_.size();
  l.scratch_at = AlignUp(l.upload_bytes, kRegionAlign);
  l.total_bytes = std::max<size_t>(l.scratch_at + scratch_, kRegionAlign);
  layout_ = l;
  return l;
}

void StepTape::WriteImage(uint64_t base, uint8_t* dst) const {
  const Layout& l = layout_;
  if (!staged_.empty()) std::memcpy(dst, staged_.data(), staged_.size());
  std::memset(dst + staged_.size(), 0, l.tables_at - staged_.size());
  if (!tables_.empty()) std::memcpy(dst + l.tables_at, tables_.data(), tables_.size());
  for (const Fixup& f : fixups_) {
    uint64_t at = base + f.off;
    if (f.region == StepRegion::kTables) at += l.tables_at;
    if (f.region == StepRegion::kScratch) at += l.scratch_at;
    std::memcpy(dst + f.field, &at, sizeof(at));
  }
}

uint64_t StepTape::Hash() const {
  return absl::HashOf(
      std::string_view(reinterpret_cast<const char*>(ops_.data()), ops_.size() * sizeof(StepOp)));
}

StepGraphCache::StepGraphCache(size_t capacity, std::function<void(Exec)> destroy)
    : capacity_(std::max<size_t>(capacity, 1)), destroy_(std::move(destroy)) {
  entries_.reserve(capacity_ + 1);  // Entry pointers stay valid: never more than this
}

StepGraphCache::~StepGraphCache() { Clear(); }

void StepGraphCache::Release(Entry& e) {
  if (e.exec != nullptr && destroy_) destroy_(e.exec);
  e.exec = nullptr;
}

StepGraphCache::Hit StepGraphCache::Lookup(const std::vector<StepOp>& ops, uint64_t hash,
                                           std::span<const uint64_t> bases) {
  ++tick_;
  Entry* e = nullptr;
  for (Entry& x : entries_) {
    if (x.hash == hash) {
      e = &x;
      break;
    }
  }
  const bool same = e != nullptr && e->ops == ops &&
                    std::equal(e->bases.begin(), e->bases.end(), bases.begin(), bases.end());
  if (e != nullptr && !same) {
    // Another step with this hash, or this step over other addresses: start over.
    Release(*e);
    *e = Entry{};
  }
  if (e == nullptr) {
    if (entries_.size() == capacity_) {
      auto lru =
          std::min_element(entries_.begin(), entries_.end(),
                           [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
      Release(*lru);
      *lru = Entry{};
      e = &*lru;
    } else {
      e = &entries_.emplace_back();
    }
  }
  if (e->seen == 0) {
    e->hash = hash;
    e->ops = ops;
    e->bases.assign(bases.begin(), bases.end());
  }
  ++e->seen;
  e->last_use = tick_;
  last_ = e;
  if (e->exec != nullptr) return Hit{Action::kReplay, e->exec};
  if (e->seen >= 2 && !e->no_graph) return Hit{Action::kCapture, nullptr};
  return Hit{Action::kRun, nullptr};
}

void StepGraphCache::Store(Exec exec) {
  if (last_ == nullptr) return;
  Release(*last_);
  last_->exec = exec;
  last_->no_graph = exec == nullptr;
}

void StepGraphCache::Clear() {
  for (Entry& e : entries_) Release(e);
  entries_.clear();
  last_ = nullptr;
}

size_t StepGraphCache::graphs() const {
  return static_cast<size_t>(std::count_if(entries_.begin(), entries_.end(),
                                           [](const Entry& e) { return e.exec != nullptr; }));
}

}  // namespace tripod
