/*
 * magnitude_bwd_impl.h -- generic body of the Magnitude Attention backward (docs/magnitude.md),
 * compiled once per element type through instantiate.h (SCALAR, SEXP, FN). No include guard
 * on purpose.
 *
 * Per (batch, head): (1) the CG solve again, keeping its O(n_iter N) history; (2) attention
 * rows: dq_i, and per-thread column sums of dk (scores) and dv' = sum_i A_ij dy_i;
 * (3) per key: dv = gate dv', the gate's gradient -> dmu, dbeta, dgamma; (4) the CG steps in
 * reverse, one product with A per step; (5) one pass over key pairs turning
 * dA = sum_it dw_it p_it^T into dk and dt without forming it.
 */

#include "vec_impl.h"
#include "magnitude_cg_impl.h"

/* Per-thread buffers. */
typedef struct FN(mag_thread) {
    SCALAR *s, *e, *t;  /* [N] rows */
    double *acc;        /* max(d, dv) */
    double dp[3];       /* this thread's sums for t, beta, gamma */
} FN(mag_thread);

/* Whether any output of (batch, head) bh has an upstream gradient (a nonzero dy entry, or dmu at a
 * valid key). Without one, every gradient of bh is exactly 0, and bh is skipped: a NaN in its
 * inputs then stays out of the gradients of a loss over other heads and batches (SPEC section 11). */
static int FN(mag_pulled)(const mag_params *p, const mag_bwd_args *ba, int64_t bh) {
    const int64_t N = p->N, dv = p->dv, b = bh / p->H;
    const SCALAR *dy = (const SCALAR *)ba->grad_out + bh * N * dv;
    for (int64_t x = 0; x < N * dv; x++)
        if (dy[x] != 0) return 1;
    if (ba->grad_mu)
        for (int64_t j = 0; j < N; j++)
            if (((const SCALAR *)ba->grad_mu)[bh * N + j] != 0 &&
                !(ba->in.key_padding_mask && ba->in.key_padding_mask[b * N + j]))
                return 1;
    return 0;
}

int FN(magnitude_bwd)(const mag_params *p, const mag_bwd_args *ba) {
    const mag_fwd_args *a = &ba->in;
    const int64_t N = p->N, BH = p->B * p->H, H = p->H, d = p->d, dv = p->dv;
    const int nthr_max = omp_get_max_threads();
    const size_t cols = (size_t)N * (size_t)(d + dv);
    FN(mag_state) st;
    int failed = 0, nthr = 1;
    SCALAR *dpar = (SCALAR *)ba->dparams;
    for (int64_t t = 0; t < 3 * H; t++) dpar[t] = 0;
    if (N == 0 || BH == 0) return 0;
    SCALAR *gbase = malloc(sizeof(SCALAR) * cols * (size_t)nthr_max + 1);
    double *dmu = malloc(sizeof(double) * (size_t)N), *dx = malloc(sizeof(double) * (size_t)N);
    double *dr = malloc(sizeof(double) * (size_t)N), *dp = malloc(sizeof(double) * (size_t)N);
    double *dw = malloc(sizeof(double) * (size_t)N), *adw = malloc(sizeof(double) * (size_t)N);
    double *dW = malloc(asc_mul(asc_mul(sizeof(double), (size_t)N), asc_add((size_t)p->n_iter, 1)));
    double *dsum = calloc((size_t)nthr_max * 3 * (size_t)H, sizeof(double));
    if (!gbase || !dmu || !dx || !dr || !dp || !dw || !adw || !dW || !dsum || FN(mag_state_alloc)(&st, p, 1)) {
        free(gbase); free(dmu); free(dx); free(dr); free(dp); free(dw); free(adw); free(dW); free(dsum);
        return 1;
    }

    #pragma omp parallel
    {
        const int tid = omp_get_thread_num();
        FN(mag_thread) th;
        th.s = malloc(sizeof(SCALAR) * (size_t)N);
        th.e = malloc(sizeof(SCALAR) * (size_t)N);
        th.t = malloc(sizeof(SCALAR) * (size_t)N);
        th.acc = malloc(sizeof(double) * (size_t)(d + dv + 1));
        SCALAR *gk = gbase + (size_t)tid * cols, *gv = gk + (size_t)N * (size_t)d;
        const int stop = asc_team_failed(&failed, !th.s || !th.e || !th.t || !th.acc);
        #pragma omp single
        nthr = omp_get_num_threads();
        for (int64_t bh = 0; !stop && bh < BH; bh++) {
            const int64_t hd = bh % H;
            const SCALAR *qb = (const SCALAR *)a->q + bh * N * d, *kb = (const SCALAR *)a->k + bh * N * d;
            const SCALAR *vb = (const SCALAR *)a->v + bh * N * dv;
            const SCALAR *dyb = (const SCALAR *)ba->grad_out + bh * N * dv;
            double *mine = dsum + ((size_t)tid * H + hd) * 3;
            if (!FN(mag_pulled)(p, ba, bh)) { /* the same answer on every thread */
                #pragma omp for schedule(static)
                for (int64_t j = 0; j < N; j++) {
                    memset((SCALAR *)ba->dq + (bh * N + j) * d, 0, sizeof(SCALAR) * (size_t)d);
                    memset((SCALAR *)ba->dk + (bh * N + j) * d, 0, sizeof(SCALAR) * (size_t)d);
                    memset((SCALAR *)ba->dv + (bh * N + j) * dv, 0, sizeof(SCALAR) * (size_t)dv);
                }
                continue;
            }
            memset(gk, 0, sizeof(SCALAR) * cols);

            /* (1) the solve, with history */
            FN(mag_solve)(&st, p, a, bh, 1, th.s, th.e);

            /* (2) attention rows */
            #pragma omp for schedule(static)
            for (int64_t i = 0; i < N; i++) {
                SCALAR *dq = (SCALAR *)ba->dq + (bh * N + i) * d;
                const SCALAR *dy = dyb + i * dv, *qi = qb + i * d;
                for (int64_t f = 0; f < d; f++) dq[f] = 0;
                if (dv == 0) continue; /* only mu was used: no attention term */
                int pulled = 0;
                for (int64_t f = 0; f < dv; f++) pulled |= dy[f] != 0;
                if (!pulled) continue; /* no upstream gradient: the row adds exactly 0 (and keeps a NaN
                                          of its own query out of the other rows' gradients) */
                const double lsum = FN(mag_row_softmax)(&st, p, qi, th.s, th.e);
                if (lsum <= 0.0) continue;
                const SCALAR inv = (SCALAR)(1.0 / lsum);
                SCALAR *A = th.e, *dS = th.s;
                FN(asc_gemv_cols)(th.t, dy, NULL, NULL, st.vT, N, dv, N); /* dy.v_j */
                double P = 0.0;
                #pragma omp simd reduction(+:P)
                for (int64_t j = 0; j < N; j++) {
                    A[j] *= inv;
                    th.t[j] *= st.gate[j]; /* dA_j = dy.(g_j v_j) */
                    P += (double)A[j] * th.t[j];
                }
                #pragma omp simd
                for (int64_t j = 0; j < N; j++) dS[j] = A[j] * (th.t[j] - (SCALAR)P);
                FN(asc_weighted_rows)(th.acc, dS, kb, st.valid, N, d);
                for (int64_t f = 0; f < d; f++) dq[f] = (SCALAR)(p->scale * th.acc[f]);
                for (int64_t j = 0; j < N; j++) {
                    if (dS[j] != 0) {
                        const SCALAR c = (SCALAR)(p->scale * dS[j]);
                        #pragma omp simd
                        for (int64_t f = 0; f < d; f++) gk[j * d + f] += c * qi[f];
                    }
                    if (A[j] != 0) {
                        #pragma omp simd
                        for (int64_t f = 0; f < dv; f++) gv[j * dv + f] += A[j] * dy[f];
                    }
                }
            }

            /* (3) per key: sum the threads' columns; the gate's gradient */
            {
                const double bg = ((const SCALAR *)a->beta)[hd];
                double s_beta = 0.0, s_gamma = 0.0;
                #pragma omp for schedule(static)
                for (int64_t j = 0; j < N; j++) {
                    SCALAR *dk = (SCALAR *)ba->dk + (bh * N + j) * d, *dvo = (SCALAR *)ba->dv + (bh * N + j) * dv;
                    double dgate = 0.0;
                    for (int64_t f = 0; f < d; f++) dk[f] = 0;
                    for (int64_t f = 0; f < dv; f++) th.acc[f] = 0.0;
                    for (int t = 0; t < nthr; t++) {
                        const SCALAR *tk = gbase + (size_t)t * cols, *tv = tk + (size_t)N * (size_t)d;
                        for (int64_t f = 0; f < d; f++) dk[f] += tk[j * d + f];
                        for (int64_t f = 0; f < dv; f++) th.acc[f] += tv[j * dv + f];
                    }
                    const double g = st.gate[j];
                    for (int64_t f = 0; f < dv; f++) {
                        dvo[f] = (SCALAR)(g * th.acc[f]);
                        dgate += th.acc[f] * (double)vb[j * dv + f];
                    }
                    const double dz = st.valid[j] ? dgate * g * (1.0 - g) : 0.0;
                    const double dmu_out = (ba->grad_mu && st.valid[j]) ? ((const SCALAR *)ba->grad_mu)[bh * N + j] : 0.0;
                    dmu[j] = bg * dz + dmu_out; /* through the gate, and a loss on mu itself */
                    s_beta += dz * (double)st.mu[j];
                    s_gamma += dz;
                }
                mine[1] += s_beta;
                mine[2] += s_gamma;
            }

            /* (4) the CG steps in reverse (docs/magnitude.md) */
            #pragma omp single
            {
                for (int64_t j = 0; j < N; j++) { dx[j] = dmu[j]; dr[j] = 0.0; dp[j] = 0.0; }
            }
            double drho = 0.0; /* adjoint of rho_{it+1}; every thread keeps the same value */
            for (int64_t it = st.n_done - 1; it >= 0; it--) {
                const double *Pi = st.P + it * N, *Wi = st.W + it * N, *Ri = st.R + it * N;
                const double al = st.alpha[it], be = st.beta[it], rho0 = st.rho[it], rho1 = st.rho[it + 1];
                const double sg = st.sigma[it];
                /* scalar adjoints, computed identically by every thread from shared vectors */
                const double dB = FN(mag_dot)(dp, Pi, N);
                double drho0 = -dB * rho1 / (rho0 * rho0);
                drho += dB / rho0;
                #pragma omp barrier
                #pragma omp single
                {
                    for (int64_t j = 0; j < N; j++) dr[j] += dp[j] + 2.0 * drho * Ri[j];
                }
                double dal = -FN(mag_dot)(dr, Wi, N) + FN(mag_dot)(dx, Pi, N);
                drho0 += dal / sg;
                const double dsg = -dal * rho0 / (sg * sg);
                #pragma omp barrier
                #pragma omp single
                {
                    for (int64_t j = 0; j < N; j++) {
                        dw[j] = -al * dr[j] + dsg * Pi[j];
                        dp[j] = be * dp[j] + al * dx[j] + dsg * Wi[j];
                    }
                    memcpy(dW + it * N, dw, sizeof(double) * (size_t)N);
                }
                FN(mag_matvec)(&st, p, kb, dw, adw, th.s, th.e);
                #pragma omp single
                {
                    for (int64_t j = 0; j < N; j++) dp[j] += adw[j];
                }
                drho = drho0;
            }

            /* (5) key pairs: dk_j += 2 sum_l c_jl (k_j - k_l), c_jl = Zm_jl (-t/d) (G_jl + G_lj),
             * G = sum_it dw_it p_it^T; dt = sum_jl G_jl Zm_jl (-D_jl / d) */
            {
                const double t = st.t, id = 1.0 / (double)(d ? d : 1);
                const SCALAR c = (SCALAR)(-t * id);
                double s_t = 0.0;
                #pragma omp for schedule(static)
                for (int64_t j = 0; j < N; j++) {
                    if (!st.valid[j] || st.n_done == 0) continue;
                    FN(asc_sqdist_cols)(th.s, kb + j * d, st.kT, N, d, N);
                    double csum = 0.0;
                    for (int64_t l = 0; l < N; l++) {
                        if (!st.valid[l]) { th.t[l] = 0; continue; }
                        double g = 0.0;
                        for (int64_t it = 0; it < st.n_done; it++)
                            g += dW[it * N + j] * st.P[it * N + l] + st.P[it * N + j] * dW[it * N + l];
                        const double z = (double)SEXP(th.s[l] * c);
                        s_t += 0.5 * g * z * (-(double)th.s[l] * id);
                        const double cjl = z * (-t * id) * g;
                        th.t[l] = (SCALAR)cjl;
                        csum += cjl;
                    }
                    FN(asc_weighted_rows)(th.acc, th.t, kb, st.valid, N, d);
                    SCALAR *dk = (SCALAR *)ba->dk + (bh * N + j) * d;
                    for (int64_t f = 0; f < d; f++)
                        dk[f] += (SCALAR)(2.0 * ((double)kb[j * d + f] * csum - th.acc[f]));
                }
                const double tr = ((const SCALAR *)a->t_raw)[hd];
                mine[0] += s_t * (1.0 / (1.0 + exp(-tr))); /* d softplus / d t_raw = sigmoid */
            }
            #pragma omp barrier
        }
        free(th.s); free(th.e); free(th.t); free(th.acc);
    }
    for (int64_t hd = 0; hd < H; hd++)
        for (int s = 0; s < 3; s++) {
            double total = 0.0;
            for (int t = 0; t < nthr; t++) total += dsum[((size_t)t * H + hd) * 3 + s];
            dpar[s * H + hd] = (SCALAR)total;
        }
    FN(mag_state_free)(&st);
    free(gbase); free(dmu); free(dx); free(dr); free(dp); free(dw); free(adw); free(dW); free(dsum);
    return failed;
}
