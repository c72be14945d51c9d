/*
 * ascender_tile_impl.h -- the SIMD layer and the three micro-kernels of the tiled CPU kernels
 * (docs/tiling.md section 2). Generic over SCALAR / SINT / FN and the ISA (ASC_VB, ASC_WIDE),
 * included once per (type, ISA) through instantiate_isa.h. No include guard on purpose; the
 * macros defined here are undefined again by ascender_undef.h.
 *
 * Blocks of BM query rows, tiles of BN keys. A tile buffer is key-major, query-minor:
 * T[j * BM + i], so one vector holds VL consecutive query rows of one key.
 */

#define VL ((int)(ASC_VB / sizeof(SCALAR))) /* lanes per vector */
#define BM 32                               /* query rows per block */
#define BN 64                               /* keys per tile */
#define MV (BM / VL)                        /* vectors per key row of a tile */
#define MVB 2                               /* row vectors per micro-tile */
/* register blocks: keys x row vectors (score), features x row vectors (row), keys x feature
 * vectors (column); 32 vector registers (AVX-512) or 16 */
#define K1_NR1 (ASC_WIDE ? 8 : 4)
#define K1_NR2 (ASC_WIDE ? 4 : 2)
#define K2_NF (ASC_WIDE ? 8 : 4)

typedef SCALAR FN(vs_t) __attribute__((vector_size(ASC_VB)));
typedef SINT FN(vi_t) __attribute__((vector_size(ASC_VB)));
typedef SCALAR FN(vsu_t) __attribute__((vector_size(ASC_VB), aligned(sizeof(SCALAR))));
#define VS FN(vs_t)
#define VI FN(vi_t)

/* ---------------------------------------------------------------- vector helpers */

ASC_INLINE VS FN(vld)(const SCALAR *p) { return *(const VS *)p; } /* aligned */
ASC_INLINE VS FN(vldu)(const SCALAR *p) { return *(const FN(vsu_t) *)p; }
ASC_INLINE void FN(vst)(SCALAR *p, VS x) { *(VS *)p = x; }
ASC_INLINE void FN(vstu)(SCALAR *p, VS x) { *(FN(vsu_t) *)p = x; } /* unaligned */
ASC_INLINE VI FN(vldi)(const SINT *p) { return *(const VI *)p; }
ASC_INLINE void FN(vsti)(SINT *p, VI x) { *(VI *)p = x; }
ASC_INLINE VS FN(vset)(SCALAR x) { return (VS){0} + x; }
/* m ? a : b, lane by lane (m is -1 or 0 per lane) */
ASC_INLINE VS FN(vsel)(VI m, VS a, VS b) { return (VS)(((VI)a & m) | ((VI)b & ~m)); }
/* x86 vector types of this ISA, for the few intrinsics below (same bits as VS) */
#if ASC_MULTI_ISA && ASC_ISA_ID == 4
#define ASC_XV __m512
#define ASC_XVD __m512d
#elif ASC_MULTI_ISA && ASC_ISA_ID == 3
#define ASC_XV __m256
#define ASC_XVD __m256d
#elif ASC_MULTI_ISA
#define ASC_XV __m128
#define ASC_XVD __m128d
#endif

/* a > b ? a : b, and b where either is NaN (the semantics of x86's max) */
ASC_INLINE VS FN(vmax)(VS a, VS b) {
#if ASC_MULTI_ISA && ASC_ISA_ID == 4
    return ASC_F32 ? (VS)_mm512_max_ps((ASC_XV)a, (ASC_XV)b) : (VS)_mm512_max_pd((ASC_XVD)a, (ASC_XVD)b);
#elif ASC_MULTI_ISA && ASC_ISA_ID == 3
    return ASC_F32 ? (VS)_mm256_max_ps((ASC_XV)a, (ASC_XV)b) : (VS)_mm256_max_pd((ASC_XVD)a, (ASC_XVD)b);
#elif ASC_MULTI_ISA
    return ASC_F32 ? (VS)_mm_max_ps((ASC_XV)a, (ASC_XV)b) : (VS)_mm_max_pd((ASC_XVD)a, (ASC_XVD)b);
#else
    return FN(vsel)(a > b, a, b);
#endif
}

/* a < b ? a : b, and b where either is NaN */
ASC_INLINE VS FN(vmin)(VS a, VS b) {
#if ASC_MULTI_ISA && ASC_ISA_ID == 4
    return ASC_F32 ? (VS)_mm512_min_ps((ASC_XV)a, (ASC_XV)b) : (VS)_mm512_min_pd((ASC_XVD)a, (ASC_XVD)b);
#elif ASC_MULTI_ISA && ASC_ISA_ID == 3
    return ASC_F32 ? (VS)_mm256_min_ps((ASC_XV)a, (ASC_XV)b) : (VS)_mm256_min_pd((ASC_XVD)a, (ASC_XVD)b);
#elif ASC_MULTI_ISA
    return ASC_F32 ? (VS)_mm_min_ps((ASC_XV)a, (ASC_XV)b) : (VS)_mm_min_pd((ASC_XVD)a, (ASC_XVD)b);
#else
    return FN(vsel)(a < b, a, b);
#endif
}

/* max(x, 0), and x where x is NaN (a clamp that keeps NaN, as torch.clamp does; SPEC section 11) */
ASC_INLINE VS FN(vclamp0)(VS x) { return FN(vmax)((VS){0}, x); }

/* y where lo <= x, 0 where x < lo, x where x is NaN: the end of vexp */
ASC_INLINE VS FN(vexp_fix)(VS x, VS lo, VS y) {
#if ASC_MULTI_ISA && ASC_ISA_ID == 4 && ASC_F32
    const __m512 r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((ASC_XV)x, (ASC_XV)lo, _CMP_GE_OQ), (ASC_XV)y);
    return (VS)_mm512_mask_mov_ps(r, _mm512_cmp_ps_mask((ASC_XV)x, (ASC_XV)x, _CMP_UNORD_Q), (ASC_XV)x);
#elif ASC_MULTI_ISA && ASC_ISA_ID == 4
    const __m512d r = _mm512_maskz_mov_pd(_mm512_cmp_pd_mask((ASC_XVD)x, (ASC_XVD)lo, _CMP_GE_OQ), (ASC_XVD)y);
    return (VS)_mm512_mask_mov_pd(r, _mm512_cmp_pd_mask((ASC_XVD)x, (ASC_XVD)x, _CMP_UNORD_Q), (ASC_XVD)x);
#else
    return FN(vsel)(x != x, x, FN(vsel)(x < lo, (VS){0}, y));
#endif
}
/* the lanes of m that are set, as the bits of an integer (VL <= 16) */
ASC_INLINE unsigned FN(vbits)(VI m) {
#if ASC_MULTI_ISA && ASC_ISA_ID == 4
    return ASC_F32 ? (unsigned)_mm512_test_epi32_mask((__m512i)m, (__m512i)m)
                   : (unsigned)_mm512_test_epi64_mask((__m512i)m, (__m512i)m);
#elif ASC_MULTI_ISA && ASC_ISA_ID == 3
    return ASC_F32 ? (unsigned)_mm256_movemask_ps((__m256)m) : (unsigned)_mm256_movemask_pd((__m256d)m);
#else
    unsigned bits = 0;
    for (int l = 0; l < VL; l++) bits |= (m[l] != 0) << l;
    return bits;
#endif
}

ASC_INLINE int FN(vany)(VI m) {
#if ASC_MULTI_ISA && ASC_ISA_ID == 4
    return ASC_F32 ? _mm512_test_epi32_mask((__m512i)m, (__m512i)m) != 0
                   : _mm512_test_epi64_mask((__m512i)m, (__m512i)m) != 0;
#elif ASC_MULTI_ISA && ASC_ISA_ID == 3
    return !_mm256_testz_si256((__m256i)m, (__m256i)m);
#else
    SINT acc = 0;
    for (int l = 0; l < VL; l++) acc |= m[l];
    return acc != 0;
#endif
}

/*
 * exp on a vector. float: the scalar asc_expf's algorithm (Cody-Waite reduction by ln 2,
 * degree-7 polynomial, < 2 ulp; 0 below -87.3; NaN kept). double: the same reduction with a
 * degree-13 Taylor polynomial (|r| <= ln2/2: truncation < 1e-17 relative; <= 2 ulp), 0 below
 * -708.3 (libm would give denormals down to -745). The integer n comes out of the rounding
 * constant's bits, so no float-to-integer conversion instruction is needed.
 */
ASC_INLINE VS FN(vexp)(VS x) {
#if ASC_F32
    const VS lo = FN(vset)(-87.3f), hi = FN(vset)(88.0f), magic = FN(vset)(12582912.0f);
    const VS xc = FN(vmin)(FN(vmax)(x, lo), hi);
    const VS nm = xc * 1.44269504f + magic; /* round(x / ln2) in the low mantissa bits */
    const VS n = nm - magic;
    const VS r = (xc - n * 0.693145752f) - n * 1.42860677e-6f;
    VS q = FN(vset)(1.98412698e-4f);
    q = q * r + 1.38888889e-3f;
    q = q * r + 8.33333333e-3f;
    q = q * r + 4.16666667e-2f;
    q = q * r + 1.66666667e-1f;
    q = q * r + 0.5f;
    q = q * r + 1.0f;
    q = q * r + 1.0f;
    const VI two_n = (((VI)nm - (VI)magic) + 127) << 23;
    return FN(vexp_fix)(x, lo, q * (VS)two_n);
#else
    const VS lo = FN(vset)(-708.3), hi = FN(vset)(709.0), magic = FN(vset)(6755399441055744.0);
    const VS xc = FN(vmin)(FN(vmax)(x, lo), hi);
    const VS nm = xc * 1.4426950408889634 + magic;
    const VS n = nm - magic;
    const VS r = (xc - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
    VS q = FN(vset)(1.0 / 6227020800.0);
    q = q * r + 1.0 / 479001600.0;
    q = q * r + 1.0 / 39916800.0;
    q = q * r + 1.0 / 3628800.0;
    q = q * r + 1.0 / 362880.0;
    q = q * r + 1.0 / 40320.0;
    q = q * r + 1.0 / 5040.0;
    q = q * r + 1.0 / 720.0;
    q = q * r + 1.0 / 120.0;
    q = q * r + 1.0 / 24.0;
    q = q * r + 1.0 / 6.0;
    q = q * r + 0.5;
    q = q * r + 1.0;
    q = q * r + 1.0;
    const VI two_n = (((VI)nm - (VI)magic) + 1023) << 52;
    return FN(vexp_fix)(x, lo, q * (VS)two_n);
#endif
}

/*
 * Row moments are sums of (w - K) and (w - K)^2 with a per-row shift K (docs/tiling.md §5),
 * accumulated in double lanes: VD holds ASC_VB / 8 doubles, NH of them cover one VS.
 */
typedef double FN(vd_t) __attribute__((vector_size(ASC_VB)));
#define VD FN(vd_t)
#if ASC_F32
#define NH 2
typedef float FN(vhf_t) __attribute__((vector_size(ASC_VB / 2)));
#else
#define NH 1
#endif
#define VDL (ASC_VB / 8) /* lanes of a VD */

/* s1 += x, s2 += x * x in double, lane by lane */
ASC_INLINE void FN(vacc2)(VD *s1, VD *s2, VS x) {
#if ASC_F32
    union { VS v; FN(vhf_t) h[2]; } u;
    u.v = x;
    #pragma GCC unroll 2
    for (int k = 0; k < 2; k++) {
        const VD dv = __builtin_convertvector(u.h[k], VD);
        s1[k] += dv;
        s2[k] += dv * dv;
    }
#else
    s1[0] += x;
    s2[0] += x * x;
#endif
}

/* s += x in double, lane by lane */
ASC_INLINE void FN(vacc1)(VD *s, VS x) {
#if ASC_F32
    union { VS v; FN(vhf_t) h[2]; } u;
    u.v = x;
    s[0] += __builtin_convertvector(u.h[0], VD);
    s[1] += __builtin_convertvector(u.h[1], VD);
#else
    s[0] += x;
#endif
}

/* s += a * b in double lanes, the product of the two SCALARs exact in double */
ASC_INLINE void FN(vaccp)(VD *s, VS a, VS b) {
#if ASC_F32
    union { VS v; FN(vhf_t) h[2]; } ua, ub;
    ua.v = a;
    ub.v = b;
    s[0] += __builtin_convertvector(ua.h[0], VD) * __builtin_convertvector(ub.h[0], VD);
    s[1] += __builtin_convertvector(ua.h[1], VD) * __builtin_convertvector(ub.h[1], VD);
#else
    s[0] += a * b;
#endif
}

/* p dS + q + r w with double row coefficients p, q, r (lanes o .. o + VL - 1 of [BM] arrays),
 * evaluated in double and rounded once: the three parts may cancel (a nearly degenerate row
 * normalization), the result must not inherit their rounding (docs/tiling.md §5). */
ASC_INLINE VS FN(vaffine)(const double *p, const double *q, const double *r, int o, VS dS, VS w) {
#if ASC_F32
    union { VS v; FN(vhf_t) h[2]; } a, b, out;
    a.v = dS;
    b.v = w;
    #pragma GCC unroll 2
    for (int k = 0; k < 2; k++) {
        const VD pd = *(const VD *)(p + o + k * VDL), qd = *(const VD *)(q + o + k * VDL);
        const VD rd = *(const VD *)(r + o + k * VDL);
        const VD x = pd * __builtin_convertvector(a.h[k], VD) + qd + rd * __builtin_convertvector(b.h[k], VD);
        out.h[k] = __builtin_convertvector(x, FN(vhf_t));
    }
    return out.v;
#else
    return *(const VD *)(p + o) * dS + *(const VD *)(q + o) + *(const VD *)(r + o) * w;
#endif
}

/* ---------------------------------------------------------------- micro-kernels */

/*
 * The register blocks below hold nm row vectors (MVB, or 1 for the last odd one) starting at vector mb;
 * a block whose rows all lie in its first mv vectors (a short block: few query rows, FN(asc_blk).mv)
 * computes only those, the other vectors of its tiles being left as they were (never read).
 * mv = ASC_MV_HALF (AVX-512 only, where a half-width vector costs half a full one): the rows lie in the
 * lower half of the first vector, and k_score and k_row compute that half only (FN(asc_blk).mvk).
 */
#define ASC_MV_HALF (-1)
#define VLH (VL / 2) /* lanes of a half vector */
typedef SCALAR FN(vsh_t) __attribute__((vector_size(ASC_VB / 2)));
#define VSH FN(vsh_t)

/* k_score's and k_row's register blocks for the lower half vector of rows (mv = ASC_MV_HALF): nr keys
 * (score) or nf features (row), one accumulator each */
ASC_INLINE void FN(k_score_half)(SCALAR *T, const SCALAR *At, SCALAR *T2, const SCALAR *At2, const SCALAR *B,
                                 int64_t ldb, int64_t F, const int nr) {
    VSH acc[K1_NR1], acc2[K1_NR1];
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) acc[r] = acc2[r] = (VSH){0};
    for (int64_t f = 0; f < F; f++) {
        const VSH av = *(const VSH *)(At + f * BM), av2 = At2 ? *(const VSH *)(At2 + f * BM) : (VSH){0};
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            const SCALAR b = B[r * ldb + f];
            acc[r] += av * b;
            if (At2) acc2[r] += av2 * b;
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        *(VSH *)(T + r * BM) = acc[r];
        if (At2) *(VSH *)(T2 + r * BM) = acc2[r];
    }
}

ASC_INLINE void FN(k_row_half)(SCALAR *Rt, const SCALAR *T, const SCALAR *B, int64_t ldb, int64_t nj, const int nf) {
    VSH acc[K2_NF];
    #pragma GCC unroll 8
    for (int r = 0; r < nf; r++) acc[r] = (VSH){0};
    for (int64_t j = 0; j < nj; j++) {
        const VSH tv = *(const VSH *)(T + j * BM);
        #pragma GCC unroll 8
        for (int r = 0; r < nf; r++) acc[r] += tv * B[j * ldb + r];
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nf; r++) *(VSH *)(Rt + r * BM) = acc[r];
}

/*
 * score: T[j][i] = sum_{f < F} At[f][i] B[j][f] for the nr keys j (B rows of stride ldb) and
 * every i < mv VL; At is [F][BM]. With At2, also T2 from At2 (each key value broadcast once).
 */
ASC_INLINE void FN(k_score1_part)(SCALAR *T, const SCALAR *At, const SCALAR *B, int64_t ldb, int64_t F,
                                  const int nr, int mb, const int nm) {
    VS acc[K1_NR1][MVB];
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        #pragma GCC unroll 2
        for (int m = 0; m < nm; m++) acc[r][m] = (VS){0};
    for (int64_t f = 0; f < F; f++) {
        VS av[MVB];
        #pragma GCC unroll 2
        for (int m = 0; m < nm; m++) av[m] = FN(vld)(At + f * BM + (mb + m) * VL);
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            const SCALAR b = B[r * ldb + f];
            #pragma GCC unroll 2
            for (int m = 0; m < nm; m++) acc[r][m] += av[m] * b;
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        #pragma GCC unroll 2
        for (int m = 0; m < nm; m++) FN(vst)(T + r * BM + (mb + m) * VL, acc[r][m]);
}

ASC_INLINE void FN(k_score2_part)(SCALAR *T, const SCALAR *At, SCALAR *T2, const SCALAR *At2, const SCALAR *B,
                                  int64_t ldb, int64_t F, const int nr, int mb, const int nm) {
    VS acc[K1_NR2][MVB], acc2[K1_NR2][MVB];
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        #pragma GCC unroll 2
        for (int m = 0; m < nm; m++) acc[r][m] = acc2[r][m] = (VS){0};
    for (int64_t f = 0; f < F; f++) {
        VS av[MVB], av2[MVB];
        #pragma GCC unroll 2
        for (int m = 0; m < nm; m++) {
            av[m] = FN(vld)(At + f * BM + (mb + m) * VL);
            av2[m] = FN(vld)(At2 + f * BM + (mb + m) * VL);
        }
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            const SCALAR b = B[r * ldb + f];
            #pragma GCC unroll 2
            for (int m = 0; m < nm; m++) {
                acc[r][m] += av[m] * b;
                acc2[r][m] += av2[m] * b;
            }
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        #pragma GCC unroll 2
        for (int m = 0; m < nm; m++) {
            FN(vst)(T + r * BM + (mb + m) * VL, acc[r][m]);
            FN(vst)(T2 + r * BM + (mb + m) * VL, acc2[r][m]);
        }
}

ASC_INLINE void FN(k_score1_blk)(SCALAR *T, const SCALAR *At, const SCALAR *B, int64_t ldb, int64_t F, const int nr,
                                 int mv) {
    for (int mb = 0; mb < mv; mb += MVB) {
        if (mb + MVB <= mv) FN(k_score1_part)(T, At, B, ldb, F, nr, mb, MVB);
        else for (int m = mb; m < mv; m++) FN(k_score1_part)(T, At, B, ldb, F, nr, m, 1);
    }
}

ASC_INLINE void FN(k_score2_blk)(SCALAR *T, const SCALAR *At, SCALAR *T2, const SCALAR *At2, const SCALAR *B,
                                 int64_t ldb, int64_t F, const int nr, int mv) {
    for (int mb = 0; mb < mv; mb += MVB) {
        if (mb + MVB <= mv) FN(k_score2_part)(T, At, T2, At2, B, ldb, F, nr, mb, MVB);
        else for (int m = mb; m < mv; m++) FN(k_score2_part)(T, At, T2, At2, B, ldb, F, nr, m, 1);
    }
}

ASC_UNUSED static void FN(k_score)(SCALAR *T, const SCALAR *At, SCALAR *T2, const SCALAR *At2, const SCALAR *B, int64_t ldb,
                        int64_t F, int64_t nj, int mv) {
    if (mv == ASC_MV_HALF) {
        const int nr = At2 ? K1_NR2 : K1_NR1;
        int64_t j = 0;
        if (At2) {
            for (; j + nr <= nj; j += nr) FN(k_score_half)(T + j * BM, At, T2 + j * BM, At2, B + j * ldb, ldb, F, K1_NR2);
            for (; j < nj; j++) FN(k_score_half)(T + j * BM, At, T2 + j * BM, At2, B + j * ldb, ldb, F, 1);
        } else {
            for (; j + nr <= nj; j += nr) FN(k_score_half)(T + j * BM, At, NULL, NULL, B + j * ldb, ldb, F, K1_NR1);
            for (; j < nj; j++) FN(k_score_half)(T + j * BM, At, NULL, NULL, B + j * ldb, ldb, F, 1);
        }
        return;
    }
    if (At2) {
        int64_t j = 0;
        for (; j + K1_NR2 <= nj; j += K1_NR2)
            FN(k_score2_blk)(T + j * BM, At, T2 + j * BM, At2, B + j * ldb, ldb, F, K1_NR2, mv);
        for (; j < nj; j++) FN(k_score2_blk)(T + j * BM, At, T2 + j * BM, At2, B + j * ldb, ldb, F, 1, mv);
    } else {
        int64_t j = 0;
        for (; j + K1_NR1 <= nj; j += K1_NR1) FN(k_score1_blk)(T + j * BM, At, B + j * ldb, ldb, F, K1_NR1, mv);
        for (; j < nj; j++) FN(k_score1_blk)(T + j * BM, At, B + j * ldb, ldb, F, 1, mv);
    }
}

/*
 * row: Rt[f][i] = sum_{j < nj} B[j][f] T[j][i] for f < F, every i < mv VL (overwrites those rows of Rt,
 * [F][BM]). safe: sums only the entries set in `mask` ([nj][BM], the tile's visibility), or, where mask is
 * NULL, the nonzero entries of T: a masked entry times a non-finite key value must not reach the row
 * (docs/tiling.md section 6), while a visible key's must, even where its weight underflowed to 0.
 */
ASC_INLINE void FN(k_row_part)(SCALAR *Rt, const SCALAR *T, const SCALAR *B, int64_t ldb, int64_t nj, const int nf,
                               int mb, const int nm) {
    VS acc[K2_NF][MVB];
    #pragma GCC unroll 8
    for (int r = 0; r < nf; r++)
        #pragma GCC unroll 2
        for (int m = 0; m < nm; m++) acc[r][m] = (VS){0};
    for (int64_t j = 0; j < nj; j++) {
        VS tv[MVB];
        #pragma GCC unroll 2
        for (int m = 0; m < nm; m++) tv[m] = FN(vld)(T + j * BM + (mb + m) * VL);
        #pragma GCC unroll 8
        for (int r = 0; r < nf; r++) {
            const SCALAR b = B[j * ldb + r];
            #pragma GCC unroll 2
            for (int m = 0; m < nm; m++) acc[r][m] += tv[m] * b;
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nf; r++)
        #pragma GCC unroll 2
        for (int m = 0; m < nm; m++) FN(vst)(Rt + r * BM + (mb + m) * VL, acc[r][m]);
}

ASC_INLINE void FN(k_row_blk)(SCALAR *Rt, const SCALAR *T, const SCALAR *B, int64_t ldb, int64_t nj, const int nf,
                              int mv) {
    for (int mb = 0; mb < mv; mb += MVB) {
        if (mb + MVB <= mv) FN(k_row_part)(Rt, T, B, ldb, nj, nf, mb, MVB);
        else for (int m = mb; m < mv; m++) FN(k_row_part)(Rt, T, B, ldb, nj, nf, m, 1);
    }
}

ASC_UNUSED static void FN(k_row)(SCALAR *Rt, const SCALAR *T, const SCALAR *B, int64_t ldb, int64_t F, int64_t nj, int safe,
                                 const SINT *mask, int mv) {
    if (safe) {
        for (int64_t f = 0; f < F; f++)
            for (int i = 0; i < (mv == ASC_MV_HALF ? VLH : mv * VL); i++) {
                SCALAR acc = 0;
                for (int64_t j = 0; j < nj; j++)
                    if (mask ? mask[j * BM + i] != 0 : T[j * BM + i] != 0) acc += T[j * BM + i] * B[j * ldb + f];
                Rt[f * BM + i] = acc;
            }
        return;
    }
    int64_t f = 0;
    if (mv == ASC_MV_HALF) {
        for (; f + K2_NF <= F; f += K2_NF) FN(k_row_half)(Rt + f * BM, T, B + f, ldb, nj, K2_NF);
        for (; f < F; f++) FN(k_row_half)(Rt + f * BM, T, B + f, ldb, nj, 1);
        return;
    }
    for (; f + K2_NF <= F; f += K2_NF) FN(k_row_blk)(Rt + f * BM, T, B + f, ldb, nj, K2_NF, mv);
    for (; f < F; f++) FN(k_row_blk)(Rt + f * BM, T, B + f, ldb, nj, 1, mv);
}

/*
 * column: C[j][f] += sum_{p < np} sum_{i < mi} Tp[j][i] Ap[i][f] for j < nj and f < Fp (a multiple
 * of VL; C has row stride ldc, every Ap row stride lda); mi <= BM: the rows past mi hold nothing (a
 * short block: few query rows). safe: skips the zero entries of the Tp. init: C holds nothing yet,
 * C[j][f] = the sum (no buffer to zero and read back).
 * Register block: nr keys x nfv feature vectors, nr = K3_ACC / nfv, so that a 32-feature output
 * still keeps K3_ACC independent accumulators in flight.
 */
#define K3_ACC (ASC_WIDE ? 16 : 8)
ASC_INLINE void FN(k_col_blk)(SCALAR *C, int64_t ldc, const SCALAR *const *T, const SCALAR *const *A, int np,
                              int64_t lda, int64_t fo, int mi, const int nr, const int nfv, int init) {
    VS acc[16][4];
    #pragma GCC unroll 16
    for (int r = 0; r < nr; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < nfv; v++) acc[r][v] = init ? (VS){0} : FN(vld)(C + r * ldc + fo + v * VL);
    for (int p = 0; p < np; p++) {
        const SCALAR *Tp = T[p], *Ap = A[p] + fo;
        for (int i = 0; i < mi; i++) {
            VS av[4];
            #pragma GCC unroll 4
            for (int v = 0; v < nfv; v++) av[v] = FN(vld)(Ap + i * lda + v * VL);
            #pragma GCC unroll 16
            for (int r = 0; r < nr; r++) {
                const SCALAR t = Tp[r * BM + i];
                #pragma GCC unroll 4
                for (int v = 0; v < nfv; v++) acc[r][v] += av[v] * t;
            }
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < nr; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < nfv; v++) FN(vst)(C + r * ldc + fo + v * VL, acc[r][v]);
}

ASC_INLINE void FN(k_col_part)(SCALAR *C, int64_t ldc, const SCALAR *const *T, const SCALAR *const *A, int np,
                               int64_t lda, int64_t fo, int64_t nj, int mi, const int nfv, int init) {
    const int nr = K3_ACC / nfv;
    int64_t j = 0;
    for (; j + nr <= nj; j += nr) {
        const SCALAR *Tj[3] = {T[0] + j * BM, np > 1 ? T[1] + j * BM : NULL, np > 2 ? T[2] + j * BM : NULL};
        FN(k_col_blk)(C + j * ldc, ldc, Tj, A, np, lda, fo, mi, nr, nfv, init);
    }
    for (; j < nj; j++) {
        const SCALAR *Tj[3] = {T[0] + j * BM, np > 1 ? T[1] + j * BM : NULL, np > 2 ? T[2] + j * BM : NULL};
        FN(k_col_blk)(C + j * ldc, ldc, Tj, A, np, lda, fo, mi, 1, nfv, init);
    }
}

ASC_UNUSED static void FN(k_col)(SCALAR *C, int64_t ldc, const SCALAR *const *T, const SCALAR *const *A, int np,
                                 int64_t lda, int64_t Fp, int64_t nj, int mi, int safe, int init) {
    if (safe) {
        for (int64_t j = 0; j < nj && init; j++) memset(C + j * ldc, 0, sizeof(SCALAR) * (size_t)Fp);
        for (int64_t j = 0; j < nj; j++)
            for (int p = 0; p < np; p++)
                for (int i = 0; i < mi; i++) {
                    const SCALAR t = T[p][j * BM + i];
                    if (t == 0) continue;
                    for (int64_t f = 0; f < Fp; f++) C[j * ldc + f] += t * A[p][i * lda + f];
                }
        return;
    }
    const int64_t nfv = Fp / VL;
    int64_t fv = 0;
    for (; fv + 4 <= nfv; fv += 4) FN(k_col_part)(C, ldc, T, A, np, lda, fv * VL, nj, mi, 4, init);
    for (; fv + 2 <= nfv; fv += 2) FN(k_col_part)(C, ldc, T, A, np, lda, fv * VL, nj, mi, 2, init);
    for (; fv < nfv; fv++) FN(k_col_part)(C, ldc, T, A, np, lda, fv * VL, nj, mi, 1, init);
}
