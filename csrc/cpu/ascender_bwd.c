/*
 * ascender_bwd.c -- exact CPU backward of ASCender attention (docs/backward.md), reading the
 * forward's saved statistics (docs/tiling.md section 4).
 *
 * C11, OpenMP. Float and double, each for AVX-512, AVX2 + FMA and the baseline ISA, from the
 * generic ascender_bwd_impl.h (instantiate_isa.h); the entry points pick the one the CPU runs.
 */
#define ASC_IMPL "ascender_bwd_impl.h"
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

int ascender_bwd_f32(const asc_params *p, const asc_bwd_args *a) { ASC_DISPATCH(ascender_bwd, f32, p, a) }
int ascender_bwd_f64(const asc_params *p, const asc_bwd_args *a) { ASC_DISPATCH(ascender_bwd, f64, p, a) }
