/*
 * magnitude_fwd.c -- fused CPU forward of Magnitude Attention (SPEC section 7).
 *
 * C11, OpenMP. Float and double from the generic magnitude_fwd_impl.h (with vec_impl.h and magnitude_cg_impl.h).
 */
#define ASC_IMPL "magnitude_fwd_impl.h"
#include "instantiate.h"
