// The CUDA backend's check of a runtime or cuBLAS call that cannot fail short of a broken device
// or a bug: the process stops with the call and the driver's message.
#pragma once

#include <cstdlib>

#include "common/util/log.h"

#define TRIPOD_CUDA_CHECK(expr)                                               \
  do {                                                                        \
    const cudaError_t err_ = (expr);                                          \
    if (err_ != cudaSuccess) {                                                \
      tripod::Logger("compute.cuda")                                          \
          .critical("CUDA error at {}:{}: {}: {}", __FILE__, __LINE__, #expr, \
                    cudaGetErrorString(err_));                                \
      std::abort();                                                           \
    }                                                                         \
  } while (0)
#define TRIPOD_CUBLAS_CHECK(expr)                                               \
  do {                                                                          \
    const cublasStatus_t st_ = (expr);                                          \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                         \
      tripod::Logger("compute.cuda")                                            \
          .critical("cuBLAS error at {}:{}: {}: {}", __FILE__, __LINE__, #expr, \
                    cublasGetStatusString(st_));                                \
      std::abort();                                                             \
    }                                                                           \
  } while (0)
