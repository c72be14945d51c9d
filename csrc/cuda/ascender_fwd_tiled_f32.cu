/* ascender_fwd_tiled_f32.cu -- the tiled forward (fwd_tiled.cuh) for float32: one dtype per translation unit. */
#include "fwd_tiled.cuh"

template cudaError_t asc::tiled::forward<float>(const asc_params &, const asc_fwd_args &, cudaStream_t);
template bool asc::tiled::fwd_smem_fits<float>(const asc_params &);
template bool asc::tiled::fwd_wide<float>(const asc_params &);
