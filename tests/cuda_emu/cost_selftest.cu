/*
 * cost_selftest.cu -- the cost counters of the emulator (emu_cost.h; docs/cuda.md, "The cost model") on
 * small kernels whose costs are known by hand: coalesced and strided global loads and stores, shared
 * memory without and with bank conflicts (4- and 16-byte accesses, broadcast), ldmatrix on padded and
 * unpadded rows, cp.async, mma, ex2 and declared scalar work, barriers, atomics, a static __shared__
 * array, and the basic-block counts of a loop that one lane of each warp runs longer than the others and of lanes
 * taking turns between __syncwarp's. Built only in the cost build (tests/cuda_emu/Makefile, build/cost), run by
 * `make -C tests/cuda_emu check-cost` (part of `check`). Exit status 1 on any failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda/common.cuh"
#include "cuda/kernel_traits.cuh"
#include "cuda/mma.cuh"
#include "emu_api.h"

namespace {

int g_failed = 0, g_passed = 0;

/* The counters of the one launch of `k` with these arguments (one block of `threads` threads). */
template <typename... P, typename... A>
asc_emu_counters counted(void (*k)(P...), unsigned threads, size_t smem, A... args) {
    asc_emu_cost_clear();
    asc_emu_cost_enable(1);
    const cudaError_t e = asc::launch(k, dim3(1), dim3(threads), smem, nullptr, args...);
    asc_emu_cost_enable(0);
    if (e != cudaSuccess || asc_emu_cost_count() != 1) {
        printf("  launch failed (%s) or %d records\n", cudaGetErrorString(e), asc_emu_cost_count());
        return asc_emu_counters{};
    }
    return asc_emu_cost_record(0)->c;
}

void check(bool ok, const char *what, const asc_emu_counters &c) {
    printf("[cost selftest] %-76s %s\n", what, ok ? "ok" : "FAIL");
    if (!ok)
        printf("  gld %llu req %llu sec %llu B | gst %llu req %llu sec %llu B | lds %llu req %llu wav %llu ideal | "
               "sts %llu req %llu wav %llu ideal | mma %llu flops %llu ldm %llu | fp32 %llu mufu %llu | bar %llu\n",
               c.gld_requests, c.gld_sectors, c.gld_bytes, c.gst_requests, c.gst_sectors, c.gst_bytes, c.lds_requests,
               c.lds_wavefronts, c.lds_ideal, c.sts_requests, c.sts_wavefronts, c.sts_ideal, c.mma_bf16, c.mma_flops,
               c.ldmatrix, c.fp32_flops, c.mufu_ops, c.barriers);
    (ok ? g_passed : g_failed)++;
}

/* The largest warp-execution count of any basic block of the one launch of `k` (two warps), and the
 * number of blocks. */
template <typename... P, typename... A>
unsigned long long busiest_block(int *nbbs, void (*k)(P...), A... args) {
    asc_emu_cost_clear();
    asc_emu_cost_enable(1);
    const cudaError_t e = asc::launch(k, dim3(1), dim3(64), 0, nullptr, args...);
    asc_emu_cost_enable(0);
    unsigned long long most = 0;
    *nbbs = 0;
    if (e == cudaSuccess && asc_emu_cost_count() == 1) {
        const asc_emu_launch_cost *r = asc_emu_cost_record(0);
        *nbbs = r->nbbs;
        for (int i = 0; i < r->nbbs; i++) most = std::max(most, r->bbs[i].warp_execs);
    }
    return most;
}

/* ---------------------------------------------------------------- kernels */

/* lane 5 of each warp runs the loop n times, the others once: each warp executes its body n times */
__global__ void k_loop(int n, float *out) {
    const int l = threadIdx.x % 32;
    const int trips = l == 5 ? n : 1;
    float acc = 0.f;
    ASC_NOUNROLL
    for (int i = 0; i < trips; i++) acc = acc * 0.5f + out[i % 32];
    out[32 + threadIdx.x] = acc;
}

/* the lanes of a quad take turns (lane t in turn t, __syncwarp between), each running the loop n times: each warp
 * executes its body 4 n times, the turns one after another, though no lane runs it more than n times */
__global__ void k_turns(int n, float *out) {
    const int l = threadIdx.x % 32;
    float acc = 0.f;
    for (int tt = 0; tt < 4; tt++) {
        if (l % 4 == tt) {
            ASC_NOUNROLL
            for (int i = 0; i < n; i++) acc = acc * 0.5f + out[i % 32];
        }
        __syncwarp();
    }
    out[32 + threadIdx.x] = acc;
}


/* one warp: y[l * STRIDE] = x[l * STRIDE] (floats) */
template <int STRIDE> __global__ void k_copy(const float *x, float *y) {
    const int l = threadIdx.x;
    y[l * STRIDE] = x[l * STRIDE];
}

/* one warp: float reads of shared memory at word l * STRIDE (0: every lane the same word) */
template <int STRIDE> __global__ void k_shared(float *out) {
    ASC_DYNAMIC_SMEM(smem);
    float *s = reinterpret_cast<float *>(smem);
    const int l = threadIdx.x;
    s[l] = (float)l; /* one conflict-free store request */
    __syncwarp();
    out[0] = s[l * STRIDE]; /* out[0]: one global store sector */
}

/* one warp: 16-byte shared reads, lane l at 16 * (l * STRIDE) bytes (a float4: g++ may split it into four
 * loads, which the counters join again) */
template <int STRIDE> __global__ void k_shared16(float *out) {
    ASC_DYNAMIC_SMEM(smem);
    const int l = threadIdx.x;
    const float4 v = reinterpret_cast<const float4 *>(smem)[l * STRIDE];
    out[l] = v.x + v.y + v.z + v.w;
}

/* one warp: ldmatrix x4 of rows PITCH bytes apart */
template <int PITCH> __global__ void k_ldmatrix(uint32_t *out) {
    ASC_DYNAMIC_SMEM(smem);
    uint32_t r[4];
    asc::ldmatrix_x4(r, smem + threadIdx.x * PITCH);
    if (threadIdx.x == 0) out[0] = r[0];
}

/* block b of the grid completes b + 1 barriers */
__global__ void k_uneven() {
    for (unsigned i = 0; i <= blockIdx.x; i++) __syncthreads();
}

/* 64 threads: a 1 KiB cp.async tile, 3 mma, 5 ex2 and 7 declared FLOPs per thread, 2 barriers */
__global__ void k_mixed(const uint4 *src, float *out) {
    ASC_DYNAMIC_SMEM(smem);
    const int l = threadIdx.x;
    asc::cp_async_16(smem + 16 * l, src + l);
    asc::cp_async_commit();
    asc::cp_async_wait<0>();
    __syncthreads();
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float d[4] = {0, 0, 0, 0};
    for (int i = 0; i < 3; i++) asc::mma_m16n8k16_bf16(d, a, b, d);
    float e = 0;
    for (int i = 0; i < 5; i++) e += asc::ex2(d[0] - (float)i);
    asc::cost_scalar(7);
    __syncthreads();
    if (l == 0) out[0] = e;
}

/* 64 threads: mma from two call sites (n1 and n2 per warp: trip counts the compiler cannot peel), one ldmatrix
 * x4 per warp */
__global__ void k_sites(int n1, int n2, float *out) {
    ASC_DYNAMIC_SMEM(smem);
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0}, r[4];
    float d[4] = {0, 0, 0, 0};
    ASC_NOUNROLL
    for (int i = 0; i < n1; i++) asc::mma_m16n8k16_bf16(d, a, b, d);
    ASC_NOUNROLL
    for (int i = 0; i < n2; i++) asc::mma_m16n8k16_bf16(d, a, b, d);
    asc::ldmatrix_x4(r, smem + (threadIdx.x % 32) * 16);
    if (threadIdx.x == 0) out[0] = d[0] + (float)r[0];
}

/* one warp: atomicAdd of every lane to one global float, then to shared word l % 2 */
__global__ void k_atomic(float *out) {
    ASC_DYNAMIC_SMEM(smem);
    float *s = reinterpret_cast<float *>(smem);
    atomicAdd(out, 1.0f);
    atomicAdd(s + (threadIdx.x % 2), 1.0f);
}

/* one warp: a static __shared__ array, read with a 2-way conflict */
__global__ void k_static(float *out) {
    __shared__ float st[64];
    const int l = threadIdx.x;
    st[2 * l] = 1.0f;
    __syncwarp();
    out[0] = st[(2 * l) % 64];
}

}  // namespace

int main() {
    if (!asc_emu_cost_enable(0)) {
        printf("cost selftest: this build does not count\n");
        return 1;
    }
    float *x = nullptr, *y = nullptr;
    cudaMalloc((void **)&x, 32 * 32 * sizeof(float));
    cudaMalloc((void **)&y, 32 * 32 * sizeof(float));
    asc_emu_counters c;

    c = counted(k_copy<1>, 32, 0, (const float *)x, y);
    check(c.gld_requests == 1 && c.gld_sectors == 4 && c.gld_bytes == 128 && c.gst_requests == 1 && c.gst_sectors == 4 &&
              c.gld_sectors_distinct == 4,
          "coalesced float copy by a warp: 1 request of 4 sectors each way", c);
    c = counted(k_copy<32>, 32, 0, (const float *)x, y);
    check(c.gld_requests == 1 && c.gld_sectors == 32 && c.gld_bytes == 128 && c.gst_sectors == 32,
          "strided float copy (128 B apart): 32 sectors for 128 bytes", c);

    c = counted(k_shared<1>, 32, 1024, y);
    check(c.lds_requests == 1 && c.lds_wavefronts == 1 && c.lds_ideal == 1 && c.sts_requests == 1 && c.sts_wavefronts == 1 &&
              c.gst_requests == 1 && c.gst_sectors == 1,
          "shared float reads, consecutive words: 1 wavefront", c);
    c = counted(k_shared<2>, 32, 1024, y);
    check(c.lds_requests == 1 && c.lds_wavefronts == 2 && c.lds_ideal == 1, "shared float reads, stride 2 words: 2-way conflict", c);
    c = counted(k_shared<32>, 32, 4096, y);
    check(c.lds_wavefronts == 32 && c.lds_ideal == 1, "shared float reads, stride 32 words: 32-way conflict", c);
    c = counted(k_shared<0>, 32, 1024, y);
    check(c.lds_wavefronts == 1 && c.lds_ideal == 1, "shared float reads of one word: broadcast, 1 wavefront", c);
    c = counted(k_shared16<1>, 32, 1024, y);
    check(c.lds_requests == 1 && c.lds_wavefronts == 4 && c.lds_ideal == 4, "16-byte shared reads, consecutive: 4 wavefronts (ideal)", c);
    c = counted(k_shared16<2>, 32, 2048, y);
    check(c.lds_wavefronts == 8 && c.lds_ideal == 4, "16-byte shared reads, 32 B apart: 8 wavefronts for 4", c);

    c = counted(k_ldmatrix<16>, 32, 512, (uint32_t *)y);
    check(c.ldmatrix == 1 && c.lds_requests == 1 && c.lds_wavefronts == 4 && c.lds_ideal == 4,
          "ldmatrix x4, rows 16 B apart: 4 wavefronts", c);
    c = counted(k_ldmatrix<144>, 32, 32 * 144, (uint32_t *)y);
    check(c.ldmatrix == 1 && c.lds_wavefronts == 4, "ldmatrix x4, rows 144 B apart (padded 128 B): 4 wavefronts", c);
    c = counted(k_ldmatrix<128>, 32, 32 * 128, (uint32_t *)y);
    check(c.ldmatrix == 1 && c.lds_wavefronts == 32 && c.lds_ideal == 4,
          "ldmatrix x4, rows 128 B apart (unpadded): 8-way conflicts, 32 wavefronts", c);

    uint4 *src = nullptr;
    cudaMalloc((void **)&src, 64 * sizeof(uint4));
    c = counted(k_mixed, 64, 1024, (const uint4 *)src, y);
    check(c.gld_requests == 2 && c.gld_sectors == 32 && c.gld_bytes == 1024 && c.sts_requests == 2 && c.sts_wavefronts == 8 &&
              c.mma_bf16 == 6 && c.mma_flops == 6ull * 4096 && c.mufu_ops == 64 * 5 && c.fp32_flops == 64 * 7 &&
              c.barriers == 2 && c.max_block_barriers == 2 && c.blocks == 1 && c.threads == 64,
          "cp.async 1 KiB, 3 mma per warp, 5 ex2 + 7 FLOPs per thread, 2 barriers", c);

    c = counted(k_atomic, 32, 64, y);
    check(c.gst_requests == 1 && c.gst_sectors == 1 && c.sts_requests == 1 && c.sts_wavefronts == 1,
          "atomics, counted as stores: one global sector; shared words 0 and 1: 1 wavefront", c);
    c = counted(k_static, 32, 0, y);
    check(c.sts_requests == 1 && c.sts_wavefronts == 2 && c.lds_requests == 1 && c.lds_wavefronts == 2,
          "static __shared__ array, stride 2 words: counted as shared, 2-way conflict", c);

    { /* the warp mma and ldmatrix instructions per call site (tools/sass_icount.py's anchor) */
        asc_emu_cost_clear();
        asc_emu_cost_enable(1);
        const cudaError_t e = asc::launch(k_sites, dim3(1), dim3(64), 512, nullptr, 3, 2, y);
        asc_emu_cost_enable(0);
        const asc_emu_launch_cost *r = e == cudaSuccess && asc_emu_cost_count() == 1 ? asc_emu_cost_record(0) : nullptr;
        unsigned long long mma[2] = {0, 0}, ldm = 0;
        int nmma = 0, nldm = 0;
        for (int i = 0; r && i < r->nproducts; i++) {
            const asc_emu_product_count &s = r->products[i];
            if (s.ldmatrix) ldm += s.warp_execs, nldm++;
            else if (nmma < 2) mma[nmma++] = s.warp_execs;
            else nmma++;
        }
        /* sorted by site: the first loop's call comes first in the code, but a compiler may place it later */
        const bool ok = r && r->nproducts == 3 && nmma == 2 && nldm == 1 && ldm == 2 &&
                        ((mma[0] == 6 && mma[1] == 4) || (mma[0] == 4 && mma[1] == 6)) && r->c.mma_bf16 == 10;
        printf("[cost selftest] %-76s %s\n", "products per call site: mma 6 and 4 warp executions, ldmatrix 2",
               ok ? "ok" : "FAIL");
        if (!ok)
            printf("  %d sites: mma %llu, %llu (%d sites), ldmatrix %llu (%d sites)\n", r ? r->nproducts : -1, mma[0],
                   mma[1], nmma, ldm, nldm);
        (ok ? g_passed : g_failed)++;
    }

    { /* the longest block (cuda_cost's "longest block"): a maximum over the blocks, not a sum */
        asc_emu_cost_clear();
        asc_emu_cost_enable(1);
        const cudaError_t e = asc::launch(k_uneven, dim3(4), dim3(64), 0, nullptr);
        asc_emu_cost_enable(0);
        const asc_emu_counters u = e == cudaSuccess && asc_emu_cost_count() == 1 ? asc_emu_cost_record(0)->c
                                                                                 : asc_emu_counters{};
        check(u.barriers == 10 && u.max_block_barriers == 4 && u.blocks == 4,
              "four blocks of 1, 2, 3 and 4 barriers: 10 barriers, the longest block 4", u);
    }

    int nb37 = 0, nb38 = 0;
    const unsigned long long b37 = busiest_block(&nb37, k_loop, 37, y), b38 = busiest_block(&nb38, k_loop, 38, y);
    printf("[cost selftest] %-76s %s\n", "basic blocks: a loop that lane 5 runs n times, the others once: n per warp",
           b37 == 2 * 37 && b38 == 2 * 38 && nb37 > 1 && nb37 == nb38 ? "ok" : "FAIL");
    if (!(b37 == 2 * 37 && b38 == 2 * 38 && nb37 > 1 && nb37 == nb38)) {
        printf("  busiest basic block %llu and %llu warp executions (want 74, 76), %d and %d blocks\n", b37, b38, nb37, nb38);
        g_failed++;
    } else {
        g_passed++;
    }

    int nt = 0;
    const unsigned long long bt = busiest_block(&nt, k_turns, 37, y);
    printf("[cost selftest] %-76s %s\n", "basic blocks: a quad's lanes in turns between __syncwarp, n each: 4 n per warp",
           bt == 2 * 4 * 37 ? "ok" : "FAIL");
    if (bt != 2 * 4 * 37) {
        printf("  busiest basic block %llu warp executions (want 296)\n", bt);
        g_failed++;
    } else {
        g_passed++;
    }

    cudaFree(x);
    cudaFree(y);
    cudaFree(src);
    printf("cost selftest: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
