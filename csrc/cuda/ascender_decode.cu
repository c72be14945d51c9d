/*
 * ascender_decode.cu -- the CUDA forward of a call that is not differentiated and has few query rows
 * (Nq <= 8: generation; docs/decode.md, docs/cuda.md "Decode"): the forward's three sweeps split over chunks
 * of keys sized per call (split-K, dec_chunk), a block of one warp per (b, h, chunk) taking the call's rows in
 * turn with a lane per key (decode_sweeps.cuh), each sweep's partial states merged per row over the chunks by the
 * last block of the sweep to finish. Three launches of chunks.cuh's steps (F1, F2, F3 per chunk; F3's last block of a
 * (b, h) writes the outputs), no key preparation (each lane forms its key's norms from the one read of its rows).
 * The values agree with the tiled forward's to rounding, not bit for bit (the CPU's decode kernel has the same
 * property): the backward must take the forward of ascender_fwd.cu, as the binding arranges.
 */
#include "chunks.cuh"
#include "tiled.h"

namespace asc {
namespace tiled {

/* Keys per chunk of a call whose launches hold `wave` blocks at once: about `wave` blocks for all (b, h), so that a
 * sweep's chunks run in one wave (two waves of chunks half as long cost more in the cost model: docs/cuda.md "The
 * chunks merged once, by the last block"); at most ROUND_CHUNKS chunks per (b, h) (the last block of each sweep merges
 * them all after its own chunk), a multiple of DEC_KEYS, at most DEC_CHUNK. */
inline int64_t dec_chunk(const asc_params &p, int64_t wave) {
    const auto whole = [](int64_t n) { return (n + DEC_KEYS - 1) / DEC_KEYS * DEC_KEYS; };
    const int64_t fill = whole((p.N * p.B * p.H + wave - 1) / wave);
    const int64_t few = whole((p.N + ROUND_CHUNKS - 1) / ROUND_CHUNKS);
    const int64_t c = fill > few ? fill : few;
    return c < DEC_CHUNK ? c : DEC_CHUNK;
}

/* Scratch of one decode call: the raw keys' prefix arrays, then [rows][chunks + 1] partials and a group of blocks per
 * (b, h) (chunks.cuh). */
template <typename T> inline void dec_place(ChunkScratch<T> &D, const asc_params &p, const asc_fwd_args &a,
                                            int64_t chunk, char *base) {
    D.kp.place(p, a, base, Tiles<T>::Dec::BN, true);
    D.place_parts(p, p.Nq, chunk, p.B * p.H, base ? base + D.kp.bytes : nullptr);
}

template <typename T, int STEP>
__global__ void __launch_bounds__(32) dec_kernel(const __grid_constant__ asc_params p,
                                                 const __grid_constant__ asc_fwd_args a,
                                                 const __grid_constant__ ChunkScratch<T> D) {
    using Tr = typename Tiles<T>::Dec;
    if (grid_y() >= p.B * p.H) return;
    ASC_DYNAMIC_SMEM(smem);
    FwdSmem<T, Tr> S;
    S.place(smem, p);
    const RowBlock<T, Tr> B(p, a, D.kp, grid_y(), 0);
    chunk_step<T, Tr, STEP>(B, S, D, (int64_t)blockIdx.x);
}

/* Whether a call takes the decode kernels (ASC_DECODE_ROWS of the CPU kernels: 8; options the tiled kernels
 * implement, tiled.h; their shared memory on the current device). */
template <typename T> bool decode_applies(const asc_params &p, const asc_fwd_args &a) {
    if (p.Nq > 8 || a.map_attn || !asc_tiled_options(&p, &a)) return false;
    FwdSmem<T, typename Tiles<T>::Dec> S;
    S.place(nullptr, p);
    return smem_fits((long)S.bytes);
}

template <typename T>
static cudaError_t decode(const asc_params &p, const asc_fwd_args &a, cudaStream_t stream) {
    using Tr = typename Tiles<T>::Dec;
    if (p.B * p.H > MAX_GRID_Y) return cudaErrorInvalidConfiguration;
    FwdSmem<T, Tr> S;
    S.place(nullptr, p);
    cudaError_t e;
    void (*const steps[CHUNK_STEPS])(asc_params, asc_fwd_args, ChunkScratch<T>) = {
        dec_kernel<T, CHUNK_F1>, dec_kernel<T, CHUNK_F2>, dec_kernel<T, CHUNK_F3>};
    for (int k = 0; k < CHUNK_STEPS; k++)
        if ((e = prepare_smem(steps[k], (long)S.bytes)) != cudaSuccess) return e;
    /* as many one-warp blocks as the device holds at once in each step (the fallback, 1024: an H100's 132 SMs hold 8
     * to 10 of the benchmark's, docs/cuda.md "Decode") */
    int64_t wave = 1024;
    for (int k = 0; k < CHUNK_STEPS; k++) {
        const int64_t w = device_wave(steps[k], 32, (long)S.bytes, 1024);
        wave = k == 0 || w < wave ? w : wave;
    }
    const int64_t chunk = dec_chunk(p, wave);
    ChunkScratch<T> D;
    dec_place(D, p, a, chunk, nullptr);
    char *base = nullptr;
    if ((e = scratch_alloc(&base, D.kp.bytes + D.bytes, stream)) != cudaSuccess) return e;
    dec_place(D, p, a, chunk, base);
    e = prepare_keys(p, a, D.kp, stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(D.ticket, 0, D.ticket_bytes, stream);
    for (int k = 0; k < CHUNK_STEPS && e == cudaSuccess; k++)
        e = launch(steps[k], dim3((unsigned)D.nch, (unsigned)(p.B * p.H)), dim3(32), (size_t)S.bytes, stream, p, a, D);
    const cudaError_t f = scratch_free(base, stream);
    return e != cudaSuccess ? e : f;
}

/* The decode kernels where they apply, else ascender_cuda_fwd. */
template <typename T> static int infer(const asc_params &p, const asc_fwd_args &a, int dtype, cudaStream_t stream) {
    return decode_applies<T>(p, a) ? (int)decode<T>(p, a, stream) : ascender_cuda_fwd(&p, &a, dtype, stream);
}

}  // namespace tiled
}  // namespace asc

/* The forward of a call whose result is not differentiated: few query rows take the decode kernels, the
 * others (and the inspection maps) ascender_cuda_fwd. */
extern "C" int ascender_cuda_infer(const asc_params *p, const asc_fwd_args *a, int dtype, cudaStream_t stream) {
    if (p->N == 0 || p->Nq == 0 || p->B * p->H == 0) return 0;
    switch (dtype) {
        case ASC_CUDA_F32: return asc::tiled::infer<float>(*p, *a, dtype, stream);
        case ASC_CUDA_F64: return asc::tiled::infer<double>(*p, *a, dtype, stream);
        case ASC_CUDA_F16: return asc::tiled::infer<__half>(*p, *a, dtype, stream);
        case ASC_CUDA_BF16: return asc::tiled::infer<__nv_bfloat16>(*p, *a, dtype, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
