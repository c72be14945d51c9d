/*
 * ascender_bwd.cu -- the CUDA backward (docs/backward.md for the math, docs/cuda.md for the
 * design): the dispatch to the tiled backward (ascender_bwd_tiled.cu) for the calls
 * asc_tiled_bwd_takes accepts, and the row-per-warp backward for the others. Plain CUDA C++, no torch.
 *
 * 1. fwd_kernel rebuilds every row's statistics, heading, centroid, neighbours and output
 *    in the compute type (O(rows) scratch).
 * 2. bwd_kernel, one warp per query row over the shared key tiles:
 *      pass A  dS_j and the per-row sums (sum dS, sum dS (w - mu), sum_T (w - mu), dT)
 *      pass B  dc = -2 sum_j drc_j (z_j - c)
 *      pass C  every per-key gradient: column parts into shared [TK][f] buffers (shared
 *              atomics over the block's rows, then one global atomicAdd per element into
 *              O(N) per-(b, h) accumulators), row parts into per-warp vectors
 *    then the row's dq, the heading's backward (neighbours / own key) and its scalars.
 * 3. finalize_kernel: dk = dk_direct + normalize-backward(k, dk^), dh likewise, casts.
 */
#include "ascender_fwd.cuh"
#include "tiled.h"

namespace asc {

/* Per-head gradient accumulators: the nine learnable scalars in SPEC order, then the sink logit (dsc holds
 * [9][H], then the sinks' ASC_SINK_COUNT gradients in their layout: [H] per head, per-row sinks' shape). */
enum { ACC_SINK = ASC_NSCALAR, NACC };

/* Column accumulators per token: [dk | dk^ | dv | dz | dh^]. */
struct Cols {
    int64_t F, k, kh, v, z, h;
    __host__ __device__ explicit Cols(const asc_params &p)
        : F(2 * p.d + p.dv + p.dz + p.da), k(0), kh(p.d), v(2 * p.d), z(2 * p.d + p.dv), h(2 * p.d + p.dv + p.dz) {}
};

/* A_ij, dS_ij = dL/dS_ij and dSx = dL/dx_ij / (score_temp + 1e-6) of one key (dA_j = dy.v_j m_ij / (1 - p)
 * + w_c rcq_j + w_s phi_j: the dropout mask, the auxiliary-loss weights). Without a softcap dS = dSx; with
 * one x = S' / (score_temp + 1e-6), S' = c tanh(S / c), so dS = dSx (1 - tanh^2) = dSx (1 - (x' / cap)^2)
 * with cap = c / (score_temp + 1e-6) and x' = x - xo the capped part of x (an outside cap leaves beta_other
 * out), and the temperature's gradient is -sum dSx x (docs/cuda.md). */
template <typename T, typename C>
__device__ __forceinline__ void key_dS(const Row<T, C> &r, const Key<C> &e, const C *vj, const C *dy, C wcoh, C wsep,
                                       C lse, C P, C *A, C *dS, C *dSx) {
    if (!e.allow) {
        *A = *dS = *dSx = (C)0;
        return;
    }
    C dA = 0;
    for (int64_t f = 0; f < r.dv; f++) dA += dy[f] * vj[f];
    dA = dA * e.keep + wcoh * e.w[2] + wsep * e.w[1];
    *A = ex(e.x - lse);
    *dSx = *A * (dA - P) * r.itemp;
    const C th = (e.x - e.xo) * r.icap; /* tanh(S / c) */
    *dS = r.cap != (C)0 ? *dSx * ((C)1 - th * th) : *dSx;
}

/* Per-row factors of the backward, from pass A (docs/backward.md passes 2-3). */
template <typename C>
struct RowGrad {
    C bA[3], bB[3], bC[3], devm[3]; /* B^X_j = bA dS_j + bB + bC (theta (w_j - mu) - devm) on T(i) */
    C cA, cphi, drho, crc, cG, dG, dV, Wd;
    C wcoh, wsep;                   /* incoming gradients of the two aux terms (coh, sep) */
};

/* The per-key adjoints of pass 3 of docs/backward.md. */
template <typename C>
struct KeyGrad {
    C B[3], dws, da, drc;
};

template <typename T, typename C>
__device__ __forceinline__ KeyGrad<C> key_grads(const Row<T, C> &r, const RowGrad<C> &g, const Key<C> &e, int64_t j,
                                                C A, C dS) {
    KeyGrad<C> k;
    for (int x = 0; x < 3; x++)
        k.B[x] = e.instat ? g.bA[x] * dS + g.bB[x] + g.bC[x] * (r.theta[x] * (e.w[x] - r.mu[x]) - g.devm[x]) : (C)0;
    const C red = e.a - r.delta;
    const C dphi = g.cphi * k.B[1] + g.wsep * A;
    const bool dens = e.instat && !(r.paper && j == r.t); /* j in T' */
    /* outside T(i) ws = phi = 0 and nothing flows (selected: a_ij there may be NaN); inside, the relu and
     * its mask [red > 0] keep a NaN affinity, as the forward's phi does */
    k.dws = e.instat ? dphi * relu(red) + (dens ? g.drho : (C)0) : (C)0;
    k.da = red <= (C)0 ? (C)0 : dphi * e.ws;
    k.drc = g.crc * k.B[2] + g.cG * e.wc + g.wcoh * A;
    return k;
}

template <typename C> __device__ __forceinline__ C absval(C x) { return x < (C)0 ? -x : x; }

/* x[from .. to) = 0 in the element type, by a warp. */
template <typename C, typename T> __device__ __forceinline__ void put_zeros(T *x, int64_t from, int64_t to, int lane) {
    for (int64_t j = from + lane; j < to; j += 32) put(x + j, (C)0);
}

template <typename T, typename C>
__global__ void __launch_bounds__(NW * 32) bwd_kernel(const asc_params p, const asc_bwd_args ba, const C *st, const C *auxs,
                                                       const C *cs, const int64_t *nbr, const C *ys, const C *rowx,
                                                       C *cols, C *dsc, const int32_t *gtile, const Layout L) {
    ASC_DYNAMIC_SMEM(smem_raw);
    __shared__ C dsc_s[NW][NACC];
    C *sm = reinterpret_cast<C *>(smem_raw);
    const asc_fwd_args &a = ba.in;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = grid_y(), b = bh / p.H, hd = bh % p.H;
    if (bh >= p.B * p.H) return;
    const int64_t i = (int64_t)blockIdx.x * NW + w, row = bh * p.Nq + i;
    C *wsm = sm + L.wbase + (long)w * L.wstride;
    C *wb = wsm + L.wbuf, *m = wsm + L.m, *dq = wsm + L.dq, *du = wsm + L.du, *dzt = wsm + L.dzt;
    C *dc = wsm + L.dc, *dht = wsm + L.dht, *dy = wsm + L.dy, *accz = wsm + L.accz;
    int64_t *nidx = reinterpret_cast<int64_t *>(smem_raw + L.nidx) + (long)w * p.n_nbr;
    const T *kb = (const T *)a.k + bh * p.N * p.d;
    const C tcoh = (C)(p.tau_coh + EPS_TAU), tsep = (C)(p.tau_sep + EPS_TAU);
    const Cols CL(p);

    for (long e = threadIdx.x; e < L.cH + (long)TK * L.ldh - L.cK; e += blockDim.x) sm[L.cK + e] = (C)0;

    Row<T, C> r;
    setup_row(r, p, a, wsm, L, b, hd, i, lane);
    const int64_t jmax = block_max(r.jend);
    const Span sp = make_span(p, a, gtile, b); /* the tiles the rebuild visited */

    /* ---- the row's forward state from the rebuild ---- */
    C lse = inf_of<C>(), rho = 0, wsum = 0, gate_a = 1, gate_c = 1, aux_c = 0, aux_s = 0, G = 0, unorm = 1;
    int64_t n_stat = 0, cnt = 0;
    if (r.active) {
        const C *s = st + row * ASC_NSTAT;
        lse = s[ASC_STAT_LSE];
        rho = s[ASC_STAT_RHO];
        wsum = s[ASC_STAT_WC_SUM];
        gate_c = s[ASC_STAT_GATE_C];
        aux_c = auxs[row * 2];
        aux_s = auxs[row * 2 + 1];
        n_stat = (int64_t)s[ASC_STAT_COUNT];
        for (int x = 0; x < 3; x++) {
            r.mu[x] = rowx[row * RX_N + RX_MU + x];
            r.sd[x] = rowx[row * RX_N + RX_SD + x];
        }
        G = rowx[row * RX_N + RX_G];
        for (int64_t f = lane; f < p.dz; f += 32) r.c[f] = cs[row * p.dz + f];
        for (int64_t f = lane; f < p.dv; f += 32) dy[f] = (C)up(((const T *)ba.grad_out)[row * p.dv + f]);
        for (int64_t f = lane; f < p.d; f += 32) dq[f] = du[f] = (C)0;
        for (int64_t f = lane; f < p.dz; f += 32) dzt[f] = accz[f] = (C)0;
        for (int64_t f = lane; f < p.da; f += 32) dht[f] = (C)0;
        if (r.paper) {
            for (int64_t n = 0; n < p.n_nbr; n++) cnt += nbr[row * p.n_nbr + n] >= 0;
            for (int64_t n = lane; n < cnt; n += 32) nidx[n] = nbr[row * p.n_nbr + n];
            __syncwarp();
            paper_heading(r, kb, nidx, cnt, m, p.alpha_align, lane, &unorm, &gate_a);
        } else {
            reference_heading(r, kb, lane);
        }
    }
    const C kap = head_scalar<T, C>(a, SC_KAPPA, hd) + (C)EPS_TAU;
    const C eta = clamp01(rho / kap);
    row_coefficients(r, a, hd, eta, gate_a, gate_c, tcoh, n_stat);

    RowGrad<C> g;
    g.wcoh = (r.active && ba.grad_aux) ? (C)up(((const T *)ba.grad_aux)[row * 2]) : (C)0;
    g.wsep = (r.active && ba.grad_aux) ? (C)up(((const T *)ba.grad_aux)[row * 2 + 1]) : (C)0;
    /* A row takes part in the pairs only if an upstream gradient (dy, grad_aux) reaches them; a row
     * with neither contributes exactly zero there, and is skipped, never multiplied by zero: its
     * rebuilt state may be non-finite (a row that sees a NaN input), and the gradients of a loss over
     * the other rows must stay finite (SPEC section 11), as in the CPU backward. `upstream` adds
     * grad_u, which reaches only the row's heading. Warp-uniform. */
    bool pairs = false, upstream = false;
    if (r.active) {
        for (int64_t f = lane; f < p.dv; f += 32) pairs |= dy[f] != (C)0;
        pairs = __any_sync(FULL, pairs) || g.wcoh != (C)0 || g.wsep != (C)0;
        bool gu = false;
        if (ba.grad_u)
            for (int64_t f = lane; f < p.d; f += 32) gu |= (C)up(((const T *)ba.grad_u)[row * p.d + f]) != (C)0;
        upstream = pairs || __any_sync(FULL, gu);
    }
    const bool live = pairs && lse < inf_of<C>(); /* n_soft > 0 */
    C P = 0;
    if (live) {
        for (int64_t f = lane; f < p.dv; f += 32) P += dy[f] * ys[row * p.dv + f];
        P = warp_sum(P) + g.wcoh * aux_c + g.wsep * aux_s; /* sum_j A_j dA_j */
    }

    /* ---- pass A: per-row sums ---- */
    C sdS = 0, dT = 0, Cw[3] = {0, 0, 0}, Ew[3] = {0, 0, 0};
    for (int64_t j0 = next_tile(sp, r, 0, jmax, lane); j0 < jmax; j0 = next_tile(sp, r, j0 + TK, jmax, lane)) {
        load_tile<T, C>(sm, L, p, a, bh, j0, true);
        if (live && j0 < r.jend) {
            const int64_t j = j0 + lane;
            const Key<C> e = eval_key(r, sm, L, lane, j, 3);
            C A, dS, dSx;
            key_dS(r, e, sm + L.Vs + (long)lane * L.ldv, dy, g.wcoh, g.wsep, lse, P, &A, &dS, &dSx);
            sdS += dS;
            dT -= e.allow ? dSx * e.x : (C)0; /* x = S' / T~: through the capped score S' */
            for (int x = 0; x < 3; x++) {
                Cw[x] += e.allow ? dS * (e.w[x] - r.mu[x]) : (C)0; /* a masked key's w may be non-finite */
                Ew[x] += e.instat ? e.w[x] - r.mu[x] : (C)0;
            }
        }
        __syncthreads();
    }
    sdS = warp_sum(sdS);
    dT = warp_sum(dT);
    C R[3], dom[3];
    const C n = (C)n_stat, n1 = r.paper ? n : n - (C)1;
    for (int x = 0; x < 3; x++) {
        Cw[x] = warp_sum(Cw[x]);
        Ew[x] = warp_sum(Ew[x]);
        g.bA[x] = g.bB[x] = g.bC[x] = g.devm[x] = R[x] = dom[x] = (C)0;
        if (live && n_stat > 1) { /* else the normalized biases are 0: nothing reaches them */
            const C om = head_scalar<T, C>(a, SC_OA + x, hd), th = r.theta[x];
            const C sd = absval(th) * r.sd[x], den = sd + (C)EPS_STD;
            const C Gam = th * Cw[x];
            const C dsig = -om * Gam / (den * den);
            g.bA[x] = om / den;
            g.bB[x] = -(om * sdS / n) / den;
            g.bC[x] = sd > (C)0 ? dsig / (n1 * sd) : (C)0;
            g.devm[x] = th * Ew[x] / n; /* the mean's path through sigma (docs/backward.md pass 2) */
            R[x] = (C)EPS_STD / (den * den) * om * Cw[x]; /* sum_T B_j w_j without cancellation */
            dom[x] = Gam / den;
        }
    }
    const C la = head_scalar<T, C>(a, SC_LA, hd), ls = head_scalar<T, C>(a, SC_LS, hd);
    const C lc = head_scalar<T, C>(a, SC_LC, hd);
    g.cA = la * gate_a;
    g.dV = r.paper ? la * R[0] * gate_a * ((C)1 - gate_a) * (C)p.alpha_align : (C)0;
    const C deta = -ls * R[1];
    const C ratio = rho / kap;
    const bool in_clamp = ratio >= (C)0 && ratio <= (C)1;
    g.drho = in_clamp ? deta / kap : (C)0;
    g.cphi = -ls * eta;
    g.dG = r.paper ? (-(lc / tcoh) * R[2]) * gate_c * ((C)1 - gate_c) * (C)p.alpha_coh : (C)0;
    g.Wd = wsum + (C)EPS_TAU;
    g.crc = -lc * gate_c / tcoh;
    g.cG = g.dG / g.Wd;

    /* ---- pass B: dc = -2 sum_j drc_j (z_j - c) ---- */
    C sdrc = 0;
    for (int64_t j0 = next_tile(sp, r, 0, jmax, lane); j0 < jmax; j0 = next_tile(sp, r, j0 + TK, jmax, lane)) {
        load_tile<T, C>(sm, L, p, a, bh, j0, true);
        if (live && j0 < r.jend) {
            const int64_t j = j0 + lane;
            const Key<C> e = eval_key(r, sm, L, lane, j, 3);
            C A, dS, dSx;
            key_dS(r, e, sm + L.Vs + (long)lane * L.ldv, dy, g.wcoh, g.wsep, lse, P, &A, &dS, &dSx);
            const KeyGrad<C> k = key_grads(r, g, e, j, A, dS);
            sdrc += k.drc;
            wb[lane] = k.drc;
            __syncwarp();
            const int jn = tile_keys(r, j0);
            for (int64_t f = lane; f < p.dz; f += 32) {
                C s = 0;
                for (int jj = 0; jj < jn; jj++)
                    if (wb[jj] != (C)0) s += wb[jj] * sm[L.Zs + (long)jj * L.ldz + f]; /* skipped, not * 0 */
                accz[f] += s;
            }
            __syncwarp();
        }
        __syncthreads();
    }
    sdrc = warp_sum(sdrc);
    C dcc = 0;
    if (live) {
        for (int64_t f = lane; f < p.dz; f += 32) {
            dc[f] = (C)-2 * (accz[f] - r.c[f] * sdrc);
            dcc += dc[f] * r.c[f];
        }
        __syncwarp();
    }
    dcc = warp_sum(dcc);

    /* ---- pass C: every per-key gradient ---- */
    C sdD = 0, sda = 0;
    T *dbias = (T *)ba.dattn_bias, *dbrow = dbias ? dbias + row * p.N : nullptr;
    int64_t jz = 0; /* the row of dattn_bias is written below jz: the visited tiles' dS, zeros between them */
    for (int64_t j0 = next_tile(sp, r, 0, jmax, lane); j0 < jmax; j0 = next_tile(sp, r, j0 + TK, jmax, lane)) {
        load_tile<T, C>(sm, L, p, a, bh, j0, true);
        if (live && j0 < r.jend) {
            const int64_t j = j0 + lane;
            const C *zj = sm + L.Zs + (long)lane * L.ldz;
            const Key<C> e = eval_key(r, sm, L, lane, j, 3);
            C A, dS, dSx;
            key_dS(r, e, sm + L.Vs + (long)lane * L.ldv, dy, g.wcoh, g.wsep, lse, P, &A, &dS, &dSx);
            const KeyGrad<C> k = key_grads(r, g, e, j, A, dS);
            if (dbrow) put_zeros<C>(dbrow, jz, j0, lane); /* the tiles skipped since the last one */
            C dcz = 0;
            for (int64_t f = 0; f < p.dz; f++) dcz += dc[f] * zj[f];
            const C dwc = e.instat ? (dcz - dcc + g.dG * (e.w[2] - G)) / g.Wd : (C)0;
            const C dD = -k.dws * e.ws / tsep - dwc * e.wc / tcoh;
            const bool valid = j < r.jend;
            sdD += dD;
            sda += k.da;
            if (dbrow && valid) put(dbrow + j, r.outside ? dSx : dS); /* dL/dattn_bias: past an outside cap */
            if (valid) { /* column side: shared buffers of this tile */
                const C ck = r.scale * dS, ckh = g.cA * k.B[0];
                if (ck != (C)0)
                    for (int64_t f = 0; f < p.d; f++) atomicAdd(sm + L.cK + (long)lane * L.ldk + f, ck * r.q[f]);
                if (ckh != (C)0)
                    for (int64_t f = 0; f < p.d; f++) atomicAdd(sm + L.cKh + (long)lane * L.ldk + f, ckh * r.u[f]);
                const C Ad = A * e.keep; /* dv_j = sum_i A_ij m_ij / (1 - p) dy_i */
                if (Ad != (C)0)
                    for (int64_t f = 0; f < p.dv; f++) atomicAdd(sm + L.cV + (long)lane * L.ldv + f, Ad * dy[f]);
                const C cz = (C)2 * (k.drc + dD), cc = (C)-2 * k.drc, ci = (C)-2 * dD, wcj = e.wc / g.Wd;
                if (cz != (C)0 || cc != (C)0 || wcj != (C)0)
                    for (int64_t f = 0; f < p.dz; f++)
                        atomicAdd(sm + L.cZ + (long)lane * L.ldz + f, cz * zj[f] + cc * r.c[f] + wcj * dc[f] + ci * r.zt[f]);
                if (k.da != (C)0)
                    for (int64_t f = 0; f < p.da; f++)
                        atomicAdd(sm + L.cH + (long)lane * L.ldh + f, k.da * r.ht[f]); /* h^_t */
            }
            /* row side: dq, du = sum cA B_j k^_j, dz_t, dh^_t (lane per feature) */
            wb[lane] = dS;
            wb[TK + lane] = k.B[0] != (C)0 ? g.cA * k.B[0] * sm[L.rk + lane] : (C)0; /* 1/||k_j||: maybe NaN */
            wb[2 * TK + lane] = dD;
            wb[3 * TK + lane] = k.da; /* times h^_j (the tile holds h^) */
            __syncwarp();
            /* a zero weight (a masked key among them) is skipped, never multiplied: the key's inputs
             * may be non-finite (SPEC section 11); the branch is uniform across the warp */
            const int jn = tile_keys(r, j0);
            for (int64_t f = lane; f < p.d; f += 32) {
                C s0 = 0, s1 = 0;
                for (int jj = 0; jj < jn; jj++) {
                    const C kv = sm[L.Ks + (long)jj * L.ldk + f];
                    if (wb[jj] != (C)0) s0 += wb[jj] * kv;
                    if (wb[TK + jj] != (C)0) s1 += wb[TK + jj] * kv;
                }
                dq[f] += s0;
                du[f] += s1;
            }
            for (int64_t f = lane; f < p.dz; f += 32) {
                C s = 0;
                for (int jj = 0; jj < jn; jj++)
                    if (wb[2 * TK + jj] != (C)0) s += wb[2 * TK + jj] * sm[L.Zs + (long)jj * L.ldz + f];
                dzt[f] += s;
            }
            for (int64_t f = lane; f < p.da; f += 32) {
                C s = 0;
                for (int jj = 0; jj < jn; jj++)
                    if (wb[3 * TK + jj] != (C)0) s += wb[3 * TK + jj] * sm[L.Hs + (long)jj * L.ldh + f];
                dht[f] += s;
            }
            jz = j0 + TK < r.jend ? j0 + TK : r.jend;
            __syncwarp();
        }
        __syncthreads();
        /* flush the tile's column buffers: one global atomicAdd per nonzero element */
        const long bufs[5] = {L.cK, L.cKh, L.cV, L.cZ, L.cH};
        const int lds[5] = {L.ldk, L.ldk, L.ldv, L.ldz, L.ldh};
        const int64_t fs[5] = {p.d, p.d, p.dv, p.dz, p.da}, gofs[5] = {CL.k, CL.kh, CL.v, CL.z, CL.h};
        for (int s = 0; s < 5; s++) {
            for (int64_t e = threadIdx.x; e < (int64_t)TK * fs[s]; e += blockDim.x) {
                const int64_t jj = e / fs[s], f = e - jj * fs[s], j = j0 + jj;
                C *src = sm + bufs[s] + jj * lds[s] + f;
                const C v = *src;
                if (v != (C)0 && j < p.N) atomicAdd(cols + (bh * p.N + j) * CL.F + gofs[s] + f, v);
                *src = (C)0;
            }
        }
        __syncthreads();
    }
    sdD = warp_sum(sdD);
    sda = warp_sum(sda);

    /* ---- the row: dq, the own token's z and h^, the heading, dattn_bias past jend ---- */
    if (r.active) {
        T *dqo = (T *)ba.dq + row * p.d;
        for (int64_t f = lane; f < p.d; f += 32) put(dqo + f, live ? r.scale * dq[f] : (C)0);
        C *ct = cols + (bh * p.N + r.t) * CL.F;
        if (live) {
            for (int64_t f = lane; f < p.dz; f += 32) atomicAdd(ct + CL.z + f, (C)2 * (r.zt[f] * sdD - dzt[f]));
            for (int64_t f = lane; f < p.da; f += 32) atomicAdd(ct + CL.h + f, dht[f]);
        }
        /* du: the alignment row's part (0 for an empty row) plus the incoming dL/du */
        if (ba.grad_u)
            for (int64_t f = lane; f < p.d; f += 32) du[f] += (C)up(((const T *)ba.grad_u)[row * p.d + f]);
        if (!upstream) { /* no gradient reaches the row: its heading (maybe non-finite) is not read */
        } else if (!r.paper) { /* u = k^_t */
            for (int64_t f = lane; f < p.d; f += 32)
                if (du[f] != (C)0) atomicAdd(ct + CL.kh + f, du[f]);
        } else if (cnt > 0) { /* through u = m / max(||m||, eps) to the neighbours' k^_l */
            C udu = 0;
            for (int64_t f = lane; f < p.d; f += 32) udu += r.u[f] * du[f];
            udu = warp_sum(udu);
            const bool heading = unorm > (C)EPS_HEADING * (C)cnt; /* else u = 0: no gradient through it */
            for (int64_t f = lane; f < p.d; f += 32) du[f] = heading ? (du[f] - r.u[f] * udu) / unorm : (C)0;
            const C dVc = (C)2 * g.dV / (C)cnt;
            for (int64_t nb = 0; nb < cnt; nb++) {
                const int64_t l = nidx[nb];
                const T *kl = kb + l * p.d;
                const C rkl = warp_inv_norm<C>(kl, p.d, lane);
                C *cl = cols + (bh * p.N + l) * CL.F + CL.kh;
                for (int64_t f = lane; f < p.d; f += 32)
                    atomicAdd(cl + f, du[f] + dVc * ((C)up(kl[f]) * rkl - m[f] / (C)cnt));
            }
        }
        if (dbrow) put_zeros<C>(dbrow, live ? jz : 0, p.N, lane); /* past the last visited tile, or the whole row */
    }

    /* ---- the learnable scalars: per warp, per block, then one atomic per scalar ---- */
    if (lane == 0) { /* selected, not multiplied by 0: a row outside `live` may have non-finite gates */
        dsc_s[w][SC_LA] = live ? gate_a * R[0] : (C)0;
        dsc_s[w][SC_LS] = live ? -eta * R[1] : (C)0;
        dsc_s[w][SC_LC] = live ? -(gate_c / tcoh) * R[2] : (C)0;
        for (int x = 0; x < 3; x++) dsc_s[w][SC_OA + x] = live ? dom[x] : (C)0;
        dsc_s[w][SC_TEMP] = live ? dT : (C)0;
        dsc_s[w][SC_DELTA] = live ? -sda : (C)0;
        dsc_s[w][SC_KAPPA] = (live && in_clamp) ? -deta * rho / (kap * kap) : (C)0;
        /* the sink's weight is exp(sink - LSE) (LSE includes it): dsink = -exp(sink - LSE) P (docs/backward.md) */
        const int64_t sk = a.sinks ? ASC_SINK_AT(&p, b, hd, live ? i : 0) : 0;
        dsc_s[w][ACC_SINK] = (live && a.sinks) ? -ex((C)up(((const T *)a.sinks)[sk]) - lse) * P : (C)0;
        /* per-query sinks: each row's own entry (the block's rows share one where sk_si = 0) */
        if (p.sk_si && dsc_s[w][ACC_SINK] != (C)0) atomicAdd(dsc + ASC_NSCALAR * p.H + sk, dsc_s[w][ACC_SINK]);
    }
    __syncthreads();
    if (threadIdx.x < NACC && !(threadIdx.x == ACC_SINK && p.sk_si)) {
        C s = 0;
        for (int k = 0; k < NW; k++) s += dsc_s[k][threadIdx.x];
        const int64_t at = threadIdx.x == ACC_SINK ? ASC_NSCALAR * p.H + ASC_SINK_AT(&p, b, hd, 0) : threadIdx.x * p.H + hd;
        if (s != (C)0) atomicAdd(dsc + at, s);
    }
}


/* One warp per token: dk, dv, dz, dh from the accumulators; block 0 also stores dscalars (and dsinks). */
template <typename T, typename C>
__global__ void __launch_bounds__(NW * 32) finalize_kernel(const asc_params p, const asc_bwd_args ba, const C *cols,
                                                            const C *dsc) {
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const Cols CL(p);
    if (blockIdx.x == 0) {
        for (int64_t s = threadIdx.x; s < ASC_NSCALAR * p.H; s += blockDim.x) put((T *)ba.dscalars + s, dsc[s]);
        if (ba.dsinks)
            for (int64_t s = threadIdx.x; s < ASC_SINK_COUNT(&p); s += blockDim.x)
                put((T *)ba.dsinks + s, dsc[ASC_NSCALAR * p.H + s]);
    }
    const int64_t tok = (int64_t)blockIdx.x * NW + w;
    if (tok >= p.B * p.H * p.N) return;
    const C *g = cols + tok * CL.F;
    normalize_backward_store((T *)ba.dk + tok * p.d, g + CL.k, (const T *)ba.in.k + tok * p.d, g + CL.kh, p.d, lane);
    normalize_backward_store((T *)ba.dh + tok * p.da, (const C *)nullptr, (const T *)ba.in.h + tok * p.da, g + CL.h,
                             p.da, lane);
    for (int64_t f = lane; f < p.dv; f += 32) put((T *)ba.dv + tok * p.dv + f, g[CL.v + f]);
    for (int64_t f = lane; f < p.dz; f += 32) put((T *)ba.dz + tok * p.dz + f, g[CL.z + f]);
}

/* Scratch of one backward call, one stream-ordered allocation. */
template <typename C>
struct Scratch {
    C *st, *aux, *u, *c, *y, *rowx, *cols, *dsc;
    int64_t *nbr;
    int32_t *gtile; /* global_tiles, or NULL without a global_mask */
    size_t bytes, zero_from, zero_bytes;
    Scratch(const asc_params &p, const asc_fwd_args &a, char *base) {
        const size_t rows = (size_t)(p.B * p.H * p.Nq), toks = (size_t)(p.B * p.H * p.N);
        size_t o = 0;
        auto take = [&](size_t n) { const size_t at = o; o += (n + 31) / 32 * 32; return base ? base + at : nullptr; };
        nbr = (int64_t *)take(rows * (size_t)p.n_nbr * 8);
        st = (C *)take(rows * ASC_NSTAT * sizeof(C));
        aux = (C *)take(rows * 2 * sizeof(C));
        u = (C *)take(rows * (size_t)p.d * sizeof(C));
        c = (C *)take(rows * (size_t)p.dz * sizeof(C));
        y = (C *)take(rows * (size_t)p.dv * sizeof(C));
        rowx = (C *)take(rows * RX_N * sizeof(C));
        gtile = global_tiles_bytes(p, a) ? (int32_t *)take(global_tiles_bytes(p, a)) : nullptr;
        zero_from = o;
        cols = (C *)take(toks * (size_t)Cols(p).F * sizeof(C));
        dsc = (C *)take((size_t)(ASC_NSCALAR * p.H + (a.sinks ? ASC_SINK_COUNT(&p) : 0)) * sizeof(C));
        zero_bytes = o - zero_from;
        bytes = o;
    }
};

template <typename T, typename C>
static cudaError_t backward_launches(const asc_params &p, const asc_bwd_args &ba, const Scratch<C> &s,
                                     char *base, cudaStream_t stream) {
    cudaError_t e = cudaMemsetAsync(base + s.zero_from, 0, s.zero_bytes, stream);
    if (e != cudaSuccess) return e;
    dim3 grid;
    if (p.Nq > 0) {
        if (!row_grid(p, &grid)) return cudaErrorInvalidConfiguration;
        if ((e = global_tiles(p, ba.in, s.gtile, stream)) != cudaSuccess) return e;
        asc_fwd_args fa = ba.in;
        fa.out = s.y;
        fa.stats = s.st;
        fa.aux = s.aux;
        fa.u = s.u;
        fa.c = s.c;
        fa.nbr = s.nbr;
        fa.rows32 = nullptr; /* (the caller's is read-only here) */
        fa.map_sbase = fa.map_align = fa.map_sep = fa.map_coh = fa.map_attn = nullptr;
        const Layout Lf = make_layout(p, sizeof(C), false);
        if ((e = prepare_smem(fwd_kernel<T, C, C>, Lf.bytes)) != cudaSuccess) return e;
        if ((e = launch(fwd_kernel<T, C, C>, grid, NW * 32, (size_t)Lf.bytes, stream, p, fa, s.rowx, s.gtile, Lf)) !=
            cudaSuccess)
            return e;
        const Layout Lb = make_layout(p, sizeof(C), true);
        if ((e = prepare_smem(bwd_kernel<T, C>, Lb.bytes)) != cudaSuccess) return e;
        if ((e = launch(bwd_kernel<T, C>, grid, NW * 32, (size_t)Lb.bytes, stream, p, ba, s.st, s.aux, s.c, s.nbr, s.y,
                        s.rowx, s.cols, s.dsc, s.gtile, Lb)) != cudaSuccess)
            return e;
    }
    const long long blocks = (p.B * p.H * p.N + NW - 1) / NW;
    if (blocks > 2147483647LL) return cudaErrorInvalidConfiguration;
    return launch(finalize_kernel<T, C>, dim3((unsigned)(blocks > 0 ? blocks : 1)), NW * 32, 0, stream, p, ba, s.cols,
                  s.dsc);
}

template <typename T, typename C>
static cudaError_t backward(const asc_params &p, const asc_bwd_args &ba, cudaStream_t stream) {
    if (p.H > 0) {
        cudaError_t e = cudaMemsetAsync(ba.dscalars, 0, sizeof(T) * ASC_NSCALAR * (size_t)p.H, stream);
        if (e == cudaSuccess && ba.dsinks)
            e = cudaMemsetAsync(ba.dsinks, 0, sizeof(T) * (size_t)ASC_SINK_COUNT(&p), stream);
        if (e != cudaSuccess) return e;
    }
    if (p.B * p.H == 0 || p.N == 0) return cudaSuccess;
    const Scratch<C> measure(p, ba.in, nullptr);
    char *base = nullptr;
    cudaError_t e = scratch_alloc(&base, measure.bytes, stream);
    if (e != cudaSuccess) return e;
    const Scratch<C> s(p, ba.in, base);
    e = backward_launches<T, C>(p, ba, s, base, stream);
    const cudaError_t f = scratch_free(base, stream);
    return e != cudaSuccess ? e : f;
}

}  // namespace asc

extern "C" int ascender_cuda_fits(const asc_params *p, int dtype, int backward) {
    if (dtype != ASC_CUDA_F32 && dtype != ASC_CUDA_F64 && dtype != ASC_CUDA_F16 && dtype != ASC_CUDA_BF16) return 0;
    const long csize = dtype == ASC_CUDA_F64 ? 8 : 4; /* the row-per-warp kernels' compute type */
    asc_bwd_args a{};
    const bool fwd = asc_tiled_fwd_takes(p, &a.in, dtype) || asc::smem_fits(asc::make_layout(*p, csize, false).bytes);
    /* the row-per-warp backward runs its own forward first, whose layout is the smaller */
    return fwd && (!backward || asc_tiled_bwd_takes(p, &a, dtype) ||
                   asc::smem_fits(asc::make_layout(*p, csize, true).bytes));
}

extern "C" int ascender_cuda_bwd(const asc_params *p, const asc_bwd_args *a, int dtype, cudaStream_t stream) {
    if (asc_tiled_bwd_takes(p, a, dtype)) return asc_tiled_bwd(p, a, dtype, stream);
    switch (dtype) {
        case ASC_CUDA_F32: return (int)asc::backward<float, float>(*p, *a, stream);
        case ASC_CUDA_F64: return (int)asc::backward<double, double>(*p, *a, stream);
        case ASC_CUDA_F16: return (int)asc::backward<__half, float>(*p, *a, stream);
        case ASC_CUDA_BF16: return (int)asc::backward<__nv_bfloat16, float>(*p, *a, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
