/*
 * fwd_tiled.cuh -- the tiled tensor-core forward of the ASCender op: the kernel of forward.cuh and its
 * launcher (design: docs/cuda.md, "The tensor-core kernels"), instantiated one dtype per translation unit
 * (ascender_fwd_tiled_f32.cu, _f16.cu, _bf16.cu) so that a parallel build compiles the three side by side;
 * ascender_fwd_tiled.cu dispatches to them. Plain CUDA C++, no torch.
 */
#ifndef ASCENDER_CUDA_FWD_TILED_CUH
#define ASCENDER_CUDA_FWD_TILED_CUH

#include "chunks.cuh"
#include "tiled.h"

namespace asc {
namespace tiled {

/* The rows row0 .. Nq - 1 of every (b, h) in tiles of Tr::BM (Tiles<T>::Row, or RowW where it gives an SM more warps:
 * forward); the rows before row0 take long_rows_kernel. */
template <typename T, class Tr>
__global__ void __launch_bounds__(Tr::THREADS)
    fwd_kernel_tc(const __grid_constant__ asc_params p, const __grid_constant__ asc_fwd_args a,
                  const __grid_constant__ KeyPrep<T> kp, const int64_t row0) {
    ASC_DYNAMIC_SMEM(smem);
    FwdSmem<T, Tr> S;
    S.place(smem, p);
    const TileBlock tb = tile_block((p.Nq - row0 + Tr::BM - 1) / Tr::BM, p.B * p.H, p.is_causal);
    const RowBlock<T, Tr> B(p, a, kp, tb.bh, row0 + tb.tile * Tr::BM);
    stage_rows(B, S);
    sweep_geometry(B, S, 0, p.N);
    rows_geometry(B, S, true);
    const int64_t jm = closed_moments(B, S); /* the keys F2 still sweeps: [jm, N) */
    if (jm < p.N) sweep_moments(B, S, jm, p.N, jm > 0);
    rows_bias_stats(B, S);
    sweep_softmax(B, S, 0, p.N);
    rows_output(B, S);
    if (a.map_attn) sweep_maps(B, S); /* uniform over the grid */
}

/*
 * The global rows of a windowed call over key chunks (docs/cuda.md "The global rows over key chunks"). A row tile that
 * holds a global row sweeps every key tile three times, where the call's other blocks sweep their window's few: at
 * N = 65536 with a window of 256 keys one such block per (b, h) issued ~40e6 warp instructions, 154 times the mean
 * block, and held the launch for most of its time. Those leading row tiles take chunks.cuh's three steps instead, a
 * block per (b, h, row tile, chunk of keys); fwd_kernel_tc takes the rest.
 */
template <typename T, int STEP>
__global__ void __launch_bounds__(Tiles<T>::Row::THREADS)
    long_rows_kernel(const __grid_constant__ asc_params p, const __grid_constant__ asc_fwd_args a,
                     const __grid_constant__ ChunkScratch<T> D) {
    using Tr = typename Tiles<T>::Row;
    const int64_t tiles = D.rows / Tr::BM, y = grid_y();
    if (y >= tiles * p.B * p.H) return;
    ASC_DYNAMIC_SMEM(smem);
    FwdSmem<T, Tr> S;
    S.place(smem, p);
    const RowBlock<T, Tr> B(p, a, D.kp, y / tiles, y % tiles * Tr::BM);
    chunk_step<T, Tr, STEP>(B, S, D, (int64_t)blockIdx.x);
}

/* The forward's shared memory per block in its standard row shape and in its shape for wide heads. */
template <typename T> void fwd_shape_bytes(const asc_params &p, long *standard, long *wide) {
    shape_bytes<FwdSmem, T, typename Tiles<T>::Row, typename Tiles<T>::RowW>(p, standard, wide);
}

/* Whether the forward's kernels get their shared memory on the current device in some row shape (bf16 / fp16 paper at
 * d = dv = 64, dz = da = 32: 114 KB standard; at d = dv = 128 171 KB, more than an A100's 163 KB, and 117 KB wide; at
 * 256 the standard rows take more than an H100's 227 KB, the wide ones 170 KB): shape_fits. A windowed call's long rows
 * run in the standard shape alone (long_rows_kernel). Where nothing fits, the row-per-warp forward takes the call. */
template <typename T> bool fwd_smem_fits(const asc_params &p) {
    using Tr = typename Tiles<T>::Row;
    long standard, wide;
    fwd_shape_bytes<T>(p, &standard, &wide);
    int64_t chunk = 0;
    if (long_row_tiles(p, Tr::BM, Tr::BN, &chunk)) return smem_fits(standard);
    return shape_fits<Tr, typename Tiles<T>::RowW>(standard, wide);
}

/* Whether the forward's row tiles take the wide shape (Tiles<T>::RowW) on the current device: runs_wide. */
template <typename T> bool fwd_wide(const asc_params &p) {
    long standard, wide;
    fwd_shape_bytes<T>(p, &standard, &wide);
    return runs_wide<typename Tiles<T>::Row, typename Tiles<T>::RowW>(standard, wide);
}

/* The launch of fwd_kernel_tc in tiles of Tr for the rows row0 .. Nq - 1 (bytes: its shared memory, prepared). */
template <typename T, class Tr>
cudaError_t launch_rows(const asc_params &p, const asc_fwd_args &a, const KeyPrep<T> &kp, int64_t row0, long bytes,
                        cudaStream_t stream) {
    dim3 grid;
    if (!tile_grid((p.Nq - row0 + Tr::BM - 1) / Tr::BM, p.B * p.H, &grid)) return cudaErrorInvalidConfiguration;
    return launch(fwd_kernel_tc<T, Tr>, grid, dim3(Tr::THREADS), (size_t)bytes, stream, p, a, kp, row0);
}

/* The forward of one call on the stream: the key preparation (with the key sums of the rows' moments where
 * closed_moments_wanted) into stream-ordered scratch, the long rows' key chunks, the kernel in
 * the row shape that gives an SM the most warps (wide_rows). */
template <typename T>
cudaError_t forward(const asc_params &p, const asc_fwd_args &a, cudaStream_t stream) {
    if (p.N == 0 || p.Nq == 0 || p.B * p.H == 0) return cudaSuccess;
    using Tr = typename Tiles<T>::Row;
    using Tw = typename Tiles<T>::RowW;
    const int64_t tiles = (p.Nq + Tr::BM - 1) / Tr::BM, bh = p.B * p.H;
    int64_t chunk = 0;
    const int64_t nlong = a.map_attn ? 0 : long_row_tiles(p, Tr::BM, Tr::BN, &chunk); /* the maps sweep every key */
    const int64_t row0 = nlong * Tr::BM; /* fwd_kernel_tc's first row, in either shape */
    dim3 grid;
    if (bh > MAX_GRID_Y || (tiles > nlong && !tile_grid(tiles - nlong, bh, &grid))) return cudaErrorInvalidConfiguration;
    FwdSmem<T, Tr> S;
    S.place(nullptr, p);
    FwdSmem<T, Tw> SW;
    SW.place(nullptr, p);
    const bool wide = tiles > nlong && runs_wide<Tr, Tw>((long)S.bytes, (long)SW.bytes);
    cudaError_t e = wide ? prepare_smem(fwd_kernel_tc<T, Tw>, (long)SW.bytes)
                         : prepare_smem(fwd_kernel_tc<T, Tr>, (long)S.bytes);
    void (*const steps[CHUNK_STEPS])(asc_params, asc_fwd_args, ChunkScratch<T>) = {
        long_rows_kernel<T, CHUNK_F1>, long_rows_kernel<T, CHUNK_F2>, long_rows_kernel<T, CHUNK_F3>};
    for (int k = 0; k < CHUNK_STEPS && nlong && e == cudaSuccess; k++) e = prepare_smem(steps[k], (long)S.bytes);
    if (e != cudaSuccess) return e;
    KeyPrep<T> kp;
    kp.place(p, a, nullptr, Tr::BN);
    const bool closed = closed_moments_wanted(p, a);
    const size_t km_bytes = closed ? (key_moments_bytes(p) + 255) / 256 * 256 : 0;
    ChunkScratch<T> D;
    if (nlong) D.place_parts(p, nlong * Tr::BM, chunk, nlong * bh, nullptr);
    char *base = nullptr;
    if ((e = scratch_alloc(&base, kp.bytes + km_bytes + (nlong ? D.bytes : 0), stream)) != cudaSuccess) return e;
    kp.place(p, a, base, Tr::BN);
    if (closed) place_key_moments(kp, p, base + kp.bytes);
    if (nlong) {
        D.kp = kp;
        D.place_parts(p, nlong * Tr::BM, chunk, nlong * bh, base + kp.bytes + km_bytes);
    }
    e = prepare_keys(p, a, kp, stream);
    if (e == cudaSuccess && closed) e = prepare_key_moments(p, a, kp, stream);
    if (e == cudaSuccess && nlong) e = cudaMemsetAsync(D.ticket, 0, D.ticket_bytes, stream);
    for (int k = 0; k < CHUNK_STEPS && nlong && e == cudaSuccess; k++)
        e = launch(steps[k], dim3((unsigned)D.nch, (unsigned)(nlong * bh)), dim3(Tr::THREADS), (size_t)S.bytes, stream,
                   p, a, D);
    if (e == cudaSuccess && tiles > nlong)
        e = wide ? launch_rows<T, Tw>(p, a, kp, row0, (long)SW.bytes, stream)
                 : launch_rows<T, Tr>(p, a, kp, row0, (long)S.bytes, stream);
    const cudaError_t f = scratch_free(base, stream);
    return e != cudaSuccess ? e : f;
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_FWD_TILED_CUH */
