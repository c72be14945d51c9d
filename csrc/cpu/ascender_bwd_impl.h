/*
 * ascender_bwd_impl.h -- generic body of the tiled CPU backward (docs/tiling.md section 4; the
 * math, pass by pass: docs/backward.md), compiled per element type and ISA through
 * instantiate_isa.h. No include guard on purpose.
 *
 * The forward's saved outputs (stats, u, c, nbr, y, aux) give every per-row coefficient of the
 * scores, so A_ij = exp(x_ij - LSE_i) and P_i = dy_i.y_i need no pass. Per query block, two
 * sweeps over the key tiles:
 *   B1  A, dA, dS on the tile (kept in a BM x N buffer pair for B2); dq; the row sums of dS
 *       against the three raw bias rows, and three products for the centroid gradient dc
 *   B2  the bias-row gradients B = p dS + q + r w, then the separation, cohesion, distance and
 *       affinity paths; row-side products du, dz_i, dh^_i; column-side products dk, dv, dk^,
 *       dz_j, dh^_j into the block's chunk accumulators.
 * Column accumulators: ASC_BWD_CHUNKS fixed chunks per (b, h) (block I -> chunk I mod C), summed
 * in chunk order, so the result does not depend on the number of threads.
 */

#include "ascender_tile_impl.h"
#include "ascender_plan_impl.h"

#ifndef ASC_BWD_CHUNKS
#define ASC_BWD_CHUNKS 4
#endif

#ifndef ASC_BWD_ONCE
#define ASC_BWD_ONCE
/* per-row constants of B2 (SCALAR vectors) */
enum { RV_LSE, RV_P, RV_ITEMP, RV_GCO, RV_GSE, RV_CA, RV_CPHI, RV_DRHO, RV_CRC, RV_CG, RV_DCC, RV_IW, RV_G, RV_DG,
       ASC_NRV };
/* row sums (double) */
enum { BS_SD, BS_SDR, BS_SDP, BS_SDC, BS_SDX, BS_SR, BS_SP, BS_SC, BS_SRC, BS_DA, BS_DD, BS_RA, ASC_NBS };
/* per (chunk, head) gradient accumulators: the nine learnable scalars in SPEC order (the sinks' are per row) */
enum { ASC_NACC = ASC_NSCALAR };
#endif

/* Per-thread state of the backward. */
typedef struct FN(asc_bws) {
    SCALAR *G1, *G2, *G3, *G4, *G5, *G6;   /* score tiles [BN][BM] */
    SCALAR *OB;                            /* beta_other */
    SCALAR *DM, *dSo;                      /* dropout: m_ij / (1 - p) (asc_dropout_tile); dSx for dattn_bias */
    SINT *mT, *mJ;
    SCALAR *TD;                            /* Bc: drc on the tile */
    SCALAR *TA, *TAk, *T1, *T2, *T3, *Tda; /* B2 tiles */
    SCALAR *Ab, *dSb;                      /* [N][BM]: A and dS of the block, B1 -> Bc, B2 */
    SCALAR *Adb;                           /* [N][BM] with dropout: A m / (1 - p), B1 -> B2 (dv) */
    SCALAR *Rb, *RCb;                      /* [N][BM]: r and rc on T (0 elsewhere), B1 -> Bc, B2 */
    SCALAR *R;                             /* row-product tile [fmax][BM] */
    SCALAR *qT, *uT, *cT, *zT, *hT, *dyT, *dcT; /* [F][BM] */
    SCALAR *sQ, *U, *Cm2, *dC, *Zm2, *Hh, *dY;  /* [BM][Fp] */
    SCALAR *nzr, *ncc;                     /* [BM] */
    SCALAR *rv;                            /* [ASC_NRV][BM] */
    double *rs;                            /* [ASC_NBS][BM] */
    double *pqr;                           /* [9][BM]: p, q, r of the align, sep, coh rows */
    double *dq, *du, *Edc, *dzr, *dhr;     /* [F][BM] */
    double *vec, *vec2;                    /* [max(d, dz)] */
    FN(asc_coef) *coef;                    /* [BM] */
} FN(asc_bws);

static void FN(asc_bws_layout)(FN(asc_bws) *w, asc_arena *ar, const asc_params *p, int drop) {
    const size_t T = (size_t)BN * BM, S = sizeof(SCALAR), N = (size_t)p->N;
    const size_t d = (size_t)(p->d ? p->d : 1), dv = (size_t)(p->dv ? p->dv : 1);
    const size_t dz = (size_t)(p->dz ? p->dz : 1), da = (size_t)(p->da ? p->da : 1);
    const size_t dp = (size_t)FN(asc_padded)((int64_t)d), dvp = (size_t)FN(asc_padded)((int64_t)dv);
    const size_t dzp = (size_t)FN(asc_padded)((int64_t)dz), dap = (size_t)FN(asc_padded)((int64_t)da);
    size_t fmax = d;
    if (dz > fmax) fmax = dz;
    if (da > fmax) fmax = da;
    SCALAR **tiles[] = {&w->G1, &w->G2, &w->G3, &w->G4, &w->G5, &w->G6, &w->OB, &w->DM, &w->dSo, &w->TD, &w->TA,
                        &w->TAk, &w->T1, &w->T2, &w->T3, &w->Tda};
    for (size_t t = 0; t < sizeof(tiles) / sizeof(tiles[0]); t++) *tiles[t] = asc_take(ar, T * S);
    w->mT = asc_take(ar, T * sizeof(SINT));
    w->mJ = asc_take(ar, T * sizeof(SINT));
    w->Ab = asc_take(ar, N * BM * S);
    w->dSb = asc_take(ar, N * BM * S);
    w->Adb = asc_take(ar, (drop ? N : 1) * BM * S);
    w->Rb = asc_take(ar, N * BM * S);
    w->RCb = asc_take(ar, N * BM * S);
    w->R = asc_take(ar, fmax * BM * S);
    w->qT = asc_take(ar, d * BM * S); w->uT = asc_take(ar, d * BM * S); w->cT = asc_take(ar, dz * BM * S);
    w->zT = asc_take(ar, dz * BM * S); w->hT = asc_take(ar, da * BM * S); w->dyT = asc_take(ar, dv * BM * S);
    w->dcT = asc_take(ar, dz * BM * S);
    w->sQ = asc_take(ar, dp * BM * S); w->U = asc_take(ar, dp * BM * S); w->Cm2 = asc_take(ar, dzp * BM * S);
    w->dC = asc_take(ar, dzp * BM * S); w->Zm2 = asc_take(ar, dzp * BM * S); w->Hh = asc_take(ar, dap * BM * S);
    w->dY = asc_take(ar, dvp * BM * S);
    w->nzr = asc_take(ar, BM * S); w->ncc = asc_take(ar, BM * S);
    w->rv = asc_take(ar, (size_t)ASC_NRV * BM * S);
    w->rs = asc_take(ar, (size_t)ASC_NBS * BM * sizeof(double));
    w->dq = asc_take(ar, d * BM * sizeof(double)); w->du = asc_take(ar, d * BM * sizeof(double));
    w->pqr = asc_take(ar, 9 * BM * sizeof(double));
    w->Edc = asc_take(ar, dz * BM * sizeof(double)); w->dzr = asc_take(ar, dz * BM * sizeof(double));
    w->dhr = asc_take(ar, da * BM * sizeof(double));
    w->vec = asc_take(ar, fmax * sizeof(double));
    w->vec2 = asc_take(ar, fmax * sizeof(double));
    w->coef = asc_take(ar, BM * sizeof(FN(asc_coef)));
}

/* Column accumulators of one chunk, row-major [N][Fp] each. fresh: they hold nothing yet (not zeroed):
 * the chunk's only block writes every row in B2 (asc_cols_fill), and adds from then on. */
typedef struct FN(asc_cols) {
    SCALAR *k, *khat, *v, *z, *hhat;
    int fresh;
} FN(asc_cols);

static size_t FN(asc_cols_elems)(const asc_params *p) {
    return (size_t)p->N * (size_t)(2 * FN(asc_padded)(p->d) + FN(asc_padded)(p->dv) + FN(asc_padded)(p->dz) +
                                   FN(asc_padded)(p->da));
}

static void FN(asc_cols_at)(FN(asc_cols) *c, SCALAR *base, const asc_params *p) {
    const size_t N = (size_t)p->N;
    c->fresh = 0;
    c->k = base;
    c->khat = c->k + N * (size_t)FN(asc_padded)(p->d);
    c->v = c->khat + N * (size_t)FN(asc_padded)(p->d);
    c->z = c->v + N * (size_t)FN(asc_padded)(p->dv);
    c->hhat = c->z + N * (size_t)FN(asc_padded)(p->dz);
}

/* Whether chunk 0 can add into output x of feature size f straight: its rows need no padding and it starts
 * on a vector boundary (the column products load and store whole aligned vectors; torch's allocations are
 * 64-byte aligned, a caller's buffer need not be). */
static int FN(asc_cols_direct)(const void *x, int64_t f) {
    return FN(asc_padded)(f) == f && (uintptr_t)x % ASC_VB == 0;
}

/* Chunk c's accumulators of (b, h) bh: its buffer at cbase + c celems, except that chunk 0 adds dk, dv and
 * dz straight into the outputs where it can (asc_cols_direct: a chunk's [N][padded f] is then the
 * output's [N][f]): no copy of them afterwards, and no buffer to zero and read back. */
static void FN(asc_cols_of)(FN(asc_cols) *c, SCALAR *cbase, int chunk, const asc_params *p, const asc_bwd_args *ba,
                            int64_t bh) {
    const int64_t N = p->N;
    FN(asc_cols_at)(c, cbase + (size_t)chunk * FN(asc_cols_elems)(p), p);
    if (chunk > 0) return;
    if (FN(asc_cols_direct)(ba->dk, p->d)) c->k = (SCALAR *)ba->dk + bh * N * p->d;
    if (FN(asc_cols_direct)(ba->dv, p->dv)) c->v = (SCALAR *)ba->dv + bh * N * p->dv;
    if (FN(asc_cols_direct)(ba->dz, p->dz)) c->z = (SCALAR *)ba->dz + bh * N * p->dz;
}

/* Zeroes rows [j0, j1) of a chunk's accumulators. */
static void FN(asc_cols_zero)(FN(asc_cols) *c, const asc_params *p, int64_t j0, int64_t j1) {
    if (j1 <= j0) return;
    const size_t n = (size_t)(j1 - j0), S = sizeof(SCALAR);
    const int64_t dp = FN(asc_padded)(p->d), dvp = FN(asc_padded)(p->dv), dzp = FN(asc_padded)(p->dz);
    const int64_t dap = FN(asc_padded)(p->da);
    memset(c->k + j0 * dp, 0, S * n * (size_t)dp);
    memset(c->khat + j0 * dp, 0, S * n * (size_t)dp);
    memset(c->v + j0 * dvp, 0, S * n * (size_t)dvp);
    memset(c->z + j0 * dzp, 0, S * n * (size_t)dzp);
    memset(c->hhat + j0 * dap, 0, S * n * (size_t)dap);
}

/* Add a tile of row sums, lane by lane, into double accumulators (s: NH double vectors). */
#define RVEC(w, x, o) FN(vld)((w)->rv + (x) * BM + (o))

/* ---------------------------------------------------------------- B1 */

ASC_INLINE void FN(b1_epi)(FN(asc_bws) *w, const asc_params *p, const FN(asc_blk) *bk, const SCALAR *nzk,
                           const SCALAR *rkk, int64_t j0, int64_t nj, int flags, int other,
                           int aux, SCALAR delta, int drop, int want_dsx, const int masked) {
    const int diag = (flags & ASC_DIAG) != 0;
    const SCALAR nits = (SCALAR)(-1.0 / (p->tau_sep + ASC_EPS_TAU));
    const VS zero = FN(vset)(0);
    for (int m = 0; m < bk->mv; m++) {
        const int o = m * VL;
        FN(asc_xvec) xv;
        FN(asc_xvec_load)(&xv, w->coef, w->nzr, w->ncc, bk->t0, o);
        const VS lse = RVEC(w, RV_LSE, o), P = RVEC(w, RV_P, o), itemp = RVEC(w, RV_ITEMP, o);
        const VS gco = RVEC(w, RV_GCO, o), gse = RVEC(w, RV_GSE, o);
        /* the sums that fix the rows' B coefficients, exact for the SCALAR values of dS and w */
        VD sd[NH], sdr[NH], sdp[NH], sdc[NH], sdx[NH], sr[NH], sp[NH], sc[NH];
        for (int k = 0; k < NH; k++) sd[k] = sdr[k] = sdp[k] = sdc[k] = sdx[k] = sr[k] = sp[k] = sc[k] = (VD){0};
        for (int64_t j = 0; j < nj; j++) {
            const int64_t e = j * BM + o;
            VS rc, phi, r;
            VS x = FN(asc_xval)(&xv, w->G1, w->G2, w->G3, w->G4, w->G5, other ? w->OB : NULL, j, o, nzk[j],
                                rkk[j], (SINT)(j0 + j), diag, nits, delta, &rc, &phi, &r);
            VS A = FN(vexp)(x - lse);
            VS dA = FN(vld)(w->G6 + e);
            if (drop) dA *= FN(vld)(w->DM + e); /* dy . v_j m_ij / (1 - p) */
            if (aux) dA += gco * rc + gse * phi;
            /* dSx = dL/dx itemp; with a softcap, dS = dL/dS (before the cap) = dSx (1 - (x' / cap)^2), x' the
             * capped part of x (all of it, or without itemp beta_other when the cap is outside) */
            VS dSx = A * (dA - P) * itemp, dS = dSx;
            if (xv.capped) {
                const VS t = (xv.outside && other ? x - xv.itemp * FN(vld)(w->OB + e) : x) * xv.icap;
                dS = dSx * (FN(vset)(1) - t * t);
            }
            if (masked) { /* masked entries are selected away, never multiplied by zero */
                const VI mj = FN(vldi)(w->mJ + e), mt = FN(vldi)(w->mT + e);
                A = FN(vsel)(mj, A, zero);
                dSx = FN(vsel)(mj, dSx, zero);
                dS = FN(vsel)(mj, dS, zero);
                x = FN(vsel)(mj, x, zero);
                r = FN(vsel)(mt, r, zero);
                phi = FN(vsel)(mt, phi, zero);
                rc = FN(vsel)(mt, rc, zero);
            }
            FN(vst)(w->Ab + (j0 + j) * BM + o, A);
            if (drop) FN(vst)(w->Adb + (j0 + j) * BM + o, A * FN(vld)(w->DM + e));
            if (want_dsx) FN(vst)(w->dSo + e, dSx); /* dattn_bias past an outside cap */
            FN(vst)(w->dSb + (j0 + j) * BM + o, dS);
            FN(vst)(w->Rb + (j0 + j) * BM + o, r);
            FN(vst)(w->RCb + (j0 + j) * BM + o, rc);
            FN(vacc1)(sd, dS);
            FN(vaccp)(sdr, dS, r);
            FN(vaccp)(sdp, dS, phi);
            FN(vaccp)(sdc, dS, rc);
            FN(vaccp)(sdx, dSx, x); /* the temperature's: x = S'/T~ with S' the capped score */
            FN(vacc1)(sr, r);
            FN(vacc1)(sp, phi);
            FN(vacc1)(sc, rc);
        }
        for (int l = 0; l < VL; l++) {
            const int i = o + l, k = l / VDL, q = l % VDL;
            double *rs = w->rs;
            rs[BS_SD * BM + i] += sd[k][q];
            rs[BS_SDR * BM + i] += sdr[k][q];
            rs[BS_SDP * BM + i] += sdp[k][q];
            rs[BS_SDC * BM + i] += sdc[k][q];
            rs[BS_SDX * BM + i] += sdx[k][q];
            rs[BS_SR * BM + i] += sr[k][q];
            rs[BS_SP * BM + i] += sp[k][q];
            rs[BS_SC * BM + i] += sc[k][q];
        }
    }
}

/* R[f][i] (SCALAR, from k_row at the block's width) into acc[f][i] (double) for the rows i that k_row wrote
 * (the others' entries of R are stale, and their products 0) */
static void FN(asc_flush_rows)(double *acc, const SCALAR *R, int64_t F, const FN(asc_blk) *bk) {
    const int lanes = bk->mvk == ASC_MV_HALF ? VLH : bk->mv * VL;
    for (int64_t f = 0; f < F; f++)
        for (int i = 0; i < lanes; i++) acc[f * BM + i] += (double)R[f * BM + i];
}

static void FN(b1_sweep)(FN(asc_bws) *w, const asc_params *p, const asc_bwd_args *ba, const FN(asc_keys) *kp,
                         const FN(asc_blk) *bk) {
    const asc_fwd_args *a = &ba->in;
    const int64_t N = p->N, d = p->d, dv = p->dv, dz = p->dz, da = p->da, bh = bk->bh, ks = FN(asc_kslot)(kp, bh);
    const int64_t end = FN(asc_stat_end)(p, bk);
    const SCALAR *zt = kp->zt + ks * N * dz, *kb = (const SCALAR *)a->k + bh * N * d;
    const SCALAR *hb = kp->hn + ks * N * da, *vb = (const SCALAR *)a->v + bh * N * dv;
    const SCALAR delta = (SCALAR)ASC_HEAD(a, delta, bk->hd);
    const int other = a->attn_bias || a->alibi_slopes, aux = ba->grad_aux != NULL, drop = a->dropout_seed != NULL;
    /* dL/dattn_bias is dL/dS before the cap, or past it (dSx) when the cap is outside */
    const int want_dsx = ba->dattn_bias && p->softcap > 0 && p->softcap_outside;
    for (int64_t j0 = FN(asc_next_tile)(p, bk, 0); j0 < end; j0 = FN(asc_next_tile)(p, bk, j0 + BN)) {
        const int64_t nj = end - j0 < BN ? end - j0 : BN;
        const int fl = FN(asc_tile_masks)(p, bk, j0, nj, w->mT, w->mJ);
        if (!(fl & ASC_T_ANY)) continue;
        const int full = (fl & ASC_T_FULL) && (fl & ASC_J_FULL);
        FN(asc_tile_scores)(w->G1, w->G2, w->G3, w->G4, w->G5, w->qT, w->uT, w->cT, w->zT, w->hT, p, kb + j0 * d,
                            zt + j0 * dz, hb + j0 * da, nj, bk->mvk);
        FN(k_score)(w->G6, w->dyT, NULL, NULL, vb + j0 * dv, dv, dv, nj, bk->mvk);
        if (other) FN(asc_other_tile)(w->OB, p, a, bk, j0, nj);
        if (drop) FN(asc_dropout_tile)(w->DM, p, a, bk, j0, nj, (SCALAR)p->dropout_scale);
        const SCALAR *nzk = kp->nz + ks * N + j0, *rkk = kp->rk + ks * N + j0;
        if (full) FN(b1_epi)(w, p, bk, nzk, rkk, j0, nj, fl, other, aux, delta, drop, want_dsx, 0);
        else FN(b1_epi)(w, p, bk, nzk, rkk, j0, nj, fl, other, aux, delta, drop, want_dsx, 1);
        if (ba->dattn_bias) {
            SCALAR *db = (SCALAR *)ba->dattn_bias;
            for (int i = 0; i < bk->nrows; i++) {
                SCALAR *drow = db + (bh * p->Nq + bk->i0 + i) * N + j0;
                const int row = ASC_ROW_IN(bk->rows, i); /* (the rows past bk->mv vectors are not computed) */
                for (int64_t j = 0; j < nj; j++)
                    drow[j] = !row ? (SCALAR)0 : want_dsx ? w->dSo[j * BM + i] : w->dSb[(j0 + j) * BM + i];
            }
        }
        const int safe = !full && (fl & ASC_BADKEY);
        FN(k_row)(w->R, w->dSb + j0 * BM, kb + j0 * d, d, d, nj, safe, NULL, bk->mvk);
        FN(asc_flush_rows)(w->dq, w->R, d, bk);
    }
}

/* ---------------------------------------------------------------- Bc: the centroid gradient */

/* TD[j][i] = drc'_ij = -lambda_c gamma_c / tau_c Bc_ij + g_coh A_ij on T(i); row sums of it */
ASC_INLINE void FN(bc_epi)(FN(asc_bws) *w, int64_t j0, int64_t nj, int mv, const int masked) {
    const VS zero = FN(vset)(0);
    const double *pc = w->pqr + 6 * BM, *qc = w->pqr + 7 * BM, *rcc = w->pqr + 8 * BM;
    for (int m = 0; m < mv; m++) {
        const int o = m * VL;
        const VS crc = RVEC(w, RV_CRC, o), gco = RVEC(w, RV_GCO, o);
        VD s[NH];
        for (int k = 0; k < NH; k++) s[k] = (VD){0};
        for (int64_t j = 0; j < nj; j++) {
            const int64_t e = j * BM + o;
            const VS rc = FN(vld)(w->RCb + (j0 + j) * BM + o);
            const VS A = FN(vld)(w->Ab + (j0 + j) * BM + o), dS = FN(vld)(w->dSb + (j0 + j) * BM + o);
            VS Bc = FN(vaffine)(pc, qc, rcc, o, dS, rc);
            if (masked) Bc = FN(vsel)(FN(vldi)(w->mT + e), Bc, zero);
            const VS t = crc * Bc + gco * A;
            FN(vst)(w->TD + e, t);
            FN(vacc1)(s, t);
        }
        for (int l = 0; l < VL; l++) w->rs[BS_SRC * BM + o + l] += s[l / VDL][l % VDL];
    }
}

static void FN(bc_sweep)(FN(asc_bws) *w, const asc_params *p, const asc_bwd_args *ba, const FN(asc_keys) *kp,
                         const FN(asc_blk) *bk) {
    (void)ba;
    const int64_t N = p->N, dz = p->dz, end = FN(asc_stat_end)(p, bk);
    const SCALAR *zt = kp->zt + FN(asc_kslot)(kp, bk->bh) * N * dz;
    for (int64_t j0 = FN(asc_next_tile)(p, bk, 0); j0 < end; j0 = FN(asc_next_tile)(p, bk, j0 + BN)) {
        const int64_t nj = end - j0 < BN ? end - j0 : BN;
        const int fl = FN(asc_tile_masks)(p, bk, j0, nj, w->mT, w->mJ);
        if (!(fl & ASC_T_ANY)) continue;
        if (fl & ASC_T_FULL) FN(bc_epi)(w, j0, nj, bk->mv, 0);
        else FN(bc_epi)(w, j0, nj, bk->mv, 1);
        FN(k_row)(w->R, w->TD, zt + j0 * dz, dz, dz, nj, !(fl & ASC_T_FULL) && (fl & ASC_BADKEY), NULL, bk->mvk);
        FN(asc_flush_rows)(w->Edc, w->R, dz, bk);
    }
}

/* ---------------------------------------------------------------- B2 */

ASC_INLINE void FN(b2_epi)(FN(asc_bws) *w, const asc_params *p, const FN(asc_blk) *bk, const SCALAR *nzk,
                           const SCALAR *rkk, int64_t j0, int64_t nj, int flags, SCALAR delta,
                           const int masked) {
    const int diag = (flags & ASC_DIAG) != 0, paper = p->variant == ASC_VARIANT_PAPER;
    const SCALAR nits = (SCALAR)(-1.0 / (p->tau_sep + ASC_EPS_TAU)), nitc = (SCALAR)(-1.0 / (p->tau_coh + ASC_EPS_TAU));
    const VS zero = FN(vset)(0);
    const VI ones = (VI){0} - 1;
    for (int m = 0; m < bk->mv; m++) {
        const int o = m * VL;
        const VS nzi = FN(vld)(w->nzr + o);
        const VI tok = FN(asc_row_tokens)(bk->t0, o);
        const double *pq = w->pqr;
        const VS cA = RVEC(w, RV_CA, o), cphi = RVEC(w, RV_CPHI, o), drho = RVEC(w, RV_DRHO, o);
        const VS crc = RVEC(w, RV_CRC, o), cG = RVEC(w, RV_CG, o), dcc = RVEC(w, RV_DCC, o);
        const VS iW = RVEC(w, RV_IW, o), G = RVEC(w, RV_G, o), dG = RVEC(w, RV_DG, o);
        const VS gco = RVEC(w, RV_GCO, o), gse = RVEC(w, RV_GSE, o);
        VS sda = zero, sdD = zero;
        for (int64_t j = 0; j < nj; j++) {
            const int64_t e = j * BM + o;
            const SCALAR nzj = nzk[j], rkj = rkk[j];
            const VI mt = masked ? FN(vldi)(w->mT + e) : ones;
            const VS gz = FN(vld)(w->G1 + e);
            VS D = FN(vclamp0)((nzi + nzj) - (gz + gz));
            VI self = (VI){0};
            if (diag) {
                self = tok == (SINT)(j0 + j);
                D = FN(vsel)(self, zero, D);
            }
            const VS ws = FN(vexp)(D * nits), wc = FN(vexp)(D * nitc);
            const VS red = FN(vld)(w->G2 + e) - delta; /* the affinity: h normalized in the key preparation */
            const VS relu = FN(vclamp0)(red);
            const VS phi = ws * relu;
            const VS r = FN(vld)(w->Rb + (j0 + j) * BM + o), rc = FN(vld)(w->RCb + (j0 + j) * BM + o);
            const VS A = FN(vld)(w->Ab + (j0 + j) * BM + o), dS = FN(vld)(w->dSb + (j0 + j) * BM + o);
            VS Ba = FN(vaffine)(pq, pq + BM, pq + 2 * BM, o, dS, r);
            VS Bs = FN(vaffine)(pq + 3 * BM, pq + 4 * BM, pq + 5 * BM, o, dS, phi);
            VS Bc = FN(vaffine)(pq + 6 * BM, pq + 7 * BM, pq + 8 * BM, o, dS, rc);
            VS wcT = wc;
            if (masked) {
                Ba = FN(vsel)(mt, Ba, zero);
                Bs = FN(vsel)(mt, Bs, zero);
                Bc = FN(vsel)(mt, Bc, zero);
                wcT = FN(vsel)(mt, wc, zero);
            }
            const VS TA = cA * Ba;
            FN(vst)(w->TA + e, TA);
            FN(vst)(w->TAk + e, TA * rkj);
            /* separation: phi -> ws (and rho), a */
            const VS dphi = cphi * Bs + gse * A;
            VI dens = mt;
            if (paper && diag) dens &= ~self;
            VS dws = dphi * relu + FN(vsel)(dens, drho, zero);
            VS da = FN(vsel)(red > zero, dphi * ws, zero);
            /* cohesion: rc -> z_j, c; wc through c and the gate */
            const VS drc = crc * Bc + cG * wcT + gco * A;
            VS dwc = (FN(vld)(w->G6 + e) - dcc + dG * (rc - G)) * iW;
            VS dD = -(dws * ws * (-nits) + dwc * wc * (-nitc));
            if (masked) {
                da = FN(vsel)(mt, da, zero);
                dD = FN(vsel)(mt, dD, zero);
            }
            FN(vst)(w->T1 + e, drc);
            FN(vst)(w->T2 + e, wcT * iW);
            FN(vst)(w->T3 + e, dD);
            FN(vst)(w->Tda + e, da);
            sda += da;
            sdD += dD;
        }
        for (int l = 0; l < VL; l++) {
            w->rs[BS_DA * BM + o + l] += (double)sda[l];
            w->rs[BS_DD * BM + o + l] += (double)sdD[l];
        }
    }
}

static void FN(b2_sweep)(FN(asc_bws) *w, const asc_params *p, const asc_bwd_args *ba, const FN(asc_keys) *kp,
                         const FN(asc_blk) *bk, FN(asc_cols) *cols) {
    const asc_fwd_args *a = &ba->in;
    const int64_t N = p->N, d = p->d, dv = p->dv, dz = p->dz, da = p->da, bh = bk->bh;
    const int64_t dp = FN(asc_padded)(d), dvp = FN(asc_padded)(dv), dzp = FN(asc_padded)(dz), dap = FN(asc_padded)(da);
    const int64_t end = FN(asc_stat_end)(p, bk), ks = FN(asc_kslot)(kp, bh);
    const SCALAR *zt = kp->zt + ks * N * dz, *kb = (const SCALAR *)a->k + bh * N * d;
    const SCALAR *hb = kp->hn + ks * N * da;
    const SCALAR delta = (SCALAR)ASC_HEAD(a, delta, bk->hd);
    const int init = cols->fresh; /* the tiles' products write their rows, the others are zeroed */
    int64_t done = 0;             /* (fresh accumulators: rows [0, done) written) */
    for (int64_t j0 = FN(asc_next_tile)(p, bk, 0); j0 < end; j0 = FN(asc_next_tile)(p, bk, j0 + BN)) {
        const int64_t nj = end - j0 < BN ? end - j0 : BN;
        const int fl = FN(asc_tile_masks)(p, bk, j0, nj, w->mT, w->mJ);
        if (!(fl & ASC_T_ANY)) continue;
        if (init) FN(asc_cols_zero)(cols, p, done, j0);
        done = j0 + nj;
        const int full = (fl & ASC_T_FULL) && (fl & ASC_J_FULL);
        FN(k_score)(w->G6, w->dcT, w->G1, w->zT, zt + j0 * dz, dz, dz, nj, bk->mvk);
        FN(k_score)(w->G2, w->hT, NULL, NULL, hb + j0 * da, da, da, nj, bk->mvk);
        const SCALAR *nzk = kp->nz + ks * N + j0, *rkk = kp->rk + ks * N + j0;
        if (fl & ASC_T_FULL) FN(b2_epi)(w, p, bk, nzk, rkk, j0, nj, fl, delta, 0);
        else FN(b2_epi)(w, p, bk, nzk, rkk, j0, nj, fl, delta, 1);
        const int safe_row = !full && (fl & ASC_BADKEY), safe_col = !full && bk->badrows;
        const int mi = 64 - __builtin_clzll(bk->rows); /* the rows past the block's last live one add 0 */
        /* column side: dk^_j, dz_j, dh^_j, dk_j, dv_j */
        {
            const SCALAR *T[3] = {w->TA}, *A[3] = {w->U};
            FN(k_col)(cols->khat + j0 * dp, dp, T, A, 1, dp, dp, nj, mi, safe_col, init);
        }
        {
            const SCALAR *T[3] = {w->T1, w->T2, w->T3}, *A[3] = {w->Cm2, w->dC, w->Zm2};
            FN(k_col)(cols->z + j0 * dzp, dzp, T, A, 3, dzp, dzp, nj, mi, safe_col, init);
            /* + 2 (sum_i drc_ij + dD_ij) zt_j */
            for (int64_t j = 0; j < nj; j++) {
                SCALAR s = 0;
                for (int i = 0; i < mi; i++) s += w->T1[j * BM + i] + w->T3[j * BM + i];
                if (s == 0) continue;
                SCALAR *dst = cols->z + (j0 + j) * dzp;
                const SCALAR *zj = zt + (j0 + j) * dz;
                for (int64_t f = 0; f < dz; f++) dst[f] += 2 * s * zj[f];
            }
        }
        {
            const SCALAR *T[3] = {w->Tda}, *A[3] = {w->Hh};
            FN(k_col)(cols->hhat + j0 * dap, dap, T, A, 1, dap, dap, nj, mi, safe_col, init);
        }
        {
            const SCALAR *T[3] = {w->dSb + j0 * BM}, *A[3] = {w->sQ};
            FN(k_col)(cols->k + j0 * dp, dp, T, A, 1, dp, dp, nj, mi, safe_col, init);
        }
        {
            const SCALAR *T[3] = {(a->dropout_seed ? w->Adb : w->Ab) + j0 * BM}, *A[3] = {w->dY}; /* A m / (1 - p) */
            FN(k_col)(cols->v + j0 * dvp, dvp, T, A, 1, dvp, dvp, nj, mi, safe_col, init);
        }
        /* row side: du_i, dz_i, dh^_i */
        FN(k_row)(w->R, w->TAk, kb + j0 * d, d, d, nj, safe_row, NULL, bk->mvk);
        FN(asc_flush_rows)(w->du, w->R, d, bk);
        FN(k_row)(w->R, w->T3, zt + j0 * dz, dz, dz, nj, safe_row, NULL, bk->mvk);
        FN(asc_flush_rows)(w->dzr, w->R, dz, bk);
        FN(k_row)(w->R, w->Tda, hb + j0 * da, da, da, nj, safe_row, NULL, bk->mvk);
        FN(asc_flush_rows)(w->dhr, w->R, da, bk);
    }
    if (init) FN(asc_cols_zero)(cols, p, done, N);
    cols->fresh = 0;
}

/* ---------------------------------------------------------------- one block */

static void FN(asc_bwd_block)(FN(asc_bws) *w, const asc_params *p, const asc_bwd_args *ba, const FN(asc_keys) *kp,
                              int64_t bh, int64_t blk, FN(asc_cols) *cols, double *dsc, double *dsr) {
    const asc_fwd_args *a = &ba->in;
    const int64_t N = p->N, d = p->d, dv = p->dv, dz = p->dz, da = p->da;
    const int64_t dp = FN(asc_padded)(d), dvp = FN(asc_padded)(dv), dzp = FN(asc_padded)(dz), dap = FN(asc_padded)(da);
    const int paper = p->variant == ASC_VARIANT_PAPER;
    const double tcoh = p->tau_coh + ASC_EPS_TAU;
    FN(asc_blk) bk;
    FN(asc_blk_init)(&bk, p, a, kp, bh, blk);
    const int64_t nr = bk.nrows, hd = bk.hd, row0 = bh * p->Nq + bk.i0, ks = FN(asc_kslot)(kp, bh);
    const SCALAR *zt = kp->zt + ks * N * dz, *z0 = kp->z0 + ks * dz;
    const SCALAR *kb = (const SCALAR *)a->k + bh * N * d, *hb = kp->hn + ks * N * da;
    const SCALAR *dy = (const SCALAR *)ba->grad_out + row0 * dv, *y = (const SCALAR *)a->out + row0 * dv;
    const SCALAR *gaux = ba->grad_aux ? (const SCALAR *)ba->grad_aux + row0 * 2 : NULL;
    const SCALAR *gu = ba->grad_u ? (const SCALAR *)ba->grad_u + row0 * d : NULL;
    const SCALAR *aux = a->aux ? (const SCALAR *)a->aux + row0 * 2 : NULL;
    const SCALAR *u = (const SCALAR *)a->u + row0 * d, *c = (const SCALAR *)a->c + row0 * dz;
    const SCALAR *st = (const SCALAR *)a->stats + row0 * ASC_NSTAT;
    SCALAR *dq = (SCALAR *)ba->dq + row0 * d;
    const SCALAR scale = (SCALAR)p->scale;

    /* ---- row state from the saved outputs ---- */
    /* A row takes part in the pairs only if an upstream gradient (dy, grad_aux) reaches them and
     * it has a visible key (LSE < +inf: an empty row's output and aux are the constant 0); any
     * other row contributes exactly zero there, and is skipped, never multiplied by zero: its
     * inputs and saved state may be non-finite (SPEC section 11). `upstream` adds grad_u, which
     * reaches only the row's heading. */
    uint64_t upstream = 0;
    for (int i = 0; i < nr; i++) {
        int any = 0;
        for (int64_t f = 0; f < dv; f++) any |= dy[i * dv + f] != 0;
        if (gaux) any |= gaux[2 * i] != 0 || gaux[2 * i + 1] != 0;
        any &= st[i * ASC_NSTAT + ASC_STAT_LSE] != (SCALAR)INFINITY;
        if (any) bk.rows |= (uint64_t)1 << i;
        else bk.rows &= ~((uint64_t)1 << i);
        if (gu)
            for (int64_t f = 0; f < d; f++) any |= gu[i * d + f] != 0;
        if (any) upstream |= (uint64_t)1 << i;
    }
    bk.mv = FN(asc_row_vectors)(bk.rows);
    bk.mvk = FN(asc_kernel_vectors)(bk.rows);
    const int live = bk.rows != 0; /* some row's upstream gradient reaches the pairs */
    for (int i = 0; i < nr; i++)
        for (int64_t f = 0; f < d; f++) dq[i * d + f] = 0;
    if (ba->dattn_bias)
        for (int i = 0; i < nr; i++) memset((SCALAR *)ba->dattn_bias + (row0 + i) * N, 0, sizeof(SCALAR) * (size_t)N);
    memset(w->rs, 0, sizeof(double) * ASC_NBS * BM);
    memset(w->du, 0, sizeof(double) * (size_t)d * BM);
    if (live) {
        int bad = 0;
        FN(asc_pack_t)(w->qT, (const SCALAR *)a->q + row0 * d, d, bk.rows, d, 1);
        FN(asc_pack_r)(w->sQ, dp, (const SCALAR *)a->q + row0 * d, d, bk.rows, d, scale);
        FN(asc_pack_t)(w->uT, u, d, bk.rows, d, 1);
        FN(asc_pack_r)(w->U, dp, u, d, bk.rows, d, 1);
        FN(asc_pack_t)(w->zT, zt + bk.t0 * dz, dz, bk.rows, dz, 1);
        FN(asc_pack_r)(w->Zm2, dzp, zt + bk.t0 * dz, dz, bk.rows, dz, -2);
        FN(asc_pack_t)(w->hT, hb + bk.t0 * da, da, bk.rows, da, 1);
        FN(asc_pack_t)(w->dyT, dy, dv, bk.rows, dv, 1);
        FN(asc_pack_r)(w->dY, dvp, dy, dv, bk.rows, dv, 1);
        for (int i = 0; i < BM; i++) {
            const int ok = ASC_ROW_IN(bk.rows, i);
            w->nzr[i] = ok ? kp->nz[ks * N + bk.t0 + i] : (SCALAR)0;
            for (int64_t f = 0; f < dap; f++)
                w->Hh[i * dap + f] = ok && f < da ? hb[(bk.t0 + i) * da + f] : (SCALAR)0;
            double cc2 = 0.0;
            for (int64_t f = 0; f < dzp; f++) {
                const SCALAR ct = ok && f < dz ? c[i * dz + f] - z0[f] : (SCALAR)0;
                if (f < dz) w->cT[f * BM + i] = ct;
                w->Cm2[i * dzp + f] = -2 * ct;
                cc2 += (double)ct * ct;
            }
            w->ncc[i] = (SCALAR)cc2;
            if (ok) {
                FN(asc_coef_from_stats)(w->coef + i, st + i * ASC_NSTAT, p, a, hd);
                double P = 0.0;
                for (int64_t f = 0; f < dv; f++) P += (double)dy[i * dv + f] * y[i * dv + f];
                const double gco = gaux ? (double)gaux[2 * i] : 0.0, gse = gaux ? (double)gaux[2 * i + 1] : 0.0;
                if (gaux && aux) P += gco * (double)aux[2 * i] + gse * (double)aux[2 * i + 1];
                const FN(asc_coef) *cf = w->coef + i;
                /* the sink's weight is exp(sink - LSE) (LSE includes it): dsink = -exp(sink - LSE) P, per row */
                if (a->sinks)
                    dsr[row0 + i] = -exp(ASC_ELEM(a, sinks, ASC_SINK_AT(p, bh / p->H, hd, bk.i0 + i)) - cf->lse) * P;
                w->rv[RV_LSE * BM + i] = (SCALAR)cf->lse;
                w->rv[RV_P * BM + i] = (SCALAR)P;
                w->rv[RV_ITEMP * BM + i] = (SCALAR)cf->itemp;
                w->rv[RV_GCO * BM + i] = (SCALAR)gco;
                w->rv[RV_GSE * BM + i] = (SCALAR)gse;
                bad |= !FN(asc_row_finite)((const SCALAR *)a->q + (row0 + i) * d, d) ||
                       !FN(asc_row_finite)(dy + i * dv, dv) || !FN(asc_row_finite)(u + i * d, d) ||
                       !FN(asc_row_finite)(c + i * dz, dz) || !isfinite(P);
            } else {
                memset(w->coef + i, 0, sizeof(FN(asc_coef)));
                for (int x = 0; x < ASC_NRV; x++) w->rv[x * BM + i] = 0;
                w->rv[RV_LSE * BM + i] = (SCALAR)INFINITY;
            }
        }
        bk.badrows = bad;
        memset(w->dq, 0, sizeof(double) * (size_t)d * BM);
        memset(w->Edc, 0, sizeof(double) * (size_t)dz * BM);
        memset(w->pqr, 0, sizeof(double) * 9 * BM);
        memset(w->dzr, 0, sizeof(double) * (size_t)dz * BM);
        memset(w->dhr, 0, sizeof(double) * (size_t)da * BM);
        FN(b1_sweep)(w, p, ba, kp, &bk);
    }

    /* ---- after B1: every per-row constant of B2 (docs/tiling.md section 4) ---- */
    const double omega[3] = {ASC_HEAD(a, omega_align, hd), ASC_HEAD(a, omega_sep, hd), ASC_HEAD(a, omega_coh, hd)};
    const double lam[3] = {ASC_HEAD(a, lambda_align, hd), ASC_HEAD(a, lambda_sep, hd), ASC_HEAD(a, lambda_coh, hd)};
    for (int i = 0; i < nr && live; i++) {
        if (!ASC_ROW_IN(bk.rows, i)) continue; /* its row constants stay 0 */
        const FN(asc_coef) *cf = w->coef + i;
        const double *rs = w->rs;
        const double n = (double)cf->n, n1 = paper ? n : n - 1.0;
        const double Sd = rs[BS_SD * BM + i];
        const double Sdw[3] = {rs[BS_SDR * BM + i], rs[BS_SDP * BM + i], rs[BS_SDC * BM + i]};
        const double Sw[3] = {rs[BS_SR * BM + i], rs[BS_SP * BM + i], rs[BS_SC * BM + i]};
        double pq[3][3] = {{0}}, R[3] = {0, 0, 0};
        dsc[6] += -rs[BS_SDX * BM + i]; /* d temp~ = -sum_J dS_j x_j */
        for (int x = 0; x < 3 && cf->norm; x++) {
            const double th = cf->theta[x], mu = cf->mean[x], sd = cf->sd[x], den = sd + ASC_EPS_STD;
            const double Gam = omega[x] * (th * Sdw[x] - mu * Sd); /* sum_T g_j (b_j - mu) */
            dsc[3 + x] += (th * Sdw[x] - mu * Sd) / den;          /* d omega = sum_J dS_j b~_j */
            const double gbar = omega[x] * Sd / n;
            const double dsig = -Gam / (den * den);
            const double csig = sd > 0.0 ? dsig / (n1 * sd) : 0.0;
            const double dev = th * Sw[x] - n * mu; /* sum_T (b_j - mu): 0 but for rounding */
            pq[x][0] = omega[x] / den;
            pq[x][1] = -gbar / den - csig * (mu + dev / n);
            pq[x][2] = csig * th;
            /* per-row factor: sum_T B_j w_j = eps/(sd+eps)^2 omega sum_J dS_j (w_j - mean_T w) */
            R[x] = ASC_EPS_STD / (den * den) * omega[x] * (Sdw[x] - Sw[x] / n * Sd);
        }
        /* alignment factor and gate */
        dsc[0] += cf->gate_a * R[0];
        /* separation: eta = clamp(rho / kappa~) */
        dsc[1] += -cf->eta * R[1];
        const double deta = -lam[1] * R[1], ratio = cf->rho / cf->kap;
        const int in_clamp = ratio >= 0.0 && ratio <= 1.0;
        const double drho = in_clamp ? deta / cf->kap : 0.0;
        if (in_clamp) dsc[8] += -deta * cf->rho / (cf->kap * cf->kap);
        /* cohesion factor, gate and centroid */
        dsc[2] += -(cf->gate_c / tcoh) * R[2];
        const double dG = paper ? -(lam[2] / tcoh) * R[2] * cf->gate_c * (1.0 - cf->gate_c) * p->alpha_coh : 0.0;
        const double Wd = cf->wsum + ASC_EPS_TAU, cG = dG / Wd, crc = -lam[2] * cf->gate_c / tcoh;
        for (int x = 0; x < 3; x++)
            for (int e = 0; e < 3; e++) w->pqr[(3 * x + e) * BM + i] = pq[x][e];
        w->rv[RV_CA * BM + i] = (SCALAR)(lam[0] * cf->gate_a);
        w->rv[RV_CPHI * BM + i] = (SCALAR)(-lam[1] * cf->eta);
        w->rv[RV_DRHO * BM + i] = (SCALAR)drho;
        w->rv[RV_CRC * BM + i] = (SCALAR)crc;
        w->rv[RV_CG * BM + i] = (SCALAR)cG;
        w->rv[RV_IW * BM + i] = (SCALAR)(1.0 / Wd);
        w->rv[RV_G * BM + i] = (SCALAR)cf->G;
        w->rv[RV_DG * BM + i] = (SCALAR)dG;
        for (int64_t f = 0; f < d; f++) dq[i * d + f] = (SCALAR)(p->scale * w->dq[f * BM + i]);
        w->rs[BS_RA * BM + i] = R[0]; /* for the alignment gate, after B2 */
    }

    if (live) {
        /* ---- Bc: dc = -2 sum_T drc_j (z_j - c) with drc = crc Bc + cG wc + g_coh A; the wc part
         * is cG eps c exactly (sum_T wc_j (z_j - c) = eps c, the centroid's definition) ---- */
        FN(bc_sweep)(w, p, ba, kp, &bk);
        for (int i = 0; i < BM; i++) {
            if (!ASC_ROW_IN(bk.rows, i)) {
                for (int64_t f = 0; f < dz; f++) w->dcT[f * BM + i] = 0;
                continue;
            }
            const double cG = (double)w->rv[RV_CG * BM + i], sdrc = w->rs[BS_SRC * BM + i];
            double dcc = 0.0;
            for (int64_t f = 0; f < dz; f++) {
                const double ct = (double)w->cT[f * BM + i];
                const double dcf = -2.0 * (w->Edc[f * BM + i] - ct * sdrc + cG * ASC_EPS_TAU * (double)c[i * dz + f]);
                w->dcT[f * BM + i] = (SCALAR)dcf;
                dcc += (double)w->dcT[f * BM + i] * ct; /* the rounded dc, as the tile product uses it */
            }
            w->rv[RV_DCC * BM + i] = (SCALAR)dcc;
        }
        for (int i = 0; i < BM; i++)
            for (int64_t f = 0; f < dzp; f++) w->dC[i * dzp + f] = f < dz ? w->dcT[f * BM + i] : (SCALAR)0;
        FN(b2_sweep)(w, p, ba, kp, &bk, cols);
        for (int i = 0; i < nr; i++) dsc[7] += -w->rs[BS_DA * BM + i];
    }
    if (cols->fresh) { /* no B2 */
        FN(asc_cols_zero)(cols, p, 0, N);
        cols->fresh = 0;
    }

    /* ---- after B2: the row-side gradients into the query's own token / its neighbours ---- */
    for (int i = 0; i < nr; i++) {
        if (!ASC_ROW_IN(upstream, i)) continue; /* no gradient reaches the row */
        const int64_t t = bk.t0 + i;
        double *duv = w->vec;
        for (int64_t f = 0; f < d; f++) duv[f] = w->du[f * BM + i] + (gu ? (double)gu[i * d + f] : 0.0);
        if (!paper) {
            for (int64_t f = 0; f < d; f++) cols->khat[t * dp + f] += (SCALAR)duv[f];
        } else {
            const int64_t *nb = a->nbr + (row0 + i) * p->n_nbr;
            int64_t cnt = 0;
            while (cnt < p->n_nbr && nb[cnt] >= 0) cnt++;
            if (cnt > 0) {
                const SCALAR *st_i = st + i * ASC_NSTAT;
                const double un = (double)st_i[ASC_STAT_UNORM], ga = (double)st_i[ASC_STAT_GATE_A];
                /* m = sum of the neighbours' k^ (the gate's mean is m / cnt): u un, or summed again where
                 * the heading is 0 (ASC_EPS_HEADING; no gradient through u there) */
                const int heading = un > ASC_EPS_HEADING * (double)cnt;
                double *m = w->vec2;
                for (int64_t f = 0; f < d; f++) m[f] = heading ? (double)u[i * d + f] * un : 0.0;
                for (int64_t q = 0; q < cnt && !heading; q++)
                    for (int64_t f = 0; f < d; f++)
                        m[f] += (double)(SCALAR)(kb[nb[q] * d + f] * kp->rk[ks * N + nb[q]]);
                double udu = 0.0;
                for (int64_t f = 0; f < d; f++) udu += (double)u[i * d + f] * duv[f];
                for (int64_t f = 0; f < d; f++) duv[f] = heading ? (duv[f] - (double)u[i * d + f] * udu) / un : 0.0;
                const double Ra = w->rs[BS_RA * BM + i]; /* 0 unless live */
                const double dV = lam[0] * Ra * ga * (1.0 - ga) * p->alpha_align;
                for (int64_t q = 0; q < cnt; q++) {
                    const int64_t l = nb[q];
                    SCALAR *dst = cols->khat + l * dp;
                    for (int64_t f = 0; f < d; f++) {
                        const double khat = (double)(SCALAR)(kb[l * d + f] * kp->rk[ks * N + l]);
                        dst[f] += (SCALAR)(duv[f] + 2.0 * dV / (double)cnt * (khat - m[f] / (double)cnt));
                    }
                }
            }
        }
        if (ASC_ROW_IN(bk.rows, i)) {
            const double sdD = w->rs[BS_DD * BM + i];
            for (int64_t f = 0; f < dz; f++)
                cols->z[t * dzp + f] += (SCALAR)(2.0 * ((double)zt[t * dz + f] * sdD - w->dzr[f * BM + i]));
            for (int64_t f = 0; f < da; f++) cols->hhat[t * dap + f] += (SCALAR)w->dhr[f * BM + i];
        }
    }
}

/* ---------------------------------------------------------------- reduction per (b, h) */

/* dx += backward of x^ = x / max(||x||, 1e-12) for one token, r = the key preparation's SCALAR
 * 1 / max(||x||, 1e-12): zero gradient at x = 0, and nothing at all without an incoming gradient (x
 * may be non-finite then, SPEC section 11). This runs for every key of every (b, h): where r is a
 * normal number below 1e12 (the norm above the clamp), dx += r (dxhat - x^ (x^ . dxhat)) with x^ = x r
 * as the forward rounds it (no norm, no division, no overflow: |x^| <= 1); else (clamp, zero, huge or
 * non-finite rows) the norm and the projection in double (no overflow for rows up to ~1e150). Rows of
 * whole vectors take the first case in one pass for the test and the product, and a tree for its sum. */
static void FN(asc_normalize_backward)(SCALAR *dx, const SCALAR *x, SCALAR r, const SCALAR *dxhat, int64_t f) {
    const int scaled = r > (SCALAR)1e-30 && r < (SCALAR)(1.0 / ASC_EPS_NORM);
    if (scaled && f % VL == 0) {
        VI in = (VI){0};
        VS dot = (VS){0};
        for (int64_t c = 0; c < f; c += VL) {
            const VS g = FN(vldu)(dxhat + c);
            in |= g != 0;
            dot += (FN(vldu)(x + c) * r) * g;
        }
        if (!FN(vany)(in)) return;
        SCALAR t[VL];
        for (int l = 0; l < VL; l++) t[l] = dot[l];
        for (int w = VL / 2; w >= 1; w /= 2)
            for (int l = 0; l < w; l++) t[l] += t[l + w];
        const SCALAR dh = t[0];
        for (int64_t c = 0; c < f; c += VL)
            FN(vstu)(dx + c, FN(vldu)(dx + c) + r * (FN(vldu)(dxhat + c) - (FN(vldu)(x + c) * r) * dh));
        return;
    }
    int any = 0;
    #pragma omp simd reduction(|:any)
    for (int64_t c = 0; c < f; c++) any |= dxhat[c] != 0;
    if (!any) return;
    if (scaled) {
        SCALAR dh = 0;
        #pragma omp simd reduction(+:dh)
        for (int64_t c = 0; c < f; c++) dh += (x[c] * r) * dxhat[c];
        #pragma omp simd
        for (int64_t c = 0; c < f; c++) dx[c] += r * (dxhat[c] - (x[c] * r) * dh);
        return;
    }
    double ss = 0.0, dot = 0.0;
    #pragma omp simd reduction(+:ss, dot)
    for (int64_t c = 0; c < f; c++) {
        ss += (double)x[c] * x[c];
        dot += (double)x[c] * dxhat[c];
    }
    const double nrm = sqrt(ss);
    if (nrm == 0.0) return;
    const int clamped = nrm < ASC_EPS_NORM; /* clamp_min passes the gradient at equality: dxhat / eps */
    const SCALAR inv = (SCALAR)(1.0 / (clamped ? ASC_EPS_NORM : nrm)), proj = clamped ? (SCALAR)0 : (SCALAR)(dot / ss);
    #pragma omp simd
    for (int64_t c = 0; c < f; c++) dx[c] += inv * (dxhat[c] - x[c] * proj);
}

/* The nchunk chunks' accumulators of (b, h) bh (asc_cols_of), once per (b, h). */
static void FN(asc_cols_all)(FN(asc_cols) *cc, SCALAR *cbase, int nchunk, const asc_params *p,
                             const asc_bwd_args *ba, int64_t bh) {
    for (int c = 0; c < nchunk; c++) FN(asc_cols_of)(cc + c, cbase, c, p, ba, bh);
}

/* Key j of (b, h) bh: dk, dv, dz, dh from the nchunk chunk accumulators cc (asc_cols_all: chunk 0's dk, dv, dz
 * may be in the outputs already), summed in chunk order, and the normalization backward of k^ and h^.
 * tmp: max(d, da) SCALARs. */
static void FN(asc_reduce_key)(const asc_params *p, const asc_bwd_args *ba, const FN(asc_keys) *kp,
                               const FN(asc_cols) *cc, int nchunk, SCALAR *tmp, int64_t bh, int64_t j) {
    const int64_t N = p->N, d = p->d, dv = p->dv, dz = p->dz, da = p->da;
    const int64_t dp = FN(asc_padded)(d), dvp = FN(asc_padded)(dv), dzp = FN(asc_padded)(dz), dap = FN(asc_padded)(da);
    const int64_t row = bh * N + j;
    SCALAR *dk = (SCALAR *)ba->dk + row * d, *dvo = (SCALAR *)ba->dv + row * dv;
    SCALAR *dzo = (SCALAR *)ba->dz + row * dz, *dh = (SCALAR *)ba->dh + row * da;
    const SCALAR *kj = (const SCALAR *)ba->in.k + row * d, *hj = (const SCALAR *)ba->in.h + row * da;
    const int k_in = cc[0].k + j * dp == dk, v_in = cc[0].v + j * dvp == dvo, z_in = cc[0].z + j * dzp == dzo;
    const SCALAR *gk = cc[0].khat + j * dp, *gh = cc[0].hhat + j * dap; /* one chunk: its own rows */
    if (!k_in) for (int64_t f = 0; f < d; f++) dk[f] = 0;
    if (!v_in) for (int64_t f = 0; f < dv; f++) dvo[f] = 0;
    if (!z_in) for (int64_t f = 0; f < dz; f++) dzo[f] = 0;
    for (int c = 0; c < nchunk; c++) {
        for (int64_t f = 0; f < d && !(c == 0 && k_in); f++) dk[f] += cc[c].k[j * dp + f];
        for (int64_t f = 0; f < dv && !(c == 0 && v_in); f++) dvo[f] += cc[c].v[j * dvp + f];
        for (int64_t f = 0; f < dz && !(c == 0 && z_in); f++) dzo[f] += cc[c].z[j * dzp + f];
    }
    if (nchunk > 1) {
        for (int64_t f = 0; f < d; f++) tmp[f] = gk[f];
        for (int c = 1; c < nchunk; c++)
            for (int64_t f = 0; f < d; f++) tmp[f] += cc[c].khat[j * dp + f];
        gk = tmp;
    }
    const int64_t kr = FN(asc_kslot)(kp, bh) * N + j; /* the key's entry of the prepared keys */
    FN(asc_normalize_backward)(dk, kj, kp->rk[kr], gk, d);
    for (int64_t f = 0; f < da; f++) dh[f] = 0;
    if (nchunk > 1) {
        for (int64_t f = 0; f < da; f++) tmp[f] = gh[f];
        for (int c = 1; c < nchunk; c++)
            for (int64_t f = 0; f < da; f++) tmp[f] += cc[c].hhat[j * dap + f];
        gh = tmp;
    }
    FN(asc_normalize_backward)(dh, hj, kp->rh[kr], gh, da);
}

/* Chunk c of (b, h) bh (of nchunk): its accumulators at cbase + c celems zeroed (with one block: written by
 * it, asc_cols.fresh), then the blocks c, c + nchunk, ... in block order; the scalar gradients' partials of
 * the chunk into dsc [H][ASC_NACC], the sinks' per row into dsr [B H Nq]. */
static void FN(asc_bwd_chunk)(FN(asc_bws) *w, const asc_params *p, const asc_bwd_args *ba, const FN(asc_keys) *kp,
                              int64_t bh, int c, int nchunk, SCALAR *cbase, double *dsc, double *dsr) {
    const int64_t nblk = (p->Nq + BM - 1) / BM;
    FN(asc_cols) cols;
    FN(asc_cols_of)(&cols, cbase, c, p, ba, bh);
    cols.fresh = c + nchunk >= nblk;
    if (!cols.fresh) FN(asc_cols_zero)(&cols, p, 0, p->N);
    for (int64_t blk = c; blk < nblk; blk += nchunk)
        FN(asc_bwd_block)(w, p, ba, kp, bh, blk, &cols, dsc + (bh % p->H) * ASC_NACC, dsr);
}

/* ---------------------------------------------------------------- entry point */

int FN(ascender_bwd)(const asc_params *p, const asc_bwd_args *ba_in) {
    const int64_t N = p->N, BH = p->B * p->H, H = p->H, nblk = (p->Nq + BM - 1) / BM;
    const int64_t nsink = ba_in->in.sinks ? ASC_SINK_COUNT(p) : 0, nrow = BH * p->Nq;
    int failed = 0;
    SCALAR *dsc_out = (SCALAR *)ba_in->dscalars, *dsink_out = (SCALAR *)ba_in->dsinks;
    for (int64_t t = 0; t < ASC_NSCALAR * H; t++) dsc_out[t] = 0;
    for (int64_t t = 0; t < nsink; t++) dsink_out[t] = 0;
    if (N == 0 || BH == 0) return 0;
    if (p->Nq == 0) {
        for (int64_t e = 0; e < BH * N * p->d; e++) ((SCALAR *)ba_in->dk)[e] = 0;
        for (int64_t e = 0; e < BH * N * p->dv; e++) ((SCALAR *)ba_in->dv)[e] = 0;
        for (int64_t e = 0; e < BH * N * p->dz; e++) ((SCALAR *)ba_in->dz)[e] = 0;
        for (int64_t e = 0; e < BH * N * p->da; e++) ((SCALAR *)ba_in->dh)[e] = 0;
        return 0;
    }

    /* the forward's saved outputs; without them (a caller that passes only the inputs), run
     * the forward into scratch first */
    asc_bwd_args ba = *ba_in;
    void *scratch[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    const asc_fwd_args *in = &ba_in->in;
    const int saved = in->out && in->stats && in->u && in->c && (in->nbr || p->n_nbr == 0) &&
                      (in->aux || !ba_in->grad_aux);
    if (!saved) {
        const size_t rows = (size_t)(BH * p->Nq), S = sizeof(SCALAR);
        scratch[0] = malloc(S * rows * (size_t)(p->dv ? p->dv : 1));
        scratch[1] = malloc(S * rows * ASC_NSTAT);
        scratch[2] = malloc(S * rows * (size_t)(p->d ? p->d : 1));
        scratch[3] = malloc(S * rows * (size_t)(p->dz ? p->dz : 1));
        scratch[4] = malloc(sizeof(int64_t) * rows * (size_t)(p->n_nbr ? p->n_nbr : 1));
        scratch[5] = malloc(S * rows * 2);
        int ok = 1;
        for (int t = 0; t < 6; t++) ok &= scratch[t] != NULL;
        asc_fwd_args f = ba.in;
        f.out = scratch[0]; f.stats = scratch[1]; f.u = scratch[2]; f.c = scratch[3];
        f.nbr = scratch[4]; f.aux = scratch[5];
        f.map_sbase = f.map_align = f.map_sep = f.map_coh = f.map_attn = NULL;
#if ASC_F32
        const int rc = ok ? ascender_fwd_f32(p, &f) : 1;
#else
        const int rc = ok ? ascender_fwd_f64(p, &f) : 1;
#endif
        if (rc) {
            for (int t = 0; t < 6; t++) free(scratch[t]);
            return 1;
        }
        ba.in = f;
    }

    FN(asc_keys) kp;
    FN(asc_bws) layout;
    asc_arena measure = {NULL, 0};
    FN(asc_bws_layout)(&layout, &measure, p, ba.in.dropout_seed != NULL);
    const size_t ws_bytes = measure.off;
    const size_t celems = FN(asc_cols_elems)(p);
    int64_t fmax = p->d > p->da ? p->d : p->da;
    /* Column accumulators: C chunks per (b, h), block I in chunk I mod C, summed in chunk order. With
     * fewer blocks than ASC_BWD_CHUNKS (short queries), C = nblk and a (b, h) is one thread's work,
     * in its own chunk buffers: the team shares out the (b, h), not its one or two chunks, and no
     * empty chunk is zeroed or summed; the thread prepares that (b, h)'s keys right before, into its own
     * arrays for one (b, h) (asc_keys.bh0: O(N) per thread, not per (b, h), still in cache for B1). Else the team shares each (b, h)'s chunks. The sums are the
     * same either way, so the result does not depend on the thread count. The scalar gradients'
     * partials: dsc [B][C][H][ASC_NACC], summed in that order; the sinks': dsr, one per row (docs/backward.md),
     * summed into the sinks' layout in row order (nsink more doubles). */
    const int C = nblk < ASC_BWD_CHUNKS ? (int)nblk : ASC_BWD_CHUNKS, own = C < ASC_BWD_CHUNKS;
    SCALAR *cbase = own ? NULL : asc_arena_alloc(sizeof(SCALAR) * celems * (size_t)C); /* 64-byte aligned rows */
    double *dsc = calloc((size_t)(p->B * C * H) * ASC_NACC, sizeof(double));
    double *dsr = nsink ? calloc((size_t)(nrow + nsink), sizeof(double)) : NULL;
    if ((!own && !cbase) || !dsc || (nsink && !dsr) || FN(asc_keys_alloc)(&kp, p, &ba.in, !own)) {
        free(cbase);
        free(dsc);
        free(dsr);
        for (int t = 0; t < 6; t++) free(scratch[t]);
        return 1;
    }

    #pragma omp parallel
    {
        FN(asc_bws) w;
        asc_arena ar = {asc_arena_alloc(ws_bytes), 0};
        SCALAR *tmp = malloc(sizeof(SCALAR) * (size_t)(fmax + 1));
        FN(asc_cols) cc[ASC_BWD_CHUNKS];
        SCALAR *mine = own ? asc_arena_alloc(sizeof(SCALAR) * celems * (size_t)C) : NULL;
        FN(asc_keys) kt = kp; /* own: the per-batch arrays shared, the geometry of one (b, h) at a time */
        const int kt_failed = own && FN(asc_keys_geometry)(&kt, p, 1);
        if (ar.base) {
            memset(ar.base, 0, ws_bytes);
            FN(asc_bws_layout)(&w, &ar, p, ba.in.dropout_seed != NULL);
        }
        const int stop = asc_team_failed(&failed, ar.base == NULL || tmp == NULL || (own && (mine == NULL || kt_failed)));
        if (!stop) {
            FN(asc_keys_fill)(&kp, p, &ba.in);
            if (own) {
                #pragma omp for schedule(dynamic, 1)
                for (int64_t bh = 0; bh < BH; bh++) {
                    kt.bh0 = bh;
                    FN(asc_keys_prep)(&kt, p, &ba.in, bh);
                    for (int c = 0; c < C; c++)
                        FN(asc_bwd_chunk)(&w, p, &ba, &kt, bh, c, C, mine, dsc + (size_t)((bh / H) * C + c) * H * ASC_NACC, dsr);
                    FN(asc_cols_all)(cc, mine, C, p, &ba, bh);
                    for (int64_t j = 0; j < N; j++) FN(asc_reduce_key)(p, &ba, &kt, cc, C, tmp, bh, j);
                }
            } else {
                for (int64_t bh = 0; bh < BH; bh++) {
                    #pragma omp for schedule(dynamic, 1)
                    for (int c = 0; c < C; c++)
                        FN(asc_bwd_chunk)(&w, p, &ba, &kp, bh, c, C, cbase, dsc + (size_t)((bh / H) * C + c) * H * ASC_NACC, dsr);
                    FN(asc_cols_all)(cc, cbase, C, p, &ba, bh);
                    #pragma omp for schedule(static)
                    for (int64_t j = 0; j < N; j++) FN(asc_reduce_key)(p, &ba, &kp, cc, C, tmp, bh, j);
                }
            }
        }
        if (own) FN(asc_keys_geometry_free)(&kt);
        free(mine);
        free(tmp);
        free(ar.base);
    }
    for (int64_t hd = 0; hd < H; hd++)
        for (int s = 0; s < ASC_NACC; s++) {
            double total = 0.0;
            for (int64_t bc = 0; bc < p->B * C; bc++) total += dsc[((size_t)bc * H + hd) * ASC_NACC + s];
            dsc_out[s * H + hd] = (SCALAR)total;
        }
    if (nsink) {
        double *sum = dsr + nrow;
        for (int64_t r = 0; r < nrow; r++) {
            const int64_t bh = r / p->Nq;
            sum[ASC_SINK_AT(p, bh / H, bh % H, r % p->Nq)] += dsr[r];
        }
        for (int64_t t = 0; t < nsink; t++) dsink_out[t] = (SCALAR)sum[t];
    }
    FN(asc_keys_free)(&kp);
    free(cbase);
    free(dsc);
    free(dsr);
    for (int t = 0; t < 6; t++) free(scratch[t]);
    return failed;
}
