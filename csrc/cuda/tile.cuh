/*
 * tile.cuh -- shared-memory tiles and the warp-level products of the tensor-core ASCender kernels
 * (docs/cuda.md, "The tensor-core kernels: the GPU tile plan").
 *
 * A product runs per warp on the PTX m16n8 accumulator layout (g = lane / 4, t = lane % 4): acc[n][e]
 * holds row g + 8 (e / 2), column 8 n + 2 t + e % 2 of a 16 x 8 NT tile. Three shapes:
 *   score   acc (16 rows x 8 NT keys) += A (16 x f, shared rows) . B (8 NT keys x f, a shared key tile)^T
 *   row     O (16 x f, fp32 rows in shared memory) += W (16 x 8 NT, accumulator registers) . X (8 NT x f)
 *   column  O (16 keys x f, fp32 in shared memory) += W^T (from a shared [queries][keys] tile) . Y (queries x f)
 * On bf16/fp16 (Elem<T>::kMma) they are mma.sync m16n8k16 with operands loaded by ldmatrix; on float32 and
 * float64 the FFMA path forms the same entries lane by lane in the compute type, so the epilogues are one
 * code for every element type.
 */
#ifndef ASCENDER_CUDA_TILE_CUH
#define ASCENDER_CUDA_TILE_CUH

#include <stdint.h>

#include <type_traits>

#include "common.cuh"
#include "kernel_traits.cuh"
#include "mma.cuh"

namespace asc {
namespace tiled {

/* ---------------------------------------------------------------- sizes */

/* Feature columns a tile of f features holds: a multiple of 16 for the mma path (k16 steps and pairs of
 * n8 tiles; the padding is zeros), f itself for the FFMA path. */
template <typename S> __host__ __device__ constexpr int64_t fpad_of(int64_t f) {
    return sizeof(S) == 2 ? (f + 15) / 16 * 16 : f;
}

/* Row stride (elements) of such a tile: for 2-byte types fpad + 8, i.e. 16-byte aligned rows whose stride
 * is 16 bytes mod 32, so the 8 rows of an ldmatrix fall into 8 different 16-byte bank groups; for the
 * FFMA path an odd stride in elements (lanes reading a column of 8 rows hit different banks). */
template <typename S> __host__ __device__ constexpr int64_t ld_of(int64_t f) {
    return sizeof(S) == 2 ? fpad_of<S>(f) + 8 : (f | 1);
}

/* Bytes of a tile of `rows` rows of f features, rounded up to 16. */
template <typename S> __host__ __device__ constexpr int64_t tile_bytes(int64_t rows, int64_t f) {
    return (rows * ld_of<S>(f) * (int64_t)sizeof(S) + 15) / 16 * 16;
}

/* A tile in shared memory: element (r, c) at p[r * ld + c]. */
template <typename S> struct Smem2D {
    S *p;
    int ld;
    __device__ S *row(int r) const { return p + (int64_t)r * ld; }
};

/* Carves 16-byte aligned regions out of the block's dynamic shared memory (measure with base NULL on the
 * host, then the same sequence of takes on the device). */
struct Carve {
    unsigned char *base;
    int64_t off = 0;
    __host__ __device__ explicit Carve(unsigned char *b) : base(b) {}
    __host__ __device__ int64_t take(int64_t bytes) {
        const int64_t at = off;
        off += (bytes + 15) / 16 * 16;
        return at;
    }
    template <typename S> __host__ __device__ Smem2D<S> tile(int64_t rows, int64_t f) {
        const int64_t at = take(tile_bytes<S>(rows, f));
        return Smem2D<S>{base ? reinterpret_cast<S *>(base + at) : nullptr, (int)ld_of<S>(f)};
    }
    template <typename S> __host__ __device__ S *array(int64_t n) {
        const int64_t at = take(n * (int64_t)sizeof(S));
        return base ? reinterpret_cast<S *>(base + at) : nullptr;
    }
};

/* ---------------------------------------------------------------- element access on the layout */

__device__ __forceinline__ int frag_row(int lane, int e) { return (lane >> 2) + ((e >> 1) << 3); }
__device__ __forceinline__ int frag_col(int lane, int n, int e) { return n * 8 + ((lane & 3) << 1) + (e & 1); }

/* The entry bits (4 n + e) of a lane's row g (entries e = 0, 1) and row g + 8 (e = 2, 3) among 8 NT keys, and all of
 * them. The epilogues keep per-entry sets (J(i), T(i), the own token) as such bits. */
template <int NT> __device__ __forceinline__ constexpr unsigned all_bits() {
    return 4 * NT >= 32 ? 0xffffffffu : (1u << (4 * NT)) - 1u;
}
template <int NT> __device__ __forceinline__ unsigned row_bits(int r) {
    return all_bits<NT>() & (r ? 0xccccccccu : 0x33333333u);
}

/* f(std::true_type) where `every` holds, else f(std::false_type): an epilogue written once whose per-entry set
 * tests fold away (if constexpr) on the tiles where every entry is in the set, the common case. */
template <typename F> __device__ __forceinline__ void every_or_not(bool every, F &&f) {
    if (every) f(std::true_type{});
    else f(std::false_type{});
}

/* Sums, maxima, minima over the four lanes of a quad (the lanes holding one row of a tile). */
template <typename V> __device__ __forceinline__ V quad_sum(V v) {
    v += __shfl_xor_sync(FULL, v, 1);
    v += __shfl_xor_sync(FULL, v, 2);
    return v;
}
template <typename V> __device__ __forceinline__ V quad_max(V v) {
    V o = __shfl_xor_sync(FULL, v, 1);
    v = o > v ? o : v;
    o = __shfl_xor_sync(FULL, v, 2);
    return o > v ? o : v;
}
template <typename V> __device__ __forceinline__ V quad_min(V v) {
    V o = __shfl_xor_sync(FULL, v, 1);
    v = o < v ? o : v;
    o = __shfl_xor_sync(FULL, v, 2);
    return o < v ? o : v;
}

template <typename C, int NT> __device__ __forceinline__ void zero_acc(C (&acc)[NT][4]) {
    for (int n = 0; n < NT; n++)
        for (int e = 0; e < 4; e++) acc[n][e] = (C)0;
}

/* A squared distance ||a - b||^2 = s - 2 a.b from s = ||a||^2 + ||b||^2 and the product a.b, clamped at 0 (a NaN
 * kept: relu). One fused multiply-add: 2 a.b is exact, so fma(-2, a.b, s) rounds once, as s - 2 a.b does, to the
 * same bits, where nvcc made s - (C)2 * dot two FADD (dot + dot, then the difference). */
template <typename C> __device__ __forceinline__ C sq_dist(C s, C dot) { return relu(fm((C)-2, dot, s)); }

/* The own token's column among a lane's entries of one row, as the value n * 8 + e % 2 of the entry that holds it
 * (the entry's column less the lane's 2 (lane % 4)): the token's column t - j0 in the tile of keys j0 .. j0 + 8 NT - 1
 * less 2 (lane % 4); -1 when the token is not in the tile (no entry has it). One 64-bit difference per row and
 * tile in place of a 64-bit compare per entry. */
template <int NT> __device__ __forceinline__ int own_col(int64_t t, int64_t j0, int lane) {
    const int64_t d = t - j0;
    return d >= 0 && d < 8 * NT ? (int)d - 2 * (lane & 3) : -1;
}

/* ---------------------------------------------------------------- the element types on the tensor cores */

template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) { return pack_bf16(lo, hi); }
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) { return pack_f16(lo, hi); }

/* d += a b; without ADD d = a b, from a zero addend that the hardware takes as its zero register (HMMA ... RZ): no
 * instructions to clear d first */
template <typename T, bool ADD = true>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    const float z[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const float(&c)[4] = *(ADD ? &d : &z);
    if constexpr (std::is_same<T, __half>::value) mma_m16n8k16_f16(d, a, b, c);
    else mma_m16n8k16_bf16(d, a, b, c);
}

/* x in the element type T (round to nearest). */
template <typename T, typename V> __device__ __forceinline__ T to_elem(V x) {
    if constexpr (std::is_same<T, __half>::value) return __float2half_rn((float)x);
    else if constexpr (std::is_same<T, __nv_bfloat16>::value) return __float2bfloat16_rn((float)x);
    else return (T)x;
}

/* The exponentials of the tiled kernels' epilogues: exp(x) = ex_scaled<T>(x * exp_scale<T>()), the factor folded
 * by the caller into a multiply it has anyway (D * nis, x * L - mx * L). On the mma path (bf16 / fp16 inputs)
 * 2^y by ex2.approx (MUFU.EX2, about 2 ulp of fp32, far inside those types' tolerances: two instructions where
 * expf takes about ten) and the factor log2 e; on the FFMA path (float32, float64) the compute type's full-
 * precision exp and the factor 1, so those results keep their bits. Forward and backward call the same pair for
 * the same element type, so the saved statistics and the recomputed weights come from one function. */
template <typename T> __host__ __device__ constexpr double exp_scale() {
    return Elem<T>::kMma ? 1.4426950408889634 : 1.0;
}
template <typename T> __device__ __forceinline__ typename Elem<T>::C ex_scaled(typename Elem<T>::C y) {
    if constexpr (Elem<T>::kMma) return ex2(y);
    else return ex(y);
}

/* x rounded to T and back (the part of a split operand that T holds). */
template <typename T> __device__ __forceinline__ float rounded(float x) { return up(to_elem<T>(x)); }

/* ---------------------------------------------------------------- loading tiles */

/* Element by element: tiles of the FFMA path, rows of a size that is not a multiple of 16 bytes, unaligned
 * sources. rows: the source's rows from the block's first (rows_in of them exist; the rest, and the columns
 * f .. fpad - 1, as zeros). */
template <typename S>
__device__ void tile_load_elems(Smem2D<S> dst, const S *rows, int64_t f, int nrows, int64_t rows_in, int tid,
                                int nthr) {
    const int64_t fp = fpad_of<S>(f);
    for (int64_t e = tid; e < (int64_t)nrows * fp; e += nthr) {
        const int r = (int)(e / fp);
        const int64_t c = e - (int64_t)r * fp;
        S v;
        if (c < f && r < rows_in) v = rows[(int64_t)r * f + c];
        else v = to_elem<S>(0.0f);
        dst.row(r)[c] = v;
    }
}

/* tiles_load's fixed walk: NROWS rows of PR whole 16-byte chunks (f = 8 PR 2-byte features, a multiple of 16),
 * every row existing, by NTHR threads. Thread tid copies chunk tid % PR of rows tid / PR + k NTHR / PR, so every
 * offset past the thread's first is a compile-time constant (an immediate of the copy instruction). Only the tiles
 * of the mask OPT (bit m: dst[m]) may be absent (NULL) and are tested: ptxas made every tested tile a predicated
 * region and worked the thread's offsets out again in each. */
template <typename S, int M, int PR, int NTHR, int NROWS, unsigned OPT>
__device__ __forceinline__ void tiles_load_rows(const Smem2D<S> (&dst)[M], const S *const (&src)[M], int tid) {
    static_assert(sizeof(S) == 2 && NTHR % PR == 0, "whole rows of 2-byte elements, a thread count of whole rows");
    constexpr int F = 8 * PR, LD = (int)ld_of<S>(F), DR = NTHR / PR, K = (NROWS + DR - 1) / DR;
    const unsigned r = (unsigned)tid / PR, c = (unsigned)tid % PR * 8;
    ASC_UNROLL
    for (int m = 0; m < M; m++) {
        if ((OPT >> m) & 1u && !dst[m].p) continue;
        S *d = dst[m].p + (r * LD + c);
        const S *g = src[m] + (r * F + c);
        ASC_UNROLL
        for (int k = 0; k < K; k++)
            if (NROWS % DR == 0 || r + k * DR < NROWS) cp_async_16(d + k * DR * LD, g + k * DR * F);
    }
}

/* Whether a source of f features takes tiles_load_fixed: 4, 8 or 16 whole chunks a row (32, 64, 128 2-byte features)
 * and a 16-byte aligned start, so that every row of it is aligned. The callers' once-per-block or per-sweep test. */
template <typename S> __device__ __forceinline__ bool fixed_walk_fits(const S *src, int64_t f) {
    return (f == 32 || f == 64 || f == 128) && (uintptr_t)src % 16 == 0;
}

/* tiles_load_rows for a width f of 4, 8 or 16 whole chunks (32, 64, 128 2-byte features) chosen at run time: NROWS rows,
 * all there, every source 16-byte aligned (the caller has checked both: fixed_walk_fits); OPT as there. */
template <typename S, int NTHR, int NROWS, unsigned OPT, int M>
__device__ __forceinline__ void tiles_load_fixed(const Smem2D<S> (&dst)[M], const S *const (&src)[M], int64_t f,
                                                 int tid) {
    if (f == 32) tiles_load_rows<S, M, 4, NTHR, NROWS, OPT>(dst, src, tid);
    else if (f == 64) tiles_load_rows<S, M, 8, NTHR, NROWS, OPT>(dst, src, tid);
    else tiles_load_rows<S, M, 16, NTHR, NROWS, OPT>(dst, src, tid);
}

/* Copies nrows rows of each of M row-major global arrays of the same width f into M shared tiles of stride
 * ld_of<S>(f) (a NULL dst[m].p: none): src[m] points at the first row to copy, and rows_in rows exist from
 * there in every source (the rest, and the columns f .. fpad - 1, load as zeros). Called by threads tid of
 * nthr of the block, all with the same arguments. Asynchronous (16-byte cp.async, commit and wait by the
 * caller) where rows and sources allow it, else element by element. The tiles share one walk: chunk
 * e = tid + k nthr (16 bytes, per_row to a row) is (row r, chunk ch) of every tile, so the split of tid and
 * nthr (by shifts where per_row is a power of two: 8 at 64 features, 4 at 32; else by a division), the
 * 32-bit offsets inside the block and the zero fill are worked out once for all M; r and ch then advance by
 * the step (dr rows, dc chunks) with one carry. (Whole tiles take tiles_load_fixed where the widths allow it: B2c's
 * query tiles, and since 2026-11-29 the row-major sweeps' key tiles, load_key_tile; B2r's row block, once per block,
 * keeps this walk: docs/cuda.md "A fixed walk for B2c's query rows", "The key tiles' fixed walk".) */
template <typename S, int M>
__device__ void tiles_load(const Smem2D<S> (&dst)[M], const S *const (&src)[M], int64_t f, int nrows,
                           int64_t rows_in, int tid, int nthr) {
    const int64_t fp = fpad_of<S>(f);
    if (fp == 0) return;
    bool async = sizeof(S) == 2 && (f * 2) % 16 == 0;
    ASC_UNROLL
    for (int m = 0; m < M; m++) async = async && (!dst[m].p || (uintptr_t)src[m] % 16 == 0);
    const int rin = rows_in <= 0 ? 0 : rows_in < nrows ? (int)rows_in : nrows;
    if (!async) {
        ASC_UNROLL
        for (int m = 0; m < M; m++)
            if (dst[m].p) tile_load_elems(dst[m], src[m], f, nrows, rin, tid, nthr);
        return;
    }
    /* a row block of a shared tile: offsets far below 2^31 */
    const int per_row = (int)(fp / 8), have = (int)(f / 8), fi = (int)f, ld = (int)ld_of<S>(f);
    int r, ch, dr, dc;
    if ((per_row & (per_row - 1)) == 0) {
        const int sh = __popc((unsigned)per_row - 1u), msk = per_row - 1;
        r = tid >> sh;
        ch = tid & msk;
        dr = nthr >> sh;
        dc = nthr & msk;
    } else {
        r = tid / per_row;
        ch = tid - r * per_row;
        dr = nthr / per_row;
        dc = nthr - dr * per_row;
    }
    while (r < nrows) {
        const bool valid = ch < have && r < rin;
        const int so = valid ? r * fi + ch * 8 : 0, doff = r * ld + ch * 8; /* an invalid chunk reads nothing */
        ASC_UNROLL
        for (int m = 0; m < M; m++)
            if (dst[m].p) cp_async_16_zfill(dst[m].p + doff, src[m] + so, valid);
        r += dr;
        ch += dc;
        if (ch >= per_row) {
            ch -= per_row;
            r++;
        }
    }
}

/* One tile: rows r0 .. r0 + nrows - 1 of src (rows at or past nvalid as zeros). */
template <typename S>
__device__ void tile_load(Smem2D<S> dst, const S *src, int64_t f, int64_t r0, int nrows, int64_t nvalid, int tid,
                          int nthr) {
    const Smem2D<S> d[1] = {dst};
    const S *s[1] = {r0 < nvalid ? src + r0 * f : src}; /* a row that exists, or the array's start */
    tiles_load<S, 1>(d, s, f, nrows, nvalid - r0, tid, nthr);
}

/* n consecutive values of each of M per-key arrays (n * sizeof(C) a multiple of 16, the sources 16-byte aligned and
 * readable for all n: the key preparation pads its arrays), by cp.async, in one loop. */
template <typename C, int M>
__device__ void vecs_load(C *const (&dst)[M], const C *const (&src)[M], int n, int tid, int nthr) {
    constexpr int per = 16 / (int)sizeof(C);
    for (int e = tid; e < n / per; e += nthr)
        ASC_UNROLL
        for (int m = 0; m < M; m++) cp_async_16(dst[m] + e * per, src[m] + e * per);
}

/* ---------------------------------------------------------------- score products */

/* body(k) for k = FIRST, FIRST + 16, ... below fpad (a multiple of 16): the k16 steps of a product or the 16-feature
 * chunks of its output. Straight-line code at 32 and 64 features, a rolled loop at other widths. As one loop with a
 * run-time trip count, a score product at 64 features ran 41 instructions for its 16 of ldmatrix and mma (29 now),
 * and a row product's chunk 28 for its 14 (docs/cuda.md, "The score products' k16 steps"). */
template <int FIRST, typename Body> __device__ __forceinline__ void k16_steps(int fpad, Body &&body) {
    auto fixed = [&](auto end) {
        ASC_UNROLL
        for (int k = FIRST; k < decltype(end)::value; k += 16) body(k);
    };
    if (fpad == 64) {
        fixed(std::integral_constant<int, 64>{});
    } else if (fpad == 32) {
        fixed(std::integral_constant<int, 32>{});
    } else {
        ASC_NOUNROLL
        for (int k = FIRST; k < fpad; k += 16) body(k);
    }
}

/* acc[n] = A (16 rows from shared memory) . B (8 NT keys of a shared tile)^T over fpad features (a positive multiple
 * of 16); with ADD, acc[n] += the product. A set takes its first k16 step with a zero addend (mma16816), so no caller
 * clears its accumulators: 2 NT instructions a product. */
template <typename T, int NT, bool ADD>
__device__ __forceinline__ void score_mma(float (&acc)[NT][4], Smem2D<T> A, Smem2D<T> B, int fpad, int lane) {
    static_assert(NT % 2 == 0, "n8 tiles are loaded in pairs");
    auto step = [&](int ks, auto add) {
        uint32_t a[4];
        ldmatrix_x4(a, A.row(lane & 15) + ks + ((lane >> 4) << 3));
        ASC_UNROLL
        for (int n = 0; n < NT; n += 2) {
            uint32_t b[4];
            const int m = lane >> 3;
            ldmatrix_x4(b, B.row((n + (m >> 1)) * 8 + (lane & 7)) + ks + ((m & 1) << 3));
            const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma16816<T, decltype(add)::value>(acc[n], a, b0);
            mma16816<T, decltype(add)::value>(acc[n + 1], a, b1);
        }
    };
    if constexpr (!ADD) step(0, std::false_type{});
    k16_steps<ADD ? 0 : 16>(fpad, [&](int ks) { step(ks, std::true_type{}); });
}

template <typename S, typename C, int NT>
__device__ __forceinline__ void score_ffma(C (&acc)[NT][4], Smem2D<S> A, Smem2D<S> B, int64_t f, int lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int64_t c = 0; c < f; c++) {
        const C a0 = (C)up(A.row(g)[c]), a1 = (C)up(A.row(g + 8)[c]);
        ASC_UNROLL
        for (int n = 0; n < NT; n++) {
            const C b0 = (C)up(B.row(n * 8 + 2 * t)[c]), b1 = (C)up(B.row(n * 8 + 2 * t + 1)[c]);
            acc[n][0] += a0 * b0;
            acc[n][1] += a0 * b1;
            acc[n][2] += a1 * b0;
            acc[n][3] += a1 * b1;
        }
    }
}

/* acc = A . B^T for A of the warp's 16 rows (rows 0..15 of the Smem2D given) and the key tile B (set, not
 * accumulated). With a second A (`Alo`, not NULL) the product of the split operand A + Alo. */
template <typename T, int NT>
__device__ __forceinline__ void score(typename Elem<T>::C (&acc)[NT][4], Smem2D<T> A, const T *Alo, Smem2D<T> B,
                                      int64_t f, int lane) {
    if constexpr (Elem<T>::kMma) {
        const int fp = ((int)f + 15) & ~15; /* fpad_of of a shared-memory row (far below 2^31) in 32 bits */
        if (fp == 0) { /* no features (a zero width is valid): zeros, written on this branch only */
            for (int n = 0; n < NT; n++)
                for (int e = 0; e < 4; e++) acc[n][e] = zero_kept();
            return;
        }
        score_mma<T, NT, false>(acc, A, B, fp, lane);
        if (Alo) score_mma<T, NT, true>(acc, Smem2D<T>{const_cast<T *>(Alo), A.ld}, B, fp, lane);
    } else {
        (void)Alo;
        zero_acc(acc);
        score_ffma<T, typename Elem<T>::C, NT>(acc, A, B, f, lane);
    }
}

/* ---------------------------------------------------------------- row products */

/*
 * O (the warp's 16 rows, fp32 / C in shared memory, stride ldo) = O osc + W . X over the tile's 8 NT keys (osc:
 * a factor per row, g and g + 8: the online softmax's rescaling), W in accumulator registers, X a shared key tile
 * of f features. SPLIT: W enters as w_hi + w_lo (two mma).
 * On the FFMA path (and always when `safe`), row_ffma below.
 */
/* A power of two that brings the largest of the warp's weights (max |w| of every lane) into [2^13, 2^14): fp16 holds
 * values up to 65504 only, and below 2^-14 it loses bits (subnormal) and flushes under 2^-24, where small weights
 * would lose the rows they make up (a centroid whose keys are all far: wc = e^(-D / tau) < 6e-5, docs/cuda.md "Fixed:
 * fp16 row products of small weights"); bf16 has the range of fp32: 1. Products scaled by it and back are exact. The
 * scaling up stops at 2^24, so that the fp32 sums it multiplies with the weights keep their range. */
__device__ __forceinline__ float half_range(float m) {
    if (!(m > 0.0f) || m - m != 0.0f) return 1.0f; /* no weight, or not finite (nothing helps) */
    int e;
    frexpf(m, &e); /* m in [2^(e-1), 2^e) */
    return ldexpf(1.0f, 14 - e < 24 ? 14 - e : 24);
}

template <typename T> __device__ __forceinline__ float range_scale(float m) {
    if constexpr (!std::is_same<T, __half>::value) {
        return 1.0f;
    } else {
        for (int o = 16; o > 0; o >>= 1) {
            const float x = __shfl_xor_sync(FULL, m, o);
            m = x > m ? x : m;
        }
        return half_range(m);
    }
}

/* The row stride of a shared accumulator block of w columns for element type T. The mma path (w a multiple of 16):
 * w + 8 floats, so that a 64-bit fragment access (frag_load, frag_store: a half-warp reads 4 rows of 8 words) hits 32
 * different banks; with w + 4 two rows shared each bank (2 wavefronts a phase). The FFMA path keeps w + 4 (float) or
 * w + 2 (double). */
template <typename T> __host__ __device__ inline int64_t acc_stride(int64_t w) {
    return w + (sizeof(T) == 2 ? 8 : sizeof(typename Elem<T>::C) == 8 ? 2 : 4);
}

/* The C fragments of two n8 tiles (features f .. f + 7: c0, f + 8 .. f + 15: c1) of a warp's 16 rows of fp32 in
 * shared memory (stride ldo), row g's entries times s0 and row g + 8's times s1; and stored back times s. A lane's
 * two entries of a tile are adjacent columns 2t, 2t + 1 and ldo, f and O's place are even (fpad multiples, Carve's
 * 16-byte regions): one 64-bit access each. */
__device__ __forceinline__ void frag_load(const float *O, int ldo, int f, int lane, float s0, float s1, float (&c0)[4],
                                          float (&c1)[4]) {
    const int g = lane >> 2, t = lane & 3;
    const float2 *o0 = reinterpret_cast<const float2 *>(O + g * ldo + f + 2 * t),
                 *o1 = reinterpret_cast<const float2 *>(O + (g + 8) * ldo + f + 2 * t);
    const float2 x0 = o0[0], x1 = o1[0], y0 = o0[4], y1 = o1[4];
    c0[0] = x0.x * s0; c0[1] = x0.y * s0; c0[2] = x1.x * s1; c0[3] = x1.y * s1;
    c1[0] = y0.x * s0; c1[1] = y0.y * s0; c1[2] = y1.x * s1; c1[3] = y1.y * s1;
}
__device__ __forceinline__ void frag_store(float *O, int ldo, int f, int lane, float s, const float (&c0)[4],
                                           const float (&c1)[4]) {
    const int g = lane >> 2, t = lane & 3;
    float2 *o0 = reinterpret_cast<float2 *>(O + g * ldo + f + 2 * t),
           *o1 = reinterpret_cast<float2 *>(O + (g + 8) * ldo + f + 2 * t);
    o0[0] = float2{c0[0] * s, c0[1] * s};
    o1[0] = float2{c0[2] * s, c0[3] * s};
    o0[4] = float2{c1[0] * s, c1[1] * s};
    o1[4] = float2{c1[2] * s, c1[3] * s};
}

template <typename T, int NT, bool SPLIT>
__device__ __forceinline__ void row_mma(float *O, int ldo, const float (&w)[NT][4], const float (&osc)[2],
                                        Smem2D<T> X, int fpad, int lane) {
    constexpr int KS = NT / 2;
    float m = 0.0f;
    ASC_UNROLL
    for (int n = 0; n < NT; n++)
        ASC_UNROLL
        for (int e = 0; e < 4; e++) m = fabsf(w[n][e]) > m ? fabsf(w[n][e]) : m;
    const float ws = range_scale<T>(m), iws = 1.0f / ws; /* the weights times ws, the products divided by it */
    uint32_t a[KS][4], al[KS][4];
    ASC_UNROLL
    for (int k = 0; k < KS; k++) {
        ASC_UNROLL
        for (int h = 0; h < 2; h++) { /* n8 tiles 2k and 2k + 1: a[0], a[1] and a[2], a[3] */
            float c[4];
            for (int e = 0; e < 4; e++) c[e] = w[2 * k + h][e] * ws;
            a[k][2 * h] = pack2<T>(c[0], c[1]);
            a[k][2 * h + 1] = pack2<T>(c[2], c[3]);
            if (SPLIT) {
                al[k][2 * h] = pack2<T>(c[0] - rounded<T>(c[0]), c[1] - rounded<T>(c[1]));
                al[k][2 * h + 1] = pack2<T>(c[2] - rounded<T>(c[2]), c[3] - rounded<T>(c[3]));
            }
        }
    }
    auto chunk = [&](int f0) { /* two output n8 tiles */
        float c0[4], c1[4];
        frag_load(O, ldo, f0, lane, osc[0] * ws, osc[1] * ws, c0, c1);
        ASC_UNROLL
        for (int k = 0; k < KS; k++) {
            uint32_t b[4];
            const int mi = lane >> 3;
            ldmatrix_x4_trans(b, X.row(k * 16 + ((mi & 1) << 3) + (lane & 7)) + f0 + ((mi >> 1) << 3));
            const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            mma16816<T>(c0, a[k], b0);
            mma16816<T>(c1, a[k], b1);
            if (SPLIT) {
                mma16816<T>(c0, al[k], b0);
                mma16816<T>(c1, al[k], b1);
            }
        }
        frag_store(O, ldo, f0, lane, iws, c0, c1);
    };
    k16_steps<0>(fpad, chunk);
}

/* The quad's four partial sums of four columns c0 .. c0 + 3 of one row, reduced and scattered: lane t of the
 * quad gets the sum of column c0 + t (three shuffles: the halves by xor 2, then the columns by xor 1). */
template <typename C> __device__ __forceinline__ C quad_reduce_scatter(const C (&v)[4], int t) {
    const bool hi = (t >> 1) != 0, odd = (t & 1) != 0;
    C keep[2];
    ASC_UNROLL
    for (int q = 0; q < 2; q++) {
        const C send = hi ? v[q] : v[2 + q];
        keep[q] = (hi ? v[2 + q] : v[q]) + __shfl_xor_sync(FULL, send, 2);
    }
    const C send = odd ? keep[0] : keep[1];
    return (odd ? keep[1] : keep[0]) + __shfl_xor_sync(FULL, send, 1);
}

/* The FFMA row product: each lane multiplies its own entries (two rows, 2 NT keys each) into four output
 * columns at a time and the quad reduces them (quad_reduce_scatter), so no weight leaves the registers;
 * with `safe`, an entry whose bit in `in` (bit 4 n + e) is clear is skipped, never multiplied by its zero
 * weight (a masked key's non-finite row stays out: SPEC section 11). */
template <typename S, typename C, int NT>
__device__ __forceinline__ void row_ffma(C *O, int ldo, const C (&w)[NT][4], const C (&osc)[2], unsigned in,
                                         bool safe, Smem2D<S> X, int64_t f, int lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int64_t c0 = 0; c0 < f; c0 += 4) {
        C part[2][4];
        ASC_UNROLL
        for (int r = 0; r < 2; r++)
            ASC_UNROLL
            for (int q = 0; q < 4; q++) part[r][q] = (C)0;
        ASC_UNROLL
        for (int n = 0; n < NT; n++)
            ASC_UNROLL
            for (int e = 0; e < 4; e++) {
                if (safe && !((in >> (4 * n + e)) & 1u)) continue; /* a masked entry: skipped */
                const S *x = X.row(frag_col(lane, n, e)) + c0;
                ASC_UNROLL
                for (int q = 0; q < 4; q++)
                    if (c0 + q < f) part[e >> 1][q] += w[n][e] * (C)up(x[q]);
            }
        ASC_UNROLL
        for (int r = 0; r < 2; r++) {
            const C sum = quad_reduce_scatter(part[r], t);
            if (c0 + t < f) {
                C *o = O + (int64_t)(g + 8 * r) * ldo + c0 + t;
                *o = *o * osc[r] + sum;
            }
        }
    }
}

/* The row product of the element type's path (see above). */
template <typename T, int NT, bool SPLIT>
__device__ __forceinline__ void row_product(typename Elem<T>::C *O, int ldo, const typename Elem<T>::C (&w)[NT][4],
                                            const typename Elem<T>::C (&osc)[2], unsigned in, bool safe, Smem2D<T> X,
                                            int64_t f, int lane) {
    using C = typename Elem<T>::C;
    if constexpr (Elem<T>::kMma) {
        if (!safe) {
            row_mma<T, NT, SPLIT>(O, ldo, w, osc, X, (int)fpad_of<T>(f), lane);
            return;
        }
    }
    row_ffma<T, C, NT>(O, ldo, w, osc, in, safe, X, f, lane);
}

/* ---------------------------------------------------------------- column products */

/*
 * O (16 keys, fp32 in shared memory, stride ldo) += sum over the terms of W^T . Y over the QB queries of a step, for the
 * output features of the chunks f0, f0 + fstep, ... below fp (16 features each, fpad multiples): per term W a shared
 * [QB][keys] weight tile whose key columns kc .. kc + 15 are the 16 keys, Y a shared [QB][f] tile of the queries'
 * operand; Wlo, Ylo: their rounding errors (a split operand), or NULL; ws: the factor the weights were stored with
 * (range_scale: fp16 only; on bf16, whose weights are stored unscaled, the products are not scaled at all). The
 * key-major backward's dk, dv, dk^, dz_j, dh^_j; the terms of one output (dz_j has three) share one pass over O.
 */
template <typename T> struct ColTerm {
    Smem2D<T> W;
    const T *Wlo;
    float ws;
    Smem2D<T> Y;
    const T *Ylo;
};

template <typename T, int QB, int NTERM>
__device__ __forceinline__ void col_mma(float *O, int ldo, const ColTerm<T> (&terms)[NTERM], int kc, int f0, int fstep,
                                        int fp, int lane) {
    constexpr int KS = QB / 16;
    constexpr bool scaled = std::is_same<T, __half>::value; /* bf16: 16 multiplies by 1 fewer per chunk and term */
    if (f0 >= fp) return;
    /* matrices (queries 0-7, keys 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15) of W, transposed: A = W^T; of Y the
     * (queries, features) ones likewise: the lane's row and column in each */
    const int m = lane >> 3, wr = ((m >> 1) << 3) + (lane & 7), wc = kc + ((m & 1) << 3);
    const int yr = ((m & 1) << 3) + (lane & 7), yc = (m >> 1) << 3;
    ASC_NOUNROLL /* one or two chunks a call: nvcc unrolled it into static code the cost model counted twice */
    for (int f = f0; f < fp; f += fstep) {
        float c0[4], c1[4];
        frag_load(O, ldo, f, lane, scaled ? terms[0].ws : 1.0f, scaled ? terms[0].ws : 1.0f, c0, c1);
        ASC_UNROLL
        for (int i = 0; i < NTERM; i++) {
            const ColTerm<T> &x = terms[i];
            if (scaled && i > 0) { /* to the next term's weight scale: powers of two, exact */
                const float r = x.ws / terms[i - 1].ws;
                for (int e = 0; e < 4; e++) {
                    c0[e] *= r;
                    c1[e] *= r;
                }
            }
            ASC_UNROLL
            for (int k = 0; k < KS; k++) {
                uint32_t a[4], al[4], b[4];
                ldmatrix_x4_trans(a, x.W.row(16 * k + wr) + wc);
                if (x.Wlo) ldmatrix_x4_trans(al, x.Wlo + (16 * k + wr) * x.W.ld + wc);
                ldmatrix_x4_trans(b, x.Y.row(16 * k + yr) + f + yc);
                const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
                mma16816<T>(c0, a, b0);
                mma16816<T>(c1, a, b1);
                if (x.Wlo) { /* the weights' rounding errors times Y */
                    mma16816<T>(c0, al, b0);
                    mma16816<T>(c1, al, b1);
                }
                if (x.Ylo) {
                    ldmatrix_x4_trans(b, x.Ylo + (16 * k + yr) * x.Y.ld + f + yc);
                    const uint32_t l0[2] = {b[0], b[1]}, l1[2] = {b[2], b[3]};
                    mma16816<T>(c0, a, l0);
                    mma16816<T>(c1, a, l1);
                }
            }
        }
        frag_store(O, ldo, f, lane, scaled ? 1.0f / terms[NTERM - 1].ws : 1.0f, c0, c1);
    }
}

/* The same on the FFMA path (the chunks f0, f0 + fstep, ... of up to 16 features below fp, fp = f): lane (g, t) forms
 * keys g and g + 8, features f + 2t, f + 2t + 1 of each 8. */
template <typename S, typename C>
__device__ __forceinline__ void col_ffma(C *O, int ldo, Smem2D<S> W, int kc, int Q, Smem2D<S> Y, int64_t f0,
                                         int64_t fstep, int64_t fp, int lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int64_t ch = f0; ch < fp; ch += fstep) {
        const int64_t f1 = ch + 16 < fp ? ch + 16 : fp;
        for (int64_t f = ch + 2 * t; f < f1; f += 8)
            for (int r = 0; r < 2; r++) {
                const int key = kc + g + 8 * r;
                for (int64_t c = f; c < f + 2 && c < f1; c++) {
                    C s = 0;
                    for (int q = 0; q < Q; q++) s += (C)up(W.row(q)[key]) * (C)up(Y.row(q)[c]);
                    O[(int64_t)(g + 8 * r) * ldo + c] += s;
                }
            }
    }
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_TILE_CUH */
