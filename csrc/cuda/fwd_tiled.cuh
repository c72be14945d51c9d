/*
 * fwd_tiled.cuh -- the tiled tensor-core forward of the ASCender op: the kernel of forward.cuh and its
 * launcher (design: docs/cuda.md, "The tensor-core kernels"), instantiated one dtype per translation unit
 * (ascender_fwd_tiled_f32.cu, _f16.cu, _bf16.cu) so that a parallel build compiles the three side by side;
 * ascender_fwd_tiled.cu dispatches to them. Plain CUDA C++, no torch.
 */
#ifndef ASCENDER_CUDA_FWD_TILED_CUH
#define ASCENDER_CUDA_FWD_TILED_CUH

#include "forward.cuh"
#include "tiled.h"

namespace asc {
namespace tiled {

template <typename T>
__global__ void __launch_bounds__(Tiles<T>::Row::THREADS)
    fwd_kernel_tc(const __grid_constant__ asc_params p, const __grid_constant__ asc_fwd_args a,
                  const __grid_constant__ KeyPrep<T> kp) {
    using Tr = typename Tiles<T>::Row;
    ASC_DYNAMIC_SMEM(smem);
    FwdSmem<T, Tr> S;
    S.place(smem, p);
    const TileBlock tb = tile_block((p.Nq + Tr::BM - 1) / Tr::BM, p.B * p.H, p.is_causal);
    const RowBlock<T, Tr> B(p, a, kp, tb.bh, tb.tile * Tr::BM);
    stage_rows(B, S);
    sweep_geometry(B, S, 0, p.N);
    rows_geometry(B, S, true);
    const int64_t jm = closed_moments(B, S); /* the keys F2 still sweeps: [jm, N) */
    if (jm < p.N) sweep_moments(B, S, jm, p.N);
    rows_bias_stats(B, S);
    sweep_softmax(B, S, 0, p.N);
    rows_output(B, S);
    if (a.map_attn) sweep_maps(B, S); /* uniform over the grid */
}

/* Whether the forward kernel gets its shared memory on the current device (bf16 / fp16 paper at d = dv = 64,
 * dz = da = 32: 114 KB; at d = dv = 128 171 KB, more than an A100's 163 KB; at 256 more than an H100's 227 KB);
 * where not, the row-per-warp forward takes the call. */
template <typename T> bool fwd_smem_fits(const asc_params &p) {
    FwdSmem<T, typename Tiles<T>::Row> S;
    S.place(nullptr, p);
    return smem_fits((long)S.bytes);
}

/* The forward of one call on the stream: the key preparation (with the key sums of the rows' moments where
 * closed_moments_wanted) into stream-ordered scratch, the kernel. */
template <typename T>
cudaError_t forward(const asc_params &p, const asc_fwd_args &a, cudaStream_t stream) {
    if (p.N == 0 || p.Nq == 0 || p.B * p.H == 0) return cudaSuccess;
    using Tr = typename Tiles<T>::Row;
    dim3 grid; /* (B H <= 65535 as every launcher of a call: the key sums' grids and the backward's) */
    if (p.B * p.H > 65535 || !tile_grid((p.Nq + Tr::BM - 1) / Tr::BM, p.B * p.H, &grid))
        return cudaErrorInvalidConfiguration;
    FwdSmem<T, Tr> S;
    S.place(nullptr, p);
    cudaError_t e = prepare_smem(fwd_kernel_tc<T>, (long)S.bytes);
    if (e != cudaSuccess) return e;
    KeyPrep<T> kp;
    kp.place(p, a, nullptr, Tr::BN);
    const bool closed = closed_moments_wanted(p, a);
    char *base = nullptr;
    if ((e = scratch_alloc(&base, kp.bytes + (closed ? key_moments_bytes(p) : 0), stream)) != cudaSuccess)
        return e;
    kp.place(p, a, base, Tr::BN);
    if (closed) place_key_moments(kp, p, base + kp.bytes);
    e = prepare_keys(p, a, kp, stream);
    if (e == cudaSuccess && closed) e = prepare_key_moments(p, a, kp, stream);
    if (e == cudaSuccess)
        e = launch(fwd_kernel_tc<T>, grid, dim3(Tr::THREADS), (size_t)S.bytes, stream, p, a, kp);
    const cudaError_t f = scratch_free(base, stream);
    return e != cudaSuccess ? e : f;
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_FWD_TILED_CUH */
