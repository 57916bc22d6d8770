// bench/transfer: time to first token through a prefill process and a decode process on loopback
// against the same prompt in one process, one JSON line per prompt length and POP setting:
//   {"bench":"transfer","prompt_tokens":N,"pop":"off|1/3","ttft_local_s":..,"ttft_remote_s":..,
//    "ratio":..,"bytes_per_token":..,"bytes_per_token_theory":..,"transfer_gbps":..,
//    "hidden_share":..}
// Local: PrefillEngine::Run (the landed in-process POP path), its KV snapshot imported into a
// DecodeEngine that runs the last prompt token and samples the first one. Remote: what a
// scheduler does, Decode.Reserve, Prefill.Run (the KV streamed layer by layer to the decode
// worker while the prefill computes), Decode.Generate until its first token, timed by this
// client. Reps alternate local and remote so that the machine's drift hits both; medians are
// reported. From the prefill worker's own clock: transfer_s (first chunk handed to the stream ->
// the decode side's ack) and tail_s (compute done -> ack); hidden_share = 1 - tail_s/transfer_s,
// the share of the transfer that ran under the compute. transfer_gbps is payload bytes over
// transfer_s: the wire's rate as throttled by the compute it overlaps, not the link's ceiling.
// Prompts are pseudo-random token ids.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/compute/session.h"
#include "common/model/model_resolver.h"
#include "common/rpc/protocol.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "decode_node/decode_engine.h"
#include "nlohmann/json.hpp"
#include "prefill_node/pop_config.h"
#include "prefill_node/prefill_engine.h"
#include "tripod/v1/decode.grpc.pb.h"
#include "tripod/v1/prefill.grpc.pb.h"

ABSL_FLAG(std::string, model, "",
          "a GGUF file or a model catalogue name (scripts/fetch_model --list); default: the "
          "bundled model");
ABSL_FLAG(int, threads, 0, "compute threads of each side (default: all cores)");
ABSL_FLAG(std::string, precision, "auto", "fp32 | bf16 | int8 | int16 | auto");
ABSL_FLAG(std::string, lengths, "512,2048", "prompt lengths");
ABSL_FLAG(std::string, pops, "0,1/3", "POP ratios (0 is reported as off)");
ABSL_FLAG(int, reps, 3, "alternated repetitions (medians are reported)");
ABSL_FLAG(int, chunk, 512, "prefill chunk, both sides");
ABSL_FLAG(std::string, bin_dir, "",
          "where tripod-prefill and tripod-decode are (default: the folder above this binary's)");

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// A worker process in its own process group, killed and reaped when this goes.
struct Child {
  pid_t pid = -1;
  std::string dir;
  int grpc_port = 0;
  ~Child() {
    if (pid > 0) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (!dir.empty()) std::system(("rm -rf '" + dir + "'").c_str());
  }
};

absl::StatusOr<std::unique_ptr<Child>> Spawn(const std::string& bin,
                                             std::vector<std::string> args) {
  auto c = std::make_unique<Child>();
  char tmpl[] = "/tmp/tripod_bench_XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  c->dir = tmpl;
  const std::string port_file = c->dir + "/ports.json";
  const std::string log = c->dir + "/log.txt";
  args.insert(args.begin(), bin);
  args.push_back("--listen=127.0.0.1:0");
  args.push_back("--http_listen=127.0.0.1:0");
  args.push_back("--port_file=" + port_file);
  c->pid = fork();
  if (c->pid < 0) return absl::InternalError("fork failed");
  if (c->pid == 0) {
    setsid();
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  const auto t0 = Clock::now();
  while (Since(t0) < 120) {
    int status;
    if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
      c->pid = -1;
      std::ifstream f(log);
      std::stringstream s;
      s << f.rdbuf();
      return absl::InternalError(absl::StrCat(bin, " exited at start:\n", s.str()));
    }
    std::ifstream f(port_file);
    if (f) {
      nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
      if (!j.is_discarded()) {
        c->grpc_port = j.value("grpc_port", 0);
        return c;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(bin, " did not listen within 120 s"));
}

struct Remote {
  double ttft_s = 0;
  v1::PrefillResponse run;
};

absl::StatusOr<Remote> RunRemote(v1::Prefill::Stub& prefill, v1::Decode::Stub& decode,
                                 const std::string& decode_address, uint64_t plan_key,
                                 const std::vector<int32_t>& prompt, uint64_t id) {
  Remote out;
  const auto t0 = Clock::now();
  v1::ReserveRequest rq;
  rq.set_prompt_tokens(static_cast<int>(prompt.size()));
  rq.set_plan_key(plan_key);
  v1::ReserveResponse rs;
  RETURN_IF_ERROR(FromGrpcStatus(decode.Reserve(NewClientContext().get(), rq, &rs)));
  v1::PrefillRequest pq;
  pq.set_request_id(id);
  *pq.mutable_prompt() = {prompt.begin(), prompt.end()};
  pq.set_decode_address(decode_address);
  pq.set_transfer_id(rs.transfer_id());
  RETURN_IF_ERROR(FromGrpcStatus(prefill.Run(NewClientContext().get(), pq, &out.run)));
  v1::GenerateRequest gq;
  gq.set_request_id(id);
  *gq.mutable_prompt() = {prompt.begin(), prompt.end()};
  gq.set_transfer_id(rs.transfer_id());
  gq.set_max_tokens(1);
  gq.mutable_sampling()->set_temperature(0);
  auto ctx = NewClientContext();
  auto reader = decode.Generate(ctx.get(), gq);
  v1::GenerateResponse ev;
  bool first = false;
  while (reader->Read(&ev)) {
    if (!first && ev.token() >= 0) {
      out.ttft_s = Since(t0);
      first = true;
    }
  }
  RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  if (!first) return absl::InternalError("remote: no token came");
  return out;
}

absl::StatusOr<double> RunLocal(PrefillEngine& pe, DecodeEngine& de,
                                const std::vector<int32_t>& prompt) {
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(PrefillResult r, pe.Run(prompt));
  DecodeRequest req;
  req.prompt = prompt;
  req.max_tokens = 1;
  req.sampling.temperature = 0;
  req.kv = std::make_shared<KvSnapshot>(std::move(r.kv));
  double ttft = 0;
  req.on_event = [&](const TokenEvent& ev) {
    if (ev.token >= 0 && ttft == 0) ttft = Since(t0);
  };
  RETURN_IF_ERROR(de.Submit(std::move(req)).status());
  RETURN_IF_ERROR(de.RunUntilIdle());
  if (ttft == 0) return absl::InternalError("local: no token came");
  return ttft;
}

absl::Status Main(const std::string& self) {
  ASSIGN_OR_RETURN(const std::string model, ResolveModel(absl::GetFlag(FLAGS_model)));
  std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (bin_dir.empty()) {
    const std::string here = self.substr(0, self.rfind('/'));
    bin_dir = here.substr(0, here.rfind('/'));
  }
  const int threads = absl::GetFlag(FLAGS_threads) > 0
                          ? absl::GetFlag(FLAGS_threads)
                          : static_cast<int>(std::thread::hardware_concurrency());
  SetComputeThreads(threads);
  const std::string precision = absl::GetFlag(FLAGS_precision);
  const int chunk = absl::GetFlag(FLAGS_chunk);
  std::vector<int> lengths;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_lengths), ',')) {
    int n;
    if (!absl::SimpleAtoi(s, &n) || n < 2) return absl::InvalidArgumentError("bad --lengths");
    lengths.push_back(n);
  }

  DecodeEngineOptions dopt;
  dopt.model_path = model;
  dopt.precision = precision;
  dopt.kv_budget_bytes = size_t{1} << 30;
  ASSIGN_OR_RETURN(std::unique_ptr<DecodeEngine> de, DecodeEngine::Create(dopt));
  const std::vector<std::string> common = {"--model=" + model, "--precision=" + precision,
                                           absl::StrCat("--threads=", threads)};
  std::vector<std::string> dargs = common;
  dargs.push_back("--kv_budget_mb=1024");
  ASSIGN_OR_RETURN(std::unique_ptr<Child> decode_proc, Spawn(bin_dir + "/tripod-decode", dargs));
  const std::string decode_address = absl::StrCat("127.0.0.1:", decode_proc->grpc_port);
  auto decode = v1::Decode::NewStub(NewWorkerChannel(decode_address));

  uint64_t id = 1;
  for (absl::string_view pop_s : absl::StrSplit(absl::GetFlag(FLAGS_pops), ',')) {
    const std::string pop(pop_s);
    PrefillOptions popt;
    popt.model_path = model;
    popt.precision = precision;
    popt.chunk = chunk;
    ASSIGN_OR_RETURN(popt.pop, ParsePopConfig(pop, ""));
    ASSIGN_OR_RETURN(std::unique_ptr<PrefillEngine> pe, PrefillEngine::Create(popt));
    std::vector<std::string> pargs = common;
    pargs.push_back("--pop_ratio=" + pop);
    pargs.push_back(absl::StrCat("--chunk=", chunk));
    ASSIGN_OR_RETURN(std::unique_ptr<Child> prefill_proc,
                     Spawn(bin_dir + "/tripod-prefill", pargs));
    auto prefill =
        v1::Prefill::NewStub(NewWorkerChannel(absl::StrCat("127.0.0.1:", prefill_proc->grpc_port)));
    v1::HealthResponse health;
    RETURN_IF_ERROR(
        FromGrpcStatus(prefill->Health(NewClientContext().get(), v1::HealthRequest(), &health)));
    const ModelConfig& c = pe->model().config;
    const double theory = 2.0 * c.n_layers * c.n_kv_heads * KvRowBytes(pe->kv_dtype(), c.head_dim);

    for (int n : lengths) {
      std::mt19937 rng(n);
      std::uniform_int_distribution<int32_t> tok(100, c.vocab_size - 1);
      std::vector<int32_t> prompt(n);
      for (int32_t& t : prompt) t = tok(rng);
      // Warm-up of both paths (first-touch of buffers, thread start-up).
      RETURN_IF_ERROR(RunLocal(*pe, *de, prompt).status());
      RETURN_IF_ERROR(
          RunRemote(*prefill, *decode, decode_address, health.plan_key(), prompt, id++).status());
      std::vector<double> local, remote, ratio, hidden, gbps, bpt;
      for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
        ASSIGN_OR_RETURN(double l, RunLocal(*pe, *de, prompt));
        ASSIGN_OR_RETURN(Remote r, RunRemote(*prefill, *decode, decode_address, health.plan_key(),
                                             prompt, id++));
        local.push_back(l);
        remote.push_back(r.ttft_s);
        ratio.push_back(r.ttft_s / l);
        const double xfer = r.run.transfer_s();
        hidden.push_back(xfer > 0 ? 1.0 - r.run.tail_s() / xfer : 1.0);
        gbps.push_back(xfer > 0 ? 8e-9 * static_cast<double>(r.run.bytes_sent()) / xfer : 0);
        bpt.push_back(static_cast<double>(r.run.bytes_sent()) / (n - 1));
      }
      std::printf(
          "{\"bench\":\"transfer\",\"prompt_tokens\":%d,\"pop\":\"%s\",\"precision\":\"%s\","
          "\"threads\":%d,\"reps\":%zu,\"ttft_local_s\":%.4f,\"ttft_remote_s\":%.4f,"
          "\"ratio\":%.4f,\"bytes_per_token\":%.1f,\"bytes_per_token_theory\":%.1f,"
          "\"transfer_gbps\":%.3f,\"hidden_share\":%.4f}\n",
          n, pop == "0" ? "off" : pop.c_str(), precision.c_str(), threads, local.size(),
          Median(local), Median(remote), Median(ratio), Median(bpt), theory, Median(gbps),
          Median(hidden));
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return 1;
  self[len] = 0;
  absl::Status s = tripod::Main(self);
  if (!s.ok()) {
    std::fprintf(stderr, "bench/transfer: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
