// DecodeEngine; see decode_engine.h.
#include "decode_node/decode_engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/compute/session.h"
#include "common/compute/step_batch.h"
#include "common/kv/hiding_kv_store.h"
#include "common/kv/kv_dtype.h"
#include "common/model/position_logprobs.h"
#include "common/util/core_share.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "decode_node/continued_choices.h"
#include "decode_node/stop_matcher.h"

namespace tripod {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

struct DecodeEngine::Sequence {
  Sequence(DecodeRequest r, const Tokenizer& tok, int32_t vocab)
      : req(std::move(r)),
        sampler(req.sampling, vocab),
        decoder(tok, req.continuation),
        stop(req.stop, req.include_stop_str) {
    if (req.constraint != nullptr) {
      constraint_state = req.constraint->start();
      const size_t n = req.prompt.size();
      const size_t k = std::min<size_t>(std::max(req.constraint_generated, 0), n);
      for (size_t i = n - k; i < n && constraint_state >= 0; ++i) {
        constraint_state = req.constraint->Advance(constraint_state, req.prompt[i]);
      }
    }
    if (req.min_tokens > 0) {
      held_back = req.stop_token_ids;
      if (!req.ignore_eos) {
        const std::span<const int32_t> eog = tok.end_of_generation_ids();
        held_back.insert(held_back.end(), eog.begin(), eog.end());
      }
    }
  }
  SchedSeq sched;
  DecodeRequest req;
  Sampler sampler;
  StreamingDecoder decoder;
  StopMatcher stop;
  std::vector<int32_t> held_back;                         // kept out of the draw before min_tokens
  int32_t constraint_state = structured::ByteDfa::kDead;  // with req.constraint
  int choice = 0;                                         // DecodeRequest::n's index
  int64_t group = 0;      // the id Submit returned (its Cancel ends every choice)
  int forks_pending = 0;  // choices still to fork from this one's prompt (choice 0 only)
  int n_generated = 0;
  int prompt_lp_next = 1;  // the next prompt position whose log-probability is owed
  double submitted = 0;    // Now() at Submit
  double first_run = -1;   // Now() when first scheduled
};

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Create(
    const DecodeEngineOptions& options, std::unique_ptr<Backend> backend, KvDtype default_kv) {
  if (options.max_tokens_per_step < 1 || options.max_running < 1 || options.block_tokens < 1) {
    return absl::InvalidArgumentError(
        "decode engine: max_tokens_per_step, max_running and block_tokens must be >= 1");
  }
  std::unique_ptr<DecodeEngine> e(new DecodeEngine());
  e->options_ = options;
  e->backend_ = std::move(backend);
  const std::string path = options.model_path.empty() ? BundledModelPath() : options.model_path;
  ASSIGN_OR_RETURN(e->model_, LoadModel(path, *e->backend_));
  ASSIGN_OR_RETURN(e->tokenizer_, Tokenizer::FromGguf(*e->model_->gguf));
  e->constraints_ = std::make_unique<structured::ConstraintCache>(*e->tokenizer_);
  const ModelConfig& c = e->model_->config;
  if (!e->model_->output) {
    return absl::FailedPreconditionError("decode engine: the model has no output head");
  }
  PagedKvOptions kv;
  kv.layout.n_layers = c.n_layers;
  kv.layout.n_kv_heads = c.n_kv_heads;
  kv.layout.head_dim = c.head_dim;
  ASSIGN_OR_RETURN(kv.layout.dtype, ParseKvDtype(options.kv_cache_dtype, default_kv));
  RETURN_IF_ERROR(e->backend_->Supports(c, kv.layout.dtype));
  kv.device = e->backend_->DeviceKvMemory();
  kv.block_tokens = options.block_tokens;
  kv.budget_bytes = options.kv_budget_bytes;
  kv.watermark = options.watermark;
  ASSIGN_OR_RETURN(e->cache_, PagedKvCache::Create(kv));
  e->ws_ = std::make_unique<ForwardWorkspace>(*e->backend_);
  e->plan_ = ForwardPlan::Full(c.n_layers);
  e->sched_config_.max_tokens_per_step = options.max_tokens_per_step;
  e->sched_config_.max_running = options.max_running;
  e->sched_config_.plan_key = e->plan_.KvKey();
  e->context_ = options.context_tokens > 0 ? std::min(options.context_tokens, c.context_length)
                                           : c.context_length;
  e->UpdateGauges();
  return e;
}

DecodeEngine::~DecodeEngine() {
  Stop();
  // Whatever is still in flight ends as cancelled, so that no stream is left open.
  Intake();
  std::vector<int64_t> ids;
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) {
    TokenEvent ev;
    ev.finish = FinishReason::kCancelled;
    Finish(*seqs_.at(id), std::move(ev));
  }
  for (const auto& [kv, r] : reservations_) cache_->FreeSequence(kv);
  reservations_.clear();
}

absl::StatusOr<std::shared_ptr<structured::TokenConstraint>> DecodeEngine::CompileConstraint(
    std::string_view regex) {
  return constraints_->Get(regex);
}

absl::Status DecodeEngine::Validate(const DecodeRequest& r) const {
  if (!r.continued_choices.empty()) return ValidateContinuedChoices(r);
  const ModelConfig& c = model_->config;
  const int n = static_cast<int>(r.prompt.size());
  if (n == 0) return absl::InvalidArgumentError("request: the prompt is empty");
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request: token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  if (n >= context_) {
    return absl::InvalidArgumentError(
        absl::StrCat("request: the prompt has ", n, " tokens; the context holds ", context_));
  }
  if (r.max_tokens < 0) return absl::InvalidArgumentError("request: max_tokens must be >= 0");
  if (r.n < 1 || r.n > kMaxChoices) {
    return absl::InvalidArgumentError(
        absl::StrCat("request: n ", r.n, " is not in [1, ", kMaxChoices, "]"));
  }
  if (r.n > 1 && r.continuation) {
    return absl::InvalidArgumentError("request: a continuation has one choice");
  }
  if (r.min_tokens < 0 || r.min_tokens > r.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request: min_tokens ", r.min_tokens, " is not in [0, max_tokens ", r.max_tokens, "]"));
  }
  if (r.stop_token_ids.size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat("request: ", r.stop_token_ids.size(),
                                                   " stop token ids; at most ", kMaxStopTokenIds));
  }
  for (size_t i = 0; i < r.stop_token_ids.size(); ++i) {
    const int32_t t = r.stop_token_ids[i];
    if (t < 0 || t >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request: stop token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")"));
    }
    if (i > 0 && t <= r.stop_token_ids[i - 1]) {
      return absl::InvalidArgumentError("request: stop token ids must be sorted, each once");
    }
  }
  RETURN_IF_ERROR(r.sampling.Validate());
  if (r.kv != nullptr) {
    const KvSnapshot& s = *r.kv;
    if (s.layout.n_layers != c.n_layers || s.layout.n_kv_heads != c.n_kv_heads ||
        s.layout.head_dim != c.head_dim) {
      return absl::InvalidArgumentError("request: the KV snapshot's layout is not the model's");
    }
    RETURN_IF_ERROR(ValidateSnapshot(s, n - 1));
    if (s.trimmed() ? s.n_slots > n - 1 : s.n_slots != n - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("request: the KV snapshot holds ", s.n_slots, " slots for ", n - 1,
                       " prompt tokens (untrimmed KV must cover exactly tokens 0..n-2)"));
    }
  }
  if (const PopControl& pc = r.pop_control; pc.variant != PopVariant::kPop) {
    for (int l : pc.skipped) {
      if (l <= 0 || l >= c.n_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("request: POP control layer ", l, " is outside [1, ", c.n_layers, ")"));
      }
    }
    if (pc.prompt_tokens < 1 || pc.prompt_tokens > n) {
      return absl::InvalidArgumentError(absl::StrCat("request: POP control's prompt of ",
                                                     pc.prompt_tokens, " tokens is outside [1, ", n,
                                                     "]"));
    }
    if (r.kv != nullptr || r.reserved_trimmed) {
      return absl::InvalidArgumentError(
          "request: a POP control runs on untrimmed KV from a reservation or its own prefill, "
          "not on a snapshot or trimmed KV");
    }
  }
  if (r.prompt_logprobs >= 0) {
    if (r.prompt_logprobs > SamplingParams::kMaxTopLogprobs) {
      return absl::InvalidArgumentError(absl::StrCat("request: prompt_logprobs ", r.prompt_logprobs,
                                                     " is not in [0, ",
                                                     SamplingParams::kMaxTopLogprobs, "]"));
    }
    // The logits of every prompt position come from this engine's full plan over the whole
    // prompt: KV made elsewhere or a pruned control would give none, or other numbers.
    if (r.kv != nullptr || r.reserved_kv_seq >= 0 || r.pop_control.active()) {
      return absl::InvalidArgumentError(
          "request: prompt log-probabilities need the prompt prefilled here with the full model "
          "(no transferred KV, no POP control)");
    }
  }
  if (r.reserved_kv_seq >= 0) {
    if (r.kv != nullptr) {
      return absl::InvalidArgumentError("request: both a KV snapshot and a KV reservation");
    }
    if (r.reserved_trimmed ? r.reserved_slots < 0 || r.reserved_slots > n - 1
                           : r.reserved_slots != n - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("request: the KV reservation holds ", r.reserved_slots, " slots for ", n - 1,
                       " prompt tokens (untrimmed KV must cover exactly tokens 0..n-2)"));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeEngine::ValidateContinuedChoices(const DecodeRequest& r) const {
  if (r.n != 1 || r.continuation) {
    return absl::InvalidArgumentError(
        "request: continued choices come with n 1 and no continuation (each is one)");
  }
  if (r.continued_choices.size() > static_cast<size_t>(kMaxChoices)) {
    return absl::InvalidArgumentError(absl::StrCat("request: ", r.continued_choices.size(),
                                                   " continued choices; at most ", kMaxChoices));
  }
  if (r.kv != nullptr || r.reserved_kv_seq >= 0) {
    return absl::InvalidArgumentError(
        "request: continued choices are prefilled here (no transferred KV)");
  }
  std::vector<bool> seen(kMaxChoices, false);
  for (const ChoiceSequence& s : ContinuedChoiceSequences(r)) {
    if (s.choice < 0 || s.choice >= kMaxChoices || seen[s.choice]) {
      return absl::InvalidArgumentError(absl::StrCat("request: continued choice ", s.choice,
                                                     " is outside [0, ", kMaxChoices,
                                                     ") or given twice"));
    }
    seen[s.choice] = true;
    if (s.request.max_tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("request: continued choice ", s.choice, " has no tokens left"));
    }
    RETURN_IF_ERROR(Validate(s.request));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DecodeEngine::Submit(DecodeRequest r) {
  RETURN_IF_ERROR(Validate(r));
  if (r.continued_choices.empty()) return Enqueue({ChoiceSequence{0, std::move(r)}});
  return Enqueue(ContinuedChoiceSequences(r));
}

int64_t DecodeEngine::Enqueue(std::vector<ChoiceSequence> parts) {
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (ChoiceSequence& p : parts) {
    seqs.push_back(NewSequence(std::move(p.request)));
    seqs.back()->choice = p.choice;
  }
  MutexLock lock(&mu_);
  const int64_t id = next_id_;
  for (std::unique_ptr<Sequence>& seq : seqs) {
    seq->sched.id = next_id_++;
    seq->group = id;
    incoming_.push_back(std::move(seq));
  }
  cv_.Signal();
  return id;
}

std::unique_ptr<DecodeEngine::Sequence> DecodeEngine::NewSequence(DecodeRequest r) {
  const ModelConfig& c = model_->config;
  const int n = static_cast<int>(r.prompt.size());
  auto seq = std::make_unique<Sequence>(std::move(r), *tokenizer_, c.vocab_size);
  seq->sched.tokens = seq->req.prompt;
  seq->sched.n_prompt = n;
  seq->sched.snapshot = seq->req.kv.get();
  if (seq->req.prompt_logprobs >= 0) {
    seq->sched.bypass_prefix_cache = true;
    seq->sched.max_chunk = kPromptLogprobRows;
  }
  if (seq->req.pop_control.active()) {
    seq->sched.plan_key = seq->req.pop_control.MixKey(plan_.KvKey());
  }
  seq->forks_pending = seq->req.n - 1;
  seq->sched.fork_blocks = seq->forks_pending;
  seq->submitted = Now();
  return seq;
}

void DecodeEngine::Cancel(int64_t id) {
  MutexLock lock(&mu_);
  cancels_.insert(id);
  cv_.Signal();
}

bool DecodeEngine::idle() const {
  MutexLock lock(&mu_);
  return incoming_.empty() && active_ == 0;
}

DecodeEngine::KvUsage DecodeEngine::kv_usage() const {
  KvUsage u;
  u.blocks = cache_->num_blocks() - cache_->num_free_blocks();
  for (const SchedSeq* s : queues_.running) u.slots += s->kv_len;
  return u;
}

DecodeEngineStats DecodeEngine::stats() const {
  MutexLock lock(&mu_);
  DecodeEngineStats st = stats_;
  st.waiting += static_cast<int>(incoming_.size());
  return st;
}

void DecodeEngine::UpdateGauges() {
  MutexLock lock(&mu_);
  stats_.waiting = static_cast<int>(queues_.waiting.size());
  stats_.running = static_cast<int>(queues_.running.size());
  stats_.reservations = static_cast<int>(reservations_.size());
  stats_.free_blocks = cache_->num_free_blocks();
  stats_.total_blocks = cache_->num_blocks();
}

bool DecodeEngine::Post(std::function<void()> task) {
  MutexLock lock(&mu_);
  if (!loop_running_) return false;
  tasks_.push_back(std::move(task));
  cv_.Signal();
  return true;
}

void DecodeEngine::RunTasks() {
  std::deque<std::function<void()>> tasks;
  {
    MutexLock lock(&mu_);
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t();
  if (!tasks.empty()) UpdateGauges();
}

absl::StatusOr<KvReservation> DecodeEngine::ReserveKv(int n_slots, uint64_t plan_key,
                                                      std::vector<int32_t> layer_first) {
  absl::StatusOr<KvReservation> result;
  Notification done;
  // The gauges are brought up to date before the caller wakes: a Health right after Reserve
  // must see the blocks taken.
  auto task = [&] {
    result = ReserveOnEngine(n_slots, plan_key, std::move(layer_first));
    UpdateGauges();
    done.Notify();
  };
  if (!Post(task)) task();
  done.WaitForNotification();
  return result;
}

absl::StatusOr<KvReservation> DecodeEngine::ReserveOnEngine(int n_slots, uint64_t plan_key,
                                                            std::vector<int32_t> layer_first) {
  PagedKvCache& c = *cache_;
  const int room = n_slots + 1;  // the last prompt token runs in the reservation's blocks
  if (n_slots < 0 || room >= context_) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV reservation: ", n_slots, " slots; the context holds ", context_));
  }
  if (!layer_first.empty()) {
    if (layer_first.size() != static_cast<size_t>(c.layout().n_layers)) {
      return absl::InvalidArgumentError(absl::StrCat("KV reservation: ", layer_first.size(),
                                                     " per-layer first slots for ",
                                                     c.layout().n_layers, " layers"));
    }
    for (size_t l = 0; l < layer_first.size(); ++l) {
      if (layer_first[l] < 0 || layer_first[l] > n_slots) {
        return absl::InvalidArgumentError(absl::StrCat("KV reservation: layer ", l,
                                                       "'s first slot ", layer_first[l],
                                                       " is outside [0, ", n_slots, "]"));
      }
    }
  }
  const int need = c.BlocksFor(room);
  if (need > c.num_blocks() - c.watermark_blocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV reservation: ", n_slots, " slots need ", need, " blocks of ",
                     c.block_tokens(), " tokens; the cache has ", c.num_blocks(), " (watermark ",
                     c.watermark_blocks(), "): it can never fit, raise the KV budget"));
  }
  if (!c.CanAdmit(room)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV reservation: ", n_slots, " slots need ", need, " blocks; ", c.num_free_blocks(), " of ",
        c.num_blocks(), " are free and ", c.watermark_blocks(),
        " are kept free (watermark): the worker is full for now"));
  }
  const int32_t kv = c.NewSequence(sched_config_.plan_key);
  if (!c.EnsureCapacity(kv, room)) {
    c.FreeSequence(kv);
    return absl::ResourceExhaustedError(
        absl::StrCat("KV reservation: could not allocate ", need, " blocks"));
  }
  reservations_[kv] = Reserved{n_slots, plan_key, layer_first};
  KvReservation r;
  r.kv_seq = kv;
  r.n_slots = n_slots;
  r.blocks = need;
  r.layer_first = std::move(layer_first);
  r.store = c.WriteView(kv);
  return r;
}

void DecodeEngine::ReleaseKv(int32_t kv_seq) {
  Notification done;
  auto task = [&] {
    if (reservations_.erase(kv_seq) > 0) cache_->FreeSequence(kv_seq);
    UpdateGauges();
    done.Notify();
  };
  if (!Post(task)) task();
  done.WaitForNotification();
}

absl::Status DecodeEngine::Adopt(Sequence& s) {
  const int32_t kv = s.req.reserved_kv_seq;
  auto it = reservations_.find(kv);
  if (it == reservations_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request: KV reservation ", kv, " is unknown (released, expired or already adopted)"));
  }
  const Reserved r = it->second;
  reservations_.erase(it);
  // From here the sequence owns the blocks: ReleaseSequence frees them whatever happens.
  s.sched.reserved_kv = kv;
  s.sched.reserved_slots = s.req.reserved_slots;
  if (r.n_slots != s.req.reserved_slots) {
    return absl::InvalidArgumentError(absl::StrCat("request: KV reservation ", kv, " holds ",
                                                   r.n_slots, " slots, the request says ",
                                                   s.req.reserved_slots));
  }
  std::span<const int32_t> tokens;
  if (!s.req.reserved_trimmed) {
    tokens = std::span<const int32_t>(s.req.prompt).first(s.req.prompt.size() - 1);
  }
  if (!r.layer_first.empty() && !s.req.reserved_trimmed) {
    return absl::InvalidArgumentError(absl::StrCat("request: KV reservation ", kv,
                                                   " has per-layer first slots, which only "
                                                   "trimmed KV fills"));
  }
  return cache_->FinishExternalFill(kv, r.n_slots, tokens, s.req.pop_control.MixKey(r.plan_key),
                                    r.layer_first);
}

void DecodeEngine::Intake() {
  RunTasks();
  std::deque<std::unique_ptr<Sequence>> in;
  absl::flat_hash_set<int64_t> cancels;
  {
    MutexLock lock(&mu_);
    in.swap(incoming_);
    cancels.swap(cancels_);
    active_ += static_cast<int64_t>(in.size());
  }
  for (auto& s : in) {
    queues_.waiting.push_back(&s->sched);
    const int64_t id = s->sched.id;
    Sequence& seq = *s;
    seqs_[id] = std::move(s);
    if (seq.req.reserved_kv_seq >= 0) {
      if (absl::Status st = Adopt(seq); !st.ok()) {
        TokenEvent ev;
        ev.finish = FinishReason::kError;
        ev.error = st.ToString();
        Finish(seq, std::move(ev));
        continue;
      }
      MutexLock lock(&mu_);
      ++stats_.adopted;
    }
  }
  std::vector<int64_t> ids(cancels.begin(), cancels.end());
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) {
    // The id Submit returned names every choice of the request; a choice's own id just it.
    std::vector<int64_t> ended;
    for (const auto& [sid, seq] : seqs_) {
      if (sid == id || seq->group == id) ended.push_back(sid);
    }
    std::sort(ended.begin(), ended.end());
    for (int64_t sid : ended) {
      TokenEvent ev;
      ev.finish = FinishReason::kCancelled;
      Finish(*seqs_.at(sid), std::move(ev));
    }
  }
}

void DecodeEngine::Finish(Sequence& s, TokenEvent ev) {
  const int64_t id = s.sched.id;
  ReleaseSequence(&s.sched, queues_, *cache_);
  ev.request_id = id;
  ev.choice = s.choice;
  if (ev.token < 0) ev.index = s.n_generated;
  ev.cached_tokens = s.sched.cached_slots;
  ev.queue_seconds = s.first_run < 0 ? -1 : s.first_run - s.submitted;
  TokenCallback cb = std::move(s.req.on_event);
  // Ended before its prompt forked (cancelled, failed): the choices it would have made end too,
  // each with its own final event, none with a token.
  const int unforked = s.forks_pending;
  seqs_.erase(id);  // s is gone
  {
    MutexLock lock(&mu_);
    --active_;
    ++stats_.finished;
    // Before the last event goes out, so that whoever sees it sees the blocks free too.
    stats_.waiting = static_cast<int>(queues_.waiting.size());
    stats_.running = static_cast<int>(queues_.running.size());
    stats_.free_blocks = cache_->num_free_blocks();
  }
  if (!cb) return;
  for (int c = 1; c <= unforked; ++c) {
    TokenEvent other;
    other.request_id = id;
    other.choice = c;
    other.finish = ev.finish;
    other.error = ev.error;
    other.cached_tokens = ev.cached_tokens;
    other.queue_seconds = ev.queue_seconds;
    cb(other);
  }
  cb(ev);
}

void DecodeEngine::EmitToken(Sequence& s, SampledToken st) {
  TokenEvent ev;
  ev.token = st.id;
  ev.choice = s.choice;
  ev.index = s.n_generated++;
  ev.logprob = st.logprob;
  ev.top_logprobs = std::move(st.top);
  s.sched.tokens.push_back(st.id);
  const bool constrained = s.req.constraint != nullptr;
  if (constrained) s.constraint_state = s.req.constraint->Advance(s.constraint_state, st.id);

  if ((!s.req.ignore_eos || constrained) && tokenizer_->IsEndOfGeneration(st.id)) {
    // The end token's own text is not streamed; what was held back for a stop string is.
    ev.text = s.stop.Push(s.decoder.Flush()).text;
    ev.text += s.stop.Flush();
    ev.finish = FinishReason::kStop;
    return Finish(s, std::move(ev));
  }
  const bool stop_token =
      std::binary_search(s.req.stop_token_ids.begin(), s.req.stop_token_ids.end(), st.id);
  if (stop_token && tokenizer_->token_type(st.id) == TokenType::kControl) {
    ev.text = s.stop.Push(s.decoder.Flush()).text;  // a control token's text is not output
    ev.text += s.stop.Flush();
    ev.finish = FinishReason::kStop;
    return Finish(s, std::move(ev));
  }
  StopMatcher::Result r = s.stop.Push(s.decoder.Push(st.id));
  ev.text = std::move(r.text);
  if (r.stopped) {
    ev.finish = FinishReason::kStop;
    return Finish(s, std::move(ev));
  }
  if (stop_token) {  // its text is out: flush what was held for a character or a stop string
    r = s.stop.Push(s.decoder.Flush());
    ev.text += r.text;
    if (!r.stopped) ev.text += s.stop.Flush();
    ev.finish = FinishReason::kStop;
    return Finish(s, std::move(ev));
  }
  if (s.n_generated >= s.req.max_tokens || static_cast<int>(s.sched.tokens.size()) >= context_) {
    r = s.stop.Push(s.decoder.Flush());
    ev.text += r.text;
    if (!r.stopped) ev.text += s.stop.Flush();
    ev.finish = r.stopped ? FinishReason::kStop : FinishReason::kLength;
    return Finish(s, std::move(ev));
  }
  ev.text_held = s.decoder.holding() || s.stop.holding();
  if (s.req.on_event) {
    ev.request_id = s.sched.id;
    s.req.on_event(ev);
  }
}

void DecodeEngine::ForkChoices(Sequence& parent, const float* logits) {
  const int n = parent.forks_pending + 1;
  parent.forks_pending = 0;
  parent.sched.fork_blocks = 0;
  for (int c = 1; c < n; ++c) {
    DecodeRequest r = parent.req;
    r.kv = nullptr;  // the choice runs on the forked KV; preempted, it recomputes
    r.reserved_kv_seq = -1;
    r.sampling.seed = parent.req.sampling.seed + static_cast<uint64_t>(c);
    auto child = std::make_unique<Sequence>(std::move(r), *tokenizer_, model_->config.vocab_size);
    child->choice = c;
    child->group = parent.group;
    child->submitted = parent.submitted;
    child->first_run = parent.first_run;
    SchedSeq& cs = child->sched;
    const SchedSeq& ps = parent.sched;
    cs.tokens = ps.tokens;
    cs.n_prompt = ps.n_prompt;
    cs.plan_key = ps.plan_key;
    cs.cached_slots = ps.cached_slots;
    cs.kv_seq = cache_->Fork(ps.kv_seq);
    if (cs.kv_seq >= 0) {
      cs.n_computed = ps.n_computed;
      cs.kv_len = ps.kv_len;
      queues_.running.push_back(&cs);
    } else {
      // No block for the copy of the last partly filled block: the choice waits at the front
      // and recomputes its prompt (from the prefix cache where it can) and its first token.
      queues_.waiting.push_front(&cs);
    }
    {
      MutexLock lock(&mu_);
      cs.id = next_id_++;
      ++active_;
    }
    Sequence* raw = child.get();
    seqs_[cs.id] = std::move(child);
    sampling_.push_back({raw, logits, {}});
  }
}

absl::Status DecodeEngine::RunControlledChunk(const ScheduledChunk& c, std::vector<float>* logits) {
  const SchedSeq& s = *c.seq;
  const PopControl& pc = seqs_.at(s.id)->req.pop_control;
  const int L = model_->config.n_layers;
  const int begin = s.n_computed, end = s.n_computed + c.n_tokens;
  // Rows before the boundary run the prompt stage's plan, the rest the decode stage's: the chunk
  // splits where it crosses the boundary. Slots follow positions (untrimmed KV).
  const int split = std::clamp(pc.boundary(), begin, end);
  const std::vector<bool> hidden = pc.HiddenLayers(L);
  HidingKvStore hiding(*cache_, hidden, pc.prompt_tokens - 1);
  std::vector<float> rows;
  for (int part = 0; part < 2; ++part) {
    const int a = part == 0 ? begin : split, b = part == 0 ? split : end;
    if (a == b) continue;
    const bool want = c.wants_logits && b == end;
    StepBatch batch;
    batch.AddSequence(s.kv_seq, s.tokens.data() + a, b - a, a, s.kv_len + (a - begin), want);
    const ForwardPlan plan = part == 0 ? pc.PromptPlan(L) : pc.DecodePlan(L);
    KvStore& kv = part == 1 && !hidden.empty() ? static_cast<KvStore&>(hiding) : *cache_;
    RETURN_IF_ERROR(Forward(*model_, *backend_, plan, batch, kv, *ws_, want ? &rows : nullptr));
    if (want) *logits = std::move(rows);
  }
  return absl::OkStatus();
}

void DecodeEngine::EmitPromptLogprobs(const StepSchedule& sched,
                                      std::span<const ChunkLogits> rows) {
  struct Row {
    Sequence* seq;
    size_t logits_row;
    int position;
  };
  std::vector<Row> todo;
  for (size_t i = 0; i < sched.chunks.size(); ++i) {
    for (int j = 0; j < rows[i].n_prompt_rows; ++j) {
      todo.push_back({seqs_.at(sched.chunks[i].seq->id).get(), rows[i].first_row + j,
                      rows[i].first_position + j});
    }
  }
  if (todo.empty()) return;
  const int32_t vocab = model_->config.vocab_size;
  std::vector<PromptTokenLogprob> out(todo.size());
  // A pass over a vocabulary row each (log-sum-exp, rank, top-k): parallel over the rows.
  ParallelFor(static_cast<int64_t>(todo.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const Row& r = todo[i];
      const int32_t token = r.seq->sched.tokens[r.position];
      PositionLogprobs lp =
          LogprobsAt(std::span<const float>(logits_.data() + r.logits_row * vocab, vocab), token,
                     r.seq->req.prompt_logprobs);
      out[i] = {r.position, token, lp.logprob, lp.rank, std::move(lp.top)};
    }
  });
  // One event per sequence, in position order (the rows of a chunk are consecutive).
  for (size_t i = 0; i < todo.size();) {
    Sequence& seq = *todo[i].seq;
    TokenEvent ev;
    ev.request_id = seq.sched.id;
    ev.index = seq.n_generated;
    for (; i < todo.size() && todo[i].seq == &seq; ++i) ev.prompt_logprobs.push_back(out[i]);
    seq.prompt_lp_next = ev.prompt_logprobs.back().position + 1;
    if (seq.req.on_event) seq.req.on_event(ev);
  }
}

absl::Status DecodeEngine::Step() {
  const double t0 = Now();
  Intake();
  StepSchedule sched = ScheduleStep(sched_config_, queues_, *cache_);
  for (auto& [seq, status] : sched.failed) {
    TokenEvent ev;
    ev.finish = FinishReason::kError;
    ev.error = status.ToString();
    Finish(*seqs_.at(seq->id), std::move(ev));
  }
  int n_imported = 0;
  for (const SchedSeq* s : sched.admitted) {
    n_imported += s->snapshot != nullptr;
    Sequence& seq = *seqs_.at(s->id);
    if (seq.first_run < 0) seq.first_run = t0;
  }

  // Sequences under a POP control run apart, in forwards of their own plans
  // (RunControlledChunk); the rest as one batch under the engine's plan, as without controls.
  StepBatch batch;
  std::vector<const ScheduledChunk*> controlled;
  // Per chunk: its rows of logits_ (prompt log-probabilities first, then the sampled row).
  std::vector<ChunkLogits> chunk_logits(sched.chunks.size());
  for (size_t i = 0; i < sched.chunks.size(); ++i) {
    const ScheduledChunk& c = sched.chunks[i];
    const SchedSeq& s = *c.seq;
    const Sequence& seq = *seqs_.at(s.id);
    if (seq.req.pop_control.active()) {
      controlled.push_back(&c);
      continue;
    }
    batch.AddSequence(s.kv_seq, s.tokens.data() + s.n_computed, c.n_tokens, s.n_computed, s.kv_len,
                      false);
    ChunkLogits& rows = chunk_logits[i];
    rows.first_row = batch.logit_rows.size();
    if (seq.req.prompt_logprobs >= 0) {
      // Row r's logits give the log-probability of prompt token r + 1.
      const int row_end = std::min(s.n_computed + c.n_tokens, s.n_prompt - 1);
      rows.first_position = std::max(s.n_computed, seq.prompt_lp_next - 1) + 1;
      for (int r = rows.first_position - 1; r < row_end; ++r) {
        batch.logit_rows.push_back(batch.seqs.back().token_begin + (r - s.n_computed));
        ++rows.n_prompt_rows;
      }
    }
    if (c.wants_logits && seq.req.max_tokens > 0) {
      batch.logit_rows.push_back(batch.seqs.back().token_begin + c.n_tokens - 1);
    }
  }
  double forward_s = 0;
  absl::Status status;
  // Logits rows of the controlled chunks that want them, by chunk.
  absl::flat_hash_map<const ScheduledChunk*, std::vector<float>> control_logits;
  if (!sched.chunks.empty()) {
    const double f0 = Now();
    if (!batch.seqs.empty()) {
      status = Forward(*model_, *backend_, plan_, batch, *cache_, *ws_, &logits_);
    }
    for (const ScheduledChunk* c : controlled) {
      if (!status.ok()) break;
      status = RunControlledChunk(*c, &control_logits[c]);
    }
    forward_s = Now() - f0;
  }
  if (!status.ok()) {
    // Nothing of this step reached the cache: the scheduled sequences end with the error.
    for (const ScheduledChunk& c : sched.chunks) {
      TokenEvent ev;
      ev.finish = FinishReason::kError;
      ev.error = status.ToString();
      Finish(*seqs_.at(c.seq->id), std::move(ev));
    }
  } else {
    CommitStep(sched, *cache_);
    const int32_t vocab = model_->config.vocab_size;
    EmitPromptLogprobs(sched, chunk_logits);
    sampling_.clear();
    std::vector<Sequence*> prompt_only;  // max_tokens 0: the prompt ran, nothing to draw
    for (size_t i = 0; i < sched.chunks.size(); ++i) {
      const ScheduledChunk& c = sched.chunks[i];
      if (!c.wants_logits) continue;
      Sequence* seq = seqs_.at(c.seq->id).get();
      if (seq->req.max_tokens == 0) {
        prompt_only.push_back(seq);
        continue;
      }
      auto it = control_logits.find(&c);
      const size_t row = chunk_logits[i].first_row + chunk_logits[i].n_prompt_rows;
      const float* logits =
          it != control_logits.end() ? it->second.data() : logits_.data() + size_t{1} * row * vocab;
      sampling_.push_back({seq, logits, {}});
    }
    for (Sequence* seq : prompt_only) {
      TokenEvent ev;
      ev.finish = FinishReason::kLength;
      Finish(*seq, std::move(ev));
    }
    // A prompt that reached its first token makes its other choices now: they sample their
    // first tokens from the same row, each with its own sampler.
    for (size_t i = 0, n = sampling_.size(); i < n; ++i) {
      if (sampling_[i].seq->forks_pending > 0) ForkChoices(*sampling_[i].seq, sampling_[i].logits);
    }
    // Sampling reads a whole vocabulary row per sequence (penalties, log-sum-exp): parallel over
    // the sequences, each with its own sampler state. Events go out afterwards, in batch order.
    ParallelFor(static_cast<int64_t>(sampling_.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        Sequence& s = *sampling_[i].seq;
        std::span<const int32_t> suppress;
        if (s.n_generated < s.req.min_tokens) suppress = s.held_back;
        std::span<const uint64_t> allowed;
        if (s.req.constraint != nullptr) allowed = s.req.constraint->Mask(s.constraint_state).bits;
        sampling_[i].token =
            s.sampler.Sample(std::span<const float>(sampling_[i].logits, vocab), s.sched.tokens,
                             static_cast<size_t>(s.sched.n_prompt), suppress, allowed);
      }
    });
    for (SampledSeq& ss : sampling_) EmitToken(*ss.seq, std::move(ss.token));
    MutexLock lock(&mu_);
    stats_.generated_tokens += static_cast<int64_t>(sampling_.size());
  }
  MutexLock lock(&mu_);
  if (!sched.chunks.empty()) ++stats_.steps;
  stats_.forward_tokens += sched.n_tokens;
  stats_.preemptions += static_cast<int64_t>(sched.preempted.size());
  stats_.prefix_hit_slots += sched.attached_slots;
  stats_.prefix_queries += sched.queried_tokens;
  stats_.imported += n_imported;
  stats_.max_batch_seqs = std::max(stats_.max_batch_seqs, static_cast<int>(sched.chunks.size()));
  stats_.forward_seconds += forward_s;
  stats_.step_seconds += Now() - t0;
  stats_.waiting = static_cast<int>(queues_.waiting.size());
  stats_.running = static_cast<int>(queues_.running.size());
  stats_.reservations = static_cast<int>(reservations_.size());
  stats_.free_blocks = cache_->num_free_blocks();
  stats_.total_blocks = cache_->num_blocks();
  return status;
}

absl::Status DecodeEngine::RunUntilIdle() {
  absl::Status first;
  while (!idle()) {
    absl::Status s = Step();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

// While a neighbour's prompts queue, the decode loop's steps take at most 1 / (1 + kYieldSteps)
// of the time (DecodeEngineOptions::yield_to_prefill_ms).
constexpr double kYieldSteps = 4;

void DecodeEngine::Loop() {
  // This thread has its own OpenMP team: pin its workers as start-up pinned the main thread's
  // (unpinned workers on a loaded machine pass each barrier only at a scheduler tick).
  PinComputeThreads();
  int64_t steps = 0;
  // Busy (core_share.h) from its first work until it has none: idle, it lends its CPUs.
  bool busy = false;
  auto set_busy = [&busy](bool b) {
    if (b != busy) SetComputeBusy(b);
    busy = b;
  };
  const double max_yield_s = options_.yield_to_prefill_ms / 1e3;
  double last_step = Now();
  double last_step_s = 0;  // how long the last step took
  while (true) {
    {
      MutexLock lock(&mu_);
      if (!stop_ && incoming_.empty() && cancels_.empty() && tasks_.empty() && active_ == 0) {
        set_busy(false);
      }
      while (!stop_ && incoming_.empty() && cancels_.empty() && tasks_.empty() && active_ == 0) {
        cv_.Wait(&mu_);
      }
      if (stop_) {
        set_busy(false);
        return;
      }
      // Give way to a neighbour's queued prompts (DecodeEngineOptions::yield_to_prefill_ms):
      // idle, so that its prefill takes these CPUs too, until its queue empties, something new
      // arrives (the shared flag is polled: it has no wake-up) or the streams waited long enough.
      // A wait of at least kYieldSteps steps' time: where a step is slow (a large model on a
      // slow CPU), the fixed bound alone would leave decode most of the cores.
      const double bound = std::max(max_yield_s, kYieldSteps * last_step_s);
      if (max_yield_s > 0 && incoming_.empty() && cancels_.empty() && tasks_.empty() &&
          Now() - last_step < bound && CoreShareOthersBacklogged() && OnlyStartedStreams()) {
        set_busy(false);
        const double t0 = Now();
        cv_.WaitWithTimeout(&mu_, absl::Milliseconds(2));
        stats_.yielded_seconds += Now() - t0;
        continue;
      }
    }
    set_busy(true);
    const double step_start = Now();
    absl::Status s = Step();
    last_step = Now();
    last_step_s = last_step - step_start;
    if (!s.ok()) Logger("decode.engine").error("step failed: {}", s.ToString());
    MutexLock lock(&mu_);
    if (stats_.steps == steps && incoming_.empty() && cancels_.empty() && tasks_.empty() &&
        !stop_) {
      // Nothing could run (the waiting wait for blocks that KV reservations hold): sleep until
      // something arrives or a little while passes, rather than spin.
      cv_.WaitWithTimeout(&mu_, absl::Milliseconds(2));
    }
    steps = stats_.steps;
  }
}

bool DecodeEngine::OnlyStartedStreams() const {
  if (!queues_.waiting.empty()) return false;
  for (const SchedSeq* q : queues_.running) {
    if (static_cast<int>(q->tokens.size()) <= q->n_prompt) return false;  // no token out yet
  }
  return true;
}

void DecodeEngine::Start() {
  if (loop_.joinable()) return;
  {
    MutexLock lock(&mu_);
    stop_ = false;
    loop_running_ = true;
  }
  loop_ = std::thread([this] { Loop(); });
}

void DecodeEngine::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.Signal();
  }
  if (loop_.joinable()) loop_.join();
  {
    MutexLock lock(&mu_);
    loop_running_ = false;
  }
  // Tasks posted while the loop was stopping: this thread owns the engine now.
  RunTasks();
}

}  // namespace tripod
