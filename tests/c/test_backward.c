/*
 * test_backward.c -- checks the fused CPU backward (ascender_bwd_f64 / _f32) against
 * central finite differences of the fused forward (ascender_fwd_f64). No torch.
 *
 * For every case (small random problem, fixed seed):
 *   L(q, k, v, z, h, scalars) = sum_{b,h,i,f} G[b,h,i,f] y[b,h,i,f]
 * for a fixed random G, so dL/dy = G is the backward's grad_out.
 *  1. ascender_bwd_f64 with grad_out = G gives dq, dk, dv, dz, dh and dscalars [9][H].
 *  2. Every input element and every per-head scalar x is moved to x +- h (h = FD_STEP,
 *     smaller for tiny scalars, see FD_STEP) and the forward rerun; the central difference
 *        (L(x + h) - L(x - h)) / (2h) = sum G (y+ - y-) / (2h)
 *     (summed as differences of outputs, never as a difference of two large L) must
 *     match the backward within TOL_FD (measure below). Measured: <= ~1e-7. The
 *     truncation error is ~h^2 |L'''| / 6 and the rounding noise ~1e-16 amp / h (amp below),
 *     both far under 1e-6 on the kept rows.
 *  3. ascender_bwd_f32 on the same inputs (every input, scalar and G is generated
 *     float-representable, so both kernels see identical values) must match
 *     ascender_bwd_f64 within TOL_F32, both with grad_out = G32 (below).
 *  4. The backward is handed the forward's saved outputs (stats, u, c, nbr, y), as the binding
 *     does; called without them it runs the forward itself and must give the same bits, and
 *     so must a run on one thread instead of the team (the column sums have a fixed order).
 * N = 70 (three query blocks, two key tiles of the tiled kernels) differences only every 13th
 * tensor element (and every scalar), to keep the run short.
 * Error measure, per gradient group (dq, dk, dv, dz, dh, and each of the nine scalars
 * over its H heads): max |got - ref| / max(max |ref| over the group, FLOOR_REL x the
 * largest |ref| over all groups of the case). The floor keeps a group that is tiny
 * (e.g. d kappa when every row's density is clamped) from being judged by the absolute
 * rounding noise of the whole L. Any NaN / infinity fails.
 *
 * Rows excluded from L (G = 0 on them): a raw bias row that is constant in exact
 * arithmetic (e.g. paper variant, a padded query whose statistics set is exactly its
 * two neighbours; both have the same k^_j.u_i) has a std at rounding level, and its
 * normalized row, hence y_i and every derivative of y_i, is rounding noise divided by
 * (std + 1e-6). Finite differences of such a row measure noise, not a derivative. The
 * forward's saved stats detect it: with n_i = COUNT > 1, the amplification
 *     amp_X = (|MEAN_X| + STD_X) / (STD_X + 1e-6)
 * is how much a relative rounding error of the raw bias values is magnified by the
 * normalization; it is 1..~1e2 for a genuine row and ~1e5..1e6 for a constant one
 * (std/|mean| ~ 1e-16). Rows with max_X amp_X > AMP_MAX get G = 0. Measured on these
 * cases: kept rows have amp <= ~1e2, excluded ones amp >= ~9e4 (9 of 1280 rows, all
 * paper-variant rows like the example above); nothing lies in between.
 *
 * The f32 check needs a stricter cut. The f32 backward forms dL/d(raw bias) ~ dS/std
 * and sums such terms in float (e.g. the column gradients dk^_j = lambda gamma B_j u_i
 * + ..., whose large parts cancel), so its error relative to a group's largest entry
 * grows like amp x u_f32 x const; measured with single-row G over all rows of these
 * cases: error <= ~1.8e-5 x amp (amp <= 10: <= 7.6e-5; amp 49: 5.9e-4, in dk through
 * the alignment path: it drops to 8e-6 with omega_align = 0). The exact gradient is
 * not that sensitive (relative input perturbations of u_f32 move the f64 backward of
 * those rows by < ~1e-6), so this is float rounding inside the kernel, not the
 * problem's conditioning; f64 shows nothing of the kind. G32 is G with also the rows of
 * amp > AMP_MAX_F32 set to 0, so the bound 1.8e-5 x AMP_MAX_F32 stays below TOL_F32.
 * Each case line reports both exclusion counts; the last backward line totals them.
 *
 * The backward reads the forward's saved stats, so the stats used here for the exclusions
 * describe exactly the rows it sees.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/ascender.h"
#include "harness.h"
#include "test_backward.h"

/* central-difference step: absolute for the tensors (entries of order 1); for a scalar x
 * FD_STEP x min(1, 100 |x|), so the tiny lambdas (~1e-5) move by ~1e-4 of themselves */
#define FD_STEP 1e-6
/* backward f64 vs finite differences of the f64 forward */
#define TOL_FD 1e-6
/* backward f32 vs backward f64 on the same (float-exact) inputs */
#define TOL_F32 2e-4
/* a group's denominator is at least FLOOR_REL x the case's largest gradient */
#define FLOOR_REL 1e-2
/* rows whose bias normalization amplifies rounding errors more than this are left out
 * of L: for the finite-difference check, and for the f32-vs-f64 check */
#define AMP_MAX 1e3
#define AMP_MAX_F32 10.0

/* ------------------------------------------------------------------ cases */

/* key padding: none, or batch 0 random (25%) with token N/2 always padded (a padded
 * query that still attends) and batch 1 fully padded */
enum bw_kpm { BK_NONE, BK_MIX };
static const char *bk_name[] = {"none", "mix+b1all"};

typedef struct bw_def {
    int variant;
    int64_t N, k;
    int causal, mask_stats;
    int kpm, am;              /* enum bw_kpm, enum am_mode */
    int am_zero_row;          /* query N/2 may attend to nothing */
    int tiny_lambda;          /* lambda_* ~ 1e-5: see bw_make */
    int fd_stride;            /* difference every fd_stride-th tensor element (0: all) */
    uint64_t seed;
} bw_def;

/* gradient groups: the five tensors, then the nine per-head scalars (SPEC order) */
enum { NT = NIN, NS = NSC, NG = NT + NS };
static const char *group_name[NG] = {"dq", "dk", "dv", "dz", "dh",
                                     "dlambda_align", "dlambda_sep", "dlambda_coh",
                                     "domega_align", "domega_sep", "domega_coh",
                                     "dscore_temp", "ddelta", "dkappa"};

/* One generated problem: parameters, double inputs (all float-representable), masks. */
typedef struct bw_case {
    asc_params p;
    size_t n[NT];    /* element counts of q, k, v, z, h */
    size_t nout;     /* elements of y: B H N dv */
    size_t rows;     /* B H N */
    double *x[NT];   /* q, k, v, z, h */
    double *sc[NS];  /* [H] each */
    uint8_t *kpm, *am;
} bw_case;

static void bw_make(const bw_def *def, bw_case *c) {
    asc_params *p = &c->p;
    rng r = rng_splitmix(def->seed * 0xD1B54A32D192ED03ULL + 17, 1);
    memset(c, 0, sizeof(*c));
    p->window_left = p->window_right = -1; /* no window (0 would be a window of the token itself) */
    p->B = 2; p->H = 2; p->N = def->N; p->Nq = def->N;
    p->d = 4; p->dv = 3; p->dz = 3; p->da = 3;
    p->variant = def->variant;
    p->k_neighbors = def->k;
    p->is_causal = def->causal;
    p->mask_stats = def->mask_stats;
    draw_hyper(p, 0, &r);

    c->rows = (size_t)(p->B * p->H * p->N);
    draw_inputs(p, 0.7, &r, c->x); /* latents: moderate distances */
    for (int t = 0; t < NT; t++) c->n[t] = input_count(p, t);
    c->nout = c->n[2];

    /* a distinct value of every scalar for every head */
    draw_head_scalars(p, 0, &r, c->sc);
    /* The row normalization makes y almost invariant to the scale of a bias row: lambda_X
     * and the gates reach y only through the 1e-6 of (std + 1e-6), i.e. with weight
     * ~1e-6 / std. With lambda_X ~ 1e-5 the stds are ~1e-6 and those paths (dlambda,
     * d gate_a -> dk, d gate_c -> dz) carry gradients of order one. */
    if (def->tiny_lambda)
        for (int s = 0; s < 3; s++)
            for (int64_t hd = 0; hd < p->H; hd++) c->sc[s][hd] = rng_unif(&r, 3e-6, 3e-5);

    if (def->kpm == BK_MIX) {
        c->kpm = xcalloc((size_t)(p->B * p->N), 1);
        for (int64_t j = 0; j < p->N; j++)
            c->kpm[j] = (uint8_t)(rng_unif(&r, 0.0, 1.0) < 0.25 || (p->N >= 2 && j == p->N / 2));
        for (int64_t b = 1; b < p->B; b++)
            for (int64_t j = 0; j < p->N; j++) c->kpm[b * p->N + j] = 1;
    }

    c->am = make_attn_mask(p, def->am, def->am_zero_row, &r);
}

static void bw_free(bw_case *c) {
    for (int t = 0; t < NT; t++) free(c->x[t]);
    for (int s = 0; s < NS; s++) free(c->sc[s]);
    free(c->kpm);
    free(c->am);
}

/* ------------------------------------------------------------------ kernel calls */

/* Outputs of one f64 forward call. */
typedef struct fwd_buf {
    double *out, *stats, *u, *c;
    int64_t *nbr;
} fwd_buf;

static void fwd_buf_alloc(fwd_buf *f, const bw_case *c) {
    f->out = xcalloc(c->nout, sizeof(double));
    f->stats = xcalloc(c->rows * ASC_NSTAT, sizeof(double));
    f->u = xcalloc(c->rows * (size_t)c->p.d, sizeof(double));
    f->c = xcalloc(c->rows * (size_t)c->p.dz, sizeof(double));
    f->nbr = xcalloc(c->rows * (size_t)c->p.n_nbr, sizeof(int64_t));
}

static void fwd_buf_free(fwd_buf *f) {
    free(f->out); free(f->stats); free(f->u); free(f->c); free(f->nbr);
}

/* ascender_fwd_f64 on the case's current inputs; exits on failure (out of memory). */
static void run_fwd64(const bw_case *c, fwd_buf *f) {
    void *x[NT], *sc[NS];
    for (int t = 0; t < NT; t++) x[t] = c->x[t];
    for (int s = 0; s < NS; s++) sc[s] = c->sc[s];
    asc_fwd_args a = fwd_inputs(x, sc, c->kpm, c->am);
    a.out = f->out; a.stats = f->stats; a.u = f->u; a.c = f->c; a.nbr = f->nbr;
    if (ascender_fwd_f64(&c->p, &a)) {
        fprintf(stderr, "ascender_fwd_f64 failed\n");
        exit(2);
    }
}

/* All gradients of one backward call, widened to double: groups [NT] tensors, then dsc [NS][H]. */
typedef struct grads {
    double *g[NT];
    double *dsc;
} grads;

static void grads_alloc(grads *gr, const bw_case *c) {
    for (int t = 0; t < NT; t++) gr->g[t] = xcalloc(c->n[t], sizeof(double));
    gr->dsc = xcalloc((size_t)NS * (size_t)c->p.H, sizeof(double));
}

static void grads_free(grads *gr) {
    for (int t = 0; t < NT; t++) free(gr->g[t]);
    free(gr->dsc);
}

/* Group gi of gr: its first element and its length. */
static double *group_of(const grads *gr, const bw_case *c, int gi, size_t *len) {
    if (gi < NT) {
        *len = c->n[gi];
        return gr->g[gi];
    }
    *len = (size_t)c->p.H;
    return gr->dsc + (size_t)(gi - NT) * (size_t)c->p.H;
}

/* ascender_bwd_f64 with grad_out = G; returns the kernel's status. saved: hand the backward
 * the forward's outputs (as the binding does; else the kernel runs the forward itself). */
static int run_bwd64(const bw_case *c, const double *G, grads *gr, int saved) {
    void *x[NT], *sc[NS];
    for (int t = 0; t < NT; t++) {
        x[t] = c->x[t];
        for (size_t e = 0; e < c->n[t]; e++) gr->g[t][e] = POISON;
    }
    for (int s = 0; s < NS; s++) sc[s] = c->sc[s];
    for (size_t e = 0; e < (size_t)NS * (size_t)c->p.H; e++) gr->dsc[e] = POISON;
    asc_bwd_args ba;
    memset(&ba, 0, sizeof(ba));
    ba.in = fwd_inputs(x, sc, c->kpm, c->am);
    fwd_buf f;
    if (saved) {
        fwd_buf_alloc(&f, c);
        run_fwd64(c, &f);
        ba.in.out = f.out; ba.in.stats = f.stats; ba.in.u = f.u; ba.in.c = f.c; ba.in.nbr = f.nbr;
    }
    ba.grad_out = G;
    ba.dq = gr->g[0]; ba.dk = gr->g[1]; ba.dv = gr->g[2]; ba.dz = gr->g[3]; ba.dh = gr->g[4];
    ba.dscalars = gr->dsc;
    const int rc = ascender_bwd_f64(&c->p, &ba);
    if (saved) fwd_buf_free(&f);
    return rc;
}

/* ascender_bwd_f32 on the same (float-exact) inputs and G; results widened into gr. */
static int run_bwd32(const bw_case *c, const double *G, grads *gr, int saved) {
    const size_t nsc = (size_t)NS * (size_t)c->p.H;
    float *x[NT], *sc[NS], *g[NT];
    void *xv[NT], *scv[NS];
    for (int t = 0; t < NT; t++) {
        xv[t] = x[t] = to_f32(c->x[t], c->n[t]);
        g[t] = xcalloc(c->n[t], sizeof(float));
        for (size_t e = 0; e < c->n[t]; e++) g[t][e] = (float)POISON;
    }
    for (int s = 0; s < NS; s++) scv[s] = sc[s] = to_f32(c->sc[s], (size_t)c->p.H);
    float *G32 = to_f32(G, c->nout), *dsc = xcalloc(nsc, sizeof(float));
    for (size_t e = 0; e < nsc; e++) dsc[e] = (float)POISON;
    asc_bwd_args ba;
    memset(&ba, 0, sizeof(ba));
    ba.in = fwd_inputs(xv, scv, c->kpm, c->am);
    float *fo = NULL, *fs = NULL, *fu = NULL, *fc = NULL;
    int64_t *fn = NULL;
    int rcf = 0;
    if (saved) { /* the float forward's outputs */
        fo = xcalloc(c->nout, sizeof(float));
        fs = xcalloc(c->rows * ASC_NSTAT, sizeof(float));
        fu = xcalloc(c->rows * (size_t)c->p.d, sizeof(float));
        fc = xcalloc(c->rows * (size_t)c->p.dz, sizeof(float));
        fn = xcalloc(c->rows * (size_t)c->p.n_nbr, sizeof(int64_t));
        ba.in.out = fo; ba.in.stats = fs; ba.in.u = fu; ba.in.c = fc; ba.in.nbr = fn;
        rcf = ascender_fwd_f32(&c->p, &ba.in);
    }
    ba.grad_out = G32;
    ba.dq = g[0]; ba.dk = g[1]; ba.dv = g[2]; ba.dz = g[3]; ba.dh = g[4];
    ba.dscalars = dsc;
    const int rc = ascender_bwd_f32(&c->p, &ba) | rcf;
    free(fo); free(fs); free(fu); free(fc); free(fn);
    for (int t = 0; t < NT; t++) widen(gr->g[t], g[t], c->n[t]);
    widen(gr->dsc, dsc, nsc);
    for (int t = 0; t < NT; t++) { free(x[t]); free(g[t]); }
    for (int s = 0; s < NS; s++) free(sc[s]);
    free(G32);
    free(dsc);
    return rc;
}

/* ------------------------------------------------------------------ finite differences */

/*
 * dL/dx for the input element *param by central differences with step h; fp, fm are
 * scratch. The step actually taken is (x + h) - (x - h) as represented, not 2h.
 */
static double fd_one(const bw_case *c, double *param, double h, const double *G, fwd_buf *fp, fwd_buf *fm) {
    const double x0 = *param, xp = x0 + h, xm = x0 - h;
    *param = xp;
    run_fwd64(c, fp);
    *param = xm;
    run_fwd64(c, fm);
    *param = x0;
    double dl = 0.0;
    for (size_t e = 0; e < c->nout; e++)
        if (G[e] != 0.0) dl += G[e] * (fp->out[e] - fm->out[e]);
    return dl / (xp - xm);
}

/* Every gradient of L by finite differences, into fd (same layout as the backward's). With
 * stride > 1 only every stride-th tensor element (all scalars) is differenced; the others
 * are copied from bwd, so that they compare equal. */
static void fd_all(bw_case *c, const double *G, grads *fd, size_t stride, const grads *bwd) {
    fwd_buf fp, fm;
    fwd_buf_alloc(&fp, c);
    fwd_buf_alloc(&fm, c);
    for (int t = 0; t < NT; t++)
        for (size_t e = 0; e < c->n[t]; e++)
            fd->g[t][e] = e % stride == (size_t)t % stride ? fd_one(c, &c->x[t][e], FD_STEP, G, &fp, &fm) : bwd->g[t][e];
    for (int s = 0; s < NS; s++)
        for (int64_t hd = 0; hd < c->p.H; hd++) {
            double *x = &c->sc[s][hd];
            const double rel = fmin(1.0, 100.0 * fabs(*x));
            const double h = FD_STEP * (rel > 0.0 ? rel : 1.0);
            fd->dsc[(size_t)s * (size_t)c->p.H + (size_t)hd] = fd_one(c, x, h, G, &fp, &fm);
        }
    fwd_buf_free(&fp);
    fwd_buf_free(&fm);
}

/* ------------------------------------------------------------------ comparison */

/* Bitwise equality of two gradient sets. */
static int grads_equal(const bw_case *c, const grads *x, const grads *y) {
    for (int t = 0; t < NT; t++)
        if (memcmp(x->g[t], y->g[t], c->n[t] * sizeof(double))) return 0;
    return !memcmp(x->dsc, y->dsc, (size_t)NS * (size_t)c->p.H * sizeof(double));
}

/* The worst group of one comparison and where in it. */
typedef struct bw_verdict {
    double err;
    int group;
    size_t at;
    double ref, got;
} bw_verdict;

/* Relative error per group (see the file comment); NaN or infinity gives INFINITY. */
static bw_verdict bw_compare(const bw_case *c, const grads *ref, const grads *got) {
    bw_verdict v = {0.0, -1, 0, 0.0, 0.0};
    double maxall = 0.0;
    for (int gi = 0; gi < NG; gi++) {
        size_t n;
        const double *r = group_of(ref, c, gi, &n);
        for (size_t e = 0; e < n; e++)
            if (fabs(r[e]) > maxall) maxall = fabs(r[e]);
    }
    for (int gi = 0; gi < NG; gi++) {
        size_t n;
        const double *r = group_of(ref, c, gi, &n), *g = group_of(got, c, gi, &n);
        double maxabs = FLOOR_REL * maxall, maxerr = 0.0;
        size_t at = 0;
        for (size_t e = 0; e < n; e++) {
            if (!isfinite(r[e]) || !isfinite(g[e])) {
                maxerr = INFINITY;
                at = e;
                break;
            }
            if (fabs(r[e]) > maxabs) maxabs = fabs(r[e]);
            if (fabs(g[e] - r[e]) > maxerr) {
                maxerr = fabs(g[e] - r[e]);
                at = e;
            }
        }
        const double err = maxerr / (maxabs > 0.0 ? maxabs : 1.0);
        if (!(err <= v.err) || v.group < 0) {
            v.err = err;
            v.group = gi;
            v.at = at;
            v.ref = r[at];
            v.got = g[at];
        }
    }
    return v;
}

/* Rounding-error amplification of row st's bias normalization (0 when n_i <= 1). */
static double row_amp(const double *st) {
    static const int mean_col[3] = {ASC_STAT_MEAN_A, ASC_STAT_MEAN_S, ASC_STAT_MEAN_C};
    static const int std_col[3] = {ASC_STAT_STD_A, ASC_STAT_STD_S, ASC_STAT_STD_C};
    double worst = 0.0;
    if (!(st[ASC_STAT_COUNT] > 1.0)) return 0.0;
    for (int t = 0; t < 3; t++) {
        const double m = fabs(st[mean_col[t]]), s = st[std_col[t]];
        const double amp = (m + s) / (s + 1e-6);
        if (amp > worst) worst = amp;
    }
    return worst;
}

/* ------------------------------------------------------------------ driver */

/* totals over all backward cases, for the summary line */
static int g_rows, g_excluded, g_excluded32;
static double g_amp_kept, g_amp_dropped = INFINITY, g_worst_fd, g_worst_f32;

static int run_bw_case(int idx, const bw_def *def) {
    bw_case c;
    bw_make(def, &c);

    /* forward once for the stats; then G (and G32), zero on the rows that cannot be
     * differentiated at that precision */
    fwd_buf f0;
    fwd_buf_alloc(&f0, &c);
    run_fwd64(&c, &f0);
    double *G = xcalloc(c.nout, sizeof(double)), *G32 = xcalloc(c.nout, sizeof(double));
    rng r = rng_splitmix(def->seed ^ 0x5DEECE66DULL, 1);
    int excluded = 0, excluded32 = 0;
    for (size_t row = 0; row < c.rows; row++) {
        const double amp = row_amp(f0.stats + row * ASC_NSTAT);
        const int drop = amp > AMP_MAX, drop32 = amp > AMP_MAX_F32;
        excluded += drop;
        excluded32 += drop32;
        if (!drop && amp > g_amp_kept) g_amp_kept = amp;
        if (drop && amp < g_amp_dropped) g_amp_dropped = amp;
        for (int64_t f = 0; f < c.p.dv; f++) {
            const size_t e = row * (size_t)c.p.dv + (size_t)f;
            G[e] = drop ? 0.0 : rng_unif(&r, -1.0, 1.0);
            G32[e] = drop32 ? 0.0 : G[e];
        }
    }

    grads b64, b64g32, b32, fd, alt;
    grads_alloc(&b64, &c);
    grads_alloc(&b64g32, &c);
    grads_alloc(&b32, &c);
    grads_alloc(&fd, &c);
    grads_alloc(&alt, &c);
    const int rc64 = run_bwd64(&c, G, &b64, 1);
    const int rc64g32 = run_bwd64(&c, G32, &b64g32, 1);
    const int rc32 = run_bwd32(&c, G32, &b32, 1);
    fd_all(&c, G, &fd, def->fd_stride ? (size_t)def->fd_stride : 1, &b64);
    /* without the saved outputs the kernel runs the forward itself: the same bits */
    int same = run_bwd64(&c, G, &alt, 0) == 0 && grads_equal(&c, &alt, &b64);
    same &= run_bwd32(&c, G32, &alt, 0) == 0 && grads_equal(&c, &alt, &b32);
    /* and with one thread instead of the team: the same bits (fixed reduction order) */
    const int team = omp_get_max_threads();
    omp_set_num_threads(1);
    same &= run_bwd64(&c, G, &alt, 1) == 0 && grads_equal(&c, &alt, &b64);
    same &= run_bwd32(&c, G32, &alt, 1) == 0 && grads_equal(&c, &alt, &b32);
    omp_set_num_threads(team);

    bw_verdict vfd = bw_compare(&c, &fd, &b64);
    bw_verdict v32 = bw_compare(&c, &b64g32, &b32);
    if (rc64) vfd.err = INFINITY;
    if (rc32 || rc64g32) v32.err = INFINITY;
    const int ok_fd = vfd.err <= TOL_FD, ok32 = v32.err <= TOL_F32 && same;
    if (vfd.err > g_worst_fd) g_worst_fd = vfd.err;
    if (v32.err > g_worst_f32) g_worst_f32 = v32.err;
    g_rows += (int)c.rows;
    g_excluded += excluded;
    g_excluded32 += excluded32;

    char where_fd[128] = "", where32[128] = "";
    if (!ok_fd)
        snprintf(where_fd, sizeof(where_fd), " @%s[%zu] fd %.9g bwd %.9g%s", group_name[vfd.group],
                 vfd.at, vfd.ref, vfd.got, rc64 ? " rc!=0" : "");
    if (!ok32)
        snprintf(where32, sizeof(where32), " @%s[%zu] f64 %.9g f32 %.9g%s", group_name[v32.group],
                 v32.at, v32.ref, v32.got, rc32 || rc64g32 ? " rc!=0" : "");
    printf("[bwd %2d] %-9s N=%-2lld k=%-3lld%s ms=%d kpm=%s am=%s%s | fd %.1e (%s)%s | f32 %.1e (%s)%s"
           " | excluded rows fd %d f32 %d of %zu | %s\n",
           idx, def->variant == ASC_VARIANT_PAPER ? "paper" : "reference", (long long)def->N,
           (long long)def->k, def->causal ? " causal" : "", def->mask_stats, bk_name[def->kpm],
           am_name[def->am], def->am_zero_row ? "+zerorow" : "", vfd.err, group_name[vfd.group],
           where_fd, v32.err, group_name[v32.group], where32, excluded, excluded32, c.rows,
           ok_fd && ok32 ? "ok" : same ? "FAIL" : "FAIL (saved/unsaved or 1/2 threads differ)");

    grads_free(&b64);
    grads_free(&b64g32);
    grads_free(&b32);
    grads_free(&fd);
    grads_free(&alt);
    free(G);
    free(G32);
    fwd_buf_free(&f0);
    bw_free(&c);
    return ok_fd && ok32;
}

void run_backward_tests(int *passed, int *failed) {
    /* 70: three query blocks (32 + 32 + 6) and two key tiles (64 + 6) of the tiled kernels;
     * its finite differences are sampled (every 13th tensor element, every scalar) */
    static const int64_t Ns[] = {1, 2, 3, 5, 9, 70};
    const int variants[2] = {ASC_VARIANT_SEED, ASC_VARIANT_PAPER};
    uint64_t seed = 1000;
    int idx = 0, npass = 0, nfail = 0;
    const char *only = getenv("ASC_BWD_ONLY");

    for (int vi = 0; vi < 2; vi++)
        for (size_t ni = 0; ni < sizeof(Ns) / sizeof(Ns[0]); ni++)
            for (int cfg = 0; cfg < 8; cfg++) {
                bw_def def;
                memset(&def, 0, sizeof(def));
                def.variant = variants[vi];
                def.N = Ns[ni];
                def.k = 4; /* > N for N <= 3 */
                def.mask_stats = 1;
                def.seed = seed++;
                def.fd_stride = def.N > 32 ? 13 : 0;
                switch (cfg) {
                case 0: /* no masks */
                    break;
                case 1: /* causal, statistics masked, a single neighbour */
                    def.causal = 1; def.k = 1;
                    break;
                case 2: /* padded queries, batch 1 fully padded */
                    def.kpm = BK_MIX;
                    break;
                case 3: /* head-broadcast mask with an empty row, statistics unmasked */
                    def.am = AM_HEAD_BCAST; def.am_zero_row = 1; def.mask_stats = 0;
                    break;
                case 4: /* everything at once, one [N, N] mask for all (b, h) */
                    def.am = AM_SHARED; def.causal = 1; def.kpm = BK_MIX;
                    break;
                case 5: /* batch-broadcast mask, causal + padding, statistics unmasked */
                    def.am = AM_BATCH_BCAST; def.causal = 1; def.kpm = BK_MIX; def.mask_stats = 0;
                    break;
                case 6: /* transposed full mask, k far beyond N */
                    def.am = AM_TRANSPOSED; def.k = 100; def.am_zero_row = 1;
                    break;
                default: /* full [B, H, N, N] mask, tiny lambdas (the epsilon paths) */
                    def.am = AM_FULL; def.k = 2; def.tiny_lambda = 1;
                    break;
                }
                if (only && atoi(only) != idx) { /* ASC_BWD_ONLY=<case>: just that one */
                    idx++;
                    continue;
                }
                if (run_bw_case(idx++, &def)) npass++;
                else nfail++;
            }

    printf("backward: %d cases, %d passed; worst fd %.1e (tol %.0e), worst f32 %.1e (tol %.0e);"
           " rows excluded fd %d (amp > %.0e; largest kept %.1f, smallest excluded %.2g),"
           " f32 %d (amp > %.0f), of %d\n",
           idx, npass, g_worst_fd, TOL_FD, g_worst_f32, TOL_F32, g_excluded, AMP_MAX, g_amp_kept,
           g_amp_dropped, g_excluded32, AMP_MAX_F32, g_rows);
    *passed += npass;
    *failed += nfail;
}
