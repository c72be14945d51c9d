/*
 * ascender_cpu.h -- type-independent helpers shared by the CPU kernels.
 */
#ifndef ASCENDER_CPU_H
#define ASCENDER_CPU_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../ascender.h"

/* The epsilon constants of the seed module (SPEC section 4); keep them exact. */
#define ASC_EPS_TAU 1e-6   /* tau_sep, tau_coh, kappa, score_temp, centroid denominator */
#define ASC_EPS_STD 1e-6   /* row normalization */
#define ASC_EPS_NORM 1e-12 /* F.normalize */

static inline double asc_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static inline double asc_clamp01(double x) { return x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x); }

/* Key j is allowed for query i (SPEC section 3); mask pointers may be NULL. */
static inline int asc_allowed(const asc_params *p, const uint8_t *kpm_b,
                              const uint8_t *am_bhi, int64_t i, int64_t j) {
    if (p->is_causal && j > i) return 0;
    if (kpm_b && kpm_b[j]) return 0;
    if (am_bhi && !am_bhi[j * p->am_sj]) return 0;
    return 1;
}

/*
 * Top-k neighbour selection by insertion: keeps the n_max largest values seen so far
 * in idx/val, sorted by descending value; ties keep the lower index first because a
 * later candidate only moves past strictly smaller values. Returns the new count.
 */
static inline int64_t asc_topk_push(int64_t *idx, double *val, int64_t count,
                                    int64_t n_max, int64_t j, double a) {
    int64_t pos;
    if (n_max == 0) return 0;
    if (count == n_max) {
        if (!(a > val[count - 1])) return count;
        count--; /* drop the current last */
    }
    pos = count;
    while (pos > 0 && val[pos - 1] < a) {
        idx[pos] = idx[pos - 1];
        val[pos] = val[pos - 1];
        pos--;
    }
    idx[pos] = j;
    val[pos] = a;
    return count + 1;
}

#endif /* ASCENDER_CPU_H */
