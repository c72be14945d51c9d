/*
 * ascender_fwd_impl.h -- generic body of the CPU forward; included by ascender_fwd.c
 * once per element type with SCALAR and FN(name) defined. No include guard on purpose.
 *
 * Per (batch, head): the keys, latent and semantic coordinates are transposed into
 * shared scratch ([feature][token], O(N) each) with their inverse norms, so that every
 * per-row pass streams contiguous columns and vectorizes over the key index j.
 * Per row i (one OpenMP task): a handful of length-N row buffers (O(N) per thread):
 *   pass 1  D_ij, a_ij, ws_ij, wc_ij; rho_i, centroid c_i, top-k N(i) -> u_i, gates
 *   pass 2  s_ij, r^align_ij, r^coh_ij -> raw bias rows, their mean and std
 *   pass 3  x_ij = S_ij / T, e_ij = exp(x_ij - max) -> log-sum-exp
 *   pass 4  y_i = sum_j e_ij v_j / sum_j e_ij.
 * No N x N buffer exists unless the caller asked for inspection maps.
 */

typedef struct FN(asc_shared) {
    SCALAR *kT, *zT, *hT; /* [d][N], [dz][N], [da][N] */
    SCALAR *rk, *rh;      /* 1 / max(||k_j||, 1e-12), likewise for h */
} FN(asc_shared);

typedef struct FN(asc_rowbuf) {
    SCALAR *a, *ws, *wc, *s, *ra, *rc; /* length N each */
    double *x;                         /* S_ij / T, length N */
    uint8_t *allow, *instat;           /* softmax set J(i), statistics set */
    double *acc;                       /* max(d, dz, dv) accumulators */
    double *topv;                      /* k_neighbors values */
    int64_t *topi;                     /* k_neighbors indices */
    SCALAR *ui, *ci;                   /* d, dz */
} FN(asc_rowbuf);

static void FN(asc_rowbuf_free)(FN(asc_rowbuf) *r) {
    free(r->a); free(r->ws); free(r->wc); free(r->s); free(r->ra); free(r->rc);
    free(r->x); free(r->allow); free(r->instat); free(r->acc); free(r->topv);
    free(r->topi); free(r->ui); free(r->ci);
}

static int FN(asc_rowbuf_alloc)(FN(asc_rowbuf) *r, const asc_params *p) {
    int64_t N = p->N, nacc = p->d;
    if (p->dz > nacc) nacc = p->dz;
    if (p->dv > nacc) nacc = p->dv;
    memset(r, 0, sizeof(*r));
    r->a = malloc(sizeof(SCALAR) * N);
    r->ws = malloc(sizeof(SCALAR) * N);
    r->wc = malloc(sizeof(SCALAR) * N);
    r->s = malloc(sizeof(SCALAR) * N);
    r->ra = malloc(sizeof(SCALAR) * N);
    r->rc = malloc(sizeof(SCALAR) * N);
    r->x = malloc(sizeof(double) * N);
    r->allow = malloc(N);
    r->instat = malloc(N);
    r->acc = malloc(sizeof(double) * (nacc + 1));
    r->topv = malloc(sizeof(double) * (p->n_nbr + 1));
    r->topi = malloc(sizeof(int64_t) * (p->n_nbr + 1));
    r->ui = malloc(sizeof(SCALAR) * (p->d + 1));
    r->ci = malloc(sizeof(SCALAR) * (p->dz + 1));
    if (!r->a || !r->ws || !r->wc || !r->s || !r->ra || !r->rc || !r->x || !r->allow ||
        !r->instat || !r->acc || !r->topv || !r->topi || !r->ui || !r->ci) {
        FN(asc_rowbuf_free)(r);
        return 1;
    }
    return 0;
}

/* Transpose rows [N][f] into columns [f][N]. */
static void FN(asc_transpose)(SCALAR *dst, const SCALAR *src, int64_t N, int64_t f) {
    #pragma omp for schedule(static) nowait
    for (int64_t j = 0; j < N; j++)
        for (int64_t c = 0; c < f; c++) dst[c * N + j] = src[j * f + c];
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

/* Block length of the SCALAR partial sums that asc_sum / asc_dot / asc_weighted_rows flush
 * into double: vector-width accumulation inside a block, double across blocks. */
#ifndef ASC_BLOCK
#define ASC_BLOCK 256
#endif

/* sum_j x[j] */
ASC_INLINE double FN(asc_sum)(const SCALAR *x, int64_t n) {
    double total = 0.0;
    for (int64_t j0 = 0; j0 < n; j0 += ASC_BLOCK) {
        const int64_t j1 = j0 + ASC_BLOCK < n ? j0 + ASC_BLOCK : n;
        SCALAR part = 0;
        #pragma omp simd reduction(+:part)
        for (int64_t j = j0; j < j1; j++) part += x[j];
        total += (double)part;
    }
    return total;
}

/* sum_j x[j] y[j] */
ASC_INLINE double FN(asc_dot)(const SCALAR *x, const SCALAR *y, int64_t n) {
    double total = 0.0;
    for (int64_t j0 = 0; j0 < n; j0 += ASC_BLOCK) {
        const int64_t j1 = j0 + ASC_BLOCK < n ? j0 + ASC_BLOCK : n;
        SCALAR part = 0;
        #pragma omp simd reduction(+:part)
        for (int64_t j = j0; j < j1; j++) part += x[j] * y[j];
        total += (double)part;
    }
    return total;
}

/* acc[c] = sum_j w[j] rows[j][c] for rows [n][f]. Columns in chunks of ASC_CHUNK whose
 * partial sums stay in registers over a block of keys, then flush into double. */
#define ASC_CHUNK 32
ASC_INLINE void FN(asc_weighted_rows)(double *acc, const SCALAR *w, const SCALAR *rows, int64_t n, int64_t f) {
    for (int64_t c = 0; c < f; c++) acc[c] = 0.0;
    for (int64_t c0 = 0; c0 < f; c0 += ASC_CHUNK) {
        const int64_t cw = c0 + ASC_CHUNK <= f ? ASC_CHUNK : f - c0;
        for (int64_t j0 = 0; j0 < n; j0 += ASC_BLOCK) {
            const int64_t j1 = j0 + ASC_BLOCK < n ? j0 + ASC_BLOCK : n;
            SCALAR part[ASC_CHUNK] = {0};
            if (cw == ASC_CHUNK) {
                for (int64_t j = j0; j < j1; j++) {
                    const SCALAR wj = w[j], *row = rows + j * f + c0;
                    #pragma omp simd
                    for (int64_t c = 0; c < ASC_CHUNK; c++) part[c] += wj * row[c];
                }
            } else {
                for (int64_t j = j0; j < j1; j++) {
                    const SCALAR wj = w[j], *row = rows + j * f + c0;
                    for (int64_t c = 0; c < cw; c++) part[c] += wj * row[c];
                }
            }
            for (int64_t c = 0; c < cw; c++) acc[c0 + c] += (double)part[c];
        }
    }
}

/* acc[j] = sum_f w[f] cols[f][j] (cols is [nf][N]) for j < n; f unrolled by 4 so each
 * pass over acc serves four columns. acc2/w2, when non-NULL, get the same with w2. */
ASC_INLINE void FN(asc_gemv_cols)(SCALAR *acc, const SCALAR *w, SCALAR *acc2, const SCALAR *w2,
                                  const SCALAR *cols, int64_t N, int64_t nf, int64_t n) {
    int64_t f = 0;
    for (int64_t j = 0; j < n; j++) acc[j] = 0;
    if (acc2)
        for (int64_t j = 0; j < n; j++) acc2[j] = 0;
    for (; f + 4 <= nf; f += 4) {
        const SCALAR *c0 = cols + f * N, *c1 = c0 + N, *c2 = c1 + N, *c3 = c2 + N;
        const SCALAR a0 = w[f], a1 = w[f + 1], a2 = w[f + 2], a3 = w[f + 3];
        if (acc2) {
            const SCALAR b0 = w2[f], b1 = w2[f + 1], b2 = w2[f + 2], b3 = w2[f + 3];
            #pragma omp simd
            for (int64_t j = 0; j < n; j++) {
                acc[j] += (a0 * c0[j] + a1 * c1[j]) + (a2 * c2[j] + a3 * c3[j]);
                acc2[j] += (b0 * c0[j] + b1 * c1[j]) + (b2 * c2[j] + b3 * c3[j]);
            }
        } else {
            #pragma omp simd
            for (int64_t j = 0; j < n; j++) acc[j] += (a0 * c0[j] + a1 * c1[j]) + (a2 * c2[j] + a3 * c3[j]);
        }
    }
    for (; f < nf; f++) {
        const SCALAR *c = cols + f * N, a0 = w[f], b0 = acc2 ? w2[f] : 0;
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) acc[j] += a0 * c[j];
        if (acc2) {
            #pragma omp simd
            for (int64_t j = 0; j < n; j++) acc2[j] += b0 * c[j];
        }
    }
}

/* acc[j] = sum_f (cols[f][j] - x[f])^2, as differences (never negative), f unrolled by 4. */
ASC_INLINE void FN(asc_sqdist_cols)(SCALAR *acc, const SCALAR *x, const SCALAR *cols, int64_t N,
                                    int64_t nf, int64_t n) {
    int64_t f = 0;
    for (int64_t j = 0; j < n; j++) acc[j] = 0;
    for (; f + 4 <= nf; f += 4) {
        const SCALAR *c0 = cols + f * N, *c1 = c0 + N, *c2 = c1 + N, *c3 = c2 + N;
        const SCALAR x0 = x[f], x1 = x[f + 1], x2 = x[f + 2], x3 = x[f + 3];
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            const SCALAR t0 = c0[j] - x0, t1 = c1[j] - x1, t2 = c2[j] - x2, t3 = c3[j] - x3;
            acc[j] += (t0 * t0 + t1 * t1) + (t2 * t2 + t3 * t3);
        }
    }
    for (; f < nf; f++) {
        const SCALAR *c = cols + f * N, x0 = x[f];
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) { const SCALAR t = c[j] - x0; acc[j] += t * t; }
    }
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

/* One query row: everything of SPEC section 4 for row i of (b, h). */
ASC_HOT static void FN(asc_row)(const asc_params *p, const asc_fwd_args *a, const FN(asc_shared) *sh,
                        FN(asc_rowbuf) *r, int64_t b, int64_t hd, int64_t i) {
    const int64_t N = p->N, d = p->d, dv = p->dv, dz = p->dz, da = p->da;
    const int64_t bh = b * p->H + hd;
    const int paper = p->variant == ASC_VARIANT_PAPER;
    const int maps = a->map_attn != NULL;
    const SCALAR *qi = (const SCALAR *)a->q + (bh * N + i) * d;
    const SCALAR *ki = (const SCALAR *)a->k + (bh * N + i) * d;
    const SCALAR *vb = (const SCALAR *)a->v + bh * N * dv;
    const SCALAR *zi = (const SCALAR *)a->z + (bh * N + i) * dz;
    const SCALAR *hi = (const SCALAR *)a->h + (bh * N + i) * da;
    const uint8_t *kpm_b = a->key_padding_mask ? a->key_padding_mask + b * N : NULL;
    const uint8_t *am_bhi = a->attn_mask ? a->attn_mask + b * p->am_sb + hd * p->am_sh + i * p->am_si : NULL;
    SCALAR *out = (SCALAR *)a->out + (bh * N + i) * dv;
    SCALAR *st = (SCALAR *)a->stats + (bh * N + i) * ASC_NSTAT;
    SCALAR *u_out = (SCALAR *)a->u + (bh * N + i) * d;
    SCALAR *c_out = (SCALAR *)a->c + (bh * N + i) * dz;
    int64_t *nbr = a->nbr + (bh * N + i) * p->n_nbr;

    const double lam_a = ((const SCALAR *)a->lambda_align)[hd];
    const double lam_s = ((const SCALAR *)a->lambda_sep)[hd];
    const double lam_c = ((const SCALAR *)a->lambda_coh)[hd];
    const double om_a = ((const SCALAR *)a->omega_align)[hd];
    const double om_s = ((const SCALAR *)a->omega_sep)[hd];
    const double om_c = ((const SCALAR *)a->omega_coh)[hd];
    const double temp = (double)((const SCALAR *)a->score_temp)[hd] + ASC_EPS_TAU;
    const double delta = ((const SCALAR *)a->delta)[hd];
    const double kappa = (double)((const SCALAR *)a->kappa)[hd] + ASC_EPS_TAU;
    const double tsep = p->tau_sep + ASC_EPS_TAU, tcoh = p->tau_coh + ASC_EPS_TAU;

    /* Keys this row touches: the softmax set is inside [0, jend) and so is the
     * statistics set, except that mask_stats=0 makes it all N tokens. */
    const int64_t jend = (maps || !p->is_causal || !p->mask_stats) ? N : i + 1;
    int64_t n_soft = 0, n_stat = 0;
    for (int64_t j = 0; j < jend; j++) {
        r->allow[j] = (uint8_t)asc_allowed(p, kpm_b, am_bhi, i, j);
        r->instat[j] = p->mask_stats ? r->allow[j] : 1;
        n_soft += r->allow[j];
        n_stat += r->instat[j];
    }

    /* ---- pass 1: distances, affinities, kernel weights ---- */
    SCALAR *D = r->s; /* s is free until pass 2 */
    FN(asc_sqdist_cols)(D, zi, sh->zT, N, dz, jend);
    FN(asc_gemv_cols)(r->a, hi, NULL, NULL, sh->hT, N, da, jend);
    {
        /* kernel weights, zero outside the statistics set (only used inside it) */
        const SCALAR rhi = sh->rh[i], nis = (SCALAR)(-1.0 / tsep), nic = (SCALAR)(-1.0 / tcoh);
        #pragma omp simd
        for (int64_t j = 0; j < jend; j++) {
            r->a[j] = (r->a[j] * rhi) * sh->rh[j];
            const SCALAR ws = SEXP(D[j] * nis), wc = SEXP(D[j] * nic);
            r->ws[j] = r->instat[j] ? ws : (SCALAR)0;
            r->wc[j] = r->instat[j] ? wc : (SCALAR)0;
        }
        /* paper: rho over l != i. Leave ws_ii (= 1) out of the sum instead of subtracting
         * it afterwards, which cancels catastrophically when rho << 1 (spread latents). */
        double rho;
        if (paper && i < jend) {
            const SCALAR wii = r->ws[i];
            r->ws[i] = 0;
            rho = FN(asc_sum)(r->ws, jend);
            r->ws[i] = wii;
        } else {
            rho = FN(asc_sum)(r->ws, jend);
        }
        const double wsum = FN(asc_sum)(r->wc, jend);
        st[ASC_STAT_RHO] = (SCALAR)rho;
        st[ASC_STAT_WC_SUM] = (SCALAR)wsum;
        /* centroid c_i = sum_l wc_il z_l / (sum_l wc_il + 1e-6) */
        for (int64_t f = 0; f < dz; f++)
            r->ci[f] = (SCALAR)(FN(asc_dot)(r->wc, sh->zT + f * N, jend) / (wsum + ASC_EPS_TAU));
    }
    memcpy(c_out, r->ci, sizeof(SCALAR) * dz);

    /* ---- neighbours, heading u_i and the alignment gate ---- */
    double gate_a = 1.0, unorm = 1.0;
    if (paper) {
        int64_t cnt = 0;
        for (int64_t j = 0; j < jend; j++)
            if (r->instat[j] && j != i) cnt = asc_topk_push(r->topi, r->topv, cnt, p->n_nbr, j, r->a[j]);
        for (int64_t t = 0; t < p->n_nbr; t++) nbr[t] = t < cnt ? r->topi[t] : -1;
        /* sum of unit neighbour keys, then its norm; mean and spread for the gate */
        double ss = 0.0, var = 0.0;
        for (int64_t f = 0; f < d; f++) r->acc[f] = 0.0;
        for (int64_t t = 0; t < cnt; t++) {
            const int64_t l = r->topi[t];
            for (int64_t f = 0; f < d; f++) r->acc[f] += (double)(SCALAR)(sh->kT[f * N + l] * sh->rk[l]);
        }
        for (int64_t f = 0; f < d; f++) ss += r->acc[f] * r->acc[f];
        unorm = sqrt(ss);
        for (int64_t f = 0; f < d; f++)
            r->ui[f] = (SCALAR)(unorm > 0.0 ? r->acc[f] / (unorm > ASC_EPS_NORM ? unorm : ASC_EPS_NORM) : 0.0);
        if (cnt > 0) {
            for (int64_t t = 0; t < cnt; t++) {
                const int64_t l = r->topi[t];
                for (int64_t f = 0; f < d; f++) {
                    double dev = (double)(SCALAR)(sh->kT[f * N + l] * sh->rk[l]) - r->acc[f] / (double)cnt;
                    var += dev * dev;
                }
            }
            var /= (double)cnt;
        }
        gate_a = asc_sigmoid(p->alpha_align * var);
    } else {
        for (int64_t f = 0; f < d; f++) r->ui[f] = (SCALAR)(ki[f] * sh->rk[i]);
    }
    memcpy(u_out, r->ui, sizeof(SCALAR) * d);

    /* ---- pass 2: base scores and the raw alignment / cohesion rows ---- */
    /* s_ij = q_i.k_j, ra = u_i.k_j (times 1/||k_j|| below), rc = ||z_j - c_i||^2 */
    FN(asc_gemv_cols)(r->s, qi, r->ra, r->ui, sh->kT, N, d, jend);
    FN(asc_sqdist_cols)(r->rc, r->ci, sh->zT, N, dz, jend); /* ||z_j - c_i||^2 */
    double gate_c = 1.0;
    if (paper) {
        const double spread = FN(asc_dot)(r->wc, r->rc, jend);
        gate_c = asc_sigmoid(p->alpha_coh * spread / ((double)st[ASC_STAT_WC_SUM] + ASC_EPS_TAU));
    }
    const double eta = asc_clamp01((double)st[ASC_STAT_RHO] / kappa);
    const double ca = lam_a * gate_a, cs = -lam_s * eta, cc = -lam_c * gate_c / tcoh;
    #pragma omp simd
    for (int64_t j = 0; j < jend; j++) {
        const double red = (double)r->a[j] - delta;
        r->s[j] = (SCALAR)(p->scale * r->s[j]);
        r->ra[j] = (SCALAR)(ca * (double)(r->ra[j] * sh->rk[j]));
        r->a[j] = (SCALAR)(cs * ((double)r->ws[j] * (red > 0.0 ? red : 0.0))); /* a -> beta^sep */
        r->rc[j] = (SCALAR)(cc * r->rc[j]);
    }
    const SCALAR *bal = r->ra, *bsp = r->a, *bco = r->rc;

    /* ---- row normalization of each bias ---- */
    const int unbiased = !paper;
    double ma, sa, ms, ss_, mc, sc;
    FN(asc_row_moments)(bal, r->instat, jend, n_stat, unbiased, &ma, &sa);
    FN(asc_row_moments)(bsp, r->instat, jend, n_stat, unbiased, &ms, &ss_);
    FN(asc_row_moments)(bco, r->instat, jend, n_stat, unbiased, &mc, &sc);
    const int norm_on = n_stat > 1;
    const double wa = norm_on ? om_a / (sa + ASC_EPS_STD) : 0.0;
    const double wsp = norm_on ? om_s / (ss_ + ASC_EPS_STD) : 0.0;
    const double wco = norm_on ? om_c / (sc + ASC_EPS_STD) : 0.0;
    const double itemp = 1.0 / temp;

    /* ---- pass 3: scores x = S / T, softmax numerators e_j = exp(x_j - max) ---- */
    double mx = -INFINITY;
    #pragma omp simd reduction(max:mx)
    for (int64_t j = 0; j < jend; j++) {
        const double S = (double)r->s[j] + wa * ((double)bal[j] - ma) + wsp * ((double)bsp[j] - ms) +
                         wco * ((double)bco[j] - mc);
        r->x[j] = S * itemp;
        mx = (r->allow[j] && r->x[j] > mx) ? r->x[j] : mx;
    }
    SCALAR *e = r->ws; /* ws is free after beta^sep */
    #pragma omp simd
    for (int64_t j = 0; j < jend; j++) {
        const SCALAR ej = SEXP((SCALAR)(r->x[j] - mx));
        e[j] = r->allow[j] ? ej : (SCALAR)0;
    }
    const double lsum = FN(asc_sum)(e, jend);
    const double lse = n_soft > 0 ? mx + log(lsum) : INFINITY;

    /* ---- pass 4: y_i = sum_j e_j v_j / sum_j e_j ---- */
    FN(asc_weighted_rows)(r->acc, e, vb, jend, dv);
    for (int64_t f = 0; f < dv; f++) out[f] = (SCALAR)(n_soft > 0 ? r->acc[f] / lsum : 0.0);

    st[ASC_STAT_LSE] = (SCALAR)lse;
    st[ASC_STAT_MEAN_A] = (SCALAR)ma; st[ASC_STAT_STD_A] = (SCALAR)sa;
    st[ASC_STAT_MEAN_S] = (SCALAR)ms; st[ASC_STAT_STD_S] = (SCALAR)ss_;
    st[ASC_STAT_MEAN_C] = (SCALAR)mc; st[ASC_STAT_STD_C] = (SCALAR)sc;
    st[ASC_STAT_GATE_A] = (SCALAR)gate_a; st[ASC_STAT_GATE_C] = (SCALAR)gate_c;
    st[ASC_STAT_UNORM] = (SCALAR)unorm;
    st[ASC_STAT_COUNT] = (SCALAR)n_stat;

    if (maps) {
        const int64_t o = (bh * N + i) * N;
        SCALAR *m_sb = (SCALAR *)a->map_sbase + o, *m_a = (SCALAR *)a->map_align + o;
        SCALAR *m_s = (SCALAR *)a->map_sep + o, *m_c = (SCALAR *)a->map_coh + o;
        SCALAR *m_p = (SCALAR *)a->map_attn + o;
        for (int64_t j = 0; j < N; j++) {
            const int on = norm_on && r->instat[j];
            m_sb[j] = r->s[j];
            m_a[j] = on ? (SCALAR)(((double)bal[j] - ma) / (sa + ASC_EPS_STD)) : 0;
            m_s[j] = on ? (SCALAR)(((double)bsp[j] - ms) / (ss_ + ASC_EPS_STD)) : 0;
            m_c[j] = on ? (SCALAR)(((double)bco[j] - mc) / (sc + ASC_EPS_STD)) : 0;
            m_p[j] = n_soft > 0 ? (SCALAR)((double)e[j] / lsum) : 0;
        }
    }
}

int FN(ascender_fwd)(const asc_params *p, const asc_fwd_args *a) {
    const int64_t N = p->N, BH = p->B * p->H;
    int failed = 0;
    FN(asc_shared) sh;
    if (N == 0 || BH == 0) return 0;
    sh.kT = malloc(sizeof(SCALAR) * N * (p->d ? p->d : 1));
    sh.zT = malloc(sizeof(SCALAR) * N * (p->dz ? p->dz : 1));
    sh.hT = malloc(sizeof(SCALAR) * N * (p->da ? p->da : 1));
    sh.rk = malloc(sizeof(SCALAR) * N);
    sh.rh = malloc(sizeof(SCALAR) * N);
    if (!sh.kT || !sh.zT || !sh.hT || !sh.rk || !sh.rh) failed = 1;

    #pragma omp parallel if (!failed)
    {
        FN(asc_rowbuf) r;
        int mine = failed ? 1 : FN(asc_rowbuf_alloc)(&r, p);
        if (mine) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp barrier
        int ok;
        #pragma omp atomic read
        ok = failed;
        ok = !ok;
        for (int64_t bh = 0; ok && bh < BH; bh++) {
            const int64_t b = bh / p->H, hd = bh % p->H;
            const SCALAR *kb = (const SCALAR *)a->k + bh * N * p->d;
            const SCALAR *zb = (const SCALAR *)a->z + bh * N * p->dz;
            const SCALAR *hb = (const SCALAR *)a->h + bh * N * p->da;
            FN(asc_transpose)(sh.kT, kb, N, p->d);
            FN(asc_transpose)(sh.zT, zb, N, p->dz);
            FN(asc_transpose)(sh.hT, hb, N, p->da);
            FN(asc_inv_norms)(sh.rk, kb, N, p->d);
            FN(asc_inv_norms)(sh.rh, hb, N, p->da);
            #pragma omp barrier
            #pragma omp for schedule(dynamic, 8)
            for (int64_t i = 0; i < N; i++) FN(asc_row)(p, a, &sh, &r, b, hd, i);
            /* the implicit barrier of the loop protects the shared scratch */
        }
        if (!mine) FN(asc_rowbuf_free)(&r);
    }
    free(sh.kT); free(sh.zT); free(sh.hT); free(sh.rk); free(sh.rh);
    return failed;
}
