// magnitude_cuda.cpp -- the Magnitude Attention ops on CUDA tensors: the launchers of
// csrc/cuda/magnitude.cu (float32, float64, float16, bfloat16) on the current stream. Built only
// with ASCENDER_CUDA=1 (setup.py).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../cuda/ascender_cuda.h"
#include "cuda_dtype.h"
#include "magnitude_op.h"

namespace asc_binding {
namespace {

void forward(const MagnitudeCall& call, const mag_fwd_args& a) {
  const c10::cuda::CUDAGuard guard(call.q.device());
  check_cuda("magnitude", magnitude_cuda_fwd(&call.p, &a, cuda_dtype(call.q.scalar_type()),
                                             c10::cuda::getCurrentCUDAStream()), "forward");
}

void backward(const MagnitudeCall& call, const mag_bwd_args& a) {
  const c10::cuda::CUDAGuard guard(call.q.device());
  check_cuda("magnitude", magnitude_cuda_bwd(&call.p, &a, cuda_dtype(call.q.scalar_type()),
                                             c10::cuda::getCurrentCUDAStream()), "backward");
}

constexpr MagnitudeBackend kCuda{c10::DeviceType::CUDA, /*half_types=*/true, forward, backward};

}  // namespace
}  // namespace asc_binding

TORCH_LIBRARY_IMPL(ascender, CUDA, m) { asc_binding::register_magnitude_ops<asc_binding::kCuda>(m); }
