/*
 * keyrow.cuh -- what one lane reads and sums of one key row in global memory (a lane per key): the decode sweeps'
 * products with the row operands and the key's norms (decode_sweeps.cuh), and the norms of the paper heading's
 * neighbours where the keys are not prepared (rows_geometry). 16-byte loads where the row allows; the 16-bit types
 * sum in float, with double where a float sum of squares overflows.
 */
#ifndef ASCENDER_CUDA_KEYROW_CUH
#define ASCENDER_CUDA_KEYROW_CUH

#include "common.cuh"
#include "kernel_traits.cuh"

namespace asc {
namespace tiled {

/* 16 bytes of a key row (one vector load). */
template <typename T> struct alignas(16) Vec16 {
    T v[16 / sizeof(T)];
};

/* W values of the compute type from a 16-byte aligned address (the decode copy of the row operands, DecOps). */
template <typename C, int W> struct alignas(16) CVec {
    C v[W];
};

/* The type of a key's own sums in the decode sweeps (its squared norms, its semantic product with the row): float
 * for 16-bit inputs (each product is exact in float; 32 to 256 terms keep a relative error near 1e-6, far below the
 * inputs' 4e-3 or 5e-4), double for float32 and float64, as the key preparation (keyprep.cuh) forms them. */
template <typename T> using KeyAcc = typename std::conditional<Elem<T>::kMma, float, double>::type;

/*
 * For the key row x (n elements in global memory): dot[v] += r_v[c] x[c] in D for the NV operand rows r_v (the
 * decode copy, DecOps; NV = 0: the squares only) and ss += x[c]^2 in A, c in order. 16-byte loads of the key row
 * and of the operands where the row allows (n a multiple of the elements in 16 bytes and x aligned).
 */
template <int NV, typename T, typename D, typename A>
__device__ __forceinline__ void key_dots(const T *x, int64_t n, const typename Elem<T>::C *const *r, D *dot, A &ss) {
    using C = typename Elem<T>::C;
    constexpr int W = 16 / (int)sizeof(T);
    if (n % W == 0 && ((uintptr_t)x & 15u) == 0) {
        for (int64_t c = 0; c < n; c += W) {
            const Vec16<T> v = *reinterpret_cast<const Vec16<T> *>(x + c);
            C xv[W];
            ASC_UNROLL
            for (int e = 0; e < W; e++) xv[e] = (C)up(v.v[e]);
            ASC_UNROLL
            for (int k = 0; k < NV; k++) {
                const CVec<C, W> rv = *reinterpret_cast<const CVec<C, W> *>(r[k] + c);
                ASC_UNROLL
                for (int e = 0; e < W; e++) dot[k] += (D)rv.v[e] * (D)xv[e];
            }
            ASC_UNROLL
            for (int e = 0; e < W; e++) ss += (A)xv[e] * (A)xv[e];
        }
    } else {
        for (int64_t c = 0; c < n; c++) {
            const C xc = (C)up(x[c]);
            ASC_UNROLL
            for (int k = 0; k < NV; k++) dot[k] += (D)r[k][c] * (D)xc;
            ss += (A)xc * (A)xc;
        }
    }
}

/* A sum of squares in float overflowed: a 16-bit key row past ~1e19 (bfloat16 has float's range). The key's norm
 * and products then come from sums in double, as the key preparation forms them, so that they do not depend on
 * the row's scale (SPEC, issue 17 item 5). */
template <typename A> __device__ __forceinline__ bool float_overflow(A ss) {
    return sizeof(A) == 4 && !(ss < inf_of<A>());
}

/* 1 / max(||x||, 1e-12) of the key row x (n elements) from its sum of squares in A. */
template <typename T, typename A> __device__ __forceinline__ A key_inv_norm(const T *x, int64_t n, A ss) {
    if (float_overflow(ss)) {
        double s = 0.0;
        for (int64_t c = 0; c < n; c++) s += (double)up(x[c]) * (double)up(x[c]);
        return (A)inv_norm(s);
    }
    return inv_norm(ss);
}

/* hs_t . h_j / ||h_j|| of the key row x (n elements) from its sums in A: hd with the row's scaled semantic row ht,
 * hh of squares (the affinity before the row's scale). */
template <typename T, typename C, typename A>
__device__ __forceinline__ C key_affinity(const T *x, int64_t n, const C *ht, A hd, A hh) {
    if (float_overflow(hh)) {
        double d = 0.0, s = 0.0;
        for (int64_t c = 0; c < n; c++) {
            const double v = (double)up(x[c]);
            d += (double)ht[c] * v;
            s += v * v;
        }
        return (C)(d * inv_norm(s));
    }
    return (C)(hd * inv_norm(hh));
}

/* 1 / max(||x||, 1e-12) of the key row x (n elements) by one lane. */
template <typename T> __device__ __forceinline__ typename Elem<T>::C lane_inv_norm(const T *x, int64_t n) {
    KeyAcc<T> ss = 0;
    key_dots<0>(x, n, nullptr, (KeyAcc<T> *)nullptr, ss);
    return (typename Elem<T>::C)key_inv_norm(x, n, ss);
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_KEYROW_CUH */
