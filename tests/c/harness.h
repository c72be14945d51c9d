/*
 * harness.h -- helpers shared by the forward (test_kernels.c) and backward
 * (test_backward.c) tests: PRNG, checked allocation, float conversion, and the
 * random parameters, inputs and attention masks of a case.
 */
#ifndef HARNESS_H
#define HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "../../csrc/ascender.h"

/* ------------------------------------------------------------------ PRNG */

/*
 * Two generators (Vigna), kept so that each test file draws the same stream as
 * before: xorshift64* (forward cases) and splitmix64 (backward cases).
 */
typedef struct rng {
    uint64_t s;
    int splitmix; /* 0: xorshift64*, 1: splitmix64 */
    int f32;      /* rng_unif rounds its values to float */
} rng;

/* xorshift64*, its state derived from seed. */
void rng_seed(rng *r, uint64_t seed);

/* splitmix64 with raw state s; f32: every value float-representable, so the
 * f32 kernels see the very same inputs as the f64 ones. */
rng rng_splitmix(uint64_t s, int f32);

/* uniform in [lo, hi) (with f32, rounded to float, so possibly hi) */
double rng_unif(rng *r, double lo, double hi);

/* ------------------------------------------------------------------ memory */

/* calloc that exits(2) on failure; n = 0 allocates one element. */
void *xcalloc(size_t n, size_t sz);

/* x rounded to float, in a new array */
float *to_f32(const double *x, size_t n);

/* dst[e] = src[e] widened to double */
void widen(double *dst, const float *src, size_t n);

/* marker written into outputs first: an element a kernel leaves alone shows up */
#define POISON (-12345.0)

/* ------------------------------------------------------------------ cases */

/* the nine learnable per-head scalars, in SPEC order */
enum { SC_LA, SC_LS, SC_LC, SC_OA, SC_OS, SC_OC, SC_TEMP, SC_DELTA, SC_KAPPA, NSC };
_Static_assert((int)NSC == (int)ASC_NSCALAR, "per-head scalar count");

/* the five input tensors q, k, v, z, h */
enum { NIN = 5 };

/* Feature size of input t (d, d, dv, dz, da) and its element count B H N size. */
int64_t input_dim(const asc_params *p, int t);
size_t input_count(const asc_params *p, int t);

/*
 * Completes p once shapes, variant and k_neighbors are set: n_nbr, then tau_sep,
 * tau_coh, alpha_align, alpha_coh, scale drawn in that order. defaults: alpha_* = -1
 * and scale = 1/sqrt(d) (the seed module's), not drawn.
 */
void draw_hyper(asc_params *p, int defaults, rng *r);

/* Allocates the inputs x[NIN], uniform in [-1, 1], z in [-zamp, zamp]. */
void draw_inputs(const asc_params *p, double zamp, rng *r, double *x[NIN]);

/* Allocates the NSC per-head scalars, [H] each: every head its own value from a
 * fixed range per scalar; defaults: the seed module's values, nothing drawn. */
void draw_head_scalars(const asc_params *p, int defaults, rng *r, double *sc[NSC]);

/* attn_mask layouts; the strides of asc_params express the broadcast */
enum am_mode { AM_NONE, AM_FULL, AM_HEAD_BCAST, AM_BATCH_BCAST, AM_SHARED, AM_TRANSPOSED };
extern const char *const am_name[]; /* indexed by am_mode */

/*
 * Sets p's am_* strides for layout mode and returns a new mask in that layout (NULL
 * for AM_NONE): each entry 1 with probability 0.75; zero_row: query row N/2 of every
 * stored (b, h) slice may attend to nothing.
 */
uint8_t *make_attn_mask(asc_params *p, int mode, int zero_row, rng *r);

/* Forward arguments with the inputs set (x in NIN order, sc in SC_* order, float or
 * double arrays alike) and every output NULL. */
asc_fwd_args fwd_inputs(void *const *x, void *const *sc, const uint8_t *kpm, const uint8_t *am);

#endif /* HARNESS_H */
