/*
 * ascender_fwd.c -- fused CPU forward of ASCender attention (SPEC section 4).
 *
 * C11, OpenMP. Float and double from the generic ascender_fwd_impl.h (with vec_impl.h and ascender_row_impl.h).
 * The algorithm, its memory bound and the numerics: docs/forward.md.
 */
#define ASC_IMPL "ascender_fwd_impl.h"
#include "instantiate.h"
