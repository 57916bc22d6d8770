// The host side of replaying a decode step as a CUDA graph (the CUDA backend's step_graph.h):
// StepTape records one step's ops with everything that changes from step to step (token ids,
// RoPE angles, the K/V batches' slots and block tables) staged as bytes, and StepGraphCache says
// whether a step was seen before, so that its captured graph can run again with new bytes.
// No CUDA here: both are plain bookkeeping, tested on any machine.
//
// Why a tape: a graph bakes each launch's parameters in. A step whose launches differ only in
// staged bytes (uploaded before each replay into one device arena) is the same graph; the tape
// makes "the same" exact: the ops compare equal, word for word, and so do the addresses the
// graph would hold besides them (the arena's, the GEMM scratch's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace tripod {

// One recorded op: a kind the backend defines and its arguments as words (pointers, integers,
// float bits). Bit i of arena_args marks a[i] as an offset into the staged bytes, made an
// address when the op is launched.
struct StepOp {
  uint32_t kind = 0;
  uint32_t arena_args = 0;
  uint64_t a[11] = {};
  bool operator==(const StepOp&) const = default;
};

// Where a staged pointer points: the staged bytes (uploaded), the block tables (uploaded, after
// them), or scratch that only the device writes (after both, never uploaded).
enum class StepRegion : uint8_t { kStaged, kTables, kScratch };

class StepTape {
 public:
  static constexpr size_t kRegionAlign = 256;

  // Starts a step: drops the last one's ops and bytes.
  void Begin();
  bool recording() const { return recording_; }
  // Copies bytes into the staged region; returns their offset (16-byte aligned).
  uint64_t Stage(const void* p, size_t bytes);
  // Copies a block table into the tables region; returns its offset there. Tables are kept apart
  // because their length grows with the context: the staged offsets, which the ops hold, stay
  // the same from step to step.
  uint64_t StageTable(std::span<const int32_t> ids);
  // Reserves device scratch (256-byte aligned); returns its offset in the scratch region.
  uint64_t Scratch(size_t bytes);
  // The 8-byte pointer field at staged offset `field` is to hold the device address of `off` in
  // `region` (resolved by WriteImage).
  void PointAt(uint64_t field, StepRegion region, uint64_t off);
  void Push(const StepOp& op) { ops_.push_back(op); }

  struct Layout {
    size_t tables_at = 0;  // region offsets from the arena's start (staged is at 0)
    size_t scratch_at = 0;
    size_t upload_bytes = 0;  // staged and tables: what WriteImage writes
    size_t total_bytes = 0;   // the arena the step needs
  };
  // Ends the recording and lays the regions out.
  Layout End();
  // The upload image (layout.upload_bytes) for an arena at device address `base`, pointers
  // resolved. After End.
  void WriteImage(uint64_t base, uint8_t* dst) const;

  const std::vector<StepOp>& ops() const { return ops_; }
  const Layout& layout() const { return layout_; }
  // A hash of the ops (equal ops, equal hash).
  uint64_t Hash() const;

 private:
  struct Fixup {
    uint64_t field;
    StepRegion region;
    uint64_t off;
  };
  bool recording_ = false;
  std::vector<StepOp> ops_;
  std::vector<uint8_t> staged_, tables_;
  size_t scratch_ = 0;
  std::vector<Fixup> fixups_;
  Layout layout_;
};

// Graphs by step, least recently used first out. A step runs as recorded the first time it is
// seen (a one-off batch costs no capture), is captured the second time, and replays after that;
// other steps in between keep its count (an engine alternating two batch sizes gets both).
class StepGraphCache {
 public:
  using Exec = void*;  // the backend's instantiated graph
  enum class Action { kRun, kCapture, kReplay };
  struct Hit {
    Action action = Action::kRun;
    Exec exec = nullptr;  // kReplay's graph
  };

  // `destroy` releases an evicted or dropped graph.
  StepGraphCache(size_t capacity, std::function<void(Exec)> destroy);
  ~StepGraphCache();
  StepGraphCache(const StepGraphCache&) = delete;
  StepGraphCache& operator=(const StepGraphCache&) = delete;

  // What to do with a step of `ops` (hash: StepTape::Hash) whose graph would also hold `bases`
  // (addresses outside the ops: the arena, scratch). Steps compare by ops and bases.
  Hit Lookup(const std::vector<StepOp>& ops, uint64_t hash, std::span<const uint64_t> bases);
  // The graph captured for the step just looked up (after kCapture); null: capture failed, run
  // it as recorded from now on.
  void Store(Exec exec);
  // Drops every graph (their memory went away).
  void Clear();

  size_t steps() const { return entries_.size(); }
  size_t graphs() const;

 private:
  struct Entry {
    uint64_t hash = 0;
    std::vector<StepOp> ops;
    std::vector<uint64_t> bases;
    int seen = 0;
    bool no_graph = false;
    Exec exec = nullptr;
    uint64_t last_use = 0;
  };
  void Release(Entry& e);

  size_t capacity_;
  std::function<void(Exec)> destroy_;
  std::vector<Entry> entries_;
  Entry* last_ = nullptr;
  uint64_t tick_ = 0;
};

}  // namespace tripod
