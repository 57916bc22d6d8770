// `tripod serve`: the whole service on one machine. Starts the decode, prefill and draft workers
// and then the scheduler as child processes on loopback (the scheduler's HTTP API on
// --host:--port), waits until the scheduler's /health answers 200, prints the URL, and then
// supervises: a child that dies is started again on the ports it had, after a backoff, so the
// addresses the scheduler was given stay right. SIGINT/SIGTERM stop the scheduler first (it drains
// requests that need the workers), then the workers: SIGTERM, a bounded wait, SIGKILL for
// stragglers, exit 0.
//
// The child binaries (tripod-prefill, tripod-decode, tripod-draft, tripod-scheduler) are the ones
// next to this binary. Each child runs in its own process group, so a terminal's Ctrl-C reaches
// only us and the shutdown keeps its order, and gets PR_SET_PDEATHSIG, so none outlives a
// `tripod serve` killed with SIGKILL.
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/serve_models.h"
#include "common/model/model_catalogue.h"
#include "common/model/model_resolver.h"
#include "common/util/core_share.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "prefill_node/pop_config.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(std::string, precision);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(std::string, kv_cache_dtype);

ABSL_DECLARE_FLAG(int, draft_layers);              // cli/draft.cc
ABSL_DECLARE_FLAG(std::string, lookahead_layers);  // cli/draft.cc

ABSL_FLAG(int, port, 8000, "serve: the API's HTTP port (0: any free port)");
ABSL_FLAG(std::string, host, "127.0.0.1", "serve: the address the API listens on");
ABSL_FLAG(std::string, pop, "",
          "serve: POP ratio the prefill workers load, e.g. 1/3 or 0.25 (0: full model; empty: the "
          "catalogue's ratio for the model, 0 for a model outside it)");
ABSL_FLAG(int, prefill_workers, 1, "serve: prefill worker processes (0: decode workers prefill)");
ABSL_FLAG(int, decode_workers, 1, "serve: decode worker processes");
ABSL_FLAG(int, draft_workers, 1,
          "serve: draft worker processes, for the requests' tripod.method speckv, specpc and "
          "draftmap (0: none; those requests then run without their method)");
ABSL_FLAG(std::string, prometheus_targets, "",
          "serve: write every process's /metrics address to this file, in Prometheus's file_sd "
          "format (deploy/prometheus/prometheus.yml reads deploy/prometheus/targets/*.json)");
ABSL_FLAG(std::string, tls_dir, "",
          "serve: mutual TLS on every gRPC channel, from a directory laid out as "
          "scripts/make_test_ca makes it (ca.pem, and <role>.pem and <role>.key for scheduler, "
          "prefill, decode and draft); empty: plaintext on loopback");
ABSL_FLAG(std::string, draft_model, "",
          "serve: the draft workers' model, a catalogue name or a GGUF file of the model's "
          "vocabulary (default: the catalogue's draft of --model, e.g. qwen2.5-coder-0.5b-instruct "
          "for qwen2.5-coder-1.5b-instruct, else a self-draft); self: a self-draft of --model (its "
          "first --draft_layers layers)");
ABSL_FLAG(int64_t, draft_timeout_ms, 0,
          "serve: the scheduler's draft deadline per 4096 prompt tokens begun; past it a request "
          "runs without its method (0: the scheduler's default, 30 s)");
ABSL_FLAG(int, method_min_tokens, -1,
          "serve: a tripod.budget given as a fraction keeps at least this many prompt tokens, so "
          "prompts this short run without the method (0: no floor; -1: the scheduler's default, "
          "512)");
ABSL_FLAG(bool, lend_cores, true,
          "serve: with the cores split (--threads 0), a worker with no work lends its CPUs to the "
          "others (a lone prompt prefills on all of them); false: each keeps its own");
ABSL_FLAG(int, yield_to_prefill_ms, 1000,
          "serve: with the cores lent (--lend_cores), while prompts queue at a prefill or draft "
          "worker the decode worker holds back steps of streams already started for at most this "
          "long (or four times its last step's time, if longer), lending its cores to the "
          "prefill (new requests' first tokens still come at once); 0: decode steps never wait");
ABSL_FLAG(bool, fetch, false,
          "serve: fetch a catalogue model (--model, --draft_model) that is not here yet with "
          "scripts/fetch_model first (scripts/serve sets it)");
ABSL_FLAG(bool, workers_only, false,
          "serve: start and supervise the workers only, no scheduler (for debugging)");

namespace tripod {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kWorkerStartTimeout = std::chrono::seconds(300);  // model load, big models
constexpr auto kHealthTimeout = std::chrono::seconds(120);
constexpr auto kStopTimeout = std::chrono::seconds(15);  // above the workers' 10 s grace
constexpr auto kKillTimeout = std::chrono::seconds(5);
constexpr auto kFirstBackoff = std::chrono::seconds(1);
constexpr auto kMaxBackoff = std::chrono::seconds(30);
constexpr auto kStableRun = std::chrono::seconds(60);  // a run this long resets the backoff

std::string JoinHostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

// Where a client on this machine reaches a server listening on `host` (a wildcard is not an
// address to connect to).
std::string ReachableHost(const std::string& host) {
  if (host.empty() || host == "0.0.0.0") return "127.0.0.1";
  if (host == "::" || host == "[::]") return "::1";
  return host;
}

struct Child {
  std::string name;               // "decode-0", "prefill-0", "scheduler"
  std::string binary;             // absolute path
  std::vector<std::string> args;  // every flag but the addresses and the port file
  std::string grpc_host = "127.0.0.1", http_host = "127.0.0.1";
  int grpc_port = 0, http_port = 0;  // 0 until the first start's port file tells them
  std::string port_file;
  pid_t pid = 0;       // 0: not running
  pid_t last_pid = 0;  // the latest run's, for the logs
  Clock::time_point started{}, restart_at{};
  Clock::duration backoff = kFirstBackoff;
  int restarts = 0;
  bool listening = false;      // its port file has appeared since the last start
  std::vector<int> cpus;       // the CPUs it may run on; empty: any
  std::vector<int> home_cpus;  // its own CPUs where it has some (for a draft worker beside it)
  int share_slot = -1;         // its slot in the core share; -1: none
};

// {"grpc_port":N,"http_port":M} as the workers write it; nullopt until the file is whole (it is
// written to a temporary name and renamed, so a partial file is never seen).
std::optional<std::pair<int, int>> ReadPortFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  auto field = [&](const std::string& key) -> int {
    const size_t at = text.find("\"" + key + "\"");
    if (at == std::string::npos) return -1;
    size_t i = text.find(':', at);
    if (i == std::string::npos) return -1;
    ++i;
    while (i < text.size() && text[i] == ' ') ++i;
    size_t j = i;
    while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j;
    int v = -1;
    return absl::SimpleAtoi(text.substr(i, j - i), &v) ? v : -1;
  };
  const int g = field("grpc_port"), h = field("http_port");
  if (g <= 0 || h <= 0) return std::nullopt;
  return std::make_pair(g, h);
}

// The status code of GET http://host:port/path, or an error; every step bounded by `timeout`.
absl::StatusOr<int> HttpGetStatus(const std::string& host, int port, const std::string& path,
                                  milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto left_ms = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count()));
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* ai = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &ai) != 0 || !ai) {
    return absl::InvalidArgumentError(absl::StrCat("not a numeric address: ", host));
  }
  const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(ai);
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  const int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* p) {
    close(*p);
    delete p;
  });
  auto wait_for = [&](short events) -> bool {
    pollfd p{fd, events, 0};
    return poll(&p, 1, left_ms()) == 1;
  };
  if (rc != 0) {
    if (errno != EINPROGRESS || !wait_for(POLLOUT)) {
      return absl::UnavailableError("connect timed out or failed");
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(err)));
  }
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", JoinHostPort(host, port),
                   "\r\nConnection: close\r\n\r\n");
  size_t sent = 0;
  while (sent < req.size()) {
    if (!wait_for(POLLOUT)) return absl::DeadlineExceededError("send timed out");
    const ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  // The status line is all we need: "HTTP/1.x NNN ...".
  std::string head;
  while (head.find("\r\n") == std::string::npos && head.size() < 4096) {
    if (!wait_for(POLLIN)) return absl::DeadlineExceededError("no answer in time");
    char buf[1024];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    head.append(buf, static_cast<size_t>(n));
  }
  int code = 0;
  if (head.size() < 12 || !absl::StartsWith(head, "HTTP/1.") ||
      !absl::SimpleAtoi(head.substr(9, 3), &code)) {
    return absl::DataLossError("not an HTTP response");
  }
  return code;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "stopped";
}

class Supervisor {
 public:
  // At most `capacity` children: Add hands out references that must stay valid.
  Supervisor(std::string tmp_dir, std::vector<std::string> env, size_t capacity)
      : tmp_dir_(std::move(tmp_dir)), env_(std::move(env)) {
    children_.reserve(capacity);
  }

  ~Supervisor() {
    // Whatever happened, no child is left behind, none unreaped, no temporary file.
    StopAll();
    for (const Child& c : children_) unlink(c.port_file.c_str());
    rmdir(tmp_dir_.c_str());
  }

  Child& Add(Child c) {
    if (children_.size() == children_.capacity()) std::abort();  // would move the others
    c.port_file = absl::StrCat(tmp_dir_, "/", c.name, ".json");
    children_.push_back(std::move(c));
    return children_.back();
  }
  std::vector<Child>& children() { return children_; }
  bool stop_requested() const { return stop_requested_; }

  absl::Status Start(Child& c) {
    unlink(c.port_file.c_str());
    std::vector<std::string> argv = {c.binary};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    argv.push_back("--listen=" + JoinHostPort(c.grpc_host, c.grpc_port));
    argv.push_back("--http_listen=" + JoinHostPort(c.http_host, c.http_port));
    argv.push_back("--port_file=" + c.port_file);
    // Everything the child needs is built before fork: between fork and exec only
    // async-signal-safe calls.
    std::vector<char*> av, ev;
    for (std::string& a : argv) av.push_back(a.data());
    av.push_back(nullptr);
    for (std::string& e : env_) ev.push_back(e.data());
    ev.push_back(nullptr);
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    for (int cpu : c.cpus) CPU_SET(cpu, &cpus);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      signal(SIGPIPE, SIG_DFL);
      if (!c.cpus.empty()) sched_setaffinity(0, sizeof(cpus), &cpus);
      const int null_fd = open("/dev/null", O_RDONLY);
      if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
      // Their logs (tripod-decode's go to stdout) join ours on stderr: our stdout carries only
      // the URL, for whoever reads it.
      dup2(STDERR_FILENO, STDOUT_FILENO);
      execve(av[0], av.data(), ev.data());
      static const char kMsg[] = "tripod serve: exec failed\n";
      ssize_t ignored = write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
      (void)ignored;
      _exit(127);
    }
    c.pid = pid;
    c.last_pid = pid;
    c.started = Clock::now();
    c.listening = false;
    return absl::OkStatus();
  }

  // Waits up to `d` for a signal; reaps exited children (their pid becomes 0 and `on_exit` is
  // told); SIGINT, SIGTERM or SIGHUP sets stop_requested() (a second one: kill_now_).
  template <typename OnExit>
  void Poll(milliseconds d, OnExit&& on_exit) {
    sigset_t set = Signals();
    timespec ts{static_cast<time_t>(d.count() / 1000),
                static_cast<long>(d.count() % 1000) * 1000000};
    siginfo_t info;
    const int sig = sigtimedwait(&set, &info, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (stop_requested_) kill_now_ = true;
      stop_requested_ = true;
    }
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (Child& c : children_) {
        if (c.pid == pid) {
          c.pid = 0;
          on_exit(c, status);
        }
      }
    }
  }
  void Poll(milliseconds d) {
    Poll(d, [](Child&, int) {});
  }

  // SIGTERM to those of `which` running, then waits for them (bounded), then SIGKILL.
  void Stop(const std::vector<Child*>& which) {
    bool any = false;
    for (Child* c : which) {
      if (c->pid > 0) {
        kill(c->pid, SIGTERM);
        any = true;
      }
    }
    if (!any) return;
    auto running = [&] {
      return std::any_of(which.begin(), which.end(), [](Child* c) { return c->pid > 0; });
    };
    const auto until = Clock::now() + kStopTimeout;
    while (running() && Clock::now() < until && !kill_now_) Poll(milliseconds(50));
    for (Child* c : which) {
      if (c->pid > 0) {
        Logger("serve").info("tripod serve: {} (pid {}) did not stop in time: SIGKILL", c->name,
                             c->pid);
        kill(c->pid, SIGKILL);
      }
    }
    const auto kill_until = Clock::now() + kKillTimeout;
    while (running() && Clock::now() < kill_until) Poll(milliseconds(20));
  }

  // The scheduler first (its requests in flight need the workers), then the workers.
  void StopAll() {
    std::vector<Child*> front, workers;
    for (Child& c : children_) (c.name == "scheduler" ? front : workers).push_back(&c);
    Stop(front);
    Stop(workers);
  }

  static sigset_t Signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);  // the terminal went away: stop as cleanly as on Ctrl-C
    sigaddset(&set, SIGCHLD);
    return set;
  }

 private:
  std::string tmp_dir_;
  std::vector<std::string> env_;
  std::vector<Child> children_;
  bool stop_requested_ = false;
  bool kill_now_ = false;
};

// Waits until each of `which` (started) has written its port file; an exit or a
// signal before that is an error (a signal: Cancelled).
absl::Status AwaitListening(Supervisor& sup, const std::vector<Child*>& which) {
  const auto until = Clock::now() + kWorkerStartTimeout;
  std::string died;
  for (;;) {
    bool all = true;
    for (Child* c : which) {
      if (!c->listening) {
        if (auto ports = ReadPortFile(c->port_file)) {
          c->grpc_port = ports->first;
          c->http_port = ports->second;
          c->listening = true;
          unlink(c->port_file.c_str());  // read once; less to leave behind after a SIGKILL
        }
      }
      all = all && c->listening;
    }
    if (all) return absl::OkStatus();
    sup.Poll(milliseconds(50), [&](Child& c, int status) {
      died =
          absl::StrCat(c.name, " ", DescribeExit(status), " before it listened (its log is above)");
    });
    if (!died.empty()) return absl::UnavailableError(died);
    if (sup.stop_requested()) return absl::CancelledError("stopped during start-up");
    if (Clock::now() > until) {
      return absl::DeadlineExceededError("the workers did not listen within 300 s");
    }
  }
}

// The children's environment, with OMP_WAIT_POLICY=PASSIVE unless the user set a policy: idle
// OpenMP threads sleep instead of spinning at barriers, where they would take cores from the
// other workers, the scheduler and gRPC's threads (the threads: see ServeMain). Under load a
// spinning team is ruinous (docs/benchmarks.md, "tripod serve: OpenMP threads that sleep").
std::vector<std::string> ChildEnvironment() {
  std::vector<std::string> env;
  bool has_policy = false;
  for (char** e = environ; *e != nullptr; ++e) {
    if (absl::StartsWith(*e, "OMP_WAIT_POLICY=")) has_policy = true;
    env.emplace_back(*e);
  }
  if (!has_policy) env.emplace_back("OMP_WAIT_POLICY=PASSIVE");
  return env;
}

// The CPUs this process may run on.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

absl::StatusOr<std::string> BinaryDir() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return absl::InternalError("cannot read /proc/self/exe");
  exe[n] = 0;
  std::string dir(exe);
  return dir.substr(0, dir.rfind('/'));
}

std::string ModelStem(const std::string& path) {
  std::string base = path.substr(path.rfind('/') + 1);
  if (absl::EndsWith(base, ".gguf")) base.resize(base.size() - 5);
  return base;
}

void OnChildExit(Child& c, int status) {
  const auto ran = Clock::now() - c.started;
  if (ran >= kStableRun) c.backoff = kFirstBackoff;
  c.restart_at = Clock::now() + c.backoff;
  ++c.restarts;
  Logger("serve").info(
      "tripod serve: {} (pid {}, up {:.1f} s) {}; restarting it in {:.0f} s on the same ports "
      "(restart {})",
      c.name, c.last_pid, std::chrono::duration<double>(ran).count(), DescribeExit(status),
      std::chrono::duration<double>(c.backoff).count(), c.restarts);
  c.backoff = std::min<Clock::duration>(c.backoff * 2, kMaxBackoff);
}

// Every process's /metrics address as Prometheus's file_sd reads it, labelled with the process
// (decode-0, prefill-0, draft-0, scheduler). Written whole, then renamed over the old file, so
// that Prometheus never reads half of it. Restarts keep their ports: the file stays true.
absl::Status WritePrometheusTargets(const std::string& path, const std::vector<Child>& children) {
  std::string json = "[\n";
  for (size_t i = 0; i < children.size(); ++i) {
    const Child& c = children[i];
    absl::StrAppend(&json, "  {\"targets\": [\"",
                    JoinHostPort(ReachableHost(c.http_host), c.http_port),
                    "\"], \"labels\": {\"process\": \"", c.name, "\"}}",
                    i + 1 < children.size() ? ",\n" : "\n");
  }
  json += "]\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << json;
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  Logger("serve").info("tripod serve: Prometheus targets in {}", path);
  return absl::OkStatus();
}

}  // namespace

absl::Status ServeMain() {
  const int port = absl::GetFlag(FLAGS_port);
  const std::string host = absl::GetFlag(FLAGS_host);
  const int n_prefill = absl::GetFlag(FLAGS_prefill_workers);
  const int n_decode = absl::GetFlag(FLAGS_decode_workers);
  const int n_draft = absl::GetFlag(FLAGS_draft_workers);
  const bool workers_only = absl::GetFlag(FLAGS_workers_only);
  if (port < 0 || port > 65535) return absl::InvalidArgumentError("--port must be in 0..65535");
  if (host.empty()) return absl::InvalidArgumentError("--host is empty");
  if (n_decode < 1) return absl::InvalidArgumentError("--decode_workers must be at least 1");
  if (n_prefill < 0) return absl::InvalidArgumentError("--prefill_workers must not be negative");
  if (n_draft < 0) return absl::InvalidArgumentError("--draft_workers must not be negative");
  if (absl::GetFlag(FLAGS_draft_timeout_ms) < 0) {
    return absl::InvalidArgumentError("--draft_timeout_ms must not be negative");
  }
  if (absl::GetFlag(FLAGS_method_min_tokens) < -1) {
    return absl::InvalidArgumentError("--method_min_tokens must be -1 or more");
  }
  if (absl::GetFlag(FLAGS_yield_to_prefill_ms) < 0) {
    return absl::InvalidArgumentError("--yield_to_prefill_ms must not be negative");
  }
  if (absl::GetFlag(FLAGS_draft_layers) < 0) {
    return absl::InvalidArgumentError("--draft_layers must not be negative");
  }
  if (absl::GetFlag(FLAGS_threads) < 0) {
    return absl::InvalidArgumentError("--threads must not be negative");
  }
  ASSIGN_OR_RETURN(const ServeModels models,
                   ChooseServeModels(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_draft_model),
                                     n_draft > 0, absl::GetFlag(FLAGS_fetch)));
  const std::string& model = models.target;
  // POP is lossy: by default a model is pruned only as far as its measured task score allows.
  std::string pop = absl::GetFlag(FLAGS_pop);
  if (pop.empty()) pop = DefaultPopFor(BuiltinModelCatalogue(), model);
  ASSIGN_OR_RETURN(const PopConfig pop_config, ParsePopConfig(pop, ""));
  if (!(pop_config.ratio >= 0 && pop_config.ratio < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--pop ", pop, " is outside [0, 1)"));
  }
  // The vocabulary check parsed both files' token tables (~100 MB of heap for Qwen's); this
  // process only supervises from here on, so hand the freed heap back.
  malloc_trim(0);
  // The API's name for the model: the catalogue name it was started by (`--model
  // qwen2.5-coder-1.5b-instruct` answers to "qwen2.5-coder-1.5b-instruct"; the scheduler keeps
  // the file's name as an alias), else the file's name.
  const std::string model_flag = absl::GetFlag(FLAGS_model);
  const bool by_name = !model_flag.empty() && IsCatalogueName(BuiltinModelCatalogue(), model_flag);
  const std::string served_name = by_name ? model_flag : ModelStem(model);
  ASSIGN_OR_RETURN(const std::string dir, BinaryDir());
  std::vector<std::string> roles = {"tripod-decode"};
  if (n_prefill > 0) roles.push_back("tripod-prefill");
  if (n_draft > 0) roles.push_back("tripod-draft");
  if (!workers_only) roles.push_back("tripod-scheduler");
  for (const std::string& r : roles) {
    const std::string path = dir + "/" + r;
    if (access(path.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(r, " not found next to this binary (", path,
                                              "): build it, e.g. cmake --build build/release "
                                              "--target tripod-prefill tripod-decode "
                                              "tripod-draft tripod-scheduler"));
    }
  }
  // Threads: by default the cores are split among the workers, not shared. Disaggregation is
  // there to keep prefill from disturbing decode; workers whose OpenMP teams share cores stall
  // at every barrier whenever both compute (a preempted team member holds up its whole parallel
  // region). Under concurrent load the split gives more tokens and a far shorter TPOT; what it
  // costs is that a lone long prompt prefills on half the cores (docs/benchmarks.md, "tripod
  // serve: cores split among the workers"). With 2+ threads each, every worker gets its own CPUs
  // (affinity), since each pins its team within the CPUs it is allowed
  // (common/util/thread_pool.cc). --threads N gives every worker N threads on any CPU instead.
  // With --lend_cores (the default) the split is a core share instead (common/util/core_share.h):
  // each worker's CPUs are its own whenever it computes, and lent to the others while it has no
  // work, so a lone prompt prefills on every core and the last requests of a burst decode on them.
  const std::vector<int> allowed = AllowedCpus();
  const int cores = static_cast<int>(allowed.size());
  const bool split = absl::GetFlag(FLAGS_threads) == 0;
  const int threads =
      split ? std::max(1, cores / (n_prefill + n_decode)) : absl::GetFlag(FLAGS_threads);
  const bool share = split && absl::GetFlag(FLAGS_lend_cores) && n_prefill + n_decode > 1 &&
                     cores >= n_prefill + n_decode;
  std::vector<std::vector<int>> share_slots;  // the share's slot i: a worker's own CPUs
  std::string share_path;                     // in serve's temporary directory, once it exists
  size_t next_cpu = 0;
  // Joins c to the share's `slot` as `member`: its team takes every core the share lends.
  auto join_share = [&](Child& c, int slot, int member) {
    c.args.push_back("--core_share=" + share_path);
    c.args.push_back(absl::StrCat("--core_share_slot=", slot));
    if (member > 0) c.args.push_back(absl::StrCat("--core_share_member=", member));
    for (std::string& a : c.args) {
      if (a.starts_with("--threads=")) a = absl::StrCat("--threads=", cores);
    }
  };
  auto assign_cpus = [&](Child& c) {
    if (!split) return;
    std::vector<int> own(allowed.begin() + next_cpu, allowed.begin() + next_cpu + threads);
    next_cpu += threads;
    if (share) {
      // Its engine thread keeps to its own CPUs and its team borrows; the process may run anywhere.
      c.share_slot = static_cast<int>(share_slots.size());
      join_share(c, c.share_slot, 0);
      share_slots.push_back(own);
      if (threads >= 2) c.home_cpus = own;
      return;
    }
    if (threads < 2) return;  // one thread: no team to pin; the kernel balances
    c.cpus = own;
    c.home_cpus = own;
  };

  // Signals are taken synchronously (sigtimedwait) in one loop with the children's exits.
  sigset_t signals = Supervisor::Signals();
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  char tmpl[] = "/tmp/tripod-serve.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  share_path = std::string(tmpl) + "/cores";
  Supervisor sup(tmpl, ChildEnvironment(), static_cast<size_t>(n_prefill + n_decode + n_draft + 1));
  const std::vector<std::string> common = {"--model=" + model, absl::StrCat("--threads=", threads),
                                           "--precision=" + absl::GetFlag(FLAGS_precision),
                                           "--backend=" + absl::GetFlag(FLAGS_backend)};
  // Each child's TLS flags (the worker checks the files itself and says what is wrong).
  const std::string tls_dir = absl::GetFlag(FLAGS_tls_dir);
  auto tls = [&tls_dir](Child& c, const char* role) {
    if (tls_dir.empty()) return;
    c.args.push_back("--tls_ca=" + tls_dir + "/ca.pem");
    c.args.push_back(absl::StrCat("--tls_cert=", tls_dir, "/", role, ".pem"));
    c.args.push_back(absl::StrCat("--tls_key=", tls_dir, "/", role, ".key"));
  };
  std::vector<Child*> workers, decoders, prefillers;
  for (int i = 0; i < n_decode; ++i) {
    Child c{.name = absl::StrCat("decode-", i), .binary = dir + "/tripod-decode", .args = common};
    c.args.push_back("--kv_cache_dtype=" + absl::GetFlag(FLAGS_kv_cache_dtype));
    c.args.push_back(
        absl::StrCat("--yield_to_prefill_ms=", absl::GetFlag(FLAGS_yield_to_prefill_ms)));
    tls(c, "decode");
    assign_cpus(c);
    decoders.push_back(&sup.Add(std::move(c)));
  }
  for (int i = 0; i < n_prefill; ++i) {
    Child c{.name = absl::StrCat("prefill-", i), .binary = dir + "/tripod-prefill", .args = common};
    c.args.push_back("--pop_ratio=" + pop);
    tls(c, "prefill");
    assign_cpus(c);
    prefillers.push_back(&sup.Add(std::move(c)));
  }
  // A draft worker runs a request's draft hop just before its prefill: it shares a prefill
  // worker's CPUs (or a decode worker's, without prefill workers) rather than taking a share of
  // its own. With the cores lent, it joins that worker's slot as another member: alone it borrows
  // the idle workers' CPUs as the prefill does (a lone long prompt's map on every core), and
  // while it computes the slot is busy to its neighbours.
  // A separate draft model runs in full (--draft_layers=0) and names its target, whose vocabulary
  // it is checked against again at its start and whose identity its Health reports.
  std::vector<Child*> drafters;
  for (int i = 0; i < n_draft; ++i) {
    Child c{.name = absl::StrCat("draft-", i), .binary = dir + "/tripod-draft", .args = common};
    if (!models.draft.empty()) {
      c.args[0] = "--model=" + models.draft;
      c.args.push_back("--target_model=" + model);
      c.args.push_back("--draft_layers=0");
    } else {
      if (const int layers = absl::GetFlag(FLAGS_draft_layers); layers > 0) {
        c.args.push_back(absl::StrCat("--draft_layers=", layers));
      }
      c.args.push_back("--lookahead_layers=" + absl::GetFlag(FLAGS_lookahead_layers));
    }
    tls(c, "draft");
    const std::vector<Child*>& beside = prefillers.empty() ? decoders : prefillers;
    const Child& host_worker = *beside[i % beside.size()];
    const int member = 1 + i / static_cast<int>(beside.size());
    if (host_worker.share_slot >= 0 && member < kCoreShareMaxMembers) {
      join_share(c, host_worker.share_slot, member);
    } else {
      c.cpus = host_worker.home_cpus;
    }
    drafters.push_back(&sup.Add(std::move(c)));
  }
  workers = decoders;
  workers.insert(workers.end(), prefillers.begin(), prefillers.end());
  workers.insert(workers.end(), drafters.begin(), drafters.end());
  Logger("serve").info(
      "tripod serve: model {}; {} decode, {} prefill (POP {}) and {} draft worker(s), {} compute "
      "thread(s) each, {} {} cores",
      model, n_decode, n_prefill, pop, n_draft, threads,
      split ? (share ? "splitting (idle ones lent) the" : "splitting the") : "sharing the", cores);
  if (n_draft > 0) {
    Logger("serve").info("tripod serve: draft model {}",
                         models.draft.empty() ? "a self-draft of the model" : models.draft);
  }
  if (share) RETURN_IF_ERROR(CreateCoreShare(share_path, share_slots));
  for (Child* w : workers) RETURN_IF_ERROR(sup.Start(*w));
  if (absl::Status s = AwaitListening(sup, workers); !s.ok()) {
    return absl::IsCancelled(s) ? absl::OkStatus() : s;
  }
  auto addresses = [](const std::vector<Child*>& cs) {
    std::vector<std::string> out;
    for (const Child* c : cs) out.push_back(JoinHostPort(c->grpc_host, c->grpc_port));
    return absl::StrJoin(out, ",");
  };
  for (const Child* w : workers) {
    Logger("serve").info("tripod serve: {}: gRPC {}, HTTP {} (pid {})", w->name,
                         JoinHostPort(w->grpc_host, w->grpc_port),
                         JoinHostPort(w->http_host, w->http_port), w->pid);
  }

  Child* scheduler = nullptr;
  if (!workers_only) {
    Child c{.name = "scheduler", .binary = dir + "/tripod-scheduler"};
    c.args = {"--model=" + model, "--decode=" + addresses(decoders)};
    if (by_name) c.args.push_back("--served_model_name=" + served_name);
    if (!prefillers.empty()) c.args.push_back("--prefill=" + addresses(prefillers));
    if (!drafters.empty()) c.args.push_back("--draft=" + addresses(drafters));
    if (const int64_t ms = absl::GetFlag(FLAGS_draft_timeout_ms); ms > 0) {
      c.args.push_back(absl::StrCat("--draft_timeout_ms=", ms));
    }
    if (const int floor = absl::GetFlag(FLAGS_method_min_tokens); floor >= 0) {
      c.args.push_back(absl::StrCat("--method_min_tokens=", floor));
    }
    tls(c, "scheduler");
    c.grpc_host = host;
    c.http_host = host;
    c.http_port = port;
    scheduler = &sup.Add(std::move(c));
    RETURN_IF_ERROR(sup.Start(*scheduler));
    if (absl::Status s = AwaitListening(sup, {scheduler}); !s.ok()) {
      return absl::IsCancelled(s) ? absl::OkStatus() : s;
    }
    // Ready once /health says a decode worker is healthy.
    const std::string probe = ReachableHost(host);
    const auto until = Clock::now() + kHealthTimeout;
    std::string died;
    for (;;) {
      absl::StatusOr<int> code =
          HttpGetStatus(probe, scheduler->http_port, "/health", milliseconds(2000));
      if (code.ok() && *code == 200) break;
      sup.Poll(milliseconds(200), [&](Child& c, int status) {
        died = absl::StrCat(c.name, " ", DescribeExit(status),
                            " during start-up (its log is "
                            "above)");
      });
      if (!died.empty()) return absl::UnavailableError(died);
      if (sup.stop_requested()) return absl::OkStatus();
      if (Clock::now() > until) {
        return absl::DeadlineExceededError(
            absl::StrCat("the scheduler's /health did not answer 200 within 120 s (last: ",
                         code.ok() ? absl::StrCat("HTTP ", *code) : code.status().ToString(), ")"));
      }
    }
    const std::string url =
        absl::StrCat("http://", JoinHostPort(probe, scheduler->http_port), "/v1");
    std::printf(
        "Tripod is serving %s at %s (Ctrl-C stops it)\n"
        "  curl %s/completions -H 'Content-Type: application/json' -d '{\"model\": \"%s\", "
        "\"prompt\": \"The capital of France is\", \"max_tokens\": 16}'\n",
        served_name.c_str(), url.c_str(), url.c_str(), served_name.c_str());
  } else {
    std::printf("tripod serve: workers only; decode %s, prefill %s, draft %s (Ctrl-C stops them)\n",
                addresses(decoders).c_str(), addresses(prefillers).c_str(),
                addresses(drafters).c_str());
  }
  std::fflush(stdout);
  if (const std::string path = absl::GetFlag(FLAGS_prometheus_targets); !path.empty()) {
    RETURN_IF_ERROR(WritePrometheusTargets(path, sup.children()));
  }

  // Supervise until a signal: restart whatever dies, on its own ports, with a backoff.
  while (!sup.stop_requested()) {
    sup.Poll(milliseconds(200), [&](Child& c, int status) {
      if (!sup.stop_requested()) OnChildExit(c, status);
    });
    const auto now = Clock::now();
    for (Child& c : sup.children()) {
      if (c.pid == 0 && !sup.stop_requested() && now >= c.restart_at) {
        if (absl::Status s = sup.Start(c); !s.ok()) {
          Logger("serve").info("tripod serve: restarting {}: {}", c.name, s.ToString());
          c.restart_at = now + c.backoff;
          continue;
        }
        Logger("serve").info("tripod serve: {} restarted (pid {})", c.name, c.pid);
      }
      if (c.pid > 0 && !c.listening && ReadPortFile(c.port_file)) {
        c.listening = true;
        unlink(c.port_file.c_str());
        if (c.restarts > 0) {
          Logger("serve").info("tripod serve: {} listens again on gRPC {}, HTTP {}", c.name,
                               c.grpc_port, c.http_port);
        }
      }
    }
  }
  Logger("serve").info("tripod serve: stopping");
  sup.StopAll();
  Logger("serve").info("tripod serve: stopped");
  return absl::OkStatus();
}

}  // namespace tripod
