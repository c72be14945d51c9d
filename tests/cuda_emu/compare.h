/*
 * compare.h -- element types, device buffers and error measures shared by the CUDA-vs-CPU tests
 * (test_kernels.cpp). Host code: builds against the emulator (ASC_CUDA_EMU) and against the real
 * CUDA runtime (the GPU playbook), so every device buffer goes through cudaMalloc / cudaMemcpy.
 */
#ifndef ASC_EMU_COMPARE_H
#define ASC_EMU_COMPARE_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

/* ---------------------------------------------------------------- element types */

enum DT { DT_F64 = 0, DT_F32, DT_F16, DT_BF16, NDT };
inline const char *dt_name(int dt) {
    static const char *n[NDT] = {"f64", "f32", "f16", "bf16"};
    return n[dt];
}
inline size_t dt_size(int dt) { return dt == DT_F64 ? 8 : (dt == DT_F32 ? 4 : 2); }

/* x rounded to the element type (and back to double, exactly) */
inline double round_to(int dt, double x) {
    switch (dt) {
        case DT_F32: return (double)(float)x;
        case DT_F16: return (double)__half2float(__double2half(x));
        case DT_BF16: return (double)__bfloat162float(__double2bfloat16(x));
        default: return x;
    }
}

inline std::vector<double> rounded(int dt, std::vector<double> x) {
    for (double &v : x) v = round_to(dt, v);
    return x;
}

inline std::vector<unsigned char> pack(int dt, const std::vector<double> &x) {
    std::vector<unsigned char> b(x.size() * dt_size(dt));
    for (size_t e = 0; e < x.size(); e++) {
        unsigned char *o = b.data() + e * dt_size(dt);
        if (dt == DT_F64) {
            memcpy(o, &x[e], 8);
        } else if (dt == DT_F32) {
            const float f = (float)x[e];
            memcpy(o, &f, 4);
        } else if (dt == DT_F16) {
            const __half h = __double2half(x[e]);
            memcpy(o, &h, 2);
        } else {
            const __nv_bfloat16 h = __double2bfloat16(x[e]);
            memcpy(o, &h, 2);
        }
    }
    return b;
}

inline std::vector<double> unpack(int dt, const unsigned char *b, size_t n) {
    std::vector<double> x(n);
    for (size_t e = 0; e < n; e++) {
        const unsigned char *o = b + e * dt_size(dt);
        if (dt == DT_F64) {
            memcpy(&x[e], o, 8);
        } else if (dt == DT_F32) {
            float f;
            memcpy(&f, o, 4);
            x[e] = f;
        } else if (dt == DT_F16) {
            __half h;
            memcpy(&h, o, 2);
            x[e] = __half2float(h);
        } else {
            __nv_bfloat16 h;
            memcpy(&h, o, 2);
            x[e] = __bfloat162float(h);
        }
    }
    return x;
}

/* ---------------------------------------------------------------- device buffers */

/* First CUDA runtime error seen by the harness (reported with the case). */
inline cudaError_t &harness_cuda_error() {
    static cudaError_t e = cudaSuccess;
    return e;
}

inline void ck(cudaError_t e) {
    if (e != cudaSuccess && harness_cuda_error() == cudaSuccess) harness_cuda_error() = e;
}

/* A device allocation (freed on scope exit). Outputs start as 0xff bytes: NaN in every float type,
 * so an element the kernel never writes fails the comparison. */
struct DevBuf {
    void *p = nullptr;
    size_t bytes = 0;
    DevBuf() = default;
    explicit DevBuf(size_t nbytes, int fill = 0xff) : bytes(nbytes) {
        if (bytes) {
            ck(cudaMalloc(&p, bytes));
            if (p) ck(cudaMemset(p, fill, bytes));
        }
    }
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
    DevBuf(DevBuf &&o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; o.bytes = 0; }
    DevBuf &operator=(DevBuf &&o) noexcept {
        std::swap(p, o.p);
        std::swap(bytes, o.bytes);
        return *this;
    }
    ~DevBuf() {
        if (p) cudaFree(p);
    }
};

/* x in element type dt on the device (NULL when x is empty) */
inline DevBuf upload(int dt, const std::vector<double> &x) {
    if (x.empty()) return DevBuf();
    const std::vector<unsigned char> b = pack(dt, x);
    DevBuf d(b.size(), 0);
    if (d.p) ck(cudaMemcpy(d.p, b.data(), b.size(), cudaMemcpyHostToDevice));
    return d;
}

inline DevBuf upload_bytes(const void *src, size_t n) {
    if (!src || !n) return DevBuf();
    DevBuf d(n, 0);
    if (d.p) ck(cudaMemcpy(d.p, src, n, cudaMemcpyHostToDevice));
    return d;
}

inline std::vector<double> download(int dt, const DevBuf &d, size_t n) {
    std::vector<unsigned char> b(n * dt_size(dt), 0xff);
    if (d.p && n) ck(cudaMemcpy(b.data(), d.p, b.size(), cudaMemcpyDeviceToHost));
    return unpack(dt, b.data(), n);
}

/* ---------------------------------------------------------------- error measures */

/* The worst deviation of one comparison and where. */
struct Verdict {
    double err = 0.0;
    std::string where = "-";
    void note(const std::string &field, double e, size_t at, double ref, double got) {
        if (!(e <= err)) { /* NaN is worse than anything */
            err = e;
            char b[200];
            snprintf(b, sizeof(b), "%s[%zu] ref %.10g got %.10g", field.c_str(), at, ref, got);
            where = b;
        }
    }
    void merge(const Verdict &o) {
        if (!(o.err <= err)) *this = o;
    }
};

/* Absolute rounding error of storing a value in the element type beyond its relative unit
 * roundoff: half the spacing of the subnormals (float16: 2^-25; the others: negligible). */
inline double storage_abs_error(int dt) { return dt == DT_F16 ? 0x1p-25 : 0.0; }

/*
 * One compared field: rows x per_row values. Error = max |got - ref| over the compared rows divided
 * by max(max |ref| over them, floor) (norm-wise), or with rowwise each value relative to
 * max(|ref|, floor). Skipped rows are only checked for NaN (an unwritten or broken value). An
 * infinity must be matched exactly. NaN anywhere gives an infinite error.
 */
inline void compare_field(Verdict &v, const std::string &name, const std::vector<double> &ref,
                          const std::vector<double> &got, size_t rows, const std::vector<char> *skip, double floor,
                          bool rowwise, double abs_err = 0.0, bool nan_rows = false) {
    if (ref.size() != got.size() || rows == 0) {
        if (ref.size() != got.size()) v.note(name + " (size)", INFINITY, 0, (double)ref.size(), (double)got.size());
        return;
    }
    const size_t per = ref.size() / rows;
    double maxabs = 0.0, maxerr = 0.0, at_ref = 0.0, at_got = 0.0;
    size_t at = 0;
    for (size_t r = 0; r < rows; r++) {
        if (nan_rows) {
            bool has_nan = false;
            for (size_t e = 0; e < per; e++) has_nan |= std::isnan(ref[r * per + e]);
            if (has_nan) continue;
        }
        for (size_t e = 0; e < per; e++) {
            const size_t i = r * per + e;
            const double x = ref[i], g = got[i];
            const bool skipped = skip && (*skip)[r];
            if (std::isnan(x) || std::isnan(g) || (!skipped && (std::isinf(x) || std::isinf(g)) && x != g)) {
                v.note(name, INFINITY, i, x, g);
                return;
            }
            if (skipped || std::isinf(x)) continue;
            const double dev = std::max(0.0, fabs(g - x) - abs_err);
            const double err = rowwise ? dev / std::max(fabs(x), floor) : dev;
            maxabs = std::max(maxabs, fabs(x));
            if (err > maxerr) {
                maxerr = err;
                at = i;
                at_ref = x;
                at_got = g;
            }
        }
    }
    const double den = rowwise ? 1.0 : std::max(maxabs, floor);
    v.note(name, maxerr / (den > 0.0 ? den : 1.0), at, at_ref, at_got);
}

#endif /* ASC_EMU_COMPARE_H */
