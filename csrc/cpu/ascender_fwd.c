/*
 * ascender_fwd.c -- fused CPU forward of ASCender attention (SPEC section 4).
 *
 * C11, OpenMP. The float and double kernels come from one generic source
 * (vec_impl.h + ascender_row_impl.h + ascender_fwd_impl.h) included twice with SCALAR /
 * SEXP / FN.
 * The algorithm, its memory bound and the numerics: docs/forward.md.
 */
#include "ascender_cpu.h"

#define SCALAR float
#define SEXP asc_expf
#define FN(name) name##_f32
#include "vec_impl.h"
#include "ascender_row_impl.h"
#include "ascender_fwd_impl.h"
#undef SCALAR
#undef SEXP
#undef FN

#define SCALAR double
#define SEXP exp
#define FN(name) name##_f64
#include "vec_impl.h"
#include "ascender_row_impl.h"
#include "ascender_fwd_impl.h"
#undef SCALAR
#undef SEXP
#undef FN
