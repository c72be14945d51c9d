/*
 * harness.c -- helpers shared by the standalone C tests (see harness.h).
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ PRNG */

static uint64_t rng_next(rng *r) {
    if (r->splitmix) {
        uint64_t z = (r->s += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        return z ^ (z >> 31);
    }
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

void rng_seed(rng *r, uint64_t seed) {
    r->s = seed * 0x9E3779B97F4A7C15ULL + 0x1234567ULL;
    if (r->s == 0) r->s = 1;
    r->splitmix = 0;
    r->f32 = 0;
    for (int t = 0; t < 4; t++) rng_next(r);
}

rng rng_splitmix(uint64_t s, int f32) {
    rng r = {s, 1, f32};
    return r;
}

double rng_unif(rng *r, double lo, double hi) {
    const double u = lo + (hi - lo) * ((double)(rng_next(r) >> 11) * 0x1p-53);
    return r->f32 ? (double)(float)u : u;
}

/* ------------------------------------------------------------------ memory */

void *xcalloc(size_t n, size_t sz) {
    void *ptr = calloc(n ? n : 1, sz);
    if (!ptr) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return ptr;
}

float *to_f32(const double *x, size_t n) {
    float *y = xcalloc(n, sizeof(float));
    for (size_t e = 0; e < n; e++) y[e] = (float)x[e];
    return y;
}

void widen(double *dst, const float *src, size_t n) {
    for (size_t e = 0; e < n; e++) dst[e] = (double)src[e];
}

/* ------------------------------------------------------------------ cases */

int64_t input_dim(const asc_params *p, int t) {
    const int64_t dims[NIN] = {p->d, p->d, p->dv, p->dz, p->da};
    return dims[t];
}

size_t input_count(const asc_params *p, int t) {
    return (size_t)(p->B * p->H * p->N) * (size_t)input_dim(p, t);
}

void draw_hyper(asc_params *p, int defaults, rng *r) {
    if (p->variant == ASC_VARIANT_PAPER) {
        const int64_t m = p->N - 1 > 0 ? p->N - 1 : 0;
        p->n_nbr = p->k_neighbors < m ? p->k_neighbors : m;
    } else {
        p->n_nbr = 0;
    }
    p->tau_sep = rng_unif(r, 0.5, 2.0);
    p->tau_coh = rng_unif(r, 0.5, 2.0);
    p->alpha_align = defaults ? -1.0 : rng_unif(r, -3.0, 3.0);
    p->alpha_coh = defaults ? -1.0 : rng_unif(r, -3.0, 3.0);
    p->scale = defaults ? 1.0 / sqrt((double)p->d) : rng_unif(r, 0.3, 1.2);
}

void draw_inputs(const asc_params *p, double zamp, rng *r, double *x[NIN]) {
    for (int t = 0; t < NIN; t++) {
        const size_t n = input_count(p, t);
        const double amp = t == 3 ? zamp : 1.0;
        x[t] = xcalloc(n, sizeof(double));
        for (size_t e = 0; e < n; e++) x[t][e] = rng_unif(r, -amp, amp);
    }
}

void draw_head_scalars(const asc_params *p, int defaults, rng *r, double *sc[NSC]) {
    /* kappa's range puts the density ratio rho / kappa on both sides of the clamp at 1 */
    static const double lo[NSC] = {0.5, 0.5, 0.5, 0.2, 0.2, 0.2, 0.5, 0.0, 0.5};
    static const double hi[NSC] = {2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.5, 0.5, 4.0};
    static const double def[NSC] = {1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 1.0, 0.2, 32.0};
    for (int s = 0; s < NSC; s++) {
        sc[s] = xcalloc((size_t)p->H, sizeof(double));
        for (int64_t hd = 0; hd < p->H; hd++)
            sc[s][hd] = defaults ? def[s] : rng_unif(r, lo[s], hi[s]);
    }
}

const char *const am_name[] = {"none", "BHNN", "B1NN", "1HNN", "NN", "BHNN^T"};

uint8_t *make_attn_mask(asc_params *p, int mode, int zero_row, rng *r) {
    const int64_t N = p->N, NN = N * N;
    int64_t nb = p->B, nh = p->H;
    switch (mode) {
    case AM_NONE:
        return NULL;
    case AM_FULL:
        p->am_sb = p->H * NN; p->am_sh = NN; p->am_si = N; p->am_sj = 1;
        break;
    case AM_HEAD_BCAST:
        nh = 1;
        p->am_sb = NN; p->am_sh = 0; p->am_si = N; p->am_sj = 1;
        break;
    case AM_BATCH_BCAST:
        nb = 1;
        p->am_sb = 0; p->am_sh = NN; p->am_si = N; p->am_sj = 1;
        break;
    case AM_SHARED:
        nb = 1; nh = 1;
        p->am_sb = 0; p->am_sh = 0; p->am_si = N; p->am_sj = 1;
        break;
    default: /* AM_TRANSPOSED, a transposed view: i runs along memory */
        p->am_sb = p->H * NN; p->am_sh = NN; p->am_si = 1; p->am_sj = N;
        break;
    }
    const size_t n = (size_t)(nb * nh * NN);
    uint8_t *am = xcalloc(n, 1);
    for (size_t e = 0; e < n; e++) am[e] = rng_unif(r, 0.0, 1.0) < 0.75;
    if (zero_row)
        for (int64_t b = 0; b < nb; b++)
            for (int64_t hd = 0; hd < nh; hd++)
                for (int64_t j = 0; j < N; j++)
                    am[b * p->am_sb + hd * p->am_sh + (N / 2) * p->am_si + j * p->am_sj] = 0;
    return am;
}

asc_fwd_args fwd_inputs(void *const *x, void *const *sc, const uint8_t *kpm, const uint8_t *am) {
    asc_fwd_args a;
    memset(&a, 0, sizeof(a));
    a.q = x[0]; a.k = x[1]; a.v = x[2]; a.z = x[3]; a.h = x[4];
    a.lambda_align = sc[SC_LA]; a.lambda_sep = sc[SC_LS]; a.lambda_coh = sc[SC_LC];
    a.omega_align = sc[SC_OA]; a.omega_sep = sc[SC_OS]; a.omega_coh = sc[SC_OC];
    a.score_temp = sc[SC_TEMP]; a.delta = sc[SC_DELTA]; a.kappa = sc[SC_KAPPA];
    a.key_padding_mask = kpm;
    a.attn_mask = am;
    return a;
}
