/*
 * mma.cuh -- the device intrinsics of the tensor-core kernels: warp matrix products (mma.sync),
 * warp matrix loads from shared memory (ldmatrix), 16-byte asynchronous global -> shared copies
 * (cp.async) and the conversions that feed them. docs/cuda.md, "The intrinsics header".
 *
 * Under nvcc every function is one PTX instruction in inline asm (sm_80 and later). Under the CPU
 * emulator (tests/cuda_emu, ASC_CUDA_EMU) the same names are warp-collective C++ implementations that
 * follow the PTX ISA's fragment layouts (tests/cuda_emu/emu_matrix.h): a wrong fragment index in a
 * kernel gives a wrong product on the CPU, and the emulator checks what the PTX ISA requires (all 32
 * lanes at the same instruction, 16-byte aligned rows and copies inside the block's dynamic shared
 * memory, a cp.async read only after its wait) and counts each instruction for the cost model.
 *
 * Fragment layouts (PTX ISA 8.x, section 9.7.14.5 "Matrix fragments for mma"; g = lane >> 2, t = lane & 3):
 *   mma.m16n8k16 .bf16/.f16 (9.7.14.5.8), A row-major 16x16, 4 regs of 2 halves (low half first):
 *       a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
 *     B "col" 16x8, 2 regs:  b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
 *     C, D 16x8 fp32:        c[0], c[1] = C[g][2t, 2t+1]    c[2], c[3] = C[g+8][2t, 2t+1]
 *   mma.m16n8k8 .tf32 (9.7.14.5.7), A 16x8, 4 regs of one tf32 each:
 *       a[0] = A[g][t]   a[1] = A[g+8][t]   a[2] = A[g][t+4]   a[3] = A[g+8][t+4]
 *     B 8x8:  b[0] = B[t][g]   b[1] = B[t+4][g];   C, D as above
 *   mma.m8n8k4 .f64 (9.7.14.5.4), A row-major 8x4, B "col" 4x8, C, D 8x8, in doubles:
 *       a = A[g][t]   b = B[t][g]   c[0], c[1] = C[g][2t, 2t+1]
 *   ldmatrix.m8n8.b16 (9.7.14.5.15): matrix m (0..3 of .x1/.x2/.x4) has its 8 rows of 8 halves (16 bytes,
 *     16-byte aligned) at the addresses of lanes 8m .. 8m+7; r[m] of lane l holds row l >> 2, columns
 *     2 (l & 3) and 2 (l & 3) + 1 of matrix m (low half first); .trans holds the transposed matrix's
 *     (row 2 (l & 3) and 2 (l & 3) + 1 of column l >> 2). With .x1 and .x2 the addresses of the lanes
 *     past 8 resp. 16 are not read.
 *   cp.async.cg.shared.global 16 bytes, cp.async.commit_group, cp.async.wait_group N (PTX ISA
 *     "Data movement and conversion instructions: cp.async"): a copy is complete and visible to its
 *     own thread only after a wait_group that leaves fewer groups pending than its group's age; the
 *     other threads see it after a barrier that follows that wait.
 *   atom.acq_rel.gpu.global.add.u32 (arrive): the count a block leaves at a counter it shares with other blocks;
 *     release and acquire at GPU scope, so the last block to arrive sees what the others wrote before.
 * Besides: ex2 (ex2.approx.ftz.f32), relu_nan (max.NaN.f32 with 0), zero_kept (a 0 the compiler keeps where it
 * is written) and cost_scalar, the cost model's declaration of scalar work.
 */
#ifndef ASCENDER_CUDA_MMA_CUH
#define ASCENDER_CUDA_MMA_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "csrc/cuda/mma.cuh needs sm_80 or later (mma.sync m16n8k16 bf16, ldmatrix, cp.async)"
#endif

namespace asc {

#ifdef ASC_CUDA_EMU

/* tests/cuda_emu/emu_matrix.h (included by cuda_emu.h): the same operations as warp collectives. The
 * trailing source location names the kernel's call site in the emulator's reports. */
using ::asc_emu::SourceAt;

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4], SourceAt at = SourceAt::current()) {
    ::asc_emu::mma(::asc_emu::MMA_BF16_16816, d, a, b, c, at);
}
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4], SourceAt at = SourceAt::current()) {
    ::asc_emu::mma(::asc_emu::MMA_F16_16816, d, a, b, c, at);
}
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4], SourceAt at = SourceAt::current()) {
    ::asc_emu::mma(::asc_emu::MMA_TF32_1688, d, a, b, c, at);
}
__device__ __forceinline__ void mma_m8n8k4_f64(double (&d)[2], double a, double b, const double (&c)[2],
                                               SourceAt at = SourceAt::current()) {
    ::asc_emu::mma_f64(d, a, b, c, at);
}
__device__ __forceinline__ uint32_t to_tf32(float x) { return ::asc_emu::to_tf32(x); }
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) { return ::asc_emu::pack_bf16(lo, hi); }
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) { return ::asc_emu::pack_f16(lo, hi); }

__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], const void *row, SourceAt at = SourceAt::current()) {
    ::asc_emu::ldmatrix<1, false>(r, row, at);
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void *row, SourceAt at = SourceAt::current()) {
    ::asc_emu::ldmatrix<2, false>(r, row, at);
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *row, SourceAt at = SourceAt::current()) {
    ::asc_emu::ldmatrix<4, false>(r, row, at);
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&r)[1], const void *row, SourceAt at = SourceAt::current()) {
    ::asc_emu::ldmatrix<1, true>(r, row, at);
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void *row, SourceAt at = SourceAt::current()) {
    ::asc_emu::ldmatrix<2, true>(r, row, at);
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row, SourceAt at = SourceAt::current()) {
    ::asc_emu::ldmatrix<4, true>(r, row, at);
}

__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem, SourceAt at = SourceAt::current()) {
    ::asc_emu::cp_async_16(smem, gmem, true, at);
}
__device__ __forceinline__ void cp_async_16_zfill(void *smem, const void *gmem, bool valid,
                                                  SourceAt at = SourceAt::current()) {
    ::asc_emu::cp_async_16(smem, gmem, valid, at);
}
__device__ __forceinline__ void cp_async_commit() { ::asc_emu::cp_async_commit(); }
template <int N> __device__ __forceinline__ void cp_async_wait(SourceAt at = SourceAt::current()) {
    static_assert(N >= 0 && N <= 7, "cp.async.wait_group takes 0..7 here");
    ::asc_emu::cp_async_wait(N, at);
}

__device__ __forceinline__ unsigned arrive(unsigned *counter) { return ::asc_emu_arrive(counter); }

__device__ __forceinline__ float ex2(float x) { return ::asc_emu::ex2(x); }
__device__ __forceinline__ float relu_nan(float x) { return ::asc_emu::relu_nan(x); }
__device__ __forceinline__ float zero_kept() { return 0.0f; }
__device__ __forceinline__ void cost_scalar(unsigned fp32_flops, unsigned mufu_ops = 0) {
    ::asc_emu::cost_count(fp32_flops, mufu_ops);
}

#else /* nvcc: the PTX instructions */

/* D = A B + C, A row-major 16x16 bf16, B column-major 16x8 bf16, C and D 16x8 fp32 */
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
}

/* the same with fp16 operands */
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
}

/* D = A B + C, A row-major 16x8 tf32, B column-major 8x8 tf32 (bit patterns from to_tf32) */
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
}

/* D = A B + C in double, A row-major 8x4, B column-major 4x8, C and D 8x8 (the FP64 tensor cores, sm_80 and
 * later) */
__device__ __forceinline__ void mma_m8n8k4_f64(double (&d)[2], double a, double b, const double (&c)[2]) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%4, %5};\n"
                 : "=d"(d[0]), "=d"(d[1])
                 : "d"(a), "d"(b), "d"(c[0]), "d"(c[1]));
}

/* x rounded to tf32 (nearest, ties away from zero), as an fp32 bit pattern with 13 zero low bits */
__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

/* two floats rounded to bf16 / fp16 (nearest even) in one register, lo in the low half */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ldmatrix_x1(uint32_t (&r)[1], const void *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_addr(row)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(row))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x1_trans(uint32_t (&r)[1], const void *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(smem_addr(row))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(row))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(row))
                 : "memory");
}

/* 16 bytes global -> shared, bypassing L1 (.cg); the _zfill form writes 16 zero bytes (and reads
 * nothing) when !valid */
__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)),
                 "l"(__cvta_generic_to_global(gmem))
                 : "memory");
}
__device__ __forceinline__ void cp_async_16_zfill(void *smem, const void *gmem, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
                 "l"(__cvta_generic_to_global(gmem)), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* The value of a counter in global memory before this thread adds 1 to it, as one read-modify-write that is a release
 * and an acquire at GPU scope: what the thread's block wrote before a barrier that precedes the call is visible to
 * every block whose call reads the count it left, after a barrier that follows that call (block_last, common.cuh) */
__device__ __forceinline__ unsigned arrive(unsigned *counter) {
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n"
                 : "=r"(old)
                 : "l"(__cvta_generic_to_global(counter))
                 : "memory");
    return old;
}

/* 2^x by the special-function unit (ex2.approx.ftz.f32: MUFU.EX2, about 2 ulp; subnormal inputs and
 * results are 0); the cost model counts one special-function operation */
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* max(x, 0) that keeps a NaN (max.NaN.f32: one FMNMX where x < 0 ? 0 : x takes a compare and a select); -0 gives
 * +0 */
__device__ __forceinline__ float relu_nan(float x) {
    float y;
    asm("max.NaN.f32 %0, %1, 0f00000000;\n" : "=f"(y) : "f"(x));
    return y;
}

/* 0.0f by a volatile move, which ptxas does not hoist out of the branch that writes it: zeros that a rare branch
 * needs stay off the common path (ptxas clears registers ahead of a branch where one side wants them zero) */
__device__ __forceinline__ float zero_kept() {
    float z;
    asm volatile("mov.b32 %0, 0;\n" : "=f"(z));
    return z;
}

/* The cost model (tests/cuda_emu, `make cuda-cost`) sees memory accesses and the instructions of this
 * header, not ordinary arithmetic: a kernel declares its epilogues' fp32 FLOPs (an FMA is 2) and other
 * special-function operations (logs, tanh, divisions by MUFU.RCP) per thread here. No code on the GPU. */
__device__ __forceinline__ void cost_scalar(unsigned, unsigned = 0) {}

#endif

}  // namespace asc

#endif /* ASCENDER_CUDA_MMA_CUH */
