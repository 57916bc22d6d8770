// StepGraphs: a decode step run as a CUDA graph. The backend records the step's ops on a
// StepTape (common/compute/step_tape.h) instead of launching them; at the step's end (the logits
// going to the host) the staged bytes go to the device in one copy, and the step runs: replayed
// from its graph when one was captured for the same ops, captured now when this is its second
// time, else launched op by op. Per step that is one copy and one graph launch in place of a few
// hundred kernel launches (about a dozen per layer), which is what a small model's decode step
// at low batch is bound by.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <mutex>

#include "common/compute/step_tape.h"
#include "common/util/mutex.h"

namespace tripod {

class StepGraphs {
 public:
  struct Counts {
    int64_t replays = 0, captures = 0, runs = 0;  // steps by how they ran
  };
  // Launches one recorded op on the stream; `arena`: the device address of the staged bytes.
  using LaunchFn = std::function<void(const StepOp& op, uint8_t* arena)>;

  StepGraphs(cudaStream_t stream, size_t max_graphs);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Starts recording a step (ops go to tape() until Flush), unless graphs failed before.
  void Begin();
  bool recording() const { return tape_.recording(); }
  StepTape& tape() { return tape_; }
  // Ends the step and runs it on the stream. `extra_base`: an address the ops use that is not in
  // them (the GEMM input scratch), which a replayed graph must find unchanged.
  void Flush(const LaunchFn& launch, uint64_t extra_base);

  const Counts& counts() const { return counts_; }
  // Held while a step is captured: another thread that must wait for the stream takes it.
  Mutex& capture_mutex() { return capture_mu_; }
  size_t graphs() const { return cache_.graphs(); }

 private:
  // Captures the ops into a graph and instantiates it; null (the error cleared, logged once) when
  // the runtime refuses, and graphs are then off for this backend.
  cudaGraphExec_t Capture(const LaunchFn& launch, uint8_t* arena);

  cudaStream_t stream_;
  StepTape tape_;
  StepGraphCache cache_;
  uint8_t* arena_ = nullptr;  // device
  size_t arena_bytes_ = 0;
  uint8_t* host_ = nullptr;  // pinned upload image
  size_t host_bytes_ = 0;
  cudaEvent_t uploaded_ = nullptr;  // the last upload out of host_
  bool failed_ = false;
  Mutex capture_mu_;
  Counts counts_;
};

}  // namespace tripod
