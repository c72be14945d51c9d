/*
 * ascender_fwd.c -- fused CPU forward of ASCender attention (SPEC section 4).
 *
 * C11, OpenMP. Float and double, each for AVX-512, AVX2 + FMA and the baseline ISA, from the
 * generic ascender_fwd_impl.h (instantiate_isa.h); the entry points pick the one the CPU runs.
 * The tile plan: docs/tiling.md; the per-row formulas and saved statistics: docs/forward.md.
 */
#define ASC_IMPL "ascender_fwd_impl.h"
#include "instantiate_isa.h"

#if ASC_MULTI_ISA
#define ASC_DISPATCH(name, T, ...)                         \
    switch (asc_cpu_isa()) {                               \
    case 2: return name##_##T##_v4(__VA_ARGS__);           \
    case 1: return name##_##T##_v3(__VA_ARGS__);           \
    default: return name##_##T##_base(__VA_ARGS__);        \
    }
#else
#define ASC_DISPATCH(name, T, ...) return name##_##T##_base(__VA_ARGS__);
#endif

int ascender_fwd_f32(const asc_params *p, const asc_fwd_args *a) { ASC_DISPATCH(ascender_fwd, f32, p, a) }
int ascender_fwd_f64(const asc_params *p, const asc_fwd_args *a) { ASC_DISPATCH(ascender_fwd, f64, p, a) }
int ascender_infer_f32(const asc_params *p, const asc_fwd_args *a) { ASC_DISPATCH(ascender_infer, f32, p, a) }
int ascender_infer_f64(const asc_params *p, const asc_fwd_args *a) { ASC_DISPATCH(ascender_infer, f64, p, a) }
