/*
 * magnitude_fwd_impl.h -- generic body of the Magnitude Attention forward, compiled once per
 * element type through instantiate.h (SCALAR, SEXP, FN). No include guard on purpose.
 */

#include "vec_impl.h"
#include "magnitude_cg_impl.h"

int FN(magnitude_fwd)(const mag_params *p, const mag_fwd_args *a) {
    const int64_t N = p->N, BH = p->B * p->H, dv = p->dv;
    FN(mag_state) st;
    int failed = 0;
    if (N == 0 || BH == 0) return 0;
    if (FN(mag_state_alloc)(&st, p, 0)) return 1;

    #pragma omp parallel
    {
        SCALAR *D = malloc(sizeof(SCALAR) * (size_t)N), *Z = malloc(sizeof(SCALAR) * (size_t)N);
        double *acc = malloc(sizeof(double) * (size_t)(dv + 1));
        const int stop = asc_team_failed(&failed, !D || !Z || !acc);
        for (int64_t bh = 0; !stop && bh < BH; bh++) {
            FN(mag_solve)(&st, p, a, bh, 0, D, Z);
            #pragma omp for schedule(static)
            for (int64_t i = 0; i < N * (dv > 0); i++) { /* dv = 0: only mu is wanted (a value gate) */
                const double lsum = FN(mag_row_softmax)(&st, p, (const SCALAR *)a->q + (bh * N + i) * p->d, D, Z);
                #pragma omp simd
                for (int64_t j = 0; j < N; j++) Z[j] *= st.gate[j]; /* e_j g_j */
                FN(asc_weighted_rows)(acc, Z, (const SCALAR *)a->v + bh * N * dv, st.valid, N, dv);
                SCALAR *out = (SCALAR *)a->out + (bh * N + i) * dv;
                /* lsum >= 1 with a valid key, unless a NaN made it NaN: then the row is NaN */
                for (int64_t f = 0; f < dv; f++) out[f] = (SCALAR)(st.n_valid > 0 ? acc[f] / lsum : 0.0);
            }
            #pragma omp single
            memcpy((SCALAR *)a->mu + bh * N, st.mu, sizeof(SCALAR) * (size_t)N);
        }
        free(D);
        free(Z);
        free(acc);
    }
    FN(mag_state_free)(&st);
    return failed;
}
