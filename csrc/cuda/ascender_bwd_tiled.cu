/*
 * ascender_bwd_tiled.cu -- the entry points of the tiled tensor-core backward (tiled.h): which calls it takes,
 * and the dispatch by dtype to its instantiations (bwd_tiled.cuh; ascender_bwd_tiled_f32.cu, _f16.cu,
 * _bf16.cu); and its dtype-independent kernels (the paper variant's inverted neighbour lists).
 * ascender_cuda_bwd (ascender_bwd.cu) sends it the calls asc_tiled_bwd_takes accepts. Plain CUDA C++, no torch.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "bwd_tiled.cuh"

namespace asc {
namespace tiled {

/* The paper variant's inverted neighbour lists (declared in bwd_tiled.cuh). */

/* count[bh][l + 1] += 1 per (row, listed neighbour l) */
__global__ void __launch_bounds__(256) nbr_count_kernel(const asc_params p, const int64_t *nbr, int32_t *cnt) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per = p.Nq * p.n_nbr;
    if (e >= p.B * p.H * per) return;
    const int64_t bh = e / per, l = nbr[e];
    if (l >= 0) atomicAdd(cnt + bh * (p.N + 1) + l + 1, 1);
}

/* the counts' prefix sums per (b, h): cnt[bh][l] = the start of key l's rows */
__global__ void __launch_bounds__(256) nbr_scan_kernel(const asc_params p, int32_t *cnt, int32_t *cursor) {
    int32_t *c = cnt + (int64_t)blockIdx.x * (p.N + 1);
    auto sum = [](int32_t x, int32_t y) { return x + y; };
    block_scan<int32_t>(p.N + 1, 0, [&](int64_t j) { return c[j]; }, sum, c);
    for (int64_t j = threadIdx.x; j <= p.N; j += blockDim.x) cursor[(int64_t)blockIdx.x * (p.N + 1) + j] = c[j];
}

/* list[bh][start(l) ..] = the rows that list l (in any order) */
__global__ void __launch_bounds__(256) nbr_fill_kernel(const asc_params p, const int64_t *nbr, int32_t *cursor,
                                                       int32_t *list) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per = p.Nq * p.n_nbr;
    if (e >= p.B * p.H * per) return;
    const int64_t bh = e / per, l = nbr[e];
    if (l < 0) return;
    const int32_t at = atomicAdd(cursor + bh * (p.N + 1) + l, 1);
    list[bh * per + at] = (int32_t)((e - bh * per) / p.n_nbr);
}

/* each key's rows sorted by row index: the gather then sums in a fixed order */
__global__ void __launch_bounds__(256) nbr_sort_kernel(const asc_params p, const int32_t *cnt, int32_t *list) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= p.B * p.H * p.N) return;
    const int64_t bh = e / p.N, l = e - bh * p.N;
    int32_t *x = list + bh * p.Nq * p.n_nbr;
    const int32_t lo = cnt[bh * (p.N + 1) + l], hi = cnt[bh * (p.N + 1) + l + 1];
    for (int32_t a = lo + 1; a < hi; a++) {
        const int32_t v = x[a];
        int32_t b = a;
        while (b > lo && x[b - 1] > v) {
            x[b] = x[b - 1];
            b--;
        }
        x[b] = v;
    }
}

}  // namespace tiled
}  // namespace asc

extern "C" int asc_tiled_bwd_takes(const asc_params *p, const asc_bwd_args *a, int dtype) {
    /* not yet in the tiled backward (the row-per-warp one takes them): query rows that are not the last ones
     * (query_offset: keys after the queries); and a call whose tiles do not fit the device's shared memory */
    if (!asc_tiled_fwd_takes(p, &a->in, dtype) || p->keys_after != 0) return 0;
    switch (dtype) {
        case ASC_CUDA_F32: return asc::tiled::bwd_smem_fits<float>(*p);
        case ASC_CUDA_F16: return asc::tiled::bwd_smem_fits<__half>(*p);
        default: return asc::tiled::bwd_smem_fits<__nv_bfloat16>(*p);
    }
}

extern "C" int asc_tiled_bwd(const asc_params *p, const asc_bwd_args *a, int dtype, cudaStream_t stream) {
    switch (dtype) {
        case ASC_CUDA_F32: return (int)asc::tiled::backward<float>(*p, *a, dtype, stream);
        case ASC_CUDA_F16: return (int)asc::tiled::backward<__half>(*p, *a, dtype, stream);
        case ASC_CUDA_BF16: return (int)asc::tiled::backward<__nv_bfloat16>(*p, *a, dtype, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
