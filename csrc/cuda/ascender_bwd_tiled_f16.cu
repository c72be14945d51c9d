/* ascender_bwd_tiled_f16.cu -- the tiled backward (bwd_tiled.cuh) for float16: one dtype per translation unit. */
#include "bwd_tiled.cuh"

template cudaError_t asc::tiled::backward<__half>(const asc_params &, const asc_bwd_args &, int, cudaStream_t);
template bool asc::tiled::bwd_smem_fits<__half>(const asc_params &);
template bool asc::tiled::b1_wide<__half>(const asc_params &);
template bool asc::tiled::b2r_wide<__half>(const asc_params &);
template bool asc::tiled::b2c_wide<__half>(const asc_params &);
