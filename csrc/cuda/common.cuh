/*
 * common.cuh -- device helpers shared by the CUDA forward and backward (docs/cuda.md):
 * element types, warp reductions, the shared-memory layout, the key-tile loader, the
 * per-row setup and the per-(row, key) evaluation of SPEC section 4.
 *
 * A block holds NW warps; warp w owns query row i = blockIdx.x * NW + w of the
 * (batch, head) blockIdx.y. The block streams over key tiles of TK = 32 keys that every
 * warp shares (K, Z, H, V rows in shared memory, converted to the compute type C, with
 * their inverse norms); inside a tile lane l evaluates key j0 + l ("lane per key"), and
 * per-feature sums over the tile run "lane per feature" from a per-warp weight buffer.
 */
#ifndef ASCENDER_CUDA_COMMON_CUH
#define ASCENDER_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "ascender_cuda.h"
#include "../philox.h"
#include "mma.cuh"

/* The block's dynamic shared memory (`extern __shared__`) as `unsigned char name[]`; under the CPU
 * emulator (tests/cuda_emu, ASC_CUDA_EMU) a pointer to the block's own buffer of the launch's size. */
#ifdef ASC_CUDA_EMU
#define ASC_DYNAMIC_SMEM(name) unsigned char *const name = ::asc_emu::view()->dynamic_smem
#else
#define ASC_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace asc {

/* The epsilon constants of the seed module (SPEC section 4), from ascender.h. */
constexpr double EPS_TAU = ASC_EPS_TAU;
constexpr double EPS_STD = ASC_EPS_STD;
constexpr double EPS_NORM = ASC_EPS_NORM;
constexpr double EPS_HEADING = ASC_EPS_HEADING;

constexpr int TK = 32;  /* keys per tile: one per lane */
constexpr int NW = 4;   /* warps (query rows) per block */
constexpr unsigned FULL = 0xffffffffu;

/* ---------------------------------------------------------------- element types */

__device__ __forceinline__ float up(float x) { return x; }
__device__ __forceinline__ double up(double x) { return x; }
__device__ __forceinline__ float up(__half x) { return __half2float(x); }
__device__ __forceinline__ float up(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ void put(float *p, float v) { *p = v; }
__device__ __forceinline__ void put(double *p, double v) { *p = v; }
__device__ __forceinline__ void put(__half *p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* Column col of output row orow of rows32 (the compute-type copies of bf16 / fp16 calls: ascender.h), or NULL where the
 * call has none. */
template <typename F>
__device__ __forceinline__ F *rows32_at(const asc_params &p, F *rows32, int64_t orow, int64_t col = 0) {
    return rows32 ? rows32 + orow * ASC_ROWS32_WIDTH(&p) + col : nullptr;
}

__device__ __forceinline__ float fm(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fm(double a, double b, double c) { return fma(a, b, c); }
__device__ __forceinline__ float ex(float x) { return expf(x); }
__device__ __forceinline__ double ex(double x) { return exp(x); }
__device__ __forceinline__ float lg(float x) { return logf(x); }
__device__ __forceinline__ double lg(double x) { return log(x); }
__device__ __forceinline__ float sq(float x) { return sqrtf(x); }
__device__ __forceinline__ double sq(double x) { return sqrt(x); }
__device__ __forceinline__ float tnh(float x) { return tanhf(x); }
__device__ __forceinline__ double tnh(double x) { return tanh(x); }

template <typename C> __device__ __forceinline__ C inf_of() { return (C)INFINITY; }

template <typename C> __device__ __forceinline__ C sigmoid(C x) { return (C)1 / ((C)1 + ex(-x)); }

template <typename C> __device__ __forceinline__ C clamp01(C x) { return x < (C)0 ? (C)0 : (x > (C)1 ? (C)1 : x); }

/* max(x, 0) that keeps a NaN, as torch.clamp and torch.relu of the twin do (fmax and x > 0 ? x : 0 turn it
 * into 0, and a row that sees a non-finite input would come out finite: SPEC section 11); float by one
 * max.NaN instruction (mma.cuh) */
template <typename C> __device__ __forceinline__ C relu(C x) {
    if constexpr (std::is_same<C, float>::value) return relu_nan(x);
    else return x < (C)0 ? (C)0 : x;
}

/* x is neither NaN nor +-Inf (x - x is 0 only then) */
template <typename C> __device__ __forceinline__ bool finite(C x) { return x - x == (C)0; }

/* ---------------------------------------------------------------- warp reductions */

template <typename V> __device__ __forceinline__ V warp_sum(V v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

template <typename V> __device__ __forceinline__ V warp_max(V v) {
    for (int o = 16; o > 0; o >>= 1) {
        const V w = __shfl_xor_sync(FULL, v, o);
        v = w > v ? w : v;
    }
    return v;
}

template <typename V> __device__ __forceinline__ V warp_min(V v) {
    for (int o = 16; o > 0; o >>= 1) {
        const V w = __shfl_xor_sync(FULL, v, o);
        v = w < v ? w : v;
    }
    return v;
}

/* ---------------------------------------------------------------- the last block of a group */

/* Whether this block is the last of `count` blocks to call this with the same counter (zero before the first): every
 * thread of the block calls it, after its global writes that the last block reads; in the last block every thread then
 * sees the writes the other blocks made before their calls (mma.cuh's arrive). No block waits for another. */
__device__ __forceinline__ bool block_last(unsigned *counter, unsigned count) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) last = arrive(counter) + 1u == count;
    __syncthreads();
    return last;
}

/* 1 / max(||x||, 1e-12) from the sum of squares in A (double where the kernels sum a norm's squares in double). */
template <typename A> __device__ __forceinline__ A inv_norm(A ss) {
    const A n = sizeof(A) == 4 ? (A)sqrtf((float)ss) : (A)sqrt((double)ss);
    return (A)1 / (n > (A)EPS_NORM ? n : (A)EPS_NORM);
}

/* 1 / max(||x||, 1e-12) of a row of f values (global T or shared C), by the whole warp; the norm in
 * double, like the CPU kernels' asc_inv_norm, so that float32 rows up to ~1e150 do not overflow it. */
template <typename C, typename P>
__device__ __forceinline__ C warp_inv_norm(const P *x, int64_t f, int lane) {
    double ss = 0;
    for (int64_t c = lane; c < f; c += 32) {
        const double v = (double)up(x[c]);
        ss += v * v;
    }
    return (C)inv_norm(warp_sum(ss));
}

/* The same by one thread, the squares summed in order. */
template <typename C, typename P> __device__ __forceinline__ C thread_inv_norm(const P *x, int64_t f) {
    double ss = 0;
    for (int64_t c = 0; c < f; c++) {
        const double v = (double)up(x[c]);
        ss += v * v;
    }
    return (C)inv_norm(ss);
}

/* ---------------------------------------------------------------- shared-memory layout */

/* Offsets in elements of C from the start of dynamic shared memory; the neighbour index
 * lists (int64, [NW][n_nbr]) follow the C region at byte offset nidx. */
struct Layout {
    int ldk, ldv, ldz, ldh;            /* padded row lengths of the tiles (f + 1) */
    long Ks, Vs, Zs, Hs, rk;           /* key tile [TK][ld*] (Hs: h^, unit rows), 1/||k_j|| [TK] */
    long cK, cKh, cV, cZ, cH;          /* backward: column gradient buffers [TK][ld*] */
    long wbase, wstride;               /* per-warp region */
    long q, u, m, dq, du, zt, c, accz, dzt, dc, ht, dht, dy, accv, wbuf, nval; /* in the warp region */
    long nidx;                         /* byte offset */
    long bytes;
};

inline Layout make_layout(const asc_params &p, long csize, bool backward) {
    Layout L;
    long o = 0;
    auto take = [&](long n) { const long at = o; o += n; return at; };
    L.ldk = (int)p.d + 1;
    L.ldv = (int)p.dv + 1;
    L.ldz = (int)p.dz + 1;
    L.ldh = (int)p.da + 1;
    L.Ks = take((long)TK * L.ldk);
    L.Vs = take((long)TK * L.ldv);
    L.Zs = take((long)TK * L.ldz);
    L.Hs = take((long)TK * L.ldh);
    L.rk = take(TK);
    L.cK = L.cKh = L.cV = L.cZ = L.cH = -1;
    if (backward) {
        L.cK = take((long)TK * L.ldk);
        L.cKh = take((long)TK * L.ldk);
        L.cV = take((long)TK * L.ldv);
        L.cZ = take((long)TK * L.ldz);
        L.cH = take((long)TK * L.ldh);
    }
    long w = 0;
    auto wtake = [&](long n) { const long at = w; w += n; return at; };
    L.q = wtake(p.d);
    L.u = wtake(p.d);
    L.m = wtake(p.d);
    L.dq = wtake(p.d);
    L.du = wtake(p.d);
    L.zt = wtake(p.dz);
    L.c = wtake(p.dz);
    L.accz = wtake(p.dz);
    L.dzt = wtake(p.dz);
    L.dc = wtake(p.dz);
    L.ht = wtake(p.da);
    L.dht = wtake(p.da);
    L.dy = wtake(p.dv);
    L.accv = wtake(p.dv);
    L.wbuf = wtake(4 * TK);
    L.nval = wtake(p.n_nbr);
    L.wstride = w;
    L.wbase = take((long)NW * w);
    const long cbytes = o * csize;
    L.nidx = (cbytes + 7) / 8 * 8;
    L.bytes = L.nidx + (long)NW * (long)p.n_nbr * 8;
    return L;
}

/* ---------------------------------------------------------------- one query row */

/* A window, global tokens or documents restrict which keys a row sees (SPEC section 8). */
__host__ __device__ inline bool structured(const asc_params &p, const asc_fwd_args &a) {
    return p.window_left >= 0 || p.window_right >= 0 || p.n_global > 0 || a.global_mask || a.document_ids;
}

/* Everything a warp knows about its row (warp-uniform values, in every lane). */
template <typename T, typename C>
struct Row {
    /* problem */
    int64_t N, d, dv, dz, da;
    bool paper, causal, mask_stats;
    C scale, nis, nic, delta, itemp, slope;
    const uint8_t *kpm; /* key_padding_mask row of batch b, or NULL */
    const uint8_t *am;  /* attn_mask row (b, h, i), or NULL */
    int64_t am_sj;
    const T *ab;        /* attn_bias row (b, h, i), or NULL */
    int64_t ab_sj;
    /* structured visibility (SPEC section 8): window, global tokens, documents */
    bool structured;    /* one of them restricts J(i) (a grid-uniform flag) */
    int64_t win_l, win_r, n_global;
    const uint8_t *glob; /* global_mask row of batch b, or NULL */
    const int64_t *doc;  /* document_ids row of batch b, or NULL */
    bool scores;        /* paper variant with neighbours = "scores": the top-k ranks s_ij, not a_ij */
    C cap, icap;        /* softcap / (score_temp + 1e-6) and its inverse (SPEC section 9); 0 without one */
    bool outside;       /* the cap leaves beta_other (attn_bias, ALiBi) out: it is added after the cap */
    /* attention dropout (SPEC section 9b): the (b, h)'s Philox stream, the threshold of a kept pair and
     * 1 / (1 - p); dropout = false: every pair kept with weight 1 */
    bool dropout;
    asc_dropout_stream drop;
    uint32_t drop_thr;
    C drop_scale;
    /* the row */
    int64_t i, t, jend; /* query row, its token t = i + N - Nq - keys_after, keys j < jend */
    bool active;        /* i < Nq */
    bool tglob;         /* t is a global token: the row sees every key (of its document) */
    int64_t tdoc;       /* document_ids of t (0 without documents) */
    C *q, *u, *zt, *ht, *c; /* per-warp shared vectors: q_i, u_i, z_t, h^_t (unit), c_i */
    /* the raw bias rows are theta_X * w_X,j with w = (r, phi, rcq); mu, sd: moments of w
     * over the statistics set; wn = omega_X / (|theta_X| sd_X + 1e-6), 0 when n_i <= 1 */
    C mu[3], sd[3], theta[3], wn[3];
};

/* Token j is global: below global_tokens or marked in global_mask (SPEC section 8). */
template <typename T, typename C>
__device__ __forceinline__ bool is_global(const Row<T, C> &r, int64_t j) {
    return j < r.n_global || (r.glob && r.glob[j]);
}

/* Per-head learnable scalars in SPEC order (asc_fwd_args). */
enum { SC_LA = 0, SC_LS, SC_LC, SC_OA, SC_OS, SC_OC, SC_TEMP, SC_DELTA, SC_KAPPA };

template <typename T, typename C>
__device__ __forceinline__ C head_scalar(const asc_fwd_args &a, int s, int64_t hd) {
    const void *ptrs[9] = {a.lambda_align, a.lambda_sep, a.lambda_coh, a.omega_align, a.omega_sep,
                           a.omega_coh,    a.score_temp, a.delta,      a.kappa};
    return (C)up(((const T *)ptrs[s])[ASC_SCALAR_HEAD(&a, s, hd)]);
}

/*
 * Fills the problem part of r and the row part for query row i of (b, hd); loads q_i, z_t,
 * h_t into the warp's shared vectors (lane per feature) and computes 1/||h_t||.
 */
template <typename T, typename C>
__device__ void setup_row(Row<T, C> &r, const asc_params &p, const asc_fwd_args &a, C *wsm, const Layout &L,
                          int64_t b, int64_t hd, int64_t i, int lane) {
    r.N = p.N; r.d = p.d; r.dv = p.dv; r.dz = p.dz; r.da = p.da;
    r.paper = p.variant == ASC_VARIANT_PAPER;
    r.causal = p.is_causal != 0;
    r.mask_stats = p.mask_stats != 0;
    r.scale = (C)p.scale;
    r.nis = (C)(-1.0 / (p.tau_sep + EPS_TAU));
    r.nic = (C)(-1.0 / (p.tau_coh + EPS_TAU));
    r.delta = head_scalar<T, C>(a, SC_DELTA, hd);
    r.itemp = (C)1 / (head_scalar<T, C>(a, SC_TEMP, hd) + (C)EPS_TAU);
    r.slope = a.alibi_slopes ? (C)up(((const T *)a.alibi_slopes)[b * p.H + hd]) : (C)0; /* [B, H] */
    r.kpm = a.key_padding_mask ? a.key_padding_mask + b * p.N : nullptr;
    r.am = a.attn_mask ? a.attn_mask + b * p.am_sb + hd * p.am_sh + i * p.am_si : nullptr;
    r.am_sj = p.am_sj;
    r.ab = a.attn_bias ? (const T *)a.attn_bias + b * p.ab_sb + hd * p.ab_sh + i * p.ab_si : nullptr;
    r.ab_sj = p.ab_sj;
    r.structured = structured(p, a);
    r.win_l = p.window_left;
    r.win_r = p.window_right;
    r.n_global = p.n_global;
    r.glob = a.global_mask ? a.global_mask + b * p.N : nullptr;
    r.doc = a.document_ids ? a.document_ids + b * p.N : nullptr;
    r.scores = r.paper && p.neighbours == ASC_NEIGHBOURS_SCORES;
    r.cap = p.softcap > 0 ? (C)p.softcap * r.itemp : (C)0;
    r.icap = p.softcap > 0 ? (C)1 / r.cap : (C)0;
    r.outside = p.softcap_outside != 0;
    r.dropout = a.dropout_seed != nullptr;
    r.drop = r.dropout ? asc_dropout_stream_of(a.dropout_seed, b * p.H + hd) : asc_dropout_stream{0, 0, 0, 0, 0};
    r.drop_thr = p.dropout_threshold;
    r.drop_scale = (C)p.dropout_scale;
    r.i = i;
    r.t = i + p.N - p.Nq - p.keys_after;
    r.active = i < p.Nq;
    r.tglob = r.active && is_global(r, r.t);
    r.tdoc = r.active && r.doc ? r.doc[r.t] : 0;
    r.jend = !r.active ? 0 : ((r.causal && r.mask_stats) ? r.t + 1 : p.N);
    r.q = wsm + L.q;
    r.u = wsm + L.u;
    r.zt = wsm + L.zt;
    r.ht = wsm + L.ht;
    r.c = wsm + L.c;
    for (int x = 0; x < 3; x++) r.mu[x] = r.sd[x] = r.theta[x] = r.wn[x] = (C)0;
    if (!r.active) return;
    const int64_t bh = b * p.H + hd;
    const T *qi = (const T *)a.q + (bh * p.Nq + i) * p.d;
    const T *zt = (const T *)a.z + (bh * p.N + r.t) * p.dz;
    const T *ht = (const T *)a.h + (bh * p.N + r.t) * p.da;
    for (int64_t f = lane; f < p.d; f += 32) r.q[f] = (C)up(qi[f]);
    for (int64_t f = lane; f < p.dz; f += 32) r.zt[f] = (C)up(zt[f]);
    const C rht = warp_inv_norm<C>(ht, p.da, lane);
    for (int64_t f = lane; f < p.da; f += 32) r.ht[f] = (C)up(ht[f]) * rht; /* h^_t: the affinity is formed */
    __syncwarp();                                                           /* from unit rows, never raw h */
}

/*
 * The row coefficients once rho, the gates and the moments of w are known:
 * theta = (lambda_align gate_a, -lambda_sep eta, -lambda_coh gate_c / tc) and wn.
 * Shared by forward and backward so that both see the same values.
 */
template <typename T, typename C>
__device__ __forceinline__ void row_coefficients(Row<T, C> &r, const asc_fwd_args &a, int64_t hd, C eta, C gate_a,
                                                 C gate_c, C tcoh, int64_t n_stat) {
    r.theta[0] = head_scalar<T, C>(a, SC_LA, hd) * gate_a;
    r.theta[1] = -head_scalar<T, C>(a, SC_LS, hd) * eta;
    r.theta[2] = -head_scalar<T, C>(a, SC_LC, hd) * gate_c / tcoh;
    for (int x = 0; x < 3; x++) {
        const C th = r.theta[x] < (C)0 ? -r.theta[x] : r.theta[x];
        /* n <= 1: the normalized row is 0, and omega 0 (a NaN omega makes the row NaN: SPEC section 11) */
        const C omega = head_scalar<T, C>(a, SC_OA + x, hd);
        r.wn[x] = n_stat > 1 ? omega / (th * r.sd[x] + (C)EPS_STD) : omega * (C)0;
    }
}

/* ---------------------------------------------------------------- key tiles */

/*
 * Loads keys j0 .. j0 + TK - 1 of (batch, head) bh into the block's tiles (zeros past N)
 * with 1/||k_j|| and h normalized in place (h^); every thread of the block calls it; ends with a barrier.
 */
template <typename T, typename C>
__device__ void load_tile(C *sm, const Layout &L, const asc_params &p, const asc_fwd_args &a, int64_t bh,
                          int64_t j0, bool need_v) {
    const int tid = threadIdx.x, nthr = blockDim.x;
    auto fill = [&](const T *src, int64_t f, int ld, C *dst) {
        const T *base = src + (bh * p.N + j0) * f;
        const int64_t tot = (int64_t)TK * f;
        for (int64_t e = tid; e < tot; e += nthr) {
            const int64_t jj = e / f, c = e - jj * f;
            dst[jj * ld + c] = j0 + jj < p.N ? (C)up(base[e]) : (C)0;
        }
    };
    fill((const T *)a.k, p.d, L.ldk, sm + L.Ks);
    fill((const T *)a.z, p.dz, L.ldz, sm + L.Zs);
    fill((const T *)a.h, p.da, L.ldh, sm + L.Hs);
    if (need_v) fill((const T *)a.v, p.dv, L.ldv, sm + L.Vs);
    __syncthreads();
    /* a thread per key, as the passes read the tile (a lane per key): 1 / ||k_j||, and h_j scaled to h^_j. By
     * the warp, two norms a key cost 80 shuffles a warp and tile (10 a key), which made most of the float64
     * kernels' warp collectives under the emulator (docs/cuda.md, "Verification on every commit") */
    for (int jj = tid; jj < TK; jj += nthr) {
        C *hj = sm + L.Hs + (long)jj * L.ldh;
        const C rh = thread_inv_norm<C>(hj, p.da);
        for (int64_t f = 0; f < p.da; f++) hj[f] *= rh; /* the tile holds h^ */
        sm[L.rk + jj] = thread_inv_norm<C>(sm + L.Ks + (long)jj * L.ldk, p.d);
    }
    __syncthreads();
}

/* Keys of the tile at j0 below the row's jend: the backward's per-feature tile sums stop there (and
 * skip the zero weights below it). A key at or past jend (a future token of a causal row with
 * mask_stats) has weight 0, but its row in the tile holds its real values, and 0 times a NaN or Inf
 * there is NaN: the CPU kernels never read those keys, and a non-finite value must reach only the
 * rows that can see it (SPEC section 11). */
template <typename T, typename C>
__device__ __forceinline__ int tile_keys(const Row<T, C> &r, int64_t j0) {
    return r.jend - j0 < TK ? (int)(r.jend - j0) : TK;
}

/* The forward's per-feature tile sums run over the members of a set only: bit jj for key j0 + jj
 * (lane jj's key) when `in` (j in T(i) for the centroid, j in J(i) for the output), a warp-uniform
 * mask; the sum visits its set bits in key order (for (m = ...; m; m &= m - 1), jj = __ffs(m) - 1).
 * A key outside -- padded, masked, or past jend -- has weight 0, but its row in the tile holds its real
 * values: it is skipped, never multiplied by zero (0 x NaN = NaN would put a NaN of a key no row may
 * see into every row of the tile, SPEC section 11), as the CPU kernels select it away. Whole warp. */
__device__ __forceinline__ unsigned tile_members(bool in) { return __ballot_sync(FULL, in); }

/* ---------------------------------------------------------------- one (row, key) pair */

template <typename C>
struct Key {
    bool allow, instat; /* j in J(i); j in the statistics set T(i) */
    C D, a, ws, wc;     /* stage 1 */
    C s, w[3];          /* stage 2: scale q.k_j and w = (r_j = k^_j.u, phi_j, ||z_j - c||^2) */
    C x;                /* stage 3: S_ij / (score_temp + 1e-6), softcapped */
    C xo;               /* stage 3: the part of x past an outside cap, beta_other / (score_temp + 1e-6); 0 inside */
    C keep;             /* stage 3: m_ij / (1 - p) of dropout (0 or 1 / (1 - p)), 1 without dropout */
};

/* Token t sees key j through its window or a global token (j, or t itself), within its document
 * (SPEC section 8; asc_visible of the CPU kernels). */
template <typename T, typename C>
__device__ __forceinline__ bool visible(const Row<T, C> &r, int64_t j) {
    const bool near = (r.win_l < 0 || j >= r.t - r.win_l) && (r.win_r < 0 || j <= r.t + r.win_r);
    return (near || r.tglob || is_global(r, j)) && (!r.doc || r.doc[j] == r.tdoc);
}

/* j in J(i): causal, padding, attn_mask and the structured visibility (j < N). */
template <typename T, typename C>
__device__ __forceinline__ bool key_allowed(const Row<T, C> &r, int64_t j) {
    if (r.causal && j > r.t) return false;
    if (r.kpm && r.kpm[j]) return false;
    if (r.am && !r.am[j * r.am_sj]) return false;
    return !r.structured || visible(r, j);
}

/*
 * Key j = j0 + jj of the current tile for row r, up to `stage` (1: geometry, 2: bias
 * ingredients, 3: the score). Not inlined on purpose: every pass that re-evaluates a key
 * runs this same code, so the values agree to the bit between passes (the shifted moments
 * rely on it: a constant bias row gets exactly zero deviation). Invalid keys (j >= jend,
 * or an inactive row) come back with allow = instat = false and zeros.
 */
template <typename T, typename C>
__device__ __noinline__ Key<C> eval_key(const Row<T, C> &r, const C *sm, const Layout &L, int jj, int64_t j,
                                        int stage) {
    Key<C> e;
    e.allow = e.instat = false;
    e.D = e.a = e.ws = e.wc = e.s = e.x = e.xo = e.keep = (C)0;
    e.w[0] = e.w[1] = e.w[2] = (C)0;
    if (!r.active || j >= r.jend) return e;
    const C *kj = sm + L.Ks + (long)jj * L.ldk;
    const C *zj = sm + L.Zs + (long)jj * L.ldz;
    const C *hj = sm + L.Hs + (long)jj * L.ldh;
    e.allow = key_allowed(r, j);
    e.instat = r.mask_stats ? e.allow : true;
    C D = 0, ah = 0;
    for (int64_t f = 0; f < r.dz; f++) {
        const C df = r.zt[f] - zj[f];
        D += df * df;
    }
    for (int64_t f = 0; f < r.da; f++) ah += r.ht[f] * hj[f]; /* h^_t . h^_j: scale-free in h */
    e.D = D;
    e.a = ah;
    e.ws = e.instat ? ex(D * r.nis) : (C)0;
    e.wc = e.instat ? ex(D * r.nic) : (C)0;
    if (stage >= 2 || r.scores) { /* s_ij, the neighbours' ranking with neighbours = "scores" */
        C s = 0;
        for (int64_t f = 0; f < r.d; f++) s += r.q[f] * kj[f];
        e.s = r.scale * s;
    }
    if (stage < 2) return e;
    C ru = 0, rc = 0;
    for (int64_t f = 0; f < r.d; f++) ru += r.u[f] * kj[f];
    for (int64_t f = 0; f < r.dz; f++) {
        const C df = zj[f] - r.c[f];
        rc += df * df;
    }
    const C red = e.a - r.delta;
    e.w[0] = ru * sm[L.rk + jj];
    e.w[1] = e.instat ? e.ws * relu(red) : (C)0; /* outside T(i) selected: h_j there may be non-finite */
    e.w[2] = rc;
    if (stage < 3) return e;
    C S = e.s, ob = 0; /* ob: beta_other */
    for (int x = 0; x < 3; x++) S += r.wn[x] * (r.theta[x] * (e.w[x] - r.mu[x]));
    if (r.ab) ob += (C)up(r.ab[j * r.ab_sj]);
    ob -= r.slope * (C)(r.t > j ? r.t - j : j - r.t);
    if (!r.outside) S += ob;
    e.x = S * r.itemp;
    if (r.cap != (C)0) e.x = r.cap * tnh(e.x * r.icap); /* softcap: S' = c tanh(S / c), x = S' / (temp + 1e-6) */
    e.xo = r.outside ? ob * r.itemp : (C)0;          /* outside: beta_other after the cap (SPEC section 9) */
    e.x += e.xo;
    e.keep = !r.dropout ? (C)1 : (asc_dropout_keep(r.drop, r.t, j, r.drop_thr) ? r.drop_scale : (C)0);
    return e;
}

/* ---------------------------------------------------------------- top-k and the heading */

/* asc_topk_push of csrc/cpu/ascender_cpu.h: insertion into a list sorted by descending
 * value; ties keep the lower index first. Returns the new count. I: the index type of the list
 * (int64_t here, int32_t in the tiled kernels' scratch). */
template <typename C, typename I>
__device__ int64_t topk_push(I *idx, C *val, int64_t count, int64_t n_max, int64_t j, C a) {
    if (n_max == 0) return 0;
    if (count == n_max) {
        if (!(a > val[count - 1])) return count;
        count--;
    }
    int64_t pos = count;
    while (pos > 0 && val[pos - 1] < a) {
        idx[pos] = idx[pos - 1];
        val[pos] = val[pos - 1];
        pos--;
    }
    idx[pos] = (I)j;
    val[pos] = a;
    return count + 1;
}

/*
 * Paper heading from the neighbour list (cnt entries of idx): m = sum_l k^_l (into the
 * warp's m), u = m / max(||m||, 1e-12) (0 if m = 0) into r.u, ||m||, and the alignment gate
 * sigma(alpha_align * mean_l ||k^_l - m / cnt||^2). Whole warp, lane per feature.
 */
template <typename T, typename C>
__device__ void paper_heading(const Row<T, C> &r, const T *kb, const int64_t *idx, int64_t cnt, C *m,
                              double alpha_align, int lane, C *unorm, C *gate_a) {
    for (int64_t f = lane; f < r.d; f += 32) m[f] = (C)0;
    for (int64_t n = 0; n < cnt; n++) {
        const T *kl = kb + idx[n] * r.d;
        const C rkl = warp_inv_norm<C>(kl, r.d, lane);
        for (int64_t f = lane; f < r.d; f += 32) m[f] += (C)up(kl[f]) * rkl;
    }
    C ss = 0;
    for (int64_t f = lane; f < r.d; f += 32) ss += m[f] * m[f];
    const C un = sq(warp_sum(ss));
    const bool heading = un > (C)EPS_HEADING * (C)cnt; /* u = 0 where the unit keys cancel to rounding */
    for (int64_t f = lane; f < r.d; f += 32) r.u[f] = heading ? m[f] / un : (C)0;
    C var = 0;
    if (cnt > 0) {
        for (int64_t n = 0; n < cnt; n++) {
            const T *kl = kb + idx[n] * r.d;
            const C rkl = warp_inv_norm<C>(kl, r.d, lane);
            for (int64_t f = lane; f < r.d; f += 32) {
                const C dev = (C)up(kl[f]) * rkl - m[f] / (C)cnt;
                var += dev * dev;
            }
        }
        var = warp_sum(var) / (C)cnt;
    }
    *unorm = un;
    *gate_a = sigmoid((C)alpha_align * var);
    __syncwarp();
}

/* Reference heading u = k^_t. */
template <typename T, typename C>
__device__ void reference_heading(const Row<T, C> &r, const T *kb, int lane) {
    const T *kt = kb + r.t * r.d;
    const C rkt = warp_inv_norm<C>(kt, r.d, lane);
    for (int64_t f = lane; f < r.d; f += 32) r.u[f] = (C)up(kt[f]) * rkt;
    __syncwarp();
}

/* Largest of the block's warp-uniform values, at least 0 (every thread calls it; contains barriers). */
__device__ inline int64_t block_max(int64_t of_warp) {
    __shared__ int64_t js[NW];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) js[w] = of_warp;
    __syncthreads();
    int64_t mx = 0;
    for (int k = 0; k < NW; k++) mx = js[k] > mx ? js[k] : mx;
    return mx;
}

/* ---------------------------------------------------------------- the key tiles a block visits */

/* Tiles of TK keys over N keys. */
__host__ __device__ inline int64_t n_tiles(int64_t N) { return (N + TK - 1) / TK; }

/*
 * Which key tiles a block's rows may see through their windows and the global tokens (SPEC section 8,
 * asc_next_tile of the CPU kernels): block-uniform. A windowed block without a global row visits the
 * tiles of its window keys [lo, hi) and those holding a global key, O(w + g) keys, not every tile.
 */
struct Span {
    bool structured;      /* a pair may be invisible: a tile without any visible pair is skipped */
    bool jump;            /* a window and no global row: tiles outside [lo, hi) without a global key are skipped */
    int64_t lo, hi;       /* the window keys of the block's rows */
    int64_t N, n_global;
    const int32_t *gtile; /* batch b's row of global_tiles, or NULL (no global_mask) */
};

__device__ inline Span make_span(const asc_params &p, const asc_fwd_args &a, const int32_t *gtile, int64_t b) {
    Span s;
    const int64_t i0 = (int64_t)blockIdx.x * NW, i1 = i0 + NW < p.Nq ? i0 + NW : p.Nq;
    const int64_t t0 = i0 + p.N - p.Nq - p.keys_after, tlast = t0 + (i1 - 1 - i0);
    bool global_row = t0 < p.n_global;
    if (a.global_mask)
        for (int64_t t = t0; t <= tlast; t++) global_row |= a.global_mask[b * p.N + t] != 0;
    s.structured = structured(p, a);
    s.jump = (p.window_left >= 0 || p.window_right >= 0) && !global_row;
    s.lo = p.window_left < 0 ? 0 : t0 - p.window_left;
    s.hi = p.window_right < 0 ? p.N : tlast + p.window_right + 1;
    s.N = p.N;
    s.n_global = p.n_global;
    s.gtile = gtile ? gtile + b * (n_tiles(p.N) + 1) : nullptr;
    return s;
}

/* The first tile at or after j0 (a multiple of TK) that holds a window key or a global key of the
 * block (N: none left); j0 itself when the block does not jump. */
__device__ inline int64_t window_tile(const Span &s, int64_t j0) {
    if (!s.jump || j0 >= s.N || (j0 + TK > s.lo && j0 < s.hi)) return j0;
    int64_t next = s.gtile ? (int64_t)s.gtile[j0 / TK] * TK : (j0 < s.n_global ? j0 : s.N);
    if (j0 < s.lo && s.lo < next) next = s.lo;
    return next >= s.N ? s.N : next / TK * TK;
}

/* The next tile at or after j0 that some row of the block sees a key of (>= jmax: none): window_tile's,
 * and of those, with structured visibility, the first with a pair in some J(i) = T(i) (not a tile of
 * other documents only, of the window's edges outside every row's window, of padding, ...). Every
 * thread of the block calls it with the same j0: the result is block-uniform (with structured
 * visibility it contains barriers). The passes over the keys visit exactly these tiles. */
template <typename T, typename C>
__device__ int64_t next_tile(const Span &s, const Row<T, C> &r, int64_t j0, int64_t jmax, int lane) {
    for (j0 = window_tile(s, j0); s.structured && j0 < jmax; j0 = window_tile(s, j0 + TK)) {
        const int64_t j = j0 + lane;
        if (block_max(__any_sync(FULL, r.active && j < r.jend && key_allowed(r, j)))) break;
    }
    return j0;
}

/* gtile[b][T], T <= n_tiles(N): the first tile at or after T that holds a global key (j < global_tokens or
 * global_mask[b, j]), n_tiles(N) if none, so that a windowed block finds the next global key in O(1). One
 * warp per batch, 32 tiles a step from the last. */
static __global__ void __launch_bounds__(32) global_tiles_kernel(const asc_params p, const uint8_t *gmask,
                                                                 int32_t *gtile) {
    const int lane = threadIdx.x;
    const int64_t b = blockIdx.x, nt = n_tiles(p.N);
    const uint8_t *g = gmask + b * p.N;
    int32_t *out = gtile + b * (nt + 1);
    int32_t after = (int32_t)nt; /* the first global tile past the current 32 */
    if (lane == 0) out[nt] = (int32_t)nt;
    for (int64_t c0 = (nt - 1) / 32 * 32; c0 >= 0; c0 -= 32) {
        const int64_t tile = c0 + lane;
        bool has = false;
        for (int64_t j = tile * TK; tile < nt && j < (tile + 1) * TK && j < p.N; j++) has |= j < p.n_global || g[j];
        const unsigned bits = __ballot_sync(FULL, has), here = bits & (FULL << lane);
        if (tile < nt) out[tile] = here ? (int32_t)(c0 + __ffs((int)here) - 1) : after;
        if (bits) after = (int32_t)(c0 + __ffs((int)bits) - 1);
    }
}

/* ---------------------------------------------------------------- host side */

/* The launchers' scratch memory, stream-ordered: the pair set by ascender_cuda_set_scratch (ascender_fwd.cu), or
 * cudaMallocAsync / cudaFreeAsync. */
extern "C" asc_cuda_alloc_fn asc_cuda_scratch_alloc;
extern "C" asc_cuda_free_fn asc_cuda_scratch_free;
template <typename P> inline cudaError_t scratch_alloc(P **p, size_t bytes, cudaStream_t stream) {
    void *v = nullptr;
    const cudaError_t e = asc_cuda_scratch_alloc ? asc_cuda_scratch_alloc(&v, bytes, stream)
                                                 : cudaMallocAsync(&v, bytes, stream);
    *p = static_cast<P *>(v);
    return e;
}
inline cudaError_t scratch_free(void *p, cudaStream_t stream) {
    return asc_cuda_scratch_free ? asc_cuda_scratch_free(p, stream) : cudaFreeAsync(p, stream);
}

/* Static shared memory of the kernels (block_max, the backward's scalar sums). */
constexpr long STATIC_SMEM = 1024;

/* The dynamic shared memory a block of the current device may opt in to, less the static STATIC_SMEM. */
inline cudaError_t smem_budget(long *budget) {
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    *budget = e == cudaSuccess ? (long)optin - STATIC_SMEM : -1;
    return e;
}

/* Whether a kernel with `bytes` of dynamic shared memory can run on the current device (the dispatch's
 * question: ascender_cuda_fits). */
inline bool smem_fits(long bytes) {
    long budget;
    return smem_budget(&budget) == cudaSuccess && bytes <= budget;
}

/* The blocks of `kernel` (`threads` each, `bytes` of dynamic shared memory) that the current device holds at once: its
 * SMs times the blocks an SM holds by the runtime's occupancy calculator (registers, shared memory, the per-SM limits);
 * `fallback` where the runtime cannot say (or says none). A launch sized for one device takes two waves on another: an
 * H100 has 132 SMs, an A100 108, smaller cards 30 to 80. The runtime counts the kernel's static shared memory itself;
 * `bytes` is the launch's dynamic shared memory, which the caller has let the kernel use first (prepare_smem: asked
 * for more than the kernel may launch with, the calculator says none and the fallback holds). */
template <typename K> inline int64_t device_wave(K *kernel, int threads, long bytes, int64_t fallback) {
    int dev = 0, sms = 0, per = 0;
    const bool known = cudaGetDevice(&dev) == cudaSuccess &&
                       cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
                       cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, reinterpret_cast<const void *>(kernel),
                                                                     threads, (size_t)bytes) ==
                           cudaSuccess;
    if (known && sms > 0 && per > 0) return (int64_t)sms * per;
    if (!known) (void)cudaGetLastError(); /* the failed query's error is not the call's */
    return fallback;
}

/* Lets `kernel` use `bytes` of dynamic shared memory (opt-in above 48 KiB); an error when
 * the device has less (very large feature sizes or k_neighbors: the dispatch asks smem_fits first). */
template <typename K>
inline cudaError_t prepare_smem(K *kernel, long bytes) {
    long budget;
    const cudaError_t e = smem_budget(&budget);
    if (e != cudaSuccess) return e;
    if (bytes > budget) return cudaErrorInvalidValue;
    if (bytes > 48 * 1024) return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    return cudaSuccess;
}

/* The blocks of `bytes` of dynamic shared memory and `fixed` of static that an SM of the current device holds by its
 * shared memory alone (the runtime's reservation per block counted); 0 where the runtime cannot say (its error
 * cleared: it is not the call's). */
inline int smem_blocks(long bytes, long fixed) {
    int dev = 0, per_sm = 0, reserved = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return (int)(per_sm / (bytes + fixed + reserved));
}

/* The warps per SM of a row kernel's shape: `nw` warps a block, as many blocks as an SM holds by its shared memory
 * (smem_blocks) and by registers (these kernels compile to 250-255 registers a thread on the mma path: ptxas, 8,192 a
 * warp of the 65,536), none where a block does not fit the device at all (smem_fits). */
inline int shape_warps(long bytes, long fixed, int nw) {
    if (!smem_fits(bytes)) return 0;
    const int by_regs = 65536 / (8192 * nw), by_smem = smem_blocks(bytes, fixed);
    return nw * (by_regs < by_smem ? by_regs : by_smem);
}

/* Whether a row kernel runs its shape for wide heads (Tiles<T>::RowW, B1W: three warps for four; B2rW: two for three)
 * instead of its standard one, given the dynamic shared memory of each: where the wide shape gives an SM more warps.
 * At d = dv = 128 (seed) on an H100 the standard block is alone on its SM by shared memory and two wide ones fit (6
 * warps against 4; B2r 4 against 3); at d = 64 the standard shapes have more (8 against 6); where the standard block
 * does not fit the device at all (d = 256 on an H100, the paper variant at d = 128 on an A100) the wide one is the
 * tiled kernel's only shape. Shared memory and a fixed register count, not the runtime's occupancy calculator: the
 * emulator's knows neither registers nor a kernel's static shared memory, and it must choose as the GPU does (its
 * grid and the cost model run the kernel a GPU would). The static memory (320 bytes in these kernels) is taken as none
 * for the standard block and as STATIC_SMEM for the wide one: wide only where it surely gives more warps. */
inline bool wide_rows(long standard_bytes, int standard_warps, long wide_bytes, int wide_warps) {
    return shape_warps(wide_bytes, STATIC_SMEM, wide_warps) > shape_warps(standard_bytes, 0, standard_warps);
}

/* A row kernel's choice between its standard shape Std and its shape for wide heads Wide (the same type where the
 * element type has one shape: the FFMA path), given their shared memory: whether it runs Wide (wide_rows), and whether
 * either fits the device. */
template <class Std, class Wide> bool runs_wide(long standard_bytes, long wide_bytes) {
    return !std::is_same<Std, Wide>::value && wide_rows(standard_bytes, Std::NW, wide_bytes, Wide::NW);
}
template <class Std, class Wide> bool shape_fits(long standard_bytes, long wide_bytes) {
    return smem_fits(standard_bytes) || (!std::is_same<Std, Wide>::value && smem_fits(wide_bytes));
}

/* The dynamic shared memory of a kernel's two shapes: its layout Smem<T, Std> and Smem<T, Wide> placed for the call
 * (extra: the further arguments of their place). */
template <template <typename, class> class Smem, typename T, class Std, class Wide, typename... X>
void shape_bytes(const asc_params &p, long *standard, long *wide, X... extra) {
    Smem<T, Std> s;
    Smem<T, Wide> w;
    s.place(nullptr, p, extra...);
    w.place(nullptr, p, extra...);
    *standard = (long)s.bytes;
    *wide = (long)w.bytes;
}

/* dx = direct + backward of x^ = x / max(||x||, 1e-12) for the incoming dx^ (zero gradient at x = 0; nothing
 * without an incoming gradient, whose x may be non-finite: SPEC section 11), stored in T. By a warp, for the
 * row-per-warp and the tiled backward; the norm and the projection in double, like the CPU kernels'
 * asc_normalize_backward (no overflow for rows up to ~1e150). */
template <typename T, typename C>
__device__ void normalize_backward_store(T *out, const C *direct, const T *x, const C *dxh, int64_t f, int lane) {
    double ss = 0, dot = 0;
    bool any = false;
    for (int64_t c = lane; c < f; c += 32) {
        const double v = (double)up(x[c]);
        ss += v * v;
        dot += v * (double)dxh[c];
        any |= dxh[c] != (C)0;
    }
    ss = warp_sum(ss);
    dot = warp_sum(dot);
    any = __any_sync(FULL, any);
    const double nrm = sqrt(ss);
    for (int64_t c = lane; c < f; c += 32) {
        double v = direct ? (double)direct[c] : 0.0;
        if (!any || nrm == 0.0) {
        } else if (nrm < EPS_NORM) { /* clamp_min passes the gradient at equality */
            v += (double)dxh[c] / EPS_NORM;
        } else {
            v += ((double)dxh[c] - (double)up(x[c]) * dot / ss) / nrm;
        }
        put(out + c, (C)v);
    }
}

/*
 * Grids of more than 65535 blocks in y (a y per (b, h), or per (b, h) and row tile: B H > 65535 is a batch of 4096
 * sequences of 16 heads). launch() folds such a y over y and z (balanced: z = ceil(y / ASC_GRID_Y), y = ceil(y / z)),
 * and a kernel reads its y as grid_y() and returns at once from the blocks past its count (at most z - 1 of them).
 * The emulator's test builds fold beyond 2 (tests/cuda_emu/Makefile), so that every grid case of more than two
 * (b, h) pairs runs the fold, and those of 3 or 9 pairs its idle blocks.
 */
#ifndef ASC_GRID_Y
#define ASC_GRID_Y 65535u
#endif
constexpr long long MAX_GRID_Y = 65535LL * 65535LL; /* the y a folded grid holds */
__device__ __forceinline__ int64_t grid_y() { return (int64_t)blockIdx.z * gridDim.y + blockIdx.y; }
inline bool grid_fold(dim3 *grid) {
    if (grid->y <= ASC_GRID_Y) return true;
    if (grid->z != 1) return false;
    const unsigned z = (grid->y + ASC_GRID_Y - 1) / ASC_GRID_Y;
    if (z > 65535u) return false;
    *grid = dim3(grid->x, (grid->y + z - 1) / z, z);
    return true;
}

/* Every kernel launch of the launchers: kernel<<<grid, block, smem, stream>>>(args...) under nvcc, the
 * emulator's launch under ASC_CUDA_EMU, so the same launcher code runs on both, with the grid's y folded
 * (grid_fold). Returns the launch's error (cudaGetLastError). The arguments are converted to the kernel's
 * parameter types first. */
template <typename A> struct param { using type = A; };
template <typename... P>
inline cudaError_t launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          typename param<P>::type... args) {
    if (!grid_fold(&grid)) return cudaErrorInvalidConfiguration;
#ifdef ASC_CUDA_EMU
    return ::asc_emu::launch<P...>(kernel, grid, block, smem, stream, args...);
#else
    kernel<<<grid, block, smem, stream>>>(args...);
    return cudaGetLastError();
#endif
}

/* Bytes of the global_tiles array of a call: only with a global_mask (else the global keys are those
 * below global_tokens, found without it). */
inline size_t global_tiles_bytes(const asc_params &p, const asc_fwd_args &a) {
    return a.global_mask ? sizeof(int32_t) * (size_t)(p.B * (n_tiles(p.N) + 1)) : 0;
}

/* Fills gtile (global_tiles_bytes, device memory) on the stream; nothing without a global_mask. */
static inline cudaError_t global_tiles(const asc_params &p, const asc_fwd_args &a, int32_t *gtile, cudaStream_t stream) {
    if (!a.global_mask) return cudaSuccess;
    return launch(global_tiles_kernel, dim3((unsigned)p.B), dim3(32), 0, stream, p, a.global_mask, gtile);
}

/*
 * The tiled kernels' grids: a block per (tile, (b, h)) in a 1-D grid, tile-major with the (b, h) fastest. The
 * block scheduler hands blocks out about in index order, so the tiles given first run first: in a causal call the
 * row tiles of the most keys (the last; `last_first`) or the key tiles of the most rows (the first), of every
 * head before any short one, leaving the short tiles to fill the last wave (with the tiles fastest, each head's
 * heaviest tiles came last: list scheduling of the causal forward's 1024 blocks of 1..64 key tiles on 264 slots
 * ends at 1.32x the even share, against 1.00x heaviest first; FlashAttention-2 orders its causal grid alike).
 */
struct TileBlock {
    int64_t tile, bh;
};
__device__ inline TileBlock tile_block(int64_t tiles, int64_t bh, bool last_first) {
    const int64_t t = (int64_t)blockIdx.x / bh;
    return {last_first ? tiles - 1 - t : t, (int64_t)blockIdx.x - t * bh};
}
inline bool tile_grid(int64_t tiles, int64_t bh, dim3 *grid) {
    if (tiles <= 0 || bh <= 0 || tiles > 2147483647LL / bh) return false;
    *grid = dim3((unsigned)(tiles * bh));
    return true;
}

/* Grid of the row kernels: x over row tiles of NW rows, y over (batch, head) (grid_y). */
inline bool row_grid(const asc_params &p, dim3 *grid) {
    const long long tiles = (p.Nq + NW - 1) / NW, bh = p.B * p.H;
    if (tiles > 2147483647LL || bh > MAX_GRID_Y) return false;
    *grid = dim3((unsigned)tiles, (unsigned)bh, 1);
    return true;
}

}  // namespace asc

#endif /* ASCENDER_CUDA_COMMON_CUH */
