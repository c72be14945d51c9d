/*
 * ascender_cuda.h -- launchers of the CUDA kernels (docs/cuda.md). Plain C, no torch.
 *
 * Same contract as the CPU kernels (ascender.h): contiguous row-major tensors, every
 * pointer in the args structs is a device pointer (key_padding_mask and attn_mask are
 * bytes), the [H] scalars and alibi_slopes have the element type of q. The work is queued
 * on `stream`; scratch memory is taken stream-ordered (cudaMallocAsync, or the pair a caller set with
 * ascender_cuda_set_scratch) and given back before the launcher returns. Return value: 0 (cudaSuccess) or a
 * cudaError_t code.
 */
#ifndef ASCENDER_CUDA_H
#define ASCENDER_CUDA_H

#include <cuda_runtime_api.h>

#include "../ascender.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element type of q, k, v, z, h, the scalars and every output. float16 and bfloat16 are
 * computed in float32, float32 in float32, float64 in float64. */
enum asc_cuda_dtype {
    ASC_CUDA_F32 = 0,
    ASC_CUDA_F64 = 1,
    ASC_CUDA_F16 = 2,
    ASC_CUDA_BF16 = 3
};

/* Forward: out, stats, u, c, nbr, aux (when not NULL) and, when a->map_attn is not NULL, the five maps. */
int ascender_cuda_fwd(const asc_params *p, const asc_fwd_args *a, int dtype, cudaStream_t stream);

/* The forward of a call whose result is not differentiated (inference, generation): up to 8 query rows
 * without maps take the decode kernels (ascender_decode.cu: split over key chunks, docs/decode.md), whose
 * values agree with ascender_cuda_fwd's to rounding but not bit for bit; otherwise ascender_cuda_fwd. */
int ascender_cuda_infer(const asc_params *p, const asc_fwd_args *a, int dtype, cudaStream_t stream);

/* Backward: dq, dk, dv, dz, dh, dscalars [9][H], optional dattn_bias; reads the optional
 * grad_aux and grad_u. */
int ascender_cuda_bwd(const asc_params *p, const asc_bwd_args *a, int dtype, cudaStream_t stream);

/* Whether the kernels this call would get find their shared memory on the current device: its forward's
 * (tiled, else row-per-warp) and, with `backward`, its backward's. Reads the sizes of p, its variant and n_nbr.
 * Wide rows (d, dv, dz, da) or a large k_neighbors need more than a block has (the float64 backward from
 * d = dv = 128, the bfloat16 forward from d = dv = 256 on an H100 or H200: docs/cuda.md "Which kernels a call
 * gets"); such a call fails with cudaErrorInvalidValue, so ascender_torch sends it to the block-wise backend. */
int ascender_cuda_fits(const asc_params *p, int dtype, int backward);

/* Where the launchers take their scratch memory: by default cudaMallocAsync / cudaFreeAsync on the launch's
 * stream. The CUDA default pool gives its memory back to the driver at every synchronization (release threshold
 * 0), so a caller that synchronizes between calls pays for mapping the scratch afresh each time; a caller with
 * its own stream-ordered pool (the torch binding: the caching allocator) sets both functions, or NULL for both
 * to go back to the default. alloc returns cudaSuccess with *p set (NULL for 0 bytes) or an error code. */
typedef cudaError_t (*asc_cuda_alloc_fn)(void **p, size_t bytes, cudaStream_t stream);
typedef cudaError_t (*asc_cuda_free_fn)(void *p, cudaStream_t stream);
void ascender_cuda_set_scratch(asc_cuda_alloc_fn alloc, asc_cuda_free_fn release);

/* Magnitude Attention (SPEC section 7), the contract of magnitude_fwd_f64 / _bwd_f64 in ascender.h
 * with device pointers; t_raw, beta, gamma [H] and dparams [3][H] have the element type of q.
 * Forward: out [B,H,N,dv] (nothing when dv = 0) and mu [B,H,N]. Backward: dq, dk, dv and dparams
 * (dt_raw, dbeta, dgamma); reads grad_out and the optional grad_mu. */
int magnitude_cuda_fwd(const mag_params *p, const mag_fwd_args *a, int dtype, cudaStream_t stream);
int magnitude_cuda_bwd(const mag_params *p, const mag_bwd_args *a, int dtype, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* ASCENDER_CUDA_H */
