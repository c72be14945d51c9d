/* ascender_fwd_tiled_bf16.cu -- the tiled forward (fwd_tiled.cuh) for bfloat16: one dtype per translation unit. */
#include "fwd_tiled.cuh"

template cudaError_t asc::tiled::forward<__nv_bfloat16>(const asc_params &, const asc_fwd_args &, cudaStream_t);
template bool asc::tiled::fwd_smem_fits<__nv_bfloat16>(const asc_params &);
template bool asc::tiled::fwd_wide<__nv_bfloat16>(const asc_params &);
