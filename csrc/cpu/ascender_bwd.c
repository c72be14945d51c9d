/*
 * ascender_bwd.c -- exact CPU backward of ASCender attention (docs/backward.md).
 *
 * C11, OpenMP. Float and double from the generic ascender_bwd_impl.h (with vec_impl.h and ascender_row_impl.h,
 * shared with the forward).
 */
#define ASC_IMPL "ascender_bwd_impl.h"
#include "instantiate.h"
