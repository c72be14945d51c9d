/*
 * magnitude_cg_impl.h -- the truncated conjugate-gradient solve of Magnitude Attention,
 * shared by its forward and backward. Generic over SCALAR / SEXP / FN; included by
 * the magnitude implementation headers after vec_impl.h. No include guard on purpose.
 *
 * Per (batch, head) the keys are transposed into kT [d][N]; every product with
 * A = Zm + eps I streams over key pairs (one length-N row of distances per thread, O(N)),
 * never materializing Zm. The CG vectors are double. Functions marked "team" are called by
 * every thread of an OpenMP team and end with a barrier.
 */

/* machine epsilon of SCALAR: the solve stops once rho = r.r <= MAG_EPS^2 rho_0 */
#undef MAG_EPS
#define MAG_EPS (sizeof(SCALAR) == sizeof(float) ? (double)FLT_EPSILON : DBL_EPSILON)

typedef struct FN(mag_state) {
    SCALAR *kT, *vT;        /* [d][N]; [dv][N] (backward only, else NULL) */
    uint8_t *valid;         /* [N]: not padding */
    int64_t n_valid;
    double t;               /* softplus(t_raw) */
    double *x, *r, *p, *w;  /* CG vectors [N] */
    double *P, *W, *R;      /* history [n_iter][N]: p_it, A p_it, r_{it+1} (backward only) */
    double *alpha, *beta, *rho, *sigma; /* [n_iter + 1] */
    int64_t n_done;         /* CG steps taken (<= n_iter) */
    int active;
    SCALAR *mu, *gate;      /* [N] */
} FN(mag_state);

static void FN(mag_state_free)(FN(mag_state) *st) {
    free(st->kT); free(st->vT); free(st->valid); free(st->x); free(st->r); free(st->p); free(st->w);
    free(st->P); free(st->W); free(st->R); free(st->alpha); free(st->beta); free(st->rho); free(st->sigma);
    free(st->mu); free(st->gate);
}

static int FN(mag_state_alloc)(FN(mag_state) *st, const mag_params *p, int backward) {
    const size_t N = (size_t)p->N, it = asc_add((size_t)p->n_iter, 1);
    memset(st, 0, sizeof(*st));
    st->kT = malloc(sizeof(SCALAR) * N * (size_t)(p->d ? p->d : 1));
    st->vT = backward ? malloc(sizeof(SCALAR) * N * (size_t)(p->dv ? p->dv : 1)) : NULL;
    st->valid = malloc(N);
    st->x = malloc(sizeof(double) * N);
    st->r = malloc(sizeof(double) * N);
    st->p = malloc(sizeof(double) * N);
    st->w = malloc(sizeof(double) * N);
    const size_t history = asc_mul(asc_mul(sizeof(double), N), backward ? it : 1);
    st->P = malloc(history);
    st->W = malloc(history);
    st->R = malloc(history);
    st->alpha = malloc(asc_mul(sizeof(double), it));
    st->beta = malloc(asc_mul(sizeof(double), it));
    st->rho = malloc(asc_mul(sizeof(double), it));
    st->sigma = malloc(asc_mul(sizeof(double), it));
    st->mu = malloc(sizeof(SCALAR) * N);
    st->gate = malloc(sizeof(SCALAR) * N);
    if (st->kT && (st->vT || !backward) && st->valid && st->x && st->r && st->p && st->w && st->P && st->W &&
        st->R && st->alpha && st->beta && st->rho && st->sigma && st->mu && st->gate)
        return 0;
    FN(mag_state_free)(st);
    return 1;
}

static inline double FN(mag_dot)(const double *x, const double *y, int64_t n) {
    double s = 0.0;
    #pragma omp simd reduction(+:s)
    for (int64_t j = 0; j < n; j++) s += x[j] * y[j];
    return s;
}

/* team: out = (Zm + eps I) in over the valid keys (0 at padding). D, Z: thread rows [N]. */
static void FN(mag_matvec)(const FN(mag_state) *st, const mag_params *p, const SCALAR *kb, const double *in,
                           double *out, SCALAR *D, SCALAR *Z) {
    const int64_t N = p->N, d = p->d;
    const SCALAR c = (SCALAR)(-st->t / (double)(d ? d : 1));
    #pragma omp for schedule(static)
    for (int64_t j = 0; j < N; j++) {
        if (!st->valid[j]) { out[j] = 0.0; continue; }
        FN(asc_sqdist_cols)(D, kb + j * d, st->kT, N, d, N);
        #pragma omp simd
        for (int64_t l = 0; l < N; l++) Z[l] = st->valid[l] ? SEXP(D[l] * c) : (SCALAR)0;
        double acc = 0.0;
        #pragma omp simd reduction(+:acc)
        for (int64_t l = 0; l < N; l++) acc += (double)Z[l] * in[l];
        out[j] = acc + p->eps * in[j];
    }
}

/* team: prepares (b, h) = bh and runs the unrolled CG; with history (backward) it keeps
 * p_it, A p_it and r_{it+1}. Ends with mu and the gates filled. */
static void FN(mag_solve)(FN(mag_state) *st, const mag_params *p, const mag_fwd_args *a, int64_t bh,
                          int history, SCALAR *D, SCALAR *Z) {
    const int64_t N = p->N, d = p->d, b = bh / p->H, hd = bh % p->H;
    const SCALAR *kb = (const SCALAR *)a->k + bh * N * d;
    FN(asc_transpose)(st->kT, kb, N, d);
    if (st->vT) FN(asc_transpose)(st->vT, (const SCALAR *)a->v + bh * N * p->dv, N, p->dv);
    #pragma omp barrier /* the transposes are nowait: the single below overwrites padded columns */
    #pragma omp single
    {
        const double tr = ((const SCALAR *)a->t_raw)[hd];
        st->t = tr > 30.0 ? tr : log1p(exp(tr)); /* softplus */
        st->n_valid = 0;
        for (int64_t j = 0; j < N; j++) {
            st->valid[j] = a->key_padding_mask ? !a->key_padding_mask[b * N + j] : 1;
            st->n_valid += st->valid[j];
            st->x[j] = 0.0;
            st->r[j] = st->valid[j] ? 1.0 : 0.0;
            st->p[j] = st->r[j];
        }
        st->rho[0] = (double)st->n_valid;
        st->n_done = 0;
        st->active = st->n_valid > 0;
        /* a padded key's column reads as 0 in every product over key columns, so that a NaN in it
           is skipped rather than multiplied by a zero weight (SPEC section 11) */
        for (int64_t j = 0; j < N; j++) {
            if (st->valid[j]) continue;
            for (int64_t f = 0; f < d; f++) st->kT[f * N + j] = 0;
            if (st->vT)
                for (int64_t f = 0; f < p->dv; f++) st->vT[f * N + j] = 0;
        }
    } /* implicit barrier: kT, valid and the vectors are ready */
    for (int64_t it = 0; it < p->n_iter; it++) {
        if (!st->active) break; /* the same shared value for every thread */
        FN(mag_matvec)(st, p, kb, st->p, st->w, D, Z);
        #pragma omp single
        {
            const double rho = st->rho[it], sigma = FN(mag_dot)(st->p, st->w, N);
            const double floor = MAG_EPS * MAG_EPS * st->rho[0];
            if (rho <= floor || sigma <= 0.0) {
                st->active = 0; /* converged to rounding, or degenerate: stop for good (a NaN from a
                                   non-finite key goes on, so that it reaches mu: SPEC section 11) */
            } else {
                const double alpha = rho / sigma;
                if (history) {
                    memcpy(st->P + it * N, st->p, sizeof(double) * (size_t)N);
                    memcpy(st->W + it * N, st->w, sizeof(double) * (size_t)N);
                }
                for (int64_t j = 0; j < N; j++) {
                    st->x[j] += alpha * st->p[j];
                    st->r[j] -= alpha * st->w[j];
                }
                const double rho1 = FN(mag_dot)(st->r, st->r, N), beta = rho1 / rho;
                for (int64_t j = 0; j < N; j++) st->p[j] = st->r[j] + beta * st->p[j];
                if (history) memcpy(st->R + it * N, st->r, sizeof(double) * (size_t)N);
                st->alpha[it] = alpha;
                st->beta[it] = beta;
                st->sigma[it] = sigma;
                st->rho[it + 1] = rho1;
                st->n_done = it + 1;
            }
        }
    }
    #pragma omp single
    {
        const double bg = ((const SCALAR *)a->beta)[hd], gg = ((const SCALAR *)a->gamma)[hd];
        for (int64_t j = 0; j < N; j++) {
            st->mu[j] = st->valid[j] ? (SCALAR)st->x[j] : (SCALAR)0;
            st->gate[j] = (SCALAR)asc_sigmoid(bg * (double)st->mu[j] + gg);
        }
    }
}

/* One attention row: scores s_j = scale q_i.k_j over the valid keys, e_j = exp(s_j - max) (0 at
 * padding); returns sum_j e_j (0 when no key is valid). s, e: thread rows [N]. */
static double FN(mag_row_softmax)(const FN(mag_state) *st, const mag_params *p, const SCALAR *qi, SCALAR *s,
                                  SCALAR *e) {
    const int64_t N = p->N;
    FN(asc_gemv_cols)(s, qi, NULL, NULL, st->kT, N, p->d, N);
    double mx = -INFINITY;
    #pragma omp simd reduction(max:mx)
    for (int64_t j = 0; j < N; j++) {
        s[j] = (SCALAR)(p->scale * s[j]);
        mx = (st->valid[j] && s[j] > mx) ? s[j] : mx;
    }
    if (st->n_valid == 0) {
        for (int64_t j = 0; j < N; j++) e[j] = 0;
        return 0.0;
    }
    #pragma omp simd
    for (int64_t j = 0; j < N; j++) {
        const SCALAR ej = SEXP((SCALAR)(s[j] - mx));
        e[j] = st->valid[j] ? ej : (SCALAR)0;
    }
    return FN(asc_sum)(e, N);
}
