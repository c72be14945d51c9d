/*
 * ascender_fwd.cu -- the CUDA forward: the dispatch between the tiled tensor-core forward
 * (ascender_fwd_tiled.cu) and the row-per-warp kernel (ascender_fwd.cuh) that takes the other
 * calls, and the row-per-warp launcher (design: docs/cuda.md). Plain CUDA C++, no torch.
 */
#include "ascender_fwd.cuh"
#include "tiled.h"

namespace asc {

template <typename T, typename C>
static cudaError_t forward(const asc_params &p, const asc_fwd_args &a, cudaStream_t stream) {
    if (p.N == 0 || p.Nq == 0 || p.B * p.H == 0) return cudaSuccess;
    dim3 grid;
    if (!row_grid(p, &grid)) return cudaErrorInvalidConfiguration;
    const Layout L = make_layout(p, sizeof(C), false);
    cudaError_t e = prepare_smem(fwd_kernel<T, C, T>, L.bytes);
    if (e != cudaSuccess) return e;
    int32_t *gtile = nullptr; /* with a global_mask, stream-ordered scratch */
    const size_t gbytes = global_tiles_bytes(p, a);
    if (gbytes && (e = scratch_alloc(&gtile, gbytes, stream)) != cudaSuccess) return e;
    e = global_tiles(p, a, gtile, stream);
    if (e == cudaSuccess) e = launch(fwd_kernel<T, C, T>, grid, NW * 32, (size_t)L.bytes, stream, p, a, nullptr, gtile, L);
    const cudaError_t f = gtile ? scratch_free(gtile, stream) : cudaSuccess;
    return e != cudaSuccess ? e : f;
}

}  // namespace asc

extern "C" {
asc_cuda_alloc_fn asc_cuda_scratch_alloc = nullptr;
asc_cuda_free_fn asc_cuda_scratch_free = nullptr;

void ascender_cuda_set_scratch(asc_cuda_alloc_fn alloc, asc_cuda_free_fn release) {
    const bool both = alloc && release; /* one without the other would free memory the other pool took */
    asc_cuda_scratch_alloc = both ? alloc : nullptr;
    asc_cuda_scratch_free = both ? release : nullptr;
}
}

extern "C" int ascender_cuda_fwd(const asc_params *p, const asc_fwd_args *a, int dtype, cudaStream_t stream) {
    if (asc_tiled_fwd_takes(p, a, dtype)) return asc_tiled_fwd(p, a, dtype, stream);
    switch (dtype) {
        case ASC_CUDA_F32: return (int)asc::forward<float, float>(*p, *a, stream);
        case ASC_CUDA_F64: return (int)asc::forward<double, double>(*p, *a, stream);
        case ASC_CUDA_F16: return (int)asc::forward<__half, float>(*p, *a, stream);
        case ASC_CUDA_BF16: return (int)asc::forward<__nv_bfloat16, float>(*p, *a, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
