/*
 * decode_sweeps.cuh -- the three sweeps of the CUDA decode kernels over one chunk of keys, a lane per key
 * (docs/cuda.md "Decode"): F1 geometry, F2 moments, F3 softmax for each of the call's few query rows
 * (Nq <= 8), row after row. A warp takes 32 consecutive keys at a time; each lane reads its key's rows
 * (16-byte loads where the rows allow) and forms the pair's values with fused multiply-adds in the compute
 * type against the row's operands, copied for the sweep into shared memory in that type (DecOps), so no lane
 * idles on a row that does not exist (the m16 tiles of the training forward left 15 of 16 rows idle at
 * Nq = 1). The sums over keys that are vectors (the centroid numerator of F1, the output numerator of F3) run
 * lane per feature over the 32 keys, their weights read from shared memory. Every
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

/* The decode copy of row `row`'s operands (DecOps): q (the scores' ranking: wq), u and c~ with their rounding
 * errors added back (wuc: F2, F3), z~_t and hs_t (wzh: F1, F3). Whole warp. */
template <typename T, class Tr>
__device__ void dec_ops(const FwdSmem<T, Tr> &S, const asc_params &p, int row, bool wq, bool wuc, bool wzh,
                        int lane) {
    using C = typename Elem<T>::C;
    const auto copy = [&](C *to, const T *hi, const T *lo, int64_t n) {
        for (int64_t f = lane; f < n; f += 32) to[f] = lo ? (C)up(hi[f]) + (C)up(lo[f]) : (C)up(hi[f]);
    };
    if (wq) copy(S.dec.q, S.ro.Q.row(row), nullptr, p.d);
    if (wuc) {
        copy(S.dec.u, S.ro.U.row(row), S.ro.Ulo ? S.ro.Ulo + (int64_t)row * S.ro.U.ld : nullptr, p.d);
        copy(S.dec.c, S.ro.Cr.row(row), S.ro.Clo ? S.ro.Clo + (int64_t)row * S.ro.Cr.ld : nullptr, p.dz);
    }
    if (wzh) {
        copy(S.dec.zt, S.ro.Zr.row(row), nullptr, p.dz);
        copy(S.dec.ht, S.ro.Hr.row(row), nullptr, p.da);
    }
    __syncwarp();
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

/* G adjacent elements of a row (one load of G elements). */
template <typename T, int G> struct alignas(G * sizeof(T)) Pack {
    T v[G];
};

/* The features f0 .. f0 + 32 G - 1 of add_lane_rows, G adjacent ones per lane (n a multiple of G, the rows aligned
 * to G elements). */
template <int G, typename T, typename C>
__device__ __forceinline__ void lane_rows_block(C *acc, unsigned mask, C scl, const C *wsh, const T *x, int64_t n,
                                                int64_t f0, int lane) {
    constexpr int W = 16 / (int)sizeof(C);
    const int64_t f = f0 + G * lane;
    const bool in = f < n;
    C s[G];
    ASC_UNROLL
    for (int g = 0; g < G; g++) {
        s[g] = in ? acc[f + g] : (C)0;
        if (scl != (C)1) s[g] *= scl;
    }
    const Pack<T, G> *xf = reinterpret_cast<const Pack<T, G> *>(x + f);
    const int64_t ld = n / G;
    ASC_UNROLL
    for (int l0 = 0; l0 < 32; l0 += W) {
        const CVec<C, W> wv = *reinterpret_cast<const CVec<C, W> *>(wsh + l0);
        ASC_UNROLL
        for (int e = 0; e < W; e++)
            if (in && ((mask >> (l0 + e)) & 1u)) {
                const Pack<T, G> v = xf[(l0 + e) * ld];
                ASC_UNROLL
                for (int g = 0; g < G; g++) s[g] += wv.v[e] * (C)up(v.v[g]);
            }
    }
    if (in)
        for (int g = 0; g < G; g++) acc[f + g] = s[g];
}

/*
 * acc[f] = acc[f] scl + the sum over the lanes l of mask, in lane order, of w_l x_l[f] (f < n, a lane per feature,
 * two adjacent ones where the rows are longer than 32 and allow it; x_l the row of key l of the tile at x, rows of n
 * elements; scl == 1: acc as it is). The weights go through shared memory (wsh, 32 of them, read 16 bytes at a time)
 * and the 32 lanes are unrolled, so that the rows' loads issue ahead of their products. Whole warp.
 */
template <typename T, typename C>
__device__ __forceinline__ void add_lane_rows(C *acc, unsigned mask, C w, C scl, C *wsh, const T *x, int64_t n,
                                              int lane) {
    wsh[lane] = w;
    __syncwarp();
    if (n > 32 && n % 2 == 0 && ((uintptr_t)x % (2 * sizeof(T))) == 0)
        for (int64_t f0 = 0; f0 < n; f0 += 64) lane_rows_block<2>(acc, mask, scl, wsh, x, n, f0, lane);
    else
        for (int64_t f0 = 0; f0 < n; f0 += 32) lane_rows_block<1>(acc, mask, scl, wsh, x, n, f0, lane);
    __syncwarp(); /* every lane has read wsh before it is written again */
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
    using A = KeyAcc<T>;
    const C *const zt[1] = {S.dec.zt}, *const ht[1] = {S.dec.ht}, *const q[1] = {S.dec.q};
    for (int row = 0; row < p.Nq; row++) {
        const DecRow R = dec_row(p, row);
        RowState<C> &rs = S.rs[row];
        C *P = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < S.ldo; f += 32) P[f] = (C)0;
        if (lane == 0) *S.list_cnt(row) = 0;
        dec_ops(S, p, row, B.scores, false, true, lane);
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
            C zz[1] = {0}, qk[1] = {0};
            A z2 = 0, hh = 0, hd[1] = {0}, unused = 0;
            if (key) {
                key_dots<1>(B.zb + j * p.dz, p.dz, zt, zz, z2);
                key_dots<1>(B.hb + j * p.da, p.da, ht, hd, hh);
                if (B.scores) key_dots<1>(B.kb + j * p.d, p.d, q, qk, unused);
            }
            const C nzj = (C)z2, a = key_affinity(B.hb + j * p.da, p.da, S.dec.ht, hd[0], hh) * shr;
            C D = sq_dist(nzr + nzj, zz[0]);
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
            const C rank = B.scores ? scale * qk[0] : a;
            const unsigned cand = __ballot_sync(FULL, B.nmax > 0 && inT && !self && !(rank <= thr));
            if (cand) {
                topk_push_lanes(nidx, nval, S.list_cnt(row), B.nmax, cand, (int32_t)j, rank, lane);
                thr = *S.list_cnt(row) == B.nmax ? nval[B.nmax - 1] : (C)NAN;
                __syncwarp(); /* every lane has read the list before the next tile rewrites it */
            }
            /* centroid numerator: P~ += wc z_j over T(i), lane per feature */
            add_lane_rows(P, __ballot_sync(FULL, inT), wcv, (C)1, S.dec.w, B.zb + j0 * p.dz, p.dz, lane);
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
    using A = KeyAcc<T>;
    const C *const u[1] = {S.dec.u}, *const cr[1] = {S.dec.c};
    for (int row = 0; row < p.Nq; row++) {
        const DecRow R = dec_row(p, row);
        RowState<C> &rs = S.rs[row];
        dec_ops(S, p, row, false, true, false, lane);
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
            C uk[1] = {0}, cz[1] = {0};
            A k2 = 0, z2 = 0;
            if (j < p.N) {
                key_dots<1>(B.kb + j * p.d, p.d, u, uk, k2);
                key_dots<1>(B.zb + j * p.dz, p.dz, cr, cz, z2);
            }
            const C r = uk[0] * usc * (C)key_inv_norm(B.kb + j * p.d, p.d, k2), rc = sq_dist(ncc + (C)z2, cz[0]);
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
    using A = KeyAcc<T>;
    const C *const qu[2] = {S.dec.q, S.dec.u}, *const zc[2] = {S.dec.zt, S.dec.c}, *const ht[1] = {S.dec.ht};
    for (int row = 0; row < p.Nq; row++) {
        const DecRow R = dec_row(p, row);
        RowState<C> &rs = S.rs[row];
        C *O = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < S.ldo; f += 32) O[f] = (C)0;
        dec_ops(S, p, row, true, true, true, lane);
        const XCoef<C> cf = xcoef(rs.cf);
        const bool extras = other || cf.cap != (C)0;
        const C nzr = rs.nzr, ncc = rs.ncc, usc = rs.usc, shr = rs.shr;
        C mx = -inf_of<C>();
        double l = 0, ac = 0, as = 0; /* per lane, about the warp's running maximum mx */
        const int64_t se = soft_end(B.vis, R.t), end = se < jend ? se : jend;
        dec_tiles(B.vis, R.t, jbeg, end, [&](int64_t j0, int vis) {
            const int64_t j = j0 + lane;
            bool inJ, inT;
            pair_sets(B.vis, vis, R.i, R.t, j, inJ, inT);
            C gu[2] = {0, 0}, zzc[2] = {0, 0}; /* q.k, u.k; z~_t.z~_j, c~.z~_j */
            A k2 = 0, z2 = 0, hh = 0, hd[1] = {0};
            if (j < p.N) {
                key_dots<2>(B.kb + j * p.d, p.d, qu, gu, k2);
                key_dots<2>(B.zb + j * p.dz, p.dz, zc, zzc, z2);
                key_dots<1>(B.hb + j * p.da, p.da, ht, hd, hh);
            }
            const C nzj = (C)z2;
            C D = sq_dist(nzr + nzj, zzc[0]);
            if (j == R.t) D = (C)0;
            const C ws = ex_scaled<T>(D * nis);
            const C phi = ws * relu(key_affinity(B.hb + j * p.da, p.da, S.dec.ht, hd[0], hh) * shr - delta);
            const C rc = sq_dist(ncc + nzj, zzc[1]), r = gu[1] * usc * (C)key_inv_norm(B.kb + j * p.d, p.d, k2);
            C x = pair_score(cf, gu[0], r, phi, rc);
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
            add_lane_rows(O, __ballot_sync(FULL, inJ), ev, scl, S.dec.w, B.vb + j0 * p.dv, p.dv, lane);
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
