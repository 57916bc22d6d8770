#include "decode_node/generate_call.h"

#include <utility>

#include "common/model/utf8.h"

namespace tripod {
namespace {

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
  out->set_choice(ev.choice);
  for (const PromptTokenLogprob& p : ev.prompt_logprobs) {
    v1::PromptLogprob* w = out->add_prompt_logprobs();
    w->set_position(p.position);
    w->set_token(p.token);
    w->set_logprob(p.logprob);
    w->set_rank(p.rank);
    for (const TokenLogprob& t : p.top) {
      v1::TopLogprob* tw = w->add_top();
      tw->set_token(t.id);
      tw->set_logprob(t.logprob);
    }
  }
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

void GenerateCall::OnEvent(const TokenEvent& ev) {
  const absl::Time now = absl::Now();
  v1::GenerateResponse out;
  EventToWire(ev, &out);
  const bool final = ev.finish != FinishReason::kNone;
  int done_completion = 0;
  GenerateTimes times;
  bool gone = false;
  bool last = false;  // the last choice's final event: the call ends
  int64_t id = 0;
  {
    MutexLock lock(&mu);
    if (choice_completion.size() <= static_cast<size_t>(ev.choice)) {
      choice_completion.resize(ev.choice + 1, 0);
    }
    if (ev.token >= 0) {
      ++choice_completion[ev.choice];
      ++completion;
      if (completion == 1) first_token = now;
      if (completion > 1) metrics->InterToken(Seconds(now - last_token));
      last_token = now;
    }
    if (final) {
      last = ++choices_ended >= n_choices;
      v1::Usage* u = out.mutable_usage();
      u->set_prompt_tokens(n_prompt);
      u->set_completion_tokens(choice_completion[ev.choice]);
      u->set_cached_tokens(ev.cached_tokens);
      v1::DecodeTiming* t = out.mutable_timing();
      t->set_queue_s(ev.queue_seconds >= 0 ? Seconds(submitted - accepted) + ev.queue_seconds
                                           : Seconds(now - accepted));
      if (completion > 0) {
        t->set_first_token_s(Seconds(first_token - accepted));
        t->set_decode_s(Seconds(last_token - first_token));
      }
      times.ttft_s = completion > 0 ? Seconds(first_token - accepted) : -1;
      times.tpot_s = completion > 1 ? Seconds(last_token - first_token) / (completion - 1) : -1;
      times.decode_s = completion > 0 ? Seconds(last_token - first_token) : -1;
      times.queue_s = ev.queue_seconds >= 0 ? Seconds(submitted - accepted) + ev.queue_seconds : -1;
      times.e2e_s = Seconds(now - accepted);
      done_completion = completion;
      gone = client_gone;
      id = engine_id;
    }
  }
  if (last) {
    const char* name = gone ? "cancelled" : FinishReasonName(ev.finish);
    metrics->GenerateDone(name, n_prompt, done_completion, ev.cached_tokens, times);
    spdlog::info(
        "generate request_id={} id={} transfer={} prompt={} cached={} completion={} finish={} "
        "ttft={:.3f}s{}{}",
        request_id, id, transfer_id, n_prompt, ev.cached_tokens, done_completion, name,
        times.ttft_s, gone ? " (client went away)" : "",
        ev.error.empty() ? std::string() : " error: " + ev.error);
  }
  // Written after the metrics: a client that has the last event sees them counted.
  stream->Write(std::move(out));  // dropped if the client is gone
  if (last) {
    stream->End(grpc::Status::OK);
    MarkEnded();
  }
}

}  // namespace tripod
