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
 */
typedef struct naive_outputs {
    double *out, *stats, *u, *c;
    int64_t *nbr;
    double *map_sbase, *map_align, *map_sep, *map_coh, *map_attn;
} naive_outputs;

/* Return 0 on success, nonzero if memory could not be allocated. */
int naive_ascender_fwd(const asc_params *p, const naive_inputs *in, const naive_outputs *o);

#endif /* NAIVE_ASCENDER_H */
