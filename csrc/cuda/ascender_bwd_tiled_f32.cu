/* ascender_bwd_tiled_f32.cu -- the tiled backward (bwd_tiled.cuh) for float32: one dtype per translation unit. */
#include "bwd_tiled.cuh"

template cudaError_t asc::tiled::backward<float>(const asc_params &, const asc_bwd_args &, int, cudaStream_t);
template bool asc::tiled::bwd_smem_fits<float>(const asc_params &);
template bool asc::tiled::b1_wide<float>(const asc_params &);
template bool asc::tiled::b2r_wide<float>(const asc_params &);
template bool asc::tiled::b2c_wide<float>(const asc_params &);
