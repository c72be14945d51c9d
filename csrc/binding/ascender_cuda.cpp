// ascender_cuda.cpp -- the ascender ops on CUDA tensors: the launchers of csrc/cuda (float32,
// float64, float16, bfloat16) on the current stream. Built only with ASCENDER_CUDA=1 (setup.py).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../cuda/ascender_cuda.h"
#include "ascender_op.h"
#include "cuda_dtype.h"

namespace asc_binding {
namespace {

void forward(const AscenderCall& call, const asc_fwd_args& a) {
  const c10::cuda::CUDAGuard guard(call.q.device());
  check_cuda("ascender", ascender_cuda_fwd(&call.p, &a, cuda_dtype(call.q.scalar_type()),
                                           c10::cuda::getCurrentCUDAStream()), "forward");
}

void infer(const AscenderCall& call, const asc_fwd_args& a) {
  const c10::cuda::CUDAGuard guard(call.q.device());
  check_cuda("ascender", ascender_cuda_infer(&call.p, &a, cuda_dtype(call.q.scalar_type()),
                                             c10::cuda::getCurrentCUDAStream()), "forward");
}

void backward(const AscenderCall& call, const asc_bwd_args& a) {
  const c10::cuda::CUDAGuard guard(call.q.device());
  check_cuda("ascender", ascender_cuda_bwd(&call.p, &a, cuda_dtype(call.q.scalar_type()),
                                           c10::cuda::getCurrentCUDAStream()), "backward");
}

constexpr AscenderBackend kCuda{c10::DeviceType::CUDA, /*half_types=*/true, forward, infer, backward};

}  // namespace
}  // namespace asc_binding

TORCH_LIBRARY_IMPL(ascender, CUDA, m) { asc_binding::register_ascender_ops<asc_binding::kCuda>(m); }
