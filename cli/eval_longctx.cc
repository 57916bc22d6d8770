// `tripod eval-longctx`: RULER-style long-context tasks (eval/longctx_tasks.h) through the full KV
// and every compression method at fractions of the prompt, with POP on and off
// (eval/longctx_eval.h). Prints one JSON line per task, length, method, budget and POP setting:
// the mean accuracy over the samples with its 95% interval, mean prefill and draft seconds and
// KV bytes. --out also writes every sample's row (JSON lines) so that shards can be merged
// (--merge) into the same summary, and with --resume a stopped run goes on from its file.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/serve_models.h"
#include "common/model/bundled_model.h"
#include "common/model/chat_template.h"
#include "common/model/gguf.h"
#include "common/model/model_resolver.h"
#include "common/model/tokenizer.h"
#include "common/util/status_macros.h"
#include "eval/longctx_eval.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, precision);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, corpus);
ABSL_DECLARE_FLAG(int, samples);
ABSL_DECLARE_FLAG(std::string, shard);
ABSL_DECLARE_FLAG(std::string, merge);
ABSL_DECLARE_FLAG(int, chunk);
ABSL_DECLARE_FLAG(int, draft_layers);
ABSL_DECLARE_FLAG(std::string, lookahead_layers);
ABSL_DECLARE_FLAG(std::string, pop);          // cli/serve.cc: the POP ratio
ABSL_DECLARE_FLAG(std::string, draft_model);  // cli/serve.cc

ABSL_FLAG(std::string, lengths, "1024,2048,4096",
          "eval-longctx: prompt lengths in tokens, comma-separated (8192 on request)");
ABSL_FLAG(std::string, budgets, "1/8,1/4,1/2",
          "eval-longctx: budgets as fractions of the prompt, comma-separated");
ABSL_FLAG(std::string, methods,
          "full,speckv,specpc,draftmap,snapkv,pyramidkv,streamingllm,keeplast",
          "eval-longctx: methods, comma-separated (full is the uncompressed reference)");
ABSL_FLAG(std::string, tasks, "niah_single,niah_multikey,niah_multivalue,vt,cwe",
          "eval-longctx: tasks, comma-separated");
ABSL_FLAG(int, trim_pool, 7, "eval-longctx: SpecKV and SnapKV's max-pool kernel over the scores");
ABSL_FLAG(std::string, samples_out, "",
          "eval-longctx: write the samples (chat-rendered prompt ids, answers, scoring) as JSON "
          "lines to this file and evaluate nothing (bench/goodput.py serves them)");
ABSL_FLAG(bool, resume, false,
          "eval-longctx: with --out, keep the samples the file already holds and evaluate only the "
          "others, appending (a stopped run goes on where it stopped; run it with the same flags)");
ABSL_FLAG(std::string, pop_rows, "on,off",
          "eval-longctx: the POP settings to run, comma-separated (on: the --pop ratio, 1/3 when "
          "--pop is not given)");

namespace tripod {
namespace {

absl::StatusOr<std::vector<std::string>> Names(const std::string& flag, const std::string& text,
                                               const std::vector<std::string>& known) {
  std::vector<std::string> out;
  for (absl::string_view s : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    if (std::find(known.begin(), known.end(), s) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("eval-longctx: --", flag, ": unknown '", s, "'"));
    }
    out.emplace_back(s);
  }
  if (out.empty())
    return absl::InvalidArgumentError(absl::StrCat("eval-longctx: --", flag, " is empty"));
  return out;
}

absl::StatusOr<std::vector<double>> Fractions(const std::string& text) {
  std::vector<double> out;
  for (absl::string_view s : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> parts = absl::StrSplit(s, '/');
    double num = 0, den = 1;
    if (parts.size() > 2 || !absl::SimpleAtod(parts[0], &num) ||
        (parts.size() == 2 && !absl::SimpleAtod(parts[1], &den)) || !(den > 0) ||
        !(num / den > 0 && num / den <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("eval-longctx: --budgets: '", s, "' is not a fraction in (0, 1]"));
    }
    out.push_back(num / den);
  }
  if (out.empty()) return absl::InvalidArgumentError("eval-longctx: --budgets is empty");
  return out;
}

nlohmann::json RowJson(const LongCtxRow& r, int sample) {
  return {{"task", r.task},
          {"length", r.length},
          {"sample", sample},
          {"method", r.method},
          {"budget", r.budget},
          {"budget_tokens", r.budget_tokens},
          {"pop", r.pop},
          {"pop_kv_only_layers", r.pop_kv_only_layers},
          {"prompt_tokens", r.prompt_tokens},
          {"accuracy", r.accuracy},
          {"prefill_s", r.prefill_s},
          {"draft_s", r.draft_s},
          {"kv_bytes", r.kv_bytes},
          {"output", r.output}};
}

// Wilson's 95% interval for a mean of k scores in [0, 1] read as a proportion: unlike mean +/-
// 1.96 sd it does not collapse to a point at 0 or 1 with few samples.
std::pair<double, double> Wilson(double p, int k) {
  if (k == 0) return {0, 1};
  const double z = 1.96, z2 = z * z;
  const double centre = (p + z2 / (2 * k)) / (1 + z2 / k);
  const double half = z * std::sqrt(p * (1 - p) / k + z2 / (4.0 * k * k)) / (1 + z2 / k);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

// One summary line per (task, length, method, budget, pop), in the rows' first-seen order.
void PrintSummary(const std::vector<nlohmann::json>& rows) {
  using Key = std::tuple<std::string, int, std::string, double, bool>;
  struct Acc {
    int k = 0;
    double accuracy = 0, prefill_s = 0, draft_s = 0, kv_bytes = 0, prompt_tokens = 0,
           budget_tokens = 0;
  };
  std::vector<Key> order;
  std::map<Key, Acc> acc;
  for (const nlohmann::json& r : rows) {
    const Key key{r["task"], r["length"], r["method"], r["budget"], r["pop"]};
    if (!acc.count(key)) order.push_back(key);
    Acc& a = acc[key];
    ++a.k;
    a.accuracy += r["accuracy"].get<double>();
    a.prefill_s += r["prefill_s"].get<double>();
    a.draft_s += r["draft_s"].get<double>();
    a.kv_bytes += r["kv_bytes"].get<double>();
    a.prompt_tokens += r["prompt_tokens"].get<double>();
    a.budget_tokens += r["budget_tokens"].get<double>();
  }
  for (const Key& key : order) {
    const Acc& a = acc[key];
    const double mean = a.accuracy / a.k;
    const auto [lo, hi] = Wilson(mean, a.k);
    nlohmann::json j = {{"task", std::get<0>(key)},
                        {"length", std::get<1>(key)},
                        {"method", std::get<2>(key)},
                        {"budget", std::get<3>(key)},
                        {"pop", std::get<4>(key)},
                        {"accuracy", mean},
                        {"accuracy_ci95", {lo, hi}},
                        {"samples", a.k},
                        {"prefill_s", a.prefill_s / a.k},
                        {"draft_s", a.draft_s / a.k},
                        {"kv_bytes", a.kv_bytes / a.k},
                        {"prompt_tokens", a.prompt_tokens / a.k},
                        {"budget_tokens", a.budget_tokens / a.k}};
    std::printf("%s\n", j.dump().c_str());
  }
  std::fflush(stdout);
}

absl::Status Merge() {
  std::vector<nlohmann::json> rows;
  for (absl::string_view path :
       absl::StrSplit(absl::GetFlag(FLAGS_merge), ',', absl::SkipEmpty())) {
    std::ifstream f{std::string(path)};
    if (!f) return absl::NotFoundError(absl::StrCat("eval-longctx: cannot read ", path));
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.contains("accuracy")) {
        return absl::InvalidArgumentError(absl::StrCat("eval-longctx: ", path, ": not a row"));
      }
      rows.push_back(std::move(j));
    }
  }
  PrintSummary(rows);
  return absl::OkStatus();
}

// --corpus, else data/corpus/eval.txt beside the bundled model's models/ folder.
absl::StatusOr<std::string> ReadCorpus() {
  std::string path = absl::GetFlag(FLAGS_corpus);
  if (path.empty()) {
    const std::string bundled = BundledModelPath();
    path = bundled.substr(0, bundled.rfind("models/")) + "data/corpus/eval.txt";
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("eval-longctx: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The samples alone, for a server to be measured on: only the tokenizer and the chat template are
// read, no weights. Sample i of (length, task) is the one the evaluation runs.
absl::Status WriteSamples(const std::string& path, const std::vector<std::string>& tasks,
                          const std::vector<int>& lengths, int samples) {
  ASSIGN_OR_RETURN(const std::string model_path, ResolveModel(absl::GetFlag(FLAGS_model)));
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_path));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromGguf(*gguf));
  ASSIGN_OR_RETURN(std::string tmpl_text, gguf->GetString("tokenizer.chat_template"));
  ASSIGN_OR_RETURN(const ChatTemplate chat, DetectChatTemplate(tmpl_text));
  ASSIGN_OR_RETURN(const std::string text, ReadCorpus());
  const LongCtxCorpus corpus = MakeLongCtxCorpus(text, *tokenizer);
  std::ofstream out(path);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  for (const int length : lengths) {
    for (const std::string& task : tasks) {
      for (int i = 0; i < samples; ++i) {
        ASSIGN_OR_RETURN(const LongCtxSample s,
                         MakeLongCtxSample(task, length, i, absl::GetFlag(FLAGS_seed), corpus,
                                           *tokenizer, chat));
        const nlohmann::json j = {{"task", s.task},
                                  {"length", length},
                                  {"sample", i},
                                  {"prompt", s.prompt},
                                  {"answers", s.answers},
                                  {"recall", s.recall},
                                  {"max_tokens", s.max_tokens}};
        out << j.dump() << "\n";
      }
    }
  }
  out.flush();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

using SampleKey = std::tuple<std::string, int, int>;  // task, length, sample

// --resume: the rows --out already holds, appended to *rows, and the samples they cover. A line
// that does not parse (the last one, cut short by a stop) is dropped; no file is no rows.
absl::StatusOr<std::set<SampleKey>> ResumeRows(std::vector<nlohmann::json>* rows) {
  std::set<SampleKey> done;
  const std::string path = absl::GetFlag(FLAGS_out);
  if (!absl::GetFlag(FLAGS_resume)) return done;
  if (path.empty()) return absl::InvalidArgumentError("eval-longctx: --resume needs --out");
  std::ifstream in(path);
  std::string line;
  while (in && std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("task") || !j.contains("length") ||
        !j.contains("sample") || !j["task"].is_string() || !j["length"].is_number_integer() ||
        !j["sample"].is_number_integer()) {
      continue;
    }
    done.insert({j["task"].get<std::string>(), j["length"].get<int>(), j["sample"].get<int>()});
    rows->push_back(std::move(j));
  }
  std::fprintf(stderr, "eval-longctx: resuming %s: %zu samples (%zu rows) kept\n", path.c_str(),
               done.size(), rows->size());
  return done;
}

}  // namespace

absl::Status EvalLongCtxMain() {
  if (!absl::GetFlag(FLAGS_merge).empty()) return Merge();
  ASSIGN_OR_RETURN(const std::vector<std::string> tasks,
                   Names("tasks", absl::GetFlag(FLAGS_tasks), LongCtxTaskNames()));
  ASSIGN_OR_RETURN(const std::vector<std::string> methods,
                   Names("methods", absl::GetFlag(FLAGS_methods), LongCtxMethodNames()));
  ASSIGN_OR_RETURN(const std::vector<std::string> pop_names,
                   Names("pop_rows", absl::GetFlag(FLAGS_pop_rows), {"on", "off"}));
  ASSIGN_OR_RETURN(const std::vector<double> budgets, Fractions(absl::GetFlag(FLAGS_budgets)));
  std::vector<int> lengths;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_lengths), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 256) {
      return absl::InvalidArgumentError(
          absl::StrCat("eval-longctx: --lengths: '", s, "' is not a length of >= 256 tokens"));
    }
    lengths.push_back(n);
  }
  if (lengths.empty()) return absl::InvalidArgumentError("eval-longctx: --lengths is empty");
  const int samples = absl::GetFlag(FLAGS_samples);
  if (samples < 1) return absl::InvalidArgumentError("eval-longctx: --samples must be >= 1");
  int shard = 0, shards = 1;
  if (!absl::GetFlag(FLAGS_shard).empty() &&
      (std::sscanf(absl::GetFlag(FLAGS_shard).c_str(), "%d/%d", &shard, &shards) != 2 ||
       shards < 1 || shard < 0 || shard >= shards)) {
    return absl::InvalidArgumentError("eval-longctx: --shard must be I/N with 0 <= I < N");
  }
  std::vector<bool> pops;
  for (const std::string& p : pop_names) pops.push_back(p == "on");

  if (!absl::GetFlag(FLAGS_samples_out).empty()) {
    return WriteSamples(absl::GetFlag(FLAGS_samples_out), tasks, lengths, samples);
  }

  LongCtxOptions o;
  ASSIGN_OR_RETURN(o.model_path, ResolveModel(absl::GetFlag(FLAGS_model)));
  o.precision = absl::GetFlag(FLAGS_precision);
  o.backend = absl::GetFlag(FLAGS_backend);
  o.chunk = absl::GetFlag(FLAGS_chunk);
  // The POP-on rows measure POP: serve's empty default (the catalogue's ratio, 0 for every model
  // so far) would make them the full rows again, so they take the paper's ratio instead.
  o.pop_ratio = absl::GetFlag(FLAGS_pop).empty() ? "1/3" : absl::GetFlag(FLAGS_pop);
  o.trim_pool = absl::GetFlag(FLAGS_trim_pool);
  if (o.trim_pool < 1) return absl::InvalidArgumentError("eval-longctx: --trim_pool must be >= 1");
  // The draft as `tripod serve` picks it: --draft_model, else the catalogue's draft of the model
  // (the 0.5B for the Qwen2.5-Coder 1.5B), else a self-draft.
  ASSIGN_OR_RETURN(const ServeModels models,
                   ChooseServeModels(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_draft_model),
                                     /*with_draft=*/true, /*fetch=*/false));
  o.draft_model_path = models.draft;
  std::fprintf(stderr, "eval-longctx: draft %s\n",
               models.draft.empty() ? "a self-draft of the model" : models.draft.c_str());
  if (absl::GetFlag(FLAGS_draft_layers) > 0) o.draft_layers = absl::GetFlag(FLAGS_draft_layers);
  ASSIGN_OR_RETURN(o.lookahead_layers, ParseLookaheadLayers(absl::GetFlag(FLAGS_lookahead_layers)));
  ASSIGN_OR_RETURN(std::unique_ptr<LongCtxEvaluator> eval, LongCtxEvaluator::Create(o));
  ASSIGN_OR_RETURN(const std::string text, ReadCorpus());
  const LongCtxCorpus corpus = MakeLongCtxCorpus(text, eval->tokenizer());
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(eval->model_path()));
  ASSIGN_OR_RETURN(std::string tmpl_text, gguf->GetString("tokenizer.chat_template"));
  ASSIGN_OR_RETURN(const ChatTemplate chat, DetectChatTemplate(tmpl_text));

  std::vector<nlohmann::json> rows;
  ASSIGN_OR_RETURN(const std::set<SampleKey> done, ResumeRows(&rows));
  std::ofstream rows_out;
  if (!absl::GetFlag(FLAGS_out).empty()) {
    rows_out.open(absl::GetFlag(FLAGS_out));
    if (!rows_out)
      return absl::InternalError(absl::StrCat("cannot write ", absl::GetFlag(FLAGS_out)));
    // The kept rows first (a line cut short by a stop is not among them).
    for (const nlohmann::json& r : rows) rows_out << r.dump() << "\n";
    rows_out.flush();
  }
  int job = 0;
  for (const int length : lengths) {
    for (const std::string& task : tasks) {
      for (int i = 0; i < samples; ++i, ++job) {
        if (job % shards != shard || done.count({task, length, i}) > 0) continue;
        ASSIGN_OR_RETURN(const LongCtxSample s,
                         MakeLongCtxSample(task, length, i, absl::GetFlag(FLAGS_seed), corpus,
                                           eval->tokenizer(), chat));
        ASSIGN_OR_RETURN(const std::vector<LongCtxRow> got,
                         eval->Evaluate(s, methods, budgets, pops));
        // A sample's rows in one write, so that a stop leaves whole samples (and at most one cut
        // line, which --resume drops).
        std::string lines;
        for (const LongCtxRow& r : got) {
          rows.push_back(RowJson(r, i));
          lines += rows.back().dump() + "\n";
        }
        if (rows_out.is_open()) rows_out << lines << std::flush;
        std::fprintf(stderr, "eval-longctx: %s at %d tokens, sample %d: %zu rows\n", task.c_str(),
                     length, i, got.size());
      }
    }
  }
  PrintSummary(rows);
  return absl::OkStatus();
}

}  // namespace tripod
