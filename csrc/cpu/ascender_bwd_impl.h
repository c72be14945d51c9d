/*
 * ascender_bwd_impl.h -- generic body of the CPU backward, compiled once per element type
 * through instantiate.h (SCALAR, SEXP, FN). No include guard on purpose. The math, pass by pass: docs/backward.md.
 *
 * Each row recomputes its forward state with asc_row_forward (the forward's own code), then
 * runs passes 1-4 as loops over j. Row-side gradients (dq_i and the parts of dk^_t, dz_t,
 * dh^_t of the query's own token t summed over j) and column-side ones (dk_j, dk^_j, dv_j, dz_j, dh^_j) go into
 * per-thread accumulators [N][f]; after the rows of a (batch, head) they are summed over the
 * threads and the normalizations' backward turns dk^, dh^ into dk, dh. O(threads x N x d).
 */

#include "vec_impl.h"
#include "ascender_row_impl.h"

/* Per-thread backward buffers of one row (length N unless noted). */
typedef struct FN(asc_gradrow) {
    SCALAR *dS;      /* dL/dS_ij */
    SCALAR *B[3];    /* dL/d(raw bias) for align, sep, coh */
    SCALAR *dws, *dwc, *da, *drc, *dD, *tmp;
    double *acc;     /* max(d, dv, dz, da) */
    SCALAR *vec;     /* max(d, dv, dz, da) */
} FN(asc_gradrow);

/* Per-thread column accumulators, row-major [N][f]. */
typedef struct FN(asc_gradcols) {
    SCALAR *k, *khat, *v, *z, *hhat;
} FN(asc_gradcols);

static void FN(asc_gradrow_layout)(FN(asc_gradrow) *g, asc_arena *ar, const asc_params *p) {
    const size_t N = (size_t)p->N, S = sizeof(SCALAR);
    int64_t nacc = p->d;
    if (p->dv > nacc) nacc = p->dv;
    if (p->dz > nacc) nacc = p->dz;
    if (p->da > nacc) nacc = p->da;
    g->dS = asc_take(ar, N * S);
    for (int t = 0; t < 3; t++) g->B[t] = asc_take(ar, N * S);
    g->dws = asc_take(ar, N * S);
    g->dwc = asc_take(ar, N * S);
    g->da = asc_take(ar, N * S);
    g->drc = asc_take(ar, N * S);
    g->dD = asc_take(ar, N * S);
    g->tmp = asc_take(ar, N * S);
    g->acc = asc_take(ar, (size_t)nacc * sizeof(double));
    g->vec = asc_take(ar, (size_t)nacc * S);
}

static size_t FN(asc_gradcols_elems)(const asc_params *p) {
    return (size_t)p->N * (size_t)(2 * p->d + p->dv + p->dz + p->da);
}

static void FN(asc_gradcols_at)(FN(asc_gradcols) *gc, SCALAR *base, const asc_params *p) {
    const size_t N = (size_t)p->N;
    gc->k = base;
    gc->khat = gc->k + N * (size_t)p->d;
    gc->v = gc->khat + N * (size_t)p->d;
    gc->z = gc->v + N * (size_t)p->dv;
    gc->hhat = gc->z + N * (size_t)p->dz;
}

/* row[c] += w * x[c] */
ASC_INLINE void FN(asc_axpy)(SCALAR *row, SCALAR w, const SCALAR *x, int64_t f) {
    #pragma omp simd
    for (int64_t c = 0; c < f; c++) row[c] += w * x[c];
}

/* sum_j dS_j (w_j - mean_T w): dS is 0 outside J(i), the mean runs over T(i) (n keys). */
ASC_INLINE double FN(asc_centered_dot)(const SCALAR *dS, const SCALAR *w, const uint8_t *instat, int64_t jend,
                                       int64_t n) {
    double sw = 0.0, acc = 0.0;
    #pragma omp simd reduction(+:sw)
    for (int64_t j = 0; j < jend; j++) sw += instat[j] ? (double)w[j] : 0.0;
    const double mw = sw / (double)n;
    #pragma omp simd reduction(+:acc)
    for (int64_t j = 0; j < jend; j++) acc += (double)dS[j] * ((double)w[j] - mw);
    return acc;
}

/* The backward of row i (docs/backward.md passes 1-4). dsc: this thread's [9] scalar sums. */
ASC_HOT static void FN(asc_row_backward)(const asc_params *p, const asc_bwd_args *ba, const FN(asc_shared) *sh,
                                         FN(asc_rowstate) *r, FN(asc_gradrow) *g, FN(asc_gradcols) *gc,
                                         double *dsc, int64_t b, int64_t hd, int64_t i) {
    const asc_fwd_args *a = &ba->in;
    const int64_t N = p->N, d = p->d, dv = p->dv, dz = p->dz, da = p->da;
    const int64_t bh = b * p->H + hd, row = bh * p->Nq + i, t = i + N - p->Nq; /* query row, token */
    const int paper = p->variant == ASC_VARIANT_PAPER;
    const SCALAR *qi = (const SCALAR *)a->q + row * d;
    const SCALAR *kb = (const SCALAR *)a->k + bh * N * d;
    const SCALAR *zb = (const SCALAR *)a->z + bh * N * dz, *zi = zb + t * dz;
    const SCALAR *hb = (const SCALAR *)a->h + bh * N * da, *hi = hb + t * da;
    const SCALAR *dy = (const SCALAR *)ba->grad_out + row * dv;
    SCALAR *dq = (SCALAR *)ba->dq + row * d;
    const double tsep = p->tau_sep + ASC_EPS_TAU, tcoh = p->tau_coh + ASC_EPS_TAU;
    /* incoming gradients of the auxiliary-loss terms and of the heading u_i (NULL = none) */
    const SCALAR *gaux = ba->grad_aux ? (const SCALAR *)ba->grad_aux + row * 2 : NULL;
    const double w_coh = gaux ? (double)gaux[0] : 0.0, w_sep = gaux ? (double)gaux[1] : 0.0;
    const SCALAR *gu = ba->grad_u ? (const SCALAR *)ba->grad_u + row * d : NULL;
    int gu_live = 0; /* autograd hands in zeros when no loss uses u */
    for (int64_t f = 0; gu && f < d; f++) gu_live |= gu[f] != 0;
    if (!gu_live) gu = NULL;

    FN(asc_row_forward)(p, a, sh, r, b, hd, i, 0);
    const int64_t jend = r->jend;
    const int soft = r->n_soft > 0;            /* y_i = 0 and A_i. = 0 otherwise: nothing from pass 1 */
    const int norm = r->n_stat > 1;            /* the normalized biases are 0 otherwise */
    const int aux = soft && (w_coh != 0.0 || w_sep != 0.0);
    for (int64_t f = 0; f < d; f++) dq[f] = 0;
    if (!soft && ba->dattn_bias) memset((SCALAR *)ba->dattn_bias + row * N, 0, sizeof(SCALAR) * (size_t)N);
    if (!soft && !gu) return;

    /* ---- pass 1: softmax and scores ---- */
    const double T = ASC_HEAD_SCALAR(a, score_temp, hd) + ASC_EPS_TAU;
    SCALAR *A = r->e; /* e -> A in place (e is 0 on an empty row) */
    if (!soft) {
        memset(g->dS, 0, sizeof(SCALAR) * (size_t)jend);
    } else {
        const SCALAR inv_lsum = (SCALAR)(1.0 / r->lsum);
        #pragma omp simd
        for (int64_t j = 0; j < jend; j++) A[j] *= inv_lsum;
        FN(asc_gemv_cols)(g->dS, dy, NULL, NULL, sh->vT, N, dv, jend); /* dA_j = dy.v_j */
        if (aux) { /* + d(w_coh sum_j A_j ||z_j - c||^2 + w_sep sum_j A_j phi_j) / dA_j */
            const double delta = ASC_HEAD_SCALAR(a, delta, hd);
            #pragma omp simd
            for (int64_t j = 0; j < jend; j++) {
                const double red = (double)r->a[j] - delta;
                g->dS[j] += (SCALAR)(w_coh * (double)r->rcq[j] + w_sep * ((double)r->ws[j] * (red > 0.0 ? red : 0.0)));
            }
        }
        const SCALAR P = (SCALAR)FN(asc_dot)(A, g->dS, jend);
        const SCALAR itemp = (SCALAR)(1.0 / T);
        double dT = 0.0;
        #pragma omp simd reduction(+:dT)
        for (int64_t j = 0; j < jend; j++) {
            g->dS[j] = A[j] * (g->dS[j] - P) * itemp; /* 0 outside J(i): A_j = 0 there */
            dT -= r->allow[j] ? (double)g->dS[j] * r->x[j] : 0.0;
        }
        dsc[6] += dT;
        if (ba->dattn_bias) { /* dL/d beta^(other)_ij = dS_ij; keys past jend do not reach the row */
            SCALAR *db = (SCALAR *)ba->dattn_bias + row * N;
            memcpy(db, g->dS, sizeof(SCALAR) * (size_t)jend);
            for (int64_t j = jend; j < N; j++) db[j] = 0;
        }
        FN(asc_weighted_rows)(g->acc, g->dS, kb, jend, d);
        for (int64_t f = 0; f < d; f++) dq[f] = (SCALAR)(p->scale * g->acc[f]);
        for (int64_t j = 0; j < jend; j++) {
            if (g->dS[j] != 0) FN(asc_axpy)(gc->k + j * d, (SCALAR)(p->scale * g->dS[j]), qi, d);
            if (A[j] != 0) FN(asc_axpy)(gc->v + j * dv, A[j], dy, dv);
        }
    }
    if (!norm && !aux && !gu) return; /* nothing reaches the bias terms */

    /* ---- pass 2: row normalization -> B^X_j = dL/db^X_j on T(i) ---- */
    const double omega[3] = {ASC_HEAD_SCALAR(a, omega_align, hd), ASC_HEAD_SCALAR(a, omega_sep, hd),
                             ASC_HEAD_SCALAR(a, omega_coh, hd)};
    const double n = (double)r->n_stat, n1 = paper ? n : n - 1.0;
    double scale_grad[3]; /* eps / (std + eps)^2 * omega * sum_J dS_j (w_j - mean_T w), see pass 3 */
    for (int x = 0; x < 3 && !norm; x++) {
        memset(g->B[x], 0, sizeof(SCALAR) * (size_t)jend);
        scale_grad[x] = 0.0;
    }
    for (int x = 0; x < 3 && norm; x++) {
        const SCALAR *bias = r->bias[x];
        const double mu = r->mean[x], sd = r->std[x], den = sd + ASC_EPS_STD;
        double sum_dS = 0.0, sum_dS_dev = 0.0, sum_dev = 0.0;
        #pragma omp simd reduction(+:sum_dS, sum_dS_dev, sum_dev)
        for (int64_t j = 0; j < jend; j++) {
            const double dev = (double)bias[j] - mu;
            sum_dS += (double)g->dS[j];
            sum_dS_dev += (double)g->dS[j] * dev;
            sum_dev += r->instat[j] ? dev : 0.0;
        }
        dsc[3 + x] += sum_dS_dev / den; /* d omega_X = sum_j dS_j b~_j */
        const double gbar = omega[x] * sum_dS / n;
        const double dsig = -omega[x] * sum_dS_dev / (den * den);
        const double csig = sd > 0.0 ? dsig / (n1 * sd) : 0.0;
        /* the mean's path through sigma: 0 in exact arithmetic, kept so that a row whose std
         * is at rounding level gets autograd's numbers (docs/backward.md, pass 2) */
        const double dev_mean = sum_dev / n;
        const double om = omega[x];
        SCALAR *B = g->B[x];
        #pragma omp simd
        for (int64_t j = 0; j < jend; j++) {
            const double v = (om * (double)g->dS[j] - gbar) / den + csig * ((double)bias[j] - mu - dev_mean);
            B[j] = r->instat[j] ? (SCALAR)v : (SCALAR)0;
        }
        scale_grad[x] = ASC_EPS_STD / (den * den) * om;
    }

    /* ---- pass 3a: alignment ---- */
    {
        const double lam = ASC_HEAD_SCALAR(a, lambda_align, hd);
        /* a per-row factor theta of b = theta w: sum_T B_j w_j equals
         * eps / (std + eps)^2 * sum_T g_j (w_j - mean w) (the row normalization is scale
         * invariant up to eps); the right side has no cancellation (docs/backward.md) */
        const double R = norm ? scale_grad[0] * FN(asc_centered_dot)(g->dS, r->r, r->instat, jend, r->n_stat) : 0.0;
        dsc[0] += r->gate_a * R;
        const SCALAR cA = (SCALAR)(lam * r->gate_a);
        /* dk^_j += cA B_j u (column); sum_j cA B_j k^_j (row) */
        #pragma omp simd
        for (int64_t j = 0; j < jend; j++) g->tmp[j] = cA * g->B[0][j] * sh->rk[j];
        for (int64_t j = 0; j < jend; j++)
            if (g->B[0][j] != 0) FN(asc_axpy)(gc->khat + j * d, cA * g->B[0][j], r->u, d);
        FN(asc_weighted_rows)(g->acc, g->tmp, kb, jend, d); /* dL/du_i */
        if (gu)
            for (int64_t f = 0; f < d; f++) g->acc[f] += (double)gu[f];
        if (!paper) {
            for (int64_t f = 0; f < d; f++) gc->khat[t * d + f] += (SCALAR)g->acc[f];
        } else if (r->cnt > 0) {
            /* du = acc; through u = m / max(||m||, eps) to m = sum of the neighbours' k^_l */
            double udu = 0.0;
            for (int64_t f = 0; f < d; f++) udu += (double)r->u[f] * g->acc[f];
            const double un = r->unorm;
            for (int64_t f = 0; f < d; f++) {
                const double dm = un >= ASC_EPS_NORM ? (g->acc[f] - (double)r->u[f] * udu) / un
                                                    : (un > 0.0 ? g->acc[f] / ASC_EPS_NORM : 0.0);
                g->acc[f] = dm;
            }
            const double dgate = lam * R;
            const double dV = dgate * r->gate_a * (1.0 - r->gate_a) * p->alpha_align;
            const double cnt = (double)r->cnt;
            for (int64_t nb = 0; nb < r->cnt; nb++) {
                const int64_t l = r->nbr[nb];
                SCALAR *dst = gc->khat + l * d;
                for (int64_t f = 0; f < d; f++) {
                    const double khat = (double)(SCALAR)(sh->kT[f * N + l] * sh->rk[l]);
                    dst[f] += (SCALAR)(g->acc[f] + 2.0 * dV / cnt * (khat - r->m[f] / cnt));
                }
            }
        }
    }

    /* ---- pass 3b: separation ---- */
    {
        const double lam = ASC_HEAD_SCALAR(a, lambda_sep, hd);
        const double delta = ASC_HEAD_SCALAR(a, delta, hd);
        const double kap = ASC_HEAD_SCALAR(a, kappa, hd) + ASC_EPS_TAU;
        #pragma omp simd
        for (int64_t j = 0; j < jend; j++) {
            const double red = (double)r->a[j] - delta;
            g->tmp[j] = (SCALAR)((double)r->ws[j] * (red > 0.0 ? red : 0.0)); /* phi_j */
        }
        const double Phi = norm ? scale_grad[1] * FN(asc_centered_dot)(g->dS, g->tmp, r->instat, jend, r->n_stat) : 0.0;
        dsc[1] += -r->eta * Phi;
        const double deta = -lam * Phi;
        const double ratio = r->rho / kap;
        const int in_clamp = ratio >= 0.0 && ratio <= 1.0;
        const SCALAR drho = (SCALAR)(in_clamp ? deta / kap : 0.0);
        if (in_clamp) dsc[8] += -deta * r->rho / (kap * kap);
        const double cphi = -lam * r->eta;
        double sum_da = 0.0;
        #pragma omp simd reduction(+:sum_da)
        for (int64_t j = 0; j < jend; j++) {
            const double red = (double)r->a[j] - delta;
            const double dphi = cphi * (double)g->B[1][j] + w_sep * (double)A[j];
            const int dens = r->instat[j] && !(paper && j == t); /* j in T' */
            g->dws[j] = (SCALAR)(dphi * (red > 0.0 ? red : 0.0)) + (dens ? drho : (SCALAR)0);
            g->da[j] = red > 0.0 ? (SCALAR)(dphi * (double)r->ws[j]) : (SCALAR)0;
            sum_da += (double)g->da[j];
        }
        dsc[7] += -sum_da;
    }

    /* ---- pass 3c: cohesion ---- */
    const double Wd = r->wsum + ASC_EPS_TAU;
    double *dc = g->acc; /* [dz], kept until the column update below */
    double dG = 0.0;
    {
        const double lam = ASC_HEAD_SCALAR(a, lambda_coh, hd);
        const double Rc = norm ? scale_grad[2] * FN(asc_centered_dot)(g->dS, r->rcq, r->instat, jend, r->n_stat) : 0.0;
        dsc[2] += -(r->gate_c / tcoh) * Rc;
        if (paper) {
            const double dgate = -(lam / tcoh) * Rc;
            dG = dgate * r->gate_c * (1.0 - r->gate_c) * p->alpha_coh;
        }
        const double crc = -lam * r->gate_c / tcoh, cG = dG / Wd;
        #pragma omp simd
        for (int64_t j = 0; j < jend; j++)
            g->drc[j] = (SCALAR)(crc * (double)g->B[2][j] + cG * (double)r->wc[j] + w_coh * (double)A[j]);
        /* dc = -2 sum_j drc_j (z_j - c) */
        const double sdrc = FN(asc_sum)(g->drc, jend);
        FN(asc_weighted_rows)(dc, g->drc, zb, jend, dz);
        for (int64_t f = 0; f < dz; f++) dc[f] = -2.0 * (dc[f] - (double)r->c[f] * sdrc);
    }
    /* dwc_j = (dc.(z_j - c) + dG (rcq_j - G)) / (W + eps) on T(i) */
    {
        double dcc = 0.0;
        for (int64_t f = 0; f < dz; f++) dcc += dc[f] * (double)r->c[f];
        for (int64_t j = 0; j < jend; j++) g->tmp[j] = 0;
        for (int64_t f = 0; f < dz; f++) {
            const SCALAR w = (SCALAR)dc[f], *col = sh->zT + f * N;
            #pragma omp simd
            for (int64_t j = 0; j < jend; j++) g->tmp[j] += w * col[j];
        }
        #pragma omp simd
        for (int64_t j = 0; j < jend; j++) {
            const double v = ((double)g->tmp[j] - dcc + dG * ((double)r->rcq[j] - r->G)) / Wd;
            g->dwc[j] = r->instat[j] ? (SCALAR)v : (SCALAR)0;
        }
    }

    /* ---- pass 4: kernel weights -> distances; affinities ---- */
    #pragma omp simd
    for (int64_t j = 0; j < jend; j++)
        g->dD[j] = (SCALAR)(-(double)g->dws[j] * (double)r->ws[j] / tsep - (double)g->dwc[j] * (double)r->wc[j] / tcoh);
    {
        /* column: dz_j += 2 drc_j (z_j - c) + wc_j dc / (W + eps) - 2 dD_j (z_i - z_j) */
        SCALAR *dcs = g->vec; /* dc as SCALAR */
        for (int64_t f = 0; f < dz; f++) dcs[f] = (SCALAR)dc[f];
        const SCALAR iW = (SCALAR)(1.0 / Wd);
        for (int64_t j = 0; j < jend; j++) {
            const SCALAR drc = g->drc[j], dD = g->dD[j], wcj = r->wc[j] * iW;
            if (drc == 0 && dD == 0 && wcj == 0) continue;
            const SCALAR *zj = zb + j * dz;
            SCALAR *dst = gc->z + j * dz;
            const SCALAR cz = 2 * (drc + dD), cc = -2 * drc, ci = -2 * dD;
            #pragma omp simd
            for (int64_t f = 0; f < dz; f++) dst[f] += cz * zj[f] + cc * r->c[f] + wcj * dcs[f] + ci * zi[f];
        }
        /* row: dz_i += 2 sum_j dD_j (z_i - z_j) */
        const double sdD = FN(asc_sum)(g->dD, jend);
        FN(asc_weighted_rows)(g->acc, g->dD, zb, jend, dz);
        for (int64_t f = 0; f < dz; f++)
            gc->z[t * dz + f] += (SCALAR)(2.0 * ((double)zi[f] * sdD - g->acc[f]));
    }
    {
        /* dh^_j += da_j h^_i (column); dh^_i += sum_j da_j h^_j (row) */
        const SCALAR rhi = sh->rh[t];
        for (int64_t f = 0; f < da; f++) g->vec[f] = hi[f] * rhi;
        for (int64_t j = 0; j < jend; j++)
            if (g->da[j] != 0) FN(asc_axpy)(gc->hhat + j * da, g->da[j], g->vec, da);
        #pragma omp simd
        for (int64_t j = 0; j < jend; j++) g->dD[j] = g->da[j] * sh->rh[j]; /* dD is free */
        FN(asc_weighted_rows)(g->acc, g->dD, hb, jend, da);
        for (int64_t f = 0; f < da; f++) gc->hhat[t * da + f] += (SCALAR)g->acc[f];
    }
}

/* dx += backward of x^ = x / max(||x||, 1e-12) for one token: zero gradient at x = 0. */
ASC_INLINE void FN(asc_normalize_backward)(SCALAR *dx, const SCALAR *x, const double *dxhat, int64_t f) {
    double ss = 0.0, dot = 0.0;
    for (int64_t c = 0; c < f; c++) ss += (double)x[c] * x[c];
    const double nrm = sqrt(ss);
    if (nrm == 0.0) return;
    if (nrm < ASC_EPS_NORM) { /* clamp_min passes the gradient at equality */
        for (int64_t c = 0; c < f; c++) dx[c] += (SCALAR)(dxhat[c] / ASC_EPS_NORM);
        return;
    }
    for (int64_t c = 0; c < f; c++) dot += (double)x[c] * dxhat[c];
    for (int64_t c = 0; c < f; c++) dx[c] += (SCALAR)((dxhat[c] - (double)x[c] * dot / ss) / nrm);
}

/* Sums the threads' column accumulators of one (b, h) into the outputs. */
static void FN(asc_reduce_columns)(const asc_params *p, const asc_bwd_args *ba, SCALAR *gbase, int nthr,
                                   double *tmp, int64_t bh) {
    const int64_t N = p->N, d = p->d, dv = p->dv, dz = p->dz, da = p->da;
    const size_t stride = FN(asc_gradcols_elems)(p);
    #pragma omp for schedule(static)
    for (int64_t j = 0; j < N; j++) {
        const int64_t row = bh * N + j;
        SCALAR *dk = (SCALAR *)ba->dk + row * d, *dvo = (SCALAR *)ba->dv + row * dv;
        SCALAR *dzo = (SCALAR *)ba->dz + row * dz, *dh = (SCALAR *)ba->dh + row * da;
        const SCALAR *kj = (const SCALAR *)ba->in.k + row * d, *hj = (const SCALAR *)ba->in.h + row * da;
        FN(asc_gradcols) gc;
        for (int64_t f = 0; f < d; f++) { dk[f] = 0; tmp[f] = 0.0; }
        for (int64_t f = 0; f < dv; f++) dvo[f] = 0;
        for (int64_t f = 0; f < dz; f++) dzo[f] = 0;
        for (int t = 0; t < nthr; t++) {
            FN(asc_gradcols_at)(&gc, gbase + (size_t)t * stride, p);
            for (int64_t f = 0; f < d; f++) { dk[f] += gc.k[j * d + f]; tmp[f] += gc.khat[j * d + f]; }
            for (int64_t f = 0; f < dv; f++) dvo[f] += gc.v[j * dv + f];
            for (int64_t f = 0; f < dz; f++) dzo[f] += gc.z[j * dz + f];
        }
        FN(asc_normalize_backward)(dk, kj, tmp, d);
        for (int64_t f = 0; f < da; f++) { dh[f] = 0; tmp[f] = 0.0; }
        for (int t = 0; t < nthr; t++) {
            FN(asc_gradcols_at)(&gc, gbase + (size_t)t * stride, p);
            for (int64_t f = 0; f < da; f++) tmp[f] += gc.hhat[j * da + f];
        }
        FN(asc_normalize_backward)(dh, hj, tmp, da);
    }
}

int FN(ascender_bwd)(const asc_params *p, const asc_bwd_args *ba) {
    const asc_fwd_args *a = &ba->in;
    const int64_t N = p->N, BH = p->B * p->H, H = p->H;
    const int nthr_max = omp_get_max_threads();
    int failed = 0;
    FN(asc_shared) sh;
    FN(asc_rowstate) rl;
    FN(asc_gradrow) gl;
    asc_arena measure = {NULL, 0};
    SCALAR *dsc_out = (SCALAR *)ba->dscalars;
    for (int64_t t = 0; t < ASC_NSCALAR * H; t++) dsc_out[t] = 0;
    if (N == 0 || BH == 0) return 0;
    FN(asc_rowstate_layout)(&rl, &measure, p);
    FN(asc_gradrow_layout)(&gl, &measure, p);
    const int64_t ntmp = p->d > p->da ? p->d : p->da;
    const size_t row_bytes = measure.off + sizeof(double) * (size_t)(ntmp + 1);
    const size_t cols = FN(asc_gradcols_elems)(p);
    SCALAR *gbase = malloc(sizeof(SCALAR) * cols * (size_t)nthr_max + 1);
    double *dsc = calloc((size_t)nthr_max * ASC_NSCALAR * (size_t)H, sizeof(double));
    if (!gbase || !dsc || FN(asc_shared_alloc)(&sh, p, 1)) {
        free(gbase);
        free(dsc);
        return 1;
    }
    int nthr = 1;

    #pragma omp parallel
    {
        const int tid = omp_get_thread_num();
        FN(asc_rowstate) r;
        FN(asc_gradrow) g;
        FN(asc_gradcols) gc;
        asc_arena ar = {asc_arena_alloc(row_bytes), 0};
        double *tmp = NULL;
        FN(asc_gradcols_at)(&gc, gbase + (size_t)tid * cols, p);
        if (ar.base) {
            FN(asc_rowstate_layout)(&r, &ar, p);
            FN(asc_gradrow_layout)(&g, &ar, p);
            tmp = asc_take(&ar, sizeof(double) * (size_t)(ntmp + 1));
        }
        const int stop = asc_team_failed(&failed, ar.base == NULL);
        #pragma omp single
        nthr = omp_get_num_threads();
        for (int64_t bh = 0; !stop && bh < BH; bh++) {
            const int64_t b = bh / H, hd = bh % H;
            memset(gc.k, 0, sizeof(SCALAR) * cols);
            FN(asc_shared_fill)(&sh, p, a, bh); /* ends with a barrier */
            /* static round-robin chunks: each row's gradient lands in a fixed thread's
             * accumulators, so the result is the same bits on every call */
            #pragma omp for schedule(static, 8)
            for (int64_t i = 0; i < p->Nq; i++)
                FN(asc_row_backward)(p, ba, &sh, &r, &g, &gc, dsc + ((size_t)tid * H + hd) * ASC_NSCALAR, b, hd, i);
            FN(asc_reduce_columns)(p, ba, gbase, nthr, tmp, bh);
        }
        free(ar.base);
    }
    for (int64_t hd = 0; hd < H; hd++)
        for (int s = 0; s < ASC_NSCALAR; s++) {
            double total = 0.0;
            for (int t = 0; t < nthr; t++) total += dsc[((size_t)t * H + hd) * ASC_NSCALAR + s];
            dsc_out[s * H + hd] = (SCALAR)total;
        }
    FN(asc_shared_free)(&sh);
    free(gbase);
    free(dsc);
    return failed;
}
