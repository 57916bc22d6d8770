// DecodeService; see decode_service.h.
#include "decode_node/decode_service.h"

#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/utf8.h"
#include "common/rpc/kv_chunk_codec.h"
#include "common/rpc/protocol.h"
#include "spdlog/spdlog.h"

namespace tripod {

// One Generate call: the engine's events queue here (engine thread) until the handler thread
// writes them.
struct DecodeService::Call {
  uint64_t request_id = 0;
  uint64_t transfer_id = 0;
  Mutex mu;
  CondVar cv;
  std::deque<TokenEvent> events ABSL_GUARDED_BY(mu);
  bool cancelled ABSL_GUARDED_BY(mu) = false;  // Cancel RPC or CancelAll
  std::string cancel_why ABSL_GUARDED_BY(mu);
  int64_t engine_id ABSL_GUARDED_BY(mu) = 0;  // 0 until submitted
};

namespace {

// Counts a handler for the drain.
class HandlerScope {
 public:
  explicit HandlerScope(std::atomic<int>& n) : n_(n) { ++n_; }
  ~HandlerScope() { --n_; }

 private:
  std::atomic<int>& n_;
};

v1::FinishReason FinishToWire(FinishReason f) {
  switch (f) {
    case FinishReason::kNone:
      return v1::FINISH_NONE;
    case FinishReason::kStop:
      return v1::FINISH_STOP;
    case FinishReason::kLength:
      return v1::FINISH_LENGTH;
    case FinishReason::kCancelled:
      return v1::FINISH_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_ERROR;
  }
  return v1::FINISH_ERROR;
}

void EventToWire(const TokenEvent& ev, v1::GenerateResponse* out) {
  out->set_token(ev.token);
  out->set_index(ev.index);
  out->set_text(ToValidUtf8(ev.text));  // a string field: an ill-formed byte fails the parse
  out->set_logprob(ev.logprob);
  for (const TokenLogprob& t : ev.top_logprobs) {
    v1::TopLogprob* p = out->add_top_logprobs();
    p->set_token(t.id);
    p->set_logprob(t.logprob);
  }
  out->set_finish(FinishToWire(ev.finish));
  if (!ev.error.empty()) out->set_error(ev.error);
  out->set_text_held(ev.text_held);
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

absl::StatusOr<SamplingParams> SamplingFromWire(const v1::SamplingParams& p) {
  SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.top_p() == 0 ? 1.0f : p.top_p();
  s.min_p = p.min_p();
  s.repetition_penalty = p.repetition_penalty() == 0 ? 1.0f : p.repetition_penalty();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.seed = p.seed();
  s.top_logprobs = p.top_logprobs();
  if (absl::Status st = s.Validate(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", st.message()));
  }
  return s;
}

DecodeService::DecodeService(DecodeEngine& engine, DecodeMetrics& metrics, v1::ModelIdentity model,
                             const DecodeServiceOptions& options)
    : engine_(engine),
      metrics_(metrics),
      model_(std::move(model)),
      options_(options),
      layout_(engine.cache().layout()) {
  links_ = std::make_unique<KvLinks>(options.links, engine.cache().memory(), layout_.dtype);
  transfers_ = std::make_unique<KvTransfers>(
      options.transfers, layout_, [&engine](int32_t kv_seq) { engine.ReleaseKv(kv_seq); },
      [&metrics](const TransferEnd& end) {
        metrics.TransferEnded(end);
        if (end.state != TransferState::kAdopted) {
          spdlog::info("transfer {} {}: {}", end.transfer_id, end.reason, end.status.ToString());
        }
      });
}

DecodeService::~DecodeService() { transfers_->Shutdown(); }

void DecodeService::StartDraining() { draining_ = true; }

int DecodeService::in_flight() const { return handlers_.load() + transfers_->active(); }

void DecodeService::RequestCancel(Call& call, const std::string& why) {
  int64_t id = 0;
  {
    MutexLock lock(&call.mu);
    if (!call.cancelled) {
      call.cancelled = true;
      call.cancel_why = why;
    }
    id = call.engine_id;
    call.cv.Signal();
  }
  if (id != 0) engine_.Cancel(id);
}

void DecodeService::CancelAll(const std::string& why) {
  std::vector<std::shared_ptr<Call>> calls;
  {
    MutexLock lock(&calls_mu_);
    for (const auto& [p, c] : calls_) calls.push_back(c);
  }
  for (const auto& c : calls) RequestCancel(*c, why);
  transfers_->Shutdown();
}

v1::HealthResponse DecodeService::HealthNow() const {
  v1::HealthResponse h;
  const DecodeEngineStats st = engine_.stats();
  h.set_role(v1::ROLE_DECODE);
  h.set_protocol_version(kProtocolVersion);
  *h.mutable_model() = model_;
  h.set_plan_key(engine_.plan().KvKey());
  h.set_plan(engine_.plan().DebugString());
  h.set_queued(st.waiting);
  h.set_running(st.running);
  h.set_free_kv_blocks(st.free_blocks);
  h.set_total_kv_blocks(st.total_blocks);
  h.set_block_tokens(engine_.options().block_tokens);
  h.set_kv_dtype(KvDtypeToWire(layout_.dtype));
  h.set_draining(draining_.load());
  h.set_reservations(transfers_->active());
  return h;
}

grpc::Status DecodeService::Health(grpc::ServerContext* context, const v1::HealthRequest*,
                                   v1::HealthResponse* response) {
  if (grpc::Status st = CheckProtocol(*context); !st.ok()) return st;
  *response = HealthNow();
  return grpc::Status::OK;
}

grpc::Status DecodeService::Reserve(grpc::ServerContext* context, const v1::ReserveRequest* req,
                                    v1::ReserveResponse* response) {
  if (grpc::Status st = CheckProtocol(*context); !st.ok()) return st;
  auto refuse = [&](absl::Status st) {
    metrics_.ReserveDone(st);
    return ToGrpcStatus(st);
  };
  if (draining_) return refuse(absl::UnavailableError("decode worker: draining, no new work"));
  const int n = req->prompt_tokens();
  if (n < 1 || n >= engine_.context_tokens()) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("Reserve: prompt_tokens ", n, " is not in [1, ", engine_.context_tokens(),
                     ") (the model's context)")));
  }
  const int slots = req->kv_slots() == 0 ? n - 1 : req->kv_slots();
  if (slots < 0 || slots > n - 1) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "Reserve: kv_slots ", req->kv_slots(), " is not in [0, ", n - 1, "] (prompt_tokens - 1)")));
  }
  KvDtype unused;
  if (req->kv_dtype() != v1::KV_DTYPE_UNSPECIFIED && !KvDtypeFromWire(req->kv_dtype(), &unused)) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("Reserve: unknown kv_dtype ", static_cast<int>(req->kv_dtype()))));
  }
  std::vector<int32_t> layer_first(req->layer_first_slot().begin(), req->layer_first_slot().end());
  if (!layer_first.empty() && req->kv_slots() == 0) {
    return refuse(absl::InvalidArgumentError(
        "Reserve: layer_first_slot needs kv_slots (per-layer budgets are trimmed KV)"));
  }
  absl::StatusOr<KvReservation> r =
      engine_.ReserveKv(slots, req->plan_key(), std::move(layer_first));
  if (!r.ok()) return refuse(r.status());
  const int blocks = r->blocks;
  TransferSpec spec;
  spec.n_prompt = n;
  spec.plan_key = req->plan_key();
  spec.dtype = req->kv_dtype();
  spec.lease = absl::Milliseconds(req->lease_ms());
  const TransferTicket t = transfers_->Add(*std::move(r), spec);
  response->set_transfer_id(t.transfer_id);
  response->set_blocks(blocks);
  response->set_block_tokens(engine_.options().block_tokens);
  response->set_lease_deadline_unix_ms(absl::ToUnixMillis(t.deadline));
  response->set_kv_dtype(KvDtypeToWire(layout_.dtype));
  metrics_.ReserveDone(absl::OkStatus());
  return grpc::Status::OK;
}

grpc::Status DecodeService::PushKv(grpc::ServerContext* context,
                                   grpc::ServerReader<v1::KvChunk>* reader,
                                   v1::PushKvResponse* response) {
  if (grpc::Status st = CheckProtocol(*context); !st.ok()) return st;
  HandlerScope scope(handlers_);
  v1::KvChunk chunk;
  if (!reader->Read(&chunk)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "PushKv: the stream carried no chunk");
  }
  const uint64_t id = chunk.transfer_id();
  if (id == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "PushKv: the first chunk names no transfer (transfer_id 0)");
  }
  if (absl::Status st = transfers_->OpenStream(id); !st.ok()) return ToGrpcStatus(st);
  const absl::Time opened = absl::Now();
  while (true) {
    absl::StatusOr<PushProgress> p;
    if (chunk.link_id() != 0 && !chunk.end()) {
      // The payload comes off the link first, whatever becomes of the transfer: the link's two
      // ends must stay in step for the payloads after it.
      const absl::Status got = links_->Receive(chunk, [&](const uint8_t* rows) {
        p = transfers_->Push(id, chunk, rows);
        return absl::OkStatus();
      });
      if (!got.ok()) {
        transfers_->Cancel(id, std::string(got.message()));
        p = got;
      }
    } else {
      p = transfers_->Push(id, chunk);
    }
    if (!p.ok()) {
      transfers_->CloseStream(id, p.status()).IgnoreError();  // already ended by the refusal
      return ToGrpcStatus(p.status());
    }
    if (!chunk.end()) {
      metrics_.ChunkAccepted(chunk.link_id() != 0 ? chunk.link_bytes() : chunk.payload().size());
    }
    if (p->complete) {
      transfers_->CloseStream(id, absl::OkStatus()).IgnoreError();  // complete: OK
      metrics_.TransferReceived(Seconds(absl::Now() - opened));
      response->set_chunks(p->chunks);
      response->set_bytes(p->bytes);
      response->set_slots(p->slots);
      return grpc::Status::OK;
    }
    if (!reader->Read(&chunk)) {
      const absl::Status why = context->IsCancelled()
                                   ? absl::CancelledError("the sender cancelled the call")
                                   : absl::AbortedError("the sender closed the stream");
      return ToGrpcStatus(transfers_->CloseStream(id, why));
    }
  }
}

grpc::Status DecodeService::OpenKvLink(grpc::ServerContext* context,
                                       const v1::OpenKvLinkRequest* request,
                                       v1::OpenKvLinkResponse* response) {
  if (grpc::Status st = CheckProtocol(*context); !st.ok()) return st;
  absl::StatusOr<v1::OpenKvLinkResponse> r = links_->Open(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *std::move(r);
  spdlog::info("KV link {} ({}) offered to {}", response->link_id(),
               v1::KvLinkKind_Name(request->kind()), context->peer());
  return grpc::Status::OK;
}

grpc::Status DecodeService::Cancel(grpc::ServerContext* context, const v1::CancelRequest* req,
                                   v1::CancelResponse* response) {
  if (grpc::Status st = CheckProtocol(*context); !st.ok()) return st;
  bool found = false;
  if (req->transfer_id() != 0) {
    found = transfers_->Cancel(req->transfer_id(), "a Cancel call");
  }
  std::vector<std::shared_ptr<Call>> hits;
  {
    MutexLock lock(&calls_mu_);
    for (const auto& [p, c] : calls_) {
      if ((req->request_id() != 0 && c->request_id == req->request_id()) ||
          (req->transfer_id() != 0 && c->transfer_id == req->transfer_id())) {
        hits.push_back(c);
      }
    }
  }
  for (const auto& c : hits) RequestCancel(*c, "a Cancel call");
  response->set_found(found || !hits.empty());
  return grpc::Status::OK;
}

grpc::Status DecodeService::Generate(grpc::ServerContext* context,
                                     const v1::GenerateRequest* request,
                                     grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (grpc::Status st = CheckProtocol(*context); !st.ok()) return st;
  HandlerScope scope(handlers_);
  auto call = std::make_shared<Call>();
  call->request_id = request->request_id();
  call->transfer_id = request->transfer_id();
  {
    MutexLock lock(&calls_mu_);
    calls_[call.get()] = call;
  }
  grpc::Status st = GenerateChecked(context, *request, writer, call);
  {
    MutexLock lock(&calls_mu_);
    calls_.erase(call.get());
  }
  return st;
}

grpc::Status DecodeService::GenerateChecked(grpc::ServerContext* context,
                                            const v1::GenerateRequest& req,
                                            grpc::ServerWriter<v1::GenerateResponse>* writer,
                                            std::shared_ptr<Call> call) {
  const absl::Time accepted = absl::Now();
  const int n = req.prompt_size();
  auto reject = [&](const absl::Status& s) {
    metrics_.GenerateRejected(s);
    spdlog::info("generate request_id={} transfer={} prompt={} rejected: {}", req.request_id(),
                 req.transfer_id(), n, s.ToString());
    return ToGrpcStatus(s);
  };
  auto cancelled_now = [&] {
    MutexLock lock(&call->mu);
    return call->cancelled;
  };
  // A request cancelled before it reached the engine: one end-only event.
  auto end_cancelled = [&](const std::string& why) {
    v1::GenerateResponse r;
    r.set_token(-1);
    r.set_finish(v1::FINISH_CANCELLED);
    r.set_error(why);
    r.mutable_usage()->set_prompt_tokens(n);
    r.mutable_timing()->set_queue_s(Seconds(absl::Now() - accepted));
    writer->Write(r);
    metrics_.GenerateDone("cancelled", n, 0, 0, GenerateTimes{});
    spdlog::info("generate request_id={} transfer={} prompt={} completion=0 finish=cancelled ({})",
                 req.request_id(), req.transfer_id(), n, why);
    return grpc::Status::OK;
  };
  if (draining_ && req.transfer_id() == 0) {
    return reject(absl::UnavailableError("decode worker: draining, no new work"));
  }
  DecodeRequest r;
  r.prompt.assign(req.prompt().begin(), req.prompt().end());
  absl::StatusOr<SamplingParams> sampling = SamplingFromWire(req.sampling());
  if (!sampling.ok()) return reject(sampling.status());
  r.sampling = *sampling;
  r.max_tokens = req.max_tokens();
  r.stop.assign(req.stop().begin(), req.stop().end());
  r.ignore_eos = req.ignore_eos();
  r.continuation = req.continuation();
  if (absl::Status v = engine_.Validate(r); !v.ok()) return reject(v);

  const uint64_t tid = req.transfer_id();
  int32_t adopted_kv = -1;
  if (tid != 0) {
    // Bounded by the lease: the reaper ends a transfer that does not complete in time. The
    // extra bound only guards against a reaper that never ran.
    const absl::Time give_up = accepted + options_.transfers.max_lease + absl::Seconds(5);
    while (true) {
      absl::StatusOr<bool> done = transfers_->AwaitComplete(tid, options_.poll);
      if (!done.ok()) {
        if (absl::IsCancelled(done.status())) return end_cancelled(done.status().ToString());
        return reject(done.status());
      }
      if (*done) break;
      if (context->IsCancelled()) {
        transfers_->Cancel(tid, "the Generate call's client went away");
        metrics_.GenerateDone("cancelled", n, 0, 0, GenerateTimes{});
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
      if (cancelled_now()) {
        transfers_->Cancel(tid, "its Generate call was cancelled");
        return end_cancelled("cancelled while waiting for the KV transfer");
      }
      if (absl::Now() > give_up) {
        transfers_->Cancel(tid, "Generate gave up waiting");
        return reject(absl::DeadlineExceededError(
            absl::StrCat("transfer ", tid, " did not complete in time")));
      }
    }
    absl::StatusOr<AdoptedKv> a = transfers_->Adopt(tid, n);
    if (!a.ok()) return reject(a.status());
    adopted_kv = a->kv_seq;
    r.reserved_kv_seq = a->kv_seq;
    r.reserved_slots = a->n_slots;
    r.reserved_trimmed = a->trimmed;
  }

  Call* c = call.get();
  r.on_event = [call](const TokenEvent& ev) {
    MutexLock lock(&call->mu);
    call->events.push_back(ev);
    call->cv.Signal();
  };
  const absl::Time submitted = absl::Now();
  absl::StatusOr<int64_t> id = engine_.Submit(std::move(r));
  if (!id.ok()) {
    if (adopted_kv >= 0) engine_.ReleaseKv(adopted_kv);
    return reject(id.status());
  }
  bool cancel_now = false;
  {
    MutexLock lock(&c->mu);
    c->engine_id = *id;
    cancel_now = c->cancelled;
  }
  if (cancel_now) engine_.Cancel(*id);

  // Stream the events until the finish.
  bool client_gone = false;
  absl::Time cancel_sent = absl::InfiniteFuture();
  absl::Time first_token = absl::InfinitePast(), last_token = absl::InfinitePast();
  int completion = 0;
  TokenEvent final_event;
  bool finished = false;
  std::deque<TokenEvent> batch;
  while (!finished) {
    {
      MutexLock lock(&c->mu);
      if (c->events.empty()) c->cv.WaitWithTimeout(&c->mu, options_.poll);
      batch.swap(c->events);
    }
    for (TokenEvent& ev : batch) {
      const absl::Time now = absl::Now();
      if (ev.token >= 0) {
        ++completion;
        if (completion == 1) first_token = now;
        if (completion > 1) metrics_.InterToken(Seconds(now - last_token));
        last_token = now;
      }
      v1::GenerateResponse out;
      EventToWire(ev, &out);
      if (ev.finish != FinishReason::kNone) {
        finished = true;
        v1::Usage* u = out.mutable_usage();
        u->set_prompt_tokens(n);
        u->set_completion_tokens(completion);
        u->set_cached_tokens(ev.cached_tokens);
        v1::DecodeTiming* t = out.mutable_timing();
        t->set_queue_s(ev.queue_seconds >= 0 ? Seconds(submitted - accepted) + ev.queue_seconds
                                             : Seconds(now - accepted));
        if (completion > 0) {
          t->set_first_token_s(Seconds(first_token - accepted));
          t->set_decode_s(Seconds(last_token - first_token));
        }
        final_event = std::move(ev);
      }
      if (!client_gone && !writer->Write(out)) {
        client_gone = true;
        engine_.Cancel(*id);
        cancel_sent = absl::Now();
      }
      if (finished) break;
    }
    batch.clear();
    if (finished) break;
    if (!client_gone && context->IsCancelled()) {
      client_gone = true;
      engine_.Cancel(*id);
      cancel_sent = absl::Now();
    }
    if (cancel_sent == absl::InfiniteFuture() && cancelled_now()) cancel_sent = absl::Now();
    if (absl::Now() - cancel_sent > options_.cancel_wait) {
      spdlog::warn("generate request_id={}: no final event {} s after the cancel; giving up",
                   req.request_id(), Seconds(options_.cancel_wait));
      break;
    }
  }

  const char* finish = finished ? FinishReasonName(final_event.finish) : "cancelled";
  GenerateTimes times;
  times.ttft_s = completion > 0 ? Seconds(first_token - accepted) : -1;
  times.tpot_s = completion > 1 ? Seconds(last_token - first_token) / (completion - 1) : -1;
  times.decode_s = completion > 0 ? Seconds(last_token - first_token) : -1;
  times.queue_s = final_event.queue_seconds >= 0
                      ? Seconds(submitted - accepted) + final_event.queue_seconds
                      : -1;
  times.e2e_s = Seconds(absl::Now() - accepted);
  metrics_.GenerateDone(finish, n, completion, final_event.cached_tokens, times);
  spdlog::info(
      "generate request_id={} id={} transfer={} prompt={} cached={} completion={} finish={} "
      "ttft={:.3f}s{}{}",
      req.request_id(), *id, tid, n, final_event.cached_tokens, completion, finish, times.ttft_s,
      client_gone ? " (client went away)" : "",
      final_event.error.empty() ? std::string() : " error: " + final_event.error);
  if (client_gone) return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  return grpc::Status::OK;
}

}  // namespace tripod
