/*
 * decode_sweeps.cuh -- the three sweeps of the CUDA decode kernels over one chunk of keys, a lane per key
 * (docs/cuda.md "Decode"): F1 geometry, F2 moments, F3 softmax for each of the call's few query rows
 * (Nq <= 8), row after row. A warp takes 32 consecutive keys at a time; each lane reads its key's rows
 * (16-byte loads where the rows allow) and forms the pair's values with fused multiply-adds in the compute
 * type, so no lane idles on a row that does not exist (the m16 tiles of the training forward left 15 of 16
 * rows idle at Nq = 1). The sums over keys that are vectors (the centroid numerator of F1, the output
 * numerator of F3) run lane per feature over the 32 keys, their weights broadcast by shuffles. Every
 * per-row and per-pair rule is the training forward's: pair_sets (J(i), T(i)), next_tile (windows,
 * globals, documents), score_extras (attn_bias, ALiBi, softcap in either order), pair_score, topk_push,
 * moments_of, and the RowState fields that sweep_geometry, sweep_moments and sweep_softmax leave, which
 * the chunk merges and the per-row steps of forward.cuh read.
 */
#ifndef ASCENDER_CUDA_DECODE_SWEEPS_CUH
#define ASCENDER_CUDA_DECODE_SWEEPS_CUH

#include "forward.cuh"

namespace asc {
namespace tiled {

/* Keys a warp of a decode sweep takes at a time: a lane per key. */
constexpr int DEC_KEYS = 32;

/* 16 bytes of a key row (one vector load). */
template <typename T> struct alignas(16) Vec16 {
    T v[16 / sizeof(T)];
};

/* f(c, x[c]) for c < n along a row in global memory: 16-byte loads when the row is aligned and whole. */
template <typename T, typename F> __device__ __forceinline__ void key_row(const T *x, int64_t n, F f) {
    constexpr int W = 16 / (int)sizeof(T);
    if (n % W == 0 && ((uintptr_t)x & 15u) == 0) {
        for (int64_t c = 0; c < n; c += W) {
            const Vec16<T> v = *reinterpret_cast<const Vec16<T> *>(x + c);
            ASC_UNROLL
            for (int e = 0; e < W; e++) f(c + e, up(v.v[e]));
        }
    } else {
        for (int64_t c = 0; c < n; c++) f(c, up(x[c]));
    }
}

/* An operand row in shared memory as the compute type: hi + its rounding error lo (NULL: none). */
template <typename T> __device__ __forceinline__ typename Elem<T>::C op_at(const T *hi, const T *lo, int64_t c) {
    using C = typename Elem<T>::C;
    return lo ? (C)up(hi[c]) + (C)up(lo[c]) : (C)up(hi[c]);
}

/* 1 / max(||x||, 1e-12) from the sum of squares (as key_rk and prepare_tile form it). */
__device__ __forceinline__ double inv_norm(double ss) {
    const double n = sqrt(ss);
    return 1.0 / (n > EPS_NORM ? n : EPS_NORM);
}

/* The query row `row` of a decode block: its token and a LaneRows whose first row is it (score_extras). */
struct DecRow {
    int row;
    int64_t i, t;
    LaneRows L;
};

__device__ __forceinline__ DecRow dec_row(const asc_params &p, int row) {
    DecRow R;
    R.row = row;
    R.i = row;
    R.t = R.i + p.N - p.Nq - p.keys_after;
    for (int r = 0; r < 2; r++) {
        R.L.lr[r] = row;
        R.L.i[r] = R.i;
        R.L.t[r] = R.t;
        R.L.act[r] = r == 0;
    }
    return R;
}

/* Runs body(j0, vis) over the tiles of DEC_KEYS keys in [jbeg, end) that token t may see (next_tile; vis: the
 * tile's class for pair_sets). jbeg is a multiple of DEC_KEYS. Whole warp. */
template <typename Body>
__device__ __forceinline__ void dec_tiles(const Vis &vis, int64_t t, int64_t jbeg, int64_t end, Body body) {
    for (int64_t j0 = next_tile(vis, t, t, jbeg, end, DEC_KEYS); j0 < end;
         j0 = next_tile(vis, t, t, j0 + DEC_KEYS, end, DEC_KEYS)) {
        const int64_t jh = (j0 + DEC_KEYS < vis.N ? j0 + DEC_KEYS : vis.N) - 1;
        body(j0, vis.doc || !vis.windowed ? rect_vis(vis, t, t, j0, jh)
                                          : row_vis(vis, t, j0, jh, key_globals(vis, j0, jh)));
    }
}

/* acc[f] += w_l x_l[f] (f < n, lane per feature) for every lane l of mask, w_l being lane l's w and x_l the row
 * of key l of the tile at x (rows of n elements). */
template <typename T, typename C>
__device__ __forceinline__ void add_lane_rows(C *acc, unsigned mask, C w, const T *x, int64_t n, int lane) {
    while (mask) {
        const int l = __ffs((int)mask) - 1;
        mask &= mask - 1u;
        const C wl = __shfl_sync(FULL, w, l);
        const T *xl = x + l * n;
        for (int64_t f = lane; f < n; f += 32) acc[f] += wl * (C)up(xl[f]);
    }
}

/*
 * Shifted moments of a raw bias row over T(i) with a lane per key (Moments of rowcoef.cuh on the lane
 * layout): the shift K is the first entry in T(i) other than the row's own token, in key order (the lowest
 * lane of the first tile that has one), the sums of (w - K) and (w - K)^2 run per lane in double, and the
 * own entry, held back, joins at the end.
 */
template <typename C> struct LaneMoments {
    C K, Sv;
    bool have, selfin;
    double s1, s2;

    __device__ void reset() {
        K = Sv = (C)0;
        have = selfin = false;
        s1 = s2 = 0.0;
    }
    /* One key per lane: its value w, whether it is in T(i) other than the own token (other), the own one (own). */
    __device__ void add(C w, bool other, bool own) {
        if (!have) { /* warp-uniform */
            const unsigned m = __ballot_sync(FULL, other);
            if (m) {
                K = __shfl_sync(FULL, w, __ffs((int)m) - 1);
                have = true;
            }
        }
        if (other) {
            const C dv = w - K;
            s1 += (double)dv;
            s2 += (double)(dv * dv);
        }
        if (own) {
            Sv = w;
            selfin = true;
        }
    }
    __device__ void finish(int64_t n, double unb, int lane, double *mean, double *sd, double *m2) {
        const unsigned ws = __ballot_sync(FULL, selfin);
        const int who = ws ? __ffs((int)ws) - 1 : -1;
        const C sv = __shfl_sync(FULL, Sv, who < 0 ? lane : who);
        shifted_moments(K, have, sv, who, lane, s1, s2, [](double v) { return warp_sum(v); }, n, unb, mean, sd, m2);
    }
};

/* ---------------------------------------------------------------- F1 */

/* F1 over keys [jbeg, jend) of every row: the RowState sums of sweep_geometry, the centroid numerator in S.O and
 * the chunk's top-k lists (pushed in key order: the same list as one sweep). */
template <typename T, class Tr>
__device__ void dec_geometry(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, int64_t jbeg, int64_t jend) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const int lane = B.lane;
    const C nis = (C)(-exp_scale<T>() / (p.tau_sep + EPS_TAU)), nic = (C)(-exp_scale<T>() / (p.tau_coh + EPS_TAU));
    const C delta = (C)B.hd.v[H_DELTA], scale = (C)p.scale;
    const double unb = B.paper ? 0.0 : 1.0;
    for (int row = 0; row < p.Nq; row++) {
        const DecRow R = dec_row(p, row);
        RowState<C> &rs = S.rs[row];
        C *P = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < S.ldo; f += 32) P[f] = (C)0;
        if (lane == 0) *S.list_cnt(row) = 0;
        __syncwarp();
        const T *zt = S.ro.Zr.row(row), *ht = S.ro.Hr.row(row), *q = S.ro.Q.row(row);
        int32_t *nidx = S.list_idx(row);
        C *nval = S.list_val(row);
        const C nzr = rs.nzr, shr = rs.shr;
        C thr = (C)NAN; /* the list is not full: every entry is a candidate */
        double rho = 0, W = 0, Qz = 0;
        int64_t nst = 0, nso = 0;
        LaneMoments<C> mphi;
        mphi.reset();
        const int64_t se = stat_end(B.vis, R.t), end = se < jend ? se : jend;
        dec_tiles(B.vis, R.t, jbeg, end, [&](int64_t j0, int vis) {
            const int64_t j = j0 + lane;
            const bool key = j < p.N, self = j == R.t;
            bool inJ, inT;
            pair_sets(B.vis, vis, R.i, R.t, j, inJ, inT);
            C zz = 0, qk = 0;
            double z2 = 0.0, hh = 0.0, hd = 0.0;
            if (key) {
                key_row(B.zb + j * p.dz, p.dz, [&](int64_t c, C x) {
                    zz += (C)up(zt[c]) * x;
                    z2 += (double)x * (double)x;
                });
                key_row(B.hb + j * p.da, p.da, [&](int64_t c, C x) {
                    hd += (double)up(ht[c]) * (double)x;
                    hh += (double)x * (double)x;
                });
                if (B.scores) key_row(B.kb + j * p.d, p.d, [&](int64_t c, C x) { qk += (C)up(q[c]) * x; });
            }
            const C nzj = (C)z2, a = (C)(hd * inv_norm(hh)) * shr;
            C D = sq_dist(nzr + nzj, zz);
            if (self) D = (C)0;
            C ws = ex_scaled<T>(D * nis), wcv = ex_scaled<T>(D * nic);
            C ph = ws * relu(a - delta);
            if (!inT) ws = wcv = ph = (C)0; /* selected away: the key may be non-finite */
            rho += (B.paper && self) ? 0.0 : (double)ws;
            W += (double)wcv;
            Qz += inT ? (double)(wcv * nzj) : 0.0;
            nst += inT;
            nso += inJ;
            mphi.add(ph, inT && !self, inT && self);
            /* the top-k list: this tile's candidates pushed in key order */
            const C rank = B.scores ? scale * qk : a;
            unsigned cand = __ballot_sync(FULL, B.nmax > 0 && inT && !self && !(rank <= thr));
            if (cand) {
                while (cand) {
                    const int l = __ffs((int)cand) - 1;
                    cand &= cand - 1u;
                    const C rv = __shfl_sync(FULL, rank, l);
                    if (lane == 0) topk_push(nidx, nval, S.list_cnt(row), B.nmax, (int32_t)(j0 + l), rv);
                }
                __syncwarp();
                thr = *S.list_cnt(row) == B.nmax ? nval[B.nmax - 1] : (C)NAN;
                __syncwarp(); /* every lane has read the list before lane 0 pushes the next tile's candidates */
            }
            /* centroid numerator: P~ += wc z_j over T(i), lane per feature */
            add_lane_rows(P, __ballot_sync(FULL, inT), wcv, B.zb + j0 * p.dz, p.dz, lane);
        });
        const double Rh = warp_sum(rho), Wt = warp_sum(W), Q2 = warp_sum(Qz);
        const int64_t n = warp_sum(nst), ns = warp_sum(nso);
        double mean, sd, m2;
        mphi.finish(n, unb, lane, &mean, &sd, &m2);
        if (lane == 0) {
            rs.st[ASC_STAT_RHO] = Rh;
            rs.st[ASC_STAT_WC_SUM] = Wt;
            rs.st[ASC_STAT_COUNT] = (double)n;
            rs.sum.mom[1][0] = mean;
            rs.sum.mom[1][1] = sd;
            rs.sum.mom[1][2] = m2;
            rs.sum.qz = Q2;
            rs.nsoft = ns;
        }
        __syncwarp();
    }
}

/* ---------------------------------------------------------------- F2 */

/* F2 over keys [jbeg, jend) of every row: the moments of r and rc (n: the count in rs.st, as sweep_moments). */
template <typename T, class Tr>
__device__ void dec_moments(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, int64_t jbeg, int64_t jend) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const int lane = B.lane;
    const double unb = B.paper ? 0.0 : 1.0;
    for (int row = 0; row < p.Nq; row++) {
        const DecRow R = dec_row(p, row);
        RowState<C> &rs = S.rs[row];
        const T *U = S.ro.U.row(row), *Ulo = S.ro.Ulo ? S.ro.Ulo + (int64_t)row * S.ro.U.ld : nullptr;
        const T *Cr = S.ro.Cr.row(row), *Clo = S.ro.Clo ? S.ro.Clo + (int64_t)row * S.ro.Cr.ld : nullptr;
        const C ncc = rs.ncc, usc = rs.usc;
        LaneMoments<C> mr, mc;
        mr.reset();
        mc.reset();
        const int64_t se = stat_end(B.vis, R.t), end = se < jend ? se : jend;
        dec_tiles(B.vis, R.t, jbeg, end, [&](int64_t j0, int vis) {
            const int64_t j = j0 + lane;
            const bool self = j == R.t;
            bool inJ, inT;
            pair_sets(B.vis, vis, R.i, R.t, j, inJ, inT);
            C uk = 0, cz = 0;
            double k2 = 0.0, z2 = 0.0;
            if (j < p.N) {
                key_row(B.kb + j * p.d, p.d, [&](int64_t c, C x) {
                    uk += op_at(U, Ulo, c) * x;
                    k2 += (double)x * (double)x;
                });
                key_row(B.zb + j * p.dz, p.dz, [&](int64_t c, C x) {
                    cz += op_at(Cr, Clo, c) * x;
                    z2 += (double)x * (double)x;
                });
            }
            const C r = uk * usc * (C)inv_norm(k2), rc = sq_dist(ncc + (C)z2, cz);
            mr.add(r, inT && !self, inT && self);
            mc.add(rc, inT && !self, inT && self);
        });
        const int64_t n = (int64_t)rs.st[ASC_STAT_COUNT];
        double m0, s0, q0, m2, s2, q2;
        mr.finish(n, unb, lane, &m0, &s0, &q0);
        mc.finish(n, unb, lane, &m2, &s2, &q2);
        if (lane == 0) {
            const double mom[2][3] = {{m0, s0, q0}, {m2, s2, q2}};
            for (int k = 0; k < 3; k++) {
                rs.sum.mom[0][k] = mom[0][k];
                rs.sum.mom[2][k] = mom[1][k];
            }
        }
        __syncwarp();
    }
}

/* ---------------------------------------------------------------- F3 */

/* F3 over keys [jbeg, jend) of every row: the online softmax's maximum, sums and aux sums in rs, the output
 * numerator in S.O (as sweep_softmax leaves them). */
template <typename T, class Tr>
__device__ void dec_softmax(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, int64_t jbeg, int64_t jend) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const asc_fwd_args &a = B.a;
    const int lane = B.lane;
    const C nis = (C)(-exp_scale<T>() / (p.tau_sep + EPS_TAU)), delta = (C)B.hd.v[H_DELTA];
    const C L = (C)exp_scale<T>(), dscale = (C)p.dropout_scale;
    const bool aux = a.aux != nullptr, drop = a.dropout_seed != nullptr, other = a.attn_bias || a.alibi_slopes;
    const asc_dropout_stream ds = drop ? asc_dropout_stream_of(a.dropout_seed, B.bh) : asc_dropout_stream{};
    for (int row = 0; row < p.Nq; row++) {
        const DecRow R = dec_row(p, row);
        RowState<C> &rs = S.rs[row];
        C *O = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < S.ldo; f += 32) O[f] = (C)0;
        __syncwarp();
        const XCoef<C> cf = xcoef(rs.cf);
        const bool extras = other || cf.cap != (C)0;
        const C nzr = rs.nzr, ncc = rs.ncc, usc = rs.usc, shr = rs.shr;
        const T *q = S.ro.Q.row(row), *zt = S.ro.Zr.row(row), *ht = S.ro.Hr.row(row);
        const T *U = S.ro.U.row(row), *Ulo = S.ro.Ulo ? S.ro.Ulo + (int64_t)row * S.ro.U.ld : nullptr;
        const T *Cr = S.ro.Cr.row(row), *Clo = S.ro.Clo ? S.ro.Clo + (int64_t)row * S.ro.Cr.ld : nullptr;
        C mx = -inf_of<C>();
        double l = 0, ac = 0, as = 0; /* per lane, about the warp's running maximum mx */
        const int64_t se = soft_end(B.vis, R.t), end = se < jend ? se : jend;
        dec_tiles(B.vis, R.t, jbeg, end, [&](int64_t j0, int vis) {
            const int64_t j = j0 + lane;
            bool inJ, inT;
            pair_sets(B.vis, vis, R.i, R.t, j, inJ, inT);
            C gs = 0, uk = 0, zz = 0, cz = 0;
            double k2 = 0.0, z2 = 0.0, hh = 0.0, hd = 0.0;
            if (j < p.N) {
                key_row(B.kb + j * p.d, p.d, [&](int64_t c, C x) {
                    gs += (C)up(q[c]) * x;
                    uk += op_at(U, Ulo, c) * x;
                    k2 += (double)x * (double)x;
                });
                key_row(B.zb + j * p.dz, p.dz, [&](int64_t c, C x) {
                    zz += (C)up(zt[c]) * x;
                    cz += op_at(Cr, Clo, c) * x;
                    z2 += (double)x * (double)x;
                });
                key_row(B.hb + j * p.da, p.da, [&](int64_t c, C x) {
                    hd += (double)up(ht[c]) * (double)x;
                    hh += (double)x * (double)x;
                });
            }
            const C nzj = (C)z2;
            C D = sq_dist(nzr + nzj, zz);
            if (j == R.t) D = (C)0;
            const C ws = ex_scaled<T>(D * nis);
            const C phi = ws * relu((C)(hd * inv_norm(hh)) * shr - delta);
            const C rc = sq_dist(ncc + nzj, cz), r = uk * usc * (C)inv_norm(k2);
            C x = pair_score(cf, gs, r, phi, rc);
            if (extras) x = score_extras<T, C>(p, a, B.b, B.h, R.L, 0, j, x, cf);
            if (!inJ) x = -inf_of<C>();
            const C m = __shfl_sync(FULL, warp_max(x), 0), mnew = m > mx ? m : mx; /* lane 0's: NaN keeps lanes apart */
            C scl = mx > -inf_of<C>() ? ex_scaled<T>((mx - mnew) * L) : (C)0;
            if (mnew == -inf_of<C>()) scl = (C)1; /* nothing in J so far */
            mx = mnew;
            const C ej = inJ ? ex_scaled<T>(x * L - mnew * L) : (C)0;
            l = l * (double)scl + (double)ej;
            if (aux) { /* a key outside J(i): its rc, phi may be non-finite, selected away */
                ac = ac * (double)scl + (inJ ? (double)(ej * rc) : 0.0);
                as = as * (double)scl + (inJ ? (double)(ej * phi) : 0.0);
            }
            /* dropout: the output sums the kept pairs times 1 / (1 - p); l and aux every pair (SPEC section 9b) */
            const C ev = drop && inJ ? ej * (asc_dropout_keep(ds, R.t, j, p.dropout_threshold) ? dscale : (C)0) : ej;
            /* output numerator: O = O scl + sum over J of ev v_j, lane per feature */
            if (scl != (C)1)
                for (int64_t f = lane; f < p.dv; f += 32) O[f] *= scl;
            add_lane_rows(O, __ballot_sync(FULL, inJ), ev, B.vb + j0 * p.dv, p.dv, lane);
        });
        l = warp_sum(l);
        ac = warp_sum(ac);
        as = warp_sum(as);
        if (lane == 0) {
            rs.mx = mx;
            rs.l = l;
            rs.ac = ac;
            rs.as = as;
        }
        __syncwarp();
    }
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_DECODE_SWEEPS_CUH */
