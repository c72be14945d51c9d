/*
 * ascender_fwd_impl.h -- generic body of the CPU forward, compiled once per element type
 * through instantiate.h (SCALAR, SEXP, FN). No include guard on purpose. The row state is computed by asc_row_forward; this file
 * writes the outputs: y_i = sum_j e_ij v_j / sum_j e_ij, the saved statistics and the maps.
 */

#include "vec_impl.h"
#include "ascender_row_impl.h"

/* Writes the outputs of row i from its forward state. */
ASC_HOT static void FN(asc_row_outputs)(const asc_params *p, const asc_fwd_args *a, const FN(asc_rowstate) *r,
                                        double *acc, int64_t b, int64_t hd) {
    const int64_t N = p->N, dv = p->dv, jend = r->jend;
    const int64_t bh = b * p->H + hd, row = bh * p->Nq + r->i;
    SCALAR *out = (SCALAR *)a->out + row * dv;
    SCALAR *st = (SCALAR *)a->stats + row * ASC_NSTAT;

    FN(asc_weighted_rows)(acc, r->e, (const SCALAR *)a->v + bh * N * dv, jend, dv);
    for (int64_t f = 0; f < dv; f++) out[f] = (SCALAR)(r->n_soft > 0 ? acc[f] / r->lsum : 0.0);

    st[ASC_STAT_LSE] = (SCALAR)r->lse;
    st[ASC_STAT_MEAN_A] = (SCALAR)r->mean[0]; st[ASC_STAT_STD_A] = (SCALAR)r->std[0];
    st[ASC_STAT_MEAN_S] = (SCALAR)r->mean[1]; st[ASC_STAT_STD_S] = (SCALAR)r->std[1];
    st[ASC_STAT_MEAN_C] = (SCALAR)r->mean[2]; st[ASC_STAT_STD_C] = (SCALAR)r->std[2];
    st[ASC_STAT_RHO] = (SCALAR)r->rho;
    st[ASC_STAT_WC_SUM] = (SCALAR)r->wsum;
    st[ASC_STAT_GATE_A] = (SCALAR)r->gate_a; st[ASC_STAT_GATE_C] = (SCALAR)r->gate_c;
    st[ASC_STAT_UNORM] = (SCALAR)r->unorm;
    st[ASC_STAT_COUNT] = (SCALAR)r->n_stat;
    if (a->aux) {
        double aux[2];
        FN(asc_row_aux)(a, r, hd, aux);
        ((SCALAR *)a->aux)[row * 2] = (SCALAR)aux[0];
        ((SCALAR *)a->aux)[row * 2 + 1] = (SCALAR)aux[1];
    }
    memcpy((SCALAR *)a->u + row * p->d, r->u, sizeof(SCALAR) * p->d);
    memcpy((SCALAR *)a->c + row * p->dz, r->c, sizeof(SCALAR) * p->dz);
    for (int64_t t = 0; t < p->n_nbr; t++) a->nbr[row * p->n_nbr + t] = t < r->cnt ? r->nbr[t] : -1;

    if (a->map_attn) {
        const int64_t o = row * N;
        SCALAR *m_sb = (SCALAR *)a->map_sbase + o, *m_p = (SCALAR *)a->map_attn + o;
        SCALAR *m_b[3] = {(SCALAR *)a->map_align + o, (SCALAR *)a->map_sep + o, (SCALAR *)a->map_coh + o};
        const int norm_on = r->n_stat > 1;
        for (int64_t j = 0; j < N; j++) {
            m_sb[j] = r->s[j];
            for (int t = 0; t < 3; t++)
                m_b[t][j] = (norm_on && r->instat[j])
                                ? (SCALAR)(((double)r->bias[t][j] - r->mean[t]) / (r->std[t] + ASC_EPS_STD))
                                : 0;
            m_p[j] = r->n_soft > 0 ? (SCALAR)((double)r->e[j] / r->lsum) : 0;
        }
    }
}

int FN(ascender_fwd)(const asc_params *p, const asc_fwd_args *a) {
    const int64_t N = p->N, BH = p->B * p->H;
    const int all_keys = a->map_attn != NULL;
    int failed = 0;
    FN(asc_shared) sh;
    FN(asc_rowstate) layout;
    asc_arena measure = {NULL, 0};
    if (N == 0 || p->Nq == 0 || BH == 0) return 0;
    FN(asc_rowstate_layout)(&layout, &measure, p);
    const size_t row_bytes = measure.off + sizeof(double) * (size_t)(p->dv + 1);
    if (FN(asc_shared_alloc)(&sh, p, 0)) return 1;

    #pragma omp parallel
    {
        FN(asc_rowstate) r;
        asc_arena ar = {asc_arena_alloc(row_bytes), 0};
        double *acc = NULL;
        if (ar.base) {
            FN(asc_rowstate_layout)(&r, &ar, p);
            acc = asc_take(&ar, sizeof(double) * (size_t)(p->dv + 1));
        }
        const int stop = asc_team_failed(&failed, ar.base == NULL);
        for (int64_t bh = 0; !stop && bh < BH; bh++) {
            const int64_t b = bh / p->H, hd = bh % p->H;
            FN(asc_shared_fill)(&sh, p, a, bh);
            #pragma omp for schedule(dynamic, 8)
            for (int64_t i = 0; i < p->Nq; i++) {
                FN(asc_row_forward)(p, a, &sh, &r, b, hd, i, all_keys);
                FN(asc_row_outputs)(p, a, &r, acc, b, hd);
            }
            /* the loop's implicit barrier protects the shared scratch */
        }
        free(ar.base);
    }
    FN(asc_shared_free)(&sh);
    return failed;
}
