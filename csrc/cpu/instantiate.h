/*
 * instantiate.h -- compiles the generic kernel file named by ASC_IMPL twice, for float (_f32)
 * and double (_f64): SCALAR is the element type, SEXP its exp, FN(name) the suffixed name
 * (torch7's "generic" pattern). Usage in a .c file:
 *     #define ASC_IMPL "ascender_fwd_impl.h"
 *     #include "instantiate.h"
 * The implementation file includes the generic headers it needs itself.
 */
#include "ascender_cpu.h"

#define SCALAR float
#define SEXP asc_expf
#define FN(name) name##_f32
#include ASC_IMPL
#undef SCALAR
#undef SEXP
#undef FN

#define SCALAR double
#define SEXP exp
#define FN(name) name##_f64
#include ASC_IMPL
#undef SCALAR
#undef SEXP
#undef FN
