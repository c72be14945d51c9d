/*
 * magnitude_bwd.c -- exact CPU backward of Magnitude Attention (docs/magnitude.md).
 *
 * C11, OpenMP; float and double from one generic source (vec_impl.h + magnitude_cg_impl.h +
 * magnitude_bwd_impl.h) included twice with SCALAR / SEXP / FN.
 */
#include "ascender_cpu.h"

#define SCALAR float
#define SEXP asc_expf
#define FN(name) name##_f32
#include "vec_impl.h"
#include "magnitude_cg_impl.h"
#include "magnitude_bwd_impl.h"
#undef SCALAR
#undef SEXP
#undef FN

#define SCALAR double
#define SEXP exp
#define FN(name) name##_f64
#include "vec_impl.h"
#include "magnitude_cg_impl.h"
#include "magnitude_bwd_impl.h"
#undef SCALAR
#undef SEXP
#undef FN
