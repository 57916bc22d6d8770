// KvTransfers: the decode worker's KV reservations and the transfers that fill them, by transfer
// id. A transfer goes reserved -> receiving (chunks arrive on its one PushKv stream) -> complete
// (the end message checked out) -> adopted (a Generate call took its blocks), or ends failed (a
// refused chunk, a stream that ended early, a mismatched Generate), expired (its lease ran out
// before it was adopted, whether or not its data had arrived) or cancelled. Every end but
// adoption frees the reservation's blocks (through the release callback) exactly once, and never
// while a chunk is being written into them. Ended transfers leave a small tombstone for a while,
// so that a late chunk or a late Generate gets a status that says what happened.
//
// Knows nothing of gRPC nor of the engine: the service makes the reservation (DecodeEngine::
// ReserveKv) and hands it over; chunks are the wire's messages, checked by KvChunkReceiver.
// Thread-safe; one reaper thread frees expired reservations at their deadlines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/kv/kv_layout.h"
#include "common/kv_transfer/kv_reservation.h"
#include "common/util/mutex.h"
#include "tripod/v1/kv_chunk.pb.h"

namespace tripod {

enum class TransferState : uint8_t {
  kReserved,   // blocks set aside, no chunk yet
  kReceiving,  // a stream is delivering chunks
  kComplete,   // every slot of every layer arrived; waiting for Generate
  kAdopted,    // a request owns the blocks now
  kFailed,
  kExpired,
  kCancelled,
};

const char* TransferStateName(TransferState s);

struct KvTransfersOptions {
  absl::Duration default_lease = absl::Seconds(30);
  absl::Duration max_lease = absl::Minutes(10);  // longer requested leases are cut to this
  absl::Duration tombstone_ttl = absl::Minutes(10);
  size_t max_tombstones = 100000;  // the oldest go first beyond this
};

// What Reserve asked for.
struct TransferSpec {
  int n_prompt = 0;                              // prompt tokens n: KV of tokens 0..n-2 comes
  uint64_t plan_key = 0;                         // of the prefill plan
  v1::KvDtype dtype = v1::KV_DTYPE_UNSPECIFIED;  // announced chunk type; unspecified: any
  absl::Duration lease = absl::ZeroDuration();   // zero: the default
};

struct TransferTicket {
  uint64_t transfer_id = 0;
  absl::Time deadline;
  absl::Duration lease;
};

// One accepted chunk (or the end message).
struct PushProgress {
  uint32_t chunks = 0;  // data chunks accepted so far
  uint64_t bytes = 0;   // their payload bytes
  int slots = 0;        // slots every layer has
  bool complete = false;
};

// What Generate takes over: the engine's reservation, now filled.
struct AdoptedKv {
  int32_t kv_seq = -1;
  int n_slots = 0;
  bool trimmed = false;
  uint64_t plan_key = 0;
};

// A transfer that ended (for metrics and logs); reason is a short label.
struct TransferEnd {
  uint64_t transfer_id = 0;
  TransferState state = TransferState::kFailed;
  std::string reason;  // adopted | chunk_rejected | stream_ended | mismatch | expired | cancelled
  absl::Status status;
  absl::Duration age;  // since Add
};

class KvTransfers {
 public:
  using ReleaseFn = std::function<void(int32_t kv_seq)>;  // frees an unadopted reservation
  using EndFn = std::function<void(const TransferEnd&)>;  // any thread, no lock held

  // layout: the destination cache's (chunks are converted to its type).
  KvTransfers(const KvTransfersOptions& options, const KvLayout& layout, ReleaseFn release,
              EndFn on_end = {});
  ~KvTransfers();  // Shutdown()
  KvTransfers(const KvTransfers&) = delete;
  KvTransfers& operator=(const KvTransfers&) = delete;

  // Takes over a reservation made for `spec`; returns its new transfer id (random, never 0,
  // never reused in this process) and lease deadline.
  TransferTicket Add(KvReservation reservation, const TransferSpec& spec);

  // Binds the one PushKv stream of a transfer. Refused (nothing else changes) when another
  // stream holds it, or the transfer ended (the status says how) or is unknown.
  absl::Status OpenStream(uint64_t transfer_id);
  // A data chunk or the end message from the bound stream. A refused chunk (any check of
  // KvChunkReceiver, a lease that ran out) aborts the transfer: state failed or expired, blocks
  // freed, and its status is returned here and to whoever waits on it.
  // device_rows: a link chunk's payload, received (KvLinks) into the store's memory.
  absl::StatusOr<PushProgress> Push(uint64_t transfer_id, const v1::KvChunk& chunk,
                                    const uint8_t* device_rows = nullptr);
  // A link chunk's header, checked as Push will (its size against its ranges, its ranges against
  // the reservation) before its payload is received: what Push would refuse aborts the transfer
  // here, as Push would. From the bound stream's thread.
  absl::Status CheckLinkChunk(uint64_t transfer_id, const v1::KvChunk& chunk);
  // The stream ended. A transfer that did not complete is aborted (its sender died or gave up):
  // returns that, or what ended the transfer before (an expired lease...); OK once complete.
  absl::Status CloseStream(uint64_t transfer_id, const absl::Status& why);

  // Waits at most `wait` for the transfer to complete: true when it has, false when it is still
  // on its way; an error when it ended otherwise (the status that ended it) or is unknown.
  absl::StatusOr<bool> AwaitComplete(uint64_t transfer_id, absl::Duration wait);
  // Calls fn once the transfer is complete or has ended (then AwaitComplete(id, 0) says which):
  // on the thread that completed or ended it, no lock held; at once, on this thread, if it
  // already has, or is unknown. So that a Generate call waits for its KV without a thread.
  void WhenSettled(uint64_t transfer_id, std::function<void()> fn);
  // Hands a complete transfer's blocks to the caller (who then owns them: adopt them in the
  // engine, or release them). A prompt of another length than reserved aborts the transfer.
  absl::StatusOr<AdoptedKv> Adopt(uint64_t transfer_id, int n_prompt);
  // Aborts a transfer that has not been adopted; false when there was none.
  bool Cancel(uint64_t transfer_id, const std::string& why);
  // Aborts every live transfer and stops the reaper. Idempotent.
  void Shutdown();

  int active() const;  // transfers reserved, receiving or complete
  // State of a live or tombstoned transfer; NOT_FOUND when unknown.
  absl::StatusOr<TransferState> state(uint64_t transfer_id) const;

 private:
  struct Transfer;
  // Releases and end events decided under mu_, run by the deciding thread once it let go of mu_
  // (so that, e.g., a refused chunk's blocks are free when PushKv answers).
  struct Pending {
    std::vector<int32_t> releases;
    std::vector<TransferEnd> ends;
    std::vector<std::function<void()>> wakes;  // WhenSettled's
  };
  struct Tombstone {
    TransferState state;
    absl::Status status;
    absl::Time at;
  };

  // Ends a live transfer (mu_ held; t by value: it is erased from live_ here): tombstone, release
  // queued unless a chunk is being written (the writer releases then), end event queued.
  void End(std::shared_ptr<Transfer> t, TransferState state, absl::Status status,
           std::string reason, Pending& pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Status for a transfer that is not live: what ended it, or NOT_FOUND. for_chunk: phrased for
  // a chunk that came too late.
  absl::Status NotLive(uint64_t transfer_id, bool for_chunk) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::shared_ptr<Transfer> Live(uint64_t transfer_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The live transfer whose PushKv stream is bound, for a chunk of that stream; else why not.
  absl::StatusOr<std::shared_ptr<Transfer>> Streaming(uint64_t transfer_id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Expires what is past its deadline, drops old tombstones.
  void Sweep(absl::Time now, Pending& pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Pending& pending) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t NewId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Reaper();

  const KvTransfersOptions options_;
  const KvLayout layout_;
  const ReleaseFn release_;
  const EndFn on_end_;

  mutable Mutex mu_;
  CondVar changed_;      // a transfer completed or ended (AwaitComplete)
  CondVar reaper_wake_;  // an earlier deadline, or stop
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> live_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, uint64_t>> deadlines_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Tombstone> tombs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<absl::Time, uint64_t>> tomb_order_ ABSL_GUARDED_BY(mu_);
  int writers_ ABSL_GUARDED_BY(mu_) = 0;  // chunks being written right now
  uint64_t id_key_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t id_counter_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace tripod
