/*
 * instantiate_isa.h -- compiles the generic tiled kernel file named by ASC_IMPL for float (_f32)
 * and double (_f64), each for three instruction sets on x86-64: AVX-512 (x86-64-v4, _v4),
 * AVX2 + FMA (x86-64-v3, _v3) and the baseline (_base); elsewhere only _base. Used like
 * instantiate.h:
 *     #define ASC_IMPL "ascender_fwd_impl.h"
 *     #include "instantiate_isa.h"
 * then a dispatcher picks FN(...) for the running CPU (asc_cpu_isa() in ascender_cpu.h).
 * The package build never uses -march=native: the ISA-specific code is confined to the
 * functions compiled here under `#pragma GCC target`.
 *
 * Per instantiation the implementation sees:
 *   SCALAR, SINT        the compute type and the integer type of its width (masks)
 *   ASC_F32             1 for float, 0 for double
 *   ASC_VB              bytes per SIMD vector (64, 32, 16)
 *   ASC_WIDE            1 where the ISA has 32 vector registers (register blocks are sized by it)
 *   ASC_ISA_ID          4, 3 or 0 (x86-64-v4, -v3, baseline): selects the few <immintrin.h>
 *                       intrinsics (max, min, masked moves) that GCC's vector extensions lack
 *   FN(name)            name_<type>_<isa>
 * Floating-point contraction (fused multiply-add) is on in these kernels; -ffast-math is not.
 */
#include "ascender_cpu.h"

#define ASC_CAT3_(a, b, c) a##_##b##_##c
#define ASC_CAT3(a, b, c) ASC_CAT3_(a, b, c)
#define FN(name) ASC_CAT3(name, ASC_TNAME, ASC_ISA)

#if ASC_MULTI_ISA
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,prefer-vector-width=512")
#pragma GCC optimize("fp-contract=fast")
#define ASC_ISA v4
#define ASC_ISA_ID 4
#define ASC_VB 64
#define ASC_WIDE 1
#include "instantiate_types.h"
#undef ASC_ISA
#undef ASC_ISA_ID
#undef ASC_VB
#undef ASC_WIDE
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#pragma GCC optimize("fp-contract=fast")
#define ASC_ISA v3
#define ASC_ISA_ID 3
#define ASC_VB 32
#define ASC_WIDE 0
#include "instantiate_types.h"
#undef ASC_ISA
#undef ASC_ISA_ID
#undef ASC_VB
#undef ASC_WIDE
#pragma GCC pop_options
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#endif
#define ASC_ISA base
#define ASC_ISA_ID 0
#define ASC_VB 16
#define ASC_WIDE 0
#include "instantiate_types.h"
#undef ASC_ISA
#undef ASC_ISA_ID
#undef ASC_VB
#undef ASC_WIDE
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

#undef FN
