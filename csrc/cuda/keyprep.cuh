/*
 * keyprep.cuh -- the per-call key preparation of the tensor-core kernels (docs/cuda.md, "Per (b, h) key
 * preparation"): what the CPU kernels' asc_keys holds, computed once per call into O(B H N) scratch so
 * that no sweep computes a norm.
 *
 * Per (b, h) and key j: 1 / max(||k_j||, 1e-12) (norm in double), ||z~_j||^2, the semantic row scaled by a
 * power of two hs_j = h_j 2^-e_j (2^e_j at ||h_j||: exact in every element type) with its scale
 * sh_j = 2^e_j / max(||h_j||, 1e-12), so that a_ij = (hs_i . hs_j) sh_i sh_j is h^_i . h^_j from one
 * product that cannot overflow; for float32 / float64 the latents centred on the mean of the finite
 * latent rows (z~ = z - z0, as the CPU kernels; bf16 / fp16 use z itself, an exact mma operand);
 * prefix counts of keys with a non-finite k, v, z or h. Per batch: prefix counts of padding and of
 * global tokens, the next global token, the document runs. The per-key arrays have a row stride
 * Npad (a multiple of the key tile, zeros past N) so that a tile's values are one cp.async.
 */
#ifndef ASCENDER_CUDA_KEYPREP_CUH
#define ASCENDER_CUDA_KEYPREP_CUH

#include "tile.cuh"

namespace asc {
namespace tiled {

template <typename T> struct KeyPrep {
    using C = typename Elem<T>::C;
    bool raw;                           /* decode calls: no per-key arrays, each tile prepares its keys */
    int64_t Npad;                       /* stride of the per-key arrays */
    C *rk, *nz, *sh;                    /* [BH][Npad] */
    T *hs;                              /* [BH][N][da] */
    T *zt;                              /* [BH][N][dz] centred latents (FFMA types), NULL: read z */
    C *z0;                              /* [BH][dz] the centre (FFMA types), NULL: 0 */
    uint8_t *badk;                      /* [BH][N]: the key has a non-finite k, v, z or h */
    int32_t *bad;                       /* [BH][N + 1] prefix counts of badk */
    int32_t *pad, *glob, *gnext, *run;  /* [B][N + 1] (run: [B][N]), or NULL when the call has none */
    double *km, *kmp;                   /* the key sums of the rows' closed-form moments [BH][KM] and per chunk of
                                         * kmg keys [BH][kmnc][KM] its partial sums, or in a causal call (kmpre) the
                                         * sums of the keys before it (keymoments.cuh); NULL: the rows sweep */
    int64_t kmnc, kmg;
    bool kmpre;
    size_t bytes;                       /* of the whole scratch (the key sums are placed after it) */

    /* Lays the arrays out from `base` (NULL: only measures). raw_keys: only the per-batch arrays (the decode
     * kernels prepare each key tile themselves: docs/decode.md, one read of the cache). */
    __host__ void place(const asc_params &p, const asc_fwd_args &a, char *base, int key_tile, bool raw_keys = false) {
        const size_t BH = (size_t)(p.B * p.H), N = (size_t)p.N, B = (size_t)p.B;
        raw = raw_keys;
        Npad = (p.N + key_tile - 1) / key_tile * key_tile + key_tile; /* one spare tile: no read past the end */
        size_t o = 0;
        auto take = [&](size_t n) -> char * {
            const size_t at = o;
            o += (n + 255) / 256 * 256;
            return base ? base + at : nullptr;
        };
        const bool keys = !raw, centre = keys && !Elem<T>::kMma;
        rk = keys ? (C *)take(sizeof(C) * BH * (size_t)Npad) : nullptr;
        nz = keys ? (C *)take(sizeof(C) * BH * (size_t)Npad) : nullptr;
        sh = keys ? (C *)take(sizeof(C) * BH * (size_t)Npad) : nullptr;
        hs = keys ? (T *)take(sizeof(T) * BH * N * (size_t)p.da) : nullptr;
        zt = centre ? (T *)take(sizeof(T) * BH * N * (size_t)p.dz) : nullptr;
        z0 = centre ? (C *)take(sizeof(C) * BH * (size_t)p.dz) : nullptr;
        badk = keys ? (uint8_t *)take(BH * N) : nullptr;
        bad = keys ? (int32_t *)take(sizeof(int32_t) * BH * (N + 1)) : nullptr;
        pad = a.key_padding_mask ? (int32_t *)take(sizeof(int32_t) * B * (N + 1)) : nullptr;
        const bool with_glob = p.n_global > 0 || a.global_mask;
        glob = with_glob ? (int32_t *)take(sizeof(int32_t) * B * (N + 1)) : nullptr;
        gnext = with_glob ? (int32_t *)take(sizeof(int32_t) * B * (N + 1)) : nullptr;
        run = a.document_ids ? (int32_t *)take(sizeof(int32_t) * B * N) : nullptr;
        km = kmp = nullptr;
        kmnc = kmg = 0;
        kmpre = false;
        bytes = o;
    }
    /* The latents and semantic rows as the products use them (raw: as given; the tiles scale h). */
    __host__ __device__ const T *zsrc(const asc_fwd_args &a) const { return zt ? zt : (const T *)a.z; }
    __host__ __device__ const T *hsrc(const asc_fwd_args &a) const { return raw ? (const T *)a.h : hs; }
};

/* The centre z0 of each (b, h) (FFMA types): the mean of the latent rows without a non-finite entry, in
 * double, each thread's rows then a fixed-order tree over the block: the same bits on every run. */
template <typename T>
__global__ void __launch_bounds__(128) centre_kernel(const asc_params p, const T *z, KeyPrep<T> kp) {
    using C = typename Elem<T>::C;
    __shared__ double part[128];
    __shared__ int64_t cnt[128];
    const int64_t bh = blockIdx.x, N = p.N, dz = p.dz;
    const T *zb = z + bh * N * dz;
    uint8_t *fin = kp.badk + bh * N; /* borrowed as the rows' finiteness flags; keys_kernel overwrites it */
    int64_t n = 0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        bool ok = true;
        for (int64_t f = 0; f < dz; f++) ok &= finite((C)up(zb[j * dz + f]));
        fin[j] = ok;
        n += ok;
    }
    cnt[threadIdx.x] = n;
    __syncthreads();
    for (int s = 64; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) cnt[threadIdx.x] += cnt[threadIdx.x + s];
        __syncthreads();
    }
    const int64_t nfin = cnt[0];
    for (int64_t f = 0; f < dz; f++) {
        double acc = 0.0;
        for (int64_t j = threadIdx.x; j < N; j += blockDim.x)
            if (fin[j]) acc += (double)up(zb[j * dz + f]);
        part[threadIdx.x] = acc;
        __syncthreads();
        for (int s = 64; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
            __syncthreads();
        }
        if (threadIdx.x == 0) kp.z0[bh * dz + f] = nfin ? (C)(part[0] / (double)nfin) : (C)0;
        __syncthreads();
    }
}

/* One warp per (b, h, key j < Npad): the per-key values (zeros past N), the scaled semantic row, the centred
 * latent row and the non-finite flag. */
template <typename T>
__global__ void __launch_bounds__(128) keys_kernel(const asc_params p, const asc_fwd_args a, KeyPrep<T> kp) {
    using C = typename Elem<T>::C;
    const int lane = threadIdx.x & 31;
    const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int64_t BH = p.B * p.H, N = p.N, Np = kp.Npad;
    if (w >= BH * Np) return;
    const int64_t bh = w / Np, j = w - bh * Np;
    if (j >= N) {
        if (lane == 0) kp.rk[w] = kp.nz[w] = kp.sh[w] = (C)0;
        return;
    }
    const int64_t d = p.d, dv = p.dv, dz = p.dz, da = p.da, row = bh * N + j;
    const T *k = (const T *)a.k + row * d, *v = (const T *)a.v + row * dv;
    const T *z = (const T *)a.z + row * dz, *h = (const T *)a.h + row * da;
    bool ok = true;
    double ss = 0.0;
    for (int64_t f = lane; f < d; f += 32) {
        const double x = (double)up(k[f]);
        ss += x * x;
        ok &= finite(x);
    }
    ss = warp_sum(ss);
    const double kn = sqrt(ss);
    for (int64_t f = lane; f < dv; f += 32) ok &= finite((double)up(v[f]));
    /* latents: centred (FFMA types) or as given */
    const C *z0 = kp.z0 ? kp.z0 + bh * dz : nullptr;
    double zz = 0.0;
    for (int64_t f = lane; f < dz; f += 32) {
        const C x = (C)up(z[f]);
        ok &= finite(x);
        const C c = z0 ? x - z0[f] : x;
        if (kp.zt) kp.zt[row * dz + f] = to_elem<T>(c);
        zz += (double)c * (double)c;
    }
    zz = warp_sum(zz);
    /* semantic row: the power of two at its norm */
    double hh = 0.0;
    for (int64_t f = lane; f < da; f += 32) {
        const double x = (double)up(h[f]);
        hh += x * x;
        ok &= finite(x);
    }
    hh = warp_sum(hh);
    const double hn = sqrt(hh), rh = 1.0 / (hn > EPS_NORM ? hn : EPS_NORM);
    int e = 0;
    if (hn > 0.0 && finite(hn)) frexp(hn, &e);
    for (int64_t f = lane; f < da; f += 32) kp.hs[row * da + f] = to_elem<T>(ldexp((double)up(h[f]), -e));
    ok = __all_sync(FULL, ok);
    if (lane == 0) {
        const int64_t o = bh * Np + j;
        /* a zero row's scale is 0, not 1e12: every use multiplies it by that row (0 either way), and the
         * backward's fp16 pair weights carry it (1e12 would push the other weights of its tile out of range) */
        kp.rk[o] = kn == 0.0 ? (C)0 : (C)(1.0 / (kn > EPS_NORM ? kn : EPS_NORM));
        kp.nz[o] = (C)zz;
        kp.sh[o] = hn == 0.0 ? (C)0 : (C)ldexp(rh, e);
        kp.badk[row] = !ok;
    }
}

/* Inclusive scans over N values by one block (a whole number of warps, at most 256 threads): out[j] = op over
 * i <= j of val(i), `init` being op's identity on the values. In rounds of blockDim.x consecutive values, a value
 * per thread (coalesced reads and writes): each warp scans its 32 by shuffles, then every thread adds the totals
 * of the warps before its own and the carry of the rounds before. out may be the values read (in place). */
template <typename V, typename F, typename Op>
__device__ void block_scan(int64_t N, V init, F val, Op op, V *out) {
    __shared__ V wtot[8];
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
    V carry = init;
    for (int64_t base = 0; base < N; base += blockDim.x) {
        const int64_t j = base + tid;
        V x = j < N ? val(j) : init;
        for (int o = 1; o < 32; o <<= 1) {
            const V y = __shfl_up_sync(FULL, x, o);
            if (lane >= o) x = op(y, x);
        }
        if (lane == 31) wtot[wid] = x;
        __syncthreads();
        V before = carry;
        for (int k = 0; k < wid; k++) before = op(before, wtot[k]);
        if (j < N) out[j] = op(before, x);
        for (int k = 0; k < nw; k++) carry = op(carry, wtot[k]);
        __syncthreads(); /* wtot is rewritten by the next round */
    }
}

/* Blocks 0 .. BH - 1 (not for raw keys): the prefix counts of non-finite keys of (b, h); the next B blocks:
 * batch b's padding and global prefix counts, next global token, document runs. */
template <typename T>
__global__ void __launch_bounds__(256) prefix_kernel(const asc_params p, const asc_fwd_args a, KeyPrep<T> kp) {
    const int64_t N = p.N, BH = kp.bad ? p.B * p.H : 0, blk = blockIdx.x;
    auto sum = [](int32_t x, int32_t y) { return x + y; };
    if (blk < BH) {
        const uint8_t *bk = kp.badk + blk * N;
        int32_t *out = kp.bad + blk * (N + 1);
        if (threadIdx.x == 0) out[0] = 0;
        block_scan<int32_t>(N, 0, [&](int64_t j) { return (int32_t)bk[j]; }, sum, out + 1);
        return;
    }
    const int64_t b = blk - BH;
    if (kp.pad) {
        const uint8_t *m = a.key_padding_mask + b * N;
        int32_t *out = kp.pad + b * (N + 1);
        if (threadIdx.x == 0) out[0] = 0;
        block_scan<int32_t>(N, 0, [&](int64_t j) { return (int32_t)(m[j] != 0); }, sum, out + 1);
    }
    if (kp.glob) {
        const uint8_t *m = a.global_mask ? a.global_mask + b * N : nullptr;
        const int64_t ng = p.n_global;
        int32_t *out = kp.glob + b * (N + 1), *nx = kp.gnext + b * (N + 1);
        auto is_g = [&](int64_t j) { return (int32_t)(j < ng || (m && m[j])); };
        if (threadIdx.x == 0) out[0] = 0;
        block_scan<int32_t>(N, 0, is_g, sum, out + 1);
        /* the first global token >= j: a scan from the end (index N - 1 - j), minimum of the global ones */
        auto first = [&](int64_t r) { const int64_t j = N - 1 - r; return is_g(j) ? (int32_t)j : (int32_t)N; };
        auto mn = [](int32_t x, int32_t y) { return x < y ? x : y; };
        block_scan<int32_t>(N, (int32_t)N, first, mn, nx); /* nx[r] = first global >= N - 1 - r */
        /* reverse in place into nx[j] = first global >= j, nx[N] = N */
        for (int64_t r = threadIdx.x; r < N / 2; r += blockDim.x) {
            const int32_t x = nx[r];
            nx[r] = nx[N - 1 - r];
            nx[N - 1 - r] = x;
        }
        __syncthreads();
        if (threadIdx.x == 0) nx[N] = (int32_t)N;
    }
    if (kp.run) {
        const int64_t *doc = a.document_ids + b * N;
        auto start = [&](int64_t j) { return (int32_t)(j == 0 || doc[j] != doc[j - 1] ? j : 0); };
        auto mx = [](int32_t x, int32_t y) { return x > y ? x : y; };
        block_scan<int32_t>(N, 0, start, mx, kp.run + b * N);
    }
}

/* The launches of the preparation on the stream (raw keys: only the per-batch arrays). */
template <typename T>
cudaError_t prepare_keys(const asc_params &p, const asc_fwd_args &a, const KeyPrep<T> &kp, cudaStream_t stream) {
    cudaError_t e = cudaSuccess;
    const int64_t BH = p.B * p.H;
    if (kp.raw) {
        if (!kp.pad && !kp.glob && !kp.run) return cudaSuccess;
        return launch(prefix_kernel<T>, dim3((unsigned)p.B), dim3(256), 0, stream, p, a, kp);
    }
    if (kp.z0 && (e = launch(centre_kernel<T>, dim3((unsigned)BH), dim3(128), 0, stream, p, (const T *)a.z, kp)) !=
                     cudaSuccess)
        return e;
    const int64_t warps = BH * kp.Npad, blocks = (warps + 3) / 4;
    if (blocks > 2147483647LL) return cudaErrorInvalidConfiguration;
    if ((e = launch(keys_kernel<T>, dim3((unsigned)blocks), dim3(128), 0, stream, p, a, kp)) != cudaSuccess) return e;
    return launch(prefix_kernel<T>, dim3((unsigned)(BH + p.B)), dim3(256), 0, stream, p, a, kp);
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_KEYPREP_CUH */
