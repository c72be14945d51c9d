/*
 * emu_matrix.h -- the intrinsics of csrc/cuda/mma.cuh under the CPU emulator (included by cuda_emu.h;
 * docs/cuda.md, "The intrinsics header"). The data movement of each lane (the 16-byte row an ldmatrix
 * lane supplies, the 16 bytes a cp.async reads and writes) happens here, in the kernel's own
 * (sanitized) code at the kernel's call site, so AddressSanitizer checks every byte, ThreadSanitizer
 * sees every shared-memory access as the issuing thread's, and the cost counters attribute it to the
 * instruction. The exchange between lanes and the arithmetic (emu_matrix.cpp) run when the last lane
 * of the warp arrives, as a warp collective of the runtime.
 *
 * Fragment layouts: the PTX ISA's, as written out in csrc/cuda/mma.cuh and implemented in
 * emu_matrix.cpp. Numerics of the emulated mma: every product exact, the sum of the k products and c
 * in double, rounded once to fp32 (the tensor cores' internal order and truncation may differ in the
 * last bits of fp32; the GPU grid compares both against the CPU kernels); the f64 form adds the k
 * products to c by fused multiply-adds in k order (the hardware's order may differ in the last bit). A tf32 operand uses the top
 * 19 bits of its register (sign, exponent, 10 mantissa bits) as the hardware does; to_tf32 rounds to
 * nearest with ties away from zero (cvt.rna).
 *
 * cp.async: a copy reads its 16 source bytes when it is issued and writes its destination only when a
 * cp.async.wait_group of its thread completes its group; at issue the destination is filled with 0xff
 * bytes (NaN in every float type), which is one of the states the GPU allows until the wait, so a read
 * before the wait (or before the barrier after it, in another thread) gets NaN instead of the data,
 * and under ThreadSanitizer that read races with the issuing thread's write.
 */
#ifndef ASC_EMU_MATRIX_H
#define ASC_EMU_MATRIX_H

namespace asc_emu {

using SourceAt = std::source_location;

/* the warp matrix products (the op code of the collective) */
enum MmaOp { MMA_BF16_16816 = 1, MMA_F16_16816, MMA_TF32_1688, MMA_F64_884 };

/* what one lane hands to an mma collective (MmaLane64: the f64 form's) */
struct MmaLane {
    const uint32_t *a, *b;
    const float *c;
    float *d;
};
struct MmaLane64 {
    double a, b;
    const double *c;
    double *d;
};

/* what one lane hands to an ldmatrix collective: its row (when it supplies one) and its destination */
struct LdmatrixLane {
    uint32_t row[4];
    uint32_t *r;
    bool has_row;
};

/* ldmatrix op code: matrices (1, 2, 4) | 8 for .trans */
constexpr int ldmatrix_op(int nmat, bool trans) { return nmat | (trans ? 8 : 0); }

/* the runtime's side (cuda_emu.cpp, emu_matrix.cpp) */
void matrix_collective(int kind, int op, void *lane_data, const SourceAt &at);
int lane_id();
/* faults the launch unless [p, p + 16) lies in the block's dynamic shared memory and p is 16-byte aligned */
void check_smem_row(const void *p, const char *what, const SourceAt &at);
void check_aligned_16(const void *p, const char *what, const SourceAt &at);
void cp_async_enqueue(void *dst, const unsigned char (&data)[16]);
void cp_async_commit();
/* the next copy that cp.async.wait_group n completes (false when none is left) */
bool cp_async_next(int n, void **dst, unsigned char (&data)[16]);
void cost_pause(bool pause);
/* fp32 FLOPs and special-function operations of the calling thread, for the cost counters */
void cost_count(unsigned fp32_flops, unsigned mufu_ops);
/* the arithmetic and the exchange, once every lane of the warp has arrived (emu_matrix.cpp) */
void resolve_mma(int op, void *const lane[32]); /* MmaLane, or MmaLane64 for MMA_F64_884 */
void resolve_ldmatrix(int op, LdmatrixLane *const lane[32]);

/* One 16-byte access (one instruction of 16 bytes, as the GPU's LDS.128 / cp.async: one request in the
 * instrumentation of the sanitizers and the cost counters). */
typedef int v16 __attribute__((vector_size(16), aligned(16)));

inline void mma(int op, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                const SourceAt &at) {
    MmaLane lane{a, b, c, d};
    matrix_collective(0, op, &lane, at);
}

inline void mma_f64(double (&d)[2], double a, double b, const double (&c)[2], const SourceAt &at) {
    MmaLane64 lane{a, b, c, d};
    matrix_collective(0, MMA_F64_884, &lane, at);
}

template <int NMAT, bool TRANS>
inline void ldmatrix(uint32_t (&r)[NMAT], const void *row, const SourceAt &at) {
    static_assert(NMAT == 1 || NMAT == 2 || NMAT == 4, "ldmatrix loads 1, 2 or 4 matrices");
    LdmatrixLane lane{};
    lane.r = r;
    lane.has_row = lane_id() < 8 * NMAT;
    if (lane.has_row) {
        check_smem_row(row, "ldmatrix row address", at);
        const v16 v = *static_cast<const v16 *>(row);
        std::memcpy(lane.row, &v, 16);
    }
    matrix_collective(1, ldmatrix_op(NMAT, TRANS), &lane, at);
}

inline void cp_async_16(void *smem, const void *gmem, bool valid, const SourceAt &at) {
    check_smem_row(smem, "cp.async shared-memory destination", at);
    check_aligned_16(gmem, "cp.async global source", at);
    v16 v = {0, 0, 0, 0};
    if (valid) v = *static_cast<const v16 *>(gmem);
    *static_cast<v16 *>(smem) = v16{-1, -1, -1, -1}; /* undefined until the wait: NaN */
    unsigned char data[16];
    std::memcpy(data, &v, 16);
    cp_async_enqueue(smem, data);
}

inline void cp_async_wait(int n, const SourceAt &at) {
    (void)at;
    void *dst = nullptr;
    unsigned char data[16];
    cost_pause(true); /* the shared-memory side was counted at the issue */
    while (cp_async_next(n, &dst, data)) {
        v16 v;
        std::memcpy(&v, data, 16);
        *static_cast<v16 *>(dst) = v;
    }
    cost_pause(false);
}

/* ex2.approx.ftz.f32: the emulator computes 2^x with the host's exp2f (the GPU's is within about 2
 * ulp of it) and flushes subnormal inputs and results to 0 (.ftz); one special-function operation */
inline float ex2(float x) {
    cost_count(0, 1);
    if (std::fabs(x) < 1.17549435e-38f) x = 0.0f;
    const float y = exp2f(x);
    return y < 1.17549435e-38f ? 0.0f : y; /* 2^x > 0: only underflow can be subnormal */
}

/* max.NaN.f32 x, 0: a NaN stays a NaN (the GPU's is the canonical one), -0 gives +0 */
inline float relu_nan(float x) { return x != x ? x : (x > 0.0f ? x : 0.0f); }

/* cvt.rna.tf32.f32: nearest, ties away from zero, in the fp32 format with the 13 low bits 0 */
inline uint32_t to_tf32(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) /* Inf stays, NaN stays a (quiet) NaN */
        return (u & 0x007fffffu) ? (u | 0x00400000u) & 0xffffe000u : u;
    return (u + 0x1000u) & 0xffffe000u; /* adds half an ulp to the magnitude; a carry may reach Inf */
}

/* cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32: lo in bits 0-15, hi in bits 16-31 */
inline uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat16 l = __float2bfloat16_rn(lo), h = __float2bfloat16_rn(hi);
    uint16_t a, b;
    std::memcpy(&a, &l, 2);
    std::memcpy(&b, &h, 2);
    return (uint32_t)a | (uint32_t)b << 16;
}
inline uint32_t pack_f16(float lo, float hi) {
    const __half l = __float2half_rn(lo), h = __float2half_rn(hi);
    uint16_t a, b;
    std::memcpy(&a, &l, 2);
    std::memcpy(&b, &h, 2);
    return (uint32_t)a | (uint32_t)b << 16;
}

}  // namespace asc_emu

#endif /* ASC_EMU_MATRIX_H */
