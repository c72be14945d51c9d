/*
 * tiled.h -- the entry points of the tiled tensor-core forward (ascender_fwd_tiled.cu, docs/cuda.md "The
 * tensor-core kernels") for the dispatch of ascender_cuda_fwd (ascender_fwd.cu), which keeps the
 * row-per-warp kernels for the calls the tiled forward does not take. Plain C, no torch.
 */
#ifndef ASCENDER_CUDA_TILED_H
#define ASCENDER_CUDA_TILED_H

#include "ascender_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the tiled kernels (forward and decode) implement every option of the call: the one place that
 * names an option of the op they do not take yet (dropout_p, softcap_bias="outside"), so that the call
 * keeps the row-per-warp forward; false for every call while ASCENDER_CUDA_TILED=0 is set. */
int asc_tiled_options(const asc_params *p, const asc_fwd_args *a);

/* Whether the tiled forward takes this call: its options, and float32, float16, bfloat16 (float64 keeps
 * the row-per-warp forward; docs/cuda.md "Which kernels a call gets"). */
int asc_tiled_fwd_takes(const asc_params *p, const asc_fwd_args *a, int dtype);

/* The tiled forward: the outputs of ascender_cuda_fwd (out, stats, u, c, nbr, aux, the maps). */
int asc_tiled_fwd(const asc_params *p, const asc_fwd_args *a, int dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* ASCENDER_CUDA_TILED_H */
