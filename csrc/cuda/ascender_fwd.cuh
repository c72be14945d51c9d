/*
 * ascender_fwd.cuh -- the forward kernel (docs/cuda.md), used by the forward launcher
 * and, with full-precision outputs, by the backward to rebuild each row's statistics.
 *
 * Per warp (one query row), streaming over the key tiles of its (batch, head) that the block's rows
 * can see (next_tile: with a window, its keys and the global ones only):
 *   pass 1  geometry: n_i, rho, W = sum wc, centroid sum, streaming top-k (paper), first
 *           key of T(i); then c_i, the heading u_i and gate_a
 *   pass 2  shifted sums of w = (r, phi, rcq) (shift = the value at the first key of T(i),
 *           so a constant row has exactly zero deviation) and sum wc rcq -> G, gate_c, means
 *   pass 3  sum of squared deviations -> the standard deviations
 *   pass 4  online softmax: running max, sum, output and the two auxiliary sums; the sink logit
 *           joins the sum at the end (SPEC section 12)
 *   pass 5  (maps only) the five inspection maps from the final log-sum-exp
 */
#ifndef ASCENDER_CUDA_FWD_CUH
#define ASCENDER_CUDA_FWD_CUH

#include "common.cuh"

namespace asc {

/* Extra per-row values for the backward (rowx), beside stats. */
enum { RX_MU = 0, RX_SD = 3, RX_G = 6, RX_N = 7 };

/*
 * T: input element type; C: compute type; TO: element type of out, stats, u, c (T for the
 * public forward, C for the backward's rebuild). rowx: [B*H*Nq][RX_N] or NULL; gtile: global_tiles
 * (with a global_mask) or NULL.
 */
template <typename T, typename C, typename TO>
__global__ void __launch_bounds__(NW * 32) fwd_kernel(const asc_params p, const asc_fwd_args a, C *rowx,
                                                       const int32_t *gtile, const Layout L) {
    ASC_DYNAMIC_SMEM(smem_raw);
    C *sm = reinterpret_cast<C *>(smem_raw);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t bh = grid_y(), b = bh / p.H, hd = bh % p.H;
    if (bh >= p.B * p.H) return;
    const int64_t i = (int64_t)blockIdx.x * NW + w;
    C *wsm = sm + L.wbase + (long)w * L.wstride;
    C *wbuf = wsm + L.wbuf, *accz = wsm + L.accz, *accv = wsm + L.accv, *m = wsm + L.m, *nval = wsm + L.nval;
    int64_t *nidx = reinterpret_cast<int64_t *>(smem_raw + L.nidx) + (long)w * p.n_nbr;
    const T *kb = (const T *)a.k + bh * p.N * p.d;
    const C tcoh = (C)(p.tau_coh + EPS_TAU);

    Row<T, C> r;
    setup_row(r, p, a, wsm, L, b, hd, i, lane);
    const int64_t jmax = block_max(r.jend);
    const int64_t nmax = r.paper ? p.n_nbr : 0;
    const Span sp = make_span(p, a, gtile, b);

    /* ---- pass 1 ---- */
    C rho = 0, wsum = 0;
    int64_t n_stat = 0, n_soft = 0, jfirst = INT64_MAX, cnt = 0;
    C thr = 0;
    for (int64_t f = lane; f < p.dz; f += 32) accz[f] = (C)0;
    for (int64_t j0 = next_tile(sp, r, 0, jmax, lane); j0 < jmax; j0 = next_tile(sp, r, j0 + TK, jmax, lane)) {
        load_tile<T, C>(sm, L, p, a, bh, j0, false);
        if (r.active && j0 < r.jend) {
            const int64_t j = j0 + lane;
            const Key<C> e = eval_key(r, sm, L, lane, j, 1);
            n_soft += e.allow;
            n_stat += e.instat;
            if (e.instat && j < jfirst) jfirst = j;
            rho += (r.paper && j == r.t) ? (C)0 : e.ws; /* paper: rho over l != i */
            wsum += e.wc;
            wbuf[lane] = e.wc;
            const unsigned in_t = tile_members(e.instat); /* the centroid sums over T(i) only */
            __syncwarp();
            for (int64_t f = lane; f < p.dz; f += 32) {
                C s = 0;
                for (unsigned mm = in_t; mm; mm &= mm - 1) {
                    const int jj = __ffs(mm) - 1;
                    s += wbuf[jj] * sm[L.Zs + (long)jj * L.ldz + f];
                }
                accz[f] += s;
            }
            if (nmax > 0) { /* streaming top-k of a_ij (or s_ij) over T(i) \ {t}, keys in index order */
                const C rank = r.scores ? e.s : e.a;
                unsigned cand = __ballot_sync(FULL, e.instat && j != r.t && (cnt < nmax || rank > thr));
                while (cand) {
                    const int src = __ffs(cand) - 1;
                    cand &= cand - 1;
                    const C av = __shfl_sync(FULL, rank, src);
                    const int64_t jv = __shfl_sync(FULL, j, src);
                    if (lane == 0) cnt = topk_push(nidx, nval, cnt, nmax, jv, av);
                    cnt = __shfl_sync(FULL, cnt, 0);
                }
                __syncwarp();
                thr = cnt > 0 ? nval[cnt - 1] : (C)0;
            }
            __syncwarp();
        }
        __syncthreads();
    }
    rho = warp_sum(rho);
    wsum = warp_sum(wsum);
    n_stat = warp_sum(n_stat);
    n_soft = warp_sum(n_soft);
    jfirst = warp_min(jfirst);
    C unorm = 1, gate_a = 1, gate_c = 1, G = 0;
    if (r.active) {
        for (int64_t f = lane; f < p.dz; f += 32) r.c[f] = accz[f] / (wsum + (C)EPS_TAU);
        if (r.paper) paper_heading(r, kb, nidx, cnt, m, p.alpha_align, lane, &unorm, &gate_a);
        else reference_heading(r, kb, lane);
    }
    const C eta = clamp01(rho / (head_scalar<T, C>(a, SC_KAPPA, hd) + (C)EPS_TAU));

    /* ---- pass 2: shifted sums of w over T(i) and sum wc rcq ---- */
    C shift[3] = {0, 0, 0}, s1[3] = {0, 0, 0}, gsum = 0;
    for (int64_t j0 = next_tile(sp, r, 0, jmax, lane); j0 < jmax; j0 = next_tile(sp, r, j0 + TK, jmax, lane)) {
        load_tile<T, C>(sm, L, p, a, bh, j0, false);
        if (r.active && j0 < r.jend) {
            const int64_t j = j0 + lane;
            const Key<C> e = eval_key(r, sm, L, lane, j, 2);
            if (jfirst >= j0 && jfirst < j0 + TK)
                for (int x = 0; x < 3; x++) shift[x] = __shfl_sync(FULL, e.w[x], (int)(jfirst - j0));
            for (int x = 0; x < 3; x++) s1[x] += e.instat ? e.w[x] - shift[x] : (C)0;
            gsum += e.instat ? e.wc * e.w[2] : (C)0; /* a key outside T(i): wc = 0, its rcq maybe NaN */
        }
        __syncthreads();
    }
    for (int x = 0; x < 3; x++) {
        s1[x] = warp_sum(s1[x]);
        r.mu[x] = n_stat > 0 ? shift[x] + s1[x] / (C)n_stat : (C)0;
    }
    gsum = warp_sum(gsum);
    G = gsum / (wsum + (C)EPS_TAU);  /* saved for both variants (stats column COH_SPREAD) */
    if (r.paper) gate_c = sigmoid((C)p.alpha_coh * G);

    /* ---- pass 3: squared deviations ---- */
    C s2[3] = {0, 0, 0};
    for (int64_t j0 = next_tile(sp, r, 0, jmax, lane); j0 < jmax; j0 = next_tile(sp, r, j0 + TK, jmax, lane)) {
        load_tile<T, C>(sm, L, p, a, bh, j0, false);
        if (r.active && j0 < r.jend) {
            const Key<C> e = eval_key(r, sm, L, lane, j0 + lane, 2);
            for (int x = 0; x < 3; x++) {
                const C dv = e.w[x] - r.mu[x];
                s2[x] += e.instat ? dv * dv : (C)0;
            }
        }
        __syncthreads();
    }
    const int64_t n_div = r.paper ? n_stat : n_stat - 1; /* population / unbiased */
    for (int x = 0; x < 3; x++) r.sd[x] = n_stat > 1 ? sq(warp_sum(s2[x]) / (C)n_div) : (C)0;
    row_coefficients(r, a, hd, eta, gate_a, gate_c, tcoh, n_stat);

    /* ---- pass 4: online softmax ---- */
    C mx = -inf_of<C>(), lsum = 0, aux_c = 0, aux_s = 0;
    for (int64_t f = lane; f < p.dv; f += 32) accv[f] = (C)0;
    for (int64_t j0 = next_tile(sp, r, 0, jmax, lane); j0 < jmax; j0 = next_tile(sp, r, j0 + TK, jmax, lane)) {
        load_tile<T, C>(sm, L, p, a, bh, j0, true);
        if (r.active && j0 < r.jend) {
            const Key<C> e = eval_key(r, sm, L, lane, j0 + lane, 3);
            const C tmax = warp_max(e.allow ? e.x : -inf_of<C>());
            const C mnew = tmax > mx ? tmax : mx;
            if (mnew > -inf_of<C>()) { /* warp-uniform */
                const C factor = mx > -inf_of<C>() ? ex(mx - mnew) : (C)0;
                const C ej = e.allow ? ex(e.x - mnew) : (C)0;
                lsum = lsum * factor + warp_sum(ej);
                /* a key outside J(i) has ej = 0 and maybe non-finite rcq, phi: selected away */
                aux_c = aux_c * factor + warp_sum(e.allow ? ej * e.w[2] : (C)0);
                aux_s = aux_s * factor + warp_sum(e.allow ? ej * e.w[1] : (C)0);
                wbuf[lane] = ej * e.keep; /* dropout: the output sums the kept pairs, scaled by 1 / (1 - p) */
                const unsigned in_j = tile_members(e.allow); /* the output sums over J(i) only */
                __syncwarp();
                for (int64_t f = lane; f < p.dv; f += 32) {
                    C s = 0;
                    for (unsigned mm = in_j; mm; mm &= mm - 1) {
                        const int jj = __ffs(mm) - 1;
                        s += wbuf[jj] * sm[L.Vs + (long)jj * L.ldv + f];
                    }
                    accv[f] = accv[f] * factor + s;
                }
                __syncwarp();
                mx = mnew;
            }
        }
        __syncthreads();
    }
    /* sinks (SPEC section 12): exp(sink - mx) joins lsum, all taken about max(mx, sink) (no exp
     * overflows); y = accv num / den, LSE = top + log(den). A row without a visible key stays 0. */
    C top = mx, num = 1, den = lsum;
    if (a.sinks && n_soft > 0) {
        const C sink = (C)up(((const T *)a.sinks)[ASC_SINK_AT(&p, b, hd, i)]); /* (per head or per row) */
        if (sink <= mx) {
            den = lsum + ex(sink - mx);
        } else { /* (a NaN sink too: then every output of the row is NaN) */
            num = ex(mx - sink);
            den = lsum * num + (C)1;
            top = sink;
        }
    }
    const C lse = n_soft > 0 ? top + lg(den) : inf_of<C>();

    /* ---- outputs of the row ---- */
    bool sick = false; /* the row saw a non-finite input (its maps are NaN: pass 5) */
    if (r.active) {
        const int64_t row = bh * p.Nq + i;
        TO *out = (TO *)a.out + row * p.dv;
        float *r32 = rows32_at(p, a.rows32, row);
        bool nf = false;
        for (int64_t f = lane; f < p.dv; f += 32) {
            const C y = n_soft > 0 ? accv[f] * num / den : (C)0;
            put(out + f, y);
            if (r32) r32[ASC_ROWS32_OUT(&p) + f] = (float)y;
            nf |= !finite(up(out[f])); /* as stored, as the CPU kernels read it back */
        }
        sick = __any_sync(FULL, nf) || lse != lse; /* an empty row: LSE = +inf, output 0, not sick */
        for (int64_t f = lane; f < p.d; f += 32) {
            put((TO *)a.u + row * p.d + f, r.u[f]);
            if (r32) r32[ASC_ROWS32_U(&p) + f] = (float)r.u[f];
        }
        for (int64_t f = lane; f < p.dz; f += 32) {
            put((TO *)a.c + row * p.dz + f, r.c[f]);
            if (r32) r32[ASC_ROWS32_C(&p) + f] = (float)r.c[f];
        }
        for (int64_t n = lane; n < p.n_nbr; n += 32) a.nbr[row * p.n_nbr + n] = n < cnt ? nidx[n] : -1;
        if (lane < ASC_NSTAT) {
            C v = 0;
            const int x = lane;
            switch (x) {
                case ASC_STAT_LSE: v = lse; break;
                case ASC_STAT_MEAN_A: case ASC_STAT_MEAN_S: case ASC_STAT_MEAN_C:
                    v = r.theta[(x - ASC_STAT_MEAN_A) / 2] * r.mu[(x - ASC_STAT_MEAN_A) / 2]; break;
                case ASC_STAT_STD_A: case ASC_STAT_STD_S: case ASC_STAT_STD_C: {
                    const C th = r.theta[(x - ASC_STAT_STD_A) / 2];
                    v = (th < (C)0 ? -th : th) * r.sd[(x - ASC_STAT_STD_A) / 2];
                    break;
                }
                case ASC_STAT_RHO: v = rho; break;
                case ASC_STAT_WC_SUM: v = wsum; break;
                case ASC_STAT_GATE_A: v = gate_a; break;
                case ASC_STAT_GATE_C: v = gate_c; break;
                case ASC_STAT_UNORM: v = unorm; break;
                case ASC_STAT_COUNT: v = (C)n_stat; break;
                case ASC_STAT_COH_SPREAD: v = G; break;
                default: break;
            }
            put((TO *)a.stats + row * ASC_NSTAT + x, v);
            if (r32) r32[x] = (float)v;
        }
        if (lane < 2) {
            const C x = a.aux && n_soft > 0 ? (lane == 0 ? aux_c : aux_s) * num / den : (C)0;
            if (a.aux) put((TO *)a.aux + row * 2 + lane, x);
            if (r32) r32[ASC_ROWS32_AUX(&p) + lane] = (float)x;
        }
        if (rowx && lane < RX_N) {
            C v = lane < RX_SD ? r.mu[lane] : (lane < RX_G ? r.sd[lane - RX_SD] : G);
            rowx[row * RX_N + lane] = v;
        }
    }

    /* ---- pass 5: inspection maps over every key ---- */
    /* A row that saw a non-finite input (its LSE NaN or an output not finite: asc_row_sick of the CPU
     * kernels) is NaN in all five maps, as the twin makes it (SPEC section 11). */
    if (!a.map_attn) return; /* uniform over the grid */
    r.jend = r.active ? p.N : 0;
    for (int64_t j0 = 0; j0 < p.N; j0 += TK) {
        load_tile<T, C>(sm, L, p, a, bh, j0, false);
        const int64_t j = j0 + lane;
        if (r.active && j < p.N && sick) {
            const int64_t o = (bh * p.Nq + i) * p.N + j;
            const C nan = (C)NAN;
            put((TO *)a.map_sbase + o, nan);
            put((TO *)a.map_align + o, nan);
            put((TO *)a.map_sep + o, nan);
            put((TO *)a.map_coh + o, nan);
            put((TO *)a.map_attn + o, nan);
        } else if (r.active && j < p.N) {
            const Key<C> e = eval_key(r, sm, L, lane, j, 3);
            const int64_t o = (bh * p.Nq + i) * p.N + j;
            put((TO *)a.map_sbase + o, e.s);
            TO *maps[3] = {(TO *)a.map_align, (TO *)a.map_sep, (TO *)a.map_coh};
            for (int x = 0; x < 3; x++) {
                const C th = r.theta[x] < (C)0 ? -r.theta[x] : r.theta[x];
                put(maps[x] + o, (n_stat > 1 && e.instat)
                                     ? r.theta[x] * (e.w[x] - r.mu[x]) / (th * r.sd[x] + (C)EPS_STD)
                                     : (C)0);
            }
            put((TO *)a.map_attn + o, (n_soft > 0 && e.allow) ? ex(e.x - lse) : (C)0);
        }
        __syncthreads();
    }
}

}  // namespace asc

#endif /* ASCENDER_CUDA_FWD_CUH */
