// The decode engine on the bundled model, fp32 (batch-invariant kernels): the greedy tokens of
// many concurrent sequences equal those of each sequence run alone, also under preemption,
// cancellation, prefix-cache hits and imported KV; finish reasons, stop strings and logprobs.
#include "decode_node/decode_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/model/chat_template.h"
#include "common/util/mutex.h"
#include "common/util/thread_pool.h"
#include "tests/unit/decode_node/random_prompt.h"
#include "tests/unit/decode_node/reference_forward.h"
#include "tests/unit/decode_node/test_engine.h"
#include "tests/unit/test_model.h"

namespace tripod::decode_engine_test {
namespace {

DecodeEngineOptions Options(size_t kv_bytes = size_t{64} << 20) {
  return TestEngineOptions(kv_bytes);
}

std::unique_ptr<DecodeEngine> NewEngine(const DecodeEngineOptions& o) { return NewTestEngine(o); }

struct Stream {
  std::vector<int32_t> tokens;
  std::vector<TokenEvent> events;
  std::string text;
  FinishReason finish = FinishReason::kNone;
};

// Polls until `count` (guarded by mu) reaches `want`; false after `timeout`.
bool WaitForCount(Mutex& mu, const int& count, int want, absl::Duration timeout) {
  const absl::Time until = absl::Now() + timeout;
  while (absl::Now() < until) {
    {
      MutexLock lock(&mu);
      if (count == want) return true;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

DecodeRequest Greedy(std::vector<int32_t> prompt, int max_tokens, Stream* out) {
  DecodeRequest r = GreedyRequest(std::move(prompt), max_tokens);
  r.on_event = [out](const TokenEvent& ev) {
    EXPECT_EQ(out->finish, FinishReason::kNone) << "event after the finish";
    if (ev.token >= 0) out->tokens.push_back(ev.token);
    out->text += ev.text;
    out->finish = ev.finish;
    out->events.push_back(ev);
  };
  return r;
}

// Prompt lengths from under one KV block to several (16-token blocks), prefilled in chunks.
class DecodeEngineTest : public ::testing::Test {
 protected:
  // What a binary does at start-up (flags): pins the compute pool's workers, without which a
  // loaded machine stalls every parallel region (see thread_pool.cc).
  static void SetUpTestSuite() { PinComputeThreads(); }
};

const std::vector<int> kLengths = {5, 17, 33, 50, 71, 96, 128, 160};
constexpr int kNewTokens = 16;

// Each prompt alone through a fresh engine: the reference tokens.
std::vector<std::vector<int32_t>> AloneTokens() {
  static const auto* ref = [] {
    auto* r = new std::vector<std::vector<int32_t>>();
    auto e = NewEngine(Options());
    if (e == nullptr) return r;
    for (size_t i = 0; i < kLengths.size(); ++i) {
      Stream s;
      EXPECT_TRUE(e->Submit(Greedy(RandomPrompt(kLengths[i], 100 + i), kNewTokens, &s)).ok());
      EXPECT_TRUE(e->RunUntilIdle().ok());
      EXPECT_EQ(s.finish, FinishReason::kLength);
      r->push_back(s.tokens);
    }
    return r;
  }();
  return *ref;
}

// All prompts at once; returns each stream.
std::deque<Stream> RunConcurrent(DecodeEngine& e) {
  std::deque<Stream> streams(kLengths.size());
  for (size_t i = 0; i < kLengths.size(); ++i) {
    EXPECT_TRUE(e.Submit(Greedy(RandomPrompt(kLengths[i], 100 + i), kNewTokens, &streams[i])).ok());
  }
  EXPECT_TRUE(e.RunUntilIdle().ok());
  return streams;
}

void ExpectAllFree(const DecodeEngine& e) {
  EXPECT_TRUE(e.cache().CheckConsistency().ok()) << e.cache().CheckConsistency();
  EXPECT_EQ(e.cache().num_free_blocks(), e.cache().num_blocks());
  EXPECT_TRUE(e.idle());
}

TEST_F(DecodeEngineTest, ConcurrentGreedyEqualsAlone) {
  const auto ref = AloneTokens();
  ASSERT_EQ(ref.size(), kLengths.size());
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  std::deque<Stream> streams = RunConcurrent(*e);
  for (size_t i = 0; i < kLengths.size(); ++i) {
    EXPECT_EQ(streams[i].finish, FinishReason::kLength);
    EXPECT_EQ(streams[i].tokens, ref[i]) << "prompt of " << kLengths[i] << " tokens";
  }
  const DecodeEngineStats st = e->stats();
  EXPECT_GE(st.max_batch_seqs, 8);  // they really ran together
  EXPECT_EQ(st.generated_tokens, static_cast<int64_t>(kLengths.size()) * kNewTokens);
  EXPECT_EQ(st.preemptions, 0);
  ExpectAllFree(*e);
}

TEST_F(DecodeEngineTest, PreemptionKeepsTokens) {
  const auto ref = AloneTokens();
  // 24 blocks of 16 tokens: the longest sequence (176 tokens, 11 blocks) fits alone, all eight
  // together (~690 tokens, 46 blocks) do not.
  const size_t per_token = 2ull * 30 * 3 * 64 * 4;
  auto e = NewEngine(Options(24 * 16 * per_token));
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->cache().num_blocks(), 24);
  std::deque<Stream> streams = RunConcurrent(*e);
  for (size_t i = 0; i < kLengths.size(); ++i) {
    EXPECT_EQ(streams[i].finish, FinishReason::kLength);
    EXPECT_EQ(streams[i].tokens, ref[i]) << "prompt of " << kLengths[i] << " tokens";
  }
  EXPECT_GT(e->stats().preemptions, 0);
  ExpectAllFree(*e);
}

TEST_F(DecodeEngineTest, CancellationFreesBlocksAndLeavesOthersUnchanged) {
  const auto ref = AloneTokens();
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  std::deque<Stream> streams(kLengths.size());
  std::vector<int64_t> ids(kLengths.size());
  DecodeEngine* engine = e.get();
  for (size_t i = 0; i < kLengths.size(); ++i) {
    DecodeRequest r = Greedy(RandomPrompt(kLengths[i], 100 + i), kNewTokens, &streams[i]);
    if (i == 3) {
      // Cancel from inside the stream after the 5th token (the callback may call Cancel).
      TokenCallback inner = r.on_event;
      r.on_event = [inner, engine, &ids, i](const TokenEvent& ev) {
        inner(ev);
        if (ev.index == 4 && ev.token >= 0) engine->Cancel(ids[i]);
      };
    }
    auto id = e->Submit(std::move(r));
    ASSERT_TRUE(id.ok());
    ids[i] = *id;
  }
  e->Cancel(ids[6]);  // before it ever ran
  ASSERT_TRUE(e->RunUntilIdle().ok());
  for (size_t i = 0; i < kLengths.size(); ++i) {
    if (i == 3) {
      EXPECT_EQ(streams[i].finish, FinishReason::kCancelled);
      ASSERT_EQ(streams[i].tokens.size(), 5u);
      EXPECT_EQ(streams[i].tokens, std::vector<int32_t>(ref[i].begin(), ref[i].begin() + 5));
      EXPECT_EQ(streams[i].events.back().token, -1);
    } else if (i == 6) {
      EXPECT_EQ(streams[i].finish, FinishReason::kCancelled);
      EXPECT_TRUE(streams[i].tokens.empty());
    } else {
      EXPECT_EQ(streams[i].tokens, ref[i]) << "prompt of " << kLengths[i] << " tokens";
    }
  }
  ExpectAllFree(*e);
}

TEST_F(DecodeEngineTest, PrefixCacheHitGivesTheSameTokens) {
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(150, 7);
  Stream first, second;
  ASSERT_TRUE(e->Submit(Greedy(prompt, 12, &first)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(e->stats().prefix_hit_slots, 0);
  EXPECT_EQ(e->stats().prefix_queries, 150);
  ASSERT_TRUE(e->Submit(Greedy(prompt, 12, &second)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(e->stats().prefix_hit_slots, 144);  // 9 full blocks of the 150-token prompt
  EXPECT_EQ(e->stats().prefix_queries, 300);
  EXPECT_EQ(first.tokens.size(), 12u);
  EXPECT_EQ(second.tokens, first.tokens);
  ExpectAllFree(*e);
}

TEST_F(DecodeEngineTest, ImportedKvGivesThePlainPathsTokens) {
  const auto ref = AloneTokens();
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  std::deque<Stream> streams(3);
  const std::vector<int> which = {1, 4, 7};
  for (size_t k = 0; k < which.size(); ++k) {
    const std::vector<int32_t> prompt = RandomPrompt(kLengths[which[k]], 100 + which[k]);
    DecodeRequest r = Greedy(prompt, kNewTokens, &streams[k]);
    r.kv = std::make_shared<KvSnapshot>(ReferencePrefillSnapshot(prompt));
    ASSERT_TRUE(e->Submit(std::move(r)).ok());
  }
  ASSERT_TRUE(e->RunUntilIdle().ok());
  for (size_t k = 0; k < which.size(); ++k) {
    EXPECT_EQ(streams[k].tokens, ref[which[k]]) << "prompt of " << kLengths[which[k]];
  }
  EXPECT_EQ(e->stats().imported, 3);
  EXPECT_EQ(e->stats().forward_tokens, 3 * kNewTokens);  // only the last prompt tokens ran
  ExpectAllFree(*e);
}

// A q8_0 KV cache: concurrent sequences still match each alone (fp32 is batch-invariant and a
// row's q8_0 bits do not depend on the batch), and f32 KV imported from a prefill worker is
// quantised to the same bits the engine's own prefill stores, so it gives the same tokens.
TEST_F(DecodeEngineTest, Q8KvCacheConcurrentAndImportedEqualAlone) {
  DecodeEngineOptions o = Options();
  o.kv_cache_dtype = "q8_0";
  auto alone_engine = NewEngine(o);
  ASSERT_NE(alone_engine, nullptr);
  EXPECT_EQ(alone_engine->cache().layout().dtype, KvDtype::kQ8_0);
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < kLengths.size(); ++i) {
    Stream s;
    ASSERT_TRUE(
        alone_engine->Submit(Greedy(RandomPrompt(kLengths[i], 100 + i), kNewTokens, &s)).ok());
    ASSERT_TRUE(alone_engine->RunUntilIdle().ok());
    alone.push_back(s.tokens);
  }
  auto e = NewEngine(o);
  ASSERT_NE(e, nullptr);
  std::deque<Stream> streams = RunConcurrent(*e);
  for (size_t i = 0; i < kLengths.size(); ++i) {
    EXPECT_EQ(streams[i].tokens, alone[i]) << "prompt of " << kLengths[i] << " tokens";
  }
  EXPECT_GE(e->stats().max_batch_seqs, 8);
  ExpectAllFree(*e);

  Stream imported;
  const std::vector<int32_t> prompt = RandomPrompt(kLengths[5], 105);
  DecodeRequest r = Greedy(prompt, kNewTokens, &imported);
  r.kv = std::make_shared<KvSnapshot>(ReferencePrefillSnapshot(prompt));  // f32 KV
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(imported.tokens, alone[5]);
  ExpectAllFree(*e);

  o.kv_cache_dtype = "q4";
  auto bad = DecodeEngine::Create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("q8_0"), std::string::npos) << bad.status();
}

TEST_F(DecodeEngineTest, RejectsBadRequests) {
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  Stream s;
  EXPECT_FALSE(e->Submit(Greedy({}, 4, &s)).ok());
  EXPECT_FALSE(e->Submit(Greedy({1, -3}, 4, &s)).ok());
  EXPECT_FALSE(e->Submit(Greedy({1, 1 << 30}, 4, &s)).ok());
  EXPECT_FALSE(e->Submit(Greedy({1, 2}, -1, &s)).ok());
  DecodeRequest r = Greedy({1, 2, 3}, 4, &s);
  r.sampling.top_p = 7;
  EXPECT_FALSE(e->Submit(std::move(r)).ok());
  r = Greedy({1, 2, 3}, 4, &s);
  auto snap = std::make_shared<KvSnapshot>();
  snap->layout = e->cache().layout();
  snap->n_slots = 5;  // more than the 2 prompt tokens it could cover
  snap->k.assign(size_t{5} * snap->layout.n_layers * snap->layout.n_kv_heads * snap->row_bytes(),
                 0);
  snap->v = snap->k;
  r.kv = snap;
  EXPECT_FALSE(e->Submit(std::move(r)).ok());
  EXPECT_TRUE(e->idle());
}

TEST_F(DecodeEngineTest, FinishReasonsStopStringsAndLogprobs) {
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(30, 3);

  // max_tokens: length, with logprobs.
  Stream base;
  DecodeRequest r = Greedy(prompt, 16, &base);
  r.sampling.top_logprobs = 5;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  ASSERT_EQ(base.tokens.size(), 16u);
  EXPECT_EQ(base.finish, FinishReason::kLength);
  for (size_t i = 0; i < base.events.size(); ++i) {
    const TokenEvent& ev = base.events[i];
    EXPECT_EQ(ev.index, static_cast<int>(i));
    ASSERT_EQ(ev.top_logprobs.size(), 5u);
    EXPECT_EQ(ev.top_logprobs[0].id, ev.token);  // greedy picks the most likely
    EXPECT_FLOAT_EQ(ev.top_logprobs[0].logprob, ev.logprob);
    EXPECT_LE(ev.logprob, 0.0f);
    EXPECT_TRUE(std::isfinite(ev.logprob));
    for (size_t k = 1; k < 5; ++k)
      EXPECT_LE(ev.top_logprobs[k].logprob, ev.top_logprobs[k - 1].logprob);
  }
  EXPECT_EQ(base.text, e->tokenizer().Decode(base.tokens));

  // A stop string from the middle of that text: the stream ends just before it.
  ASSERT_GT(base.text.size(), 12u);
  const std::string stop = base.text.substr(base.text.size() / 2, 3);
  Stream stopped;
  r = Greedy(prompt, 16, &stopped);
  r.stop = {stop};
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(stopped.finish, FinishReason::kStop);
  EXPECT_EQ(stopped.text, base.text.substr(0, base.text.find(stop)));
  EXPECT_LE(stopped.tokens.size(), base.tokens.size());

  // End of generation: a short chat answer ends with <|im_end|>, whose text is not streamed.
  Stream chat;
  auto tmpl_text = e->model().gguf->GetString("tokenizer.chat_template");
  ASSERT_TRUE(tmpl_text.ok());
  auto tmpl = DetectChatTemplate(*tmpl_text);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::vector<ChatMessage> messages = {{"user", "What is the capital of France?"}};
  const std::vector<int32_t> chat_prompt =
      EncodeChat(e->tokenizer(), RenderChatSegments(*tmpl, messages, true), false);
  r = Greedy(chat_prompt, 48, &chat);
  r.ignore_eos = false;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(chat.finish, FinishReason::kStop);
  ASSERT_FALSE(chat.tokens.empty());
  EXPECT_TRUE(e->tokenizer().IsEndOfGeneration(chat.tokens.back()));
  EXPECT_EQ(chat.text.find("<|im_end|>"), std::string::npos);
  EXPECT_FALSE(chat.text.empty());
  ExpectAllFree(*e);
}

TEST_F(DecodeEngineTest, StopTokenIdsAndMinTokens) {
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(20, 8);
  const int32_t x = 1000;  // a plain token, forced by its bias
  const std::optional<int32_t> im_end = e->tokenizer().FindToken("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  struct Case {
    int32_t forced;
    int min_tokens;
    size_t n_tokens;       // generated, the stop token included
    bool text_has_forced;  // the stop token's text is output (a plain token)
  };
  for (const Case& c : {Case{x, 0, 1, true}, Case{x, 3, 4, true}, Case{*im_end, 0, 1, false},
                        Case{*im_end, 5, 6, false}}) {
    Stream s;
    DecodeRequest r = Greedy(prompt, 16, &s);
    r.sampling.logit_bias = {{c.forced, 100.0f}};
    r.stop_token_ids = {c.forced};
    r.min_tokens = c.min_tokens;
    ASSERT_TRUE(e->Submit(std::move(r)).ok());
    ASSERT_TRUE(e->RunUntilIdle().ok());
    EXPECT_EQ(s.finish, FinishReason::kStop) << c.forced << " " << c.min_tokens;
    ASSERT_EQ(s.tokens.size(), c.n_tokens) << c.forced << " " << c.min_tokens;
    EXPECT_EQ(s.tokens.back(), c.forced);
    for (size_t i = 0; i + 1 < s.tokens.size(); ++i) EXPECT_NE(s.tokens[i], c.forced);
    const std::string head = e->tokenizer().Decode(std::span(s.tokens).first(c.n_tokens - 1));
    EXPECT_EQ(s.text, c.text_has_forced ? e->tokenizer().Decode(s.tokens) : head);
  }
  // min_tokens keeps the end of generation out too (ignore_eos off): forced, it comes at 4.
  Stream eos;
  DecodeRequest r = Greedy(prompt, 16, &eos);
  r.ignore_eos = false;
  r.sampling.logit_bias = {{*im_end, 100.0f}};
  r.min_tokens = 3;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(eos.finish, FinishReason::kStop);
  ASSERT_EQ(eos.tokens.size(), 4u);
  EXPECT_EQ(eos.tokens.back(), *im_end);
  // Refused: min_tokens past max_tokens, stop ids unsorted or outside the vocabulary.
  Stream bad;
  r = Greedy(prompt, 4, &bad);
  r.min_tokens = 5;
  EXPECT_FALSE(e->Submit(std::move(r)).ok());
  r = Greedy(prompt, 4, &bad);
  r.stop_token_ids = {9, 3};
  EXPECT_FALSE(e->Submit(std::move(r)).ok());
  r = Greedy(prompt, 4, &bad);
  r.stop_token_ids = {1 << 30};
  EXPECT_FALSE(e->Submit(std::move(r)).ok());
  ExpectAllFree(*e);
}

TEST_F(DecodeEngineTest, AContinuationPicksUpWhereAnotherWorkerStopped) {
  // What the scheduler does when a stream's decode worker dies (request migration): the prompt
  // plus the tokens streamed so far, as a continuation, for the rest of max_tokens. Greedy in
  // fp32 (batch-invariant: the prefill of those tokens gives the logits their decode steps gave)
  // continues with exactly the uninterrupted run's tokens and text.
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = RandomPrompt(40, 21);
  Stream whole;
  ASSERT_TRUE(e->Submit(Greedy(prompt, 24, &whole)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  ASSERT_EQ(whole.tokens.size(), 24u);
  // Moved after an event that held nothing back (the scheduler moves no other): here only an
  // incomplete UTF-8 character can be held, these random ids' text has some.
  int k = 9;
  while (k < 20 && whole.events[k - 1].text_held) ++k;
  ASSERT_LT(k, 20);
  std::vector<int32_t> moved = prompt;
  moved.insert(moved.end(), whole.tokens.begin(), whole.tokens.begin() + k);
  std::string first_text;
  for (int i = 0; i < k; ++i) first_text += whole.events[i].text;
  Stream rest;
  DecodeRequest r = Greedy(moved, 24 - k, &rest);
  r.continuation = true;
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(rest.finish, FinishReason::kLength);
  EXPECT_EQ(rest.tokens, std::vector<int32_t>(whole.tokens.begin() + k, whole.tokens.end()));
  EXPECT_EQ(first_text + rest.text, whole.text);

  // An event after which a possible stop string's start is held back says so.
  Stream held;
  r = Greedy(prompt, 24, &held);
  const std::string stop = whole.text.substr(whole.text.size() / 2, 2) + "\x01";  // never matches
  r.stop = {stop};
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(held.text, whole.text);
  bool any_held = false;
  for (const TokenEvent& ev : held.events) any_held = any_held || ev.text_held;
  EXPECT_TRUE(any_held);
  ExpectAllFree(*e);
}

// Clients on their own threads submit, cancel and read stats while the background loop runs
// (what the TSan preset checks): the cancelled request ends cancelled, the others complete
// with their alone tokens, and every block comes back.
TEST_F(DecodeEngineTest, BackgroundLoopCancelsFromAnotherThread) {
  const auto ref = AloneTokens();
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  e->Start();
  Mutex mu;
  int done = 0;
  std::deque<Stream> streams(3);
  auto submit = [&](int i, int max_tokens) {
    DecodeRequest r = Greedy(RandomPrompt(kLengths[i], 100 + i), max_tokens, &streams[i]);
    TokenCallback inner = r.on_event;
    r.on_event = [inner, &mu, &done](const TokenEvent& ev) {
      MutexLock lock(&mu);  // the stream is read by the test thread
      inner(ev);
      if (ev.finish != FinishReason::kNone) ++done;
    };
    auto id = e->Submit(std::move(r));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : int64_t{-1};
  };
  int64_t long_id = -1;
  std::thread canceller([&] {
    long_id = submit(2, 1000);  // long enough to be running when cancelled
    for (;;) {
      {
        MutexLock lock(&mu);
        if (!streams[2].tokens.empty()) break;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    e->Cancel(long_id);
  });
  std::thread others([&] {
    submit(0, kNewTokens);
    submit(1, kNewTokens);
    for (int k = 0; k < 20; ++k) {
      (void)e->stats();
      (void)e->idle();
      absl::SleepFor(absl::Milliseconds(2));
    }
  });
  canceller.join();
  others.join();
  EXPECT_TRUE(WaitForCount(mu, done, 3, absl::Seconds(120)));
  e->Stop();
  MutexLock lock(&mu);
  EXPECT_EQ(streams[2].finish, FinishReason::kCancelled);
  EXPECT_LT(streams[2].tokens.size(), 1000u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(streams[i].finish, FinishReason::kLength);
    EXPECT_EQ(streams[i].tokens, ref[i]);
  }
  ExpectAllFree(*e);
}

TEST_F(DecodeEngineTest, BackgroundLoopServesConcurrentSubmitters) {
  const auto ref = AloneTokens();
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  e->Start();
  std::deque<Stream> streams(3);
  Mutex mu;
  int done = 0;
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&, i] {
      DecodeRequest r = Greedy(RandomPrompt(kLengths[i], 100 + i), kNewTokens, &streams[i]);
      TokenCallback inner = r.on_event;
      r.on_event = [inner, &mu, &done](const TokenEvent& ev) {
        inner(ev);
        if (ev.finish != FinishReason::kNone) {
          MutexLock lock(&mu);
          ++done;
        }
      };
      EXPECT_TRUE(e->Submit(std::move(r)).ok());
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_TRUE(WaitForCount(mu, done, 3, absl::Seconds(120)));
  e->Stop();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(streams[i].tokens, ref[i]);
}

// A structured output in the continuous batch: the constrained sequences' text fullmatches
// their pattern (greedy and sampled) and ends with an end token where the pattern is complete;
// the unconstrained sequences beside them keep their tokens.
TEST_F(DecodeEngineTest, ConstrainedSequencesMatchTheirPatternOthersUnchanged) {
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  const std::string regex = R"((yes|no), [0-9]{2,4} (apples|pears)!)";
  auto c = e->CompileConstraint(regex);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(e->CompileConstraint(regex)->get(), c->get());  // cached
  std::deque<Stream> free(kLengths.size()), constrained(4);
  for (size_t i = 0; i < kLengths.size(); ++i) {
    ASSERT_TRUE(e->Submit(Greedy(RandomPrompt(kLengths[i], 100 + i), kNewTokens, &free[i])).ok());
  }
  for (size_t i = 0; i < constrained.size(); ++i) {
    DecodeRequest r = Greedy(RandomPrompt(20 + 7 * i, 300 + i), 40, &constrained[i]);
    r.ignore_eos = false;
    if (i % 2 == 1) {
      r.sampling.temperature = 1.0f;
      r.sampling.seed = i;
      r.sampling.top_logprobs = 3;
    }
    r.constraint = *c;
    ASSERT_TRUE(e->Submit(std::move(r)).ok());
  }
  ASSERT_TRUE(e->RunUntilIdle().ok());
  const std::vector<std::vector<int32_t>> alone = AloneTokens();
  for (size_t i = 0; i < kLengths.size(); ++i) EXPECT_EQ(free[i].tokens, alone[i]) << i;
  for (size_t i = 0; i < constrained.size(); ++i) {
    const Stream& s = constrained[i];
    EXPECT_EQ(s.finish, FinishReason::kStop) << i << ": " << s.text;
    EXPECT_TRUE((*c)->dfa().FullMatch(s.text)) << i << ": " << s.text;
    EXPECT_TRUE(e->tokenizer().IsEndOfGeneration(s.tokens.back()));
    for (const TokenEvent& ev : s.events) {
      // Reported after the mask: the alternatives are allowed tokens, so their mass is <= 1.
      double mass = 0;
      for (const TokenLogprob& lp : ev.top_logprobs) mass += std::exp(lp.logprob);
      EXPECT_LE(mass, 1.0 + 1e-4);
    }
  }
  ExpectAllFree(*e);
}

// A continuation (a migrated request) walks the constraint over its earlier output first.
TEST_F(DecodeEngineTest, ConstrainedContinuationStartsAfterItsEarlierOutput) {
  auto e = NewEngine(Options());
  ASSERT_NE(e, nullptr);
  auto c = e->CompileConstraint(R"(abc[0-9]{3})");
  ASSERT_TRUE(c.ok());
  std::vector<int32_t> prompt = RandomPrompt(12, 7);
  const std::vector<int32_t> earlier = e->tokenizer().Encode("abc");
  prompt.insert(prompt.end(), earlier.begin(), earlier.end());
  Stream s;
  DecodeRequest r = Greedy(prompt, 20, &s);
  r.ignore_eos = false;
  r.continuation = true;
  r.constraint = *c;
  r.constraint_generated = static_cast<int>(earlier.size());
  ASSERT_TRUE(e->Submit(std::move(r)).ok());
  ASSERT_TRUE(e->RunUntilIdle().ok());
  EXPECT_EQ(s.finish, FinishReason::kStop);
  EXPECT_TRUE((*c)->dfa().FullMatch("abc" + s.text)) << s.text;
}

}  // namespace
}  // namespace tripod::decode_engine_test
