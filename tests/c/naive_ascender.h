/*
 * naive_ascender.h -- a deliberately naive test oracle for the ASCender forward.
 *
 * Implements shared/SPEC.md section 4 in double precision, materializing every
 * N x N matrix of one (batch, head) pair. Clarity over speed: it exists only to
 * check the fused kernels of csrc/ against an independent, obviously-correct
 * reading of the specification.
 */
#ifndef NAIVE_ASCENDER_H
#define NAIVE_ASCENDER_H

#include <stdint.h>

#include "../../csrc/ascender.h"

/*
 * Inputs, all double, contiguous row-major, same shapes as asc_fwd_args:
 *   q, k [B,H,N,d]; v [B,H,N,dv]; z [B,H,N,dz]; h [B,H,N,da];
 *   the nine learnable scalars [H] each;
 *   key_padding_mask [B,N] (nonzero = padding) or NULL;
 *   attn_mask (nonzero = may attend, element strides am_s* of asc_params) or NULL.
 */
typedef struct naive_inputs {
    const double *q, *k, *v, *z, *h;
    const double *lambda_align, *lambda_sep, *lambda_coh;
    const double *omega_align, *omega_sep, *omega_coh;
    const double *score_temp, *delta, *kappa;
    const uint8_t *key_padding_mask;
    const uint8_t *attn_mask;
} naive_inputs;

/*
 * Outputs, same shapes and meaning as in asc_fwd_args (see ascender.h); every
 * pointer may be NULL, in which case that output is not written:
 *   out [B,H,N,dv]; stats [B,H,N,ASC_NSTAT]; u [B,H,N,d]; c [B,H,N,dz];
 *   nbr [B,H,N,n_nbr] (n_nbr taken from asc_params);
 *   map_* [B,H,N,N] (normalized biases are 0 outside the statistics set or when
 *   the statistics set has at most one element; map_attn is 0 outside J(i)).
 *
 * Two diagnostics that only a test needs, to judge how precisely a row can be
 * computed at all:
 *   bias_scale [B,H,N,3]: for align, sep, coh, a bound on the magnitude of the
 *     terms that make up the raw bias row before any cancellation (0 for an empty
 *     statistics set): max_j |lambda_a| gamma_a ||k^_j|| ||u_i||;
 *     max_j |lambda_s| eta ws_ij (|a_ij| + |delta|) over the j with a_ij > delta;
 *     max_j |lambda_c| gamma_c (||z_j|| + ||c_i||)^2 / (tau_coh + 1e-6).
 *     A relative rounding error u in the inputs moves MEAN_* / STD_* by about
 *     u * bias_scale, whatever the size of the mean and std themselves.
 *   cond [B,H,N]: how much a relative error in the raw bias terms is amplified
 *     in the softmax logits S_ij / (score_temp + 1e-6) by the row normalization:
 *     sum_t |omega_t| bias_scale_t / (std_t + 1e-6) / (score_temp + 1e-6), or 0
 *     when |T(i)| <= 1. It is huge (~1e6) when a bias row is analytically
 *     constant but not bit-for-bit so (rounding noise divided by 1e-6).
 *   zscale [B,H,N]: max_j (||z_j|| + ||c_i||)^2 over T(i), the size of the terms of the
 *     cohesion spread G_i (stats COH_SPREAD) before they cancel: kernels that form it from
 *     norms and products are accurate to about u * zscale, not u * G_i.
 */
typedef struct naive_outputs {
    double *out, *stats, *u, *c;
    int64_t *nbr;
    double *map_sbase, *map_align, *map_sep, *map_coh, *map_attn;
    double *bias_scale, *cond, *zscale;
} naive_outputs;

/* Return 0 on success, nonzero if memory could not be allocated. */
int naive_ascender_fwd(const asc_params *p, const naive_inputs *in, const naive_outputs *o);

#endif /* NAIVE_ASCENDER_H */
