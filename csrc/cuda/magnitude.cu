/*
 * magnitude.cu -- CUDA forward and backward of Magnitude Attention (SPEC section 7): the algorithm of
 * the CPU kernels (csrc/cpu/magnitude_*, docs/magnitude.md) on the GPU. Design: docs/cuda.md,
 * "Magnitude Attention". Plain CUDA C++, no torch.
 *
 * Per (batch, head), over the valid keys (not padding):
 *   solve   (Zm + eps I) mu = 1 by n_iter unrolled CG steps from 0, Zm never stored: every product
 *           with the matrix is matvec_kernel, a grid over rows j streaming key tiles (lane per key:
 *           ||k_j - k_l||^2, exp, times the vector); each step's dot products and vector updates are
 *           step_kernel, one block per (batch, head). The CG vectors and scalars are float64 for every
 *           element type, as on the CPU.
 *   gate    g_j = sigmoid(beta mu_j + gamma)
 *   attend  y_i = sum_j softmax_j(scale q_i.k_j) g_j v_j: rows_kernel, a warp per query row,
 *           online softmax over key tiles (FlashAttention style).
 * Backward (reverse mode through the steps actually taken, docs/magnitude.md):
 *   the solve again with its history (p, A p, r per step: O(n_iter N)); rows_kernel for each row's
 *   log-sum-exp and P_i = dy_i.y_i, then dq (rows) and, per key column, dk, dv', dv = g dv' and the
 *   gate's gradient (cols_kernel, a warp per key streaming query tiles: no atomics); the CG steps in
 *   reverse (back_step_kernel, one product with the matrix per step); pairs_kernel for the matrix's
 *   own gradient dk_j += 2 (k_j sum_l c_jl - sum_l c_jl k_l) and dt; params_kernel for dt_raw, dbeta,
 *   dgamma (per head, summed over the batch in a fixed order: deterministic, like every kernel here).
 * Non-finite inputs (SPEC section 11, docs/magnitude.md), entry for entry as the CPU kernels: the CG
 * stopping rule is written as comparisons a NaN fails, so a NaN key reaches mu instead of stopping the
 * solve; a NaN score makes its row NaN (the online softmax takes it as +inf, so lsum is NaN), and a
 * row with a valid key outputs acc / lsum, never the 0 of an empty row; a padded key is never read:
 * every tile sum over keys skips it instead of multiplying its row by a zero weight; the backward
 * skips rows, and whole (b, h), without upstream gradient (S_PULLED).
 */
#include <float.h>

#include "common.cuh"

namespace asc {
namespace mag {

constexpr int NTV = 256; /* threads of the per-(batch, head) vector kernels */

/* Scalars of one (batch, head), float64, in scratch: then alpha, beta, sigma [n_iter], rho [n_iter + 1]. */
enum { S_T = 0, S_NVALID, S_ACTIVE, S_NDONE, S_DRHO, S_PULLED, S_HEAD };

__host__ __device__ inline int64_t sc_stride(const mag_params &p) { return S_HEAD + 4 * p.n_iter + 1; }
__device__ inline double *alpha_of(double *s, const mag_params &) { return s + S_HEAD; }
__device__ inline double *beta_of(double *s, const mag_params &p) { return s + S_HEAD + p.n_iter; }
__device__ inline double *sigma_of(double *s, const mag_params &p) { return s + S_HEAD + 2 * p.n_iter; }
__device__ inline double *rho_of(double *s, const mag_params &p) { return s + S_HEAD + 3 * p.n_iter; }

__device__ inline bool key_valid(const mag_fwd_args &a, const mag_params &p, int64_t b, int64_t j) {
    return !a.key_padding_mask || !a.key_padding_mask[b * p.N + j];
}

__device__ inline double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Sum over the block, the same value (and the same bits: a fixed order) in every thread. Every
 * thread calls it; it contains two barriers. */
__device__ inline double block_sum(double v) {
    __shared__ double part[32];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, nw = (int)(blockDim.x + 31) / 32;
    v = warp_sum(v);
    if (lane == 0) part[w] = v;
    __syncthreads();
    double s = 0.0;
    for (int k = 0; k < nw; k++) s += part[k];
    __syncthreads(); /* every thread has read part before the next call writes it */
    return s;
}

/* Shared memory of the tiled kernels, in elements of the compute type C: tile A [TK][d + 1] (keys, or
 * queries for cols_kernel), tile B [TK][dv + 1] (values, or dL/dy), four per-key scalars [TK] (gate,
 * valid, lse, P), and per warp: va [d], vb [dv], acc_a [d], acc_b [dv], wb [2 TK]. */
struct Layout {
    int lda, ldb;
    long A, B, g, ok, lse, pd, wbase, wstride, va, vb, acc_a, acc_b, wb;
    long bytes;
};

inline Layout make_layout(const mag_params &p, long csize, bool with_b) {
    Layout L;
    long o = 0;
    auto take = [&](long n) { const long at = o; o += n; return at; };
    L.lda = (int)p.d + 1;
    L.ldb = (int)p.dv + 1;
    L.A = take((long)TK * L.lda);
    L.B = with_b ? take((long)TK * L.ldb) : -1;
    L.g = take(TK);
    L.ok = take(TK);
    L.lse = take(TK);
    L.pd = take(TK);
    long w = 0;
    auto wtake = [&](long n) { const long at = w; w += n; return at; };
    L.va = wtake(p.d);
    L.vb = wtake(p.dv);
    L.acc_a = wtake(p.d);
    L.acc_b = wtake(p.dv);
    L.wb = wtake(2 * TK);
    L.wstride = w;
    L.wbase = take((long)NW * w);
    L.bytes = o * csize;
    return L;
}

/* Rows src[j0 .. j0 + TK) of a [N][f] tensor of (batch, head) bh into a tile [TK][ld] (zeros past N). */
template <typename T, typename C>
__device__ inline void fill_tile(C *dst, int ld, const T *src, int64_t bh, int64_t N, int64_t f, int64_t j0) {
    const T *base = src + (bh * N + j0) * f;
    for (int64_t e = threadIdx.x; e < (int64_t)TK * f; e += blockDim.x) {
        const int64_t jj = e / f, c = e - jj * f;
        dst[jj * ld + c] = j0 + jj < N ? (C)up(base[e]) : (C)0;
    }
}

/* ---------------------------------------------------------------- the solve */

/*
 * x = 0, r = p = 1 on the valid keys, t = softplus(t_raw), rho_0 = n_valid. One block per (b, h).
 * S_PULLED: in the forward 1; in the backward whether some output of (b, h) has an upstream gradient
 * (a nonzero entry of dy, or of dmu at a valid key), as the CPU's mag_pulled. Without one every
 * gradient of (b, h) is exactly 0: the solve stays off (mu = 0) and the kernels after pass nothing,
 * so that a NaN in its inputs stays out of the gradients of a loss over other heads and batches.
 */
template <typename T>
__global__ void __launch_bounds__(NTV) init_kernel(const mag_params p, const mag_fwd_args a, int backward, const T *dy,
                                                   const T *dmu, double *sc, double *x, double *r, double *pv) {
    const int64_t bh = blockIdx.x, b = bh / p.H, hd = bh % p.H, N = p.N;
    double *s = sc + bh * sc_stride(p);
    double cnt = 0.0, pulled = backward ? 0.0 : 1.0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        const double v = key_valid(a, p, b, j) ? 1.0 : 0.0;
        x[bh * N + j] = 0.0;
        r[bh * N + j] = v;
        pv[bh * N + j] = v;
        cnt += v;
        if (dmu && v != 0.0 && up(dmu[bh * N + j]) != 0) pulled = 1.0; /* a NaN counts */
    }
    for (int64_t e = threadIdx.x; backward && e < N * p.dv; e += blockDim.x)
        if (up(dy[bh * N * p.dv + e]) != 0) pulled = 1.0;
    cnt = block_sum(cnt);
    pulled = block_sum(pulled);
    if (threadIdx.x == 0) {
        const double tr = (double)up(((const T *)a.t_raw)[hd]);
        s[S_T] = tr > 30.0 ? tr : log1p(exp(tr));
        s[S_NVALID] = cnt;
        s[S_PULLED] = pulled > 0.0 ? 1.0 : 0.0;
        s[S_ACTIVE] = cnt > 0.0 && pulled > 0.0 ? 1.0 : 0.0;
        s[S_NDONE] = 0.0;
        s[S_DRHO] = 0.0;
        rho_of(s, p)[0] = cnt;
    }
}

/*
 * out = (Zm + eps I) in over the valid keys (0 at padding), rows j = blockIdx.x * NW + warp of (b, h)
 * blockIdx.y. Only where the solve is on: forward step `it` while S_ACTIVE, backward step `it` while
 * it < S_NDONE (the whole block returns otherwise).
 */
template <typename T, typename C>
__global__ void __launch_bounds__(NW * 32) matvec_kernel(const mag_params p, const mag_fwd_args a, const double *sc,
                                                         const double *in, double *out, int64_t it, int backward,
                                                         const Layout L) {
    ASC_DYNAMIC_SMEM(smem_raw);
    C *sm = reinterpret_cast<C *>(smem_raw);
    const int64_t bh = grid_y(), b = bh / p.H, N = p.N, d = p.d;
    if (bh >= p.B * p.H) return;
    const double *s = sc + bh * sc_stride(p);
    if (backward ? !((double)it < s[S_NDONE]) : s[S_ACTIVE] == 0.0) return; /* uniform over the block */
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t j = (int64_t)blockIdx.x * NW + w;
    C *kj = sm + L.wbase + (long)w * L.wstride + L.va;
    const T *kb = (const T *)a.k;
    if (j < N)
        for (int64_t f = lane; f < d; f += 32) kj[f] = (C)up(kb[(bh * N + j) * d + f]);
    __syncwarp();
    const C c = (C)(-s[S_T] / (double)(d ? d : 1));
    const double *vin = in + bh * N;
    double acc = 0.0;
    for (int64_t j0 = 0; j0 < N; j0 += TK) {
        fill_tile<T, C>(sm + L.A, L.lda, kb, bh, N, d, j0);
        for (int e = threadIdx.x; e < TK; e += blockDim.x)
            sm[L.ok + e] = (j0 + e < N && key_valid(a, p, b, j0 + e)) ? (C)1 : (C)0;
        __syncthreads();
        const int64_t l = j0 + lane;
        if (j < N && sm[L.ok + lane] != (C)0) {
            const C *kl = sm + L.A + (long)lane * L.lda;
            C D = 0;
            for (int64_t f = 0; f < d; f++) {
                const C df = kl[f] - kj[f];
                D += df * df;
            }
            acc += (double)ex(D * c) * vin[l];
        }
        __syncthreads();
    }
    acc = warp_sum(acc);
    if (j < N && lane == 0) out[bh * N + j] = key_valid(a, p, b, j) ? acc + p.eps * vin[j] : 0.0;
}

/*
 * One CG step of (b, h) = blockIdx.x, given w = A p: sigma = p.w; stop for good when rho_it <=
 * (machine epsilon)^2 rho_0 or sigma <= 0; else alpha, x += alpha p, r -= alpha w, rho_{it+1} = r.r,
 * beta, p = r + beta p. P, W, R (or NULL): the history [n_iter][N] for the backward.
 */
__global__ void __launch_bounds__(NTV) step_kernel(const mag_params p, double *sc, double *x, double *r, double *pv,
                                                   const double *w, double *P, double *W, double *R, int64_t it,
                                                   double eps_type) {
    const int64_t bh = blockIdx.x, N = p.N;
    double *s = sc + bh * sc_stride(p);
    if (s[S_ACTIVE] == 0.0) return; /* uniform */
    double *xb = x + bh * N, *rb = r + bh * N, *pb = pv + bh * N;
    const double *wb = w + bh * N;
    double sg = 0.0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) sg += pb[j] * wb[j];
    sg = block_sum(sg);
    const double rho = rho_of(s, p)[it], floor = eps_type * eps_type * rho_of(s, p)[0];
    if (rho <= floor || sg <= 0.0) { /* converged to rounding, or degenerate; a NaN (from a non-finite
                                        key) goes on, so that it reaches mu, as on the CPU */
        if (threadIdx.x == 0) s[S_ACTIVE] = 0.0;
        return;
    }
    const double al = rho / sg;
    const int64_t h0 = (bh * p.n_iter + it) * N;
    double rr = 0.0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        if (P) {
            P[h0 + j] = pb[j];
            W[h0 + j] = wb[j];
        }
        xb[j] += al * pb[j];
        rb[j] -= al * wb[j];
        rr += rb[j] * rb[j];
    }
    rr = block_sum(rr);
    const double be = rr / rho;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        pb[j] = rb[j] + be * pb[j];
        if (R) R[h0 + j] = rb[j];
    }
    if (threadIdx.x == 0) {
        alpha_of(s, p)[it] = al;
        beta_of(s, p)[it] = be;
        sigma_of(s, p)[it] = sg;
        rho_of(s, p)[it + 1] = rr;
        s[S_NDONE] = (double)(it + 1);
    }
}

/* mu_j = x_j at the valid keys (0 at padding), g_j = sigmoid(beta mu_j + gamma); mu into mu_out
 * (the output, element type T) and/or mu_c (scratch, compute type). */
template <typename T, typename C>
__global__ void gate_kernel(const mag_params p, const mag_fwd_args a, const double *x, C *gate, C *mu_c, T *mu_out) {
    const int64_t bh = grid_y(), b = bh / p.H, hd = bh % p.H;
    if (bh >= p.B * p.H) return;
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= p.N) return;
    const int64_t o = bh * p.N + j;
    const C mu = key_valid(a, p, b, j) ? (C)x[o] : (C)0;
    const double bg = (double)up(((const T *)a.beta)[hd]), gg = (double)up(((const T *)a.gamma)[hd]);
    gate[o] = (C)sigmoid_d(bg * (double)mu + gg);
    if (mu_c) mu_c[o] = mu;
    if (mu_out) put(mu_out + o, mu);
}

/* ---------------------------------------------------------------- attention rows */

/* Loads the key tile at j0 (keys, values, gates, validity) for the row kernels; ends with a barrier. */
template <typename T, typename C>
__device__ inline void load_key_tile(C *sm, const Layout &L, const mag_params &p, const mag_fwd_args &a, const C *gate,
                                     int64_t bh, int64_t j0) {
    const int64_t b = bh / p.H;
    fill_tile<T, C>(sm + L.A, L.lda, (const T *)a.k, bh, p.N, p.d, j0);
    fill_tile<T, C>(sm + L.B, L.ldb, (const T *)a.v, bh, p.N, p.dv, j0);
    for (int e = threadIdx.x; e < TK; e += blockDim.x) {
        const bool in = j0 + e < p.N;
        sm[L.ok + e] = (in && key_valid(a, p, b, j0 + e)) ? (C)1 : (C)0;
        sm[L.g + e] = in ? gate[bh * p.N + j0 + e] : (C)0;
    }
    __syncthreads();
}

/*
 * A warp per query row i = blockIdx.x * NW + warp of (b, h) blockIdx.y; online softmax over the key
 * tiles of scale q_i.k_j at the valid keys; acc = sum_j e_j g_j v_j.
 * mode 0: out_i = acc / sum e (0 without a valid key) into a.out.
 * mode 1 (backward): lse_i = max + log(sum e) and pd_i = dy_i.y_i; lse_i = +inf marks a row that adds
 * nothing to the gradients: no valid key, or no upstream gradient (dy_i = 0: skipped, as on the CPU).
 * lse_i is NaN where the CPU's sum e is NaN, or -inf where every valid score is -inf (the CPU's sum is
 * NaN then: exp(-inf + inf)); either way every A_ij of the row is NaN below, as on the CPU.
 */
template <typename T, typename C>
__global__ void __launch_bounds__(NW * 32) rows_kernel(const mag_params p, const mag_fwd_args a, const double *sc,
                                                       const C *gate, const T *grad_out, C *lse, C *pd, int mode,
                                                       const Layout L) {
    ASC_DYNAMIC_SMEM(smem_raw);
    C *sm = reinterpret_cast<C *>(smem_raw);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = grid_y(), N = p.N, d = p.d, dv = p.dv;
    if (bh >= p.B * p.H) return;
    const int64_t i = (int64_t)blockIdx.x * NW + w;
    const bool active = i < N;
    C *wsm = sm + L.wbase + (long)w * L.wstride;
    C *q = wsm + L.va, *acc = wsm + L.acc_b, *wb = wsm + L.wb;
    if (active) {
        for (int64_t f = lane; f < d; f += 32) q[f] = (C)up(((const T *)a.q)[(bh * N + i) * d + f]);
        for (int64_t f = lane; f < dv; f += 32) acc[f] = (C)0;
    }
    __syncwarp();
    C mx = -inf_of<C>(), lsum = 0;
    for (int64_t j0 = 0; j0 < N; j0 += TK) {
        load_key_tile<T, C>(sm, L, p, a, gate, bh, j0);
        if (active) {
            const bool ok = sm[L.ok + lane] != (C)0;
            const C *kl = sm + L.A + (long)lane * L.lda;
            C dot = 0;
            for (int64_t f = 0; f < d; f++) dot += q[f] * kl[f];
            const C sv = (C)(p.scale * dot);
            /* a NaN score counts as +inf: the tile is taken and its e = NaN makes lsum NaN, so the row
               is NaN like the CPU's (whose max skips the NaN and whose sum does not); and the max stays
               the same in every lane (a NaN would not come out of warp_max uniformly) */
            const C tmax = warp_max(ok ? (sv == sv ? sv : inf_of<C>()) : -inf_of<C>());
            const C mnew = tmax > mx ? tmax : mx;
            if (mnew > -inf_of<C>()) { /* warp-uniform */
                const C factor = mx > -inf_of<C>() ? ex(mx - mnew) : (C)0;
                const C e = ok ? ex(sv - mnew) : (C)0;
                lsum = lsum * factor + warp_sum(e);
                wb[lane] = e * sm[L.g + lane];
                __syncwarp();
                const int jn = N - j0 < TK ? (int)(N - j0) : TK;
                for (int64_t f = lane; f < dv; f += 32) {
                    C s = 0;
                    for (int jj = 0; jj < jn; jj++) /* a padded key skipped, not * 0: its v may be NaN */
                        if (sm[L.ok + jj] != (C)0) s += wb[jj] * sm[L.B + (long)jj * L.ldb + f];
                    acc[f] = acc[f] * factor + s;
                }
                __syncwarp();
                mx = mnew;
            }
        }
        __syncthreads();
    }
    if (!active) return;
    const int64_t row = bh * N + i;
    /* with a valid key lsum >= 1, unless a NaN made it NaN: then the row is NaN, not an empty row's 0 */
    const bool keys = sc[bh * sc_stride(p) + S_NVALID] > 0.0;
    if (mode == 0) {
        for (int64_t f = lane; f < dv; f += 32) put((T *)a.out + row * dv + f, keys ? acc[f] / lsum : (C)0);
        return;
    }
    C dot = 0, nz = 0;
    for (int64_t f = lane; f < dv; f += 32) {
        const C g = (C)up(grad_out[row * dv + f]);
        dot += g * (keys ? acc[f] / lsum : (C)0);
        nz += g != (C)0 ? (C)1 : (C)0; /* a NaN counts */
    }
    dot = warp_sum(dot);
    nz = warp_sum(nz);
    if (lane == 0) {
        lse[row] = keys && nz > (C)0 ? mx + lg(lsum) : inf_of<C>();
        pd[row] = dot;
    }
}

/*
 * dq_i = scale sum_j dS_ij k_j with A_ij = exp(s_ij - lse_i) at the valid keys, dA_ij = g_j (dy_i.v_j)
 * and dS_ij = A_ij (dA_ij - pd_i). A warp per query row, like rows_kernel.
 */
template <typename T, typename C>
__global__ void __launch_bounds__(NW * 32) dq_kernel(const mag_params p, const mag_bwd_args ba, const C *gate,
                                                     const C *lse, const C *pd, const Layout L) {
    ASC_DYNAMIC_SMEM(smem_raw);
    C *sm = reinterpret_cast<C *>(smem_raw);
    const mag_fwd_args &a = ba.in;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = grid_y(), N = p.N, d = p.d, dv = p.dv;
    if (bh >= p.B * p.H) return;
    const int64_t i = (int64_t)blockIdx.x * NW + w, row = bh * N + i;
    const bool active = i < N;
    C *wsm = sm + L.wbase + (long)w * L.wstride;
    C *q = wsm + L.va, *dy = wsm + L.vb, *acc = wsm + L.acc_a, *wb = wsm + L.wb;
    C li = inf_of<C>(), pi = 0;
    if (active) {
        for (int64_t f = lane; f < d; f += 32) {
            q[f] = (C)up(((const T *)a.q)[row * d + f]);
            acc[f] = (C)0;
        }
        for (int64_t f = lane; f < dv; f += 32) dy[f] = (C)up(((const T *)ba.grad_out)[row * dv + f]);
        li = lse[row];
        pi = pd[row];
    }
    __syncwarp();
    const bool live = active && li != inf_of<C>(); /* the row adds to the gradients (NaN: it does) */
    for (int64_t j0 = 0; j0 < N; j0 += TK) {
        load_key_tile<T, C>(sm, L, p, a, gate, bh, j0);
        if (live) {
            const bool ok = sm[L.ok + lane] != (C)0;
            const C *kl = sm + L.A + (long)lane * L.lda, *vl = sm + L.B + (long)lane * L.ldb;
            C dS = 0;
            if (ok) {
                C dot = 0, dyv = 0;
                for (int64_t f = 0; f < d; f++) dot += q[f] * kl[f];
                for (int64_t f = 0; f < dv; f++) dyv += dy[f] * vl[f];
                const C A = ex((C)(p.scale * dot) - li);
                dS = A * (sm[L.g + lane] * dyv - pi);
            }
            wb[lane] = dS;
            __syncwarp();
            const int jn = N - j0 < TK ? (int)(N - j0) : TK;
            for (int64_t f = lane; f < d; f += 32) {
                C s = 0;
                for (int jj = 0; jj < jn; jj++) /* a padded key skipped, not * 0: its k may be NaN */
                    if (sm[L.ok + jj] != (C)0) s += wb[jj] * sm[L.A + (long)jj * L.lda + f];
                acc[f] += s;
            }
            __syncwarp();
        }
        __syncthreads();
    }
    if (!active) return;
    for (int64_t f = lane; f < d; f += 32) put((T *)ba.dq + row * d + f, live ? (C)p.scale * acc[f] : (C)0);
}

/*
 * A warp per key column l = blockIdx.x * NW + warp of (b, h) blockIdx.y, streaming query tiles:
 * dk_l (attention part) = scale sum_i dS_il q_i into dk_att, dv'_l = sum_i A_il dy_i, dv_l = g_l dv'_l
 * (output), and the gate's gradient dz_l = (dv'_l.v_l) g_l (1 - g_l) at a valid key: dmu_l = beta dz_l
 * + dL/dmu_l into dmu, dz_l into dz (for dbeta, dgamma). With dv = 0 only dmu = dL/dmu is set; in a
 * (b, h) without upstream gradient (S_PULLED) everything is 0.
 * The sums over rows skip a zero dS_il or A_il, as the CPU's do, rather than multiply a row's q or dy
 * by it (a NaN query of a row without upstream gradient stays out). A padded key l is never read: its
 * A_il = e_l / lsum_i with e_l = 0, and dS_il = A_il (0 - pd_i), are 0 unless the row's lsum or pd is
 * NaN, when they are NaN, as on the CPU.
 */
template <typename T, typename C>
__global__ void __launch_bounds__(NW * 32) cols_kernel(const mag_params p, const mag_bwd_args ba, const double *sc,
                                                       const C *gate, const C *lse, const C *pd, C *dk_att,
                                                       double *dmu, double *dz, const Layout L) {
    ASC_DYNAMIC_SMEM(smem_raw);
    C *sm = reinterpret_cast<C *>(smem_raw);
    const mag_fwd_args &a = ba.in;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = grid_y(), b = bh / p.H, hd = bh % p.H, N = p.N, d = p.d, dv = p.dv;
    if (bh >= p.B * p.H) return;
    const int64_t l = (int64_t)blockIdx.x * NW + w, col = bh * N + l;
    const bool pulled = sc[bh * sc_stride(p) + S_PULLED] != 0.0; /* uniform over the block */
    const bool active = l < N, ok = active && pulled && key_valid(a, p, b, l);
    C *wsm = sm + L.wbase + (long)w * L.wstride;
    C *kl = wsm + L.va, *vl = wsm + L.vb, *ak = wsm + L.acc_a, *av = wsm + L.acc_b, *wb = wsm + L.wb;
    const C gl = active ? gate[col] : (C)0;
    if (active) {
        for (int64_t f = lane; f < d; f += 32) {
            kl[f] = (C)up(((const T *)a.k)[col * d + f]);
            ak[f] = (C)0;
        }
        for (int64_t f = lane; f < dv; f += 32) {
            vl[f] = (C)up(((const T *)a.v)[col * dv + f]);
            av[f] = (C)0;
        }
    }
    __syncwarp();
    for (int64_t i0 = 0; i0 < N && dv > 0 && pulled; i0 += TK) {
        fill_tile<T, C>(sm + L.A, L.lda, (const T *)a.q, bh, N, d, i0);
        fill_tile<T, C>(sm + L.B, L.ldb, (const T *)ba.grad_out, bh, N, dv, i0);
        for (int e = threadIdx.x; e < TK; e += blockDim.x) {
            const bool in = i0 + e < N;
            sm[L.lse + e] = in ? lse[bh * N + i0 + e] : inf_of<C>();
            sm[L.pd + e] = in ? pd[bh * N + i0 + e] : (C)0;
        }
        __syncthreads();
        if (active) {
            const C li = sm[L.lse + lane];
            C A = 0, dS = 0;
            if (li != inf_of<C>()) { /* query i0 + lane exists and adds to the gradients */
                const C *qi = sm + L.A + (long)lane * L.lda, *dyi = sm + L.B + (long)lane * L.ldb;
                C dot = 0, dyv = 0;
                if (ok) {
                    for (int64_t f = 0; f < d; f++) dot += qi[f] * kl[f];
                    for (int64_t f = 0; f < dv; f++) dyv += dyi[f] * vl[f];
                }
                A = ok ? ex((C)(p.scale * dot) - li) : (C)0 * li; /* padded: 0, or NaN with the row's lsum */
                dS = A * (gl * dyv - sm[L.pd + lane]);
            }
            wb[lane] = dS;
            wb[TK + lane] = A;
            __syncwarp();
            const int in_tile = N - i0 < TK ? (int)(N - i0) : TK;
            for (int64_t f = lane; f < d; f += 32) {
                C s = 0;
                for (int ii = 0; ii < in_tile; ii++)
                    if (wb[ii] != (C)0) s += wb[ii] * sm[L.A + (long)ii * L.lda + f];
                ak[f] += s;
            }
            for (int64_t f = lane; f < dv; f += 32) {
                C s = 0;
                for (int ii = 0; ii < in_tile; ii++)
                    if (wb[TK + ii] != (C)0) s += wb[TK + ii] * sm[L.B + (long)ii * L.ldb + f];
                av[f] += s;
            }
            __syncwarp();
        }
        __syncthreads();
    }
    if (!active) return;
    double dgate = 0.0;
    for (int64_t f = lane; f < d; f += 32) dk_att[col * d + f] = (C)p.scale * ak[f];
    for (int64_t f = lane; f < dv; f += 32) {
        put((T *)ba.dv + col * dv + f, gl * av[f]);
        dgate += (double)av[f] * (double)vl[f];
    }
    dgate = warp_sum(dgate);
    if (lane == 0) {
        const double g = (double)gl, z = ok ? dgate * g * (1.0 - g) : 0.0;
        const double dmu_out = (ba.grad_mu && ok) ? (double)up(((const T *)ba.grad_mu)[col]) : 0.0;
        dmu[col] = (double)up(((const T *)a.beta)[hd]) * z + dmu_out;
        dz[col] = z;
    }
}

/* ---------------------------------------------------------------- the solve in reverse */

/*
 * Reverse of CG step `it` of (b, h) = blockIdx.x (docs/magnitude.md), for it < n_done; first adds
 * A dw of step it + 1 (adw) to dp. dx = dmu stays; dr, dp, the scalar adjoint drho (S_DRHO) carry
 * over between steps; dw_it goes to dW [n_iter][N] (for the pair pass) and to dw (for the product).
 */
__global__ void __launch_bounds__(NTV) back_step_kernel(const mag_params p, double *sc, const double *P, const double *W,
                                                        const double *R, const double *dx, double *dr, double *dp,
                                                        double *dw, const double *adw, double *dW, int64_t it) {
    const int64_t bh = blockIdx.x, N = p.N;
    double *s = sc + bh * sc_stride(p);
    const double ndone = s[S_NDONE];
    if (!((double)it < ndone)) return; /* uniform */
    const int64_t h0 = (bh * p.n_iter + it) * N, o = bh * N;
    const bool after = (double)(it + 1) < ndone;
    double dB = 0.0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        if (after) dp[o + j] += adw[o + j];
        dB += dp[o + j] * P[h0 + j];
    }
    dB = block_sum(dB);
    const double rho0 = rho_of(s, p)[it], rho1 = rho_of(s, p)[it + 1], al = alpha_of(s, p)[it];
    const double be = beta_of(s, p)[it], sg = sigma_of(s, p)[it];
    double drho0 = -dB * rho1 / (rho0 * rho0);
    const double drho = s[S_DRHO] + dB / rho0;
    double drW = 0.0, dxP = 0.0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        dr[o + j] += dp[o + j] + 2.0 * drho * R[h0 + j];
        drW += dr[o + j] * W[h0 + j];
        dxP += dx[o + j] * P[h0 + j];
    }
    drW = block_sum(drW);
    dxP = block_sum(dxP);
    const double dal = -drW + dxP;
    drho0 += dal / sg;
    const double dsg = -dal * rho0 / (sg * sg);
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        const double v = -al * dr[o + j] + dsg * P[h0 + j];
        dw[o + j] = v;
        dW[h0 + j] = v;
        dp[o + j] = be * dp[o + j] + al * dx[o + j] + dsg * W[h0 + j];
    }
    if (threadIdx.x == 0) s[S_DRHO] = drho0;
}

/*
 * The matrix's own gradient, a warp per row j of (b, h) blockIdx.y over the key tiles: with
 * G_jl = sum_it dw_it,j p_it,l + p_it,j dw_it,l and Z = exp(-t D / d), c_jl = Z (-t/d) G_jl:
 * dk_j = dk_att_j + 2 (k_j sum_l c_jl - sum_l c_jl k_l) (output) and st_j = sum_l G_jl Z (-D/d) / 2
 * (dt's share of row j). Rows at padding, or without a CG step, keep the attention part.
 */
template <typename T, typename C>
__global__ void __launch_bounds__(NW * 32) pairs_kernel(const mag_params p, const mag_bwd_args ba, const double *sc,
                                                        const double *P, const double *dW, const C *dk_att, double *st,
                                                        const Layout L) {
    ASC_DYNAMIC_SMEM(smem_raw);
    C *sm = reinterpret_cast<C *>(smem_raw);
    const mag_fwd_args &a = ba.in;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = grid_y(), b = bh / p.H, N = p.N, d = p.d;
    if (bh >= p.B * p.H) return;
    const int64_t j = (int64_t)blockIdx.x * NW + w, row = bh * N + j;
    const double *s = sc + bh * sc_stride(p);
    const int64_t ndone = (int64_t)s[S_NDONE];
    const bool live = j < N && ndone > 0 && key_valid(a, p, b, j);
    C *wsm = sm + L.wbase + (long)w * L.wstride;
    C *kj = wsm + L.va, *acc = wsm + L.acc_a, *wb = wsm + L.wb;
    const T *kb = (const T *)a.k;
    if (live)
        for (int64_t f = lane; f < d; f += 32) {
            kj[f] = (C)up(kb[row * d + f]);
            acc[f] = (C)0;
        }
    __syncwarp();
    const double t = s[S_T], id = 1.0 / (double)(d ? d : 1);
    const C c = (C)(-t * id);
    double csum = 0.0, stp = 0.0;
    for (int64_t j0 = 0; j0 < N && ndone > 0; j0 += TK) {
        fill_tile<T, C>(sm + L.A, L.lda, kb, bh, N, d, j0);
        for (int e = threadIdx.x; e < TK; e += blockDim.x)
            sm[L.ok + e] = (j0 + e < N && key_valid(a, p, b, j0 + e)) ? (C)1 : (C)0;
        __syncthreads();
        if (live) {
            const int64_t l = j0 + lane;
            double cjl = 0.0;
            if (sm[L.ok + lane] != (C)0) {
                const C *kl = sm + L.A + (long)lane * L.lda;
                C D = 0;
                for (int64_t f = 0; f < d; f++) {
                    const C df = kl[f] - kj[f];
                    D += df * df;
                }
                double g = 0.0;
                for (int64_t it = 0; it < ndone; it++) {
                    const int64_t h0 = (bh * p.n_iter + it) * N;
                    g += dW[h0 + j] * P[h0 + l] + P[h0 + j] * dW[h0 + l];
                }
                const double z = (double)ex(D * c);
                stp += 0.5 * g * z * (-(double)D * id);
                cjl = z * (-t * id) * g;
            }
            csum += cjl;
            wb[lane] = (C)cjl;
            __syncwarp();
            const int jn = N - j0 < TK ? (int)(N - j0) : TK;
            for (int64_t f = lane; f < d; f += 32) {
                C sacc = 0;
                for (int jj = 0; jj < jn; jj++) /* a padded key skipped, not * 0: its k may be NaN */
                    if (sm[L.ok + jj] != (C)0) sacc += wb[jj] * sm[L.A + (long)jj * L.lda + f];
                acc[f] += sacc;
            }
            __syncwarp();
        }
        __syncthreads();
    }
    csum = warp_sum(csum);
    stp = warp_sum(stp);
    if (j >= N) return;
    for (int64_t f = lane; f < d; f += 32) {
        const C pair = live ? (C)(2.0 * ((double)kj[f] * csum - (double)acc[f])) : (C)0;
        put((T *)ba.dk + row * d + f, dk_att[row * d + f] + pair);
    }
    if (lane == 0) st[row] = live ? stp : 0.0;
}

/* dparams [3][H] = (dt_raw, dbeta, dgamma) of head blockIdx.x, summed over the batch in a fixed order:
 * dt_raw = sigmoid(t_raw) sum st, dbeta = sum dz mu, dgamma = sum dz. */
template <typename T, typename C>
__global__ void __launch_bounds__(NTV) params_kernel(const mag_params p, const mag_bwd_args ba, const double *st,
                                                     const double *dz, const C *mu_c) {
    const int64_t hd = blockIdx.x, N = p.N;
    double sst = 0.0, sb = 0.0, sgm = 0.0;
    for (int64_t b = 0; b < p.B; b++) {
        const int64_t o = (b * p.H + hd) * N;
        for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
            sst += st[o + j];
            sb += dz[o + j] * (double)mu_c[o + j];
            sgm += dz[o + j];
        }
    }
    sst = block_sum(sst);
    sb = block_sum(sb);
    sgm = block_sum(sgm);
    if (threadIdx.x == 0) {
        const double tr = (double)up(((const T *)ba.in.t_raw)[hd]);
        T *out = (T *)ba.dparams;
        put(out + hd, (C)(sst * sigmoid_d(tr)));
        put(out + p.H + hd, (C)sb);
        put(out + 2 * p.H + hd, (C)sgm);
    }
}

/* ---------------------------------------------------------------- launchers */

/* Scratch of one call, one stream-ordered allocation (doubles first, then compute-type arrays). */
template <typename C>
struct Scratch {
    double *sc, *x, *r, *pv, *w, *P, *W, *R, *dW, *dmu, *dr, *dp, *dw, *adw, *st, *dz;
    C *gate, *mu, *lse, *pd, *dk_att;
    size_t bytes, zero_from, zero_bytes;
    Scratch(const mag_params &p, char *base, bool backward) {
        const size_t BHN = (size_t)(p.B * p.H * p.N), hist = BHN * (size_t)(p.n_iter > 0 ? p.n_iter : 1);
        size_t o = 0;
        auto take = [&](size_t n) { const size_t at = o; o += (n + 255) / 256 * 256; return base ? base + at : nullptr; };
        sc = (double *)take((size_t)(p.B * p.H * sc_stride(p)) * 8);
        x = (double *)take(BHN * 8);
        r = (double *)take(BHN * 8);
        pv = (double *)take(BHN * 8);
        w = (double *)take(BHN * 8);
        gate = (C *)take(BHN * sizeof(C));
        P = W = R = dW = dmu = dr = dp = dw = adw = st = dz = nullptr;
        mu = lse = pd = dk_att = nullptr;
        zero_from = zero_bytes = 0;
        if (backward) {
            P = (double *)take(hist * 8);
            W = (double *)take(hist * 8);
            R = (double *)take(hist * 8);
            dW = (double *)take(hist * 8);
            dmu = (double *)take(BHN * 8);
            st = (double *)take(BHN * 8);
            dz = (double *)take(BHN * 8);
            dw = (double *)take(BHN * 8);
            adw = (double *)take(BHN * 8);
            zero_from = o; /* dr, dp start at 0 */
            dr = (double *)take(BHN * 8);
            dp = (double *)take(BHN * 8);
            zero_bytes = o - zero_from;
            mu = (C *)take(BHN * sizeof(C));
            lse = (C *)take(BHN * sizeof(C));
            pd = (C *)take(BHN * sizeof(C));
            dk_att = (C *)take(BHN * (size_t)(p.d > 0 ? p.d : 1) * sizeof(C));
        }
        bytes = o;
    }
};

/* The solve of every (b, h), with the history when P is not NULL; ba: the backward's arguments (NULL in
 * the forward), whose upstream gradients say which (b, h) are solved at all (init_kernel). */
template <typename T, typename C>
static cudaError_t solve(const mag_params &p, const mag_fwd_args &a, const mag_bwd_args *ba, const Scratch<C> &s,
                         cudaStream_t stream) {
    const long long tiles = (p.N + NW - 1) / NW, bh = p.B * p.H;
    if (tiles > 2147483647LL || bh > MAX_GRID_Y) return cudaErrorInvalidConfiguration;
    const dim3 rows((unsigned)tiles, (unsigned)bh), per_bh((unsigned)bh);
    const double eps_type = sizeof(C) == sizeof(float) ? (double)FLT_EPSILON : DBL_EPSILON;
    const Layout L = make_layout(p, sizeof(C), false);
    cudaError_t e = prepare_smem(matvec_kernel<T, C>, L.bytes);
    if (e != cudaSuccess) return e;
    if ((e = launch(init_kernel<T>, per_bh, NTV, 0, stream, p, a, ba ? 1 : 0, ba ? (const T *)ba->grad_out : nullptr,
                    ba ? (const T *)ba->grad_mu : nullptr, s.sc, s.x, s.r, s.pv)) != cudaSuccess)
        return e;
    for (int64_t it = 0; it < p.n_iter; it++) {
        if ((e = launch(matvec_kernel<T, C>, rows, NW * 32, (size_t)L.bytes, stream, p, a, (const double *)s.sc,
                        (const double *)s.pv, s.w, it, 0, L)) != cudaSuccess)
            return e;
        if ((e = launch(step_kernel, per_bh, NTV, 0, stream, p, s.sc, s.x, s.r, s.pv, (const double *)s.w, s.P, s.W,
                        s.R, it, eps_type)) != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

template <typename T, typename C>
static cudaError_t forward(const mag_params &p, const mag_fwd_args &a, cudaStream_t stream) {
    if (p.N == 0 || p.B * p.H == 0) return cudaSuccess;
    const Scratch<C> measure(p, nullptr, false);
    char *base = nullptr;
    cudaError_t e = scratch_alloc(&base, measure.bytes, stream);
    if (e != cudaSuccess) return e;
    const Scratch<C> s(p, base, false);
    e = solve<T, C>(p, a, nullptr, s, stream);
    const dim3 rows((unsigned)((p.N + NW - 1) / NW), (unsigned)(p.B * p.H));
    if (e == cudaSuccess)
        e = launch(gate_kernel<T, C>, dim3((unsigned)((p.N + 255) / 256), (unsigned)(p.B * p.H)), 256, 0, stream, p, a,
                   (const double *)s.x, s.gate, (C *)nullptr, (T *)a.mu);
    if (e == cudaSuccess && p.dv > 0) { /* dv = 0: only mu is wanted (a value gate) */
        const Layout L = make_layout(p, sizeof(C), true);
        e = prepare_smem(rows_kernel<T, C>, L.bytes);
        if (e == cudaSuccess)
            e = launch(rows_kernel<T, C>, rows, NW * 32, (size_t)L.bytes, stream, p, a, (const double *)s.sc,
                       (const C *)s.gate, (const T *)nullptr, (C *)nullptr, (C *)nullptr, 0, L);
    }
    const cudaError_t f = scratch_free(base, stream);
    return e != cudaSuccess ? e : f;
}

template <typename T, typename C>
static cudaError_t backward_launches(const mag_params &p, const mag_bwd_args &ba, const Scratch<C> &s, char *base,
                                     cudaStream_t stream) {
    const mag_fwd_args &a = ba.in;
    cudaError_t e = cudaMemsetAsync(base + s.zero_from, 0, s.zero_bytes, stream);
    if (e != cudaSuccess) return e;
    if ((e = solve<T, C>(p, a, &ba, s, stream)) != cudaSuccess) return e;
    const unsigned BH = (unsigned)(p.B * p.H);
    const dim3 rows((unsigned)((p.N + NW - 1) / NW), BH), per_bh(BH);
    if ((e = launch(gate_kernel<T, C>, dim3((unsigned)((p.N + 255) / 256), BH), 256, 0, stream, p, a,
                    (const double *)s.x, s.gate, s.mu, (T *)nullptr)) != cudaSuccess)
        return e;
    const Layout Lb = make_layout(p, sizeof(C), true), La = make_layout(p, sizeof(C), false);
    if (p.dv > 0) {
        if ((e = prepare_smem(rows_kernel<T, C>, Lb.bytes)) != cudaSuccess) return e;
        if ((e = launch(rows_kernel<T, C>, rows, NW * 32, (size_t)Lb.bytes, stream, p, a, (const double *)s.sc,
                        (const C *)s.gate, (const T *)ba.grad_out, s.lse, s.pd, 1, Lb)) != cudaSuccess)
            return e;
        if ((e = prepare_smem(dq_kernel<T, C>, Lb.bytes)) != cudaSuccess) return e;
        if ((e = launch(dq_kernel<T, C>, rows, NW * 32, (size_t)Lb.bytes, stream, p, ba, (const C *)s.gate,
                        (const C *)s.lse, (const C *)s.pd, Lb)) != cudaSuccess)
            return e;
    } else if (p.d > 0) { /* only mu was used: no attention term */
        if ((e = cudaMemsetAsync(ba.dq, 0, sizeof(T) * (size_t)(p.B * p.H * p.N * p.d), stream)) != cudaSuccess) return e;
    }
    if ((e = prepare_smem(cols_kernel<T, C>, Lb.bytes)) != cudaSuccess) return e;
    if ((e = launch(cols_kernel<T, C>, rows, NW * 32, (size_t)Lb.bytes, stream, p, ba, (const double *)s.sc,
                    (const C *)s.gate, (const C *)s.lse, (const C *)s.pd, s.dk_att, s.dmu, s.dz, Lb)) != cudaSuccess)
        return e;
    for (int64_t it = p.n_iter - 1; it >= 0; it--) {
        if ((e = launch(back_step_kernel, per_bh, NTV, 0, stream, p, s.sc, (const double *)s.P, (const double *)s.W,
                        (const double *)s.R, (const double *)s.dmu, s.dr, s.dp, s.dw, (const double *)s.adw, s.dW,
                        it)) != cudaSuccess)
            return e;
        if (it > 0 && (e = launch(matvec_kernel<T, C>, rows, NW * 32, (size_t)La.bytes, stream, p, a,
                                  (const double *)s.sc, (const double *)s.dw, s.adw, it, 1, La)) != cudaSuccess)
            return e;
    }
    if ((e = prepare_smem(pairs_kernel<T, C>, La.bytes)) != cudaSuccess) return e;
    if ((e = launch(pairs_kernel<T, C>, rows, NW * 32, (size_t)La.bytes, stream, p, ba, (const double *)s.sc,
                    (const double *)s.P, (const double *)s.dW, (const C *)s.dk_att, s.st, La)) != cudaSuccess)
        return e;
    return launch(params_kernel<T, C>, dim3((unsigned)p.H), NTV, 0, stream, p, ba, (const double *)s.st,
                  (const double *)s.dz, (const C *)s.mu);
}

template <typename T, typename C>
static cudaError_t backward(const mag_params &p, const mag_bwd_args &ba, cudaStream_t stream) {
    if (p.H > 0) {
        cudaError_t e = cudaMemsetAsync(ba.dparams, 0, sizeof(T) * 3 * (size_t)p.H, stream);
        if (e != cudaSuccess) return e;
    }
    if (p.N == 0 || p.B * p.H == 0) return cudaSuccess;
    const Scratch<C> measure(p, nullptr, true);
    char *base = nullptr;
    cudaError_t e = scratch_alloc(&base, measure.bytes, stream);
    if (e != cudaSuccess) return e;
    const Scratch<C> s(p, base, true);
    e = backward_launches<T, C>(p, ba, s, base, stream);
    const cudaError_t f = scratch_free(base, stream);
    return e != cudaSuccess ? e : f;
}

}  // namespace mag
}  // namespace asc

extern "C" int magnitude_cuda_fwd(const mag_params *p, const mag_fwd_args *a, int dtype, cudaStream_t stream) {
    switch (dtype) {
        case ASC_CUDA_F32: return (int)asc::mag::forward<float, float>(*p, *a, stream);
        case ASC_CUDA_F64: return (int)asc::mag::forward<double, double>(*p, *a, stream);
        case ASC_CUDA_F16: return (int)asc::mag::forward<__half, float>(*p, *a, stream);
        case ASC_CUDA_BF16: return (int)asc::mag::forward<__nv_bfloat16, float>(*p, *a, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}

extern "C" int magnitude_cuda_bwd(const mag_params *p, const mag_bwd_args *a, int dtype, cudaStream_t stream) {
    switch (dtype) {
        case ASC_CUDA_F32: return (int)asc::mag::backward<float, float>(*p, *a, stream);
        case ASC_CUDA_F64: return (int)asc::mag::backward<double, double>(*p, *a, stream);
        case ASC_CUDA_F16: return (int)asc::mag::backward<__half, float>(*p, *a, stream);
        case ASC_CUDA_BF16: return (int)asc::mag::backward<__nv_bfloat16, float>(*p, *a, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
