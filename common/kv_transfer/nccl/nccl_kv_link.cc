// The NCCL KvLink; see nccl_kv_link.h. Every wait polls (the communicator is non-blocking) so that
// a peer that died or never posts its half ends in an error and ncclCommAbort, never a hang.
#include "common/kv_transfer/nccl_kv_link.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/util/mutex.h"

namespace tripod {
namespace {

absl::Status NcclError(const char* what, ncclResult_t r) {
  return absl::UnavailableError(absl::StrCat("NCCL link: ", what, ": ", ncclGetErrorString(r)));
}

// Waits until the communicator's pending call is through: OK, its error, or the deadline.
absl::Status AwaitComm(ncclComm_t comm, absl::Time deadline, const char* what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclError(what, r);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(what, state);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("NCCL link: ", what, ": the other end did not take part in time"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

class NcclKvLink final : public KvLink {
 public:
  NcclKvLink(ncclComm_t comm, int rank, cudaStream_t stream)
      : comm_(comm), peer_(1 - rank), stream_(stream) {}
  ~NcclKvLink() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);  // null: aborted when it broke
    cudaStreamDestroy(stream_);
  }
  const char* kind() const override { return "nccl"; }

  absl::Status Send(const uint8_t* device, size_t bytes, absl::Duration timeout) override {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    return Done(ncclSend(device, bytes, ncclUint8, peer_, comm_, stream_), timeout, "send");
  }
  absl::Status Recv(uint8_t* device, size_t bytes, absl::Duration timeout) override {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    return Done(ncclRecv(device, bytes, ncclUint8, peer_, comm_, stream_), timeout, "receive");
  }

 private:
  // The call was issued: wait for it to be enqueued, then for the stream, within the deadline.
  absl::Status Done(ncclResult_t issued, absl::Duration timeout, const char* what) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::Status st = issued == ncclSuccess || issued == ncclInProgress
                          ? AwaitComm(comm_, deadline, what)
                          : NcclError(what, issued);
    while (st.ok()) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) {
        st = absl::UnavailableError(
            absl::StrCat("NCCL link: ", what, ": CUDA: ", cudaGetErrorString(q)));
        break;
      }
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        st = NcclError(what, state);
        break;
      }
      if (absl::Now() >= deadline) {
        st = absl::DeadlineExceededError(absl::StrCat(
            "NCCL link: ", what, " of a payload not done in ", absl::FormatDuration(timeout)));
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    broken_ = st;
    ncclCommAbort(comm_);  // unblocks the stream; the communicator is gone
    comm_ = nullptr;
    return st;
  }

  Mutex mu_;
  ncclComm_t comm_;
  const int peer_;
  cudaStream_t stream_;
  absl::Status broken_;
};

}  // namespace

bool NcclLinksBuilt() { return true; }

absl::StatusOr<std::string> NewNcclLinkId() {
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return NcclError("unique id", r);
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<KvLink>> OpenNcclLink(const std::string& id_bytes, int rank,
                                                     absl::Duration timeout) {
  ncclUniqueId id;
  if (id_bytes.size() != sizeof(id.internal) || (rank != 0 && rank != 1)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL link: a unique id of ", id_bytes.size(),
                                                   " bytes (", sizeof(id.internal),
                                                   " expected) or rank ", rank, " of 2"));
  }
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));
  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("NCCL link: no stream: ", cudaGetErrorString(e)));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
  absl::Status st = r == ncclSuccess || r == ncclInProgress
                        ? AwaitComm(comm, absl::Now() + timeout, "set-up")
                        : NcclError("set-up", r);
  if (!st.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return st;
  }
  return std::unique_ptr<KvLink>(std::make_unique<NcclKvLink>(comm, rank, stream));
}

}  // namespace tripod
