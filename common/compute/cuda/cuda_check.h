// The CUDA backend's check of a runtime or cuBLAS call that cannot fail short of a broken device
// or a bug: the process stops with the call and the driver's message.
#pragma once

#include <cstdlib>

#include "common/util/log.h"

namespace tripod {

[[noreturn]] inline void CudaCallFailed(const char* api, const char* file, int line,
                                        const char* call, const char* message) {
  Logger("compute.cuda").critical("{} error at {}:{}: {}: {}", api, file, line, call, message);
  std::abort();
}

}  // namespace tripod

#define TRIPOD_CUDA_CHECK(expr)                                                            \
  do {                                                                                     \
    const cudaError_t err_ = (expr);                                                       \
    if (err_ != cudaSuccess) {                                                             \
      tripod::CudaCallFailed("CUDA", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
    }                                                                                      \
  } while (0)
#define TRIPOD_CUBLAS_CHECK(expr)                                                              \
  do {                                                                                         \
    const cublasStatus_t st_ = (expr);                                                         \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
      tripod::CudaCallFailed("cuBLAS", __FILE__, __LINE__, #expr, cublasGetStatusString(st_)); \
    }                                                                                          \
  } while (0)
