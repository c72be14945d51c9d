/*
 * philox.h -- the counter-based generator of attention dropout (SPEC section 9b), one definition
 * for the CPU kernels (C11) and the CUDA kernels (host and device code under nvcc and the
 * emulator), so that every backend draws the same mask; ascender_torch/dropout.py computes the
 * same function with PyTorch integer ops (the twin, the block-wise path). docs/dropout.md.
 *
 * Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11):
 * a 128-bit counter (c0, c1, c2, c3) and a 64-bit key (k0, k1) give four 32-bit words after ten
 * rounds of
 *     (hi0, lo0) = M0 c0,  (hi1, lo1) = M1 c2   (32 x 32 -> 64-bit products)
 *     (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
 * with the key bumped by (W0, W1) between rounds.
 *
 * The dropout stream of a call is (seed, offset), two 64-bit numbers (the dropout_seed tensor). The
 * pair (query token t, key j) of (batch b, head h) takes word j mod 4 of
 *     Philox4x32-10(counter = (j / 4, t, low and high half of offset + b H + h), key = seed)
 * and is kept when that word is >= floor(p 2^32): one call serves four neighbouring keys of a row.
 * Tokens and keys are below 2^32 (the binding checks N).
 */
#ifndef ASC_PHILOX_H
#define ASC_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__) || defined(ASC_CUDA_EMU)
#define ASC_PHILOX_FN static inline __host__ __device__
#else
#define ASC_PHILOX_FN static inline
#endif

#define ASC_PHILOX_M0 0xD2511F53u
#define ASC_PHILOX_M1 0xCD9E8D57u
#define ASC_PHILOX_W0 0x9E3779B9u
#define ASC_PHILOX_W1 0xBB67AE85u

/* Four 32-bit words: a counter or an output. */
typedef struct asc_philox4 {
    uint32_t w[4];
} asc_philox4;

/* Philox4x32-10 of counter c under key (k0, k1). */
ASC_PHILOX_FN asc_philox4 asc_philox4x32_10(asc_philox4 c, uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += ASC_PHILOX_W0;
            k1 += ASC_PHILOX_W1;
        }
        const uint64_t p0 = (uint64_t)ASC_PHILOX_M0 * c.w[0], p1 = (uint64_t)ASC_PHILOX_M1 * c.w[2];
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        const asc_philox4 n = {{hi1 ^ c.w[1] ^ k0, lo1, hi0 ^ c.w[3] ^ k1, lo0}};
        c = n;
    }
    return c;
}

/* The dropout stream of one (batch, head): the Philox key and the counter's upper half. */
typedef struct asc_dropout_stream {
    uint32_t k0, k1, c2, c3;
} asc_dropout_stream;

/* seed_offset = {seed, offset} (the dropout_seed tensor's two int64, taken as 64-bit patterns); bh = b H + h. */
ASC_PHILOX_FN asc_dropout_stream asc_dropout_stream_of(const int64_t *seed_offset, int64_t bh) {
    const uint64_t seed = (uint64_t)seed_offset[0], ctr = (uint64_t)seed_offset[1] + (uint64_t)bh;
    const asc_dropout_stream s = {(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)ctr, (uint32_t)(ctr >> 32)};
    return s;
}

/* The four words of keys 4 g .. 4 g + 3 for query token t: word j mod 4 decides key j. */
ASC_PHILOX_FN asc_philox4 asc_dropout_words(asc_dropout_stream s, int64_t t, int64_t g) {
    const asc_philox4 c = {{(uint32_t)g, (uint32_t)t, s.c2, s.c3}};
    return asc_philox4x32_10(c, s.k0, s.k1);
}

/* Whether the pair (t, j) is kept: threshold = floor(p 2^32) (asc_params.dropout_threshold). */
ASC_PHILOX_FN int asc_dropout_keep(asc_dropout_stream s, int64_t t, int64_t j, uint32_t threshold) {
    return asc_dropout_words(s, t, j >> 2).w[j & 3] >= threshold;
}

#endif /* ASC_PHILOX_H */
