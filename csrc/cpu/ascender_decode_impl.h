/*
 * ascender_decode_impl.h -- the forward of a few query rows against a long key cache (the decode
 * shape of generation: Nq <= ASC_DECODE_ROWS, no inspection maps; docs/decode.md). Included by
 * ascender_fwd_impl.h, so it is compiled per element type and ISA with the tiled kernels and
 * shares their visibility (an asc_blk of one row), the per-row steps (asc_row_geometry,
 * asc_row_bias_stats, asc_row_output) and the score coefficients. No include guard on purpose.
 *
 * The tiled forward computes blocks of BM = 32 query rows: one row pays for 32, and for the key
 * preparation of every (b, h), O(N (d + dv + dz + da)) per call, as much as the row itself. Here a
 * row streams its keys in chunks of DC keys, parallel over (row, chunk) -- split-K, as
 * flash-decoding does -- in the three sweeps of the tiled forward, each followed by a merge per
 * row in chunk order (the chunks are fixed, so the result does not depend on the thread count):
 *   A geometry  D_j = ||z_j - z_t||^2, a_j = h^_t.h^_j (and s_j for neighbours = "scores")
 *               -> rho, sum wc, sum wc (z_j - z_t), sum wc D_j, moments of phi, the chunk's top-k;
 *               merge: c, G, the gates, u (asc_row_geometry)
 *   B moments   s_j = q.k_j, r_j = u.k^_j, rc_j = ||z_j - c||^2 -> moments of r and rc;
 *               merge: the stats and the row's coefficients (asc_row_bias_stats)
 *   C softmax   x_j from s, r, phi, rc kept per key by A and B -> max, sum exp, sum exp v, aux sums;
 *               merge: the flash-decoding combination of the chunks' (max, sum) (asc_row_output)
 * Per key each sweep reads only what it needs (A: z, h; B: k, z; C: v), and the key norms
 * (1/||k_j||, 1/||h_j||) come from the same read as the key's products, so nothing is prepared
 * per (b, h). Products of a key are summed in SCALAR (as the tiles' products are), a tile's sums
 * over keys in SCALAR and everything across tiles in double; masked keys are never read (SPEC
 * section 11).
 */

#define DC 512 /* keys per chunk: a multiple of BN */
#ifndef ASC_DECODE_ONCE
#define ASC_DECODE_ONCE
#define ASC_DECODE_ROWS 8                 /* query rows up to which a call takes the decode path */
#define ASC_DECODE_BYTES ((int64_t)64 << 20) /* per-(row, key) values held at once (rows in groups) */
#endif

/* What one (row, chunk) leaves for the merge; moments as (count, shift, shifted sums). */
typedef struct FN(dec_part) {
    double rho, W, QZ;     /* A: sum ws (the paper variant without the row's own token), sum wc, sum wc D */
    double K[3], s1[3], s2[3]; /* r, phi, rc (in the order align, sep, coh): shift and shifted sums */
    int64_t n, cnt;        /* |T(i)| in the chunk; its top-k entries */
    double mx, l, ac, as;  /* C: max of x, sum exp(x - mx), sums of exp(x - mx) rc and phi */
    int64_t nsoft;         /* |J(i)| in the chunk */
} FN(dec_part);

/* Scratch of one group of rows (rows g0 .. g0 + Rg - 1): per-(row, chunk) partials, per-(row, key) values. */
typedef struct FN(dec_buf) {
    int64_t Rg, nc;
    FN(dec_part) *part; /* [Rg][nc] */
    double *P, *O;      /* [Rg][nc][dz], [Rg][nc][dv] */
    SCALAR *Pt, *Ot;    /* [Rg][nc][dz], [Rg][nc][dv]: one tile's share of P and O, summed in SCALAR */
    SCALAR *hq;         /* [Rg][da]: h^_t of the row (asc_inv_norm) */
    int64_t *nbr;       /* [Rg][nc + 1][n_nbr]: each chunk's top-k, then the row's */
    double *nbv;
    SCALAR *PH, *RR, *RC, *SS; /* [Rg][N]: phi, r, rc, q.k per key */
    double *mom;        /* [Rg][3][2]: mean and std of r, phi, rc */
    double *ubuf;       /* [Rg][2 d] */
    SCALAR *ct;         /* [Rg][dz] */
    FN(asc_coef) *coef; /* [Rg] */
} FN(dec_buf);

static void FN(dec_buf_free)(FN(dec_buf) *B) {
    free(B->part); free(B->P); free(B->O); free(B->Pt); free(B->Ot); free(B->hq); free(B->nbr); free(B->nbv); free(B->PH); free(B->RR); free(B->RC);
    free(B->SS); free(B->mom); free(B->ubuf); free(B->ct); free(B->coef);
}

static int FN(dec_buf_alloc)(FN(dec_buf) *B, const asc_params *p, int64_t Rg) {
    const size_t R = (size_t)Rg, nc = (size_t)((p->N + DC - 1) / DC), N = (size_t)p->N, S = sizeof(SCALAR);
    const size_t nn = (size_t)(p->n_nbr ? p->n_nbr : 1), dz = (size_t)(p->dz ? p->dz : 1);
    const size_t dv = (size_t)(p->dv ? p->dv : 1), d = (size_t)(p->d ? p->d : 1);
    B->Rg = Rg;
    B->nc = (int64_t)nc;
    B->part = malloc(sizeof(FN(dec_part)) * R * nc);
    B->P = malloc(sizeof(double) * R * nc * dz);
    B->O = malloc(sizeof(double) * R * nc * dv);
    B->Pt = malloc(S * R * nc * dz);
    B->Ot = malloc(S * R * nc * dv);
    B->hq = malloc(S * R * (size_t)(p->da ? p->da : 1));
    B->nbr = malloc(sizeof(int64_t) * R * (nc + 1) * nn);
    B->nbv = malloc(sizeof(double) * R * (nc + 1) * nn);
    B->PH = malloc(S * R * N); B->RR = malloc(S * R * N); B->RC = malloc(S * R * N); B->SS = malloc(S * R * N);
    B->mom = malloc(sizeof(double) * R * 6);
    B->ubuf = malloc(sizeof(double) * R * 2 * d);
    B->ct = malloc(S * R * dz);
    B->coef = malloc(sizeof(FN(asc_coef)) * R);
    if (B->part && B->P && B->O && B->Pt && B->Ot && B->hq && B->nbr && B->nbv && B->PH && B->RR && B->RC && B->SS && B->mom && B->ubuf &&
        B->ct && B->coef)
        return 0;
    FN(dec_buf_free)(B);
    return 1;
}

/* The one-row block of query row `row` (over all (b, h)): its tile masks have one row. */
static void FN(dec_row_blk)(FN(asc_blk) *bk, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp,
                            int64_t row) {
    const int64_t i = row % p->Nq;
    FN(asc_blk_init)(bk, p, a, kp, row / p->Nq, i / BM);
    bk->i0 = i;
    bk->nrows = 1;
    bk->rows = 1;
    bk->t0 = bk->tlast = i + p->N - p->Nq - p->keys_after;
    bk->mrows = 1;
}

/* The keys of a tile that are in the set (T or J): in[j] = -1, else 0 (also past nj). Returns
 * whether there is any. */
static int FN(dec_in)(SINT *in, int fl, int any_flag, int full_flag, const SINT *m, int64_t nj) {
    if (!(fl & any_flag)) return 0;
    for (int64_t j = 0; j < BN; j++) in[j] = j < nj && ((fl & full_flag) || m[j]) ? (SINT)-1 : 0;
    return 1;
}

/* Moments of one raw row over a chunk: the first value K, sums of (x - K) and (x - K)^2. */
typedef struct FN(dec_sums) {
    double K, s1, s2;
} FN(dec_sums);

ASC_INLINE void FN(dec_sums_add)(FN(dec_sums) *m, double v, int first) {
    if (first) m->K = v;
    const double dl = v - m->K;
    m->s1 += dl;
    m->s2 += dl * dl;
}

ASC_INLINE void FN(dec_sums_store)(FN(dec_part) *pt, int x, const FN(dec_sums) *m) {
    pt->K[x] = m->K;
    pt->s1[x] = m->s1;
    pt->s2[x] = m->s2;
}

/* A sum of squares in SCALAR is used where it is a normal number well inside the type's range;
 * otherwise (a key or semantic row scaled near overflow or underflow) the row's products are
 * formed again in double, so the normalizations stay scale-free as asc_inv_norm's are. */
/* Key rows are read once per sweep, straight from memory: fetch the row DEC_AHEAD keys ahead. */
#define DEC_AHEAD 8
ASC_INLINE void FN(dec_prefetch)(const SCALAR *row, int64_t F) {
    for (int64_t f = 0; f < F; f += 64 / (int64_t)sizeof(SCALAR)) __builtin_prefetch(row + f);
}

#define DEC_SAFE(ss) ((ss) > (ASC_F32 ? 1e-30 : 1e-290) && (ss) < (ASC_F32 ? 1e30 : 1e290))

/* u.x / max(||x||, 1e-12) formed in double: the fallback where x's sum of squares is not DEC_SAFE. */
static SCALAR FN(dec_unit_dot)(const SCALAR *u, const SCALAR *x, int64_t F) {
    double xx = 0.0, ux = 0.0;
    for (int64_t f = 0; f < F; f++) {
        xx += (double)x[f] * x[f];
        ux += (double)u[f] * x[f];
    }
    const double n = sqrt(xx);
    return (SCALAR)(ux / (n > ASC_EPS_NORM ? n : ASC_EPS_NORM));
}

/* Moments of raw row x over the chunks in order (Chan et al.'s merge of (n, mean, M2)): mean, std. */
static void FN(dec_moments)(const FN(dec_part) *pt, int64_t nc, int x, double unb, double *mean, double *sd) {
    double n = 0.0, mu = 0.0, M2 = 0.0;
    for (int64_t ch = 0; ch < nc; ch++) {
        const double nb = (double)pt[ch].n;
        if (pt[ch].n == 0) continue;
        const double mb = pt[ch].K[x] + pt[ch].s1[x] / nb, M2b = pt[ch].s2[x] - pt[ch].s1[x] * pt[ch].s1[x] / nb;
        if (n == 0.0) {
            n = nb; mu = mb; M2 = M2b;
            continue;
        }
        const double dl = mb - mu, nn = n + nb;
        mu += dl * nb / nn;
        M2 += M2b + dl * dl * n * nb / nn;
        n = nn;
    }
    *mean = n > 0.0 ? mu : 0.0;
    const double var = n > 1.0 ? M2 / (n - unb) : 0.0;
    *sd = var < 0.0 ? 0.0 : sqrt(var); /* rounding below 0 (a NaN stays NaN) */
}

/* ---------------------------------------------------------------- A: geometry of one (row, chunk) */

static void FN(dec_geometry)(FN(dec_buf) *B, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp,
                             int64_t row, int64_t rg, int64_t ch) {
    SCALAR Dt[BN] __attribute__((aligned(64))), At[BN] __attribute__((aligned(64)));
    SCALAR WS[BN] __attribute__((aligned(64))), WC[BN] __attribute__((aligned(64)));
    SCALAR PT[BN] __attribute__((aligned(64))), Rk[BN] __attribute__((aligned(64))), HH[BN] __attribute__((aligned(64)));
    SINT mT[BN] __attribute__((aligned(64))), mJ[BN] __attribute__((aligned(64))), in[BN] __attribute__((aligned(64)));
    FN(asc_blk) bk;
    FN(dec_row_blk)(&bk, p, a, kp, row);
    const int64_t N = p->N, d = p->d, dz = p->dz, da = p->da, bh = bk.bh, t = bk.t0, nn = p->n_nbr;
    const int paper = p->variant == ASC_VARIANT_PAPER, scores = paper && p->neighbours == ASC_NEIGHBOURS_SCORES;
    const SCALAR *z = (const SCALAR *)a->z + bh * N * dz, *h = (const SCALAR *)a->h + bh * N * da;
    const SCALAR *k = (const SCALAR *)a->k + bh * N * d, *q = (const SCALAR *)a->q + row * d;
    const SCALAR *zi = z + t * dz, *hq = B->hq + rg * da;
    const SCALAR nits = (SCALAR)(-1.0 / (p->tau_sep + ASC_EPS_TAU)), nitc = (SCALAR)(-1.0 / (p->tau_coh + ASC_EPS_TAU));
    const SCALAR delta = (SCALAR)ASC_HEAD(a, delta, bk.hd);
    const VS zero = FN(vset)(0);
    const int64_t item = rg * B->nc + ch;
    FN(dec_part) *pt = B->part + item;
    double *P = B->P + item * dz, rho = 0.0, W = 0.0, QZ = 0.0;
    SCALAR *Pt = B->Pt + item * dz;
    int64_t *nb = B->nbr + (rg * (B->nc + 1) + ch) * (nn ? nn : 1), n = 0, cnt = 0;
    double *nv = B->nbv + (rg * (B->nc + 1) + ch) * (nn ? nn : 1);
    SCALAR *PH = B->PH + rg * N;
    FN(dec_sums) mp = {0.0, 0.0, 0.0};
    memset(pt, 0, sizeof(*pt));
    for (int64_t f = 0; f < dz; f++) P[f] = 0.0;
    const int64_t end = FN(asc_stat_end)(p, &bk), c1 = (ch + 1) * DC < end ? (ch + 1) * DC : end;
    for (int64_t j0 = FN(asc_next_tile)(p, &bk, ch * DC); j0 < c1; j0 = FN(asc_next_tile)(p, &bk, j0 + BN)) {
        const int64_t nj = c1 - j0 < BN ? c1 - j0 : BN;
        if (!FN(dec_in)(in, FN(asc_tile_masks)(p, &bk, j0, nj, mT, mJ), ASC_T_ANY, ASC_T_FULL, mT, nj)) continue;
        for (int64_t j = 0; j < BN; j++) {
            Dt[j] = At[j] = Rk[j] = 0;
            HH[j] = 1;
            if (!in[j]) continue;
            const SCALAR *zj = z + (j0 + j) * dz, *hj = h + (j0 + j) * da;
            if (j0 + j + DEC_AHEAD < c1) {
                FN(dec_prefetch)(zj + DEC_AHEAD * dz, dz);
                FN(dec_prefetch)(hj + DEC_AHEAD * da, da);
            }
            SCALAR dd = 0, hh = 0, ha = 0;
            #pragma omp simd reduction(+:dd)
            for (int64_t f = 0; f < dz; f++) {
                const SCALAR df = zi[f] - zj[f];
                dd += df * df;
            }
            #pragma omp simd reduction(+:hh, ha)
            for (int64_t f = 0; f < da; f++) {
                hh += hj[f] * hj[f];
                ha += hq[f] * hj[f];
            }
            if (!DEC_SAFE(hh)) { /* HH = 1 takes a as it is */
                ha = FN(dec_unit_dot)(hq, hj, da);
                hh = 1;
            }
            Dt[j] = j0 + j == t ? (SCALAR)0 : dd;
            HH[j] = hh;
            At[j] = ha;
            if (scores) {
                SCALAR qk = 0;
                #pragma omp simd reduction(+:qk)
                for (int64_t f = 0; f < d; f++) qk += q[f] * k[(j0 + j) * d + f];
                Rk[j] = (SCALAR)p->scale * qk;
            }
        }
        #pragma omp simd
        for (int64_t j = 0; j < BN; j++) { /* a = h^_t.h_j / max(||h_j||, eps) */
            const SCALAR nh = sqrt(HH[j]);
            At[j] /= nh > (SCALAR)ASC_EPS_NORM ? nh : (SCALAR)ASC_EPS_NORM;
        }
        for (int64_t o = 0; o < nj; o += VL) { /* the weights, as F1 forms them */
            const VI m = FN(vldi)(in + o);
            const VS D = FN(vld)(Dt + o), ws = FN(vexp)(D * nits);
            FN(vst)(WS + o, FN(vsel)(m, ws, zero));
            FN(vst)(WC + o, FN(vsel)(m, FN(vexp)(D * nitc), zero));
            FN(vst)(PT + o, FN(vsel)(m, ws * FN(vclamp0)(FN(vld)(At + o) - delta), zero));
        }
        for (int64_t f = 0; f < dz; f++) Pt[f] = 0;
        for (int64_t j = 0; j < nj; j++) {
            if (!in[j]) continue;
            const int64_t key = j0 + j;
            const int self = key == t;
            const SCALAR wc = WC[j];
            rho += paper && self ? 0.0 : (double)WS[j];
            W += (double)wc;
            QZ += (double)wc * (double)Dt[j];
            FN(dec_sums_add)(&mp, (double)PT[j], n == 0);
            n++;
            PH[key] = PT[j];
            if (paper && !self) cnt = asc_topk_push(nb, nv, cnt, nn, key, (double)(scores ? Rk[j] : At[j]));
            const SCALAR *zj = z + key * dz;
            #pragma omp simd
            for (int64_t f = 0; f < dz; f++) Pt[f] += wc * (zj[f] - zi[f]);
        }
        for (int64_t f = 0; f < dz; f++) P[f] += (double)Pt[f];
    }
    pt->rho = rho;
    pt->W = W;
    pt->QZ = QZ;
    pt->n = n;
    pt->cnt = cnt;
    FN(dec_sums_store)(pt, 1, &mp);
}

/* Row `row` before its sweeps: h^_t, its normalized semantic row. */
static void FN(dec_row_prepare)(FN(dec_buf) *B, const asc_params *p, const asc_fwd_args *a, int64_t row, int64_t rg) {
    const int64_t da = p->da, t = row % p->Nq + p->N - p->Nq - p->keys_after;
    const SCALAR *ht = (const SCALAR *)a->h + ((row / p->Nq) * p->N + t) * da;
    const SCALAR rh = FN(asc_inv_norm)(ht, da);
    for (int64_t f = 0; f < da; f++) B->hq[rg * da + f] = ht[f] * rh;
}

/* Row `row`: the chunks of A merged, then its centroid, gates, heading and first stats. */
static void FN(dec_geometry_merge)(FN(dec_buf) *B, const asc_params *p, const asc_fwd_args *a, int64_t row,
                                   int64_t rg) {
    const int64_t N = p->N, dz = p->dz, nn = p->n_nbr, nc = B->nc, bh = row / p->Nq;
    const int64_t t = row % p->Nq + N - p->Nq - p->keys_after, ns = nn ? nn : 1;
    const FN(dec_part) *pt = B->part + rg * nc;
    double *P = B->P + rg * nc * dz;
    int64_t *nb = B->nbr + (rg * (nc + 1) + nc) * ns, cnt = 0, n = 0;
    double *nv = B->nbv + (rg * (nc + 1) + nc) * ns, rho = 0.0, W = 0.0, QZ = 0.0;
    for (int64_t ch = 0; ch < nc; ch++) {
        rho += pt[ch].rho;
        W += pt[ch].W;
        QZ += pt[ch].QZ;
        n += pt[ch].n;
        if (ch > 0)
            for (int64_t f = 0; f < dz; f++) P[f] += P[ch * dz + f];
        /* the chunks' lists in chunk order: ties keep the lower index, as one sweep would */
        const int64_t *cb = B->nbr + (rg * (nc + 1) + ch) * ns;
        const double *cv = B->nbv + (rg * (nc + 1) + ch) * ns;
        for (int64_t e = 0; e < pt[ch].cnt; e++) cnt = asc_topk_push(nb, nv, cnt, nn, cb[e], cv[e]);
    }
    const SCALAR *zt = (const SCALAR *)a->z + (bh * N + t) * dz;
    FN(asc_row_geometry)(p, a, bh, row, t, zt, W, P, 1, QZ, rho, n, nb, cnt, B->ubuf + rg * 2 * p->d, B->ct + rg * dz,
                         1);
    double *mom = B->mom + rg * 6;
    FN(dec_moments)(pt, nc, 1, p->variant == ASC_VARIANT_PAPER ? 0.0 : 1.0, &mom[2], &mom[3]);
}

/* ---------------------------------------------------------------- B: moments of r and rc */

static void FN(dec_moments_sweep)(FN(dec_buf) *B, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp,
                                  int64_t row, int64_t rg, int64_t ch) {
    SCALAR KK[BN] __attribute__((aligned(64)));
    SINT mT[BN] __attribute__((aligned(64))), mJ[BN] __attribute__((aligned(64))), in[BN] __attribute__((aligned(64)));
    FN(asc_blk) bk;
    FN(dec_row_blk)(&bk, p, a, kp, row);
    const int64_t N = p->N, d = p->d, dz = p->dz, bh = bk.bh;
    const SCALAR *z = (const SCALAR *)a->z + bh * N * dz, *k = (const SCALAR *)a->k + bh * N * d;
    const SCALAR *q = (const SCALAR *)a->q + row * d, *u = (const SCALAR *)a->u + row * d;
    const SCALAR *c = (const SCALAR *)a->c + row * dz;
    SCALAR *RR = B->RR + rg * N, *RC = B->RC + rg * N, *SS = B->SS + rg * N;
    FN(dec_sums) mr = {0.0, 0.0, 0.0}, mc = {0.0, 0.0, 0.0};
    int64_t n = 0;
    const int64_t end = FN(asc_stat_end)(p, &bk), c1 = (ch + 1) * DC < end ? (ch + 1) * DC : end;
    for (int64_t j0 = FN(asc_next_tile)(p, &bk, ch * DC); j0 < c1; j0 = FN(asc_next_tile)(p, &bk, j0 + BN)) {
        const int64_t nj = c1 - j0 < BN ? c1 - j0 : BN;
        if (!FN(dec_in)(in, FN(asc_tile_masks)(p, &bk, j0, nj, mT, mJ), ASC_T_ANY, ASC_T_FULL, mT, nj)) continue;
        for (int64_t j = 0; j < nj; j++) {
            KK[j] = 1;
            RR[j0 + j] = 0;
            if (!in[j]) continue;
            const int64_t key = j0 + j;
            const SCALAR *kj = k + key * d, *zj = z + key * dz;
            if (key + DEC_AHEAD < c1) {
                FN(dec_prefetch)(kj + DEC_AHEAD * d, d);
                FN(dec_prefetch)(zj + DEC_AHEAD * dz, dz);
            }
            SCALAR kk = 0, uk = 0, qk = 0, rc = 0;
            #pragma omp simd reduction(+:kk, uk, qk)
            for (int64_t f = 0; f < d; f++) {
                kk += kj[f] * kj[f];
                uk += u[f] * kj[f];
                qk += q[f] * kj[f];
            }
            #pragma omp simd reduction(+:rc)
            for (int64_t f = 0; f < dz; f++) {
                const SCALAR df = zj[f] - c[f];
                rc += df * df;
            }
            if (!DEC_SAFE(kk)) { /* KK = 1 takes r as it is */
                uk = FN(dec_unit_dot)(u, kj, d);
                kk = 1;
            }
            KK[j] = kk;
            RR[key] = uk;
            RC[key] = rc;
            SS[key] = qk;
        }
        SCALAR *rr = RR + j0;
        #pragma omp simd
        for (int64_t j = 0; j < nj; j++) { /* r = u.k_j / max(||k_j||, eps) (a masked key's entry is never read) */
            const SCALAR nk = sqrt(KK[j]);
            rr[j] /= nk > (SCALAR)ASC_EPS_NORM ? nk : (SCALAR)ASC_EPS_NORM;
        }
        for (int64_t j = 0; j < nj; j++) {
            if (!in[j]) continue;
            FN(dec_sums_add)(&mr, (double)rr[j], n == 0);
            FN(dec_sums_add)(&mc, (double)RC[j0 + j], n == 0);
            n++;
        }
    }
    FN(dec_part) *pt = B->part + rg * B->nc + ch;
    FN(dec_sums_store)(pt, 0, &mr);
    FN(dec_sums_store)(pt, 2, &mc);
}

/* Row `row`: the moments of its three bias rows, its stats and score coefficients. */
static void FN(dec_moments_merge)(FN(dec_buf) *B, const asc_params *p, const asc_fwd_args *a, int64_t row, int64_t rg) {
    double *mom = B->mom + rg * 6;
    const double unb = p->variant == ASC_VARIANT_PAPER ? 0.0 : 1.0;
    FN(dec_moments)(B->part + rg * B->nc, B->nc, 0, unb, &mom[0], &mom[1]);
    FN(dec_moments)(B->part + rg * B->nc, B->nc, 2, unb, &mom[4], &mom[5]);
    FN(asc_row_bias_stats)(p, a, row, (row / p->Nq) % p->H, (const double(*)[2])mom, B->coef + rg);
}

/* ---------------------------------------------------------------- C: softmax and output */

static void FN(dec_softmax)(FN(dec_buf) *B, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp,
                            int64_t row, int64_t rg, int64_t ch) {
    SCALAR X[BN] __attribute__((aligned(64))), E[BN] __attribute__((aligned(64)));
    SINT mT[BN] __attribute__((aligned(64))), mJ[BN] __attribute__((aligned(64))), in[BN] __attribute__((aligned(64)));
    FN(asc_blk) bk;
    FN(dec_row_blk)(&bk, p, a, kp, row);
    const int64_t N = p->N, dv = p->dv, bh = bk.bh, t = bk.t0;
    const SCALAR *v = (const SCALAR *)a->v + bh * N * dv;
    const SCALAR *ab = a->attn_bias ? (const SCALAR *)a->attn_bias + bk.b * p->ab_sb + bk.hd * p->ab_sh + bk.i0 * p->ab_si
                                    : NULL;
    const double slope = a->alibi_slopes ? (double)((const SCALAR *)a->alibi_slopes)[bk.bh] : 0.0;
    const FN(asc_coef) *cf = B->coef + rg;
    const SCALAR *PH = B->PH + rg * N, *RR = B->RR + rg * N, *RC = B->RC + rg * N, *SS = B->SS + rg * N;
    FN(dec_part) *pt = B->part + rg * B->nc + ch;
    double *O = B->O + (rg * B->nc + ch) * dv, mx = -INFINITY, l = 0.0, ac = 0.0, as = 0.0;
    SCALAR *Ot = B->Ot + (rg * B->nc + ch) * dv;
    int64_t nsoft = 0;
    for (int64_t f = 0; f < dv; f++) O[f] = 0.0;
    const int64_t end = FN(asc_soft_end)(p, &bk), c1 = (ch + 1) * DC < end ? (ch + 1) * DC : end;
    for (int64_t j0 = FN(asc_next_tile)(p, &bk, ch * DC); j0 < c1; j0 = FN(asc_next_tile)(p, &bk, j0 + BN)) {
        const int64_t nj = c1 - j0 < BN ? c1 - j0 : BN;
        if (!FN(dec_in)(in, FN(asc_tile_masks)(p, &bk, j0, nj, mT, mJ), ASC_J_ANY, ASC_J_FULL, mJ, nj)) continue;
        double tmax = -INFINITY;
        for (int64_t j = 0; j < BN; j++) { /* x_j as asc_xval forms it */
            X[j] = (SCALAR)-INFINITY;
            if (!in[j]) continue;
            const int64_t key = j0 + j;
            double x = cf->cs * SS[key] + cf->ca * RR[key] + cf->cphi * PH[key] + cf->cc * RC[key] + cf->x0;
            double xo = 0.0; /* itemp beta_other, inside or outside the cap */
            if (ab || slope != 0.0) {
                const double ob = (ab ? (double)ab[key * p->ab_sj] : 0.0) - slope * (double)(t > key ? t - key : key - t);
                xo = cf->itemp * (double)(SCALAR)ob;
            }
            if (!cf->outside) x += xo;
            if (cf->cap != 0.0) x = cf->cap * tanh(x / cf->cap);
            if (cf->outside) x += xo;
            X[j] = (SCALAR)x;
            tmax = X[j] > tmax ? (double)X[j] : tmax; /* a NaN x does not set the max (its exp is NaN) */
        }
        if (tmax > mx) {
            const double alpha = mx == -INFINITY ? 0.0 : exp(mx - tmax);
            l *= alpha;
            ac *= alpha;
            as *= alpha;
            for (int64_t f = 0; f < dv; f++) O[f] *= alpha;
            mx = tmax;
        }
        const VS zero = FN(vset)(0), vm = FN(vset)((SCALAR)mx);
        for (int64_t o = 0; o < nj; o += VL)
            FN(vst)(E + o, FN(vsel)(FN(vldi)(in + o), FN(vexp)(FN(vld)(X + o) - vm), zero));
        for (int64_t f = 0; f < dv; f++) Ot[f] = 0;
        for (int64_t j = 0; j < nj; j++) {
            if (!in[j]) continue;
            const int64_t key = j0 + j;
            const SCALAR e = E[j], *vj = v + key * dv;
            if (key + DEC_AHEAD < c1) FN(dec_prefetch)(vj + DEC_AHEAD * dv, dv);
            l += (double)e;
            ac += (double)e * (double)RC[key];
            as += (double)e * (double)PH[key];
            nsoft++;
            #pragma omp simd
            for (int64_t f = 0; f < dv; f++) Ot[f] += e * vj[f];
        }
        for (int64_t f = 0; f < dv; f++) O[f] += (double)Ot[f];
    }
    pt->mx = mx;
    pt->l = l;
    pt->ac = ac;
    pt->as = as;
    pt->nsoft = nsoft;
}

/* Row `row`: the chunks' softmax partials combined (rescaled to the row's max), then y, LSE, aux. */
static void FN(dec_softmax_merge)(FN(dec_buf) *B, const asc_params *p, const asc_fwd_args *a, int64_t row, int64_t rg) {
    const int64_t nc = B->nc, dv = p->dv;
    const FN(dec_part) *pt = B->part + rg * nc;
    double *O = B->O + rg * nc * dv, mx = -INFINITY, l = 0.0, ac = 0.0, as = 0.0;
    int64_t nsoft = 0;
    for (int64_t ch = 0; ch < nc; ch++)
        if (pt[ch].nsoft > 0 && pt[ch].mx > mx) mx = pt[ch].mx;
    for (int64_t ch = 0; ch < nc; ch++) {
        if (pt[ch].nsoft == 0) continue;
        const double w = pt[ch].mx == -INFINITY ? 0.0 : exp(pt[ch].mx - mx);
        l += w * pt[ch].l;
        ac += w * pt[ch].ac;
        as += w * pt[ch].as;
        nsoft += pt[ch].nsoft;
        if (ch == 0) { /* chunk 0's O is the row's accumulator (all 0 when the chunk saw no key) */
            if (w != 1.0)
                for (int64_t f = 0; f < dv; f++) O[f] *= w;
        } else {
            for (int64_t f = 0; f < dv; f++) O[f] += w * O[ch * dv + f];
        }
    }
    FN(asc_row_output)(p, a, row, O, 1, l, mx, nsoft, ac, as);
}

/* ---------------------------------------------------------------- the decode forward */

/* Whether a call takes the decode path: few query rows, no inspection maps (those need every key
 * of every row: the tiled forward writes them). */
static int FN(asc_decode_applies)(const asc_params *p, const asc_fwd_args *a) {
    return p->Nq <= ASC_DECODE_ROWS && !a->map_attn && !a->dropout_seed; /* (dropout: the tiled forward) */
}

/* Every step of one row on the calling thread: its chunks one after the other. */
static void FN(dec_row)(FN(dec_buf) *B, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp, int64_t row,
                        int64_t rg) {
    FN(dec_row_prepare)(B, p, a, row, rg);
    for (int64_t ch = 0; ch < B->nc; ch++) FN(dec_geometry)(B, p, a, kp, row, rg, ch);
    FN(dec_geometry_merge)(B, p, a, row, rg);
    for (int64_t ch = 0; ch < B->nc; ch++) FN(dec_moments_sweep)(B, p, a, kp, row, rg, ch);
    FN(dec_moments_merge)(B, p, a, row, rg);
    for (int64_t ch = 0; ch < B->nc; ch++) FN(dec_softmax)(B, p, a, kp, row, rg, ch);
    FN(dec_softmax_merge)(B, p, a, row, rg);
}

/*
 * Scheduling (the chunks and their merge order are the same either way, so are the bits): with at
 * least two rows per thread, a thread takes whole rows (one loop, no barrier inside a call); with
 * fewer rows the (row, chunk) pairs of each sweep are spread over the threads (split-K), a barrier
 * after each sweep and each merge. The threads a call takes (dec_threads) follow its work: whole rows for one thread
 * per DEC_ROW_PAIRS (row, key) pairs, or, where that gives more, the chunks of the split schedule for one thread per
 * DEC_SPLIT_PAIRS (its seven barriers cost more than a thread's start) and per chunk.
 */
#define DEC_ROW_PAIRS 256
#define DEC_SPLIT_PAIRS 4096

/* Threads for R rows of N keys in nc chunks, at most `limit` (2 threads, paper, 2026-12-02, against one thread for
 * fewer than 32768 pairs before: B H = 8, N = 256 0.30 -> 0.15 ms, N = 2048 2.1 -> 0.90 ms; B H = 1, N = 16384
 * 1.8 -> 1.2 ms). */
static int FN(dec_threads)(int64_t R, int64_t N, int64_t nc, int limit) {
    int64_t rows = R * N / DEC_ROW_PAIRS, split = R * N / DEC_SPLIT_PAIRS;
    rows = rows < R / 2 ? rows : R / 2; /* two rows a thread at least */
    split = split < R * nc ? split : R * nc;
    const int64_t t = rows > split ? rows : split;
    return t < 1 ? 1 : (t < limit ? (int)t : limit);
}

static int FN(asc_decode_fwd)(const asc_params *p, const asc_fwd_args *a) {
    const int64_t R = p->B * p->H * p->Nq, nc = (p->N + DC - 1) / DC;
    /* rows per group: the per-(row, key) values of a group within ASC_DECODE_BYTES */
    const int64_t per_row = 4 * (int64_t)sizeof(SCALAR) * p->N;
    int64_t Rg = ASC_DECODE_BYTES / (per_row ? per_row : 1);
    Rg = Rg < 1 ? 1 : (Rg > R ? R : Rg);
    FN(asc_keys) kp;
    FN(dec_buf) B;
    if (FN(asc_keys_alloc)(&kp, p, a, 0)) return 1;
    if (FN(dec_buf_alloc)(&B, p, Rg)) {
        FN(asc_keys_free)(&kp);
        return 1;
    }
    const int threads = FN(dec_threads)(R, p->N, nc, omp_get_max_threads());
    #pragma omp parallel if (threads > 1) num_threads(threads)
    {
        FN(asc_keys_fill)(&kp, p, a);
        for (int64_t g0 = 0; g0 < R; g0 += Rg) {
            const int64_t ng = R - g0 < Rg ? R - g0 : Rg;
            if (ng >= 2 * omp_get_num_threads()) {
                #pragma omp for schedule(dynamic, 1)
                for (int64_t r = 0; r < ng; r++) FN(dec_row)(&B, p, a, &kp, g0 + r, r);
                continue;
            }
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < ng; r++) FN(dec_row_prepare)(&B, p, a, g0 + r, r);
            #pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < ng * nc; it++) FN(dec_geometry)(&B, p, a, &kp, g0 + it / nc, it / nc, it % nc);
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < ng; r++) FN(dec_geometry_merge)(&B, p, a, g0 + r, r);
            #pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < ng * nc; it++)
                FN(dec_moments_sweep)(&B, p, a, &kp, g0 + it / nc, it / nc, it % nc);
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < ng; r++) FN(dec_moments_merge)(&B, p, a, g0 + r, r);
            #pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < ng * nc; it++) FN(dec_softmax)(&B, p, a, &kp, g0 + it / nc, it / nc, it % nc);
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < ng; r++) FN(dec_softmax_merge)(&B, p, a, g0 + r, r);
        }
    }
    FN(dec_buf_free)(&B);
    FN(asc_keys_free)(&kp);
    return 0;
}
