/* ascender_fwd_tiled_f16.cu -- the tiled forward (fwd_tiled.cuh) for float16: one dtype per translation unit. */
#include "fwd_tiled.cuh"

template cudaError_t asc::tiled::forward<__half>(const asc_params &, const asc_fwd_args &, cudaStream_t);
template bool asc::tiled::fwd_smem_fits<__half>(const asc_params &);
template bool asc::tiled::fwd_wide<__half>(const asc_params &);
