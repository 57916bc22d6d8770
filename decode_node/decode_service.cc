// DecodeService; see decode_service.h.
#include "decode_node/decode_service.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/compute/pop_control.h"
#include "common/kv_transfer/kv_chunk_codec.h"
#include "common/kv_transfer/kv_receiver.h"
#include "common/rpc/protocol.h"
#include "decode_node/generate_call.h"
#include "spdlog/spdlog.h"

namespace tripod {

namespace {

// Counts a handler for the drain.
class HandlerScope {
 public:
  explicit HandlerScope(std::atomic<int>& n) : n_(n) { ++n_; }
  ~HandlerScope() { --n_; }

 private:
  std::atomic<int>& n_;
};

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
  for (const v1::TokenBias& b : p.logit_bias()) s.logit_bias.push_back({b.id(), b.bias()});
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
  // A link payload is at most what the sender's split makes of this layout (KvSender).
  KvLinksOptions links = options.links;
  links.max_payload_bytes = std::max(kMaxKvChunkPayload, KvChunkPayloadBytes(layout_, 1, 1));
  links_ = std::make_unique<KvLinks>(links, engine.cache().memory(), layout_.dtype);
  transfers_ = std::make_unique<KvTransfers>(
      options.transfers, layout_, [&engine](int32_t kv_seq) { engine.ReleaseKv(kv_seq); },
      [&metrics](const TransferEnd& end) {
        metrics.TransferEnded(end);
        if (end.state != TransferState::kAdopted) {
          spdlog::info("transfer {} {}: {}", end.transfer_id, end.reason, end.status.ToString());
        }
      });
}

DecodeService::~DecodeService() {
  transfers_->Shutdown();  // ends the calls still waiting for their KV
  // Requests still in the engine (their calls done, or never ended) hold this service's metrics:
  // cancel them, and wait (bounded: the engine may be stopped) for their final events.
  std::vector<std::shared_ptr<Call>> left;
  {
    MutexLock lock(&calls_mu_);
    for (const auto& [p, c] : calls_) left.push_back(c);
  }
  for (const auto& c : left) c->RequestCancel();
  left.clear();
  MutexLock lock(&calls_mu_);
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (!calls_.empty() && !calls_gone_.WaitWithDeadline(&calls_mu_, until)) {
  }
  if (!calls_.empty()) {
    spdlog::warn("decode service: {} requests had no final event from the engine", calls_.size());
  }
}

void DecodeService::Forget(Call* call) {
  MutexLock lock(&calls_mu_);
  calls_.erase(call);
  if (calls_.empty()) calls_gone_.SignalAll();
}

void DecodeService::StartDraining() { draining_ = true; }

int DecodeService::in_flight() const { return handlers_.load() + transfers_->active(); }

void DecodeService::CancelAll(const std::string& why) {
  std::vector<std::shared_ptr<Call>> calls;
  {
    MutexLock lock(&calls_mu_);
    for (const auto& [p, c] : calls_) calls.push_back(c);
  }
  for (const auto& c : calls) c->RequestCancel();
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

grpc::ServerUnaryReactor* DecodeService::Health(grpc::CallbackServerContext* context,
                                                const v1::HealthRequest*,
                                                v1::HealthResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status st = CheckProtocol(*context);
  if (st.ok()) *response = HealthNow();
  reactor->Finish(st);
  return reactor;
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
  KvReceiver receiver(*transfers_, links_.get());
  v1::KvChunk chunk;
  if (!reader->Read(&chunk)) return ToGrpcStatus(receiver.Close(absl::OkStatus()));
  const absl::Time opened = absl::Now();
  while (true) {
    const absl::StatusOr<PushProgress> p = receiver.Receive(chunk);
    if (!p.ok()) return ToGrpcStatus(p.status());
    if (!chunk.end()) {
      metrics_.ChunkAccepted(chunk.link_id() != 0 ? chunk.link_bytes() : chunk.payload().size());
    }
    if (receiver.state() == KvReceiveState::kComplete) {
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
      return ToGrpcStatus(receiver.Close(why));
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

grpc::ServerUnaryReactor* DecodeService::Cancel(grpc::CallbackServerContext* context,
                                                const v1::CancelRequest* req,
                                                v1::CancelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status st = CheckProtocol(*context); !st.ok()) {
    reactor->Finish(st);
    return reactor;
  }
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
  for (const auto& c : hits) c->RequestCancel();
  response->set_found(found || !hits.empty());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

namespace {

// The request's control on this model's layers.
absl::StatusOr<PopControl> PopControlFromWire(const v1::PopControlSpec& w, int n_layers) {
  std::optional<PopVariant> v = ParsePopVariant(w.variant());
  std::optional<double> ratio = ParsePopRatio(w.ratio());
  if (!v.has_value() || !ratio.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("request: POP control '", w.variant(), "' at '",
                                                   w.ratio(),
                                                   "': expected noboundary, nokv or shortgpt at a "
                                                   "ratio in [0, 1)"));
  }
  PopControl pc;
  pc.variant = *v;
  pc.skipped = PopTailLayers(n_layers, *ratio);
  pc.prompt_tokens = w.prompt_tokens();
  return pc;
}

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* DecodeService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* req) {
  auto call = std::make_shared<Call>();
  call->forget = [this](GenerateCall* c) { Forget(c); };
  call->engine = &engine_;
  call->transfers = transfers_.get();
  call->metrics = &metrics_;
  call->request_id = req->request_id();
  call->transfer_id = req->transfer_id();
  call->n_prompt = req->prompt_size();
  call->accepted = absl::Now();
  StreamHooks hooks;
  hooks.on_client_gone = [call] { call->ClientGone(); };
  hooks.before_finish = [this] { --handlers_; };  // before the client sees the end (the drain)
  hooks.on_done = [call] { call->MarkRpcDone(); };
  call->stream = std::make_shared<Call::Stream>(std::move(hooks));
  grpc::ServerWriteReactor<v1::GenerateResponse>* reactor = call->stream->Open();
  ++handlers_;
  {
    MutexLock lock(&calls_mu_);
    calls_[call.get()] = call;
  }
  if (grpc::Status st = CheckProtocol(*context); !st.ok()) {
    call->stream->End(st);
    call->MarkEnded();
    return reactor;
  }
  if (draining_ && req->transfer_id() == 0) {
    call->Reject(absl::UnavailableError("decode worker: draining, no new work"));
    return reactor;
  }
  DecodeRequest r;
  r.prompt.assign(req->prompt().begin(), req->prompt().end());
  absl::StatusOr<SamplingParams> sampling = SamplingFromWire(req->sampling());
  if (!sampling.ok()) {
    call->Reject(sampling.status());
    return reactor;
  }
  r.sampling = *sampling;
  r.max_tokens = req->max_tokens();
  r.stop.assign(req->stop().begin(), req->stop().end());
  r.include_stop_str = req->include_stop_str();
  r.ignore_eos = req->ignore_eos();
  r.continuation = req->continuation();
  r.stop_token_ids.assign(req->stop_token_ids().begin(), req->stop_token_ids().end());
  r.min_tokens = req->min_tokens();
  r.n = std::max(1, req->n());
  call->n_choices = r.n;
  if (req->continued_choices_size() > 0) {
    if (req->transfer_id() != 0) {
      call->Reject(absl::InvalidArgumentError(
          "Generate: continued choices are prefilled here (transfer_id 0)"));
      return reactor;
    }
    for (const v1::ContinuedChoice& w : req->continued_choices()) {
      ContinuedChoice& c = r.continued_choices.emplace_back();
      c.choice = w.choice();
      c.tokens.assign(w.tokens().begin(), w.tokens().end());
      c.max_tokens = w.max_tokens();
      c.min_tokens = w.min_tokens();
    }
    call->n_choices = req->continued_choices_size();  // the call ends after their final events
  }
  if (req->prompt_logprobs()) r.prompt_logprobs = req->prompt_top_logprobs();
  if (req->prompt_logprobs() && req->transfer_id() != 0) {
    call->Reject(absl::InvalidArgumentError(
        "Generate: prompt log-probabilities need the prompt prefilled here (transfer_id 0)"));
    return reactor;
  }
  if (req->has_pop_control() && !req->pop_control().variant().empty()) {
    absl::StatusOr<PopControl> pc =
        PopControlFromWire(req->pop_control(), engine_.model().config.n_layers);
    if (!pc.ok()) {
      call->Reject(pc.status());
      return reactor;
    }
    r.pop_control = *std::move(pc);
  }
  if (req->has_constraint() && !req->constraint().regex().empty()) {
    // Compiled here, on the call's thread, not the engine's: a new pattern costs milliseconds
    // (the masks come later, one per automaton state, as the steps reach them).
    absl::StatusOr<std::shared_ptr<structured::TokenConstraint>> c =
        engine_.CompileConstraint(req->constraint().regex());
    if (!c.ok()) {
      call->Reject(absl::InvalidArgumentError(
          absl::StrCat("request: structured output: ", c.status().message())));
      return reactor;
    }
    r.constraint = *std::move(c);
    r.constraint_generated = req->constraint().generated();
  }
  if (absl::Status v = engine_.Validate(r); !v.ok()) {
    call->Reject(v);
    return reactor;
  }
  {
    MutexLock lock(&call->mu);
    call->request = std::move(r);
  }
  if (call->transfer_id == 0) {
    Submit(call);
  } else {
    // Bounded by the lease: the reaper ends a transfer that does not complete in time.
    transfers_->WhenSettled(call->transfer_id, [this, call] { TransferSettled(call); });
  }
  return reactor;
}

void DecodeService::TransferSettled(const std::shared_ptr<Call>& call) {
  const uint64_t tid = call->transfer_id;
  absl::StatusOr<bool> done = transfers_->AwaitComplete(tid, absl::ZeroDuration());
  if (done.ok() && !*done) {  // not settled after all: wait on
    transfers_->WhenSettled(tid, [this, call] { TransferSettled(call); });
    return;
  }
  bool gone = false;
  {
    MutexLock lock(&call->mu);
    gone = call->client_gone;
  }
  if (!done.ok()) {
    if (gone) {
      metrics_.GenerateDone("cancelled", call->n_prompt, 0, 0, GenerateTimes{});
      call->MarkEnded();
    } else if (absl::IsCancelled(done.status())) {
      call->EndCancelled(done.status().ToString());
    } else {
      call->Reject(done.status());
    }
    return;
  }
  absl::StatusOr<AdoptedKv> a = transfers_->Adopt(tid, call->n_prompt);
  if (!a.ok()) {
    call->Reject(a.status());
    return;
  }
  {
    MutexLock lock(&call->mu);
    call->request.reserved_kv_seq = a->kv_seq;
    call->request.reserved_slots = a->n_slots;
    call->request.reserved_trimmed = a->trimmed;
  }
  Submit(call);
}

void DecodeService::Submit(const std::shared_ptr<Call>& call) {
  DecodeRequest r;
  {
    MutexLock lock(&call->mu);
    r = std::move(call->request);
    call->submitted = absl::Now();
  }
  const int32_t adopted_kv = r.reserved_kv_seq;
  r.on_event = [call](const TokenEvent& ev) { call->OnEvent(ev); };
  absl::StatusOr<int64_t> id = engine_.Submit(std::move(r));
  if (!id.ok()) {
    if (adopted_kv >= 0) engine_.ReleaseKv(adopted_kv);
    call->Reject(id.status());
    return;
  }
  bool cancel_now = false;
  {
    MutexLock lock(&call->mu);
    call->engine_id = *id;
    cancel_now = call->cancelled || call->client_gone;
  }
  if (cancel_now) engine_.Cancel(*id);
}

}  // namespace tripod
