/*
 * tiled.h -- the entry points of the tiled tensor-core forward and backward (ascender_fwd_tiled.cu,
 * ascender_bwd_tiled.cu; docs/cuda.md "The tensor-core kernels") for the dispatch of ascender_cuda_fwd
 * (ascender_fwd.cu) and ascender_cuda_bwd (ascender_bwd.cu), which keep the row-per-warp kernels for the
 * calls the tiled ones do not take; and, for C++, the per-dtype launchers those entry points dispatch to
 * (defined in fwd_tiled.cuh and bwd_tiled.cuh, instantiated one dtype per translation unit). No torch.
 */
#ifndef ASCENDER_CUDA_TILED_H
#define ASCENDER_CUDA_TILED_H

#include "ascender_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the tiled kernels (forward, decode, backward) implement every option of the call: the one place
 * that would name an option of the op they do not take (none at present: dropout, softcap_bias="outside" and
 * query_offset are in), so that the call keeps the row-per-warp kernels; false for every call while
 * ASCENDER_CUDA_TILED=0 is set. */
int asc_tiled_options(const asc_params *p, const asc_fwd_args *a);

/* Whether the tiled forward takes this call: its options, float32, float16, bfloat16 (float64 keeps the
 * row-per-warp forward; docs/cuda.md "Which kernels a call gets"), and its kernel's shared memory fits the
 * device (wide rows do not: they keep the row-per-warp forward). */
int asc_tiled_fwd_takes(const asc_params *p, const asc_fwd_args *a, int dtype);

/* The tiled forward: the outputs of ascender_cuda_fwd (out, stats, u, c, nbr, aux, the maps). */
int asc_tiled_fwd(const asc_params *p, const asc_fwd_args *a, int dtype, cudaStream_t stream);

/* Whether the tiled backward takes this call: what the tiled forward takes, less the calls whose tiles do not
 * fit the device's shared memory; the others keep the row-per-warp backward. */
int asc_tiled_bwd_takes(const asc_params *p, const asc_bwd_args *a, int dtype);

/* The tiled backward: the gradients of ascender_cuda_bwd from the forward's saved outputs in a->in (out,
 * stats, u, c, nbr, aux; when one is missing it runs the tiled forward into scratch first). */
int asc_tiled_bwd(const asc_params *p, const asc_bwd_args *a, int dtype, cudaStream_t stream);

/* Which pair kernels of this call run their shapes for wide heads on the current device (docs/cuda.md "Wide rows: the
 * forward and B1 at three warps", "B2r at two warps for wide heads", "B2c in narrow key blocks"): bit 0 the forward's
 * row tiles, bit 1 B1's, bit 2 B2r's, bit 3 B2c's key blocks (0 for the FFMA types, whose shapes are one). */
int asc_tiled_wide_rows(const asc_params *p, int dtype);

#ifdef __cplusplus
}

namespace asc {
namespace tiled {
/* The tiled forward of one call for element type T (float, __half, __nv_bfloat16): fwd_tiled.cuh. */
template <typename T> cudaError_t forward(const asc_params &p, const asc_fwd_args &a, cudaStream_t stream);
/* Whether its kernel's shared memory fits the current device: fwd_tiled.cuh. */
template <typename T> bool fwd_smem_fits(const asc_params &p);
/* Whether its row tiles take the wide shape (fwd_tiled.cuh), and B1's, B2r's and B2c's (bwd_tiled.cuh): wide_rows. */
template <typename T> bool fwd_wide(const asc_params &p);
template <typename T> bool b1_wide(const asc_params &p);
template <typename T> bool b2r_wide(const asc_params &p);
template <typename T> bool b2c_wide(const asc_params &p);
/* The tiled backward of one call, and whether its kernels' shared memory fits the current device:
 * bwd_tiled.cuh. */
template <typename T>
cudaError_t backward(const asc_params &p, const asc_bwd_args &ba, int dtype, cudaStream_t stream);
template <typename T> bool bwd_smem_fits(const asc_params &p);
}  // namespace tiled
}  // namespace asc
#endif

#endif /* ASCENDER_CUDA_TILED_H */
