/*
 * ascender_row_impl.h -- the forward state of one query row, shared by the CPU forward
 * (ascender_fwd_impl.h) and backward (ascender_bwd_impl.h). Generic over SCALAR / SEXP /
 * FN(name); included once per element type. No include guard on purpose.
 *
 * Per (batch, head) the keys, latent and semantic coordinates are transposed into shared
 * scratch ([feature][token], O(N) each) with their inverse norms, so every per-row pass
 * streams contiguous columns and vectorizes over the key index j. A row's state lives in
 * per-thread buffers of length N (docs/forward.md):
 *   pass 1  D_ij, a_ij, ws_ij, wc_ij; rho_i, centroid c_i; top-k N(i) -> u_i, gate_a
 *   pass 2  s_ij, r_ij = k^_j.u_i, ||z_j - c_i||^2; gate_c; raw bias rows, mean and std
 *   pass 3  x_ij = S_ij / T, e_ij = exp(x_ij - max) on J(i), log-sum-exp.
 */

typedef struct FN(asc_shared) {
    SCALAR *kT, *zT, *hT; /* [d][N], [dz][N], [da][N] */
    SCALAR *vT;           /* [dv][N], backward only (else NULL) */
    SCALAR *rk, *rh;      /* 1 / max(||k_j||, 1e-12), likewise for h */
} FN(asc_shared);

/* One row's forward state. Buffers are valid for j < jend. */
typedef struct FN(asc_rowstate) {
    uint8_t *allow, *instat; /* softmax set J(i); statistics set T(i) */
    SCALAR *a;               /* a_ij = h^_i.h^_j */
    SCALAR *ws, *wc;         /* kernel weights, 0 outside T(i) */
    SCALAR *s;               /* scale q_i.k_j */
    SCALAR *r;               /* k^_j.u_i */
    SCALAR *rcq;             /* ||z_j - c_i||^2 */
    SCALAR *bias[3];         /* raw beta^align, beta^sep, beta^coh */
    SCALAR *e;               /* exp(x_ij - max) on J(i), else 0 */
    double *x;               /* S_ij / (score_temp + 1e-6) */
    SCALAR *u, *c;           /* u_i [d], c_i [dz] */
    double *m;               /* sum of the neighbours' unit keys [d] (paper) */
    int64_t *nbr;            /* N(i), descending affinity [n_nbr] */
    double *nbrv;            /* their affinities */
    int64_t cnt;             /* |N(i)| */
    int64_t i, t;            /* query row i is token t = i + N - Nq */
    int64_t jend, n_soft, n_stat;
    double rho, eta, wsum, G, gate_a, gate_c, unorm;
    double mean[3], std[3];  /* raw bias row moments over T(i), std without +1e-6 */
    double wnorm[3];         /* omega_X / (std_X + 1e-6), 0 when n_i <= 1 */
    double lsum, lse;
} FN(asc_rowstate);

/* Carves the row buffers out of ar (see asc_take); measure with a NULL base first. */
static void FN(asc_rowstate_layout)(FN(asc_rowstate) *r, asc_arena *ar, const asc_params *p) {
    const size_t N = (size_t)p->N, S = sizeof(SCALAR);
    r->allow = asc_take(ar, N);
    r->instat = asc_take(ar, N);
    r->a = asc_take(ar, N * S);
    r->ws = asc_take(ar, N * S);
    r->wc = asc_take(ar, N * S);
    r->s = asc_take(ar, N * S);
    r->r = asc_take(ar, N * S);
    r->rcq = asc_take(ar, N * S);
    for (int t = 0; t < 3; t++) r->bias[t] = asc_take(ar, N * S);
    r->e = asc_take(ar, N * S);
    r->x = asc_take(ar, N * sizeof(double));
    r->u = asc_take(ar, (size_t)p->d * S);
    r->c = asc_take(ar, (size_t)p->dz * S);
    r->m = asc_take(ar, (size_t)p->d * sizeof(double));
    r->nbr = asc_take(ar, (size_t)p->n_nbr * sizeof(int64_t));
    r->nbrv = asc_take(ar, (size_t)p->n_nbr * sizeof(double));
}

/* Inverse norms 1 / max(||x_j||, 1e-12) of rows [N][f]. */
static void FN(asc_inv_norms)(SCALAR *dst, const SCALAR *src, int64_t N, int64_t f) {
    #pragma omp for schedule(static) nowait
    for (int64_t j = 0; j < N; j++) {
        double ss = 0.0;
        for (int64_t c = 0; c < f; c++) ss += (double)src[j * f + c] * src[j * f + c];
        double n = sqrt(ss);
        dst[j] = (SCALAR)(1.0 / (n > ASC_EPS_NORM ? n : ASC_EPS_NORM));
    }
}

/* Fills the shared scratch of (b, h) = bh; called by every thread of the team. */
static void FN(asc_shared_fill)(FN(asc_shared) *sh, const asc_params *p, const asc_fwd_args *a, int64_t bh) {
    const int64_t N = p->N;
    const SCALAR *kb = (const SCALAR *)a->k + bh * N * p->d;
    const SCALAR *zb = (const SCALAR *)a->z + bh * N * p->dz;
    const SCALAR *hb = (const SCALAR *)a->h + bh * N * p->da;
    FN(asc_transpose)(sh->kT, kb, N, p->d);
    FN(asc_transpose)(sh->zT, zb, N, p->dz);
    FN(asc_transpose)(sh->hT, hb, N, p->da);
    if (sh->vT) FN(asc_transpose)(sh->vT, (const SCALAR *)a->v + bh * N * p->dv, N, p->dv);
    FN(asc_inv_norms)(sh->rk, kb, N, p->d);
    FN(asc_inv_norms)(sh->rh, hb, N, p->da);
    #pragma omp barrier
}

static void FN(asc_shared_free)(FN(asc_shared) *sh) {
    free(sh->kT); free(sh->zT); free(sh->hT); free(sh->vT); free(sh->rk); free(sh->rh);
}

static int FN(asc_shared_alloc)(FN(asc_shared) *sh, const asc_params *p, int with_v) {
    const size_t N = (size_t)p->N, S = sizeof(SCALAR);
    sh->vT = with_v ? malloc(S * N * (size_t)(p->dv ? p->dv : 1)) : NULL;
    sh->kT = malloc(S * N * (size_t)(p->d ? p->d : 1));
    sh->zT = malloc(S * N * (size_t)(p->dz ? p->dz : 1));
    sh->hT = malloc(S * N * (size_t)(p->da ? p->da : 1));
    sh->rk = malloc(S * N);
    sh->rh = malloc(S * N);
    if (sh->kT && sh->zT && sh->hT && sh->rk && sh->rh && (sh->vT || !with_v)) return 0;
    FN(asc_shared_free)(sh);
    return 1;
}

/*
 * Mean and standard deviation of row[j] over the statistics set, both in double and
 * two-pass (exact zero deviation for a constant row). unbiased: divide by n - 1.
 */
ASC_INLINE void FN(asc_row_moments)(const SCALAR *row, const uint8_t *instat, int64_t jend,
                                    int64_t n, int unbiased, double *mean, double *std) {
    double sum = 0.0, ss = 0.0;
    #pragma omp simd reduction(+:sum)
    for (int64_t j = 0; j < jend; j++) sum += instat[j] ? (double)row[j] : 0.0;
    *mean = n > 0 ? sum / (double)n : 0.0;
    #pragma omp simd reduction(+:ss)
    for (int64_t j = 0; j < jend; j++) {
        double t = (double)row[j] - *mean;
        ss += instat[j] ? t * t : 0.0;
    }
    *std = n > 1 ? sqrt(ss / (double)(unbiased ? n - 1 : n)) : 0.0;
}

/* Per-head learnable scalar t of asc_fwd_args (SPEC order lambda_align .. kappa). */
#define ASC_HEAD_SCALAR(a, name, hd) ((double)((const SCALAR *)(a)->name)[hd])

/*
 * The forward state of query row i (token t = i + N - Nq) of (b, h): everything of SPEC
 * section 4 up to the softmax numerators. The row touches keys j < jend, where jend = t + 1
 * for a causal row with mask_stats, N otherwise (or always N when all_keys is set, for the maps).
 */
ASC_HOT static void FN(asc_row_forward)(const asc_params *p, const asc_fwd_args *a, const FN(asc_shared) *sh,
                                        FN(asc_rowstate) *r, int64_t b, int64_t hd, int64_t i, int all_keys) {
    const int64_t N = p->N, d = p->d, dz = p->dz, da = p->da;
    const int64_t bh = b * p->H + hd, t = i + N - p->Nq;
    const int paper = p->variant == ASC_VARIANT_PAPER;
    const SCALAR *qi = (const SCALAR *)a->q + (bh * p->Nq + i) * d;
    const SCALAR *ki = (const SCALAR *)a->k + (bh * N + t) * d;
    const SCALAR *zi = (const SCALAR *)a->z + (bh * N + t) * dz;
    const SCALAR *hi = (const SCALAR *)a->h + (bh * N + t) * da;
    const uint8_t *kpm_b = a->key_padding_mask ? a->key_padding_mask + b * N : NULL;
    const uint8_t *am_bhi = a->attn_mask ? a->attn_mask + b * p->am_sb + hd * p->am_sh + i * p->am_si : NULL;
    const double tsep = p->tau_sep + ASC_EPS_TAU, tcoh = p->tau_coh + ASC_EPS_TAU;
    const int64_t jend = (all_keys || !p->is_causal || !p->mask_stats) ? N : t + 1;

    r->i = i;
    r->t = t;
    r->jend = jend;
    r->n_soft = r->n_stat = 0;
    for (int64_t j = 0; j < jend; j++) {
        r->allow[j] = (uint8_t)asc_allowed(p, kpm_b, am_bhi, t, j);
        r->instat[j] = p->mask_stats ? r->allow[j] : 1;
        r->n_soft += r->allow[j];
        r->n_stat += r->instat[j];
    }

    /* ---- pass 1: distances, affinities, kernel weights, density, centroid ---- */
    SCALAR *D = r->s; /* s is free until pass 2 */
    FN(asc_sqdist_cols)(D, zi, sh->zT, N, dz, jend);
    FN(asc_gemv_cols)(r->a, hi, NULL, NULL, sh->hT, N, da, jend);
    {
        const SCALAR rhi = sh->rh[t], nis = (SCALAR)(-1.0 / tsep), nic = (SCALAR)(-1.0 / tcoh);
        #pragma omp simd
        for (int64_t j = 0; j < jend; j++) {
            r->a[j] = (r->a[j] * rhi) * sh->rh[j];
            const SCALAR ws = SEXP(D[j] * nis), wc = SEXP(D[j] * nic);
            r->ws[j] = r->instat[j] ? ws : (SCALAR)0;
            r->wc[j] = r->instat[j] ? wc : (SCALAR)0;
        }
        /* paper: rho over l != i. Leave ws_ii (= 1) out of the sum instead of subtracting
         * it afterwards, which cancels catastrophically when rho << 1 (spread latents). */
        if (paper && t < jend) {
            const SCALAR wtt = r->ws[t];
            r->ws[t] = 0;
            r->rho = FN(asc_sum)(r->ws, jend);
            r->ws[t] = wtt;
        } else {
            r->rho = FN(asc_sum)(r->ws, jend);
        }
        r->wsum = FN(asc_sum)(r->wc, jend);
        /* centroid c_i = sum_l wc_il z_l / (sum_l wc_il + 1e-6) */
        for (int64_t f = 0; f < dz; f++)
            r->c[f] = (SCALAR)(FN(asc_dot)(r->wc, sh->zT + f * N, jend) / (r->wsum + ASC_EPS_TAU));
    }

    /* ---- neighbours, heading u_i and the alignment gate ---- */
    r->gate_a = 1.0;
    r->unorm = 1.0;
    r->cnt = 0;
    if (paper) {
        int64_t cnt = 0;
        for (int64_t j = 0; j < jend; j++)
            if (r->instat[j] && j != t) cnt = asc_topk_push(r->nbr, r->nbrv, cnt, p->n_nbr, j, r->a[j]);
        r->cnt = cnt;
        /* sum of unit neighbour keys, then its norm; mean and spread for the gate */
        double ss = 0.0, var = 0.0;
        for (int64_t f = 0; f < d; f++) r->m[f] = 0.0;
        for (int64_t n = 0; n < cnt; n++) {
            const int64_t l = r->nbr[n];
            for (int64_t f = 0; f < d; f++) r->m[f] += (double)(SCALAR)(sh->kT[f * N + l] * sh->rk[l]);
        }
        for (int64_t f = 0; f < d; f++) ss += r->m[f] * r->m[f];
        r->unorm = sqrt(ss);
        for (int64_t f = 0; f < d; f++)
            r->u[f] = (SCALAR)(r->unorm > 0.0 ? r->m[f] / (r->unorm > ASC_EPS_NORM ? r->unorm : ASC_EPS_NORM) : 0.0);
        if (cnt > 0) {
            for (int64_t n = 0; n < cnt; n++) {
                const int64_t l = r->nbr[n];
                for (int64_t f = 0; f < d; f++) {
                    double dev = (double)(SCALAR)(sh->kT[f * N + l] * sh->rk[l]) - r->m[f] / (double)cnt;
                    var += dev * dev;
                }
            }
            var /= (double)cnt;
        }
        r->gate_a = asc_sigmoid(p->alpha_align * var);
    } else {
        for (int64_t f = 0; f < d; f++) r->u[f] = (SCALAR)(ki[f] * sh->rk[t]);
    }

    /* ---- pass 2: base scores and the raw alignment / cohesion rows ---- */
    /* s_ij = q_i.k_j, r = u_i.k_j (times 1/||k_j|| below), rcq = ||z_j - c_i||^2 */
    FN(asc_gemv_cols)(r->s, qi, r->r, r->u, sh->kT, N, d, jend);
    FN(asc_sqdist_cols)(r->rcq, r->c, sh->zT, N, dz, jend);
    r->G = 0.0;
    r->gate_c = 1.0;
    if (paper) {
        r->G = FN(asc_dot)(r->wc, r->rcq, jend) / (r->wsum + ASC_EPS_TAU);
        r->gate_c = asc_sigmoid(p->alpha_coh * r->G);
    }
    r->eta = asc_clamp01(r->rho / (ASC_HEAD_SCALAR(a, kappa, hd) + ASC_EPS_TAU));
    const double delta = ASC_HEAD_SCALAR(a, delta, hd);
    const double ca = ASC_HEAD_SCALAR(a, lambda_align, hd) * r->gate_a;
    const double cs = -ASC_HEAD_SCALAR(a, lambda_sep, hd) * r->eta;
    const double cc = -ASC_HEAD_SCALAR(a, lambda_coh, hd) * r->gate_c / tcoh;
    SCALAR *bal = r->bias[0], *bsp = r->bias[1], *bco = r->bias[2];
    #pragma omp simd
    for (int64_t j = 0; j < jend; j++) {
        const double red = (double)r->a[j] - delta;
        r->s[j] = (SCALAR)(p->scale * r->s[j]);
        r->r[j] = r->r[j] * sh->rk[j];
        bal[j] = (SCALAR)(ca * (double)r->r[j]);
        bsp[j] = (SCALAR)(cs * ((double)r->ws[j] * (red > 0.0 ? red : 0.0)));
        bco[j] = (SCALAR)(cc * r->rcq[j]);
    }

    /* ---- row normalization of each bias ---- */
    const double omega[3] = {ASC_HEAD_SCALAR(a, omega_align, hd), ASC_HEAD_SCALAR(a, omega_sep, hd),
                             ASC_HEAD_SCALAR(a, omega_coh, hd)};
    for (int x = 0; x < 3; x++) {
        FN(asc_row_moments)(r->bias[x], r->instat, jend, r->n_stat, !paper, &r->mean[x], &r->std[x]);
        r->wnorm[x] = r->n_stat > 1 ? omega[x] / (r->std[x] + ASC_EPS_STD) : 0.0;
    }

    /* ---- pass 3: scores x = S / T, softmax numerators e_j = exp(x_j - max) ---- */
    const double itemp = 1.0 / (ASC_HEAD_SCALAR(a, score_temp, hd) + ASC_EPS_TAU);
    const double wa = r->wnorm[0], wsp = r->wnorm[1], wco = r->wnorm[2];
    const double ma = r->mean[0], ms = r->mean[1], mc = r->mean[2];
    /* beta^(other): a dense additive bias and ALiBi, -slope * |t - j| */
    const SCALAR *ab = a->attn_bias ? (const SCALAR *)a->attn_bias + b * p->ab_sb + hd * p->ab_sh + i * p->ab_si : NULL;
    const int64_t ab_sj = p->ab_sj;
    const double slope = a->alibi_slopes ? ((const SCALAR *)a->alibi_slopes)[hd] : 0.0;
    double mx = -INFINITY;
    #pragma omp simd reduction(max:mx)
    for (int64_t j = 0; j < jend; j++) {
        const double other = (ab ? (double)ab[j * ab_sj] : 0.0) - slope * (double)(t > j ? t - j : j - t);
        const double S = (double)r->s[j] + wa * ((double)bal[j] - ma) + wsp * ((double)bsp[j] - ms) +
                         wco * ((double)bco[j] - mc) + other;
        r->x[j] = S * itemp;
        mx = (r->allow[j] && r->x[j] > mx) ? r->x[j] : mx;
    }
    #pragma omp simd
    for (int64_t j = 0; j < jend; j++) {
        const SCALAR ej = SEXP((SCALAR)(r->x[j] - mx));
        r->e[j] = r->allow[j] ? ej : (SCALAR)0;
    }
    r->lsum = FN(asc_sum)(r->e, jend);
    r->lse = r->n_soft > 0 ? mx + log(r->lsum) : INFINITY;
}

/*
 * The per-row auxiliary-loss terms of SPEC section 5 from a row's forward state:
 * aux[0] = sum_j A_ij ||z_j - c_i||^2, aux[1] = sum_j A_ij phi_ij with A_ij = e_ij / sum_j e_ij
 * (both 0 for a row with no allowed key).
 */
ASC_INLINE void FN(asc_row_aux)(const asc_fwd_args *a, const FN(asc_rowstate) *r, int64_t hd, double aux[2]) {
    const double delta = ASC_HEAD_SCALAR(a, delta, hd);
    double coh = 0.0, sep = 0.0;
    #pragma omp simd reduction(+:coh, sep)
    for (int64_t j = 0; j < r->jend; j++) {
        const double red = (double)r->a[j] - delta;
        coh += (double)r->e[j] * (double)r->rcq[j];
        sep += (double)r->e[j] * ((double)r->ws[j] * (red > 0.0 ? red : 0.0));
    }
    aux[0] = r->n_soft > 0 ? coh / r->lsum : 0.0;
    aux[1] = r->n_soft > 0 ? sep / r->lsum : 0.0;
}
