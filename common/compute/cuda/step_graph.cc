// StepGraphs; see step_graph.h.
#include "common/compute/cuda/step_graph.h"

#include <algorithm>
#include <cstdio>

#include "common/compute/cuda/cuda_check.h"
#include "common/util/log.h"

namespace tripod {

StepGraphs::StepGraphs(cudaStream_t stream, size_t max_graphs)
    : stream_(stream), cache_(max_graphs, [](StepGraphCache::Exec e) {
        cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e));
      }) {
  TRIPOD_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
}

StepGraphs::~StepGraphs() {
  cudaStreamSynchronize(stream_);
  cache_.Clear();
  if (arena_ != nullptr) cudaFree(arena_);
  if (host_ != nullptr) cudaFreeHost(host_);
  cudaEventDestroy(uploaded_);
}

void StepGraphs::Begin() {
  if (!failed_) tape_.Begin();
}

void StepGraphs::Flush(const LaunchFn& launch, uint64_t extra_base) {
  if (!tape_.recording()) return;
  const StepTape::Layout layout = tape_.End();
  if (tape_.ops().empty()) return;

  if (arena_bytes_ < layout.total_bytes) {
    // A new arena: graphs that hold the old one's addresses can never run again.
    cache_.Clear();
    if (arena_ != nullptr) TRIPOD_CUDA_CHECK(cudaFree(arena_));  // waits for the device
    arena_bytes_ = std::max(layout.total_bytes, 2 * arena_bytes_);
    TRIPOD_CUDA_CHECK(cudaMalloc(&arena_, arena_bytes_));
  }
  // The image is written on the host while the last upload out of it may still be in flight.
  TRIPOD_CUDA_CHECK(cudaEventSynchronize(uploaded_));
  if (host_bytes_ < layout.upload_bytes) {
    if (host_ != nullptr) TRIPOD_CUDA_CHECK(cudaFreeHost(host_));
    host_bytes_ = std::max(layout.upload_bytes, 2 * host_bytes_);
    TRIPOD_CUDA_CHECK(cudaMallocHost(&host_, host_bytes_));
  }
  tape_.WriteImage(reinterpret_cast<uint64_t>(arena_), host_);
  // Before the graph on the stream, and outside it: every replay takes this step's bytes.
  TRIPOD_CUDA_CHECK(
      cudaMemcpyAsync(arena_, host_, layout.upload_bytes, cudaMemcpyHostToDevice, stream_));
  TRIPOD_CUDA_CHECK(cudaEventRecord(uploaded_, stream_));

  const uint64_t bases[] = {reinterpret_cast<uint64_t>(arena_), extra_base};
  StepGraphCache::Hit hit = cache_.Lookup(tape_.ops(), tape_.Hash(), bases);
  if (hit.action == StepGraphCache::Action::kCapture) {
    cudaGraphExec_t exec = Capture(launch, arena_);
    cache_.Store(exec);
    if (exec != nullptr) {
      ++counts_.captures;
      TRIPOD_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
      return;
    }
  } else if (hit.action == StepGraphCache::Action::kReplay) {
    ++counts_.replays;
    TRIPOD_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(hit.exec), stream_));
    return;
  }
  ++counts_.runs;
  for (const StepOp& op : tape_.ops()) launch(op, arena_);
}

cudaGraphExec_t StepGraphs::Capture(const LaunchFn& launch, uint8_t* arena) {
  // Thread-local: other threads' calls (KV transfers on their own streams) go on meanwhile.
  MutexLock capturing(&capture_mu_);
  cudaError_t err = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (err == cudaSuccess) {
    for (const StepOp& op : tape_.ops()) launch(op, arena);
    err = cudaStreamEndCapture(stream_, &graph);
  }
  if (err == cudaSuccess && graph != nullptr) {
    err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
  }
  if (err != cudaSuccess || exec == nullptr) {
    cudaGetLastError();  // clear it: the step runs op by op instead
    Logger("compute.cuda")
        .warn(
            "CUDA backend: capturing a decode step as a graph failed ({}); decode steps run op by "
            "op from now on",
            cudaGetErrorString(err));
    failed_ = true;
    return nullptr;
  }
  return exec;
}

}  // namespace tripod
