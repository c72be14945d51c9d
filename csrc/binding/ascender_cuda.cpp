// ascender_cuda.cpp -- the ascender ops on CUDA tensors: the launchers of csrc/cuda (float32,
// float64, float16, bfloat16) on the current stream. Built only with ASCENDER_CUDA=1 (setup.py).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../cuda/ascender_cuda.h"
#include "ascender_op.h"
#include "cuda_dtype.h"

namespace asc_binding {
namespace {

// A call whose kernels do not find their shared memory on the device (ascender_cuda_fits) is refused by its
// sizes; the automatic backend choice (ascender_torch.backends) sends such calls to the block-wise path first.
// (A generation step asks about the forward's kernels, though the decode path's need less.)
void check_fits(const AscenderCall& call, bool backward) {
  const asc_params& p = call.p;
  if (ascender_cuda_fits(&p, cuda_dtype(call.q.scalar_type()), backward)) return;
  TORCH_CHECK(false, "ascender: the CUDA kernels of this call (", call.q.scalar_type(), ", d = ", p.d, ", dv = ",
              p.dv, ", dz = ", p.dz, ", da = ", p.da, ", ", p.n_nbr, " neighbour columns", backward ? ", backward" : "",
              ") need more shared memory per block than ", call.q.device(),
              " has; the block-wise backend runs it (ascender_torch.attention_backend(\"blockwise\"))");
}

void forward(const AscenderCall& call, const asc_fwd_args& a) {
  const c10::cuda::CUDAGuard guard(call.q.device());
  check_fits(call, false);
  check_cuda("ascender", ascender_cuda_fwd(&call.p, &a, cuda_dtype(call.q.scalar_type()),
                                           c10::cuda::getCurrentCUDAStream()), "forward");
}

void infer(const AscenderCall& call, const asc_fwd_args& a) {
  const c10::cuda::CUDAGuard guard(call.q.device());
  check_fits(call, false);
  check_cuda("ascender", ascender_cuda_infer(&call.p, &a, cuda_dtype(call.q.scalar_type()),
                                             c10::cuda::getCurrentCUDAStream()), "forward");
}

void backward(const AscenderCall& call, const asc_bwd_args& a) {
  const c10::cuda::CUDAGuard guard(call.q.device());
  check_fits(call, true);
  check_cuda("ascender", ascender_cuda_bwd(&call.p, &a, cuda_dtype(call.q.scalar_type()),
                                           c10::cuda::getCurrentCUDAStream()), "backward");
}

constexpr AscenderBackend kCuda{c10::DeviceType::CUDA, /*half_types=*/true, forward, infer, backward};

// The kernels' scratch from torch's caching allocator, stream-ordered on the launch's stream: its blocks stay
// cached across calls, where the CUDA default pool (cudaMallocAsync) gives them back to the driver at every
// synchronization and maps them afresh in the next call. The Magnitude launchers take the same pair.
cudaError_t torch_scratch(void** p, size_t bytes, cudaStream_t stream) {
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  try {
    *p = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
  } catch (const c10::OutOfMemoryError&) {
    return cudaErrorMemoryAllocation;
  }
  return cudaSuccess;
}

cudaError_t torch_scratch_free(void* p, cudaStream_t) {
  if (p) c10::cuda::CUDACachingAllocator::raw_delete(p);
  return cudaSuccess;
}

const bool kScratchSet = (ascender_cuda_set_scratch(torch_scratch, torch_scratch_free), true);

}  // namespace

bool cuda_call_fits(int device, const char* dtype, bool paper, int64_t k_neighbors, int64_t d, int64_t dv, int64_t dz,
                    int64_t da, bool backward) {
  const std::string name(dtype);
  const at::ScalarType t = name == "float32"   ? at::kFloat
                           : name == "float64" ? at::kDouble
                           : name == "float16" ? at::kHalf
                           : name == "bfloat16" ? at::kBFloat16
                                                : at::kInt;
  TORCH_CHECK(t != at::kInt, "ascender: cuda_fits: dtype must be float32, float64, float16 or bfloat16, got ", name);
  asc_params p{};
  p.variant = paper ? ASC_VARIANT_PAPER : ASC_VARIANT_SEED;
  p.k_neighbors = k_neighbors;
  p.d = d;
  p.dv = dv;
  p.dz = dz;
  p.da = da;
  p.n_nbr = paper ? k_neighbors : 0;  // at most k columns (fewer below k + 1 tokens): the larger layout
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  return ascender_cuda_fits(&p, cuda_dtype(t), backward) != 0;
}

}  // namespace asc_binding

TORCH_LIBRARY_IMPL(ascender, CUDA, m) { asc_binding::register_ascender_ops<asc_binding::kCuda>(m); }
