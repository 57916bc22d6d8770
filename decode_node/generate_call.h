// One Generate call on the decode worker, from its request to its last event: the engine's
// events made wire messages for the call's stream writer (common/rpc/server_stream_writer.h),
// the client's going and Cancel calls turned into engine or transfer cancels, the call's
// metrics and log line. DecodeService (decode_service.h) creates it and submits its request.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/kv_transfer/kv_transfers.h"
#include "common/rpc/protocol.h"
#include "common/rpc/server_stream_writer.h"
#include "common/util/mutex.h"
#include "decode_node/decode_engine.h"
#include "decode_node/decode_metrics.h"
#include "spdlog/spdlog.h"
#include "tripod/v1/decode.pb.h"

namespace tripod {

// One Generate call. Nothing waits for it on a thread: it moves on when its transfer settles
// (KvTransfers::WhenSettled), when the engine sends an event (its thread), when the client goes
// away (the stream writer's hook) and on a Cancel call. Its state is shared by the stream writer
// (until OnDone), the engine's callback, the transfer's waiter and calls_, so that whichever of
// them comes last frees it. The writes themselves are the writer's (server_stream_writer.h).
struct GenerateCall {
  using Stream = ServerStreamWriter<v1::GenerateResponse>;

  // Called once both ends are marked: the service lets go of the call.
  std::function<void(GenerateCall*)> forget;
  DecodeEngine* engine = nullptr;
  KvTransfers* transfers = nullptr;
  DecodeMetrics* metrics = nullptr;
  std::shared_ptr<Stream> stream;  // set once, before the call is shared
  uint64_t request_id = 0;
  uint64_t transfer_id = 0;
  int n_prompt = 0;
  int n_choices = 1;  // GenerateRequest.n: the call ends after this many final events
  absl::Time accepted;

  Mutex mu;
  DecodeRequest request ABSL_GUARDED_BY(mu);  // until submitted
  absl::Time submitted ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  int64_t engine_id ABSL_GUARDED_BY(mu) = 0;     // 0 until submitted
  bool cancelled ABSL_GUARDED_BY(mu) = false;    // Cancel RPC or CancelAll
  bool client_gone ABSL_GUARDED_BY(mu) = false;  // the writer's on_client_gone
  bool ended ABSL_GUARDED_BY(mu) = false;        // its final event is out, or none will come
  bool rpc_done ABSL_GUARDED_BY(mu) = false;     // OnDone: gRPC let go of the writer
  int completion ABSL_GUARDED_BY(mu) = 0;        // tokens of every choice
  std::vector<int> choice_completion ABSL_GUARDED_BY(mu);  // tokens by choice
  int choices_ended ABSL_GUARDED_BY(mu) = 0;
  absl::Time first_token ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  absl::Time last_token ABSL_GUARDED_BY(mu) = absl::InfinitePast();

  // Marks one of the two ends; the call leaves calls_ (and the service's care) after both.
  void MarkEnded() ABSL_LOCKS_EXCLUDED(mu) { Mark(&GenerateCall::ended); }
  void MarkRpcDone() ABSL_LOCKS_EXCLUDED(mu) { Mark(&GenerateCall::rpc_done); }
  void Mark(bool GenerateCall::*flag) ABSL_LOCKS_EXCLUDED(mu) {
    bool both = false;
    {
      MutexLock lock(&mu);
      if (this->*flag) return;
      this->*flag = true;
      both = ended && rpc_done;
    }
    if (both) forget(this);
  }

  // The client went away (or the call's deadline passed, or the server shuts down): the request
  // stops wherever it is; the writer ends the call CANCELLED without waiting for the engine.
  void ClientGone() ABSL_LOCKS_EXCLUDED(mu) {
    Stop(&GenerateCall::client_gone, "the Generate call's client went away");
  }
  // A Cancel call or CancelAll: the request ends with a cancelled finish event.
  void RequestCancel() ABSL_LOCKS_EXCLUDED(mu) {
    Stop(&GenerateCall::cancelled, "its Generate call was cancelled");
  }
  // Sets `flag` and stops the request where it is: in the engine, or waiting for its transfer.
  void Stop(bool GenerateCall::*flag, const char* why) ABSL_LOCKS_EXCLUDED(mu) {
    int64_t id = 0;
    bool waiting = false;
    {
      MutexLock lock(&mu);
      this->*flag = true;
      id = engine_id;
      waiting = transfer_id != 0 && id == 0 && !ended;
    }
    if (id != 0) {
      engine->Cancel(id);
    } else if (waiting) {
      transfers->Cancel(transfer_id, why);
    }
  }

  // Before the request reached the engine: the call's status says why (nothing streamed).
  void Reject(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu) {
    metrics->GenerateRejected(s);
    spdlog::info("generate request_id={} transfer={} prompt={} rejected: {}", request_id,
                 transfer_id, n_prompt, s.ToString());
    stream->End(ToGrpcStatus(s));
    MarkEnded();
  }

  // Cancelled before it reached the engine: one end-only event per choice (none if the client
  // is gone).
  void EndCancelled(const std::string& why) ABSL_LOCKS_EXCLUDED(mu) {
    v1::GenerateResponse r;
    r.set_token(-1);
    r.set_finish(v1::FINISH_CANCELLED);
    r.set_error(why);
    r.mutable_usage()->set_prompt_tokens(n_prompt);
    r.mutable_timing()->set_queue_s(absl::ToDoubleSeconds(absl::Now() - accepted));
    metrics->GenerateDone("cancelled", n_prompt, 0, 0, GenerateTimes{});
    spdlog::info("generate request_id={} transfer={} prompt={} completion=0 finish=cancelled ({})",
                 request_id, transfer_id, n_prompt, why);
    for (int c = 1; c < n_choices; ++c) {
      v1::GenerateResponse other = r;
      other.set_choice(c);
      stream->Write(std::move(other));
    }
    stream->Write(std::move(r));
    stream->End(grpc::Status::OK);
    MarkEnded();
  }

  // The engine's callback (its thread).
  void OnEvent(const TokenEvent& ev) ABSL_LOCKS_EXCLUDED(mu);
};

}  // namespace tripod
