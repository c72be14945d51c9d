/* ascender_bwd_tiled_bf16.cu -- the tiled backward (bwd_tiled.cuh) for bfloat16: one dtype per translation unit. */
#include "bwd_tiled.cuh"

template cudaError_t asc::tiled::backward<__nv_bfloat16>(const asc_params &, const asc_bwd_args &, int, cudaStream_t);
template bool asc::tiled::bwd_smem_fits<__nv_bfloat16>(const asc_params &);
template bool asc::tiled::b1_wide<__nv_bfloat16>(const asc_params &);
template bool asc::tiled::b2r_wide<__nv_bfloat16>(const asc_params &);
template bool asc::tiled::b2c_wide<__nv_bfloat16>(const asc_params &);
