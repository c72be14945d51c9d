/*
 * ascender_plan_impl.h -- what the tiled forward and backward share (docs/tiling.md): the
 * prepared key data of every (batch, head), a query block's identity and per-tile masks, the
 * packing of a block's row operands, and the per-row coefficients of the scores, derived from
 * the saved statistics by one function for both directions. Generic over SCALAR / SINT / FN and
 * the ISA; included after ascender_tile_impl.h. No include guard on purpose.
 */

/* Prepared key data of all (b, h), O(B H N dz); the decode rows need only the per-batch masks'
 * arrays (pad, glob, gnext, run: asc_keys_alloc with geometry = 0 leaves the others NULL). */
typedef struct FN(asc_keys) {
    SCALAR *zt;      /* [BH][N][dz]: z_j - z0, the latents centred on the mean of the finite rows */
    SCALAR *nz;      /* [BH][N]: ||zt_j||^2 */
    SCALAR *rk;      /* [BH][N]: 1 / max(||k_j||, 1e-12) */
    SCALAR *hn;      /* [BH][N][da]: h_j / max(||h_j||, 1e-12) (norm in double): the kernels form the
                      * affinity from these, so no product of raw h can overflow (a is scale-free in h) */
    SCALAR *rh;      /* [BH][N]: 1 / max(||h_j||, 1e-12) (the backward's normalization of h^) */
    SCALAR *z0;      /* [BH][dz] */
    int32_t *bad;    /* [BH][N + 1]: prefix counts of tokens with a non-finite k, v, z or h */
    int32_t *pad;    /* [B][N + 1]: prefix counts of padded tokens, or NULL */
    int32_t *glob;   /* [B][N + 1]: prefix counts of global tokens (SPEC section 8), or NULL */
    int32_t *gnext;  /* [B][N + 1]: the first global token >= j (N: none), or NULL */
    int32_t *run;    /* [B][N]: first token of the run of equal document_ids that holds token j, or NULL */
    int64_t bh0;     /* the geometry arrays (zt .. bad) hold (b, h) bh0, bh0 + 1, ...: 0 (all of them), or the
                      * one (b, h) a thread prepares at a time (the backward of short queries) */
} FN(asc_keys);

/* The slot of (b, h) bh in the geometry arrays: zt + slot N dz, nz + slot N, ... */
ASC_UNUSED static int64_t FN(asc_kslot)(const FN(asc_keys) *kp, int64_t bh) { return bh - kp->bh0; }

ASC_UNUSED static void FN(asc_keys_geometry_free)(FN(asc_keys) *kp) {
    free(kp->zt); free(kp->nz); free(kp->rk); free(kp->hn); free(kp->rh); free(kp->z0); free(kp->bad);
    kp->zt = kp->nz = kp->rk = kp->hn = kp->rh = kp->z0 = NULL;
    kp->bad = NULL;
}

/* The geometry arrays for `slots` (b, h); 1 (and none) if an allocation fails. */
ASC_UNUSED static int FN(asc_keys_geometry)(FN(asc_keys) *kp, const asc_params *p, int64_t slots) {
    const size_t n = (size_t)slots, N = (size_t)p->N, S = sizeof(SCALAR), dz = (size_t)(p->dz ? p->dz : 1);
    kp->zt = malloc(S * n * N * dz);
    kp->nz = malloc(S * n * N);
    kp->rk = malloc(S * n * N);
    kp->rh = malloc(S * n * N);
    kp->hn = malloc(S * n * N * (size_t)(p->da ? p->da : 1));
    kp->z0 = malloc(S * n * dz);
    kp->bad = malloc(sizeof(int32_t) * n * (N + 1));
    if (kp->zt && kp->nz && kp->rk && kp->hn && kp->rh && kp->z0 && kp->bad) return 0;
    FN(asc_keys_geometry_free)(kp);
    return 1;
}

ASC_UNUSED static void FN(asc_keys_free)(FN(asc_keys) *kp) {
    FN(asc_keys_geometry_free)(kp);
    free(kp->pad); free(kp->glob); free(kp->gnext); free(kp->run);
}

ASC_UNUSED static int FN(asc_keys_alloc)(FN(asc_keys) *kp, const asc_params *p, const asc_fwd_args *a, int geometry) {
    const int with_pad = a->key_padding_mask != NULL, with_glob = p->n_global > 0 || a->global_mask != NULL;
    const size_t N = (size_t)p->N;
    memset(kp, 0, sizeof(*kp));
    const int nogeo = geometry && FN(asc_keys_geometry)(kp, p, p->B * p->H); /* every (b, h), bh0 = 0 */
    kp->pad = with_pad ? malloc(sizeof(int32_t) * (size_t)p->B * (N + 1)) : NULL;
    kp->glob = with_glob ? malloc(sizeof(int32_t) * (size_t)p->B * (N + 1)) : NULL;
    kp->gnext = with_glob ? malloc(sizeof(int32_t) * (size_t)p->B * (N + 1)) : NULL;
    kp->run = a->document_ids ? malloc(sizeof(int32_t) * (size_t)p->B * (N ? N : 1)) : NULL;
    if (!nogeo && (kp->pad || !with_pad) &&
        (kp->glob || !with_glob) && (kp->gnext || !with_glob) && (kp->run || !a->document_ids))
        return 0;
    FN(asc_keys_free)(kp);
    return 1;
}

ASC_UNUSED static int FN(asc_row_finite)(const SCALAR *x, int64_t f) {
    int ok = 1;
    for (int64_t c = 0; c < f; c++) ok &= isfinite(x[c]) != 0;
    return ok;
}

/* Whether x[0 .. n) is all finite: the sum of x * 0 is 0, or NaN where some x is not (vector adds into
 * four accumulators and one horizontal sum, no compare per element: the key preparation checks a tile of
 * keys' rows at once, and each key's rows only where that fails) */
ASC_UNUSED static int FN(asc_all_finite)(const SCALAR *x, int64_t n) {
    const VS zero = FN(vset)(0);
    VS s0 = zero, s1 = zero, s2 = zero, s3 = zero;
    int64_t c = 0;
    for (; c + 4 * VL <= n; c += 4 * VL) {
        s0 += FN(vldu)(x + c) * zero;
        s1 += FN(vldu)(x + c + VL) * zero;
        s2 += FN(vldu)(x + c + 2 * VL) * zero;
        s3 += FN(vldu)(x + c + 3 * VL) * zero;
    }
    const VS t = (s0 + s1) + (s2 + s3);
    SCALAR s = 0;
    for (; c < n; c++) s += x[c] * (SCALAR)0;
    for (int l = 0; l < VL; l++) s += t[l];
    return s == 0;
}

/* 1 / max(||x||, 1e-12), the norm in double (a vector sum: a serial one would be the cost of every key
 * preparation) */
ASC_UNUSED static SCALAR FN(asc_inv_norm)(const SCALAR *x, int64_t f) {
    double ss = 0.0;
    #pragma omp simd reduction(+:ss)
    for (int64_t c = 0; c < f; c++) ss += (double)x[c] * x[c];
    const double n = sqrt(ss);
    return (SCALAR)(1.0 / (n > ASC_EPS_NORM ? n : ASC_EPS_NORM));
}

/* Prepares the keys of (b, h) bh into its slot of the geometry arrays. */
ASC_UNUSED static void FN(asc_keys_prep)(FN(asc_keys) *kp, const asc_params *p, const asc_fwd_args *a, int64_t bh) {
    const int64_t N = p->N, d = p->d, dv = p->dv, dz = p->dz, da = p->da, ks = FN(asc_kslot)(kp, bh);
    const SCALAR *k = (const SCALAR *)a->k + bh * N * d, *v = (const SCALAR *)a->v + bh * N * dv;
    const SCALAR *z = (const SCALAR *)a->z + bh * N * dz, *h = (const SCALAR *)a->h + bh * N * da;
    SCALAR *zt = kp->zt + ks * N * dz, *z0 = kp->z0 + ks * dz;
    int32_t *bad = kp->bad + ks * (N + 1);
    const int zfin = FN(asc_all_finite)(z, N * dz); /* (z: every latent row counts in the centre) */
    /* the centre: mean of the finite latent rows (distances and the cohesion terms are
     * translation invariant; centring keeps ||z_i||^2 + ||z_j||^2 - 2 z_i.z_j well conditioned) */
    int64_t nfin = 0;
    for (int64_t c = 0; c < dz; c++) z0[c] = 0;
    {
        double *acc = calloc((size_t)(dz ? dz : 1), sizeof(double));
        if (acc) {
            for (int64_t j = 0; j < N; j++)
                if (zfin || FN(asc_row_finite)(z + j * dz, dz)) {
                    nfin++;
                    for (int64_t c = 0; c < dz; c++) acc[c] += (double)z[j * dz + c];
                }
            for (int64_t c = 0; c < dz; c++) z0[c] = nfin ? (SCALAR)(acc[c] / (double)nfin) : (SCALAR)0;
            free(acc);
        }
    }
    bad[0] = 0;
    int tfin = 0; /* every input of the current tile of keys is finite (the rule): no check per key */
    for (int64_t j = 0; j < N; j++) {
        if (j % BN == 0) {
            const int64_t nj = N - j < BN ? N - j : BN;
            tfin = FN(asc_all_finite)(k + j * d, nj * d) && FN(asc_all_finite)(v + j * dv, nj * dv) &&
                   FN(asc_all_finite)(z + j * dz, nj * dz) && FN(asc_all_finite)(h + j * da, nj * da);
        }
        double ss = 0.0;
        #pragma omp simd reduction(+:ss)
        for (int64_t c = 0; c < dz; c++) {
            const SCALAR t = z[j * dz + c] - z0[c];
            zt[j * dz + c] = t;
            ss += (double)t * t;
        }
        kp->nz[ks * N + j] = (SCALAR)ss;
        kp->rk[ks * N + j] = FN(asc_inv_norm)(k + j * d, d);
        const SCALAR rh = FN(asc_inv_norm)(h + j * da, da);
        kp->rh[ks * N + j] = rh;
        for (int64_t c = 0; c < da; c++) kp->hn[(ks * N + j) * da + c] = h[j * da + c] * rh;
        const int fin = tfin || (FN(asc_row_finite)(k + j * d, d) && FN(asc_row_finite)(v + j * dv, dv) &&
                                 FN(asc_row_finite)(z + j * dz, dz) && FN(asc_row_finite)(h + j * da, da));
        bad[j + 1] = bad[j] + !fin;
    }
}

/* Fills the prepared key data (the geometry of every (b, h) where kp holds all of them, asc_keys_alloc, and
 * the per-batch arrays); called by every thread of the team (static loops, ends with a barrier). */
ASC_UNUSED static void FN(asc_keys_fill)(FN(asc_keys) *kp, const asc_params *p, const asc_fwd_args *a) {
    const int64_t N = p->N, BH = kp->zt ? p->B * p->H : 0;
    #pragma omp for schedule(static) nowait
    for (int64_t bh = 0; bh < BH; bh++) FN(asc_keys_prep)(kp, p, a, bh);
    if (kp->pad) {
        #pragma omp for schedule(static) nowait
        for (int64_t b = 0; b < p->B; b++) {
            int32_t *pad = kp->pad + b * (N + 1);
            const uint8_t *m = a->key_padding_mask + b * N;
            pad[0] = 0;
            for (int64_t j = 0; j < N; j++) pad[j + 1] = pad[j] + (m[j] != 0);
        }
    }
    if (kp->glob) {
        #pragma omp for schedule(static) nowait
        for (int64_t b = 0; b < p->B; b++) {
            int32_t *g = kp->glob + b * (N + 1);
            const uint8_t *m = a->global_mask ? a->global_mask + b * N : NULL;
            g[0] = 0;
            for (int64_t j = 0; j < N; j++) g[j + 1] = g[j] + (j < p->n_global || (m && m[j]));
            int32_t *nx = kp->gnext + b * (N + 1);
            nx[N] = (int32_t)N;
            for (int64_t j = N - 1; j >= 0; j--) nx[j] = g[j + 1] > g[j] ? (int32_t)j : nx[j + 1];
        }
    }
    if (kp->run) {
        #pragma omp for schedule(static) nowait
        for (int64_t b = 0; b < p->B; b++) {
            int32_t *r = kp->run + b * N;
            const int64_t *doc = a->document_ids + b * N;
            for (int64_t j = 0; j < N; j++) r[j] = j > 0 && doc[j] == doc[j - 1] ? r[j - 1] : (int32_t)j;
        }
    }
    #pragma omp barrier
}

/* ---------------------------------------------------------------- a query block */

/* The bit set of rows 0 .. n - 1 of a block (n <= BM <= 64). */
ASC_UNUSED static uint64_t FN(asc_first_rows)(int64_t n) { return n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1; }

/* The row vectors that hold the rows of a bit set: up to its last row. */
ASC_UNUSED static int FN(asc_row_vectors)(uint64_t rows) { return rows ? (64 - __builtin_clzll(rows) + VL - 1) / VL : 0; }
#ifndef ASC_ROW_IN
#define ASC_ROW_IN(rows, i) ((((rows) >> (i)) & 1) != 0)
#endif

typedef struct FN(asc_blk) {
    int64_t b, hd, bh;
    int64_t i0, nrows; /* query rows i0 .. i0 + nrows - 1 */
    uint64_t rows;     /* bit i: row i0 + i takes part in the pairs (every i < nrows in the forward; the
                        * backward drops the rows without an upstream gradient or a visible key, SPEC section 11) */
    int64_t t0, tlast; /* their tokens: t0 = i0 + N - Nq - keys_after, tlast = t0 + nrows - 1 */
    const uint8_t *kpm;  /* key_padding_mask + b N, or NULL */
    const int32_t *pad;  /* prefix counts of padding of batch b, or NULL */
    const uint8_t *am;   /* attn_mask + b sb + h sh, or NULL */
    const int32_t *bad;  /* prefix counts of non-finite keys of (b, h) */
    const int32_t *glob; /* prefix counts of global tokens of batch b, or NULL */
    const int32_t *gnext; /* the first global token >= j of batch b, or NULL */
    const int32_t *run;  /* document runs of batch b (asc_keys), or NULL */
    const int64_t *doc;  /* document_ids + b N, or NULL */
    int windowed;        /* window_size, global tokens or documents restrict J(i) (SPEC section 8) */
    int mrows;           /* rows of the tile masks: BM, or 1 for a decode row (asc_dec_row) */
    int mv;              /* the row vectors (VL rows each) up to the last row in `rows`: the tiles' products
                          * and epilogues compute those only (a short block: few query rows) */
    int mvk;             /* the products' width (k_score, k_row): mv, or ASC_MV_HALF (asc_kernel_vectors) */
    int badrows;         /* some row of the block has a non-finite operand */
} FN(asc_blk);

ASC_UNUSED static void FN(asc_blk_init)(FN(asc_blk) *bk, const asc_params *p, const asc_fwd_args *a, const FN(asc_keys) *kp,
                             int64_t bh, int64_t blk) {
    const int64_t N = p->N;
    bk->bh = bh;
    bk->b = bh / p->H;
    bk->hd = bh % p->H;
    bk->i0 = blk * BM;
    bk->nrows = p->Nq - bk->i0 < BM ? p->Nq - bk->i0 : BM;
    bk->rows = FN(asc_first_rows)(bk->nrows);
    bk->t0 = bk->i0 + N - p->Nq - p->keys_after;
    bk->tlast = bk->t0 + bk->nrows - 1;
    bk->kpm = a->key_padding_mask ? a->key_padding_mask + bk->b * N : NULL;
    bk->pad = kp->pad ? kp->pad + bk->b * (N + 1) : NULL;
    bk->am = a->attn_mask ? a->attn_mask + bk->b * p->am_sb + bk->hd * p->am_sh : NULL;
    bk->bad = kp->bad ? kp->bad + FN(asc_kslot)(kp, bh) * (N + 1) : NULL;
    bk->glob = kp->glob ? kp->glob + bk->b * (N + 1) : NULL;
    bk->gnext = kp->gnext ? kp->gnext + bk->b * (N + 1) : NULL;
    bk->run = kp->run ? kp->run + bk->b * N : NULL;
    bk->doc = a->document_ids ? a->document_ids + bk->b * N : NULL;
    bk->windowed = p->window_left >= 0 || p->window_right >= 0 || bk->glob || bk->doc;
    bk->badrows = 0;
    bk->mrows = BM;
    bk->mv = FN(asc_row_vectors)(bk->rows);
    bk->mvk = bk->mv;
}

/* The products' width for a block's rows: ASC_MV_HALF where they all lie in the lower half of the first
 * vector and a half vector costs half a full one (AVX-512: 32 registers, and 512-bit operations take
 * twice a 256-bit one's issue slots on the cores that split them), else the row vectors. */
ASC_UNUSED static int FN(asc_kernel_vectors)(uint64_t rows) {
    return ASC_WIDE && rows != 0 && (rows >> VLH) == 0 ? ASC_MV_HALF : FN(asc_row_vectors)(rows);
}

/* Key range [0, end) a block's statistics (T) or softmax (J) can touch. */
ASC_UNUSED static int64_t FN(asc_stat_end)(const asc_params *p, const FN(asc_blk) *bk) {
    return p->is_causal && p->mask_stats ? bk->tlast + 1 : p->N;
}
ASC_UNUSED static int64_t FN(asc_soft_end)(const asc_params *p, const FN(asc_blk) *bk) {
    return p->is_causal ? bk->tlast + 1 : p->N;
}

#ifndef ASC_PLAN_ONCE
#define ASC_PLAN_ONCE
enum {
    ASC_T_ANY = 1,   /* some entry of the tile is in a statistics set T(i) */
    ASC_J_ANY = 2,   /* some entry is in a softmax set J(i) */
    ASC_T_FULL = 4,  /* every entry (valid row, key < nj) is in T: no mask needed */
    ASC_J_FULL = 8,
    ASC_DIAG = 16,   /* the tile holds some row's own token */
    ASC_BADKEY = 32  /* some key of the tile has a non-finite input */
};
enum { ASC_VIS_NONE, ASC_VIS_ALL, ASC_VIS_SOME };
#endif

/* The structured visibility of the tile (SPEC section 8) for every (row, key) at once:
 * ASC_VIS_NONE (no pair visible: the tile is skipped in O(1)), ASC_VIS_ALL (every pair), or
 * ASC_VIS_SOME (decided per pair by asc_visible). */
ASC_UNUSED static int FN(asc_tile_visibility)(const asc_params *p, const FN(asc_blk) *bk, int64_t j0, int64_t nj) {
    const int64_t L = p->window_left, R = p->window_right, jl = j0, jh = j0 + nj - 1;
    const int all_in = (L < 0 || jl >= bk->tlast - L) && (R < 0 || jh <= bk->t0 + R);
    const int none_in = (L >= 0 && jh < bk->t0 - L) || (R >= 0 && jl > bk->tlast + R);
    const int globals = bk->glob && (bk->glob[jh + 1] > bk->glob[jl] || bk->glob[bk->tlast + 1] > bk->glob[bk->t0]);
    int vis = all_in ? ASC_VIS_ALL : (none_in && !globals ? ASC_VIS_NONE : ASC_VIS_SOME);
    if (bk->doc && vis != ASC_VIS_NONE) {
        /* rows and keys each inside one run of equal ids: all in one document, or none */
        const int rows_one = bk->run[bk->tlast] <= bk->t0, keys_one = bk->run[jh] <= jl;
        if (rows_one && keys_one) vis = bk->doc[bk->t0] == bk->doc[jl] ? vis : ASC_VIS_NONE;
        else vis = ASC_VIS_SOME;
    }
    return vis;
}

/* The first key tile at or after j0 (a multiple of BN) that some row of the block may see through its
 * window or a global key: the sweeps jump over the others, so a windowed block visits O(w + g) keys,
 * not every tile (p->N: none left). Without a window, or for a block with a global row, j0. */
ASC_UNUSED static int64_t FN(asc_next_tile)(const asc_params *p, const FN(asc_blk) *bk, int64_t j0) {
    const int64_t L = p->window_left, R = p->window_right;
    if ((L < 0 && R < 0) || j0 >= p->N || (bk->glob && bk->glob[bk->tlast + 1] > bk->glob[bk->t0])) return j0;
    const int64_t lo = L < 0 ? 0 : bk->t0 - L, hi = R < 0 ? p->N : bk->tlast + R + 1; /* window keys [lo, hi) */
    if (j0 + BN > lo && j0 < hi) return j0;
    int64_t next = bk->gnext ? bk->gnext[j0] : p->N;
    if (j0 < lo && lo < next) next = lo;
    return next >= p->N ? p->N : next / BN * BN;
}

/* Query token t sees key j through the window, a global token and its document (SPEC section 8). */
ASC_UNUSED static int FN(asc_visible)(const asc_params *p, const FN(asc_blk) *bk, int64_t t, int64_t j) {
    int vis = (p->window_left < 0 || j >= t - p->window_left) && (p->window_right < 0 || j <= t + p->window_right);
    if (!vis && bk->glob) vis = bk->glob[j + 1] > bk->glob[j] || bk->glob[t + 1] > bk->glob[t];
    return vis && (!bk->doc || bk->doc[t] == bk->doc[j]);
}

/*
 * Classifies the tile of keys j0 .. j0 + nj - 1 for block bk and, unless it is full, writes
 * the masks mT, mJ [nj][bk->mrows] (-1 in the set, 0 outside; rows not in bk->rows are outside).
 */
ASC_UNUSED static int FN(asc_tile_masks)(const asc_params *p, const FN(asc_blk) *bk, int64_t j0, int64_t nj, SINT *mT,
                              SINT *mJ) {
    int flags = 0;
    const int vis = bk->windowed ? FN(asc_tile_visibility)(p, bk, j0, nj) : ASC_VIS_ALL;
    if (vis == ASC_VIS_NONE) return 0;
    const int M = bk->mrows, rows_full = bk->rows == FN(asc_first_rows)(M);
    const int cut = p->is_causal && j0 + nj - 1 > bk->t0;
    const int pad_in = bk->pad && bk->pad[j0 + nj] - bk->pad[j0] > 0;
    if (j0 <= bk->tlast && j0 + nj > bk->t0) flags |= ASC_DIAG;
    if (bk->bad && bk->bad[j0 + nj] - bk->bad[j0] > 0) flags |= ASC_BADKEY;
    const int jfull = rows_full && !cut && !pad_in && !bk->am && vis == ASC_VIS_ALL;
    const int tfull = p->mask_stats ? jfull : rows_full;
    if (jfull && tfull) return flags | ASC_T_ANY | ASC_J_ANY | ASC_T_FULL | ASC_J_FULL;
    if (!cut && !pad_in && !bk->am && vis == ASC_VIS_ALL) { /* only the row set: each key's column is the same */
        for (int i = 0; i < M; i++) mJ[i] = mT[i] = ASC_ROW_IN(bk->rows, i) ? (SINT)-1 : 0;
        for (int64_t j = 1; j < nj; j++) {
            memcpy(mJ + j * M, mJ, sizeof(SINT) * (size_t)M);
            memcpy(mT + j * M, mJ, sizeof(SINT) * (size_t)M);
        }
        return flags | (bk->rows ? ASC_T_ANY | ASC_J_ANY : 0); /* (not all rows: no full tile) */
    }
    int tall = 1, jall = 1, tany = 0, jany = 0;
    for (int64_t j = 0; j < nj; j++) {
        const int64_t key = j0 + j;
        const int padded = bk->kpm && bk->kpm[key];
        for (int i = 0; i < M; i++) {
            const int row = ASC_ROW_IN(bk->rows, i);
            int ok = row && !padded && !(p->is_causal && key > bk->t0 + i);
            if (ok && bk->am) ok = bk->am[(bk->i0 + i) * p->am_si + key * p->am_sj] != 0;
            if (ok && vis == ASC_VIS_SOME) ok = FN(asc_visible)(p, bk, bk->t0 + i, key);
            const int inT = p->mask_stats ? ok : row;
            mJ[j * M + i] = ok ? (SINT)-1 : 0;
            mT[j * M + i] = inT ? (SINT)-1 : 0;
            jall &= ok;
            tall &= inT;
            jany |= ok;
            tany |= inT;
        }
    }
    return flags | (tany ? ASC_T_ANY : 0) | (jany ? ASC_J_ANY : 0) | (tall ? ASC_T_FULL : 0) | (jall ? ASC_J_FULL : 0);
}

/* ---------------------------------------------------------------- packing of row operands */

/* dst[f][BM] = src[r][f] for the rows r in `rows` (row stride lds), 0 for the other rows (never
 * read: a dropped row's inputs may be non-finite); scaled by s. */
ASC_UNUSED static void FN(asc_pack_t)(SCALAR *dst, const SCALAR *src, int64_t lds, uint64_t rows, int64_t F, SCALAR s) {
    for (int64_t f = 0; f < F; f++)
        for (int i = 0; i < BM; i++) dst[f * BM + i] = ASC_ROW_IN(rows, i) ? s * src[i * lds + f] : (SCALAR)0;
}

/* dst[r][Fp] = src[r][f] (row stride lds) for the rows r in `rows`, f < F; zero elsewhere; scaled by s. */
ASC_UNUSED static void FN(asc_pack_r)(SCALAR *dst, int64_t Fp, const SCALAR *src, int64_t lds, uint64_t rows, int64_t F,
                           SCALAR s) {
    for (int i = 0; i < BM; i++)
        for (int64_t f = 0; f < Fp; f++)
            dst[i * Fp + f] = ASC_ROW_IN(rows, i) && f < F ? s * src[i * lds + f] : (SCALAR)0;
}

/* Round up to the vector length. */
ASC_UNUSED static int64_t FN(asc_padded)(int64_t f) { return (f + VL - 1) / VL * VL; }

/* ---------------------------------------------------------------- per-row coefficients */

/* Element e of a SCALAR array of asc_fwd_args, in double; head hd's value of a learnable scalar (SPEC order
 * lambda_align .. kappa). */
#define ASC_ELEM(a, name, e) ((double)((const SCALAR *)(a)->name)[e])
#define ASC_HEAD(a, name, hd) ASC_ELEM(a, name, ASC_SCALAR_HEAD(a, ASC_SCALAR_##name, hd))

/*
 * Everything about a row that the score tiles need, derived from its saved statistics (already
 * rounded to SCALAR) -- by the forward right after it computed them and by the backward from
 * the saved tensor, so both evaluate every x_ij with identical coefficients (docs/tiling.md §4):
 *   x_ij = cs s'_ij + ca r_ij + cphi phi_ij + cc rc_ij + x0 + itemp beta_other,ij
 * with s' = q_i.k_j (scale folded into cs), the raw rows r = k^_j.u_i, phi, rc = ||z_j - c_i||^2.
 */
typedef struct FN(asc_coef) {
    double itemp, eta, gate_a, gate_c, rho, wsum, G, unorm, lse, kap;
    double cap; /* softcap / (score_temp + 1e-6): x <- cap tanh(x / cap) (SPEC section 9); 0: off */
    int outside; /* the cap leaves beta_other out: x <- cap tanh((x - xo) / cap) + xo, xo = itemp beta_other */
    double theta[3], mean[3], sd[3], wnorm[3];
    double cs, ca, cphi, cc, x0;
    int64_t n;
    int norm;
} FN(asc_coef);

ASC_UNUSED static void FN(asc_coef_from_stats)(FN(asc_coef) *c, const SCALAR *st, const asc_params *p, const asc_fwd_args *a,
                                    int64_t hd) {
    const double tcoh = p->tau_coh + ASC_EPS_TAU;
    c->lse = (double)st[ASC_STAT_LSE];
    c->rho = (double)st[ASC_STAT_RHO];
    c->wsum = (double)st[ASC_STAT_WC_SUM];
    c->gate_a = (double)st[ASC_STAT_GATE_A];
    c->gate_c = (double)st[ASC_STAT_GATE_C];
    c->unorm = (double)st[ASC_STAT_UNORM];
    c->G = (double)st[ASC_STAT_COH_SPREAD];
    c->n = (int64_t)st[ASC_STAT_COUNT];
    c->norm = c->n > 1;
    c->kap = ASC_HEAD(a, kappa, hd) + ASC_EPS_TAU;
    c->eta = asc_clamp01(c->rho / c->kap);
    c->theta[0] = ASC_HEAD(a, lambda_align, hd) * c->gate_a;
    c->theta[1] = -ASC_HEAD(a, lambda_sep, hd) * c->eta;
    c->theta[2] = -ASC_HEAD(a, lambda_coh, hd) * c->gate_c / tcoh;
    const double omega[3] = {ASC_HEAD(a, omega_align, hd), ASC_HEAD(a, omega_sep, hd), ASC_HEAD(a, omega_coh, hd)};
    c->itemp = 1.0 / (ASC_HEAD(a, score_temp, hd) + ASC_EPS_TAU);
    c->x0 = 0.0;
    for (int x = 0; x < 3; x++) {
        c->mean[x] = (double)st[ASC_STAT_MEAN_A + 2 * x];
        c->sd[x] = (double)st[ASC_STAT_STD_A + 2 * x];
        /* n <= 1: the normalized row is 0, times omega (a NaN omega makes the row NaN: SPEC section 11) */
        c->wnorm[x] = c->norm ? omega[x] / (c->sd[x] + ASC_EPS_STD) : omega[x] * 0.0;
        c->x0 -= c->itemp * c->wnorm[x] * c->mean[x];
    }
    c->cap = p->softcap > 0 ? p->softcap * c->itemp : 0.0;
    c->outside = p->softcap_outside;
    c->cs = p->scale * c->itemp;
    c->ca = c->itemp * c->wnorm[0] * c->theta[0];
    c->cphi = c->itemp * c->wnorm[1] * c->theta[1];
    c->cc = c->itemp * c->wnorm[2] * c->theta[2];
}

/* beta_other of the tile: ob[j][i] = attn_bias[b, h, i, j] - slope_bh |t_i - j| (0 for rows not in bk->rows). */
ASC_UNUSED static void FN(asc_other_tile)(SCALAR *ob, const asc_params *p, const asc_fwd_args *a, const FN(asc_blk) *bk,
                               int64_t j0, int64_t nj) {
    const SCALAR *ab = a->attn_bias ? (const SCALAR *)a->attn_bias + bk->b * p->ab_sb + bk->hd * p->ab_sh : NULL;
    const double slope = a->alibi_slopes ? (double)((const SCALAR *)a->alibi_slopes)[bk->bh] : 0.0;
    for (int64_t j = 0; j < nj; j++)
        for (int i = 0; i < BM; i++) {
            double v = 0.0;
            if (ASC_ROW_IN(bk->rows, i)) {
                const int64_t key = j0 + j, t = bk->t0 + i;
                if (ab) v += (double)ab[(bk->i0 + i) * p->ab_si + key * p->ab_sj];
                v -= slope * (double)(t > key ? t - key : key - t);
            }
            ob[j * BM + i] = (SCALAR)v;
        }
}

/* Attention dropout of the tile (SPEC section 9b, csrc/philox.h): M[j][i] = keep where the pair (row
 * i's token, key j0 + j) is kept, 0 where it is dropped, for every row of the block (a row not in
 * bk->rows has nothing to drop: its entries of the tiles it multiplies are 0; rows past bk->mv vectors are
 * not computed). One Philox call gives the words of four keys of the sequence, J = j + the stream's
 * token offset from 4 G on (with no offset the tile's keys j0 .. are whole groups: j0 is a multiple of 4). */
ASC_UNUSED static void FN(asc_dropout_tile)(SCALAR *M, const asc_params *p, const asc_fwd_args *a, const FN(asc_blk) *bk,
                                            int64_t j0, int64_t nj, SCALAR keep) {
    const asc_dropout_stream s = asc_dropout_stream_of(a->dropout_seed, bk->bh);
    const uint32_t thr = p->dropout_threshold;
    const int rows = bk->mv * VL;
    const int64_t first = j0 + s.tok, end = first + nj; /* the sequence's keys of the tile */
    for (int64_t G = first >> 2; 4 * G < end; G++) {
        uint32_t words[4][BM];
        for (int i = 0; i < rows; i++) {
            const asc_philox4 w = asc_dropout_words(s, bk->t0 + i + s.tok, G);
            for (int q = 0; q < 4; q++) words[q][i] = w.w[q];
        }
        for (int64_t J = 4 * G > first ? 4 * G : first; J < 4 * G + 4 && J < end; J++)
            for (int i = 0; i < rows; i++) M[(J - first) * BM + i] = words[J & 3][i] >= thr ? keep : (SCALAR)0;
    }
}

/* Row tokens of a block as a SINT vector for lanes o .. o + VL - 1. */
ASC_INLINE VI FN(asc_row_tokens)(int64_t t0, int o) {
    VI v;
    for (int l = 0; l < VL; l++) v[l] = (SINT)(t0 + o + l);
    return v;
}

/* ---------------------------------------------------------------- the scores of a tile */

/*
 * The scores of a tile for the rows of vector o, as both directions compute them: x (and, when
 * asked, rc and phi) at tile entry (j, o..o+VL-1). G3 = q.k, G4 = u.k, G5 = c~.zt, G1 = zt.zt,
 * G2 = h.h; OB = beta_other (when other). Every x_ij is the same expression in forward and
 * backward, so the bits agree.
 */
typedef struct FN(asc_xvec) {
    VS cs, ca, cphi, cc, x0, itemp, nzi, ncc;
    VS cap, icap; /* the rows' softcap on x (asc_coef.cap) and its inverse; capped: some row has one */
    VI tok;
    int capped, outside; /* outside: the cap leaves beta_other out (asc_coef.outside) */
} FN(asc_xvec);

ASC_INLINE void FN(asc_xvec_load)(FN(asc_xvec) *xv, const FN(asc_coef) *coef, const SCALAR *nzr,
                                  const SCALAR *ncc, int64_t t0, int o) {
    enum { L_CS, L_CA, L_CPHI, L_CC, L_X0, L_ITEMP, L_CAP, L_ICAP, L_N };
    SCALAR lane[L_N][VL] __attribute__((aligned(64))); /* the rows' coefficients, loaded as vectors */
    for (int l = 0; l < VL; l++) {
        const FN(asc_coef) *c = coef + o + l;
        lane[L_CS][l] = (SCALAR)c->cs;
        lane[L_CA][l] = (SCALAR)c->ca;
        lane[L_CPHI][l] = (SCALAR)c->cphi;
        lane[L_CC][l] = (SCALAR)c->cc;
        lane[L_X0][l] = (SCALAR)c->x0;
        lane[L_ITEMP][l] = (SCALAR)c->itemp;
        lane[L_CAP][l] = (SCALAR)c->cap;
        lane[L_ICAP][l] = c->cap != 0.0 ? (SCALAR)(1.0 / c->cap) : (SCALAR)0;
    }
    xv->cs = FN(vld)(lane[L_CS]);
    xv->ca = FN(vld)(lane[L_CA]);
    xv->cphi = FN(vld)(lane[L_CPHI]);
    xv->cc = FN(vld)(lane[L_CC]);
    xv->x0 = FN(vld)(lane[L_X0]);
    xv->itemp = FN(vld)(lane[L_ITEMP]);
    xv->cap = FN(vld)(lane[L_CAP]);
    xv->icap = FN(vld)(lane[L_ICAP]);
    xv->capped = xv->outside = 0;
    for (int l = 0; l < VL; l++) {
        xv->capped |= coef[o + l].cap != 0.0;
        xv->outside |= coef[o + l].outside; /* (a dropped row's coefficients are 0) */
    }
    xv->nzi = FN(vld)(nzr + o);
    xv->ncc = FN(vld)(ncc + o);
    xv->tok = FN(asc_row_tokens)(t0, o);
}

/* The softcap on x = S / (score_temp + 1e-6): x <- cap tanh(x / cap) per row (SPEC section 9; a
 * row without one, cap = 0, keeps x). tanh in double, lane by lane: only softcapped calls pay.
 * Its argument holds itemp beta_other (asc_xbias) unless the cap is `outside`. */
ASC_INLINE VS FN(asc_softcap)(const FN(asc_xvec) *xv, VS x) {
    if (!xv->capped) return x;
    for (int l = 0; l < VL; l++)
        if (xv->cap[l] != 0) x[l] = (SCALAR)((double)xv->cap[l] * tanh((double)x[l] * (double)xv->icap[l]));
    return x;
}

/* x = (score + itemp beta_other), softcapped, from the score part x and beta_other ob of a vector: the
 * cap takes the sum (inside) or the score part only (outside, SPEC section 9). */
ASC_INLINE VS FN(asc_xbias)(const FN(asc_xvec) *xv, VS x, VS ob) {
    if (xv->outside) return FN(asc_softcap)(xv, x) + xv->itemp * ob;
    return FN(asc_softcap)(xv, x + xv->itemp * ob);
}

/* x (softcapped), and rc, phi, r of tile entry (j, o) */
ASC_INLINE VS FN(asc_xval)(const FN(asc_xvec) *xv, const SCALAR *G1, const SCALAR *G2, const SCALAR *G3,
                           const SCALAR *G4, const SCALAR *G5, const SCALAR *OB, int64_t j, int o, SCALAR nzj,
                           SCALAR rkj, SINT key, int diag, SCALAR nits, SCALAR delta, VS *rc_out,
                           VS *phi_out, VS *r_out) {
    const VS zero = FN(vset)(0);
    const int64_t e = j * BM + o;
    const VS gz = FN(vld)(G1 + e);
    VS D = FN(vmax)((xv->nzi + nzj) - (gz + gz), zero);
    if (diag) D = FN(vsel)(xv->tok == key, zero, D);
    const VS ws = FN(vexp)(D * nits);
    const VS a = FN(vld)(G2 + e);
    const VS phi = ws * FN(vmax)(a - delta, zero);
    const VS gc = FN(vld)(G5 + e);
    const VS rc = FN(vmax)((xv->ncc + nzj) - (gc + gc), zero);
    const VS r = FN(vld)(G4 + e) * rkj;
    VS x = xv->cs * FN(vld)(G3 + e) + xv->ca * r + xv->cphi * phi + xv->cc * rc + xv->x0;
    x = OB ? FN(asc_xbias)(xv, x, FN(vld)(OB + e)) : FN(asc_softcap)(xv, x);
    *rc_out = rc;
    *phi_out = phi;
    if (r_out) *r_out = r;
    return x;
}

/* The five score products of a tile (G3/G4 share the keys, G5/G1 the latents). */
ASC_UNUSED static void FN(asc_tile_scores)(SCALAR *G1, SCALAR *G2, SCALAR *G3, SCALAR *G4, SCALAR *G5, const SCALAR *qT,
                                const SCALAR *uT, const SCALAR *cT, const SCALAR *zT, const SCALAR *hT,
                                const asc_params *p, const SCALAR *kb, const SCALAR *zt, const SCALAR *hn, int64_t nj,
                                int mv) {
    FN(k_score)(G3, qT, G4, uT, kb, p->d, p->d, nj, mv);
    FN(k_score)(G5, cT, G1, zT, zt, p->dz, p->dz, nj, mv);
    FN(k_score)(G2, hT, NULL, NULL, hn, p->da, p->da, nj, mv);
}
