/*
 * rowcoef.cuh -- per-row quantities of the tensor-core kernels that do not depend on a pair: the learnable
 * scalars of a head, the coefficients of the scores derived from a row's statistics (the CPU kernels'
 * asc_coef_from_stats: the forward derives them from the statistics it computed, the backward from the
 * saved ones, with this one function), the shifted moments of a raw bias row, and the top-k list push.
 */
#ifndef ASCENDER_CUDA_ROWCOEF_CUH
#define ASCENDER_CUDA_ROWCOEF_CUH

#include "tile.cuh"

namespace asc {
namespace tiled {

/* The nine learnable scalars of head hd in SPEC order (ASC_SCALARS), in double. */
struct Heads {
    double v[ASC_NSCALAR];
};

template <typename T> __device__ inline Heads load_heads(const asc_fwd_args &a, int64_t hd) {
    const void *ptrs[ASC_NSCALAR] = {a.lambda_align, a.lambda_sep, a.lambda_coh, a.omega_align, a.omega_sep,
                                     a.omega_coh,    a.score_temp, a.delta,      a.kappa};
    Heads h;
    for (int s = 0; s < ASC_NSCALAR; s++) h.v[s] = (double)up(((const T *)ptrs[s])[ASC_SCALAR_HEAD(&a, s, hd)]);
    return h;
}
enum { H_LA = 0, H_LS, H_LC, H_OA, H_OS, H_OC, H_TEMP, H_DELTA, H_KAPPA };

/*
 * The score of a pair from its products (docs/tiling.md section 3, IDEAS section 2):
 *   x = cs (q.k) + ca r + cphi phi + cc rc + x0 (+ itemp beta_other), then the softcap x <- cap tanh(x / cap)
 * with r = k^_j.u_i, phi = ws relu(a - delta), rc = ||z_j - c_i||^2; theta, mean, sd: the raw rows' factors
 * and the saved (theta-scaled) moments, for the maps and the backward.
 */
template <typename C> struct Coef {
    C cs, ca, cphi, cc, x0, itemp, cap, icap;
    C theta[3], mean[3], sd[3];
    C eta, kap, rho, wsum, G, gate_a, gate_c, unorm, lse;
    int64_t n;
    bool norm; /* n > 1: the normalized biases exist */
};

template <typename C>
__device__ inline Coef<C> coef_from_stats(const double (&st)[ASC_NSTAT], const asc_params &p, const Heads &h) {
    Coef<C> c;
    const double tcoh = p.tau_coh + EPS_TAU;
    const double kap = h.v[H_KAPPA] + EPS_TAU, rho = st[ASC_STAT_RHO];
    const double eta = rho / kap < 0.0 ? 0.0 : (rho / kap > 1.0 ? 1.0 : rho / kap);
    const double theta[3] = {h.v[H_LA] * st[ASC_STAT_GATE_A], -h.v[H_LS] * eta,
                             -h.v[H_LC] * st[ASC_STAT_GATE_C] / tcoh};
    const double itemp = 1.0 / (h.v[H_TEMP] + EPS_TAU);
    c.n = (int64_t)st[ASC_STAT_COUNT];
    c.norm = c.n > 1;
    double x0 = 0.0, wn[3];
    for (int x = 0; x < 3; x++) {
        const double mean = st[ASC_STAT_MEAN_A + 2 * x], sd = st[ASC_STAT_STD_A + 2 * x];
        /* n <= 1: no normalized row, weighed by omega * 0 (a NaN omega makes the row NaN: SPEC section 11) */
        wn[x] = c.norm ? h.v[H_OA + x] / (sd + EPS_STD) : h.v[H_OA + x] * 0.0;
        x0 -= itemp * wn[x] * mean;
        c.theta[x] = (C)theta[x];
        c.mean[x] = (C)mean;
        c.sd[x] = (C)sd;
    }
    c.cs = (C)(p.scale * itemp);
    c.ca = (C)(itemp * wn[0] * theta[0]);
    c.cphi = (C)(itemp * wn[1] * theta[1]);
    c.cc = (C)(itemp * wn[2] * theta[2]);
    c.x0 = (C)x0;
    c.itemp = (C)itemp;
    const double cap = p.softcap > 0 ? p.softcap * itemp : 0.0;
    c.cap = (C)cap;
    c.icap = cap != 0.0 ? (C)(1.0 / cap) : (C)0;
    c.eta = (C)eta;
    c.kap = (C)kap;
    c.rho = (C)rho;
    c.wsum = (C)st[ASC_STAT_WC_SUM];
    c.G = (C)st[ASC_STAT_COH_SPREAD];
    c.gate_a = (C)st[ASC_STAT_GATE_A];
    c.gate_c = (C)st[ASC_STAT_GATE_C];
    c.unorm = (C)st[ASC_STAT_UNORM];
    c.lse = (C)st[ASC_STAT_LSE];
    return c;
}

/* The part of Coef that the score of every pair reads (registers of the epilogues). */
template <typename C> struct XCoef {
    C cs, ca, cphi, cc, x0, itemp, cap, icap;
};

template <typename C> __device__ __forceinline__ XCoef<C> xcoef(const Coef<C> &c) {
    return XCoef<C>{c.cs, c.ca, c.cphi, c.cc, c.x0, c.itemp, c.cap, c.icap};
}

/* x of a pair before beta_other and the softcap, from its products: q.k (unscaled), r, phi, rc. */
template <typename C> __device__ __forceinline__ C pair_score(const XCoef<C> &c, C gs, C r, C phi, C rc) {
    return c.cs * gs + c.ca * r + c.cphi * phi + c.cc * rc + c.x0;
}

/* The softcap x <- cap tanh(x / cap) (SPEC section 9), out of line: only softcapped calls reach it. */
template <typename C> __device__ __noinline__ C softcap(C x, C cap, C icap) { return cap * tnh(x * icap); }

/* The standard deviation (unb = 1: unbiased) of n entries with sum of squared deviations m2. */
__device__ __forceinline__ double std_of(double m2, double n, double unb) {
    return n > 1.0 ? sqrt(m2 / (n - unb)) : 0.0;
}

/* Mean, standard deviation (unb = 1: unbiased) and sum of squared deviations of n entries from their sums about
 * the shift k: a1 = sum (w - k), a2 = sum (w - k)^2 (asc_moments). */
__device__ inline void moments_of(double k, double a1, double a2, int64_t n, double unb, double *mean, double *sd,
                                  double *m2) {
    const double nn = (double)n;
    *mean = n > 0 ? k + a1 / nn : 0.0;
    const double dev = n > 1 ? a2 - a1 * a1 / nn : 0.0;
    *m2 = dev < 0.0 ? 0.0 : dev; /* rounding below 0; a NaN stays NaN */
    *sd = std_of(*m2, nn, unb);
}

/* Chan et al.'s rule: (n, mean, M2) of a part joined by (nb, mb, qb) of another; an empty part takes the other's as
 * they are (mb nb / nb need not round to mb). */
__device__ __forceinline__ void chan_add(double &n, double &mean, double &m2, double nb, double mb, double qb) {
    if (nb > 0 && n == 0) {
        n = nb;
        mean = mb;
        m2 = qb;
    } else if (nb > 0) {
        const double nt = n + nb, dl = mb - mean;
        mean += dl * nb / nt;
        m2 += qb + dl * dl * n * nb / nt;
        n = nt;
    }
}

/* The moments of a row from its shifted sums s1, s2 over its lanes (shift K; none yet: !have), with the own
 * token's value sv added by lane `who` (-1: the own token is not in T(i); it becomes the shift if there was
 * none); sum reduces over the row's lanes (a quad or the warp). */
template <typename C, typename Sum>
__device__ __forceinline__ void shifted_moments(C K, bool have, C sv, int who, int lane, double s1, double s2, Sum sum,
                                                int64_t n, double unb, double *mean, double *sd, double *m2) {
    C k = K;
    if (who >= 0) {
        if (!have) k = sv;
        if (lane == who) {
            const double dlt = (double)(C)(sv - k);
            s1 += dlt;
            s2 += dlt * dlt;
        }
    }
    s1 = sum(s1);
    s2 = sum(s2);
    moments_of((double)k, s1, s2, n, unb, mean, sd, m2);
}

/*
 * Shifted moments of a raw bias row over T(i), per lane for its two rows (g and g + 8 of the warp's m16
 * tile), as the CPU kernels form them: the shift K is the row's first entry in T(i) other than its own
 * token (found in the first tile that has one: a quad minimum of the key column, the value from its lane),
 * the sums of (w - K) and (w - K)^2 run over the other entries (the compute type per tile, double across
 * tiles), and the row's own entry, held back, joins at the end (asc_moments).
 */
template <typename C> struct Moments {
    C K[2], Sv[2];
    bool have[2], selfin[2];
    double s1[2], s2[2];

    __device__ void reset() {
        for (int r = 0; r < 2; r++) {
            K[r] = Sv[r] = (C)0;
            have[r] = selfin[r] = false;
            s1[r] = s2[r] = 0.0;
        }
    }

    /* One tile's values w; `other` / `own`: entry bits (4 n + e) of the entries in T(i) other than / equal to
     * the row's own token. Whole warp. */
    template <int NT> __device__ void tile(const C (&w)[NT][4], unsigned other, unsigned own, int lane) {
        for (int r = 0; r < 2; r++) {
            if (__any_sync(FULL, !have[r])) { /* have is quad-uniform; the shuffles need the whole warp */
                int mine = 64;
                C val = (C)0;
                ASC_UNROLL
                for (int n = NT - 1; n >= 0; n--)
                    ASC_UNROLL
                    for (int e = 3; e >= 0; e--)
                        if ((e >> 1) == r && ((other >> (4 * n + e)) & 1u)) {
                            mine = frag_col(lane, n, e);
                            val = w[n][e];
                        }
                const int first = quad_min(mine);
                const int owner = (lane & ~3) | ((first & 7) >> 1);
                const C k = __shfl_sync(FULL, val, owner);
                if (!have[r] && first < 64) {
                    K[r] = k;
                    have[r] = true;
                }
            }
            C t1 = 0, t2 = 0;
            const unsigned rb = row_bits<NT>(r);
            /* every entry of the row in T(i), none its own token (the common tile): no per-entry tests */
            every_or_not((other & rb) == rb && (own & rb) == 0u, [&](auto every) {
                ASC_UNROLL
                for (int n = 0; n < NT; n++)
                    ASC_UNROLL
                    for (int e = 2 * r; e < 2 * r + 2; e++) {
                        const int bit = 4 * n + e;
                        if (decltype(every)::value || ((other >> bit) & 1u)) {
                            const C dv = w[n][e] - K[r];
                            t1 += dv;
                            t2 += dv * dv;
                        }
                        if (!decltype(every)::value && ((own >> bit) & 1u)) {
                            Sv[r] = w[n][e];
                            selfin[r] = true;
                        }
                    }
            });
            s1[r] += (double)t1;
            s2[r] += (double)t2;
        }
    }

    /* Mean, standard deviation (unb = 1: unbiased) and sum of squared deviations of row r over its n entries;
     * whole warp. */
    __device__ void finish(int r, int64_t n, double unb, int lane, double *mean, double *sd, double *m2) {
        const int who = quad_max(selfin[r] ? lane : -1);
        const C sv = __shfl_sync(FULL, Sv[r], who < 0 ? lane : who);
        shifted_moments(K[r], have[r], sv, who, lane, s1[r], s2[r], [](double v) { return quad_sum(v); }, n, unb,
                        mean, sd, m2);
    }
};

/* asc::topk_push (common.cuh) on the tiled kernels' int32 lists, whose count lives in scratch. */
template <typename C>
__device__ inline void topk_push(int32_t *idx, C *val, int32_t *count, int nmax, int32_t j, C a) {
    *count = (int32_t)asc::topk_push(idx, val, *count, nmax, j, a);
}

/*
 * The candidates of one tile (the lanes in cand: value a, key j; the keys after every key already pushed, in lane
 * order) into a list of at most nmax, whole warp: the list topk_push leaves when it takes them in lane order. That
 * list is the first nmax of the old list and the candidates in the order (value descending, then key), so each lane
 * counts the entries before its own and writes it there. Lists longer than a warp, and a NaN among the values (whose
 * place depends on the pushes' order), take lane 0's pushes.
 */
template <typename C>
__device__ void topk_push_lanes(int32_t *idx, C *val, int32_t *count, int nmax, unsigned cand, int32_t j, C a,
                                int lane) {
    const int32_t cnt = *count;
    const bool mine = (cand >> lane) & 1u, held = lane < cnt;
    const C hv = held ? val[lane] : (C)0;
    const int32_t hj = held ? idx[lane] : 0;
    if (nmax > 32 || __any_sync(FULL, (mine && a != a) || (held && hv != hv))) {
        __syncwarp(); /* every lane's reads above before lane 0 rewrites the list */
        for (unsigned m = cand; m; m &= m - 1u) {
            const int l = __ffs((int)m) - 1;
            const C al = __shfl_sync(FULL, a, l);
            const int32_t jl = __shfl_sync(FULL, j, l);
            if (lane == 0) topk_push(idx, val, count, nmax, jl, al);
        }
        __syncwarp();
        return;
    }
    int32_t before = 0, moved = 0; /* a candidate: the entries before it; a held entry: the candidates before it */
    for (unsigned m = cand; m; m &= m - 1u) {
        const int l = __ffs((int)m) - 1;
        const C al = __shfl_sync(FULL, a, l);
        before += al > a || (al == a && l < lane);
        moved += al > hv;
    }
    for (int32_t e = 0; e < cnt; e++) before += !(val[e] < a); /* held entries have the lower keys */
    __syncwarp();                                              /* the list read before it is rewritten */
    if (held && lane + moved < nmax) {
        val[lane + moved] = hv;
        idx[lane + moved] = hj;
    }
    if (mine && before < nmax) {
        val[before] = a;
        idx[before] = j;
    }
    const int32_t total = cnt + __popc(cand);
    __syncwarp();
    if (lane == 0) *count = total < nmax ? total : nmax;
    __syncwarp();
}

/*
 * A tile's top-k candidates (cand: the lane's entries, bit 4 n + e; rank: their values) into the lists of the lane's
 * rows (g: list 0, g + 8: list 1), the row-major sweeps' fragment layout: the quad of a row holds its keys
 * j0 + 8 n + 2 t + c at lane t, entry 2 r + c. Each row takes its candidates in key order (n8 tile, lane, entry),
 * the order of the serial pushes, so its list is the same to the bit whatever the values (ties, NaN). The rows push
 * side by side: per n8 tile, the quad's candidate bits of both rows gathered in every lane of the quad, then a round
 * per candidate, lane t = r of the quad pushing row r's. Whole warp.
 */
template <typename C, int NT>
__device__ void topk_push_quads(int32_t *const (&idx)[2], C *const (&val)[2], int32_t *const (&count)[2], int nmax,
                                unsigned cand, const C (&rank)[NT][4], int64_t j0, int lane) {
    const int t = lane & 3, q0 = lane & ~3;
    ASC_UNROLL
    for (int n = 0; n < NT; n++) {
        const unsigned cn = (cand >> (4 * n)) & 0xFu;
        if (!__any_sync(FULL, cn != 0u)) continue;
        /* bit 8 r + 2 t + c: the quad's candidates of row r, in key order */
        unsigned m = ((cn & 3u) | ((cn >> 2) << 8)) << (2 * t);
        m |= __shfl_xor_sync(FULL, m, 1);
        m |= __shfl_xor_sync(FULL, m, 2);
        while (__any_sync(FULL, m != 0u)) {
            ASC_UNROLL
            for (int r = 0; r < 2; r++) {
                const unsigned mr = (m >> (8 * r)) & 0xFFu;
                const int pos = mr ? __ffs((int)mr) - 1 : 0; /* 2 t' + c: lane t' of the quad, entry 2 r + c */
                const C v = __shfl_sync(FULL, pos & 1 ? rank[n][2 * r + 1] : rank[n][2 * r], q0 + (pos >> 1));
                if (mr && t == r) topk_push(idx[r], val[r], count[r], nmax, (int32_t)(j0 + 8 * n + pos), v);
                m &= ~((mr & (0u - mr)) << (8 * r));
            }
        }
    }
    __syncwarp(); /* the lists pushed before the quad's lanes read them */
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_ROWCOEF_CUH */
