/*
 * naive_ascender.c -- naive double-precision oracle of the ASCender forward.
 *
 * A direct transcription of shared/SPEC.md sections 3-4: for every (batch, head)
 * it builds the full N x N matrices (masks, base scores, affinities, distances,
 * kernel weights, raw and normalized biases, scores, attention), then reads the
 * outputs off them. No fusion, no streaming, no clever tricks.
 *
 * Notation: J(i) is the softmax set of row i (allowed keys); T(i) is the
 * statistics set, T(i) = J(i) when mask_stats, else all N tokens. Every reduction
 * (neighbours, density, centroid, gates, row mean / std) runs over T(i); only the
 * softmax runs over J(i).
 *
 * Scope (issue 11's choice): this oracle stays the independent, dense C transcription of the core
 * formulas (both variants, every mask mode) that the C harness checks the kernels against under
 * ASan/UBSan. The later extras -- attn_bias, ALiBi, the aux outputs, windows, global tokens,
 * documents, softcap, the scores neighbourhood -- are checked in the pytest grid against
 * ascender_torch/reference.py (itself checked on hand-computed cases) and kernel against kernel
 * (CUDA vs CPU under tests/cuda_emu; saved vs recomputed and 1 vs 2 threads in tests/c), so they
 * are not duplicated here.
 */
#include "naive_ascender.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The epsilon constants of SPEC section 4, from the kernels' contract (csrc/ascender.h). */
#define EPS_TAU ASC_EPS_TAU
#define EPS_STD ASC_EPS_STD
#define EPS_NORM ASC_EPS_NORM

static double dot(const double *x, const double *y, int64_t n) {
    double s = 0.0;
    for (int64_t f = 0; f < n; f++) s += x[f] * y[f];
    return s;
}

/* ||x - y||^2, computed as a sum of squared differences (never negative). */
static double sqdist(const double *x, const double *y, int64_t n) {
    double s = 0.0;
    for (int64_t f = 0; f < n; f++) {
        const double t = x[f] - y[f];
        s += t * t;
    }
    return s;
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static double clamp01(double x) { return x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x); }

/* dst = src / max(||src||, 1e-12) for a vector of n elements. */
static void normalize(double *dst, const double *src, int64_t n) {
    const double nrm = sqrt(dot(src, src, n));
    const double den = nrm > EPS_NORM ? nrm : EPS_NORM;
    for (int64_t f = 0; f < n; f++) dst[f] = src[f] / den;
}

/*
 * Mean and standard deviation of row[j] over the j with set[j] != 0 (n of them).
 * Mean over an empty set is 0; the standard deviation is 0 when n <= 1. The
 * unbiased estimator divides by n - 1, the population one by n.
 */
static void row_moments(const double *row, const uint8_t *set, int64_t N, int64_t n,
                        int unbiased, double *mean, double *std) {
    double sum = 0.0, ss = 0.0;
    for (int64_t j = 0; j < N; j++)
        if (set[j]) sum += row[j];
    *mean = n > 0 ? sum / (double)n : 0.0;
    for (int64_t j = 0; j < N; j++)
        if (set[j]) ss += (row[j] - *mean) * (row[j] - *mean);
    *std = n > 1 ? sqrt(ss / (double)(unbiased ? n - 1 : n)) : 0.0;
}

/* All scratch of one (batch, head); every matrix is N x N, row i then column j. */
typedef struct head_scratch {
    uint8_t *J, *T;                 /* softmax set, statistics set */
    double *sbase, *aff, *D, *ws, *wc;
    double *ba, *bs, *bc;           /* raw biases beta^align, beta^sep, beta^coh */
    double *na, *ns, *nc;           /* row-normalized biases */
    double *S, *A;                  /* final scores, attention weights */
    double *kh, *hh;                /* normalized keys [N][d], semantic rows [N][da] */
    double *cen, *u, *tmp;          /* centroids [N][dz], headings [N][d], tmp [d] */
    int64_t *sel;                   /* neighbour list of one row [N] */
    uint8_t *taken;                 /* neighbour already chosen [N] */
} head_scratch;

static void scratch_free(head_scratch *s) {
    free(s->J); free(s->T);
    free(s->sbase); free(s->aff); free(s->D); free(s->ws); free(s->wc);
    free(s->ba); free(s->bs); free(s->bc);
    free(s->na); free(s->ns); free(s->nc);
    free(s->S); free(s->A);
    free(s->kh); free(s->hh); free(s->cen); free(s->u); free(s->tmp);
    free(s->sel); free(s->taken);
}

static int scratch_alloc(head_scratch *s, const asc_params *p) {
    const size_t N = (size_t)p->N, NN = N * N;
    memset(s, 0, sizeof(*s));
    s->J = calloc(NN, 1);
    s->T = calloc(NN, 1);
    s->sbase = calloc(NN, sizeof(double));
    s->aff = calloc(NN, sizeof(double));
    s->D = calloc(NN, sizeof(double));
    s->ws = calloc(NN, sizeof(double));
    s->wc = calloc(NN, sizeof(double));
    s->ba = calloc(NN, sizeof(double));
    s->bs = calloc(NN, sizeof(double));
    s->bc = calloc(NN, sizeof(double));
    s->na = calloc(NN, sizeof(double));
    s->ns = calloc(NN, sizeof(double));
    s->nc = calloc(NN, sizeof(double));
    s->S = calloc(NN, sizeof(double));
    s->A = calloc(NN, sizeof(double));
    s->kh = calloc(N * (size_t)p->d + 1, sizeof(double));
    s->hh = calloc(N * (size_t)p->da + 1, sizeof(double));
    s->cen = calloc(N * (size_t)p->dz + 1, sizeof(double));
    s->u = calloc(N * (size_t)p->d + 1, sizeof(double));
    s->tmp = calloc((size_t)p->d + 1, sizeof(double));
    s->sel = calloc(N + 1, sizeof(int64_t));
    s->taken = calloc(N + 1, 1);
    if (!s->J || !s->T || !s->sbase || !s->aff || !s->D || !s->ws || !s->wc || !s->ba ||
        !s->bs || !s->bc || !s->na || !s->ns || !s->nc || !s->S || !s->A || !s->kh ||
        !s->hh || !s->cen || !s->u || !s->tmp || !s->sel || !s->taken) {
        scratch_free(s);
        return 1;
    }
    return 0;
}

/* Everything of SPEC section 4 for one (batch b, head hd). */
static void naive_head(const asc_params *p, const naive_inputs *in, const naive_outputs *o,
                       head_scratch *s, int64_t b, int64_t hd) {
    const int64_t N = p->N, d = p->d, dv = p->dv, dz = p->dz, da = p->da;
    const int64_t bh = b * p->H + hd;
    const int paper = p->variant == ASC_VARIANT_PAPER;
    const double *q = in->q + bh * N * d, *k = in->k + bh * N * d;
    const double *v = in->v + bh * N * dv, *z = in->z + bh * N * dz;
    const double *h = in->h + bh * N * da;

    const double lam_a = in->lambda_align[hd], lam_s = in->lambda_sep[hd];
    const double lam_c = in->lambda_coh[hd];
    const double om_a = in->omega_align[hd], om_s = in->omega_sep[hd];
    const double om_c = in->omega_coh[hd];
    const double temp = in->score_temp[hd], delta = in->delta[hd], kappa = in->kappa[hd];

    /* ---- masks: J(i) and T(i) (SPEC section 3) ---- */
    for (int64_t i = 0; i < N; i++) {
        for (int64_t j = 0; j < N; j++) {
            int ok = 1;
            if (p->is_causal && j > i) ok = 0;
            if (in->key_padding_mask && in->key_padding_mask[b * N + j]) ok = 0;
            if (in->attn_mask &&
                !in->attn_mask[b * p->am_sb + hd * p->am_sh + i * p->am_si + j * p->am_sj])
                ok = 0;
            s->J[i * N + j] = (uint8_t)ok;
            s->T[i * N + j] = (uint8_t)(p->mask_stats ? ok : 1);
        }
    }

    /* ---- unit keys and semantic rows ---- */
    for (int64_t j = 0; j < N; j++) {
        normalize(s->kh + j * d, k + j * d, d);
        normalize(s->hh + j * da, h + j * da, da);
    }

    /* ---- pairwise matrices ---- */
    for (int64_t i = 0; i < N; i++) {
        for (int64_t j = 0; j < N; j++) {
            const int64_t ij = i * N + j;
            s->sbase[ij] = p->scale * dot(q + i * d, k + j * d, d);
            s->aff[ij] = dot(s->hh + i * da, s->hh + j * da, da);
            s->D[ij] = sqdist(z + i * dz, z + j * dz, dz);
            s->ws[ij] = exp(-s->D[ij] / (p->tau_sep + EPS_TAU));
            s->wc[ij] = exp(-s->D[ij] / (p->tau_coh + EPS_TAU));
        }
    }

    /* ---- per row: statistics, biases, scores, softmax, output ---- */
    for (int64_t i = 0; i < N; i++) {
        const uint8_t *Ti = s->T + i * N, *Ji = s->J + i * N;
        const double *wsi = s->ws + i * N, *wci = s->wc + i * N, *affi = s->aff + i * N;
        double *ci = s->cen + i * dz, *ui = s->u + i * d;
        int64_t nT = 0, nJ = 0;
        for (int64_t j = 0; j < N; j++) {
            nT += Ti[j];
            nJ += Ji[j];
        }

        /* density: reference includes the token itself, paper excludes it */
        double rho = 0.0;
        for (int64_t l = 0; l < N; l++)
            if (Ti[l] && !(paper && l == i)) rho += wsi[l];
        const double eta = clamp01(rho / (kappa + EPS_TAU));

        /* centroid c_i = sum_l wc_il z_l / (sum_l wc_il + 1e-6), l in T(i) */
        double wcsum = 0.0;
        for (int64_t l = 0; l < N; l++)
            if (Ti[l]) wcsum += wci[l];
        for (int64_t f = 0; f < dz; f++) {
            double acc = 0.0;
            for (int64_t l = 0; l < N; l++)
                if (Ti[l]) acc += wci[l] * z[l * dz + f];
            ci[f] = acc / (wcsum + EPS_TAU);
        }

        /* G_i: the wc-weighted mean squared distance to the centroid (stats COH_SPREAD) */
        double spread_c = 0.0;
        for (int64_t l = 0; l < N; l++)
            if (Ti[l]) spread_c += wci[l] * sqdist(z + l * dz, ci, dz);
        spread_c /= wcsum + EPS_TAU;

        /* neighbours, heading u_i and gates */
        int64_t cnt = 0;
        double gate_a = 1.0, gate_c = 1.0, unorm = 1.0;
        if (paper) {
            /* selection sort: repeatedly take the largest remaining affinity,
             * scanning upward with a strict '>' so that ties keep the lower index */
            memset(s->taken, 0, (size_t)N);
            while (cnt < p->k_neighbors) {
                int64_t best = -1;
                for (int64_t l = 0; l < N; l++) {
                    if (!Ti[l] || l == i || s->taken[l]) continue;
                    if (best < 0 || affi[l] > affi[best]) best = l;
                }
                if (best < 0) break;
                s->taken[best] = 1;
                s->sel[cnt++] = best;
            }
            /* u_i = normalize(sum of neighbour unit keys), 0 without neighbours or where they cancel */
            for (int64_t f = 0; f < d; f++) s->tmp[f] = 0.0;
            for (int64_t t = 0; t < cnt; t++)
                for (int64_t f = 0; f < d; f++) s->tmp[f] += s->kh[s->sel[t] * d + f];
            unorm = sqrt(dot(s->tmp, s->tmp, d));
            if (unorm > ASC_EPS_HEADING * (double)cnt) /* else the unit keys cancel: a zero heading */
                normalize(ui, s->tmp, d);
            else
                for (int64_t f = 0; f < d; f++) ui[f] = 0.0;
            /* gate_a: mean over N(i) of ||k^_l - mean_N k^||^2 (0 for empty N(i)) */
            double spread_a = 0.0;
            if (cnt > 0) {
                for (int64_t t = 0; t < cnt; t++) {
                    const double *kl = s->kh + s->sel[t] * d;
                    for (int64_t f = 0; f < d; f++) {
                        const double dev = kl[f] - s->tmp[f] / (double)cnt;
                        spread_a += dev * dev;
                    }
                }
                spread_a /= (double)cnt;
            }
            gate_a = sigmoid(p->alpha_align * spread_a);
            /* gate_c: wc-weighted mean squared distance to the centroid */
            gate_c = sigmoid(p->alpha_coh * spread_c);
        } else {
            for (int64_t f = 0; f < d; f++) ui[f] = s->kh[i * d + f];
        }

        /* raw bias rows, for every j (only j in T(i) are used below) */
        for (int64_t j = 0; j < N; j++) {
            const int64_t ij = i * N + j;
            const double *khj = s->kh + j * d;
            const double rel = affi[j] - delta;
            if (paper)
                s->ba[ij] = lam_a * gate_a * dot(khj, ui, d);
            else
                s->ba[ij] = lam_a * dot(s->kh + i * d, khj, d);
            s->bs[ij] = -lam_s * eta * (wsi[j] * (rel > 0.0 ? rel : 0.0));
            s->bc[ij] = lam_c * gate_c * (-sqdist(z + j * dz, ci, dz)) / (p->tau_coh + EPS_TAU);
        }

        /* row normalization over T(i); the whole row is 0 when |T(i)| <= 1 */
        const int unbiased = !paper;
        double mom[3][2];
        const double *raw[3] = {s->ba + i * N, s->bs + i * N, s->bc + i * N};
        double *nrm[3] = {s->na + i * N, s->ns + i * N, s->nc + i * N};
        for (int t = 0; t < 3; t++) {
            row_moments(raw[t], Ti, N, nT, unbiased, &mom[t][0], &mom[t][1]);
            for (int64_t j = 0; j < N; j++)
                nrm[t][j] = (nT > 1 && Ti[j]) ? (raw[t][j] - mom[t][0]) / (mom[t][1] + EPS_STD) : 0.0;
        }

        /* scores and softmax over J(i) */
        double *Si = s->S + i * N, *Ai = s->A + i * N;
        double mx = -INFINITY, lse = INFINITY;
        for (int64_t j = 0; j < N; j++) {
            Si[j] = s->sbase[i * N + j] + om_a * nrm[0][j] + om_s * nrm[1][j] + om_c * nrm[2][j];
            if (Ji[j] && Si[j] / (temp + EPS_TAU) > mx) mx = Si[j] / (temp + EPS_TAU);
        }
        if (nJ > 0) {
            double sum = 0.0;
            for (int64_t j = 0; j < N; j++)
                if (Ji[j]) sum += exp(Si[j] / (temp + EPS_TAU) - mx);
            lse = mx + log(sum);
        }
        for (int64_t j = 0; j < N; j++)
            Ai[j] = (nJ > 0 && Ji[j]) ? exp(Si[j] / (temp + EPS_TAU) - lse) : 0.0;

        /* ---- conditioning diagnostics (see naive_ascender.h) ---- */
        double scl[3] = {0.0, 0.0, 0.0}, zsc = 0.0;
        const double cnorm = sqrt(dot(ci, ci, dz)), unrm = sqrt(dot(ui, ui, d));
        for (int64_t j = 0; j < N; j++) {
            if (!Ti[j]) continue;
            const double zn = sqrt(dot(z + j * dz, z + j * dz, dz)) + cnorm;
            const double t_a = fabs(lam_a) * gate_a * unrm * sqrt(dot(s->kh + j * d, s->kh + j * d, d));
            /* an inactive relu (a_ij <= delta) gives an exact 0, whatever the rounding */
            const double t_s = affi[j] > delta ? fabs(lam_s) * eta * wsi[j] * (fabs(affi[j]) + fabs(delta)) : 0.0;
            const double t_c = fabs(lam_c) * gate_c * zn * zn / (p->tau_coh + EPS_TAU);
            if (t_a > scl[0]) scl[0] = t_a;
            if (t_s > scl[1]) scl[1] = t_s;
            if (t_c > scl[2]) scl[2] = t_c;
            if (zn * zn > zsc) zsc = zn * zn;
        }
        const double om_abs[3] = {fabs(om_a), fabs(om_s), fabs(om_c)};
        double cond = 0.0;
        if (nT > 1)
            for (int t = 0; t < 3; t++) cond += om_abs[t] * scl[t] / (mom[t][1] + EPS_STD);
        cond /= fabs(temp + EPS_TAU);

        /* ---- write the outputs of row i ---- */
        const int64_t row = bh * N + i;
        if (o->bias_scale) memcpy(o->bias_scale + row * 3, scl, sizeof(scl));
        if (o->cond) o->cond[row] = cond;
        if (o->zscale) o->zscale[row] = zsc;
        if (o->out)
            for (int64_t f = 0; f < dv; f++) {
                double acc = 0.0;
                for (int64_t j = 0; j < N; j++) acc += Ai[j] * v[j * dv + f];
                o->out[row * dv + f] = acc;
            }
        if (o->stats) {
            double *st = o->stats + row * ASC_NSTAT;
            st[ASC_STAT_LSE] = lse;
            st[ASC_STAT_MEAN_A] = mom[0][0]; st[ASC_STAT_STD_A] = mom[0][1];
            st[ASC_STAT_MEAN_S] = mom[1][0]; st[ASC_STAT_STD_S] = mom[1][1];
            st[ASC_STAT_MEAN_C] = mom[2][0]; st[ASC_STAT_STD_C] = mom[2][1];
            st[ASC_STAT_RHO] = rho;
            st[ASC_STAT_WC_SUM] = wcsum;
            st[ASC_STAT_GATE_A] = gate_a;
            st[ASC_STAT_GATE_C] = gate_c;
            st[ASC_STAT_UNORM] = unorm;
            st[ASC_STAT_COUNT] = (double)nT;
            st[ASC_STAT_COH_SPREAD] = spread_c;
        }
        if (o->u) memcpy(o->u + row * d, ui, sizeof(double) * (size_t)d);
        if (o->c) memcpy(o->c + row * dz, ci, sizeof(double) * (size_t)dz);
        if (o->nbr)
            for (int64_t t = 0; t < p->n_nbr; t++) o->nbr[row * p->n_nbr + t] = t < cnt ? s->sel[t] : -1;
        if (o->map_sbase) memcpy(o->map_sbase + row * N, s->sbase + i * N, sizeof(double) * (size_t)N);
        if (o->map_align) memcpy(o->map_align + row * N, nrm[0], sizeof(double) * (size_t)N);
        if (o->map_sep) memcpy(o->map_sep + row * N, nrm[1], sizeof(double) * (size_t)N);
        if (o->map_coh) memcpy(o->map_coh + row * N, nrm[2], sizeof(double) * (size_t)N);
        if (o->map_attn) memcpy(o->map_attn + row * N, Ai, sizeof(double) * (size_t)N);
    }
}

int naive_ascender_fwd(const asc_params *p, const naive_inputs *in, const naive_outputs *o) {
    head_scratch s;
    if (p->N == 0 || p->B * p->H == 0) return 0;
    if (scratch_alloc(&s, p)) return 1;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t hd = 0; hd < p->H; hd++) naive_head(p, in, o, &s, b, hd);
    scratch_free(&s);
    return 0;
}
