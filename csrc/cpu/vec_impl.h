/*
 * vec_impl.h -- generic vector helpers of the CPU kernels (sums, dots, column passes,
 * transposes), included by each op's implementation header, so once per element type
 * (instantiate.h). No include guard on purpose.
 */

/* Transpose rows [N][f] into columns [f][N]. */
static void FN(asc_transpose)(SCALAR *dst, const SCALAR *src, int64_t N, int64_t f) {
    #pragma omp for schedule(static) nowait
    for (int64_t j = 0; j < N; j++)
        for (int64_t c = 0; c < f; c++) dst[c * N + j] = src[j * f + c];
}

/* Block length of the SCALAR partial sums that asc_sum / asc_dot / asc_weighted_rows flush
 * into double: vector-width accumulation inside a block, double across blocks. */
#ifndef ASC_BLOCK
#define ASC_BLOCK 256
#endif

/* sum_j x[j] */
ASC_INLINE double FN(asc_sum)(const SCALAR *x, int64_t n) {
    double total = 0.0;
    for (int64_t j0 = 0; j0 < n; j0 += ASC_BLOCK) {
        const int64_t j1 = j0 + ASC_BLOCK < n ? j0 + ASC_BLOCK : n;
        SCALAR part = 0;
        #pragma omp simd reduction(+:part)
        for (int64_t j = j0; j < j1; j++) part += x[j];
        total += (double)part;
    }
    return total;
}

/* sum_j x[j] y[j] */
ASC_INLINE double FN(asc_dot)(const SCALAR *x, const SCALAR *y, int64_t n) {
    double total = 0.0;
    for (int64_t j0 = 0; j0 < n; j0 += ASC_BLOCK) {
        const int64_t j1 = j0 + ASC_BLOCK < n ? j0 + ASC_BLOCK : n;
        SCALAR part = 0;
        #pragma omp simd reduction(+:part)
        for (int64_t j = j0; j < j1; j++) part += x[j] * y[j];
        total += (double)part;
    }
    return total;
}

/* acc[c] = sum_j w[j] rows[j][c] over the rows j with keep[j] != 0, for rows [n][f]: the other rows
 * are skipped, not multiplied by a zero weight (a NaN in a padded key's row stays out, SPEC section
 * 11). Columns in chunks of ASC_CHUNK whose partial sums stay in registers over a block of keys,
 * then flush into double. */
#define ASC_CHUNK 32
ASC_INLINE void FN(asc_weighted_rows)(double *acc, const SCALAR *w, const SCALAR *rows, const uint8_t *keep,
                                      int64_t n, int64_t f) {
    for (int64_t c = 0; c < f; c++) acc[c] = 0.0;
    for (int64_t c0 = 0; c0 < f; c0 += ASC_CHUNK) {
        const int64_t cw = c0 + ASC_CHUNK <= f ? ASC_CHUNK : f - c0;
        for (int64_t j0 = 0; j0 < n; j0 += ASC_BLOCK) {
            const int64_t j1 = j0 + ASC_BLOCK < n ? j0 + ASC_BLOCK : n;
            SCALAR part[ASC_CHUNK] = {0};
            if (cw == ASC_CHUNK) {
                for (int64_t j = j0; j < j1; j++) {
                    if (!keep[j]) continue;
                    const SCALAR wj = w[j], *row = rows + j * f + c0;
                    #pragma omp simd
                    for (int64_t c = 0; c < ASC_CHUNK; c++) part[c] += wj * row[c];
                }
            } else {
                for (int64_t j = j0; j < j1; j++) {
                    if (!keep[j]) continue;
                    const SCALAR wj = w[j], *row = rows + j * f + c0;
                    for (int64_t c = 0; c < cw; c++) part[c] += wj * row[c];
                }
            }
            for (int64_t c = 0; c < cw; c++) acc[c0 + c] += (double)part[c];
        }
    }
}

/* acc[j] = sum_f w[f] cols[f][j] (cols is [nf][N]) for j < n; f unrolled by 4 so each
 * pass over acc serves four columns. acc2/w2, when non-NULL, get the same with w2. */
ASC_INLINE void FN(asc_gemv_cols)(SCALAR *acc, const SCALAR *w, SCALAR *acc2, const SCALAR *w2,
                                  const SCALAR *cols, int64_t N, int64_t nf, int64_t n) {
    int64_t f = 0;
    for (int64_t j = 0; j < n; j++) acc[j] = 0;
    if (acc2)
        for (int64_t j = 0; j < n; j++) acc2[j] = 0;
    for (; f + 4 <= nf; f += 4) {
        const SCALAR *c0 = cols + f * N, *c1 = c0 + N, *c2 = c1 + N, *c3 = c2 + N;
        const SCALAR a0 = w[f], a1 = w[f + 1], a2 = w[f + 2], a3 = w[f + 3];
        if (acc2) {
            const SCALAR b0 = w2[f], b1 = w2[f + 1], b2 = w2[f + 2], b3 = w2[f + 3];
            #pragma omp simd
            for (int64_t j = 0; j < n; j++) {
                acc[j] += (a0 * c0[j] + a1 * c1[j]) + (a2 * c2[j] + a3 * c3[j]);
                acc2[j] += (b0 * c0[j] + b1 * c1[j]) + (b2 * c2[j] + b3 * c3[j]);
            }
        } else {
            #pragma omp simd
            for (int64_t j = 0; j < n; j++) acc[j] += (a0 * c0[j] + a1 * c1[j]) + (a2 * c2[j] + a3 * c3[j]);
        }
    }
    for (; f < nf; f++) {
        const SCALAR *c = cols + f * N, a0 = w[f], b0 = acc2 ? w2[f] : 0;
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) acc[j] += a0 * c[j];
        if (acc2) {
            #pragma omp simd
            for (int64_t j = 0; j < n; j++) acc2[j] += b0 * c[j];
        }
    }
}

/* acc[j] = sum_f (cols[f][j] - x[f])^2, as differences (never negative), f unrolled by 4. */
ASC_INLINE void FN(asc_sqdist_cols)(SCALAR *acc, const SCALAR *x, const SCALAR *cols, int64_t N,
                                    int64_t nf, int64_t n) {
    int64_t f = 0;
    for (int64_t j = 0; j < n; j++) acc[j] = 0;
    for (; f + 4 <= nf; f += 4) {
        const SCALAR *c0 = cols + f * N, *c1 = c0 + N, *c2 = c1 + N, *c3 = c2 + N;
        const SCALAR x0 = x[f], x1 = x[f + 1], x2 = x[f + 2], x3 = x[f + 3];
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            const SCALAR t0 = c0[j] - x0, t1 = c1[j] - x1, t2 = c2[j] - x2, t3 = c3[j] - x3;
            acc[j] += (t0 * t0 + t1 * t1) + (t2 * t2 + t3 * t3);
        }
    }
    for (; f < nf; f++) {
        const SCALAR *c = cols + f * N, x0 = x[f];
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) { const SCALAR t = c[j] - x0; acc[j] += t * t; }
    }
}
