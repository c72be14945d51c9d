/*
 * instantiate_types.h -- the float and double instantiations of ASC_IMPL for one ISA (included by
 * instantiate_isa.h, which sets ASC_ISA, ASC_VB, ASC_WIDE). No include guard on purpose.
 */
#define SCALAR float
#define SINT int32_t
#define ASC_F32 1
#define ASC_TNAME f32
#include ASC_IMPL
#include "ascender_undef.h"
#undef SCALAR
#undef SINT
#undef ASC_F32
#undef ASC_TNAME

#define SCALAR double
#define SINT int64_t
#define ASC_F32 0
#define ASC_TNAME f64
#include ASC_IMPL
#include "ascender_undef.h"
#undef SCALAR
#undef SINT
#undef ASC_F32
#undef ASC_TNAME
