/*
 * ascender_bwd.c -- exact CPU backward of ASCender attention (docs/backward.md).
 *
 * C11, OpenMP. The float and double kernels come from one generic source
 * (vec_impl.h + ascender_row_impl.h, shared with the forward, + ascender_bwd_impl.h)
 * included twice with SCALAR / SEXP / FN.
 */
#include "ascender_cpu.h"

#define SCALAR float
#define SEXP asc_expf
#define FN(name) name##_f32
#include "vec_impl.h"
#include "ascender_row_impl.h"
#include "ascender_bwd_impl.h"
#undef SCALAR
#undef SEXP
#undef FN

#define SCALAR double
#define SEXP exp
#define FN(name) name##_f64
#include "vec_impl.h"
#include "ascender_row_impl.h"
#include "ascender_bwd_impl.h"
#undef SCALAR
#undef SEXP
#undef FN
