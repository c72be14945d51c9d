// cuda_dtype.h -- what the CUDA backends of the ops share: the launchers' dtype code and their
// error check (built only with ASCENDER_CUDA=1).
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include "../cuda/ascender_cuda.h"

namespace asc_binding {

inline int cuda_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ASC_CUDA_F32;
    case at::kDouble: return ASC_CUDA_F64;
    case at::kHalf: return ASC_CUDA_F16;
    default: return ASC_CUDA_BF16;  // the checks admit nothing else
  }
}

inline void check_cuda(const char* who, int rc, const char* what) {
  TORCH_CHECK(rc == 0, who, ": the CUDA ", what, " failed: ", cudaGetErrorString(static_cast<cudaError_t>(rc)),
              " (error ", rc, ")");
}

}  // namespace asc_binding
