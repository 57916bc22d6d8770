// A decode side for the prefill worker's tests: a real gRPC server on 127.0.0.1:0 whose
// Decode.PushKv checks chunks with the real KvChunkReceiver and lands them in a contiguous cache,
// and can be told to refuse a chunk, hold the stream (backpressure, lease expiry) or delay its
// acknowledgement. Not a mock of gRPC: the bytes cross a socket.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/kv_snapshot.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/rpc/protocol.h"
#include "common/util/mutex.h"
#include "grpcpp/grpcpp.h"
#include "tripod/v1/decode.grpc.pb.h"

namespace tripod {

class FakeDecode final : public v1::Decode::Service {
 public:
  struct Behavior {
    int refuse_at_seq = -1;  // answer this status on receiving data chunk `seq`
    grpc::Status refusal;
    bool hold = false;  // read nothing until Release() (or the call ends)
    absl::Duration ack_delay = absl::ZeroDuration();  // after the end message
  };

  // Expects transfer `transfer_id` of n_slots slots of `layout`.
  FakeDecode(uint64_t transfer_id, const KvLayout& layout, int n_slots)
      : transfer_id_(transfer_id), layout_(layout), n_slots_(n_slots) {
    cache_ = *ContiguousKvCache::Create(layout, 1, std::max(n_slots, 1));
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.SetMaxReceiveMessageSize(8 << 20);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeDecode() override {
    Release();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void set_behavior(const Behavior& b) {
    MutexLock lock(&mu_);
    behavior_ = b;
  }
  void Release() {
    MutexLock lock(&mu_);
    behavior_.hold = false;
    cv_.SignalAll();
  }

  grpc::Status PushKv(grpc::ServerContext* ctx, grpc::ServerReader<v1::KvChunk>* reader,
                      v1::PushKvResponse* response) override {
    if (grpc::Status s = CheckProtocol(*ctx); !s.ok()) return s;
    Behavior b;
    {
      MutexLock lock(&mu_);
      ++calls_;
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      while (behavior_.hold && !ctx->IsCancelled() && absl::Now() < deadline) {
        cv_.WaitWithTimeout(&mu_, absl::Milliseconds(10));
      }
      b = behavior_;
    }
    KvChunkReceiver rx(transfer_id_, layout_, n_slots_, n_slots_);
    v1::KvChunk c;
    while (reader->Read(&c)) {
      {
        MutexLock lock(&mu_);
        seqs_.push_back(c.seq());
      }
      if (c.end()) {
        if (absl::Status s = rx.Finish(c); !s.ok()) return Done(ToGrpcStatus(s));
        const absl::Time until = absl::Now() + b.ack_delay;
        while (absl::Now() < until && !ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
        if (ctx->IsCancelled()) return Done(grpc::Status(grpc::StatusCode::CANCELLED, "gone"));
        response->set_chunks(rx.chunks());
        response->set_bytes(rx.bytes());
        response->set_slots(rx.slots_done());
        return Done(grpc::Status::OK, true);
      }
      if (static_cast<int>(c.seq()) == b.refuse_at_seq) return Done(b.refusal);
      if (absl::Status s = rx.Accept(c, *cache_, 0); !s.ok()) return Done(ToGrpcStatus(s));
    }
    return Done(grpc::Status(grpc::StatusCode::CANCELLED, "the stream ended without its end"));
  }

  // The KV received, as a snapshot of all slots, once the PushKv call has ended (its handler's
  // writes are then ordered before this read through mu_, which TSan sees).
  KvSnapshot Received() {
    WaitDone(absl::Seconds(30));
    MutexLock lock(&mu_);
    return *ExportSnapshot(*cache_, 0, n_slots_);
  }
  std::vector<uint32_t> seqs() {
    MutexLock lock(&mu_);
    return seqs_;
  }
  int calls() {
    MutexLock lock(&mu_);
    return calls_;
  }
  // The status of the last finished PushKv call and whether it completed; waits (bounded) for one.
  bool WaitDone(absl::Duration bound, grpc::StatusCode* code = nullptr) {
    MutexLock lock(&mu_);
    const absl::Time until = absl::Now() + bound;
    while (!finished_ && !cv_.WaitWithDeadline(&mu_, until)) {
    }
    const bool ok = finished_;
    if (code != nullptr) *code = last_code_;
    return ok;
  }
  bool completed() {
    MutexLock lock(&mu_);
    return completed_;
  }

 private:
  grpc::Status Done(grpc::Status s, bool completed = false) {
    MutexLock lock(&mu_);
    cv_.SignalAll();
    finished_ = true;
    completed_ = completed;
    last_code_ = s.error_code();
    return s;
  }

  const uint64_t transfer_id_;
  const KvLayout layout_;
  const int n_slots_;
  std::unique_ptr<ContiguousKvCache> cache_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  Mutex mu_;
  CondVar cv_;
  Behavior behavior_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> seqs_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool completed_ ABSL_GUARDED_BY(mu_) = false;
  grpc::StatusCode last_code_ ABSL_GUARDED_BY(mu_) = grpc::StatusCode::OK;
};

}  // namespace tripod
