/*
 * magnitude_bwd.c -- exact CPU backward of Magnitude Attention (docs/magnitude.md).
 *
 * C11, OpenMP. Float and double from the generic magnitude_bwd_impl.h (with vec_impl.h and magnitude_cg_impl.h).
 */
#define ASC_IMPL "magnitude_bwd_impl.h"
#include "instantiate.h"
