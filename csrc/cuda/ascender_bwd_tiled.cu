/*
 * ascender_bwd_tiled.cu -- the entry points of the tiled tensor-core backward (tiled.h): which calls it takes,
 * and the dispatch by dtype to its instantiations (bwd_tiled.cuh; ascender_bwd_tiled_f32.cu, _f16.cu,
 * _bf16.cu), which this file does not include: it instantiates nothing. ascender_cuda_bwd (ascender_bwd.cu)
 * sends it the calls asc_tiled_bwd_takes accepts. Plain CUDA C++, no torch.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tiled.h"

extern "C" int asc_tiled_bwd_takes(const asc_params *p, const asc_bwd_args *a, int dtype) {
    /* what the tiled forward takes, less a call whose tiles do not fit the device's shared memory */
    if (!asc_tiled_fwd_takes(p, &a->in, dtype)) return 0;
    switch (dtype) {
        case ASC_CUDA_F32: return asc::tiled::bwd_smem_fits<float>(*p);
        case ASC_CUDA_F16: return asc::tiled::bwd_smem_fits<__half>(*p);
        default: return asc::tiled::bwd_smem_fits<__nv_bfloat16>(*p);
    }
}

extern "C" int asc_tiled_bwd(const asc_params *p, const asc_bwd_args *a, int dtype, cudaStream_t stream) {
    switch (dtype) {
        case ASC_CUDA_F32: return (int)asc::tiled::backward<float>(*p, *a, dtype, stream);
        case ASC_CUDA_F16: return (int)asc::tiled::backward<__half>(*p, *a, dtype, stream);
        case ASC_CUDA_BF16: return (int)asc::tiled::backward<__nv_bfloat16>(*p, *a, dtype, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
