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
 * The dropout stream of a call is (seed, offset, token offset o), three 64-bit numbers (the dropout_seed
 * tensor; the binding gives the kernels o = 0 when the caller passed (seed, offset) alone). The pair
 * (query token t, key j) of (batch b, head h) draws as the pair (t + o, j + o) of a longer sequence:
 * with T = t + o and J = j + o it takes word J mod 4 of
 *     Philox4x32-10(counter = (J / 4, T, low and high half of offset + b H + h), key = seed)
 * (J / 4 and T as 32-bit words) and is kept when that word is >= floor(p 2^32): one call serves four
 * neighbouring keys of a row. So a call over the tokens [o, o + N) of a sequence (context parallelism's
 * ranks) draws exactly the mask that one call over the whole sequence draws for those pairs.
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

/* The dropout stream of one (batch, head): the Philox key, the counter's upper half, the token offset. */
typedef struct asc_dropout_stream {
    uint32_t k0, k1, c2, c3;
    int64_t tok;
} asc_dropout_stream;

/* seed_offset = {seed, offset, token offset} (the dropout_seed tensor's three int64, the first two taken as
 * 64-bit patterns); bh = b H + h. */
ASC_PHILOX_FN asc_dropout_stream asc_dropout_stream_of(const int64_t *seed_offset, int64_t bh) {
    const uint64_t seed = (uint64_t)seed_offset[0], ctr = (uint64_t)seed_offset[1] + (uint64_t)bh;
    /* the words take T mod 2^32 and J / 4 mod 2^32, so the offset mod 2^34 draws the same and keeps t + o and
     * j + o far from overflow whatever int64 the caller gave */
    const asc_dropout_stream s = {(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)ctr, (uint32_t)(ctr >> 32),
                                  (int64_t)((uint64_t)seed_offset[2] & ((1ull << 34) - 1))};
    return s;
}

/* The four words of the sequence's keys 4 G .. 4 G + 3 for its query token T (the token offset added
 * already): word J mod 4 decides key J. */
ASC_PHILOX_FN asc_philox4 asc_dropout_words(asc_dropout_stream s, int64_t T, int64_t G) {
    const asc_philox4 c = {{(uint32_t)G, (uint32_t)T, s.c2, s.c3}};
    return asc_philox4x32_10(c, s.k0, s.k1);
}

/* Whether the call's pair (t, j) is kept: threshold = floor(p 2^32) (asc_params.dropout_threshold). */
ASC_PHILOX_FN int asc_dropout_keep(asc_dropout_stream s, int64_t t, int64_t j, uint32_t threshold) {
    const int64_t J = j + s.tok;
    return asc_dropout_words(s, t + s.tok, J >> 2).w[J & 3] >= threshold;
}

#endif /* ASC_PHILOX_H */
