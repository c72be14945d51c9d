/*
 * ascender_fwd_impl.h -- generic body of the tiled CPU forward (docs/tiling.md section 3),
 * compiled per element type and ISA through instantiate_isa.h. No include guard on purpose.
 *
 * Per query block of BM rows, three sweeps over the key tiles:
 *   F1 geometry  D, a, ws, wc -> rho, sum wc, centroid numerator (product Wc Zt), moments of
 *                phi, the top-k of a (paper); then c_i, G_i, the gates, u_i
 *   F2 moments   r = k^_j.u_i and rc = ||z_j - c_i||^2 -> their moments; the stats
 *   F3 softmax   x_ij, online max and sum, O += E V (product), aux sums; y, LSE
 * and, for the inspection maps only, a fourth sweep over every key writing the maps.
 */

#include "ascender_tile_impl.h"
#include "ascender_plan_impl.h"

/* Per-thread state of the forward: tiles, the block's packed row operands and row sums. */
typedef struct FN(asc_fws) {
    SCALAR *G1, *G2, *G3, *G4, *G5; /* score tiles [BN][BM] */
    SCALAR *E, *X, *OB, *DM;        /* wc or exp(x - m); x; beta_other; the dropout mask (asc_dropout_tile) */
    SCALAR *PHb, *Rb, *RCb;         /* [N][BM]: phi (F1), r and rc (F2) of the block, read by F3 */
    SINT *mT, *mJ;                  /* masks [BN][BM] */
    SCALAR *R;                      /* row-product tile [max(dz, dv)][BM] */
    SCALAR *zT, *hT, *qT, *uT, *cT; /* packed row operands [F][BM] */
    SCALAR *nzr, *ncc;              /* [BM]: ||zt_t||^2, ||c~_i||^2 */
    SCALAR *K0, *K1, *K2, *thr, *mx;/* [BM]: moment shifts (phi, r, rc), top-k thresholds, running max */
    SCALAR *S0, *S1, *S2;           /* [BM]: the self entry of phi, r, rc (added with the final shift) */
    SINT *have, *selfin;            /* [BM]: the row's shifts are set; the self entry was seen */
    double *P, *O;                  /* [dz][BM], [dv][BM] */
    double *rs;                     /* row sums [ASC_FRS][BM] */
    int64_t *cnt;                   /* [2][BM]: n_stat, n_soft */
    int64_t *nbr, *ncount;          /* [BM][n_nbr], [BM] */
    double *nbv;                    /* [BM][n_nbr] */
    double *lse;                    /* [BM] */
    double *ubuf;                   /* [d] */
    FN(asc_coef) *coef;             /* [BM] */
} FN(asc_fws);

/* row sums kept in double */
#ifndef ASC_FWD_ONCE
#define ASC_FWD_ONCE
enum { FRS_RHO, FRS_W, FRS_QZ, FRS_P1, FRS_P2, FRS_R1, FRS_R2, FRS_C1, FRS_C2, FRS_L, FRS_AC, FRS_AS, ASC_FRS };
#endif

static void FN(asc_fws_layout)(FN(asc_fws) *w, asc_arena *ar, const asc_params *p) {
    const size_t T = (size_t)BN * BM, S = sizeof(SCALAR);
    const size_t dz = (size_t)(p->dz ? p->dz : 1), dv = (size_t)(p->dv ? p->dv : 1);
    const size_t d = (size_t)(p->d ? p->d : 1), da = (size_t)(p->da ? p->da : 1);
    const size_t fmax = dz > dv ? dz : dv, nn = (size_t)(p->n_nbr ? p->n_nbr : 1);
    w->G1 = asc_take(ar, T * S); w->G2 = asc_take(ar, T * S); w->G3 = asc_take(ar, T * S);
    w->G4 = asc_take(ar, T * S); w->G5 = asc_take(ar, T * S);
    w->E = asc_take(ar, T * S); w->X = asc_take(ar, T * S); w->OB = asc_take(ar, T * S); w->DM = asc_take(ar, T * S);
    w->PHb = asc_take(ar, (size_t)p->N * BM * S);
    w->Rb = asc_take(ar, (size_t)p->N * BM * S);
    w->RCb = asc_take(ar, (size_t)p->N * BM * S);
    w->mT = asc_take(ar, T * sizeof(SINT)); w->mJ = asc_take(ar, T * sizeof(SINT));
    w->R = asc_take(ar, fmax * BM * S);
    w->zT = asc_take(ar, dz * BM * S); w->hT = asc_take(ar, da * BM * S); w->qT = asc_take(ar, d * BM * S);
    w->uT = asc_take(ar, d * BM * S); w->cT = asc_take(ar, dz * BM * S);
    w->nzr = asc_take(ar, BM * S); w->ncc = asc_take(ar, BM * S);
    w->K0 = asc_take(ar, BM * S); w->K1 = asc_take(ar, BM * S); w->K2 = asc_take(ar, BM * S);
    w->thr = asc_take(ar, BM * S); w->mx = asc_take(ar, BM * S);
    w->S0 = asc_take(ar, BM * S); w->S1 = asc_take(ar, BM * S); w->S2 = asc_take(ar, BM * S);
    w->have = asc_take(ar, BM * sizeof(SINT));
    w->selfin = asc_take(ar, BM * sizeof(SINT));
    w->P = asc_take(ar, dz * BM * sizeof(double));
    w->O = asc_take(ar, dv * BM * sizeof(double));
    w->rs = asc_take(ar, (size_t)ASC_FRS * BM * sizeof(double));
    w->cnt = asc_take(ar, 2 * BM * sizeof(int64_t));
    w->nbr = asc_take(ar, nn * BM * sizeof(int64_t));
    w->ncount = asc_take(ar, BM * sizeof(int64_t));
    w->nbv = asc_take(ar, nn * BM * sizeof(double));
    w->lse = asc_take(ar, BM * sizeof(double));
    w->ubuf = asc_take(ar, 2 * d * sizeof(double));
    w->coef = asc_take(ar, BM * sizeof(FN(asc_coef)));
}

/* ---------------------------------------------------------------- F1: geometry */

ASC_INLINE void FN(f1_epi)(FN(asc_fws) *w, const asc_params *p, const FN(asc_blk) *bk, const SCALAR *nzk,
                           int64_t j0, int64_t nj, int flags, SCALAR delta, const int masked) {
    const int paper = p->variant == ASC_VARIANT_PAPER;
    const int scores = paper && p->neighbours == ASC_NEIGHBOURS_SCORES; /* rank by s = scale q.k (G3) */
    const SCALAR scale = (SCALAR)p->scale;
    const int diag = (flags & ASC_DIAG) != 0;
    const SCALAR nits = (SCALAR)(-1.0 / (p->tau_sep + ASC_EPS_TAU)), nitc = (SCALAR)(-1.0 / (p->tau_coh + ASC_EPS_TAU));
    const VS zero = FN(vset)(0);
    const VI ones = (VI){0} - 1;
    for (int m = 0; m < bk->mv; m++) {
        const int o = m * VL;
        const VS nzi = FN(vld)(w->nzr + o);
        const VI tok = FN(asc_row_tokens)(bk->t0, o);
        VS rho = zero, W = zero, Qz = zero;
        VD s1[NH], s2[NH];
        for (int k = 0; k < NH; k++) s1[k] = s2[k] = (VD){0};
        VS K = FN(vld)(w->K0 + o), Sv = FN(vld)(w->S0 + o);
        VI have = FN(vldi)(w->have + o), sin = FN(vldi)(w->selfin + o), cnt = (VI){0};
        for (int64_t j = 0; j < nj; j++) {
            const SCALAR nzj = nzk[j];
            const VS gz = FN(vld)(w->G1 + j * BM + o), gh = FN(vld)(w->G2 + j * BM + o);
            VS D = FN(vclamp0)((nzi + nzj) - (gz + gz));
            VI self = (VI){0};
            if (diag) {
                self = tok == (SINT)(j0 + j);
                D = FN(vsel)(self, zero, D);
            }
            VS ws = FN(vexp)(D * nits), wc = FN(vexp)(D * nitc);
            const VS a = gh; /* h normalized in the key preparation */
            VS phi = ws * FN(vclamp0)(a - delta);
            VI mt = ones;
            if (masked) {
                mt = FN(vldi)(w->mT + j * BM + o);
                ws = FN(vsel)(mt, ws, zero);
                wc = FN(vsel)(mt, wc, zero);
                phi = FN(vsel)(mt, phi, zero);
            }
            FN(vst)(w->E + j * BM + o, wc);
            FN(vst)(w->PHb + (j0 + j) * BM + o, phi);
            rho += paper && diag ? FN(vsel)(self, zero, ws) : ws;
            W += wc;
            /* a masked key's ||z~_j||^2 may be non-finite: the product is selected away */
            Qz += masked ? FN(vsel)(mt, wc * nzj, zero) : wc * nzj;
            /* moments of phi, shifted by the row's first entry other than its own token */
            const VI other = mt & ~self, first = other & ~have;
            K = FN(vsel)(first, phi, K);
            have |= first;
            FN(vacc2)(s1, s2, masked || diag ? FN(vsel)(other, phi - K, zero) : phi - K);
            if (diag) {
                Sv = FN(vsel)(mt & self, phi, Sv);
                sin |= mt & self;
            }
            cnt -= mt;
            if (paper) { /* top-k of a (or s) over T(i) \ {i}: strictly better than the current k-th */
                const VS rank = scores ? FN(vld)(w->G3 + j * BM + o) * scale : a;
                unsigned bits = FN(vbits)(mt & ~self & ~(rank <= FN(vld)(w->thr + o)));
                if (bits) { /* rare after the first tiles: lanes through memory */
                    SCALAR ab[VL] __attribute__((aligned(64)));
                    FN(vst)(ab, rank);
                    for (; bits; bits &= bits - 1) {
                        const int l = __builtin_ctz(bits), i = o + l;
                        const int64_t c = asc_topk_push(w->nbr + (size_t)i * p->n_nbr, w->nbv + (size_t)i * p->n_nbr,
                                                        w->ncount[i], p->n_nbr, j0 + j, (double)ab[l]);
                        w->ncount[i] = c;
                        if (c == p->n_nbr) w->thr[i] = (SCALAR)w->nbv[(size_t)i * p->n_nbr + c - 1];
                    }
                }
            }
        }
        FN(vst)(w->K0 + o, K);
        FN(vst)(w->S0 + o, Sv);
        FN(vsti)(w->have + o, have);
        FN(vsti)(w->selfin + o, sin);
        for (int l = 0; l < VL; l++) {
            const int i = o + l;
            w->rs[FRS_RHO * BM + i] += (double)rho[l];
            w->rs[FRS_W * BM + i] += (double)W[l];
            w->rs[FRS_QZ * BM + i] += (double)Qz[l];
            w->rs[FRS_P1 * BM + i] += s1[l / VDL][l % VDL];
            w->rs[FRS_P2 * BM + i] += s2[l / VDL][l % VDL];
            w->cnt[i] += (int64_t)cnt[l];
        }
    }
}

static void FN(f1_sweep)(FN(asc_fws) *w, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp,
                         const FN(asc_blk) *bk) {
    const int64_t N = p->N, d = p->d, dz = p->dz, da = p->da, bh = bk->bh, end = FN(asc_stat_end)(p, bk);
    const SCALAR *zt = kp->zt + bh * N * dz, *hb = kp->hn + bh * N * da;
    const SCALAR *kb = (const SCALAR *)a->k + bh * N * d;
    const SCALAR delta = (SCALAR)ASC_HEAD(a, delta, bk->hd);
    for (int64_t j0 = FN(asc_next_tile)(p, bk, 0); j0 < end; j0 = FN(asc_next_tile)(p, bk, j0 + BN)) {
        const int64_t nj = end - j0 < BN ? end - j0 : BN;
        const int fl = FN(asc_tile_masks)(p, bk, j0, nj, w->mT, w->mJ);
        if (!(fl & ASC_T_ANY)) continue;
        FN(k_score)(w->G1, w->zT, NULL, NULL, zt + j0 * dz, dz, dz, nj, bk->mv);
        FN(k_score)(w->G2, w->hT, NULL, NULL, hb + j0 * da, da, da, nj, bk->mv);
        if (p->variant == ASC_VARIANT_PAPER && p->neighbours == ASC_NEIGHBOURS_SCORES)
            FN(k_score)(w->G3, w->qT, NULL, NULL, kb + j0 * d, d, d, nj, bk->mv);
        if (fl & ASC_T_FULL)
            FN(f1_epi)(w, p, bk, kp->nz + bh * N + j0, j0, nj, fl, delta, 0);
        else
            FN(f1_epi)(w, p, bk, kp->nz + bh * N + j0, j0, nj, fl, delta, 1);
        /* centroid numerator: P[f][i] += sum_j zt_j[f] wc_ij */
        FN(k_row)(w->R, w->E, zt + j0 * dz, dz, dz, nj, !(fl & ASC_T_FULL) && (fl & ASC_BADKEY), w->mT, bk->mv);
        for (int64_t f = 0; f < dz; f++)
            for (int i = 0; i < BM; i++) w->P[f * BM + i] += (double)w->R[f * BM + i];
    }
}

/* ---------------------------------------------------------------- F2: moments of r and rc */

ASC_INLINE void FN(f2_epi)(FN(asc_fws) *w, const FN(asc_blk) *bk, const SCALAR *nzk, const SCALAR *rkk, int64_t j0,
                           int64_t nj, int flags, const int masked) {
    const int diag = (flags & ASC_DIAG) != 0;
    const VS zero = FN(vset)(0);
    const VI ones = (VI){0} - 1;
    for (int m = 0; m < bk->mv; m++) {
        const int o = m * VL;
        const VS ncc = FN(vld)(w->ncc + o);
        const VI tok = FN(asc_row_tokens)(bk->t0, o);
        VS Kr = FN(vld)(w->K1 + o), Kc = FN(vld)(w->K2 + o), Sr = FN(vld)(w->S1 + o), Sc = FN(vld)(w->S2 + o);
        VI have = FN(vldi)(w->have + o), sin = FN(vldi)(w->selfin + o);
        VD r1[NH], r2[NH], c1[NH], c2[NH];
        for (int k = 0; k < NH; k++) r1[k] = r2[k] = c1[k] = c2[k] = (VD){0};
        for (int64_t j = 0; j < nj; j++) {
            const VS r = FN(vld)(w->G4 + j * BM + o) * rkk[j];
            const VS gc = FN(vld)(w->G5 + j * BM + o);
            const VS rc = FN(vclamp0)((ncc + nzk[j]) - (gc + gc));
            FN(vst)(w->Rb + (j0 + j) * BM + o, r);
            FN(vst)(w->RCb + (j0 + j) * BM + o, rc);
            const VI mt = masked ? FN(vldi)(w->mT + j * BM + o) : ones;
            const VI self = diag ? tok == (SINT)(j0 + j) : (VI){0};
            const VI other = mt & ~self, first = other & ~have;
            Kr = FN(vsel)(first, r, Kr);
            Kc = FN(vsel)(first, rc, Kc);
            have |= first;
            if (masked || diag) {
                FN(vacc2)(r1, r2, FN(vsel)(other, r - Kr, zero));
                FN(vacc2)(c1, c2, FN(vsel)(other, rc - Kc, zero));
                Sr = FN(vsel)(mt & self, r, Sr);
                Sc = FN(vsel)(mt & self, rc, Sc);
                sin |= mt & self;
            } else {
                FN(vacc2)(r1, r2, r - Kr);
                FN(vacc2)(c1, c2, rc - Kc);
            }
        }
        FN(vst)(w->K1 + o, Kr);
        FN(vst)(w->K2 + o, Kc);
        FN(vst)(w->S1 + o, Sr);
        FN(vst)(w->S2 + o, Sc);
        FN(vsti)(w->have + o, have);
        FN(vsti)(w->selfin + o, sin);
        for (int l = 0; l < VL; l++) {
            const int i = o + l;
            w->rs[FRS_R1 * BM + i] += r1[l / VDL][l % VDL];
            w->rs[FRS_R2 * BM + i] += r2[l / VDL][l % VDL];
            w->rs[FRS_C1 * BM + i] += c1[l / VDL][l % VDL];
            w->rs[FRS_C2 * BM + i] += c2[l / VDL][l % VDL];
        }
    }
}

static void FN(f2_sweep)(FN(asc_fws) *w, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp,
                         const FN(asc_blk) *bk) {
    const int64_t N = p->N, d = p->d, dz = p->dz, bh = bk->bh, end = FN(asc_stat_end)(p, bk);
    const SCALAR *zt = kp->zt + bh * N * dz, *kb = (const SCALAR *)a->k + bh * N * d;
    for (int64_t j0 = FN(asc_next_tile)(p, bk, 0); j0 < end; j0 = FN(asc_next_tile)(p, bk, j0 + BN)) {
        const int64_t nj = end - j0 < BN ? end - j0 : BN;
        const int fl = FN(asc_tile_masks)(p, bk, j0, nj, w->mT, w->mJ);
        if (!(fl & ASC_T_ANY)) continue;
        FN(k_score)(w->G4, w->uT, NULL, NULL, kb + j0 * d, d, d, nj, bk->mv);
        FN(k_score)(w->G5, w->cT, NULL, NULL, zt + j0 * dz, dz, dz, nj, bk->mv);
        if (fl & ASC_T_FULL) FN(f2_epi)(w, bk, kp->nz + bh * N + j0, kp->rk + bh * N + j0, j0, nj, fl, 0);
        else FN(f2_epi)(w, bk, kp->nz + bh * N + j0, kp->rk + bh * N + j0, j0, nj, fl, 1);
    }
}

/* ---------------------------------------------------------------- F3: softmax and output */

ASC_INLINE void FN(f3_epi)(FN(asc_fws) *w, const asc_params *p, int64_t j0, int64_t nj, int mv, int other, int aux,
                           const int masked) {
    const VS zero = FN(vset)(0), ninf = FN(vset)(-INFINITY);
    for (int m = 0; m < mv; m++) {
        const int o = m * VL;
        /* x = cs s + ca r + cphi phi + cc rc + x0 (+ itemp beta_other): asc_xval's expression, with
         * phi, r, rc as F1 and F2 left them */
        FN(asc_xvec) xv;
        FN(asc_xvec_load)(&xv, w->coef, w->nzr, w->ncc, 0, o);
        const VS mold = FN(vld)(w->mx + o);
        VS mt_max = ninf;
        VI nsoft = (VI){0};
        for (int64_t j = 0; j < nj; j++) {
            const int64_t e = j * BM + o, eb = (j0 + j) * BM + o;
            VS x = xv.cs * FN(vld)(w->G3 + e) + xv.ca * FN(vld)(w->Rb + eb) + xv.cphi * FN(vld)(w->PHb + eb) +
                   xv.cc * FN(vld)(w->RCb + eb) + xv.x0;
            x = other ? FN(asc_xbias)(&xv, x, FN(vld)(w->OB + e)) : FN(asc_softcap)(&xv, x);
            if (masked) {
                const VI mj = FN(vldi)(w->mJ + e);
                x = FN(vsel)(mj, x, ninf);
                nsoft -= mj;
            }
            FN(vst)(w->X + e, x);
            mt_max = FN(vmax)(x, mt_max);
        }
        const VS mnew = FN(vmax)(mt_max, mold);
        VS l = zero, ac = zero, as = zero;
        for (int64_t j = 0; j < nj; j++) {
            const int64_t e = j * BM + o, eb = (j0 + j) * BM + o;
            VS ev = FN(vexp)(FN(vld)(w->X + e) - mnew);
            if (masked) ev = FN(vsel)(FN(vldi)(w->mJ + e), ev, zero);
            FN(vst)(w->E + e, ev);
            l += ev;
            if (aux) {
                VS rc = FN(vld)(w->RCb + eb), ph = FN(vld)(w->PHb + eb);
                if (masked) { /* a masked key's rc, phi may be non-finite: selected away */
                    const VI mj = FN(vldi)(w->mJ + e);
                    rc = FN(vsel)(mj, rc, zero);
                    ph = FN(vsel)(mj, ph, zero);
                }
                ac += ev * rc;
                as += ev * ph;
            }
        }
        for (int lane = 0; lane < VL; lane++) {
            const int i = o + lane;
            const double alpha = mold[lane] == -INFINITY ? 0.0 : exp((double)mold[lane] - (double)mnew[lane]);
            double *rs = w->rs;
            if (alpha != 1.0) {
                rs[FRS_L * BM + i] *= alpha;
                rs[FRS_AC * BM + i] *= alpha;
                rs[FRS_AS * BM + i] *= alpha;
                for (int64_t f = 0; f < p->dv; f++) w->O[f * BM + i] *= alpha;
            }
            rs[FRS_L * BM + i] += (double)l[lane];
            rs[FRS_AC * BM + i] += (double)ac[lane];
            rs[FRS_AS * BM + i] += (double)as[lane];
            w->cnt[BM + i] += masked ? (int64_t)nsoft[lane] : nj;
        }
        FN(vst)(w->mx + o, mnew);
    }
}

static void FN(f3_sweep)(FN(asc_fws) *w, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp,
                         const FN(asc_blk) *bk) {
    (void)kp;
    const int64_t N = p->N, d = p->d, dv = p->dv, bh = bk->bh;
    const int64_t end = FN(asc_soft_end)(p, bk);
    const SCALAR *kb = (const SCALAR *)a->k + bh * N * d, *vb = (const SCALAR *)a->v + bh * N * dv;
    const int other = a->attn_bias || a->alibi_slopes, aux = a->aux != NULL;
    for (int64_t j0 = FN(asc_next_tile)(p, bk, 0); j0 < end; j0 = FN(asc_next_tile)(p, bk, j0 + BN)) {
        const int64_t nj = end - j0 < BN ? end - j0 : BN;
        const int fl = FN(asc_tile_masks)(p, bk, j0, nj, w->mT, w->mJ);
        if (!(fl & ASC_J_ANY)) continue;
        FN(k_score)(w->G3, w->qT, NULL, NULL, kb + j0 * d, d, d, nj, bk->mv);
        if (other) FN(asc_other_tile)(w->OB, p, a, bk, j0, nj);
        if (fl & ASC_J_FULL) FN(f3_epi)(w, p, j0, nj, bk->mv, other, aux, 0);
        else FN(f3_epi)(w, p, j0, nj, bk->mv, other, aux, 1);
        if (a->dropout_seed) { /* y sums the kept pairs only (1 / (1 - p): asc_row_output); l and aux all */
            FN(asc_dropout_tile)(w->DM, p, a, bk, j0, nj, 1);
            for (int64_t e = 0; e < nj * BM; e++) w->E[e] *= w->DM[e];
        }
        FN(k_row)(w->R, w->E, vb + j0 * dv, dv, dv, nj, !(fl & ASC_J_FULL) && (fl & ASC_BADKEY), w->mJ, bk->mv);
        for (int64_t f = 0; f < dv; f++)
            for (int i = 0; i < BM; i++) w->O[f * BM + i] += (double)w->R[f * BM + i];
    }
}

/* ---------------------------------------------------------------- the maps (inspection only) */

/* Whether row `row` saw a non-finite input (SPEC section 11): its log-sum-exp is NaN or an output is not
 * finite (an empty row has LSE = +inf and output 0: not sick). */
static int FN(asc_row_sick)(const asc_params *p, const asc_fwd_args *a, int64_t row, double lse) {
    if (isnan(lse)) return 1;
    const SCALAR *y = (const SCALAR *)a->out + row * p->dv;
    for (int64_t f = 0; f < p->dv; f++)
        if (!isfinite((double)y[f])) return 1;
    return 0;
}

static void FN(f4_maps)(FN(asc_fws) *w, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp,
                        const FN(asc_blk) *bk) {
    const int64_t N = p->N, d = p->d, dz = p->dz, da = p->da, bh = bk->bh;
    const SCALAR *zt = kp->zt + bh * N * dz, *kb = (const SCALAR *)a->k + bh * N * d;
    const SCALAR *hb = kp->hn + bh * N * da;
    const double delta = ASC_HEAD(a, delta, bk->hd), nits = -1.0 / (p->tau_sep + ASC_EPS_TAU);
    const int other = a->attn_bias || a->alibi_slopes;
    int sick[BM];
    for (int i = 0; i < bk->nrows; i++) sick[i] = FN(asc_row_sick)(p, a, bh * p->Nq + bk->i0 + i, w->lse[i]);
    for (int64_t j0 = 0; j0 < N; j0 += BN) {
        const int64_t nj = N - j0 < BN ? N - j0 : BN;
        const int fl = FN(asc_tile_masks)(p, bk, j0, nj, w->mT, w->mJ);
        if (!(fl & (ASC_T_ANY | ASC_J_ANY))) { /* a skipped tile leaves its masks unwritten */
            memset(w->mT, 0, sizeof(SINT) * (size_t)(nj * BM));
            memset(w->mJ, 0, sizeof(SINT) * (size_t)(nj * BM));
        }
        const int full = (fl & ASC_T_FULL) && (fl & ASC_J_FULL);
        FN(asc_tile_scores)(w->G1, w->G2, w->G3, w->G4, w->G5, w->qT, w->uT, w->cT, w->zT, w->hT, p, kb + j0 * d,
                            zt + j0 * dz, hb + j0 * da, nj, bk->mv);
        if (other) FN(asc_other_tile)(w->OB, p, a, bk, j0, nj);
        for (int i = 0; i < bk->nrows; i++) {
            const FN(asc_coef) *c = w->coef + i;
            const int64_t row = bh * p->Nq + bk->i0 + i, t = bk->t0 + i;
            SCALAR *m_sb = (SCALAR *)a->map_sbase + row * N, *m_p = (SCALAR *)a->map_attn + row * N;
            SCALAR *m_b[3] = {(SCALAR *)a->map_align + row * N, (SCALAR *)a->map_sep + row * N,
                              (SCALAR *)a->map_coh + row * N};
            if (sick[i]) { /* as the twin: a row that sees a NaN / Inf is NaN */
                for (int64_t j = 0; j < nj; j++)
                    m_sb[j0 + j] = m_p[j0 + j] = m_b[0][j0 + j] = m_b[1][j0 + j] = m_b[2][j0 + j] = (SCALAR)NAN;
                continue;
            }
            for (int64_t j = 0; j < nj; j++) {
                const int64_t e = j * BM + i, key = j0 + j;
                const int inT = full || w->mT[e], inJ = full || w->mJ[e];
                const double gs = (double)w->G3[e];
                double D = (double)w->nzr[i] + (double)kp->nz[bh * N + key] - 2.0 * (double)w->G1[e];
                D = key == t || D < 0.0 ? 0.0 : D;
                const double ws = exp(D * nits);
                const double av = (double)w->G2[e];
                const double phi = ws * (av - delta < 0.0 ? 0.0 : av - delta); /* a NaN stays NaN */
                double rc = (double)w->ncc[i] + (double)kp->nz[bh * N + key] - 2.0 * (double)w->G5[e];
                rc = rc < 0.0 ? 0.0 : rc;
                const double r = (double)w->G4[e] * (double)kp->rk[bh * N + key];
                const double wv[3] = {r, phi, rc};
                m_sb[key] = (SCALAR)(p->scale * gs);
                for (int x = 0; x < 3; x++)
                    m_b[x][key] = c->norm && inT ? (SCALAR)((c->theta[x] * wv[x] - c->mean[x]) / (c->sd[x] + ASC_EPS_STD))
                                                 : (SCALAR)0;
                double xv = c->cs * gs + c->ca * r + c->cphi * phi + c->cc * rc + c->x0;
                const double xo = other ? c->itemp * (double)w->OB[e] : 0.0; /* beta_other, inside or outside the cap */
                if (!c->outside) xv += xo;
                if (c->cap != 0.0) xv = c->cap * tanh(xv / c->cap);
                if (c->outside) xv += xo;
                m_p[key] = inJ && isfinite(w->lse[i]) ? (SCALAR)exp(xv - w->lse[i]) : (SCALAR)0;
            }
        }
    }
}

/* ---------------------------------------------------------------- per-row steps (tiled and decode) */

/*
 * Mean and standard deviation of a raw row from its shifted sums (double); the self entry sv,
 * held back during the sweep, joins with the final shift K. unb: 1 for the seed module's
 * unbiased std.
 */
static void FN(asc_moments)(double s1, double s2, SCALAR K, int have, SCALAR sv, int selfin, int64_t n, double unb,
                            double *mean, double *sd) {
    if (selfin) {
        if (!have) K = sv;
        const double dlt = (double)(SCALAR)(sv - K);
        s1 += dlt;
        s2 += dlt * dlt;
    }
    const double nn = (double)n;
    *mean = n > 0 ? (double)K + s1 / nn : 0.0;
    const double var = n > 1 ? (s2 - s1 * s1 / nn) / (nn - unb) : 0.0;
    *sd = var < 0.0 ? 0.0 : sqrt(var); /* rounding below 0 (a NaN stays NaN) */
}

/*
 * After the geometry sweep, one row (query row `row` of (b, h) bh, token t): the centroid c, its
 * spread G, the gates and the heading u, from the sums over the statistics set T(i)
 *   W = sum wc_l,  P_f = sum wc_l (z_l - z0)_f (P[f * Ps]),  QZ = sum wc_l ||z_l - z0||^2,  rho
 * taken about any centre z0, n = |T(i)| and (paper) the neighbours nb[0 .. cnt). Writes the row's
 * c, u, nbr and the stats RHO .. COH_SPREAD; ct[f * cts] = c_f - z0_f. Returns ||c - z0||^2.
 * ubuf: 2 d doubles of scratch.
 */
static double FN(asc_row_geometry)(const asc_params *p, const asc_fwd_args *a, int64_t bh, int64_t row, int64_t t,
                                   const SCALAR *z0, double W, const double *P, int64_t Ps, double QZ, double rho,
                                   int64_t n, const int64_t *nb, int64_t cnt, double *ubuf, SCALAR *ct, int64_t cts) {
    const int64_t d = p->d, dz = p->dz;
    const int paper = p->variant == ASC_VARIANT_PAPER;
    const SCALAR *kb = (const SCALAR *)a->k + bh * p->N * d;
    const double Wd = W + ASC_EPS_TAU;
    SCALAR *c = (SCALAR *)a->c + row * dz, *u = (SCALAR *)a->u + row * d;
    SCALAR *st = (SCALAR *)a->stats + row * ASC_NSTAT;
    double cc2 = 0.0, cP = 0.0;
    for (int64_t f = 0; f < dz; f++) {
        const double Pf = P[f * Ps];
        c[f] = (SCALAR)((Pf + W * (double)z0[f]) / Wd);
        const SCALAR cf = c[f] - z0[f]; /* c - z0, as the backward forms it */
        ct[f * cts] = cf;
        cc2 += (double)cf * cf;
        cP += (double)cf * Pf;
    }
    double G = (QZ - 2.0 * cP + cc2 * W) / Wd;
    G = G < 0.0 ? 0.0 : G; /* rounding below 0 (a NaN stays NaN) */
    const double gate_c = paper ? asc_sigmoid(p->alpha_coh * G) : 1.0;
    double gate_a = 1.0, unorm = 1.0;
    if (paper) {
        double *restrict mv = ubuf, *restrict kbar = ubuf + d, ss = 0.0, var = 0.0;
        for (int64_t f = 0; f < d; f++) mv[f] = 0.0;
        for (int64_t q = 0; q < cnt; q++) {
            const SCALAR *kl = kb + nb[q] * d, rkl = FN(asc_inv_norm)(kl, d);
            #pragma omp simd
            for (int64_t f = 0; f < d; f++) mv[f] += (double)(SCALAR)(kl[f] * rkl);
        }
        for (int64_t f = 0; f < d; f++) ss += mv[f] * mv[f];
        unorm = sqrt(ss);
        /* u = 0 where the unit keys cancel to rounding (ASC_EPS_HEADING), judged on the stored UNORM as
         * the backward judges it */
        const int heading = (double)(SCALAR)unorm > ASC_EPS_HEADING * (double)cnt;
        for (int64_t f = 0; f < d; f++) u[f] = (SCALAR)(heading ? mv[f] / unorm : 0.0);
        if (cnt > 0) { /* the spread of the neighbours' unit keys around their mean */
            for (int64_t f = 0; f < d; f++) kbar[f] = mv[f] / (double)cnt;
            for (int64_t q = 0; q < cnt; q++) {
                const SCALAR *kl = kb + nb[q] * d, rkl = FN(asc_inv_norm)(kl, d);
                double acc = 0.0;
                #pragma omp simd reduction(+:acc)
                for (int64_t f = 0; f < d; f++) {
                    const double dev = (double)(SCALAR)(kl[f] * rkl) - kbar[f];
                    acc += dev * dev;
                }
                var += acc;
            }
            var /= (double)cnt;
        }
        gate_a = asc_sigmoid(p->alpha_align * var);
        for (int64_t q = 0; q < p->n_nbr; q++) a->nbr[row * p->n_nbr + q] = q < cnt ? nb[q] : -1;
    } else {
        const SCALAR rkt = FN(asc_inv_norm)(kb + t * d, d);
        for (int64_t f = 0; f < d; f++) u[f] = (SCALAR)(kb[t * d + f] * rkt);
    }
    st[ASC_STAT_RHO] = (SCALAR)rho;
    st[ASC_STAT_WC_SUM] = (SCALAR)W;
    st[ASC_STAT_GATE_A] = (SCALAR)gate_a;
    st[ASC_STAT_GATE_C] = (SCALAR)gate_c;
    st[ASC_STAT_UNORM] = (SCALAR)unorm;
    st[ASC_STAT_COUNT] = (SCALAR)n;
    st[ASC_STAT_COH_SPREAD] = (SCALAR)G;
    return cc2;
}

/*
 * After the moments sweep, one row: the mean and std of its three bias rows (theta times those of
 * the raw rows phi, r, rc: mom = {mean, sd} of r, phi, rc, in the order align, sep, coh) into the
 * stats, and the row's score coefficients.
 */
static void FN(asc_row_bias_stats)(const asc_params *p, const asc_fwd_args *a, int64_t row, int64_t hd,
                                   const double mom[3][2], FN(asc_coef) *coef) {
    SCALAR *st = (SCALAR *)a->stats + row * ASC_NSTAT;
    const double eta = asc_clamp01((double)st[ASC_STAT_RHO] / (ASC_HEAD(a, kappa, hd) + ASC_EPS_TAU));
    const double theta[3] = {ASC_HEAD(a, lambda_align, hd) * (double)st[ASC_STAT_GATE_A],
                             -ASC_HEAD(a, lambda_sep, hd) * eta,
                             -ASC_HEAD(a, lambda_coh, hd) * (double)st[ASC_STAT_GATE_C] / (p->tau_coh + ASC_EPS_TAU)};
    for (int x = 0; x < 3; x++) {
        st[ASC_STAT_MEAN_A + 2 * x] = (SCALAR)(theta[x] * mom[x][0]);
        st[ASC_STAT_STD_A + 2 * x] = (SCALAR)(fabs(theta[x]) * mom[x][1]);
    }
    st[ASC_STAT_LSE] = 0;
    FN(asc_coef_from_stats)(coef, st, p, a, hd);
}

/*
 * After the softmax sweep, one row: y = O / l (O[f * Os] = sum_j e_j v_j with e_j = exp(x_j - mx),
 * l = sum_j e_j over J(i), nsoft = |J(i)|), the log-sum-exp and the auxiliary terms (sums ac, as of
 * e_j rc_j and e_j phi_j). With sinks (SPEC section 12) exp(sink - mx) joins l, all taken about
 * max(mx, sink) so that no exp overflows. A row with no allowed key gets y = 0, aux = 0, LSE = +inf
 * (whatever its sink). With dropout O sums the kept pairs only and y is scaled by 1 / (1 - p)
 * (dropout_scale; the sink has no value, nothing to drop). Returns LSE.
 */
static double FN(asc_row_output)(const asc_params *p, const asc_fwd_args *a, int64_t row, const double *O, int64_t Os,
                                 double l, double mx, int64_t nsoft, double ac, double as) {
    SCALAR *out = (SCALAR *)a->out + row * p->dv, *st = (SCALAR *)a->stats + row * ASC_NSTAT;
    const int soft = nsoft > 0;
    const double scale = a->dropout_seed ? p->dropout_scale : 1.0;
    double shift = mx, num = 1.0, den = l; /* y = O num / den, LSE = shift + log(den) */
    if (soft && a->sinks) {
        const int64_t bh = row / p->Nq;
        const double sink = ASC_ELEM(a, sinks, ASC_SINK_AT(p, bh / p->H, bh % p->H, row % p->Nq));
        if (sink <= mx) {
            den = l + exp(sink - mx);
        } else { /* (a NaN sink too: then every output of the row is NaN) */
            num = exp(mx - sink);
            den = l * num + 1.0;
            shift = sink;
        }
    }
    for (int64_t f = 0; f < p->dv; f++) out[f] = soft ? (SCALAR)(O[f * Os] * num / den * scale) : (SCALAR)0;
    const double lse = soft ? shift + log(den) : INFINITY;
    st[ASC_STAT_LSE] = (SCALAR)lse;
    if (a->aux) {
        ((SCALAR *)a->aux)[row * 2] = soft ? (SCALAR)(ac * num / den) : (SCALAR)0;
        ((SCALAR *)a->aux)[row * 2 + 1] = soft ? (SCALAR)(as * num / den) : (SCALAR)0;
    }
    return lse;
}

/* ---------------------------------------------------------------- one block */

static void FN(asc_fwd_block)(FN(asc_fws) *w, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp,
                              int64_t bh, int64_t blk) {
    const int64_t N = p->N, d = p->d, dz = p->dz, da = p->da;
    const int paper = p->variant == ASC_VARIANT_PAPER;
    FN(asc_blk) bk;
    FN(asc_blk_init)(&bk, p, a, kp, bh, blk);
    const int64_t nr = bk.nrows, hd = bk.hd;
    const SCALAR *zt = kp->zt + bh * N * dz, *z0 = kp->z0 + bh * dz, *hb = kp->hn + bh * N * da;

    /* row operands of F1 and the row state */
    FN(asc_pack_t)(w->zT, zt + bk.t0 * dz, dz, bk.rows, dz, 1);
    FN(asc_pack_t)(w->hT, hb + bk.t0 * da, da, bk.rows, da, 1);
    FN(asc_pack_t)(w->qT, (const SCALAR *)a->q + (bh * p->Nq + bk.i0) * d, d, bk.rows, d, 1); /* F1 (scores), F3 */
    for (int i = 0; i < BM; i++) {
        w->nzr[i] = i < nr ? kp->nz[bh * N + bk.t0 + i] : (SCALAR)0;
        w->K0[i] = w->K1[i] = w->K2[i] = w->S0[i] = w->S1[i] = w->S2[i] = 0;
        w->have[i] = w->selfin[i] = 0;
        w->thr[i] = p->n_nbr > 0 ? (SCALAR)NAN : (SCALAR)INFINITY;
        w->mx[i] = (SCALAR)-INFINITY;
        w->ncount[i] = 0;
        w->cnt[i] = w->cnt[BM + i] = 0;
    }
    memset(w->rs, 0, sizeof(double) * ASC_FRS * BM);
    memset(w->P, 0, sizeof(double) * (size_t)dz * BM);
    memset(w->O, 0, sizeof(double) * (size_t)p->dv * BM);

    FN(f1_sweep)(w, p, a, kp, &bk);

    /* ---- after F1: centroid, spread, gates, heading u_i ---- */
    const double unb = paper ? 0.0 : 1.0; /* the seed module's std is unbiased */
    double mom[BM][3][2];                  /* mean and std of the raw rows r, phi, rc */
    for (int i = 0; i < nr; i++) {
        const int64_t row = bh * p->Nq + bk.i0 + i;
        w->ncc[i] = (SCALAR)FN(asc_row_geometry)(p, a, bh, row, bk.t0 + i, z0, w->rs[FRS_W * BM + i], w->P + i, BM,
                                                 w->rs[FRS_QZ * BM + i], w->rs[FRS_RHO * BM + i], w->cnt[i],
                                                 w->nbr + (size_t)i * p->n_nbr, paper ? w->ncount[i] : 0, w->ubuf,
                                                 w->cT + i, BM);
        const SCALAR *u = (const SCALAR *)a->u + row * d;
        for (int64_t f = 0; f < d; f++) w->uT[f * BM + i] = u[f];
        FN(asc_moments)(w->rs[FRS_P1 * BM + i], w->rs[FRS_P2 * BM + i], w->K0[i], w->have[i] != 0, w->S0[i],
                        w->selfin[i] != 0, w->cnt[i], unb, &mom[i][1][0], &mom[i][1][1]);
    }
    for (int i = 0; i < BM; i++) w->have[i] = w->selfin[i] = 0; /* F2 sets its own shifts */
    for (int i = (int)nr; i < BM; i++) {
        for (int64_t f = 0; f < dz; f++) w->cT[f * BM + i] = 0;
        for (int64_t f = 0; f < d; f++) w->uT[f * BM + i] = 0;
        w->ncc[i] = 0;
    }

    FN(f2_sweep)(w, p, a, kp, &bk);

    /* ---- after F2: the moments of the three raw bias rows, the stats, the coefficients ---- */
    for (int i = 0; i < nr; i++) {
        const int64_t row = bh * p->Nq + bk.i0 + i, n = w->cnt[i];
        FN(asc_moments)(w->rs[FRS_R1 * BM + i], w->rs[FRS_R2 * BM + i], w->K1[i], w->have[i] != 0, w->S1[i],
                        w->selfin[i] != 0, n, unb, &mom[i][0][0], &mom[i][0][1]);
        FN(asc_moments)(w->rs[FRS_C1 * BM + i], w->rs[FRS_C2 * BM + i], w->K2[i], w->have[i] != 0, w->S2[i],
                        w->selfin[i] != 0, n, unb, &mom[i][2][0], &mom[i][2][1]);
        FN(asc_row_bias_stats)(p, a, row, hd, (const double(*)[2])mom[i], w->coef + i);
    }
    for (int i = (int)nr; i < BM; i++) memset(w->coef + i, 0, sizeof(FN(asc_coef)));

    FN(f3_sweep)(w, p, a, kp, &bk);

    /* ---- outputs ---- */
    for (int i = 0; i < nr; i++)
        w->lse[i] = FN(asc_row_output)(p, a, bh * p->Nq + bk.i0 + i, w->O + i, BM, w->rs[FRS_L * BM + i],
                                       (double)w->mx[i], w->cnt[BM + i], w->rs[FRS_AC * BM + i],
                                       w->rs[FRS_AS * BM + i]);
    if (a->map_attn) FN(f4_maps)(w, p, a, kp, &bk);
}

#include "ascender_decode_impl.h"

int FN(ascender_fwd)(const asc_params *p, const asc_fwd_args *a) {
    const int64_t BH = p->B * p->H, nblk = (p->Nq + BM - 1) / BM;
    int failed = 0;
    FN(asc_keys) kp;
    FN(asc_fws) layout;
    asc_arena measure = {NULL, 0};
    if (p->N == 0 || p->Nq == 0 || BH == 0) return 0;
    FN(asc_fws_layout)(&layout, &measure, p);
    const size_t ws_bytes = measure.off;
    if (FN(asc_keys_alloc)(&kp, p, a, 1)) return 1;

    #pragma omp parallel
    {
        FN(asc_fws) w;
        asc_arena ar = {asc_arena_alloc(ws_bytes), 0};
        if (ar.base) {
            memset(ar.base, 0, ws_bytes);
            FN(asc_fws_layout)(&w, &ar, p);
        }
        const int stop = asc_team_failed(&failed, ar.base == NULL);
        if (!stop) {
            FN(asc_keys_fill)(&kp, p, a);
            /* one dynamic loop over every (b, h, query block): a thread that is descheduled
             * holds up at most one block */
            #pragma omp for schedule(dynamic, 1)
            for (int64_t item = 0; item < BH * nblk; item++) FN(asc_fwd_block)(&w, p, a, &kp, item / nblk, item % nblk);
        }
        free(ar.base);
    }
    FN(asc_keys_free)(&kp);
    return failed;
}

/* The forward of a call whose result is not differentiated (docs/decode.md): a few query rows take
 * the decode path; the others, and the inspection maps, the tiled forward. */
int FN(ascender_infer)(const asc_params *p, const asc_fwd_args *a) {
    if (p->N == 0 || p->Nq == 0 || p->B * p->H == 0) return 0;
    return FN(asc_decode_applies)(p, a) ? FN(asc_decode_fwd)(p, a) : FN(ascender_fwd)(p, a);
}
