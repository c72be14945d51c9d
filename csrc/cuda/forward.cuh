/*
 * forward.cuh -- the tensor-core forward of the ASCender op (docs/cuda.md, "The tensor-core kernels"):
 * a block per (b, h, BM query rows), three sweeps over the key tiles (docs/tiling.md section 3) and,
 * for the inspection maps, a fourth over every key.
 *   F1 geometry  products z.z, h.h (q.k with neighbours = "scores"); D, ws, wc, phi, rho, sums of wc and
 *                wc ||z~||^2, the moments of phi, the top-k (paper); row product wc . Z~ (centroid)
 *   F2 moments   products u.k, c~.z~; r, rc and their moments -- or, where every row's statistics run over all
 *                N keys, in closed form from per-(b, h) key sums (closed_moments, keymoments.cuh)
 *   F3 softmax   all five score products; x, online max and sum; row product e . V; aux sums
 * The per-row steps between the sweeps (centroid, heading, statistics, coefficients) run per warp,
 * row by row, lane per feature.
 */
#ifndef ASCENDER_CUDA_FORWARD_CUH
#define ASCENDER_CUDA_FORWARD_CUH

#include "keymoments.cuh"
#include "sweeps.cuh"

namespace asc {
namespace tiled {

/* A row's sums of F1 and F2, until bias_stats turns them into the statistics and the coefficients. */
struct RowSums {
    double qz;        /* sum of wc ||z~||^2 over T(i) (F1, for the centroid's spread) */
    double mom[3][3]; /* mean, std and sum of squared deviations of the raw rows r, phi, rc */
};

/* Per-row state of a block between the sweeps (shared memory). The sums and the coefficients share their
 * bytes: bias_stats reads the one and then writes the other (80 of the 376 bytes a row took, 5 KB a block:
 * with the top-k lists in O's spare columns it lets two paper blocks share an SM, docs/cuda.md). */
template <typename C> struct RowState {
    double st[ASC_NSTAT]; /* the statistics as computed (double) */
    union {
        RowSums sum;      /* F1, F2 .. bias_stats */
        Coef<C> cf;       /* bias_stats .. the end: the score coefficients (F3, the maps) */
    };
    double l, ac, as;     /* F3: sum of e^(x - mx), of e rc and of e phi */
    C mx;                 /* F3: the running maximum of x */
    C nzr, ncc, usc, shr; /* ||z~_t||^2, ||c~_i||^2, the heading's scale, the semantic row's scale */
    int64_t nsoft;
    bool sick;            /* the row saw a non-finite input (its maps are NaN) */
    bool fall;            /* closed_moments: the key sums cannot give this row's moments (the block sweeps F2) */
};

/* The decode sweeps' copy of the row they run (decode_sweeps.cuh): its operands in the compute type (u and c~ with
 * their rounding errors added back), each 16-byte aligned for vector reads, and the warp's 32 key weights of a tile. */
template <typename C> struct DecOps {
    C *q, *u, *c, *zt, *ht, *w;
    __host__ __device__ void place(Carve &cv, const asc_params &p) {
        q = cv.array<C>(p.d);
        u = cv.array<C>(p.d);
        c = cv.array<C>(p.dz);
        zt = cv.array<C>(p.dz);
        ht = cv.array<C>(p.da);
        w = cv.array<C>(32);
    }
};

/* The block's shared memory (docs/cuda.md: key tiles double-buffered, row operands, accumulators). */
template <typename T, class Tr> struct FwdSmem {
    using C = typename Elem<T>::C;
    KeyStages<T> ks;       /* key tiles of BN keys, Tr::STAGES stages */
    RowOps<T> ro;          /* the block's BM rows of q, u (split on the mma path, paper), c~ (split), z~_t, hs_t */
    C *O;                  /* [BM][ldo]: the centroid numerator (F1), then the output numerator (F3) */
    int ldo;
    /* The top-k lists of F1 (paper; the seed variant keeps the counts only): row r's nmax values, indices and
     * count. The row-major kernels keep them in O's columns past the centroid's fpad(dz), which nothing else
     * uses until F3 zeroes O (rows_geometry reads the lists beside the centroid), when they fit there; decode
     * and wider lists keep them apart. */
    C *nval;
    int32_t *nidx, *ncnt;
    int nlv, nli;          /* row strides of nval (elements of C) and of nidx and ncnt (int32) */
    RowState<C> *rs;       /* [BM] */
    DecOps<C> dec;         /* decode (no key stages) only */
    int64_t bytes;

    __host__ __device__ void place(unsigned char *base, const asc_params &p) {
        Carve cv(base);
        const int64_t BM = Tr::BM;
        if (Tr::STAGES > 0) ks.place(cv, p, Tr::BN, Tr::STAGES); /* none for decode: its lanes read their keys */
        ro.place(cv, p, Tr::BM, Elem<T>::kMma && p.variant == ASC_VARIANT_PAPER, Elem<T>::kMma);
        const int64_t of = fpad_of<T>(p.dv > p.dz ? p.dv : p.dz);
        ldo = (int)acc_stride<T>(of);
        O = cv.array<C>(BM * ldo);
        const int64_t nmax = p.variant == ASC_VARIANT_PAPER ? p.n_nbr : 0, c0 = fpad_of<T>(p.dz);
        const int64_t list_bytes = nmax * (int64_t)sizeof(C) + (nmax + 1) * (int64_t)sizeof(int32_t);
        if (Tr::STAGES > 0 && c0 * (int64_t)sizeof(C) + list_bytes <= ldo * (int64_t)sizeof(C)) {
            nval = O ? O + c0 : nullptr;
            nidx = O ? reinterpret_cast<int32_t *>(nval + nmax) : nullptr;
            ncnt = O ? nidx + nmax : nullptr;
            nlv = ldo;
            nli = (int)(ldo * (int64_t)sizeof(C) / (int64_t)sizeof(int32_t));
        } else {
            nval = cv.array<C>(BM * nmax);
            nidx = cv.array<int32_t>(BM * (nmax + 1));
            ncnt = nidx ? nidx + nmax : nullptr;
            nlv = (int)nmax;
            nli = (int)nmax + 1;
        }
        rs = cv.array<RowState<C>>(BM);
        if (Tr::STAGES == 0) dec.place(cv, p);
        bytes = cv.off;
    }
    __device__ int32_t *list_idx(int row) const { return nidx + (int64_t)row * nli; }
    __device__ C *list_val(int row) const { return nval + (int64_t)row * nlv; }
    __device__ int32_t *list_cnt(int row) const { return ncnt + (int64_t)row * nli; }
};

/* ---------------------------------------------------------------- F1 */

template <typename T, class Tr>
__device__ void sweep_geometry(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, int64_t jbeg, int64_t jend) {
    using C = typename Elem<T>::C;
    constexpr int NT = Tr::NT;
    const asc_params &p = B.p;
    const int lane = B.lane, w = B.w;
    /* exp(-D / tau) = ex_scaled(D * n), the exp's scale folded into n */
    const C nis = (C)(-exp_scale<T>() / (p.tau_sep + EPS_TAU)), nic = (C)(-exp_scale<T>() / (p.tau_coh + EPS_TAU));
    const C delta = (C)B.hd.v[H_DELTA], scale = (C)p.scale;
    const int wrow = w * 16;
    C *Ow = S.O + (int64_t)wrow * S.ldo;
    for (int64_t e = lane; e < 16 * (int64_t)S.ldo; e += 32) Ow[e] = (C)0;
    for (int r = lane; r < 16; r += 32) *S.list_cnt(wrow + r) = 0;
    __syncwarp();
    C nzr[2], shr[2], thr[2];
    for (int r = 0; r < 2; r++) {
        nzr[r] = S.rs[B.L.lr[r]].nzr;
        shr[r] = S.rs[B.L.lr[r]].shr;
        thr[r] = (C)NAN; /* the list is not full: every entry is a candidate */
    }
    double rho[2] = {0, 0}, W[2] = {0, 0}, Qz[2] = {0, 0};
    int64_t nst[2] = {0, 0}, nso[2] = {0, 0};
    Moments<C> mphi;
    mphi.reset();
    const RowSlice<T> R = row_slice(S.ro, wrow);
    const int need = NEED_Z | NEED_H | (B.scores ? NEED_K : 0);
    const int64_t end = stat_end(B.vis, B.tlast) < jend ? stat_end(B.vis, B.tlast) : jend;
    sweep(B, S.ks, jbeg, end, need, false, [&](int s, int64_t j0, const TileInfo &ti) {
        C az[NT][4], ah[NT][4], as[NT][4];
        score<T, NT>(az, R.Zr, nullptr, S.ks.Z(s), p.dz, lane);
        score<T, NT>(ah, R.Hr, nullptr, S.ks.H(s), p.da, lane);
        if (B.scores) score<T, NT>(as, R.Q, nullptr, S.ks.K(s), p.d, lane);
        else zero_acc(as);
        unsigned J, Ts, own;
        entry_sets<NT>(B.vis, B.L, lane, j0, ti, J, Ts, own);
        C wc[NT][4], phi[NT][4], rank[NT][4];
        C trho[2] = {0, 0}, tW[2] = {0, 0}, tQ[2] = {0, 0};
        unsigned cand = 0u;
        /* every entry of the lane in T(i), none its rows' own token: the set tests fold away */
        every_or_not(Ts == all_bits<NT>() && own == 0u, [&](auto every) {
            ASC_UNROLL
            for (int n = 0; n < NT; n++)
                ASC_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int r = e >> 1, col = frag_col(lane, n, e), bit = 4 * n + e;
                    const bool inT = decltype(every)::value || ((Ts >> bit) & 1u);
                    const bool self = !decltype(every)::value && ((own >> bit) & 1u);
                    C D = sq_dist(nzr[r] + S.ks.nz(s)[col], az[n][e]);
                    if (self) D = (C)0;
                    const C a = ah[n][e] * shr[r] * S.ks.sh(s)[col];
                    C ws = ex_scaled<T>(D * nis), wcv = ex_scaled<T>(D * nic);
                    C ph = ws * relu(a - delta);
                    if (!inT) ws = wcv = ph = (C)0; /* selected away: the key may be non-finite */
                    trho[r] += (B.paper && self) ? (C)0 : ws;
                    tW[r] += wcv;
                    tQ[r] += inT ? wcv * S.ks.nz(s)[col] : (C)0;
                    wc[n][e] = wcv;
                    phi[n][e] = ph;
                    rank[n][e] = B.scores ? scale * as[n][e] : a;
                    if (B.nmax > 0 && inT && !self && !(rank[n][e] <= thr[r])) cand |= 1u << bit;
                }
        });
        for (int r = 0; r < 2; r++) {
            rho[r] += (double)trho[r];
            W[r] += (double)tW[r];
            Qz[r] += (double)tQ[r];
            nst[r] += __popc(Ts & row_bits<NT>(r));
            nso[r] += __popc(J & row_bits<NT>(r));
        }
        mphi.template tile<NT>(phi, Ts & ~own, Ts & own, lane);
        /* the top-k lists: each row's candidates in key order (n8 tile, lane, entry), the rows side by side */
        if (__any_sync(FULL, cand != 0u)) {
            int32_t *const li[2] = {S.list_idx(B.L.lr[0]), S.list_idx(B.L.lr[1])};
            C *const lv[2] = {S.list_val(B.L.lr[0]), S.list_val(B.L.lr[1])};
            int32_t *const lc[2] = {S.list_cnt(B.L.lr[0]), S.list_cnt(B.L.lr[1])};
            topk_push_quads<C, NT>(li, lv, lc, B.nmax, cand, rank, j0, lane);
            for (int r = 0; r < 2; r++) thr[r] = *lc[r] == B.nmax ? lv[r][B.nmax - 1] : (C)NAN;
        }
        /* centroid numerator: P~ += wc . Z~ over T(i) */
        const C one[2] = {(C)1, (C)1};
        row_product<T, NT, true>(Ow, S.ldo, wc, one, Ts, !ti.full && ti.badkey, S.ks.Z(s), p.dz, lane);
    });
    /* the rows' sums (quad), written by the quad's first lane */
    const double unb = B.paper ? 0.0 : 1.0;
    for (int r = 0; r < 2; r++) {
        const double Rh = quad_sum(rho[r]), Wt = quad_sum(W[r]), Q2 = quad_sum(Qz[r]);
        const int64_t n = quad_sum(nst[r]), ns = quad_sum(nso[r]);
        double mean, sd, m2;
        mphi.finish(r, n, unb, lane, &mean, &sd, &m2);
        if ((lane & 3) == 0) {
            RowState<C> &rs = S.rs[B.L.lr[r]];
            rs.st[ASC_STAT_RHO] = Rh;
            rs.st[ASC_STAT_WC_SUM] = Wt;
            rs.st[ASC_STAT_COUNT] = (double)n;
            rs.sum.mom[1][0] = mean;
            rs.sum.mom[1][1] = sd;
            rs.sum.mom[1][2] = m2;
            rs.sum.qz = Q2;
            rs.nsoft = ns;
        }
    }
}

/* ---------------------------------------------------------------- after F1: centroid, heading */

/* c_i, G_i, the gates, the heading u_i of the warp's rows and their operand rows for F2 and F3, from the sums
 * of F1; the outputs c, u and nbr when `write` (a decode chunk's block repeats this merge and writes only once),
 * and c, u in the compute type into rows32 where it is given (bf16 / fp16 with a backward to come). */
template <typename T, class Tr>
__device__ void rows_geometry(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, bool write) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const asc_fwd_args &a = B.a;
    const int lane = B.lane;
    const int64_t d = p.d, dz = p.dz;
    const double tcoh = p.tau_coh + EPS_TAU;
    const C *z0 = B.kp.z0 ? B.kp.z0 + B.bh * dz : nullptr;
    __syncwarp();
    for (int rr = 0; rr < 16; rr++) {
        const int row = B.w * 16 + rr;
        const int64_t i = B.i0 + row, t = i + p.N - p.Nq - p.keys_after;
        RowState<C> &rs = S.rs[row];
        T *Cr = S.ro.Cr.row(row), *Clo = S.ro.Clo ? S.ro.Clo + (int64_t)row * S.ro.Cr.ld : nullptr;
        T *U = S.ro.U.row(row), *Ulo = S.ro.Ulo ? S.ro.Ulo + (int64_t)row * S.ro.U.ld : nullptr;
        if (i >= p.Nq) { /* warp-uniform: zero operands for a row that does not exist */
            for (int64_t f = lane; f < fpad_of<T>(dz); f += 32) put_operand(Cr, Clo, f, (C)0);
            for (int64_t f = lane; f < fpad_of<T>(d); f += 32) put_operand(U, Ulo, f, (C)0);
            if (lane == 0) rs.ncc = rs.usc = (C)0;
            __syncwarp(); /* the warp's lanes read them in F2 */
            continue;
        }
        const int64_t orow = B.bh * p.Nq + i;
        float *r32 = write ? rows32_at(p, a.rows32, orow) : nullptr;
        float *c32 = r32 ? r32 + ASC_ROWS32_C(&p) : nullptr, *u32 = r32 ? r32 + ASC_ROWS32_U(&p) : nullptr;
        /* centroid: c~ = (P~ - eps z0) / (W + eps), c = c~ + z0; its spread G */
        const double W = rs.st[ASC_STAT_WC_SUM], Wd = W + EPS_TAU;
        const C *P = S.O + (int64_t)row * S.ldo;
        double cc2 = 0.0, cP = 0.0;
        for (int64_t f = lane; f < fpad_of<T>(dz); f += 32) {
            C ct = (C)0;
            if (f < dz) {
                const double zf = z0 ? (double)z0[f] : 0.0;
                ct = (C)(((double)P[f] - EPS_TAU * zf) / Wd);
                const C cf = (C)((double)ct + zf);
                if (write) put((T *)a.c + orow * dz + f, cf);
                if (c32) c32[f] = (float)cf;
                /* float32 / float64 (centred: z0): c~ as the backward reads it back from c (b1_kernel), bit for
                 * bit, so that the distances to it agree here and there, and with them the cohesion row's stored
                 * moments and B1's (the mma types' c~ is c: no centring) */
                if constexpr (!Elem<T>::kMma) ct = cf - (z0 ? z0[f] : (C)0);
                cc2 += (double)ct * (double)ct;
                cP += (double)ct * (double)P[f];
            }
            put_operand(Cr, Clo, f, ct);
        }
        cc2 = warp_sum(cc2);
        cP = warp_sum(cP);
        double G = (rs.sum.qz - 2.0 * cP + cc2 * W) / Wd;
        G = G < 0.0 ? 0.0 : G; /* rounding below 0; a NaN stays NaN */
        const double gate_c = B.paper ? 1.0 / (1.0 + exp(-p.alpha_coh * G)) : 1.0;
        /* heading */
        double gate_a = 1.0, unorm = 1.0;
        C usc = (C)1;
        const T *kb = B.kb;
        if (B.paper) {
            const int32_t cnt = *S.list_cnt(row);
            const int32_t *nb = S.list_idx(row);
            C *rkn = S.list_val(row); /* the list's values are not needed any more */
            for (int32_t q = lane; q < cnt; q += 32) rkn[q] = key_rk_lane(B, nb[q]);
            __syncwarp();
            /* m_f = sum_q x_qf, x_qf = k_f of neighbour q over its norm, and sum_q x_qf^2 (into x2) */
            const auto mean_dir = [&](int64_t f, double &x2) {
                double m = 0.0;
                for (int32_t q = 0; q < cnt; q++) {
                    const double x = (double)((C)up(kb[nb[q] * d + f]) * rkn[q]);
                    m += x;
                    x2 += x * x;
                }
                return m;
            };
            /* a lane keeps m of its first HS features (d <= 32 HS); wider rows form the rest again for u */
            constexpr int HS = 4;
            double mk[HS], ss = 0.0, sx = 0.0;
            ASC_UNROLL
            for (int s = 0; s < HS; s++) {
                const int64_t f = lane + 32 * s;
                mk[s] = f < d ? mean_dir(f, sx) : 0.0;
                ss += mk[s] * mk[s];
            }
            for (int64_t f = lane + 32 * HS; f < d; f += 32) {
                const double m = mean_dir(f, sx);
                ss += m * m;
            }
            ss = warp_sum(ss);
            sx = warp_sum(sx);
            unorm = sqrt(ss);
            /* u = 0 where the unit keys cancel to rounding, judged on UNORM as stored (the CPU kernels' rule) */
            const bool heading = (double)(C)unorm > EPS_HEADING * (double)cnt;
            const auto put_u = [&](int64_t f, double m) {
                const C u = heading ? (C)(m / unorm) : (C)0;
                if (f < d) {
                    if (write) put((T *)a.u + orow * d + f, u);
                    if (u32) u32[f] = (float)u;
                }
                put_operand(U, Ulo, f, u);
            };
            ASC_UNROLL
            for (int s = 0; s < HS; s++)
                if (lane + 32 * s < fpad_of<T>(d)) put_u(lane + 32 * s, mk[s]);
            for (int64_t f = lane + 32 * HS; f < fpad_of<T>(d); f += 32) {
                double x2 = 0.0;
                put_u(f, f < d ? mean_dir(f, x2) : 0.0);
            }
            /* the unit keys' spread about their mean, sum_q ||x_q - m / cnt||^2 / cnt = (sum x^2 - ||m||^2 / cnt) / cnt
             * in one pass: both sums in double (sum_q ||x_q||^2 is about cnt), so equal keys get a spread of ~1e-16
             * where two passes give 0, which the gate's sigmoid does not see; below 0 by rounding is 0, a NaN stays */
            double var = cnt > 0 ? (sx - ss / (double)cnt) / (double)cnt : 0.0;
            var = var < 0.0 ? 0.0 : var;
            gate_a = 1.0 / (1.0 + exp(-p.alpha_align * var));
            if (write && a.nbr)
                for (int64_t q = lane; q < p.n_nbr; q += 32) a.nbr[orow * p.n_nbr + q] = q < cnt ? (int64_t)nb[q] : -1;
        } else { /* u = k^_t: the products use the exact row k_t and 1 / ||k_t|| */
            usc = key_rk(B, t);
            for (int64_t f = lane; f < d; f += 32) {
                const C u = (C)up(kb[t * d + f]) * usc;
                if (write) put((T *)a.u + orow * d + f, u);
                if (u32) u32[f] = (float)u;
            }
            for (int64_t f = lane; f < fpad_of<T>(d); f += 32) U[f] = f < d ? kb[t * d + f] : to_elem<T>(0.0f);
        }
        if (lane == 0) {
            rs.ncc = (C)cc2;
            rs.usc = usc;
            rs.st[ASC_STAT_COH_SPREAD] = G;
            rs.st[ASC_STAT_GATE_A] = gate_a;
            rs.st[ASC_STAT_GATE_C] = gate_c;
            rs.st[ASC_STAT_UNORM] = unorm;
            (void)tcoh;
        }
        __syncwarp();
    }
}

/* ---------------------------------------------------------------- F2 */

/* The keys before j that every row's statistics see, in a call the key sums serve (closed_moments): all of them but
 * the padding that mask_stats hides from the statistics. */
__device__ __forceinline__ int64_t stat_keys_before(const Vis &v, int64_t j) {
    return j - (v.ms && v.pad ? v.pad[j] : 0);
}

/* The alignment and cohesion moments of the block's rows over their keys in [jbeg, jend) (rs.st's count: the rows' keys
 * in T(i) up to jend); `joined` (causal statistics, from closed_moments): joined to the moments of the keys before
 * jbeg that closed_moments left. */
template <typename T, class Tr>
__device__ void sweep_moments(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, int64_t jbeg, int64_t jend,
                              bool joined) {
    using C = typename Elem<T>::C;
    constexpr int NT = Tr::NT;
    const asc_params &p = B.p;
    const int lane = B.lane, wrow = B.w * 16;
    C ncc[2], usc[2];
    for (int r = 0; r < 2; r++) {
        ncc[r] = S.rs[B.L.lr[r]].ncc;
        usc[r] = S.rs[B.L.lr[r]].usc;
    }
    Moments<C> mr, mc;
    mr.reset();
    mc.reset();
    const RowSlice<T> R = row_slice(S.ro, wrow);
    const int64_t end = stat_end(B.vis, B.tlast) < jend ? stat_end(B.vis, B.tlast) : jend;
    sweep(B, S.ks, jbeg, end, NEED_K | NEED_Z, false, [&](int s, int64_t j0, const TileInfo &ti) {
        C au[NT][4], ac[NT][4], rv[NT][4], rcv[NT][4];
        score<T, NT>(au, R.U, R.Ulo, S.ks.K(s), p.d, lane);
        score<T, NT>(ac, R.Cr, R.Clo, S.ks.Z(s), p.dz, lane);
        unsigned J, Ts, own;
        entry_sets<NT>(B.vis, B.L, lane, j0, ti, J, Ts, own);
        ASC_UNROLL
        for (int n = 0; n < NT; n++)
            ASC_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, col = frag_col(lane, n, e);
                rv[n][e] = au[n][e] * usc[r] * S.ks.rk(s)[col];
                rcv[n][e] = sq_dist(ncc[r] + S.ks.nz(s)[col], ac[n][e]);
            }
        mr.template tile<NT>(rv, Ts & ~own, Ts & own, lane);
        mc.template tile<NT>(rcv, Ts & ~own, Ts & own, lane);
    });
    const double unb = B.paper ? 0.0 : 1.0;
    for (int r = 0; r < 2; r++) {
        RowState<C> &rs = S.rs[B.L.lr[r]];
        const int64_t n = (int64_t)rs.st[ASC_STAT_COUNT];
        const int64_t nb = joined ? stat_keys_before(B.vis, jbeg) : 0, ne = n - nb; /* the row's keys before jbeg, after */
        double mo[2][3];             /* r, rc: mean, std, sum of squared deviations */
        mr.finish(r, ne, unb, lane, &mo[0][0], &mo[0][1], &mo[0][2]);
        mc.finish(r, ne, unb, lane, &mo[1][0], &mo[1][1], &mo[1][2]);
        if (joined) { /* causal: the keys before jbeg have their moments from closed_moments */
            ASC_UNROLL
            for (int x = 0; x < 2; x++) {
                double nn = (double)nb, mean = rs.sum.mom[2 * x][0], m = rs.sum.mom[2 * x][2];
                chan_add(nn, mean, m, (double)ne, mo[x][0], mo[x][2]);
                mo[x][0] = mean;
                mo[x][1] = std_of(m, (double)n, unb);
                mo[x][2] = m;
            }
            __syncwarp(); /* the quad's lanes have read the moments its first lane overwrites */
        }
        if ((lane & 3) == 0)
            ASC_UNROLL
            for (int k = 0; k < 3; k++) {
                rs.sum.mom[0][k] = mo[0][k];
                rs.sum.mom[2][k] = mo[1][k];
            }
    }
}

/* F2 in closed form (keymoments.cuh): the warp's rows' alignment and cohesion moments from the (b, h)'s key sums, in
 * double: eight rows at a time (an m-tile), the quadratic forms u^T A u and c'^T Z c' on the FP64 tensor cores
 * (quad_form8), the dot products by the four lanes of each row's quad over its features, and the row's tail by the
 * quad's first lane.
 * A row is refused (`fall`) where the sums cannot give its sum of squared deviations to float32's precision: the
 * rounding of the sums and the forms is at most (n + f^2 + 8) 2^-53 times E, E bounding the same sums and forms
 * taken of absolute values (by Cauchy-Schwarz: sum_j |k'_jf k'_jg| <= sqrt(A_ff A_gg), sum_j |k'_jf| <=
 * sqrt(n A_ff)), so a row is taken when m2 >= (n + f^2 + 8) 2^-30 E: m2 then holds float32's 24 bits.
 * The sums cover the keys the statistics see: every key, or (mask_stats) all but the padding, n of them. Causal
 * statistics (kmpre): the sums cover those before the block's chunk, P = (t0 / kmg) kmg <= t0, which every row of the
 * block sees; the rows keep their moments over those keys and sweep_moments joins the keys P .. t
 * (Chan's rule). A row is judged on those n keys alone (their m2 is at most the whole row's).
 * Returns the first key F2 must still sweep, block-uniform: p.N where every row's moments are done, P, or 0 where
 * the block sweeps F2 whole: no key sums for the call, a (b, h) with a non-finite key, a refused row in the block (a
 * row without keys among them, for one), or a causal block in the first chunk. */
template <typename T, class Tr>
__device__ int64_t closed_moments(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const Vis &v = B.vis; /* (closed_moments_wanted: no window, and no attn_mask with mask_stats) */
    if (!B.kp.km || v.windowed || (v.ms && v.am) || (v.bad && v.bad[p.N] > 0)) return 0;
    const KmLayout L(p);
    const int64_t c = B.kp.kmpre ? B.t0 / B.kp.kmg : 0, P = c * B.kp.kmg; /* t0 < N: c < kmnc */
    if (B.kp.kmpre && c == 0) return 0;
    const double *km = B.kp.kmpre ? B.kp.kmp + (B.bh * B.kp.kmnc + c) * L.size : B.kp.km + B.bh * L.size;
    const int64_t nk = stat_keys_before(v, B.kp.kmpre ? P : p.N);
    const int lane = B.lane, t = lane & 3;
    const int d = (int)p.d, dz = (int)p.dz;
    const double n = (double)nk, unb = B.paper ? 0.0 : 1.0, tol = 0x1p-30;
    for (int m = 0; m < 2; m++) {
        const int row = B.w * 16 + 8 * m + (lane >> 2); /* rows past Nq hold zero operands (rows_geometry) */
        RowState<C> &rs = S.rs[row];
        const T *U = S.ro.U.row(row), *Ulo = S.ro.Ulo ? S.ro.Ulo + (int64_t)row * S.ro.U.ld : nullptr;
        const T *Cr = S.ro.Cr.row(row), *Clo = S.ro.Clo ? S.ro.Clo + (int64_t)row * S.ro.Cr.ld : nullptr;
        auto uval = [&](int f) { return (double)up(U[f]) + (Ulo ? (double)up(Ulo[f]) : 0.0); };
        auto cval = [&](int f) { return (double)up(Cr[f]) + (Clo ? (double)up(Clo[f]) : 0.0) - km[L.z0 + f]; };
        const double quad = quad_form8(uval, km + L.A, d, lane), cq = quad_form8(cval, km + L.Z, dz, lane);
        double ea = 0.0, v1 = 0.0, u0 = 0.0, uu = 0.0;
        for (int f = t; f < d; f += 4) {
            const double x = uval(f);
            ea += fabs(x) * sqrt(km[L.A + (int64_t)f * d + f]);
            v1 += x * km[L.s + f];
            u0 += x * km[L.k0 + f];
            uu += x * x;
        }
        ea = quad_sum(ea);
        v1 = quad_sum(v1);
        u0 = quad_sum(u0);
        uu = quad_sum(uu);
        double ec = 0.0, csz = 0.0, cbz = 0.0, cs2 = 0.0, cn2 = 0.0; /* cs2 = ||c'||^2, cn2 = ||c~||^2 */
        for (int f = t; f < dz; f += 4) {
            const double x = cval(f), xz = x + km[L.z0 + f];
            ec += fabs(x) * sqrt(km[L.Z + (int64_t)f * dz + f]);
            csz += x * km[L.sz + f];
            cbz += x * km[L.sbz + f];
            cs2 += x * x;
            cn2 += xz * xz;
        }
        ec = quad_sum(ec);
        csz = quad_sum(csz);
        cbz = quad_sum(cbz);
        cs2 = quad_sum(cs2);
        cn2 = quad_sum(cn2);
        if (t == 0 && B.i0 + row >= p.Nq) {
            for (int k = 0; k < 3; k++) rs.sum.mom[0][k] = rs.sum.mom[2][k] = 0.0;
            rs.fall = false;
        } else if (t == 0) {
            const double usc = (double)rs.usc, sb = km[L.sb], sbb = km[L.sbb];
            /* the products' rc_ij = ncc + ||z~_j||^2 - 2 c~.z~_j takes ncc = ||c~||^2 as rows_geometry rounded it from
             * c~ before its split into the operand c~ = hi + lo: the difference moves the mean */
            double m0, s0, q0, m2, s2, q2;
            moments_of(usc * u0, usc * v1, usc * usc * quad, nk, unb, &m0, &s0, &q0);
            moments_of(cs2 + ((double)rs.ncc - cn2), sb - 2.0 * csz, sbb - 4.0 * cbz + 4.0 * cq, nk, unb, &m2, &s2,
                       &q2);
            const double Ea = 3.0 * usc * usc * ea * ea, lin = sb + 2.0 * sqrt(n) * ec;
            const double Ec = sbb + 4.0 * sqrt(sbb) * ec + 4.0 * ec * ec + 2.0 * lin * lin / n;
            /* the sums' rounding, and the rounding of the products' own values: F3 and the maps form each r_ij and
             * rc_ij in float32 (the maps subtract the mean from it), which the sweep's mean follows and the closed form
             * does not: a row whose spread is not 2^12 times that rounding sweeps (a row of equal values, for one: the
             * sweep's deviations are exactly 0 there). |r_ij| <= |usc| ||u||, rc_ij <= (||c~|| + max ||z~_j||)^2, and
             * a float32 dot product of f terms rounds by about sqrt(f) ulps of that (f ulps at worst: with f the rule
             * refused random unit keys at d = 256, whose spread is 1 / 16) */
            const double zc = sqrt(cn2) + sqrt(km[L.zmax]);
            const double ra = (sqrt((double)d) + 2.0) * 0x1p-24 * fabs(usc) * sqrt(uu);
            const double rc = (sqrt((double)dz) + 3.0) * 0x1p-24 * zc * zc;
            const bool ok = q0 >= tol * (n + (double)d * d + 8.0) * Ea &&
                            q2 >= tol * (n + (double)dz * dz + 8.0) * Ec && q0 >= n * 0x1p24 * ra * ra &&
                            q2 >= n * 0x1p24 * rc * rc;
            const double mom[2][3] = {{m0, s0, q0}, {m2, s2, q2}};
            for (int k = 0; k < 3; k++) {
                rs.sum.mom[0][k] = mom[0][k];
                rs.sum.mom[2][k] = mom[1][k];
            }
            rs.fall = !ok;
        }
    }
    __syncthreads(); /* every warp's rows judged */
    bool fall = false;
    for (int r = lane; r < Tr::BM; r += 32) fall |= S.rs[r].fall;
    return __any_sync(FULL, fall) ? 0 : B.kp.kmpre ? P : p.N;
}

/* A row's statistics from its geometry and the moments of its raw rows (theta times them: the CPU's
 * asc_row_bias_stats), and its score coefficients from those statistics (one thread per row). */
template <typename T, class Tr> __device__ void bias_stats(const RowBlock<T, Tr> &B, RowState<typename Elem<T>::C> &rs) {
    const asc_params &p = B.p;
    const double kap = B.hd.v[H_KAPPA] + EPS_TAU, ratio = rs.st[ASC_STAT_RHO] / kap;
    const double eta = ratio < 0.0 ? 0.0 : (ratio > 1.0 ? 1.0 : ratio);
    const double theta[3] = {B.hd.v[H_LA] * rs.st[ASC_STAT_GATE_A], -B.hd.v[H_LS] * eta,
                             -B.hd.v[H_LC] * rs.st[ASC_STAT_GATE_C] / (p.tau_coh + EPS_TAU)};
    for (int x = 0; x < 3; x++) {
        rs.st[ASC_STAT_MEAN_A + 2 * x] = theta[x] * rs.sum.mom[x][0];
        rs.st[ASC_STAT_STD_A + 2 * x] = fabs(theta[x]) * rs.sum.mom[x][1];
    }
    rs.st[ASC_STAT_LSE] = 0.0;
    rs.cf = coef_from_stats<typename Elem<T>::C>(rs.st, p, B.hd);
}

/* The statistics and coefficients of the warp's rows after F2. */
template <typename T, class Tr> __device__ void rows_bias_stats(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S) {
    for (int r = 0; r < 2; r++)
        if ((B.lane & 3) == 0 && B.L.act[r]) bias_stats(B, S.rs[B.L.lr[r]]);
    __syncwarp();
}

/* ---------------------------------------------------------------- F3 and the maps: the scores of a tile */

template <typename T, class Tr>
__device__ void load_row_coef(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S,
                              XCoef<typename Elem<T>::C> (&cf)[2], RowVals<typename Elem<T>::C> (&rv)[2]) {
    for (int r = 0; r < 2; r++) {
        const RowState<typename Elem<T>::C> &rs = S.rs[B.L.lr[r]];
        cf[r] = xcoef(rs.cf);
        rv[r] = RowVals<typename Elem<T>::C>{rs.nzr, rs.ncc, rs.usc, rs.shr};
    }
}

/* forced inline: NVVM's inliner left it out of line by its size (fp16 at 5d640f7, bf16 once the score products'
 * steps were unrolled), and the call put the block's context in a 688-byte stack frame (docs/cuda.md, "The score
 * products' k16 steps") */
template <typename T, class Tr>
__device__ __forceinline__ void sweep_softmax(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, int64_t jbeg,
                                              int64_t jend) {
    using C = typename Elem<T>::C;
    constexpr int NT = Tr::NT;
    const asc_params &p = B.p;
    const int lane = B.lane, w = B.w, wrow = w * 16;
    C *Ow = S.O + (int64_t)wrow * S.ldo;
    for (int64_t e = lane; e < 16 * (int64_t)S.ldo; e += 32) Ow[e] = (C)0;
    __syncwarp();
    XCoef<C> cf[2];
    RowVals<C> rowv[2];
    load_row_coef(B, S, cf, rowv);
    const RowSlice<T> R = row_slice(S.ro, wrow);
    const C delta = (C)B.hd.v[H_DELTA];
    C mx[2] = {-inf_of<C>(), -inf_of<C>()};
    double l[2] = {0, 0}, ac[2] = {0, 0}, as[2] = {0, 0};
    const bool aux = B.a.aux != nullptr, drop = B.a.dropout_seed != nullptr;
    const C L = (C)exp_scale<T>(), dscale = (C)p.dropout_scale;
    const int64_t end = soft_end(B.vis, B.tlast) < jend ? soft_end(B.vis, B.tlast) : jend;
    sweep(B, S.ks, jbeg, end, NEED_K | NEED_V | NEED_Z | NEED_H, false,
          [&](int s, int64_t j0, const TileInfo &ti) {
              /* dropout: the output sums the kept pairs times 1 / (1 - p); l and aux every pair (SPEC section 9b) */
              const unsigned keep = drop ? drop_bits<NT>(p, B.a, B.bh, B.L, lane, j0) : 0u;
              PairVals<C, NT> pv;
              tile_scores<T, NT>(p, B.a, B.b, B.h, delta, B.L, R, key_slice(S.ks, s, 0, j0), lane, cf, rowv, pv);
              unsigned J, Ts, own;
              entry_sets<NT>(B.vis, B.L, lane, j0, ti, J, Ts, own);
              const bool everyJ = J == all_bits<NT>(); /* every entry of the lane in J(i): no per-entry tests */
              C tmax[2] = {-inf_of<C>(), -inf_of<C>()};
              every_or_not(everyJ, [&](auto every) {
                  ASC_UNROLL
                  for (int n = 0; n < NT; n++)
                      ASC_UNROLL
                      for (int e = 0; e < 4; e++) {
                          if (!decltype(every)::value && !((J >> (4 * n + e)) & 1u)) pv.x[n][e] = -inf_of<C>();
                          tmax[e >> 1] = pv.x[n][e] > tmax[e >> 1] ? pv.x[n][e] : tmax[e >> 1];
                      }
              });
              C scl[2], mxs[2]; /* mxs: the maximum times the exp's scale, e^(x - mx) = ex_scaled(x L - mx L) */
              for (int r = 0; r < 2; r++) {
                  const C m = quad_max(tmax[r]);
                  const C mnew = m > mx[r] ? m : mx[r];
                  scl[r] = mx[r] > -inf_of<C>() ? ex_scaled<T>((mx[r] - mnew) * L) : (C)0;
                  if (mnew == -inf_of<C>()) scl[r] = (C)1; /* nothing in J so far */
                  mx[r] = mnew;
                  mxs[r] = mnew * L;
              }
              C ev[NT][4], tl[2] = {0, 0}, tc[2] = {0, 0}, tsp[2] = {0, 0};
              every_or_not(everyJ, [&](auto every) {
                  ASC_UNROLL
                  for (int n = 0; n < NT; n++)
                      ASC_UNROLL
                      for (int e = 0; e < 4; e++) {
                          const int r = e >> 1;
                          const bool inJ = decltype(every)::value || ((J >> (4 * n + e)) & 1u);
                          const C ej = inJ ? ex_scaled<T>(pv.x[n][e] * L - mxs[r]) : (C)0;
                          ev[n][e] = ej;
                          tl[r] += ej;
                          if (aux) { /* a key outside J(i): its rc, phi may be non-finite, selected away */
                              tc[r] += inJ ? ej * pv.rc[n][e] : (C)0;
                              tsp[r] += inJ ? ej * pv.phi[n][e] : (C)0;
                          }
                      }
              });
              for (int r = 0; r < 2; r++) {
                  l[r] = l[r] * (double)scl[r] + (double)tl[r];
                  ac[r] = ac[r] * (double)scl[r] + (double)tc[r];
                  as[r] = as[r] * (double)scl[r] + (double)tsp[r];
              }
              if (drop) drop_scale(ev, keep, dscale);
              /* split weights (two mma on the tensor cores): y to ~16 bits, so that the backward's P = dy.y (rows32)
               * is the sum of A dA it forms, not 2^-9 off (docs/cuda.md "Fixed: bfloat16 / float16 dz ...") */
              row_product<T, NT, true>(Ow, S.ldo, ev, scl, J, !ti.full && ti.badkey, S.ks.V(s), p.dv, lane);
          });
    for (int r = 0; r < 2; r++) {
        l[r] = quad_sum(l[r]);
        ac[r] = quad_sum(ac[r]);
        as[r] = quad_sum(as[r]);
        if ((lane & 3) == 0) {
            RowState<C> &rs = S.rs[B.L.lr[r]];
            rs.mx = mx[r];
            rs.l = l[r];
            rs.ac = ac[r];
            rs.as = as[r];
        }
    }
    __syncwarp();
}

/* The outputs of the warp's rows after F3 (row by row, lane per feature): y = O / l (l with the sink's exp,
 * SPEC section 12), the statistics with the log-sum-exp, aux; whether the row saw a non-finite input (rs.sick, for the maps). */
template <typename T, class Tr> __device__ void rows_output(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const int lane = B.lane, wrow = B.w * 16;
    const C *Ow = S.O + (int64_t)wrow * S.ldo;
    for (int rr = 0; rr < 16; rr++) {
        const int row = wrow + rr;
        const int64_t i = B.i0 + row;
        if (i >= p.Nq) continue;
        RowState<C> &rs = S.rs[row];
        const int64_t orow = B.bh * p.Nq + i;
        const bool soft = rs.nsoft > 0;
        /* sinks (SPEC section 12): exp(sink - mx) joins the sum, all taken about max(mx, sink) so that no exp
         * overflows: y = O num / L, LSE = top + log(L); a row without a visible key stays 0 */
        double top = (double)rs.mx, num = 1.0, L = rs.l;
        if (B.a.sinks && soft) {
            const double sink = (double)up(((const T *)B.a.sinks)[ASC_SINK_AT(&p, B.b, B.h, i)]); /* (per head or row) */
            if (sink <= top) {
                L += exp(sink - top);
            } else { /* (a NaN sink too: then every output of the row is NaN) */
                num = exp(top - sink);
                L = L * num + 1.0;
                top = sink;
            }
        }
        const double lse = soft ? top + log(L) : (double)INFINITY;
        T *out = (T *)B.a.out + orow * p.dv;
        float *r32 = rows32_at(p, B.a.rows32, orow);
        bool nf = false;
        for (int64_t f = lane; f < p.dv; f += 32) {
            const C y = soft ? (C)((double)Ow[(int64_t)rr * S.ldo + f] * num / L) : (C)0;
            put(out + f, y);
            if (r32) r32[ASC_ROWS32_OUT(&p) + f] = (float)y;
            nf |= !finite(up(out[f])); /* as stored, as the CPU kernels read it back */
        }
        const bool sick = __any_sync(FULL, nf) || lse != lse; /* an empty row: LSE = +inf, output 0 */
        T *st = (T *)B.a.stats + orow * ASC_NSTAT;
        if (lane < ASC_NSTAT) {
            const C v = (C)(lane == ASC_STAT_LSE ? lse : rs.st[lane]);
            put(st + lane, v);
            if (r32) r32[lane] = (float)v;
        }
        if (lane < 2) {
            const C x = B.a.aux && soft ? (C)((lane == 0 ? rs.ac : rs.as) * num / L) : (C)0;
            if (B.a.aux) put((T *)B.a.aux + orow * 2 + lane, x);
            if (r32) r32[ASC_ROWS32_AUX(&p) + lane] = (float)x;
        }
        __syncwarp();
        if (lane == 0) {
            rs.st[ASC_STAT_LSE] = lse;
            rs.cf.lse = (C)lse;
            rs.sick = sick;
        }
        __syncwarp();
    }
}

/* ---------------------------------------------------------------- the maps (inspection only) */

template <typename T, class Tr>
__device__ void sweep_maps(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S) {
    using C = typename Elem<T>::C;
    constexpr int NT = Tr::NT;
    const asc_params &p = B.p;
    const int lane = B.lane, wrow = B.w * 16;
    XCoef<C> cf[2];
    RowVals<C> rowv[2];
    load_row_coef(B, S, cf, rowv);
    const RowSlice<T> R = row_slice(S.ro, wrow);
    const C delta = (C)B.hd.v[H_DELTA];
    bool sick[2];
    for (int r = 0; r < 2; r++) sick[r] = B.L.act[r] && S.rs[B.L.lr[r]].sick;
    T *maps[5] = {(T *)B.a.map_sbase, (T *)B.a.map_align, (T *)B.a.map_sep, (T *)B.a.map_coh, (T *)B.a.map_attn};
    /* every tile of every key: a pair outside J(i) still has S_base, and T(i) the biases */
    sweep(B, S.ks, 0, p.N, NEED_K | NEED_Z | NEED_H, true, [&](int s, int64_t j0, const TileInfo &ti) {
        PairVals<C, NT> pv;
        tile_scores<T, NT>(p, B.a, B.b, B.h, delta, B.L, R, key_slice(S.ks, s, 0, j0), lane, cf, rowv, pv);
        unsigned J, Ts, own;
        entry_sets<NT>(B.vis, B.L, lane, j0, ti, J, Ts, own);
        ASC_UNROLL
        for (int n = 0; n < NT; n++)
            ASC_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, bit = 4 * n + e;
                const int64_t j = j0 + frag_col(lane, n, e);
                if (!B.L.act[r] || j >= p.N) continue;
                const int64_t o = (B.bh * p.Nq + B.L.i[r]) * p.N + j;
                if (sick[r]) {
                    for (int m = 0; m < 5; m++) put(maps[m] + o, (C)NAN);
                    continue;
                }
                const bool inT = (Ts >> bit) & 1u, inJ = (J >> bit) & 1u;
                put(maps[0] + o, (C)p.scale * pv.gs[n][e]);
                const Coef<C> &c = S.rs[B.L.lr[r]].cf;
                const C wv[3] = {pv.r[n][e], pv.phi[n][e], pv.rc[n][e]};
                for (int xx = 0; xx < 3; xx++)
                    put(maps[1 + xx] + o,
                        c.norm && inT ? (c.theta[xx] * wv[xx] - c.mean[xx]) / (c.sd[xx] + (C)EPS_STD) : (C)0);
                const C lse = c.lse, L = (C)exp_scale<T>();
                put(maps[4] + o, inJ && finite(lse) ? ex_scaled<T>(pv.x[n][e] * L - lse * L) : (C)0);
            }
    });
}

/* ---------------------------------------------------------------- the block */

/* The block's rows of q, z~_t and hs_t (raw keys: h_t, scaled here) and their per-row values. */
template <typename T, class Tr>
__device__ void stage_rows(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const int64_t bh = B.bh;
    tile_load(S.ro.Q, (const T *)B.a.q + bh * p.Nq * p.d, p.d, B.i0, Tr::BM, p.Nq, B.tid, Tr::THREADS);
    tile_load(S.ro.Zr, B.zb, p.dz, B.t0, Tr::BM, p.N, B.tid, Tr::THREADS);
    tile_load(S.ro.Hr, B.hb, p.da, B.t0, Tr::BM, p.N, B.tid, Tr::THREADS);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    const int lane = B.lane;
    for (int rr = 0; rr < 16; rr++) {
        const int row = B.w * 16 + rr;
        const int64_t t = B.i0 + row + p.N - p.Nq - p.keys_after;
        RowState<C> &rs = S.rs[row];
        C nzr = 0, shr = 0;
        if (B.i0 + row >= p.Nq) {
        } else if (!B.kp.raw) {
            nzr = B.nzb[t];
            shr = B.shb[t];
        } else {
            nzr = (C)warp_sq(S.ro.Zr.row(row), p.dz, lane);
            double sc;
            T *hr = S.ro.Hr.row(row);
            const int e = semantic_exp(warp_sq(hr, p.da, lane), &sc);
            __syncwarp();
            for (int64_t c = lane; c < p.da; c += 32) hr[c] = to_elem<T>(ldexp((double)up(hr[c]), -e));
            shr = (C)sc;
        }
        if (lane == 0) {
            rs.nzr = nzr;
            rs.shr = shr;
        }
    }
    __syncwarp();
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_FORWARD_CUH */
