/*
 * ascender_cpu.h -- type-independent helpers shared by the CPU kernels.
 */
#ifndef ASCENDER_CPU_H
#define ASCENDER_CPU_H

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../ascender.h"
#include "../philox.h"

#if defined(__GNUC__)
#define ASC_UNUSED __attribute__((unused))
#define ASC_INLINE static inline __attribute__((always_inline))
#else
#define ASC_UNUSED
#define ASC_INLINE static inline
#endif

/*
 * The tiled ASCender kernels are compiled for three ISAs on x86-64 with gcc (instantiate_isa.h):
 * AVX-512 (x86-64-v4), AVX2 + FMA (x86-64-v3) and the baseline. asc_cpu_isa() says which one
 * the running CPU takes: 2, 1 or 0. The environment variable ASCENDER_CPU_ISA (v4, v3 or base)
 * can only lower the choice (for tests of the narrower code paths on a wider CPU).
 */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(ASC_NO_CLONES)
#define ASC_MULTI_ISA 1
#else
#define ASC_MULTI_ISA 0
#endif

#if ASC_MULTI_ISA
#include <immintrin.h>
#endif

static inline int asc_cpu_isa(void) {
    static int cached = -1;
    int isa;
    #pragma omp atomic read
    isa = cached;
    if (isa >= 0) return isa;
    isa = 0;
#if ASC_MULTI_ISA
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) isa = 2;
    else if (__builtin_cpu_supports("x86-64-v3")) isa = 1;
#endif
    const char *want = getenv("ASCENDER_CPU_ISA");
    if (want) {
        const int cap = !strcmp(want, "base") ? 0 : !strcmp(want, "v3") ? 1 : 2;
        if (cap < isa) isa = cap;
    }
    #pragma omp atomic write
    cached = isa;
    return isa;
}

/*
 * exp for float that gcc vectorizes inside `omp simd` loops (the Magnitude kernels' SEXP for float) (libm's expf is a call).
 * exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln2 / 2, ln 2 split in two parts
 * (Cody-Waite), exp(r) by its degree-7 Taylor polynomial: error below 2 ulp. Results
 * underflow to exactly 0 below -87.3 (as expf's do, up to denormals), NaN stays NaN.
 */
ASC_INLINE float asc_expf(float x) {
    const float xc = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
    const float n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const float r = (xc - n * 0.693145752f) - n * 1.42860677e-6f;
    float p = 1.98412698e-4f;
    p = p * r + 1.38888889e-3f;
    p = p * r + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { uint32_t u; float f; } two_n;
    two_n.u = (uint32_t)((int32_t)n + 127) << 23;
    const float y = p * two_n.f;
    return x != x ? x : (x < -87.3f ? 0.0f : y);
}

static inline double asc_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static inline double asc_clamp01(double x) { return x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x); }

/*
 * Sizes with a user-chosen factor (n_iter) saturate at SIZE_MAX instead of wrapping around, so
 * that the allocation fails cleanly (a wrapped product is a small buffer overrun by the loops).
 * Products of tensor dimensions alone cannot overflow: those tensors exist in memory.
 */
static inline size_t asc_mul(size_t a, size_t b) {
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

static inline size_t asc_add(size_t a, size_t b) {
    size_t r;
    return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

/*
 * A bump allocator for per-thread scratch: a layout function takes every buffer from an
 * arena twice, once with base NULL to measure the total, then from one aligned block.
 */
typedef struct asc_arena {
    char *base;
    size_t off;
} asc_arena;

static inline void *asc_take(asc_arena *ar, size_t bytes) {
    void *ptr = ar->base ? ar->base + ar->off : NULL;
    ar->off += (bytes + 63) & ~(size_t)63;
    return ptr;
}

/* One 64-byte aligned block of ar->off bytes (at least 64), or NULL. */
static inline void *asc_arena_alloc(size_t bytes) {
    return aligned_alloc(64, bytes < 64 ? 64 : (bytes + 63) & ~(size_t)63);
}

/*
 * Inside a parallel region: each thread says whether its scratch allocation failed; every
 * thread gets 1 if any did (so all of them skip the work together). Ends with a barrier.
 */
static inline int asc_team_failed(int *failed, int mine) {
    if (mine) {
        #pragma omp atomic write
        *failed = 1;
    }
    #pragma omp barrier
    int any;
    #pragma omp atomic read
    any = *failed;
    return any;
}

/*
 * Top-k neighbour selection by insertion: keeps the n_max largest values seen so far
 * in idx/val, sorted by descending value; ties keep the lower index first because a
 * later candidate only moves past strictly smaller values (candidates arrive in increasing
 * index order). A candidate that passed the k-th value usually lands near the end, so the
 * scan runs from the end. Returns the new count.
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
