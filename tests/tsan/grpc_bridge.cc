// gRPC's ordering guarantees, told to ThreadSanitizer. Debian's gRPC is not built with TSan, so
// the happens-before edges it creates between threads (atomics and absl::Mutex inside libgrpc)
// are invisible: every access that gRPC hands from one thread to another (a reactor's state
// between StartWrite and OnWriteDone, a client callback's captures, a request and its handler)
// would read as a race. Suppressing those by gRPC's frames hides every race of Tripod's own code
// on gRPC's threads, so this file states the edges instead, at gRPC's own API boundary:
//  - grpc_call_start_batch releases its tag, and the tag's callback acquires it when it runs
//    (callback API: the tag is a grpc_completion_queue_functor, whose functor_run is wrapped);
//  - a call's OnDone and OnCancel, which libgrpc++ hands to gRPC's executor as closures, acquire
//    what the thread that scheduled them did, and the end of every callback before them;
//  - a new incoming call's callback acquires everything this process sent as a client before it
//    and the server's start (in-process tests run the client and the server in one process;
//    across processes the edge is the network's).
// Only the test binary of the tsan preset links this file (tests/CMakeLists.txt); the library
// calls interposed here are the ones libgrpc++ reaches through the dynamic linker.
#include <dlfcn.h>
#include <grpc/grpc.h>
#include <link.h>
#include <sanitizer/tsan_interface.h>

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/util/mutex.h"

// TSan's dynamic annotations (libtsan exports them; no header declares them).
extern "C" void AnnotateIgnoreSyncBegin(const char* file, int line);
extern "C" void AnnotateIgnoreSyncEnd(const char* file, int line);
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);

struct grpc_closure;

// libgrpc 1.51's internal declarations that libgrpc++ calls (grpc_core::Executor and the server's
// call allocations): only an allocation's tag is read, but the layouts must match for the values
// to pass through unchanged.
namespace grpc_core {
enum class ExecutorType;
enum class ExecutorJobType;
class Executor {
 public:
  static void Run(grpc_closure* closure, absl::Status error, ExecutorType type,
                  ExecutorJobType job_type);
};
class Server {
 public:
  struct BatchCallAllocation {
    void* tag;
    grpc_call** call;
    grpc_metadata_array* initial_metadata;
    grpc_call_details* details;
    grpc_completion_queue* cq;
  };
  struct RegisteredCallAllocation {
    void* tag;
    grpc_call** call;
    grpc_metadata_array* initial_metadata;
    gpr_timespec* deadline;
    grpc_byte_buffer** optional_payload;
    grpc_completion_queue* cq;
  };
  void SetBatchMethodAllocator(grpc_completion_queue* cq,
                               std::function<BatchCallAllocation()> allocator);
  void SetRegisteredMethodAllocator(grpc_completion_queue* cq, void* method_tag,
                                    std::function<RegisteredCallAllocation()> allocator);
};
}  // namespace grpc_core

namespace {

using FunctorRun = void (*)(grpc_completion_queue_functor*, int);

// What the process sent as a client: released by every client batch and by a server's start,
// acquired by every new incoming call (an over-approximation within one process: see
// docs/reliability.md).
char wire;
// A server's registered methods: released when registered and started, acquired when gRPC asks
// the method's allocator for a new call (from its own poller threads, which may predate them).
char registration;
// The allocators' uses, acquired when gRPC destroys one (on whichever thread lets go of the server
// last).
char allocators_used;
// Every callback's end, acquired by OnDone and OnCancel. gRPC runs a reactor's OnDone after its
// other reactions have returned, counting them down with atomics; where libgrpc++'s own copy of
// that count takes the last step (a cancellation), TSan cannot see it. Over all calls at once, so
// an OnDone is ordered after every reaction that ended before it, of any call.
char callbacks_ended;

// The head of libgrpc 1.51's grpc_closure: a queue link, then cb(arg).
using ClosureCb = void (*)(void*, absl::Status);
struct ClosureHead {
  void* next;
  ClosureCb cb;
  void* cb_arg;
};

template <typename Fn>
Fn Real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) __builtin_trap();
  return reinterpret_cast<Fn>(f);
}

// The bridge's own bookkeeping must add no edges between the threads it serves: its lock and
// its map are hidden from TSan (they are correct by construction: one mutex around one map).
class Hidden {
 public:
  Hidden() {
    AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~Hidden() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
  }
};

struct Originals {
  tripod::Mutex mu;
  std::unordered_map<grpc_completion_queue_functor*, FunctorRun> run ABSL_GUARDED_BY(mu);
  // Executable segments of the loaded objects.
  std::vector<std::pair<uintptr_t, uintptr_t>> code ABSL_GUARDED_BY(mu);
};

Originals& State() {
  static Originals* state = new Originals;
  return *state;
}

int AddCode(dl_phdr_info* info, size_t, void* out) {
  auto* code = static_cast<std::vector<std::pair<uintptr_t, uintptr_t>>*>(out);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) != 0) {
      code->emplace_back(info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
    }
  }
  return 0;
}

// A callback-API tag is a functor whose first word is a function; the other tags gRPC's C++ API
// passes (CallOpSet and its kin) are polymorphic objects whose first word points at a vtable.
bool IsCode(uintptr_t p, const std::vector<std::pair<uintptr_t, uintptr_t>>& code) {
  for (const auto& [lo, hi] : code) {
    if (p >= lo && p < hi) return true;
  }
  return false;
}

FunctorRun TakeOriginal(grpc_completion_queue_functor* f) {
  Hidden hidden;
  Originals& s = State();
  tripod::MutexLock lock(&s.mu);
  return s.run.at(f);
}

void OpDone(grpc_completion_queue_functor* f, int ok) {
  FunctorRun run = TakeOriginal(f);
  __tsan_acquire(f);
  run(f, ok);  // f may be gone after this
  __tsan_release(&callbacks_ended);
}

void CallArrived(grpc_completion_queue_functor* f, int ok) {
  FunctorRun run = TakeOriginal(f);
  __tsan_acquire(f);
  __tsan_acquire(&wire);
  run(f, ok);
}

// Routes the functor's next run through `through`, which acquires what was released on it.
void Wrap(void* tag, FunctorRun through) {
  if (tag == nullptr) return;
  auto* f = static_cast<grpc_completion_queue_functor*>(tag);
  Hidden hidden;
  Originals& s = State();
  tripod::MutexLock lock(&s.mu);
  const FunctorRun current = f->functor_run;
  if (current == &OpDone || current == &CallArrived) return;  // still wrapped from an earlier batch
  if (s.code.empty()) dl_iterate_phdr(&AddCode, &s.code);
  if (!IsCode(reinterpret_cast<uintptr_t>(current), s.code)) return;  // not a functor
  s.run[f] = current;
  f->functor_run = through;
}

// What a wrapped closure was: its function and argument, restored before it runs.
struct Wrapped {
  ClosureHead* head;
  ClosureCb cb;
  void* arg;
};

void ClosureRan(void* wrapped, absl::Status error) {
  auto* w = static_cast<Wrapped*>(wrapped);
  __tsan_acquire(w->head);
  __tsan_acquire(&callbacks_ended);
  const ClosureCb cb = w->cb;
  void* const arg = w->arg;
  {
    Hidden hidden;  // fields libgrpc reads without TSan; the closure may be scheduled again
    w->head->cb = cb;
    w->head->cb_arg = arg;
  }
  delete w;
  cb(arg, std::move(error));
}

// libgrpc++ hands a reactor's OnDone (and a server reactor's OnCancel) to gRPC's executor threads
// as closures.
void WrapClosure(grpc_closure* closure) {
  auto* head = reinterpret_cast<ClosureHead*>(closure);
  {
    Hidden hidden;
    if (head->cb == &ClosureRan) return;
    auto* w = new Wrapped{head, head->cb, head->cb_arg};
    head->cb = &ClosureRan;
    head->cb_arg = w;
  }
  __tsan_release(head);
}

struct AllocatorUses {
  ~AllocatorUses() { __tsan_acquire(&allocators_used); }
};

// A server's call allocator, which gRPC calls on its poller threads to make a new call's objects.
template <typename Allocation>
std::function<Allocation()> Bridged(std::function<Allocation()> allocator) {
  __tsan_release(&registration);
  return [inner = std::move(allocator), uses = AllocatorUses{}] {
    __tsan_acquire(&registration);
    Allocation a = inner();
    Wrap(a.tag, &CallArrived);
    if (a.tag != nullptr) __tsan_release(a.tag);  // the call's objects, made on the poller
    __tsan_release(&allocators_used);
    return a;
  };
}

}  // namespace

extern "C" {

grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops, size_t nops, void* tag,
                                      void* reserved) {
  static const auto real = Real<decltype(&grpc_call_start_batch)>("grpc_call_start_batch");
  // libgrpc's bool grpc_call_is_client(grpc_call*), exported under its C++ name.
  static const auto is_client = Real<bool (*)(grpc_call*)>("_Z19grpc_call_is_clientP9grpc_call");
  Wrap(tag, &OpDone);
  __tsan_release(tag);
  if (is_client(call)) __tsan_release(&wire);
  return real(call, ops, nops, tag, reserved);
}

void grpc_server_start(grpc_server* server) {
  static const auto real = Real<decltype(&grpc_server_start)>("grpc_server_start");
  __tsan_release(&wire);
  __tsan_release(&registration);
  real(server);
}

}  // extern "C"

namespace grpc_core {

void Executor::Run(grpc_closure* closure, absl::Status error, ExecutorType type,
                   ExecutorJobType job_type) {
  using Fn = void (*)(grpc_closure*, absl::Status, ExecutorType, ExecutorJobType);
  static const auto real = Real<Fn>(
      "_ZN9grpc_core8Executor3RunEP12grpc_closureN4absl7debian36StatusENS_12ExecutorTypeENS_"
      "15ExecutorJobTypeE");
  if (closure != nullptr) WrapClosure(closure);
  real(closure, std::move(error), type, job_type);
}

void Server::SetBatchMethodAllocator(grpc_completion_queue* cq,
                                     std::function<BatchCallAllocation()> allocator) {
  using Fn = void (*)(Server*, grpc_completion_queue*, std::function<BatchCallAllocation()>);
  static const auto real = Real<Fn>(
      "_ZN9grpc_core6Server23SetBatchMethodAllocatorEP21grpc_completion_queueSt8functionIF"
      "NS0_19BatchCallAllocationEvEE");
  real(this, cq, Bridged(std::move(allocator)));
}

void Server::SetRegisteredMethodAllocator(grpc_completion_queue* cq, void* method_tag,
                                          std::function<RegisteredCallAllocation()> allocator) {
  using Fn =
      void (*)(Server*, grpc_completion_queue*, void*, std::function<RegisteredCallAllocation()>);
  static const auto real = Real<Fn>(
      "_ZN9grpc_core6Server28SetRegisteredMethodAllocatorEP21grpc_completion_queuePvSt8fun"
      "ctionIFNS0_24RegisteredCallAllocationEvEE");
  real(this, cq, method_tag, Bridged(std::move(allocator)));
}

}  // namespace grpc_core
