/*
 * ascender.h -- the whole contract between the libtorch binding and the kernels.
 *
 * Plain C (no torch). The binding validates every input and hands the kernels
 * contiguous row-major tensors; the kernels assume that and check nothing.
 * Formulas: shared/SPEC.md section 4; per-row algorithm: docs/forward.md.
 */
#ifndef ASCENDER_H
#define ASCENDER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The epsilon constants of the seed module (SPEC section 4); keep them exact. The CPU and CUDA
 * kernels both take them from here; ascender_torch/_spec.py holds the same values for Python
 * (checked when the extension is imported). */
#define ASC_EPS_TAU 1e-6   /* tau_sep, tau_coh, kappa, score_temp, centroid denominator */
#define ASC_EPS_STD 1e-6   /* row normalization */
#define ASC_EPS_NORM 1e-12 /* F.normalize */
/* The paper variant's heading u_i = m_i / ||m_i||, m_i = sum of the neighbours' unit keys, is 0 where
 * ||m_i|| <= ASC_EPS_HEADING * |N(i)|: unit keys that cancel in exact arithmetic leave a rounding
 * residue, which must not be normalized into a unit vector (README, Semantics; not a seed constant). */
#define ASC_EPS_HEADING 1e-5

/* The paper variant's neighbourhood N(i): top-k of the semantic affinity a_il or of the base score s_il. */
enum asc_neighbours {
    ASC_NEIGHBOURS_SEMANTIC = 0,
    ASC_NEIGHBOURS_SCORES = 1
};

enum asc_variant {
    ASC_VARIANT_SEED = 0,      /* what the seed module computes (SPEC section 1, variant "reference") */
    ASC_VARIANT_PAPER = 1      /* the method as written in the paper */
};

/*
 * Per-row statistics returned by the forward, stats[b][h][i][*] (ascender_torch/_spec.py Stat has
 * the same columns): what a tiled backward needs to rebuild a row's bias terms without a first
 * pass (the CPU backward reads them, docs/tiling.md).
 * LSE is log sum_j exp(S_ij / (score_temp + 1e-6)) over the allowed keys (plus exp(sink_h) with
 * sinks, SPEC section 12), or +inf for a row with no allowed key (then every exp(x - LSE) is 0).
 * MEAN_* / STD_* are the row mean and standard deviation (without the +1e-6) of the
 * raw bias rows beta^align, beta^sep, beta^coh over the statistics set of row i.
 * RHO is the raw density rho_i; WC_SUM is sum_l wc_il (the centroid's denominator
 * without +1e-6); GATE_A and GATE_C are the paper variant's gates (1 for the
 * seed variant); UNORM is || sum_{l in N(i)} k^_l || (paper variant, the heading is 0 where
 * it is <= ASC_EPS_HEADING |N(i)|; 1 for the seed variant); COUNT is n_i, the size of the statistics set; COH_SPREAD is
 * G_i = sum_l wc_il ||z_l - c_i||^2 / (sum_l wc_il + 1e-6), the argument of the paper variant's
 * cohesion gate (computed for both variants). The CPU backward reads every column
 * (docs/tiling.md section 4).
 */
#define ASC_STATS(X) X(LSE) X(MEAN_A) X(STD_A) X(MEAN_S) X(STD_S) X(MEAN_C) X(STD_C) \
                     X(RHO) X(WC_SUM) X(GATE_A) X(GATE_C) X(UNORM) X(COUNT) X(COH_SPREAD)
enum asc_stat {
#define ASC_STAT_ENUM_(name) ASC_STAT_##name,
    ASC_STATS(ASC_STAT_ENUM_)
#undef ASC_STAT_ENUM_
    ASC_NSTAT
};

/* The learnable per-head scalars in SPEC order: the fields of asc_fwd_args below and the rows
 * of the backward's dscalars (ascender_torch/_spec.py SCALARS, the same order). */
#define ASC_SCALARS(X) X(lambda_align) X(lambda_sep) X(lambda_coh) X(omega_align) X(omega_sep) X(omega_coh) \
                       X(score_temp) X(delta) X(kappa)
enum asc_scalar {
#define ASC_SCALAR_ENUM_(name) ASC_SCALAR_##name,
    ASC_SCALARS(ASC_SCALAR_ENUM_)
#undef ASC_SCALAR_ENUM_
    ASC_NSCALAR
};
/* The element of learnable scalar s (enum asc_scalar) that head hd reads in asc_fwd_args a: 0 where the call gives
 * one value for every head (bit s of a->scalars_shared), else hd. */
#define ASC_SCALAR_HEAD(a, s, hd) ((((a)->scalars_shared >> (s)) & 1u) ? 0 : (hd))

/* Shapes and fixed hyper-parameters of one call. */
typedef struct asc_params {
    int64_t B, H, N;          /* batch, heads, tokens */
    int64_t Nq;               /* query rows (<= N): query row i is token t = i + N - Nq - keys_after */
    int64_t keys_after;       /* key tokens after the last query row (0: the queries are the last Nq of
                               * the N tokens, Nq = N for self-attention; > 0: a block of rows inside
                               * the sequence, as a context-parallel rank holds them) */
    int64_t d, dv, dz, da;    /* q/k, v, z, h feature sizes */
    int variant;              /* enum asc_variant */
    int64_t k_neighbors;      /* top-k size of the paper variant (>= 0) */
    int64_t n_nbr;            /* columns of nbr: paper min(k, max(N-1,0)), seed 0 */
    double tau_sep, tau_coh;
    double alpha_align, alpha_coh; /* gate slopes, paper variant only */
    double scale;             /* multiplies q.k */
    int is_causal;            /* key j allowed for query i only if j <= i */
    int mask_stats;           /* 1: masks restrict every statistic; 0: only the softmax */
    double softcap;           /* > 0: S <- softcap tanh(S / softcap) before the temperature; 0: off */
    int softcap_outside;      /* 1: the softcap caps S without beta^(other), which is added after it (SPEC section 9) */
    /* attention dropout (SPEC section 9b, with asc_fwd_args.dropout_seed): a pair is kept when its Philox
     * word (csrc/philox.h) is >= dropout_threshold = floor(p 2^32), and the kept are scaled by
     * dropout_scale = 1 / (1 - p) */
    uint32_t dropout_threshold;
    double dropout_scale;
    /* structured visibility (SPEC section 8): query token t sees key j when (t - window_left <= j or
     * window_left < 0) and (j <= t + window_right or window_right < 0), or either is global (j or t
     * below n_global, or marked in global_mask), and both have the same document_ids entry */
    int64_t window_left, window_right; /* -1: unbounded on that side (both -1: no window) */
    int64_t n_global;         /* the first n_global tokens are global */
    int neighbours;           /* enum asc_neighbours */
    /* attn_mask and attn_bias element strides over (b, h, i, j); 0 where they broadcast */
    int64_t am_sb, am_sh, am_si, am_sj;
    int64_t ab_sb, ab_sh, ab_si, ab_sj;
    /* sinks element strides over (b, h, i) of its [B, H, Nq] view, 0 where it broadcasts ([H]: 0, 1, 0;
     * per-row sinks, docs/backward.md); sinks and dsinks are compact in that layout (ASC_SINK_COUNT) */
    int64_t sk_sb, sk_sh, sk_si;
} asc_params;

/* The offset of row (b, h, i)'s sink logit in asc_fwd_args.sinks, and of its gradient in dsinks. */
#define ASC_SINK_AT(p, b, h, i) ((b) * (p)->sk_sb + (h) * (p)->sk_sh + (i) * (p)->sk_si)
/* The number of sink logits: the product of the sizes of the dimensions that do not broadcast. */
#define ASC_SINK_COUNT(p) ((p)->sk_sb ? (p)->sk_sb * (p)->B : (p)->sk_sh ? (p)->sk_sh * (p)->H : (p)->sk_si ? (p)->Nq : 1)

/*
 * Pointers of one forward call. Element type: float for *_f32, double for *_f64;
 * masks are bytes (0/1). Shapes, all contiguous:
 *   q [B,H,Nq,d]; k [B,H,N,d]; v [B,H,N,dv]; z [B,H,N,dz]; h [B,H,N,da];
 *   lambda_*, omega_*, score_temp, delta, kappa: [H] each, or one value for every head where their bit of
 *   scalars_shared is set (ASC_SCALAR_HEAD);
 *   key_padding_mask [B,N] (nonzero = padding) or NULL;
 *   attn_mask (nonzero = may attend, strides in asc_params) or NULL.
 *   attn_mask is indexed by (b, h, query row i, key j).
 *   beta^(other) (paper sections 1, 11), added to S_ij before the temperature:
 *   attn_bias, an additive SCALAR bias indexed like attn_mask (strides ab_*), or NULL;
 *   alibi_slopes [B,H] (SCALAR): adds -slope_bh * |t - j| (t = the query's token), or NULL.
 *   sinks [H] (SCALAR): a logit per head that joins each softmax denominator, A_ij =
 *   exp(x_ij) / (exp(sink_h) + sum_l exp(x_il)) (SPEC section 12: GPT-OSS), or NULL; or per row, row
 *   (b, h, i) reading sinks[ASC_SINK_AT(p, b, h, i)] (docs/backward.md).
 * Outputs, one row per query: out [B,H,Nq,dv]; stats [B,H,Nq,ASC_NSTAT]; u [B,H,Nq,d] (the
 * heading u_i, k^_t for the seed variant); c [B,H,Nq,dz] (the centroid c_i);
 * nbr [B,H,Nq,n_nbr] (the neighbour indices in descending affinity, -1 past the end);
 * aux [B,H,Nq,2] or NULL (not computed), the per-row terms of the auxiliary losses of paper section 8 (SPEC section 5):
 * sum_j A_ij ||z_j - c_i||^2 and sum_j A_ij phi_ij (0 for a row with no allowed key). With dropout, out is
 * sum_j A_ij m_ij v_j / (1 - p); aux, the stats and the maps are those of A, without the mask.
 * rows32 [B,H,Nq,ASC_ROWS32_WIDTH(p)] float32 or NULL: per row the stats, c, u, out and aux again (in that
 * order; the two aux columns 0 where aux is NULL), in the compute type of float16 / bfloat16, whose own 8 or 11
 * bits the backward's sums would amplify; the CUDA forward writes it, the CUDA tiled backward reads it
 * (docs/cuda.md). Other dtypes: NULL.
 * Inspection maps, each [B,H,Nq,N], written only when non-NULL (all or none):
 * map_sbase (scale q.k), map_align / map_sep / map_coh (normalized biases, before
 * omega; 0 outside the statistics set), map_attn (softmax weights A).
 */
/* Columns of a row of rows32: stats | c | u | out | aux (asc_fwd_args). */
#define ASC_ROWS32_WIDTH(p) (ASC_NSTAT + (p)->dz + (p)->d + (p)->dv + 2)
/* The first column of c, u, out and aux in such a row (the stats: 0). */
#define ASC_ROWS32_C(p) ASC_NSTAT
#define ASC_ROWS32_U(p) (ASC_ROWS32_C(p) + (p)->dz)
#define ASC_ROWS32_OUT(p) (ASC_ROWS32_U(p) + (p)->d)
#define ASC_ROWS32_AUX(p) (ASC_ROWS32_OUT(p) + (p)->dv)

typedef struct asc_fwd_args {
    const void *q, *k, *v, *z, *h;
    const void *lambda_align, *lambda_sep, *lambda_coh;
    const void *omega_align, *omega_sep, *omega_coh;
    const void *score_temp, *delta, *kappa;
    uint32_t scalars_shared;       /* bit s (enum asc_scalar): scalar s is one value for every head, not [H] */
    const uint8_t *key_padding_mask;
    const uint8_t *attn_mask;
    const void *attn_bias, *alibi_slopes;
    const uint8_t *global_mask;    /* [B, N] (nonzero = global) or NULL */
    const int64_t *document_ids;   /* [B, N] or NULL */
    const void *sinks;             /* [H], or per row (strides sk_* in asc_params), or NULL */
    const int64_t *dropout_seed;   /* [3]: the (seed, offset, token offset) of the dropout mask (csrc/philox.h), or NULL: no dropout */
    void *out, *stats, *u, *c;
    int64_t *nbr;
    void *aux;
    float *rows32;
    void *map_sbase, *map_align, *map_sep, *map_coh, *map_attn;
} asc_fwd_args;

/*
 * Pointers of one backward call (docs/backward.md). `in` holds the forward's inputs (its
 * output and map pointers are ignored); the kernel recomputes each row's forward state.
 *   grad_out [B,H,Nq,dv]: dL/dy. Outputs: dq [B,H,Nq,d], dk [B,H,N,d]; dv [B,H,N,dv]; dz [B,H,N,dz];
 *   dh [B,H,N,da]; dscalars [9][H], the learnable scalars in SPEC order (lambda_align,
 *   lambda_sep, lambda_coh, omega_align, omega_sep, omega_coh, score_temp, delta, kappa);
 *   dattn_bias [B,H,Nq,N] (dL/dS_ij, before any broadcast reduction) or NULL;
 *   dsinks [H] (dL/dsink_h = -sum_i exp(sink_h - LSE_i) P_i, docs/backward.md) when in.sinks is set; per-row
 *   sinks: the rows' -exp(sink - LSE_i) P_i summed into dsinks[ASC_SINK_AT(p, b, h, i)] (the sinks' layout).
 * Optional incoming gradients of the other forward outputs (NULL = zero):
 *   grad_aux [B,H,Nq,2], dL/daux; grad_u [B,H,Nq,d], dL/du_i (a loss on the headings, e.g.
 *   L_align of SPEC section 5). stats, c and nbr are not differentiable.
 */
typedef struct asc_bwd_args {
    asc_fwd_args in;
    const void *grad_out;
    const void *grad_aux, *grad_u;
    void *dq, *dk, *dv, *dz, *dh, *dscalars;
    void *dattn_bias;
    void *dsinks;
} asc_bwd_args;

/* Return 0 on success, nonzero if scratch memory could not be allocated. */
int ascender_fwd_f32(const asc_params *p, const asc_fwd_args *a);
int ascender_fwd_f64(const asc_params *p, const asc_fwd_args *a);
/* The same forward for a result that will not be differentiated (inference, generation): up to
 * ASC_DECODE_ROWS query rows take the decode kernel (split over key chunks, docs/decode.md), whose
 * values agree with ascender_fwd's to rounding but not bit for bit -- the backward recomputes the
 * tiled forward's values, so a differentiated result must come from ascender_fwd. */
int ascender_infer_f32(const asc_params *p, const asc_fwd_args *a);
int ascender_infer_f64(const asc_params *p, const asc_fwd_args *a);
int ascender_bwd_f32(const asc_params *p, const asc_bwd_args *a);
int ascender_bwd_f64(const asc_params *p, const asc_bwd_args *a);

/* ---------------------------------------------------------------- Magnitude Attention
 * SPEC section 7 (seed 004), per (batch, head) over the keys not marked as padding:
 *   Zm_jl = exp(-t ||k_j - k_l||^2 / d), t = softplus(t_raw); (Zm + eps I) mu = 1 by n_iter
 *   unrolled conjugate-gradient steps from mu = 0 (a (b, h) whose rho = r.r is not above
 *   eps_type^2 rho_0, or whose p.Ap is not > 0, stops iterating);
 *   gate_j = sigmoid(beta mu_j + gamma); y = softmax(scale q k^T) (gate * v).
 * Math of the backward: docs/magnitude.md.
 */
typedef struct mag_params {
    int64_t B, H, N, d, dv;
    int64_t n_iter;
    double eps, scale;
} mag_params;

/* q, k [B,H,N,d]; v [B,H,N,dv]; t_raw, beta, gamma [H]; key_padding_mask [B,N] or NULL.
 * Outputs: out [B,H,N,dv]; mu [B,H,N] (0 at padding). */
typedef struct mag_fwd_args {
    const void *q, *k, *v;
    const void *t_raw, *beta, *gamma;
    const uint8_t *key_padding_mask;
    void *out, *mu;
} mag_fwd_args;

/* `in` holds the forward's inputs (out, mu ignored). grad_out [B,H,N,dv]; grad_mu [B,H,N] or
 * NULL (a loss on mu itself). Outputs dq, dk, dv like the inputs and dparams [3][H]
 * (t_raw, beta, gamma). */
typedef struct mag_bwd_args {
    mag_fwd_args in;
    const void *grad_out, *grad_mu;
    void *dq, *dk, *dv, *dparams;
} mag_bwd_args;

int magnitude_fwd_f32(const mag_params *p, const mag_fwd_args *a);
int magnitude_fwd_f64(const mag_params *p, const mag_fwd_args *a);
int magnitude_bwd_f32(const mag_params *p, const mag_bwd_args *a);
int magnitude_bwd_f64(const mag_params *p, const mag_bwd_args *a);

#ifdef __cplusplus
}
#endif

#endif /* ASCENDER_H */
