/*
 * emu_matrix.cpp -- the warp-wide half of the emulated matrix intrinsics (emu_matrix.h,
 * csrc/cuda/mma.cuh): when every lane of a warp has arrived at an mma or ldmatrix, the runtime
 * (cuda_emu.cpp) hands the 32 lanes' operands to these functions, which assemble the matrices from the
 * fragments, compute, and scatter the results into the lanes' destination registers. The fragment
 * layouts are the PTX ISA's (section 9.7.14.5.4 for m8n8k4 f64, 9.7.14.5.7 for m16n8k8 tf32, 9.7.14.5.8 for
 * m16n8k16 bf16/f16,
 * 9.7.14.5.15 for ldmatrix), with g = lane >> 2 ("groupID") and t = lane & 3 ("threadID_in_group").
 * Compiled like the rest of the runtime (not instrumented: the lanes' registers live on their fibers'
 * stacks, which only the lanes themselves touch in sanitized code).
 */
#include <cmath>
#include <cstring>

#include "cuda_emu.h"

namespace asc_emu {

namespace {

/* one operand element from its register: half `h` (0: bits 0-15, 1: bits 16-31) of a .bf16x2 / .f16x2
 * register, or the tf32 value of a whole register */
double bf16_at(uint32_t reg, int h) {
    const uint32_t bits = (reg >> (16 * h) & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

double f16_at(uint32_t reg, int h) {
    const uint16_t bits = (uint16_t)(reg >> (16 * h));
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
}

double tf32_at(uint32_t reg) {
    const uint32_t bits = reg & 0xffffe000u; /* the tensor cores read sign, exponent and 10 mantissa bits */
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

/* mma.m8n8k4 .f64: a = A[g][t], b = B[t][g], c[i] = C[g][2t + i] (section 9.7.14.5.4) */
void resolve_mma_f64(MmaLane64 *const lane[32]) {
    double A[8][4], B[4][8], C[8][8];
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        A[g][t] = lane[l]->a;
        B[t][g] = lane[l]->b;
        C[g][2 * t] = lane[l]->c[0];
        C[g][2 * t + 1] = lane[l]->c[1];
    }
    for (int l = 0; l < 32; l++) { /* after every lane's c was read: d may be c */
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 2; i++) {
            double s = C[g][2 * t + i];
            for (int k = 0; k < 4; k++) s = std::fma(A[g][k], B[k][2 * t + i], s);
            lane[l]->d[i] = s;
        }
    }
}

}  // namespace

void resolve_mma(int op, void *const lanes[32]) {
    if (op == MMA_F64_884) {
        resolve_mma_f64(reinterpret_cast<MmaLane64 *const *>(lanes));
        return;
    }
    MmaLane *const *lane = reinterpret_cast<MmaLane *const *>(lanes);
    double A[16][16] = {}, B[16][8] = {}, C[16][8];
    const bool tf32 = op == MMA_TF32_1688;
    const int K = tf32 ? 8 : 16;
    for (int l = 0; l < 32; l++) {
        const int g = l >> 2, t = l & 3;
        const uint32_t *a = lane[l]->a, *b = lane[l]->b;
        const float *c = lane[l]->c;
        if (tf32) {
            A[g][t] = tf32_at(a[0]);
            A[g + 8][t] = tf32_at(a[1]);
            A[g][t + 4] = tf32_at(a[2]);
            A[g + 8][t + 4] = tf32_at(a[3]);
            B[t][g] = tf32_at(b[0]);
            B[t + 4][g] = tf32_at(b[1]);
        } else {
            auto at = op == MMA_BF16_16816 ? bf16_at : f16_at;
            for (int h = 0; h < 2; h++) {
                A[g][2 * t + h] = at(a[0], h);
                A[g + 8][2 * t + h] = at(a[1], h);
                A[g][2 * t + 8 + h] = at(a[2], h);
                A[g + 8][2 * t + 8 + h] = at(a[3], h);
                B[2 * t + h][g] = at(b[0], h);
                B[2 * t + 8 + h][g] = at(b[1], h);
            }
        }
        for (int h = 0; h < 2; h++) {
            C[g][2 * t + h] = c[h];
            C[g + 8][2 * t + h] = c[2 + h];
        }
    }
    float D[16][8];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            double s = C[i][j];
            for (int k = 0; k < K; k++) s += A[i][k] * B[k][j]; /* exact products; double sum */
            D[i][j] = (float)s;
        }
    for (int l = 0; l < 32; l++) { /* after every lane's c was read: d may be c */
        const int g = l >> 2, t = l & 3;
        float *d = lane[l]->d;
        d[0] = D[g][2 * t];
        d[1] = D[g][2 * t + 1];
        d[2] = D[g + 8][2 * t];
        d[3] = D[g + 8][2 * t + 1];
    }
}

void resolve_ldmatrix(int op, LdmatrixLane *const lane[32]) {
    const int nmat = op & 7;
    const bool trans = (op & 8) != 0;
    uint16_t M[4][8][8]; /* [matrix][row][column] */
    for (int m = 0; m < nmat; m++)
        for (int r = 0; r < 8; r++)
            for (int w = 0; w < 4; w++) { /* no memcpy (Makefile, RT_*) */
                const uint32_t x = lane[8 * m + r]->row[w];
                M[m][r][2 * w] = (uint16_t)x;
                M[m][r][2 * w + 1] = (uint16_t)(x >> 16);
            }
    uint32_t out[32][4];
    for (int l = 0; l < 32; l++)
        for (int m = 0; m < nmat; m++) {
            const int row = l >> 2, col = 2 * (l & 3);
            const uint16_t lo = trans ? M[m][col][row] : M[m][row][col];
            const uint16_t hi = trans ? M[m][col + 1][row] : M[m][row][col + 1];
            out[l][m] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    for (int l = 0; l < 32; l++)
        for (int m = 0; m < nmat; m++) lane[l]->r[m] = out[l][m];
}

}  // namespace asc_emu
