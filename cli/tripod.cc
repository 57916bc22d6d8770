// The `tripod` command: generate (one-shot or interactive chat) and logits (for the reference
// tests), thin over the libraries. Flags are defined here and passed down as plain options.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/compute/session.h"
#include "common/model/chat_template.h"
#include "common/model/model_resolver.h"
#include "common/model/sampler.h"
#include "common/model/tokenizer.h"
#include "common/util/flag_args.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"

ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name, e.g. qwen2.5-coder-1.5b-instruct (scripts/"
          "fetch_model --list); default: the bundled SmolLM2-135M-Instruct");
ABSL_FLAG(std::string, prompt, "", "raw prompt text (no chat template)");
ABSL_FLAG(std::string, chat, "",
          "a user message, rendered with the model's chat template; a bare "
          "--chat (no message) chats interactively");
ABSL_FLAG(bool, interactive, false, "chat interactively: read user messages from stdin");
ABSL_FLAG(std::string, system, "", "system message for --chat (default: the template's)");
ABSL_FLAG(std::string, chat_template, "", "chat template: chatml | llama3 (default: from GGUF)");
ABSL_FLAG(std::string, ids, "", "comma-separated token ids instead of text");
ABSL_FLAG(int, max_tokens, 256, "maximum new tokens");
ABSL_FLAG(double, temperature, 0.7, "sampling temperature (0 = greedy)");
ABSL_FLAG(int, top_k, 40, "top-k (0 = off)");
ABSL_FLAG(double, top_p, 0.95, "top-p (1 = off)");
ABSL_FLAG(double, min_p, 0.05, "min-p (0 = off)");
ABSL_FLAG(double, repetition_penalty, 1.0, "repetition penalty (1 = off)");
ABSL_FLAG(double, presence_penalty, 0.0, "presence penalty");
ABSL_FLAG(double, frequency_penalty, 0.0, "frequency penalty");
ABSL_FLAG(uint64_t, seed, 0, "random seed");
ABSL_FLAG(int, threads, 0, "compute threads (default: all cores)");
ABSL_FLAG(bool, stats, false, "print prefill and decode tokens/s to stderr");
ABSL_FLAG(std::string, backend, "cpu",
          "cpu | cuda | cpu-guarded-kv (generate, logits, prefill, draft, eval-longctx, and every "
          "worker of serve: cuda puts bf16 weights and GEMMs and f16 KV on the GPU, --precision "
          "is the CPU's; cpu-guarded-kv is the CPU with its KV out of the host code's reach, as a "
          "GPU's, to test those paths without one)");
ABSL_FLAG(std::string, precision, "auto",
          "fp32 (exact path) | bf16 | int16 | int8 (reduced precision) | auto (bf16 GEMMs if the "
          "CPU multiplies bf16 fast, int16 GEMVs for 1-3 rows)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "KV cache element type: auto (f32 for fp32, else f16) | f32 | f16 | bf16 | q8_0");
ABSL_FLAG(int, chunk, tripod::SessionOptions{}.prefill_chunk,
          "prefill chunk size in tokens (1 = token by token)");
ABSL_FLAG(int, context, 0, "KV capacity in tokens (default: the model's context length)");
ABSL_FLAG(bool, print_ids, false, "generate: print the generated ids instead of text");
ABSL_FLAG(bool, all, false, "logits: write the logits of every position, not just the last");
ABSL_FLAG(std::string, out, "", "logits: output file (raw little-endian float32)");

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& s) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--ids: '", part, "' is not a token id"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--ids is empty");
  return ids;
}

absl::StatusOr<std::unique_ptr<Session>> OpenSession() {
  SessionOptions o;
  ASSIGN_OR_RETURN(o.model_path, ResolveModel(absl::GetFlag(FLAGS_model)));
  o.backend = absl::GetFlag(FLAGS_backend);
  o.precision = absl::GetFlag(FLAGS_precision);
  o.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  o.context_tokens = absl::GetFlag(FLAGS_context);
  o.prefill_chunk = absl::GetFlag(FLAGS_chunk);
  return Session::Open(o);
}

SamplingParams SamplingFromFlags() {
  SamplingParams p;
  p.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  p.top_k = absl::GetFlag(FLAGS_top_k);
  p.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  p.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  p.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  p.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  p.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  p.seed = absl::GetFlag(FLAGS_seed);
  return p;
}

struct GenerateStats {
  int prompt_tokens = 0, new_tokens = 0;
  double prefill_s = 0, decode_s = 0;
};

// Prefills `prompt` (reusing the cached common prefix) and samples up to max_tokens, calling
// on_token for each; stops at end-of-generation. Returns the generated ids.
absl::StatusOr<std::vector<int32_t>> RunGeneration(Session& session, const Tokenizer* tok,
                                                   const std::vector<int32_t>& prompt,
                                                   const SamplingParams& params, int max_tokens,
                                                   const std::function<void(int32_t)>& on_token,
                                                   GenerateStats* stats) {
  const int vocab = session.model().config.vocab_size;
  Sampler sampler(params, vocab);
  const int keep = session.CommonPrefix(prompt);
  session.Truncate(keep);
  std::vector<int32_t> rest(prompt.begin() + keep, prompt.end());
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(std::vector<float> logits, session.Append(rest));
  const auto t1 = Clock::now();
  std::vector<int32_t> history = prompt, out;
  for (int i = 0; i < max_tokens; ++i) {
    const SampledToken t = sampler.Sample(logits, history, prompt.size());
    history.push_back(t.id);
    out.push_back(t.id);
    on_token(t.id);
    if (tok != nullptr && tok->IsEndOfGeneration(t.id)) break;
    if (i + 1 == max_tokens) break;
    ASSIGN_OR_RETURN(logits, session.Append({t.id}));
  }
  const auto t2 = Clock::now();
  stats->prompt_tokens = static_cast<int>(rest.size());
  stats->new_tokens = static_cast<int>(out.size());
  stats->prefill_s = std::chrono::duration<double>(t1 - t0).count();
  stats->decode_s = std::chrono::duration<double>(t2 - t1).count();
  return out;
}

void PrintStats(const GenerateStats& s) {
  // The first token comes with the prefill; decode speed counts the steps after it.
  const int steps = std::max(0, s.new_tokens - 1);
  std::fprintf(stderr,
               "\n[stats] prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s "
               "(%.1f tok/s)\n",
               s.prompt_tokens, s.prefill_s, s.prompt_tokens / std::max(s.prefill_s, 1e-9), steps,
               s.decode_s, steps / std::max(s.decode_s, 1e-9));
}

absl::StatusOr<ChatTemplate> PickTemplate(const Session& session) {
  if (!absl::GetFlag(FLAGS_chat_template).empty()) {
    return ChatTemplateByName(absl::GetFlag(FLAGS_chat_template));
  }
  auto text = session.model().gguf->GetString("tokenizer.chat_template");
  if (!text.ok()) {
    return absl::FailedPreconditionError(
        "the model has no chat template (tokenizer.chat_template); name one with --chat_template");
  }
  return DetectChatTemplate(*text);
}

// The flags generate and logits share, checked before the model loads: a value out of range is
// an error naming the flag (it used to run and print nothing, exit 0).
absl::Status CheckSessionFlags() {
  if (absl::GetFlag(FLAGS_threads) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be >= 0 (0: all cores), got ", absl::GetFlag(FLAGS_threads)));
  }
  if (absl::GetFlag(FLAGS_chunk) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk must be >= 1, got ", absl::GetFlag(FLAGS_chunk)));
  }
  if (absl::GetFlag(FLAGS_context) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--context must be >= 0 (0: the model's context length), got ",
                     absl::GetFlag(FLAGS_context)));
  }
  return absl::OkStatus();
}

// Flags named on the command line (main fills it before parsing): an empty --prompt given is an
// error, an absent one is not. (CommandLineFlag::IsSpecifiedOnCommandLine is private in the
// abseil Debian 12 packages.)
std::vector<std::string>& GivenFlags() {
  static std::vector<std::string> given;
  return given;
}

bool Given(const std::string& flag) {
  const std::vector<std::string>& g = GivenFlags();
  return std::find(g.begin(), g.end(), flag) != g.end();
}

absl::Status CheckGenerateFlags() {
  RETURN_IF_ERROR(CheckSessionFlags());
  if (absl::GetFlag(FLAGS_max_tokens) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_tokens must be >= 1, got ", absl::GetFlag(FLAGS_max_tokens)));
  }
  const int inputs = Given("prompt") + Given("ids") + Given("chat");
  if (inputs > 1) {
    return absl::InvalidArgumentError("give one of --prompt, --ids and --chat, not several");
  }
  if (Given("prompt") && absl::GetFlag(FLAGS_prompt).empty()) {
    return absl::InvalidArgumentError(
        "--prompt is empty: give the text to complete (or --chat for a chat message)");
  }
  if (Given("ids") && absl::GetFlag(FLAGS_ids).empty()) {
    return absl::InvalidArgumentError("--ids is empty: give comma-separated token ids");
  }
  return SamplingFromFlags().Validate();
}

absl::Status Generate() {
  RETURN_IF_ERROR(CheckGenerateFlags());
  ASSIGN_OR_RETURN(std::unique_ptr<Session> session, OpenSession());
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::FromGguf(*session->model().gguf));
  const SamplingParams params = SamplingFromFlags();
  RETURN_IF_ERROR(params.Validate());
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  const bool print_ids = absl::GetFlag(FLAGS_print_ids);

  auto stream_one = [&](const std::vector<int32_t>& prompt) -> absl::Status {
    StreamingDecoder dec(*tok);
    GenerateStats stats;
    auto on_token = [&](int32_t id) {
      if (print_ids) {
        std::printf("%d ", id);
      } else if (!tok->IsEndOfGeneration(id)) {
        std::fputs(dec.Push(id).c_str(), stdout);
      }
      std::fflush(stdout);
    };
    RETURN_IF_ERROR(
        RunGeneration(*session, tok.get(), prompt, params, max_tokens, on_token, &stats).status());
    if (!print_ids) std::fputs(dec.Flush().c_str(), stdout);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (absl::GetFlag(FLAGS_stats)) PrintStats(stats);
    return absl::OkStatus();
  };

  auto with_bos = [&](std::vector<int32_t> ids) {
    if (tok->add_bos() && (ids.empty() || ids[0] != tok->bos_id())) {
      ids.insert(ids.begin(), tok->bos_id());
    }
    return ids;
  };

  if (!absl::GetFlag(FLAGS_ids).empty()) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIds(absl::GetFlag(FLAGS_ids)));
    return stream_one(ids);
  }
  if (!absl::GetFlag(FLAGS_prompt).empty()) {
    return stream_one(with_bos(tok->Encode(absl::GetFlag(FLAGS_prompt), /*parse_special=*/true)));
  }

  ASSIGN_OR_RETURN(ChatTemplate tmpl, PickTemplate(*session));
  std::vector<ChatMessage> messages;
  if (!absl::GetFlag(FLAGS_system).empty()) {
    messages.push_back({"system", absl::GetFlag(FLAGS_system)});
  }
  auto chat_turn = [&](const std::string& user) -> absl::Status {
    messages.push_back({"user", user});
    const std::string text = RenderChat(tmpl, messages, /*add_generation_prompt=*/true);
    const std::vector<int32_t> prompt = with_bos(tok->Encode(text, true));
    StreamingDecoder dec(*tok);
    std::string reply;
    GenerateStats stats;
    auto on_token = [&](int32_t id) {
      if (tok->IsEndOfGeneration(id)) return;
      const std::string piece = dec.Push(id);
      reply += piece;
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    };
    RETURN_IF_ERROR(
        RunGeneration(*session, tok.get(), prompt, params, max_tokens, on_token, &stats).status());
    const std::string tail = dec.Flush();
    reply += tail;
    std::fputs((tail + "\n").c_str(), stdout);
    std::fflush(stdout);
    if (absl::GetFlag(FLAGS_stats)) PrintStats(stats);
    messages.push_back({"assistant", reply});
    return absl::OkStatus();
  };

  const std::string first = absl::GetFlag(FLAGS_chat);
  if (!first.empty()) RETURN_IF_ERROR(chat_turn(first));
  if (!first.empty() && !absl::GetFlag(FLAGS_interactive)) return absl::OkStatus();
  // Interactive chat: one user message per line; an empty line or EOF ends it.
  const bool tty = isatty(STDIN_FILENO);
  for (;;) {
    if (tty) std::fputs("> ", stdout), std::fflush(stdout);
    std::string line;
    if (!std::getline(std::cin, line) || line.empty()) break;
    RETURN_IF_ERROR(chat_turn(line));
  }
  return absl::OkStatus();
}

absl::Status Logits() {
  RETURN_IF_ERROR(CheckSessionFlags());
  if (absl::GetFlag(FLAGS_ids).empty()) return absl::InvalidArgumentError("logits needs --ids");
  if (absl::GetFlag(FLAGS_out).empty()) return absl::InvalidArgumentError("logits needs --out");
  ASSIGN_OR_RETURN(std::unique_ptr<Session> session, OpenSession());
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIds(absl::GetFlag(FLAGS_ids)));
  ASSIGN_OR_RETURN(std::vector<float> logits, session->Append(ids, absl::GetFlag(FLAGS_all)));
  std::ofstream f(absl::GetFlag(FLAGS_out), std::ios::binary);
  f.write(reinterpret_cast<const char*>(logits.data()),
          static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", absl::GetFlag(FLAGS_out)));
  return absl::OkStatus();
}

}  // namespace

absl::Status PopImportanceMain();                 // cli/pop_importance.cc
absl::Status EvalPopMain(int argc, char** argv);  // cli/eval_pop.cc
absl::Status PrefillMain();                       // cli/prefill.cc
absl::Status ServeMain();                         // cli/serve.cc
absl::Status DraftMain();                         // cli/draft.cc
absl::Status EvalLongCtxMain();                   // cli/eval_longctx.cc

}  // namespace tripod

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  usage.version_string = [] {
    return std::string("tripod " TRIPOD_VERSION " (CUDA backend: ") +
           (tripod::CudaSupportsHeadDim(64) ? "built" : "not built") + ")\n";
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "tripod <command> [flags]\n"
      "  serve      the OpenAI-compatible service: scheduler and workers as child processes on\n"
      "             loopback: --port 8000 --host 127.0.0.1 --model M --pop 1/3\n"
      "             --prefill_workers 1 --decode_workers 1 --threads N (each worker's; default:\n"
      "             the cores split among the workers)\n"
      "  generate   stream a completion: --prompt TEXT | --chat MESSAGE | --chat '' (interactive)\n"
      "  logits     write raw float32 logits of --ids to --out (reference tests)\n"
      "  pop-importance  per-layer prefill/decode importance for POP: --corpus --out\n"
      "  eval-pop   POP quality vs the full model and controls (JSON): --corpus --prompts\n"
      "  prefill    one POP prefill (JSON: plan, resident bytes, timing): --prompt | --ids\n"
      "  draft      one draft pass (JSON: SpecPC token scores and kept positions, lookahead):\n"
      "             --prompt | --ids, --draft_layers N --window 64 --budget C --lookahead L\n"
      "  eval-longctx  RULER-style long-context accuracy of the full KV and every compression\n"
      "             method (JSON lines): --lengths 1024,2048,4096 --budgets 1/8,1/4,1/2\n"
      "             --methods --tasks --samples --pop_rows on,off --pop 1/3 --shard I/N\n"
      "             --out ROWS --merge ROWS,...\n");
  // A bare `--chat` (no message) starts an interactive chat.
  tripod::UnderscoredArgs underscored(argc, argv);  // --max-tokens: the flag --max_tokens
  std::vector<char*> argv2(underscored.argv(), underscored.argv() + underscored.argc());
  static char interactive[] = "--interactive";
  for (size_t i = 0; i < argv2.size(); ++i) {
    const bool bare = std::strcmp(argv2[i], "--chat") == 0 &&
                      (i + 1 == argv2.size() || std::strncmp(argv2[i + 1], "--", 2) == 0);
    if (bare) argv2[i] = interactive;
  }
  for (size_t i = 1; i < argv2.size(); ++i) {
    std::string_view a = argv2[i];
    if (a == "--") break;
    if (a.size() > 2 && a.substr(0, 2) == "--") {
      a.remove_prefix(2);
      tripod::GivenFlags().emplace_back(a.substr(0, a.find('=')));
    }
  }
  std::vector<char*> args = absl::ParseCommandLine(static_cast<int>(argv2.size()), argv2.data());
  if (args.size() < 2) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  const std::string cmd = args[1];
  // serve computes nothing itself: its --threads is the workers'.
  if (absl::GetFlag(FLAGS_threads) > 0 && cmd != "serve") {
    tripod::SetComputeThreads(absl::GetFlag(FLAGS_threads));
  }
  absl::Status status;
  if (cmd == "serve") {
    status = tripod::ServeMain();
  } else if (cmd == "generate") {
    status = tripod::Generate();
  } else if (cmd == "logits") {
    status = tripod::Logits();
  } else if (cmd == "pop-importance") {
    status = tripod::PopImportanceMain();
  } else if (cmd == "eval-pop") {
    status = tripod::EvalPopMain(argc, argv);
  } else if (cmd == "prefill") {
    status = tripod::PrefillMain();
  } else if (cmd == "draft") {
    status = tripod::DraftMain();
  } else if (cmd == "eval-longctx") {
    status = tripod::EvalLongCtxMain();
  } else {
    std::fprintf(stderr, "tripod: unknown command '%s'\n%s\n", cmd.c_str(),
                 absl::ProgramUsageMessage().data());
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "tripod: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
