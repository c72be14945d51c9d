/*
 * keymoments.cuh -- the key sums that give the alignment and cohesion rows' moments without a sweep over the
 * pairs (shared/IDEAS.md section 3; docs/cuda.md, "F2 in closed form"). Where every row's statistics run over all
 * N keys (mask_stats = False: whatever the masks), over the keys not padded, or (causal statistics) over those of
 * keys 0 .. t (no window, global tokens, documents or attn_mask hiding keys from the statistics, no non-finite key),
 * the rows
 *   r_ij  = usc_i u_i . k^_j                     (k^_j = k_j / ||k_j||, the product's operands)
 *   rc_ij = ||c~_i - z~_j||^2
 * have, per row, moments that are polynomials in u_i and c~_i of per-(b, h) sums over the keys. The sums are
 * taken about a shift (key 0's k^ and z~), as the sweep's moments are taken about a row's first value, so that
 * a row of equal values has exactly zero deviation and a spread small against the values loses nothing to
 * cancellation:
 *   k'_j = k^_j - k^_0:  s = sum_j k'_j,  A = sum_j k'_j k'_j^T
 *   z'_j = z~_j - z~_0,  b_j = ||z'_j||^2:  sz = sum_j z'_j,  Z = sum_j z'_j z'_j^T,  sbz = sum_j b_j z'_j,
 *                                           sb = sum_j b_j,  sbb = sum_j b_j^2
 * all in double, over the keys the statistics see (a padded key's terms are left out with mask_stats). The forward's
 * rows then take (closed_moments in forward.cuh), with c' = c~ - z~_0:
 *   sum_j (r_ij - usc u.k^_0) = usc u.s,      sum_j (..)^2 = usc^2 u^T A u
 *   sum_j (rc_ij - ||c'||^2)  = sb - 2 c'.sz,  sum_j (..)^2 = sbb - 4 c'.sbz + 4 c'^T Z c'
 * Layout of a (b, h)'s KmLayout(p).size doubles: k^_0 [d] | s [d] | A [d][d] | z~_0 [dz] | sz [dz] | Z [dz][dz] |
 * sbz [dz] | sb | sbb | the largest ||z~_j||^2 (the scale of the cohesion row's rounding). The sums are formed in
 * kmnc chunks of kmg keys per (b, h) (partials, each chunk's keys in order) and added in chunk order: the same bits
 * on every run. In a causal call (kmpre) chunk c's slot then holds the sums of the keys before it, 0 .. c kmg - 1: a
 * block of rows whose first token is t0 takes its moments over the keys before P = (t0 / kmg) kmg from there and
 * sweeps only P .. t (closed_moments and sweep_moments in forward.cuh).
 */
#ifndef ASCENDER_CUDA_KEYMOMENTS_CUH
#define ASCENDER_CUDA_KEYMOMENTS_CUH

#include <cstdlib>
#include <cstring>

#include "keyprep.cuh"

namespace asc {
namespace tiled {

/* Offsets of the parts of a (b, h)'s key sums. */
struct KmLayout {
    int64_t d, dz, k0, s, A, z0, sz, Z, sbz, sb, sbb, zmax, size;
    __host__ __device__ explicit KmLayout(const asc_params &p) : d(p.d), dz(p.dz) {
        k0 = 0;
        s = k0 + d;
        A = s + d;
        z0 = A + d * d;
        sz = z0 + dz;
        Z = sz + dz;
        sbz = Z + dz * dz;
        sb = sbz + dz;
        sbb = sb + 1;
        zmax = sbb + 1;
        size = zmax + 1;
    }
};

/* The keys of one (b, h, key chunk) staged as doubles about the shift, a round of R keys at a time: k' [R][dp],
 * z' [R][zp], b [R] (dp, zp: d, dz rounded up to 4, zeros past them). */
struct KmStage {
    int64_t dp, zp, R;
    __host__ __device__ explicit KmStage(const asc_params &p) {
        dp = (p.d + 3) / 4 * 4;
        zp = (p.dz + 3) / 4 * 4;
        const int64_t r = 40960 / ((dp + zp + 1) * (int64_t)sizeof(double));
        R = r < 1 ? 1 : (r > 64 ? 64 : r);
    }
    __host__ __device__ size_t bytes() const { return (size_t)(R * (dp + zp + 1)) * sizeof(double); }
};

/* q = x^T M x for the 8 rows of a warp's m-tile at once: lane (g, t) = (lane >> 2, lane & 3) serves row g, whose
 * x_f = xval(f) (the same function on the four lanes of its quad); M symmetric [nf][nf] in global memory (L2). Y = X M
 * by mma m8n8k4 f64 (the FP64 tensor cores: A = X's 8 rows x 4 features, B = 4 rows x 8 columns of M; features past nf
 * as zeros), in passes of QG n-tiles, then each lane adds x_c y_c over its columns 2t, 2t + 1 of each n-tile and the
 * quad sums them. Returns q of the lane's row on every lane of its quad. */
template <typename XV> __device__ __forceinline__ double quad_form8(XV xval, const double *M, int nf, int lane) {
    constexpr int QG = 4; /* n-tiles per pass: 8 accumulators */
    const int g = lane >> 2, t = lane & 3;
    double q = 0.0;
    for (int n0 = 0; n0 < nf; n0 += 8 * QG) {
        double acc[QG][2] = {};
        for (int k0 = 0; k0 < nf; k0 += 4) {
            const int k = k0 + t;
            const double a = k < nf ? xval(k) : 0.0;
            ASC_UNROLL
            for (int j = 0; j < QG; j++) {
                const int col = n0 + 8 * j + g;
                if (n0 + 8 * j >= nf) break; /* warp-uniform */
                const double b = k < nf && col < nf ? M[(int64_t)k * nf + col] : 0.0;
                mma_m8n8k4_f64(acc[j], a, b, acc[j]);
            }
        }
        ASC_UNROLL
        for (int j = 0; j < QG; j++)
            ASC_UNROLL
            for (int i = 0; i < 2; i++) {
                const int col = n0 + 8 * j + 2 * t + i;
                if (col < nf) q += xval(col) * acc[j][i];
            }
    }
    return quad_sum(q);
}

/* Batch b's key_padding_mask where it hides keys from the statistics (mask_stats), else NULL. */
__host__ __device__ inline const uint8_t *stat_padding(const asc_params &p, const asc_fwd_args &a, int64_t b) {
    return p.mask_stats && a.key_padding_mask ? a.key_padding_mask + b * p.N : nullptr;
}

/* Grid (NC, BH), 256 threads: chunk c of (b, h)'s keys summed into its partial. A thread owns units (a 4 x 4 tile
 * of A or Z, an entry of s, an entry of sz with sbz's, or sb with sbb), 256 at a time over the chunk's keys. */
template <typename T>
__global__ void __launch_bounds__(256) kmom_kernel(const asc_params p, const asc_fwd_args a, KeyPrep<T> kp) {
    ASC_DYNAMIC_SMEM(smem);
    const KmLayout L(p);
    const KmStage st(p);
    double *kx = reinterpret_cast<double *>(smem), *zx = kx + st.R * st.dp, *bx = zx + st.R * st.zp;
    const int64_t NC = gridDim.x, c = blockIdx.x, bh = grid_y(), N = p.N, d = p.d, dz = p.dz;
    if (bh >= p.B * p.H) return;
    const int64_t jlo = c * kp.kmg, jhi = jlo + kp.kmg < N ? jlo + kp.kmg : N;
    const T *kb = (const T *)a.k + bh * N * d, *zb = kp.zsrc(a) + bh * N * dz;
    const typename Elem<T>::C *rk = kp.rk + bh * kp.Npad;
    const uint8_t *pad = stat_padding(p, a, bh / p.H); /* keys the statistics do not see: zeros about the shift */
    double *out = kp.kmp + (bh * NC + c) * L.size;
    const int tid = threadIdx.x;
    const int64_t ta = st.dp / 4, tz = st.zp / 4, units = ta * ta + tz * tz + d + dz + 1;
    for (int64_t u0 = 0; u0 < units; u0 += blockDim.x) {
        const int64_t u = u0 + tid;
        /* the unit: kind 0 an A tile, 1 a Z tile, 2 s_f, 3 sz_f and sbz_f, 4 sb, sbb and the largest ||z~_j||^2;
         * IDLE: none (the threads past the last unit) */
        constexpr int IDLE = 5;
        int kind = IDLE;
        int64_t f = 0, g = 0;
        if (u < ta * ta) kind = 0, f = 4 * (u / ta), g = 4 * (u % ta);
        else if (u < ta * ta + tz * tz) kind = 1, f = 4 * ((u - ta * ta) / tz), g = 4 * ((u - ta * ta) % tz);
        else if (u < ta * ta + tz * tz + d) kind = 2, f = u - ta * ta - tz * tz;
        else if (u < units - 1) kind = 3, f = u - ta * ta - tz * tz - d;
        else if (u == units - 1) kind = 4;
        double acc[4][4] = {};
        for (int64_t r0 = jlo; r0 < jhi; r0 += st.R) {
            const int64_t nr = jhi - r0 < st.R ? jhi - r0 : st.R;
            __syncthreads(); /* the round before is read */
            for (int64_t e = tid; e < nr * st.dp; e += blockDim.x) {
                const int64_t r = e / st.dp, x = e - r * st.dp, j = r0 + r;
                const bool in = x < d && !(pad && pad[j]);
                kx[e] = in ? (double)up(kb[j * d + x]) * (double)rk[j] - (double)up(kb[x]) * (double)rk[0] : 0.0;
            }
            for (int64_t e = tid; e < nr * st.zp; e += blockDim.x) {
                const int64_t r = e / st.zp, x = e - r * st.zp, j = r0 + r;
                zx[e] = x < dz && !(pad && pad[j]) ? (double)up(zb[j * dz + x]) - (double)up(zb[x]) : 0.0;
            }
            __syncthreads();
            for (int64_t r = tid; r < nr; r += blockDim.x) {
                double bb = 0.0;
                for (int64_t x = 0; x < dz; x++) bb += zx[r * st.zp + x] * zx[r * st.zp + x];
                bx[r] = bb;
            }
            __syncthreads();
            for (int64_t r = 0; r < nr && kind != IDLE; r++) {
                if (kind <= 1) {
                    const double *v = kind == 0 ? kx + r * st.dp : zx + r * st.zp;
                    double vf[4], vg[4];
                    ASC_UNROLL
                    for (int x = 0; x < 4; x++) {
                        vf[x] = v[f + x];
                        vg[x] = v[g + x];
                    }
                    ASC_UNROLL
                    for (int x = 0; x < 4; x++)
                        ASC_UNROLL
                        for (int y = 0; y < 4; y++) acc[x][y] += vf[x] * vg[y];
                } else if (kind == 2) {
                    acc[0][0] += kx[r * st.dp + f];
                } else if (kind == 3) {
                    acc[0][0] += zx[r * st.zp + f];
                    acc[0][1] += bx[r] * zx[r * st.zp + f];
                } else {
                    acc[0][0] += bx[r];
                    acc[0][1] += bx[r] * bx[r];
                    const double nz = (double)kp.nz[bh * kp.Npad + r0 + r];
                    acc[0][2] = nz > acc[0][2] ? nz : acc[0][2];
                }
            }
        }
        if (kind <= 1) {
            const int64_t n = kind == 0 ? d : dz, o = kind == 0 ? L.A : L.Z;
            ASC_UNROLL
            for (int x = 0; x < 4; x++)
                ASC_UNROLL
                for (int y = 0; y < 4; y++)
                    if (f + x < n && g + y < n) out[o + (f + x) * n + g + y] = acc[x][y];
        } else if (kind == 2) {
            out[L.s + f] = acc[0][0];
        } else if (kind == 3) {
            out[L.sz + f] = acc[0][0];
            out[L.sbz + f] = acc[0][1];
        } else if (kind == 4) {
            out[L.sb] = acc[0][0];
            out[L.sbb] = acc[0][1];
            out[L.zmax] = acc[0][2];
        }
    }
}

/* Grid (entries / 256, BH), a thread per entry: the shifts, and the chunks' partial sums added in chunk order; with
 * kmpre each chunk's slot takes, in place, the sums of the chunks before it (and the shifts). */
template <typename T>
__global__ void __launch_bounds__(256) kmom_sum_kernel(const asc_params p, const asc_fwd_args a, KeyPrep<T> kp) {
    const KmLayout L(p);
    const int64_t bh = grid_y(), NC = kp.kmnc, N = p.N, e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (bh >= p.B * p.H) return;
    const T *kb = (const T *)a.k + bh * N * p.d, *zb = kp.zsrc(a) + bh * N * p.dz;
    const double rk0 = (double)kp.rk[bh * kp.Npad];
    double *part = kp.kmp + bh * NC * L.size;
    double *out = kp.km + bh * L.size;
    if (e >= L.size) return;
    double v = 0.0;
    const bool shift = e < L.s || (e >= L.z0 && e < L.sz);
    if (e < L.s) v = (double)up(kb[e]) * rk0;
    else if (e < L.sz && e >= L.z0) v = (double)up(zb[e - L.z0]);
    for (int64_t c = 0; c < NC; c++) {
        double *x = part + c * L.size + e;
        const double pc = shift ? 0.0 : *x; /* (kmom_kernel writes no shift: not read, for initcheck) */
        if (kp.kmpre) *x = v;               /* the keys before chunk c */
        if (!shift) v = e == L.zmax ? (pc > v ? pc : v) : v + pc;
    }
    out[e] = v;
}

/* Whether a call's rows see their statistics' keys as a prefix: causal statistics (T(i) = keys 0 .. t). */
inline bool key_moments_prefix(const asc_params &p) { return p.is_causal && p.mask_stats; }

/* Keys per chunk of the key sums: a multiple of 64 (of the forward's key tiles). Full attention: about 256 blocks in
 * all and at most 16 MB of partial sums; causal: the sums before each chunk are what the rows read, at most 64 MB
 * of them, in chunks as short as that allows (a block of rows sweeps its chunk's keys before its first token). */
inline int64_t kmom_keys(const asc_params &p) {
    const int64_t BH = p.B * p.H, per = BH * KmLayout(p).size * (int64_t)sizeof(double);
    int64_t nc = key_moments_prefix(p) ? (64LL << 20) / per : (16LL << 20) / per;
    if (!key_moments_prefix(p) && nc > (256 + BH - 1) / BH) nc = (256 + BH - 1) / BH;
    if (nc < 1) nc = 1;
    const int64_t keys = (p.N + nc - 1) / nc;
    return (keys + 63) / 64 * 64;
}

/* Whether a forward call's rows take their moments from the key sums: the rows' statistics run over every key, over
 * the keys not padded, or over those of keys 0 .. t (the kernel also requires no non-finite key in the (b, h)), and
 * the call is large enough that the sums and each row's closed form (and in a causal call its sweep of up to
 * kmom_keys + 64 keys) cost less than the sweep they replace (the pairs in T(i) of two products and the moments).
 * The constants are the cost model's at d = 64, dz = 32 (docs/cuda.md, "The rows' quadratic forms on the FP64
 * tensor cores"): about 1.3 warp instructions a pair for the sweep, 600 a row for the closed form and the sums' two
 * kernels as 900 a key, scaled by (d^2 + dz^2) / (d + dz). At the benchmark's widths a full-attention call takes it
 * from N = Nq ~ 1200, a causal one from ~2600. ASCENDER_CUDA_MOMENTS=closed takes every call that can (the
 * emulator's grid, the cost model), =sweep none. */
inline bool closed_moments_wanted(const asc_params &p, const asc_fwd_args &a) {
    /* mask_stats = False: every row's statistics see all N keys, whatever the masks (windows, global tokens and
     * documents need mask_stats); with it, attn_mask and the structured visibility hide keys per row */
    const bool structured = (p.mask_stats && a.attn_mask) || p.window_left >= 0 || p.window_right >= 0 ||
                            p.n_global > 0 || a.global_mask || a.document_ids;
    if (structured || p.d < 1 || p.N < 2) return false;
    /* the sums: at most 64 MB (kmom_keys keeps the chunks' sums to 16 MB, or 64 MB causal, but for one chunk) */
    if ((double)(p.B * p.H) * (double)KmLayout(p).size * sizeof(double) > 64.0 * (1 << 20)) return false;
    const char *v = getenv("ASCENDER_CUDA_MOMENTS");
    if (v && !strcmp(v, "sweep")) return false;
    if (v && !strcmp(v, "closed")) return true;
    const double s = (double)(p.d * p.d + p.dz * p.dz) / (double)(p.d + p.dz) / 53.3, N = (double)p.N,
                 Nq = (double)p.Nq, off = (double)(p.N - p.Nq - p.keys_after);
    const bool pre = key_moments_prefix(p);
    const double pairs = pre ? Nq * (off + 1.0) + Nq * (Nq - 1.0) / 2.0 : N * Nq;
    const double left = pre ? Nq * (double)(kmom_keys(p) + 64) : 0.0; /* the pairs a causal row block still sweeps */
    return 1.3 * (pairs - left) > s * (900.0 * N + 600.0 * Nq);
}

/* Bytes of a call's key sums and chunk sums, placed at `base` (after the rest of the key preparation). */
inline size_t key_moments_bytes(const asc_params &p) {
    const size_t per = (size_t)(p.B * p.H) * (size_t)KmLayout(p).size * sizeof(double);
    const int64_t g = kmom_keys(p);
    return per * (size_t)(1 + (p.N + g - 1) / g);
}
template <typename T> void place_key_moments(KeyPrep<T> &kp, const asc_params &p, char *base) {
    kp.kmg = kmom_keys(p);
    kp.kmnc = (p.N + kp.kmg - 1) / kp.kmg;
    kp.kmpre = key_moments_prefix(p);
    kp.km = reinterpret_cast<double *>(base);
    kp.kmp = kp.km + (size_t)(p.B * p.H) * (size_t)KmLayout(p).size;
}

/* The launches (after keys_kernel: they read rk and the centred latents). */
template <typename T>
cudaError_t prepare_key_moments(const asc_params &p, const asc_fwd_args &a, const KeyPrep<T> &kp,
                                cudaStream_t stream) {
    const KmStage st(p);
    const int64_t BH = p.B * p.H;
    cudaError_t e = launch(kmom_kernel<T>, dim3((unsigned)kp.kmnc, (unsigned)BH), dim3(256), st.bytes(), stream, p,
                           a, kp);
    if (e != cudaSuccess) return e;
    const unsigned entries = (unsigned)((KmLayout(p).size + 255) / 256);
    return launch(kmom_sum_kernel<T>, dim3(entries, (unsigned)BH), dim3(256), 0, stream, p, a, kp);
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_KEYMOMENTS_CUH */
