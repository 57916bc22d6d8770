// bench/paged_kv: the paged KV cache's bookkeeping cost, without any forward pass. One JSON
// line: per-token cost of decode-style growth (EnsureCapacity + Append, which hashes and
// publishes each block as it fills), of attaching a cached prefix, and of freeing; plus the
// bytes per token the cache really holds against 2 * layers * kv_heads * head_dim * element.
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/kv/paged_kv_cache.h"

ABSL_FLAG(int, seqs, 64, "concurrent sequences");
ABSL_FLAG(int, tokens, 2048, "tokens per sequence");
ABSL_FLAG(int, block_tokens, 16, "slots per block");

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Run() {
  const int n_seqs = absl::GetFlag(FLAGS_seqs), n_tok = absl::GetFlag(FLAGS_tokens);
  PagedKvOptions o;
  o.layout = KvLayout{30, 3, 64, KvDtype::kF16};  // the bundled SmolLM2-135M
  o.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  o.budget_bytes = size_t{1} * (n_seqs + 1) * (n_tok + o.block_tokens) * o.layout.bytes_per_token();
  auto made = PagedKvCache::Create(o);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 1;
  }
  PagedKvCache& c = **made;
  std::vector<std::vector<int32_t>> prompts(n_seqs, std::vector<int32_t>(n_tok));
  for (int s = 0; s < n_seqs; ++s) {
    for (int i = 0; i < n_tok; ++i) prompts[s][i] = 1 + (s * 7919 + i * 104729) % 49000;
  }
  std::vector<int32_t> seqs;
  for (int s = 0; s < n_seqs; ++s) seqs.push_back(c.NewSequence(1));
  // Decode-style growth: every step, every sequence gets one more slot.
  const auto t0 = Clock::now();
  for (int i = 0; i < n_tok; ++i) {
    for (int s = 0; s < n_seqs; ++s) {
      if (!c.EnsureCapacity(seqs[s], i + 1) || !c.Append(seqs[s], {&prompts[s][i], 1})) {
        std::fprintf(stderr, "out of blocks\n");
        return 1;
      }
    }
  }
  const auto t1 = Clock::now();
  for (int32_t s : seqs) c.FreeSequence(s);
  const auto t2 = Clock::now();
  // Every prompt is cached now: attach each again (all but its last block).
  for (int s = 0; s < n_seqs; ++s) {
    seqs[s] = c.NewSequence(1);
    if (c.AttachCachedPrefix(seqs[s], prompts[s]) == 0) {
      std::fprintf(stderr, "no prefix hit\n");
      return 1;
    }
  }
  const auto t3 = Clock::now();
  const bool ok = c.CheckConsistency().ok();
  const double total = double{1} * n_seqs * n_tok;
  std::printf(
      "{\"bench\":\"paged_kv\",\"seqs\":%d,\"tokens\":%d,\"block_tokens\":%d,"
      "\"append_ns_per_token\":%.1f,\"free_ns_per_token\":%.1f,\"attach_ns_per_token\":%.1f,"
      "\"kv_bytes_per_token\":%zu,\"kv_bytes_per_token_theory\":%zu,\"consistent\":%s}\n",
      n_seqs, n_tok, o.block_tokens, 1e9 * Seconds(t0, t1) / total, 1e9 * Seconds(t1, t2) / total,
      1e9 * Seconds(t2, t3) / total, c.kv_bytes_per_token(), o.layout.bytes_per_token(),
      ok ? "true" : "false");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tripod::Run();
}
