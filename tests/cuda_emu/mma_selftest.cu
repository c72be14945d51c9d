/*
 * mma_selftest.cu -- the intrinsics of csrc/cuda/mma.cuh against plain matrix products and the PTX ISA's
 * fragment tables, on random operands. Built twice from this one source: by g++ against the CPU
 * emulator (tests/cuda_emu/Makefile, every commit, ASan/UBSan and TSan), where it checks the
 * emulator's warp-collective implementations, and by nvcc for the GPU (check-gpu, the playbook's
 * cgrid stage), where the same kernels check that the emulator's layouts are the hardware's.
 *
 *  - mma m16n8k16 bf16 and f16, m16n8k8 tf32: each lane builds its fragments from row-major A, B, C in
 *    global memory by the PTX ISA's tables (mma.cuh), D = A B + C is compared with a double product;
 *    a kernel with two fragment registers swapped (a planted layout bug) must fail the comparison.
 *  - mma m8n8k4 f64 likewise, against a double product to 1e-14; a lane taking A's columns rotated must fail.
 *    And its one user, quad_form8 (keymoments.cuh: x^T M x of 8 rows at once), against a double loop at three
 *    widths: the forward falls back to the sweep where these forms look wrong, so the grid alone would not see a
 *    wrong fragment index there.
 *  - ldmatrix x1, x2, x4, each with and without .trans: 4 distinct 8x8 matrices of distinct 16-bit
 *    values at padded rows of dynamic shared memory; every lane's registers against the table, and a
 *    planted wrong row address must fail it.
 *  - ldmatrix feeding mma (the kernels' path): A by x4 from row-major A and by x4.trans from A
 *    transposed, B by x2 from B transposed ("col") and by x2.trans / two x1.trans from row-major B.
 *  - cp.async with zero fill, two groups, wait_group 1 then 0: the data, the zeros; under the emulator
 *    also that a group still pending reads as 0xff bytes (a missing wait shows).
 *  - to_tf32, pack_bf16, pack_f16 against host roundings written independently; ex2 against exp2; relu_nan
 *    against max(x, 0) with NaN kept and +0 for -0.
 *  - arrive through block_last (common.cuh): groups of blocks write their values, and the one block of each group
 *    that arrives last sums them all (every value written before the others' arrivals, none missed).
 *  - Under the emulator only, the faults the PTX ISA's rules call for: a misaligned or non-shared
 *    ldmatrix row, a cp.async outside shared memory, lanes at different matrix instructions, a lane
 *    that has exited.
 * Exit status 1 on any failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda/common.cuh"
#include "cuda/keymoments.cuh"
#include "cuda/mma.cuh"

#ifdef ASC_CUDA_EMU
#include "emu_api.h"
#endif

namespace {

int g_failed = 0, g_passed = 0;

void check(bool ok, const char *what) {
    printf("[mma selftest] %-72s %s\n", what, ok ? "ok" : "FAIL");
    if (ok) g_passed++;
    else g_failed++;
}

#define CK(call)                                                                                  \
    do {                                                                                          \
        const cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

/* device buffers of n elements, copied in and out */
template <typename V> V *to_device(const std::vector<V> &h) {
    V *d = nullptr;
    CK(cudaMalloc((void **)&d, h.size() * sizeof(V)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(V), cudaMemcpyHostToDevice));
    return d;
}
template <typename V> std::vector<V> from_device(const V *d, size_t n) {
    std::vector<V> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(V), cudaMemcpyDeviceToHost));
    return h;
}

/* ---------------------------------------------------------------- host-side number formats */

uint64_t g_rng = 0x9E3779B97F4A7C15ull;
double uniform() { /* in [-1, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 4503599627370496.0 - 1.0;
}

float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* a value with p significant bits (and an exponent in [-3, 3]), exact in bf16 (p = 8), f16 (p = 11),
 * tf32 (p = 11) */
double with_bits(int p) {
    const double m = ldexp(floor(ldexp(fabs(uniform()), p)), -p) * (uniform() < 0 ? -1 : 1);
    return ldexp(m, (int)floor(uniform() * 3.5));
}

uint16_t bf16_of(double x) { return (uint16_t)(float_bits((float)x) >> 16); } /* exact values only */
uint16_t f16_of(double x) {
    const __half h = __float2half_rn((float)x);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* round to p significant bits, ties away from zero / to even, independently of the device code */
double round_bits(double x, int p, bool away) {
    if (x == 0 || !isfinite(x)) return x;
    int e;
    const double f = frexp(x, &e); /* x = f 2^e, 0.5 <= |f| < 1 */
    const double s = ldexp(f, p);
    const double r = away ? round(s) : nearbyint(s); /* nearbyint: the default mode, ties to even */
    return ldexp(r, e - p);
}

/* ---------------------------------------------------------------- mma kernels */

enum Kind { BF16 = 0, F16 = 1, TF32 = 2 };

/* Lane l of one warp: fragments of A [16][K], B [K][8] (row-major, as 16-bit patterns or tf32 bit
 * patterns in a uint32 each), C [16][8] by the tables of mma.cuh; D [16][8] out. PERMUTE swaps a[1]
 * and a[2] (rows g+8 and columns +8 confused), a layout bug the comparison must catch. */
template <int KIND, bool PERMUTE>
__global__ void k_mma(const uint32_t *A, const uint32_t *B, const float *C, float *D) {
    const int l = threadIdx.x, g = l >> 2, t = l & 3;
    const int K = KIND == TF32 ? 8 : 16;
    uint32_t a[4], b[2];
    float c[4], d[4];
    if (KIND == TF32) {
        a[0] = A[g * K + t];
        a[1] = A[(g + 8) * K + t];
        a[2] = A[g * K + t + 4];
        a[3] = A[(g + 8) * K + t + 4];
        b[0] = B[t * 8 + g];
        b[1] = B[(t + 4) * 8 + g];
    } else {
        auto pair = [&](int r, int col) { return A[r * K + col] | A[r * K + col + 1] << 16; };
        a[0] = pair(g, 2 * t);
        a[1] = pair(g + 8, 2 * t);
        a[2] = pair(g, 2 * t + 8);
        a[3] = pair(g + 8, 2 * t + 8);
        b[0] = B[(2 * t) * 8 + g] | B[(2 * t + 1) * 8 + g] << 16;
        b[1] = B[(2 * t + 8) * 8 + g] | B[(2 * t + 9) * 8 + g] << 16;
    }
    if (PERMUTE) {
        const uint32_t x = a[1];
        a[1] = a[2];
        a[2] = x;
    }
    c[0] = C[g * 8 + 2 * t];
    c[1] = C[g * 8 + 2 * t + 1];
    c[2] = C[(g + 8) * 8 + 2 * t];
    c[3] = C[(g + 8) * 8 + 2 * t + 1];
    if (KIND == BF16) asc::mma_m16n8k16_bf16(d, a, b, c);
    else if (KIND == F16) asc::mma_m16n8k16_f16(d, a, b, c);
    else asc::mma_m16n8k8_tf32(d, a, b, c);
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

/* relative error of D against the double product (scale: sum |a||b| + |c| of the element) */
double mma_error(const std::vector<double> &A, const std::vector<double> &B, const std::vector<double> &C,
                 const std::vector<float> &D, int K) {
    double worst = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            double s = C[i * 8 + j], scale = fabs(C[i * 8 + j]);
            for (int k = 0; k < K; k++) {
                s += A[i * K + k] * B[k * 8 + j];
                scale += fabs(A[i * K + k] * B[k * 8 + j]);
            }
            const double e = fabs((double)D[i * 8 + j] - s) / (scale > 0 ? scale : 1);
            worst = e > worst || e != e ? e : worst;
        }
    return worst;
}

/* runs k_mma<kind> (and its permuted twin) on random exact operands: {error, permuted error} */
template <int KIND> void test_mma(const char *name) {
    const int K = KIND == TF32 ? 8 : 16;
    std::vector<double> A(16 * K), B(K * 8), C(16 * 8);
    std::vector<uint32_t> Ab(16 * K), Bb(K * 8);
    std::vector<float> Cf(16 * 8);
    for (int i = 0; i < 16 * K; i++) A[i] = with_bits(KIND == BF16 ? 8 : 11);
    for (int i = 0; i < K * 8; i++) B[i] = with_bits(KIND == BF16 ? 8 : 11);
    for (int i = 0; i < 16 * 8; i++) C[i] = (double)(Cf[i] = (float)(uniform() * 4));
    for (int i = 0; i < 16 * K; i++) Ab[i] = KIND == BF16 ? bf16_of(A[i]) : KIND == F16 ? f16_of(A[i]) : float_bits((float)A[i]);
    for (int i = 0; i < K * 8; i++) Bb[i] = KIND == BF16 ? bf16_of(B[i]) : KIND == F16 ? f16_of(B[i]) : float_bits((float)B[i]);
    uint32_t *dA = to_device(Ab), *dB = to_device(Bb);
    float *dC = to_device(Cf), *dD = nullptr;
    CK(cudaMalloc((void **)&dD, 16 * 8 * sizeof(float)));
    double err[2];
    for (int perm = 0; perm < 2; perm++) {
        CK(asc::launch(perm ? k_mma<KIND, true> : k_mma<KIND, false>, dim3(1), dim3(32), 0, nullptr,
                       (const uint32_t *)dA, (const uint32_t *)dB, (const float *)dC, dD));
        CK(cudaDeviceSynchronize());
        err[perm] = mma_error(A, B, C, from_device(dD, 16 * 8), K);
    }
    char what[160];
    snprintf(what, sizeof(what), "%s: D = A B + C within 1e-6 (%.1e); swapped a[1], a[2] fails (%.1e)", name, err[0],
             err[1]);
    check(err[0] <= 1e-6 && err[1] > 1e-3, what);
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dC));
    CK(cudaFree(dD));
}

/* Lane l of one warp: a = A[g][t], b = B[t][g], c = C[g][2t, 2t+1] of row-major A [8][4], B [4][8], C [8][8] (mma.cuh);
 * D [8][8] out. ROTATE takes A[g][(t + 1) % 4]: a layout bug the comparison must catch. */
template <bool ROTATE> __global__ void k_mma_f64(const double *A, const double *B, const double *C, double *D) {
    const int l = threadIdx.x, g = l >> 2, t = l & 3;
    const double c[2] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1]};
    double d[2];
    asc::mma_m8n8k4_f64(d, A[g * 4 + (ROTATE ? (t + 1) & 3 : t)], B[t * 8 + g], c);
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
}

void test_mma_f64() {
    std::vector<double> A(8 * 4), B(4 * 8), C(8 * 8);
    for (double &x : A) x = uniform() * 2 - 1;
    for (double &x : B) x = uniform() * 2 - 1;
    for (double &x : C) x = uniform() * 4;
    double *dA = to_device(A), *dB = to_device(B), *dC = to_device(C), *dD = nullptr;
    CK(cudaMalloc((void **)&dD, 8 * 8 * sizeof(double)));
    double err[2];
    for (int rot = 0; rot < 2; rot++) {
        CK(asc::launch(rot ? k_mma_f64<true> : k_mma_f64<false>, dim3(1), dim3(32), 0, nullptr, (const double *)dA,
                       (const double *)dB, (const double *)dC, dD));
        CK(cudaDeviceSynchronize());
        const std::vector<double> D = from_device(dD, 8 * 8);
        err[rot] = 0;
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < 8; j++) {
                double s = C[i * 8 + j], scale = fabs(C[i * 8 + j]);
                for (int k = 0; k < 4; k++) {
                    s += A[i * 4 + k] * B[k * 8 + j];
                    scale += fabs(A[i * 4 + k] * B[k * 8 + j]);
                }
                const double e = fabs(D[i * 8 + j] - s) / (scale > 0 ? scale : 1);
                err[rot] = e > err[rot] || e != e ? e : err[rot];
            }
    }
    char what[160];
    snprintf(what, sizeof(what), "mma m8n8k4 f64: D = A B + C within 1e-14 (%.1e); A's columns rotated fails (%.1e)",
             err[0], err[1]);
    check(err[0] <= 1e-14 && err[1] > 1e-3, what);
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dC));
    CK(cudaFree(dD));
}

/* q[l] = quad_form8 of lane l: row l >> 2 of X [8][nf] against the symmetric M [nf][nf] */
__global__ void k_quad_form8(const double *X, const double *M, int nf, double *q) {
    const int l = threadIdx.x;
    q[l] = asc::tiled::quad_form8([&](int f) { return X[(l >> 2) * nf + f]; }, M, nf, l);
}

void test_quad_form8() {
    double worst = 0;
    for (int nf : {37, 64, 100}) {
        std::vector<double> X(8 * nf), M(nf * nf);
        for (double &x : X) x = uniform();
        for (int f = 0; f < nf; f++)
            for (int g = 0; g <= f; g++) M[f * nf + g] = M[g * nf + f] = uniform();
        double *dX = to_device(X), *dM = to_device(M), *dq = nullptr;
        CK(cudaMalloc((void **)&dq, 32 * sizeof(double)));
        CK(asc::launch(k_quad_form8, dim3(1), dim3(32), 0, nullptr, (const double *)dX, (const double *)dM, nf, dq));
        CK(cudaDeviceSynchronize());
        const std::vector<double> q = from_device(dq, 32);
        for (int l = 0; l < 32; l++) {
            const double *x = &X[(l >> 2) * nf];
            double r = 0, scale = 0;
            for (int f = 0; f < nf; f++)
                for (int g = 0; g < nf; g++) {
                    r += x[f] * M[f * nf + g] * x[g];
                    scale += fabs(x[f] * M[f * nf + g] * x[g]);
                }
            const double e = fabs(q[l] - r) / scale;
            worst = e > worst || e != e ? e : worst;
        }
        CK(cudaFree(dX));
        CK(cudaFree(dM));
        CK(cudaFree(dq));
    }
    char what[160];
    snprintf(what, sizeof(what), "quad_form8 (mma m8n8k4 f64): x^T M x of 8 rows, nf = 37, 64, 100, within 1e-13 (%.1e)",
             worst);
    check(worst <= 1e-13, what);
}

/* ---------------------------------------------------------------- ldmatrix against the table */

constexpr int PITCH = 24; /* halves per shared row: 48 bytes, 16-byte aligned rows, 8 halves of padding */

/* 4 matrices m of 8 rows r at shared rows 8m + r (value 256 m + 8 r + c + 1 at column c), loaded by
 * the form (NMAT, TRANS); lane l supplies row l & 7 of matrix l >> 3, or (BAD) of the row after it.
 * out[l * 4 + m] = r[m] of lane l. */
template <int NMAT, bool TRANS, bool BAD>
__global__ void k_ldmatrix(uint32_t *out) {
    ASC_DYNAMIC_SMEM(smem);
    uint16_t *s = reinterpret_cast<uint16_t *>(smem);
    const int l = threadIdx.x;
    for (int i = l; i < 32 * PITCH; i += 32) {
        const int row = i / PITCH, col = i % PITCH;
        s[i] = col < 8 ? (uint16_t)(256 * (row >> 3) + 8 * (row & 7) + col + 1) : (uint16_t)0xdead;
    }
    __syncwarp();
    const int row = BAD ? (l + 1) % 32 : l;
    const void *p = s + row * PITCH;
    uint32_t r[4] = {0, 0, 0, 0};
    if (NMAT == 1) {
        uint32_t x[1];
        if (TRANS) asc::ldmatrix_x1_trans(x, p);
        else asc::ldmatrix_x1(x, p);
        r[0] = x[0];
    } else if (NMAT == 2) {
        uint32_t x[2];
        if (TRANS) asc::ldmatrix_x2_trans(x, p);
        else asc::ldmatrix_x2(x, p);
        r[0] = x[0];
        r[1] = x[1];
    } else {
        if (TRANS) asc::ldmatrix_x4_trans(r, p);
        else asc::ldmatrix_x4(r, p);
    }
    for (int m = 0; m < 4; m++) out[l * 4 + m] = r[m];
}

/* the table: r[m] of lane l = (row l/4, columns 2 (l%4), +1) of matrix m, or of its transpose */
template <int NMAT, bool TRANS, bool BAD> bool ldmatrix_case() {
    uint32_t *d = nullptr;
    CK(cudaMalloc((void **)&d, 32 * 4 * sizeof(uint32_t)));
    auto k = k_ldmatrix<NMAT, TRANS, BAD>;
    const size_t smem = 32 * PITCH * sizeof(uint16_t);
    CK(asc::launch(k, dim3(1), dim3(32), smem, nullptr, d));
    CK(cudaDeviceSynchronize());
    const std::vector<uint32_t> out = from_device(d, 32 * 4);
    CK(cudaFree(d));
    bool ok = true;
    for (int l = 0; l < 32; l++)
        for (int m = 0; m < NMAT; m++) {
            const int row = l / 4, col = 2 * (l % 4);
            auto val = [&](int r, int c) { return (uint32_t)(256 * m + 8 * r + c + 1); };
            const uint32_t lo = TRANS ? val(col, row) : val(row, col), hi = TRANS ? val(col + 1, row) : val(row, col + 1);
            ok &= out[(size_t)l * 4 + m] == (lo | hi << 16);
        }
    return ok;
}

template <int NMAT, bool TRANS> void test_ldmatrix(const char *name) {
    const bool ok = ldmatrix_case<NMAT, TRANS, false>(), bad_fails = !ldmatrix_case<NMAT, TRANS, true>();
    char what[160];
    snprintf(what, sizeof(what), "%s: every lane's registers as the table; a shifted row address fails", name);
    check(ok && bad_fails, what);
}

/* ---------------------------------------------------------------- ldmatrix feeding mma */

/* A [16][16] and B [16][8] bf16 (row-major in global memory) staged in shared memory as the kernels
 * would: A row-major (FORM 0, ldmatrix_x4) or transposed (FORM 1, x4.trans); B transposed, i.e. "col"
 * [8][16] (x2), or row-major [16][8] (FORM 1: x2.trans; FORM 2: two x1.trans). */
template <int FORM>
__global__ void k_ldmatrix_mma(const uint16_t *A, const uint16_t *B, float *D) {
    ASC_DYNAMIC_SMEM(smem);
    uint16_t *sa = reinterpret_cast<uint16_t *>(smem), *sb = sa + 16 * PITCH;
    const int l = threadIdx.x;
    for (int i = l; i < 256; i += 32) {
        const int r = i / 16, c = i % 16;
        if (FORM == 0) sa[r * PITCH + c] = A[r * 16 + c];
        else sa[c * PITCH + r] = A[r * 16 + c]; /* A^T row-major */
    }
    for (int i = l; i < 128; i += 32) {
        const int k = i / 8, n = i % 8;
        if (FORM == 0) sb[n * PITCH + k] = B[k * 8 + n]; /* B^T [8][16] */
        else sb[k * PITCH + n] = B[k * 8 + n];           /* B [16][8] */
    }
    __syncwarp();
    uint32_t a[4], b[2];
    /* the 4 matrices of A's fragment: (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
     * (rows 8-15, cols 8-15); lane l supplies row l & 7 of matrix l >> 3 */
    const int m = l >> 3, r = l & 7, rows = (m & 1) * 8, cols = (m >> 1) * 8;
    if (FORM == 0) asc::ldmatrix_x4(a, sa + (rows + r) * PITCH + cols);
    else asc::ldmatrix_x4_trans(a, sa + (cols + r) * PITCH + rows); /* row r of the transposed block */
    /* B's fragment: matrix 0 = k 0-7, matrix 1 = k 8-15 */
    if (FORM == 0) {
        asc::ldmatrix_x2(b, sb + r * PITCH + (m & 1) * 8); /* row n = r of B^T, k block m */
    } else if (FORM == 1) {
        asc::ldmatrix_x2_trans(b, sb + ((m & 1) * 8 + r) * PITCH); /* row k of B */
    } else {
        uint32_t x[1];
        asc::ldmatrix_x1_trans(x, sb + r * PITCH);
        b[0] = x[0];
        asc::ldmatrix_x1_trans(x, sb + (8 + r) * PITCH);
        b[1] = x[0];
    }
    float d[4], c[4] = {0, 0, 0, 0};
    asc::mma_m16n8k16_bf16(d, a, b, c);
    const int g = l >> 2, t = l & 3;
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

void test_ldmatrix_mma() {
    std::vector<double> A(256), B(128), C(128, 0.0);
    std::vector<uint16_t> Ab(256), Bb(128);
    for (int i = 0; i < 256; i++) Ab[i] = bf16_of(A[i] = with_bits(8));
    for (int i = 0; i < 128; i++) Bb[i] = bf16_of(B[i] = with_bits(8));
    uint16_t *dA = to_device(Ab), *dB = to_device(Bb);
    float *dD = nullptr;
    CK(cudaMalloc((void **)&dD, 128 * sizeof(float)));
    const char *names[3] = {"ldmatrix x4 (A) + x2 (B col) -> mma bf16 = A B",
                            "ldmatrix x4.trans (A^T) + x2.trans (B row) -> mma bf16 = A B",
                            "ldmatrix x4.trans (A^T) + 2 x1.trans (B row) -> mma bf16 = A B"};
    for (int form = 0; form < 3; form++) {
        auto k = form == 0 ? k_ldmatrix_mma<0> : form == 1 ? k_ldmatrix_mma<1> : k_ldmatrix_mma<2>;
        CK(asc::launch(k, dim3(1), dim3(32), (size_t)(32 * PITCH * 2), nullptr, (const uint16_t *)dA,
                       (const uint16_t *)dB, dD));
        CK(cudaDeviceSynchronize());
        check(mma_error(A, B, C, from_device(dD, 128), 16) <= 1e-6, names[form]);
    }
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dD));
}

/* ---------------------------------------------------------------- cp.async */

/* 2 tiles of 64 x 16 bytes, one group each, copied by 64 threads; chunk j of tile 1 is a zero fill
 * when j % 5 == 0. out: tile 0 after wait_group 1, then (emulator) tile 1 before its wait, then tile 1
 * after wait_group 0 (each after a barrier). */
__global__ void k_cp_async(const uint4 *src, uint4 *out) {
    ASC_DYNAMIC_SMEM(smem);
    uint4 *s = reinterpret_cast<uint4 *>(smem);
    const int j = threadIdx.x;
    asc::cp_async_16(s + j, src + j);
    asc::cp_async_commit();
    asc::cp_async_16_zfill(s + 64 + j, src + 64 + j, j % 5 != 0);
    asc::cp_async_commit();
    asc::cp_async_wait<1>();
    __syncthreads();
    out[j] = s[j];
#ifdef ASC_CUDA_EMU
    out[64 + j] = s[64 + j]; /* a read of the pending group: 0xff bytes under the emulator */
#endif
    asc::cp_async_wait<0>();
    __syncthreads();
    out[128 + j] = s[64 + j];
}

void test_cp_async() {
    std::vector<uint4> src(128);
    for (int i = 0; i < 128; i++) src[i] = make_uint4(4 * i + 1, 4 * i + 2, 4 * i + 3, 4 * i + 4);
    uint4 *dsrc = to_device(src), *dout = nullptr;
    CK(cudaMalloc((void **)&dout, 192 * sizeof(uint4)));
    CK(cudaMemset(dout, 0, 192 * sizeof(uint4)));
    CK(asc::launch(k_cp_async, dim3(1), dim3(64), 128 * sizeof(uint4), nullptr, (const uint4 *)dsrc, dout));
    CK(cudaDeviceSynchronize());
    const std::vector<uint4> out = from_device(dout, 192);
    auto same = [](uint4 a, uint4 b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; };
    bool data = true;
    for (int j = 0; j < 64; j++) {
        data &= same(out[j], src[j]);
        data &= same(out[128 + j], j % 5 ? src[64 + j] : make_uint4(0, 0, 0, 0));
    }
    check(data, "cp.async 16 B, zero fill, two groups: wait_group 1 then 0 complete them in order");
#ifdef ASC_CUDA_EMU
    bool pending = true;
    for (int j = 0; j < 64; j++) pending &= same(out[64 + j], make_uint4(~0u, ~0u, ~0u, ~0u));
    check(pending, "cp.async (emulator): a group not yet waited for reads as 0xff bytes");
#endif
    CK(cudaFree(dsrc));
    CK(cudaFree(dout));
}

/* ---------------------------------------------------------------- conversions */

__global__ void k_convert(const float *x, int n, uint32_t *tf, uint32_t *bf, uint32_t *hf) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        tf[i] = asc::to_tf32(x[i]);
        bf[i] = asc::pack_bf16(x[i], -x[i] * 0.5f);
        hf[i] = asc::pack_f16(x[i], -x[i] * 0.5f);
    }
}

void test_convert() {
    std::vector<float> x;
    for (int i = 0; i < 2000; i++) x.push_back((float)(uniform() * ldexp(1.0, (int)(uniform() * 20))));
    /* ties of tf32 (10 mantissa bits), bf16 (7), f16 (10) and values past their ranges */
    for (float v : {1.0f + ldexpf(1, -11), 1.0f + 3 * ldexpf(1, -11), -(1.0f + ldexpf(1, -11)), 1.0f + ldexpf(1, -8),
                    1.0f + 3 * ldexpf(1, -8), 65519.0f, 65520.0f, 3.0e38f, -3.4e38f, 1e-8f, 0.0f, -0.0f})
        x.push_back(v);
    const int n = (int)x.size();
    float *dx = to_device(x);
    uint32_t *dt = nullptr, *db = nullptr, *dh = nullptr;
    CK(cudaMalloc((void **)&dt, n * 4));
    CK(cudaMalloc((void **)&db, n * 4));
    CK(cudaMalloc((void **)&dh, n * 4));
    CK(asc::launch(k_convert, dim3(1), dim3(64), 0, nullptr, (const float *)dx, n, dt, db, dh));
    CK(cudaDeviceSynchronize());
    const std::vector<uint32_t> t = from_device(dt, n), b = from_device(db, n), h = from_device(dh, n);
    bool ok_t = true, ok_b = true, ok_h = true;
    for (int i = 0; i < n; i++) {
        const double v = x[i];
        const double tv = round_bits(v, 11, true);
        ok_t &= (t[i] & 0x1fffu) == 0 && (fabs(tv) >= 0x1p128 ? isinf(bits_float(t[i])) : bits_float(t[i]) == (float)tv);
        for (int half = 0; half < 2; half++) {
            const double w = half ? -v * 0.5 : v;
            const double bv = round_bits(w, 8, false);
            const float bgot = bits_float((b[i] >> (16 * half) & 0xffffu) << 16);
            ok_b &= fabs(bv) >= 0x1p128 ? isinf(bgot) : bgot == (float)bv;
            __half_raw raw;
            raw.x = (uint16_t)(h[i] >> (16 * half));
            const float hgot = __half2float(__half(raw));
            const double hv = fabs(w) < 0x1p-14 ? nearbyint(ldexp(w, 24)) * 0x1p-24 : round_bits(w, 11, false);
            ok_h &= fabs(hv) >= 65520.0 ? isinf(hgot) : hgot == (float)hv;
        }
    }
    check(ok_t, "to_tf32: nearest, ties away from zero, 13 low bits 0, Inf past the range");
    check(ok_b, "pack_bf16: nearest even, lo in the low half, Inf past the range");
    check(ok_h, "pack_f16: nearest even (subnormals too), lo in the low half, Inf past 65520");
    CK(cudaFree(dx));
    CK(cudaFree(dt));
    CK(cudaFree(db));
    CK(cudaFree(dh));
}

/* ---------------------------------------------------------------- ex2, relu_nan: one value per thread */

struct Ex2 {
    __device__ float operator()(float x) const { return asc::ex2(x); }
};
struct ReluNan {
    __device__ float operator()(float x) const { return asc::relu_nan(x); }
};

template <typename F> __global__ void k_map(const float *x, int n, float *y) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = F()(x[i]);
}

/* F of every entry of x, on the device */
template <typename F> std::vector<float> map_on_device(const std::vector<float> &x) {
    const int n = (int)x.size();
    float *dx = to_device(x), *dy = nullptr;
    CK(cudaMalloc((void **)&dy, n * 4));
    CK(asc::launch(k_map<F>, dim3(1), dim3(64), 0, nullptr, (const float *)dx, n, dy));
    CK(cudaDeviceSynchronize());
    std::vector<float> y = from_device(dy, n);
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    return y;
}

void test_ex2() {
    std::vector<float> x;
    for (int i = 0; i < 1000; i++) x.push_back((float)(uniform() * 120));
    for (float v : {0.0f, -0.0f, 1e-40f, -126.0f, -127.5f, -150.0f, 127.9f, 128.0f, INFINITY, -INFINITY}) x.push_back(v);
    const std::vector<float> y = map_on_device<Ex2>(x);
    bool ok = true;
    for (size_t i = 0; i < x.size(); i++) {
        const double want = exp2((double)x[i]);
        if (want < 0x1p-126) ok &= y[i] == 0.0f; /* .ftz: a subnormal result is 0 */
        else if (isinf(want) || want >= 0x1p128) ok &= isinf(y[i]) && y[i] > 0;
        else ok &= fabs(y[i] - want) <= 0x1p-21 * want;
    }
    check(ok, "ex2 (ex2.approx.ftz.f32): within 2^-21 relative, subnormal results 0, Inf past 2^128");
}

void test_relu_nan() {
    std::vector<float> x;
    for (int i = 0; i < 200; i++) x.push_back((float)(uniform() * 4 - 2));
    for (float v : {0.0f, -0.0f, 1e-40f, -1e-40f, 3e38f, -3e38f, INFINITY, -INFINITY, NAN, -NAN}) x.push_back(v);
    const std::vector<float> y = map_on_device<ReluNan>(x);
    bool ok = true;
    for (size_t i = 0; i < x.size(); i++) {
        if (isnan(x[i])) ok &= (bool)isnan(y[i]);
        else if (x[i] > 0.0f) ok &= y[i] == x[i];
        else ok &= y[i] == 0.0f && !signbit(y[i]); /* -0 and the negatives: +0 */
    }
    check(ok, "relu_nan (max.NaN.f32 with 0): x above 0, +0 for -0 and below, NaN kept");
}

/* ---------------------------------------------------------------- arrive: the last block of a group */

constexpr int GROUP_BLOCKS = 37, GROUP_THREADS = 64;

/* Block b of group b / GROUP_BLOCKS writes one value per thread; the group's last block sums the group's values. */
__global__ void k_last(unsigned *vals, unsigned *counter, unsigned long long *sum, unsigned *lasts) {
    const unsigned g = blockIdx.x / GROUP_BLOCKS, c = blockIdx.x % GROUP_BLOCKS;
    vals[(g * GROUP_BLOCKS + c) * GROUP_THREADS + threadIdx.x] = c * GROUP_THREADS + threadIdx.x + 1;
    if (!asc::block_last(counter + g, GROUP_BLOCKS)) return;
    if (threadIdx.x == 0) {
        unsigned long long s = 0;
        for (int k = 0; k < GROUP_BLOCKS * GROUP_THREADS; k++) s += vals[g * GROUP_BLOCKS * GROUP_THREADS + k];
        sum[g] = s;
        atomicAdd(lasts + g, 1u);
    }
}

void test_block_last() {
    const int groups = 5, n = GROUP_BLOCKS * GROUP_THREADS;
    unsigned *vals = nullptr;
    CK(cudaMalloc((void **)&vals, sizeof(unsigned) * groups * n));
    unsigned *counter = to_device(std::vector<unsigned>(groups, 0u));
    unsigned *lasts = to_device(std::vector<unsigned>(groups, 0u));
    unsigned long long *sum = to_device(std::vector<unsigned long long>(groups, 0ull));
    CK(asc::launch(k_last, dim3(groups * GROUP_BLOCKS), dim3(GROUP_THREADS), 0, nullptr, vals, counter, sum, lasts));
    CK(cudaDeviceSynchronize());
    const std::vector<unsigned> hc = from_device(counter, groups), hl = from_device(lasts, groups);
    const std::vector<unsigned long long> hs = from_device(sum, groups);
    bool ok = true;
    for (int g = 0; g < groups; g++)
        ok &= hc[g] == GROUP_BLOCKS && hl[g] == 1 && hs[g] == (unsigned long long)n * (n + 1) / 2;
    check(ok, "arrive (atom.acq_rel.gpu) in block_last: one last block a group, and it sees every value");
    for (void *q : {(void *)vals, (void *)counter, (void *)lasts, (void *)sum}) CK(cudaFree(q));
}

/* ---------------------------------------------------------------- emulator faults */

#ifdef ASC_CUDA_EMU
/* WHAT: 0 ldmatrix row at an odd 8-byte offset, 1 ldmatrix row in global memory, 2 cp.async into global
 * memory, 3 lanes at two different ldmatrix forms, 4 a lane exits before an mma */
template <int WHAT>
__global__ void k_fault(uint32_t *g) {
    ASC_DYNAMIC_SMEM(smem);
    const int l = threadIdx.x;
    uint32_t r[4] = {0, 0, 0, 0};
    if (WHAT == 0) asc::ldmatrix_x4(r, smem + 16 * l + (l == 5 ? 8 : 0));
    if (WHAT == 1) asc::ldmatrix_x4(r, reinterpret_cast<unsigned char *>(g) + 16 * l);
    if (WHAT == 2) asc::cp_async_16(g + 4 * l, g);
    if (WHAT == 3) {
        uint32_t x[2];
        if (l < 16) asc::ldmatrix_x4(r, smem + 16 * l);
        else asc::ldmatrix_x2(x, smem + 16 * l);
    }
    if (WHAT == 4) {
        if (l == 31) return;
        float d[4], c[4] = {0, 0, 0, 0};
        asc::mma_m16n8k16_bf16(d, r, *reinterpret_cast<uint32_t(*)[2]>(r), c);
    }
    g[l] = r[0];
}

template <int WHAT> bool faults_with(const char *needle) {
    uint32_t *g = nullptr;
    CK(cudaMalloc((void **)&g, 32 * 16));
    const cudaError_t e = asc::launch(k_fault<WHAT>, dim3(1), dim3(32), 1024, nullptr, g);
    const char *f = asc_emu_last_fault();
    const bool ok = e == cudaErrorLaunchFailure && strstr(f, needle) != nullptr;
    if (!ok) printf("  launch: %s; fault was: %s\n", cudaGetErrorString(e), f);
    asc_emu_reset();
    CK(cudaFree(g));
    return ok;
}

void test_faults() {
    check(faults_with<0>("not 16-byte aligned"), "fault: ldmatrix row address not 16-byte aligned");
    check(faults_with<1>("not inside the block's dynamic shared memory"), "fault: ldmatrix row outside shared memory");
    check(faults_with<2>("not inside the block's dynamic shared memory"), "fault: cp.async destination outside shared memory");
    check(faults_with<3>("mismatched warp collectives"), "fault: lanes at ldmatrix .x4 and .x2");
    check(faults_with<4>("exited"), "fault: mma.sync with a lane that has exited");
}
#endif

}  // namespace

int main() {
    test_mma<BF16>("mma m16n8k16 bf16");
    test_mma<F16>("mma m16n8k16 f16");
    test_mma<TF32>("mma m16n8k8 tf32");
    test_mma_f64();
    test_quad_form8();
    test_ldmatrix<1, false>("ldmatrix x1");
    test_ldmatrix<2, false>("ldmatrix x2");
    test_ldmatrix<4, false>("ldmatrix x4");
    test_ldmatrix<1, true>("ldmatrix x1.trans");
    test_ldmatrix<2, true>("ldmatrix x2.trans");
    test_ldmatrix<4, true>("ldmatrix x4.trans");
    test_ldmatrix_mma();
    test_cp_async();
    test_convert();
    test_ex2();
    test_relu_nan();
    test_block_last();
#ifdef ASC_CUDA_EMU
    test_faults();
    check(asc_emu_live_allocations() == 0, "no device allocation left behind");
#endif
    printf("mma selftest: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
