/*
 * ascender_fwd_tiled.cu -- the entry points of the tiled tensor-core forward (tiled.h): the options it takes,
 * and the dispatch by dtype to its instantiations (fwd_tiled.cuh; ascender_fwd_tiled_f32.cu, _f16.cu,
 * _bf16.cu). ascender_cuda_fwd (ascender_fwd.cu) sends it the calls asc_tiled_fwd_takes accepts. Plain CUDA
 * C++, no torch.
 */
#include <cstdlib>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tiled.h"

/* ASCENDER_CUDA_TILED=0 in the environment keeps every call on the row-per-warp kernels: the benchmark's
 * same-run comparison, and a way around the tiled kernels should one misbehave on a user's GPU. Read per
 * call (a getenv beside a kernel launch), so a process can switch. */
static int tiled_disabled(void) {
    const char *v = getenv("ASCENDER_CUDA_TILED");
    return v != nullptr && v[0] == '0' && v[1] == '\0';
}

extern "C" int asc_tiled_options(const asc_params *, const asc_fwd_args *) {
    return !tiled_disabled(); /* every option of the op, dropout and softcap_bias="outside" included */
}

extern "C" int asc_tiled_fwd_takes(const asc_params *p, const asc_fwd_args *a, int dtype) {
    if (!asc_tiled_options(p, a)) return 0;
    switch (dtype) {
        case ASC_CUDA_F32: return asc::tiled::fwd_smem_fits<float>(*p);
        case ASC_CUDA_F16: return asc::tiled::fwd_smem_fits<__half>(*p);
        case ASC_CUDA_BF16: return asc::tiled::fwd_smem_fits<__nv_bfloat16>(*p);
        default: return 0;
    }
}

extern "C" int asc_tiled_wide_rows(const asc_params *p, int dtype) {
    switch (dtype) {
        case ASC_CUDA_F16:
            return asc::tiled::fwd_wide<__half>(*p) | asc::tiled::b1_wide<__half>(*p) << 1 |
                   asc::tiled::b2r_wide<__half>(*p) << 2 | asc::tiled::b2c_wide<__half>(*p) << 3;
        case ASC_CUDA_BF16:
            return asc::tiled::fwd_wide<__nv_bfloat16>(*p) | asc::tiled::b1_wide<__nv_bfloat16>(*p) << 1 |
                   asc::tiled::b2r_wide<__nv_bfloat16>(*p) << 2 | asc::tiled::b2c_wide<__nv_bfloat16>(*p) << 3;
        default: return 0;
    }
}

extern "C" int asc_tiled_fwd(const asc_params *p, const asc_fwd_args *a, int dtype, cudaStream_t stream) {
    switch (dtype) {
        case ASC_CUDA_F32: return (int)asc::tiled::forward<float>(*p, *a, stream);
        case ASC_CUDA_F16: return (int)asc::tiled::forward<__half>(*p, *a, stream);
        case ASC_CUDA_BF16: return (int)asc::tiled::forward<__nv_bfloat16>(*p, *a, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
