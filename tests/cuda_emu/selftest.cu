/*
 * selftest.cu -- checks of the CUDA emulator itself (cuda_emu.h, cuda_emu.cpp): the semantics of
 * the built-in variables, barriers, warp collectives, shared memory and atomics on small kernels
 * with known results, and that the faults it promises to catch are caught:
 *   selftest            the semantic checks and the detected faults (deadlock, divergent barriers,
 *                       mismatched collectives, a lane outside its mask, missing __syncwarp under
 *                       the forward and reverse lane orders, dynamic shared memory limits)
 *   selftest race       kernels with a missing __syncwarp and a missing __syncthreads: ThreadSanitizer
 *                       must report both
 *   selftest overrun    a kernel writing one element past its dynamic shared memory: AddressSanitizer
 *                       must report it
 * Compiled by the host compiler against the emulator, like the kernels of csrc/cuda (tests/cuda_emu/Makefile).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#define ASC_DYNAMIC_SMEM(name) unsigned char *const name = ::asc_emu::view()->dynamic_smem

static int g_failed = 0, g_passed = 0;

static void check(bool ok, const char *what) {
    printf("[emu selftest] %-66s %s\n", what, ok ? "ok" : "FAIL");
    if (ok) g_passed++;
    else g_failed++;
}

template <typename... P>
static cudaError_t launch(void (*k)(P...), dim3 grid, dim3 block, size_t smem, P... args) {
    return asc_emu::launch<P...>(k, grid, block, smem, nullptr, args...);
}

/* ---------------------------------------------------------------- kernels with known results */

/* out[b * nthreads + t] = linear thread index, block index and dims encoded */
__global__ void k_indices(int *out) {
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int nt = blockDim.x * blockDim.y * blockDim.z;
    out[b * nt + t] = b * 10000 + t;
}

/* warp collectives: sum by xor-shuffles, broadcast, up/down with width 8, ballot, any/all, ffs */
__global__ void k_warp(long long *out) {
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    long long v = lane + 1;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const double bc = __shfl_sync(0xffffffffu, (double)(lane * 3), 7);
    const int up = __shfl_up_sync(0xffffffffu, lane, 1, 8);
    const int down = __shfl_down_sync(0xffffffffu, lane, 2, 8);
    const unsigned ballot = __ballot_sync(0xffffffffu, lane % 3 == 0);
    const int any = __any_sync(0xffffffffu, lane == 5), all = __all_sync(0xffffffffu, lane < 31);
    const int first = __ffs((int)(ballot & ~1u));
    long long *o = out + (w * 32 + lane) * 8;
    o[0] = v;
    o[1] = (long long)bc;
    o[2] = up;
    o[3] = down;
    o[4] = ballot;
    o[5] = any;
    o[6] = all;
    o[7] = first;
}

/* block reduction through static and dynamic shared memory and atomics */
__global__ void k_reduce(const float *x, int n, float *sum, double *dsum, unsigned *count) {
    __shared__ float part[32];
    ASC_DYNAMIC_SMEM(dyn);
    double *acc = reinterpret_cast<double *>(dyn);
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    if (threadIdx.x == 0) acc[0] = 0.0;
    __syncthreads();
    float v = 0.f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) part[w] = v;
    atomicAdd(acc, (double)v);
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (int k = 0; k < (int)blockDim.x / 32; k++) s += part[k];
        atomicAdd(sum, s);
        atomicAdd(dsum, acc[0] / 32.0);
        atomicAdd(count, 1u);
    }
}

/* ---------------------------------------------------------------- kernels with faults */

__global__ void k_return_before_barrier(int *out) {
    if (threadIdx.x >= 64) return; /* a CUDA bug: the other threads wait forever */
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_divergent_barriers(int *out) {
    if (threadIdx.x < 32) __syncthreads();
    else __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_mismatched(int *out) {
    const int lane = threadIdx.x % 32;
    int v = lane;
    if (lane < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
    else v = (int)__ballot_sync(0xffffffffu, v);
    out[threadIdx.x] = v;
}

__global__ void k_outside_mask(int *out) {
    const int lane = threadIdx.x % 32;
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, lane, 0);
}

__global__ void k_warp_then_block(int *out) {
    const int lane = threadIdx.x % 32;
    int v = lane;
    if (lane == 3) __syncthreads(); /* lane 3 never joins the shuffle the others wait at */
    else v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

/* Lane 0 publishes a value through shared memory; without the __syncwarp the other lanes may read
 * it before it is written (the emulator runs lanes in the order of the setting). */
template <bool SYNC>
__global__ void k_publish(int *out) {
    __shared__ int box[1];
    const int lane = threadIdx.x % 32;
    if (lane == 0) box[0] = 0;
    __syncwarp();
    int dummy = __shfl_sync(0xffffffffu, lane, 0); /* a shuffle orders no memory */
    if (lane == 0) box[0] = 42 + dummy;
    if (SYNC) __syncwarp();
    out[lane] = box[0];
    __syncwarp();
}

/* Warp 0 fills dynamic shared memory, warp 1 reads it: without the __syncthreads, a race between
 * warps (the warps' shuffles in between do not order memory across warps). */
template <bool SYNC>
__global__ void k_handoff(float *out) {
    ASC_DYNAMIC_SMEM(dyn);
    float *f = reinterpret_cast<float *>(dyn);
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    if (w == 0) f[lane] = (float)lane;
    const float s = __shfl_xor_sync(0xffffffffu, (float)lane, 1);
    if (SYNC) __syncthreads();
    if (w == 1) out[lane] = f[lane] + s * 0.0f;
}

__global__ void k_overrun(float *out, int n) {
    ASC_DYNAMIC_SMEM(dyn);
    float *f = reinterpret_cast<float *>(dyn);
    if (threadIdx.x == 0) f[n] = 1.0f; /* one past the n floats of the launch */
    __syncthreads();
    out[threadIdx.x] = f[0];
}

/* ---------------------------------------------------------------- driver */

static bool fault_says(const char *needle) {
    const char *f = asc_emu_last_fault();
    const bool ok = strstr(f, needle) != nullptr;
    if (!ok) printf("  fault was: %s\n", f);
    asc_emu_reset();
    return ok;
}

/* `selftest race`: two racy kernels, each must give a ThreadSanitizer report (the Makefile counts). */
static int run_race(void) {
    int *out = (int *)calloc(32, sizeof(int));
    cudaError_t e = launch(k_publish<false>, dim3(1), dim3(32), 0, out);
    printf("race kernel 1 (missing __syncwarp) ran: %s\n", cudaGetErrorString(e));
    float *fo = (float *)calloc(32, sizeof(float));
    e = launch(k_handoff<false>, dim3(1), dim3(64), 32 * sizeof(float), fo);
    printf("race kernel 2 (missing __syncthreads) ran: %s\n", cudaGetErrorString(e));
    free(out);
    free(fo);
    return 0;
}

static int run_overrun(void) {
    float *out = (float *)calloc(32, sizeof(float));
    const cudaError_t e = launch(k_overrun, dim3(1), dim3(32), 16 * sizeof(float), out, 16);
    printf("overrun kernel ran: %s\n", cudaGetErrorString(e));
    free(out);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "race")) return run_race();
    if (argc > 1 && !strcmp(argv[1], "overrun")) return run_overrun();

    { /* built-in variables over a 3-D grid and block */
        const dim3 g(3, 2, 2), b(4, 3, 2);
        std::vector<int> out(12 * 24, -1);
        const cudaError_t e = launch(k_indices, g, b, 0, out.data());
        bool ok = e == cudaSuccess;
        for (int blk = 0; blk < 12; blk++)
            for (int t = 0; t < 24; t++) ok &= out[(size_t)(blk * 24 + t)] == blk * 10000 + t;
        check(ok, "threadIdx / blockIdx / blockDim / gridDim over a 3-D launch");
    }
    { /* warp collectives */
        std::vector<long long> out(64 * 8, -1);
        const cudaError_t e = launch(k_warp, dim3(1), dim3(64), 0, out.data()); /* one block: k_warp indexes by thread only */
        bool ok = e == cudaSuccess;
        unsigned ballot = 0;
        for (int l = 0; l < 32; l++)
            if (l % 3 == 0) ballot |= 1u << l;
        for (int t = 0; t < 64; t++) {
            const long long *o = &out[(size_t)t * 8];
            const int lane = t % 32, seg = lane & ~7;
            const int up = lane - 1 >= seg ? lane - 1 : lane, down = lane + 2 < seg + 8 ? lane + 2 : lane;
            ok &= o[0] == 528 && o[1] == 21 && o[2] == up && o[3] == down && o[4] == (long long)ballot && o[5] == 1 &&
                  o[6] == 0 && o[7] == 4;
        }
        check(ok, "__shfl_xor/_sync/_up/_down (width 8), __ballot/any/all_sync, __ffs");
    }
    { /* shared memory, barriers and atomics, 2 workers x several blocks */
        const int n = 10000;
        std::vector<float> x((size_t)n);
        double want = 0.0;
        for (int i = 0; i < n; i++) {
            x[(size_t)i] = (float)(i % 7) - 3.0f;
            want += x[(size_t)i];
        }
        float sum = 0.f;
        double dsum = 0.0;
        unsigned count = 0;
        const cudaError_t e = launch(k_reduce, dim3(7), dim3(128), sizeof(double), (const float *)x.data(), n, &sum,
                                     &dsum, &count);
        check(e == cudaSuccess && sum == (float)want && dsum == want && count == 7,
              "static + dynamic shared memory, __syncthreads, shared and global atomicAdd");
    }
    { /* dynamic shared memory limits: 48 KiB without the attribute, the opt-in maximum with it */
        int out[64] = {0};
        cudaError_t e1 = launch(k_indices, dim3(1), dim3(32), 60000, out);
        const cudaError_t last = cudaGetLastError();
        cudaError_t e2 = cudaFuncSetAttribute(k_indices, cudaFuncAttributeMaxDynamicSharedMemorySize, 60000);
        cudaError_t e3 = launch(k_indices, dim3(1), dim3(32), 60000, out);
        int optin = 0;
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
        cudaError_t e4 = cudaFuncSetAttribute(k_indices, cudaFuncAttributeMaxDynamicSharedMemorySize, optin + 1);
        cudaGetLastError();
        cudaError_t e5 = launch(k_indices, dim3(1), dim3(2048), 0, out);
        cudaGetLastError();
        check(e1 == cudaErrorInvalidValue && last == cudaErrorInvalidValue && e2 == cudaSuccess && e3 == cudaSuccess &&
                  e4 == cudaErrorInvalidValue && e5 == cudaErrorInvalidConfiguration,
              "launch limits: 48 KiB, cudaFuncSetAttribute, opt-in maximum, block size");
    }
    { /* the occupancy calculator (device_wave in common.cuh): 32 blocks, 64 warps or the SM's shared memory */
        const void *k = reinterpret_cast<const void *>(k_indices);
        int optin = 0, sms = 0, warp = 0, big = 0, smem = 0, bad = 0, over = 1;
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
        const cudaError_t e1 = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&warp, k, 32, 0);
        const cudaError_t e2 = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&big, k, 1024, 0);
        const cudaError_t e3 = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&smem, k, 32, 20000);
        const cudaError_t e4 = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bad, k, 2048, 0);
        cudaGetLastError();
        /* more dynamic memory than k_indices may launch with (48 KiB, or its opt-in above): none, as on a GPU */
        cudaFuncSetAttribute(k_indices, cudaFuncAttributeMaxDynamicSharedMemorySize, 48 * 1024);
        const cudaError_t e5 = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&over, k, 32, 48 * 1024 + 16);
        cudaGetLastError();
        /* the SM's memory over each block's dynamic bytes, 1 KiB taken as the kernel's static and 1 KiB reserved */
        check(e1 == cudaSuccess && warp == 32 && e2 == cudaSuccess && big == 2 && e3 == cudaSuccess &&
                  smem == (optin + 1024) / (20000 + 2048) && e4 == cudaErrorInvalidValue && e5 == cudaSuccess &&
                  over == 0 && sms == asc_emu_get_settings().sms,
              "cudaOccupancyMaxActiveBlocksPerMultiprocessor and the SM count");
    }

    /* faults: each must fail the launch with a message, not hang */
    int out[128];
    check(launch(k_return_before_barrier, dim3(1), dim3(128), 0, out) == cudaErrorLaunchFailure &&
              cudaGetLastError() == cudaErrorLaunchFailure && fault_says("can never complete") &&
              cudaGetLastError() == cudaSuccess,
          "return before __syncthreads: fault (sticky until reset)");
    check(launch(k_divergent_barriers, dim3(1), dim3(64), 0, out) == cudaErrorLaunchFailure &&
              fault_says("divergent block barriers"),
          "__syncthreads at two different sites: fault");
    check(launch(k_mismatched, dim3(1), dim3(32), 0, out) == cudaErrorLaunchFailure &&
              fault_says("mismatched warp collectives"),
          "lanes at different warp collectives: fault");
    check(launch(k_outside_mask, dim3(1), dim3(32), 0, out) == cudaErrorLaunchFailure &&
              fault_says("does not include the caller"),
          "a lane calling a collective outside its mask: fault");
    check(launch(k_warp_then_block, dim3(1), dim3(64), 0, out) == cudaErrorLaunchFailure && fault_says("__syncthreads"),
          "a lane at __syncthreads while its warp waits at a shuffle: fault");

    /* a missing __syncwarp gives wrong results in at least one lane order (and a TSan race: under
     * TSan only `selftest race` runs that kernel) */
#ifdef __SANITIZE_THREAD__
    for (int sync = 1; sync < 2; sync++) {
#else
    for (int sync = 0; sync < 2; sync++) {
#endif
        bool wrong_somewhere = false;
        for (int order : {ASC_EMU_FORWARD, ASC_EMU_REVERSE, ASC_EMU_SHUFFLE}) {
            asc_emu_set_order(order, 7);
            int o[32];
            const cudaError_t e = sync ? launch(k_publish<true>, dim3(1), dim3(32), 0, o)
                                       : launch(k_publish<false>, dim3(1), dim3(32), 0, o);
            for (int l = 0; l < 32; l++) wrong_somewhere |= e != cudaSuccess || o[l] != 42;
        }
        check(sync ? !wrong_somewhere : wrong_somewhere,
              sync ? "publish through shared memory with __syncwarp: right in every order"
                   : "publish without __syncwarp: wrong in some lane order");
    }
    asc_emu_set_order(ASC_EMU_SHUFFLE, 1);
    {
        float fo[32];
        const cudaError_t e = launch(k_handoff<true>, dim3(1), dim3(64), 32 * sizeof(float), fo); /* one block: it writes fo[lane] */
        bool ok = e == cudaSuccess;
        for (int l = 0; l < 32; l++) ok &= fo[l] == (float)l;
        check(ok, "hand-off between warps through dynamic shared memory with __syncthreads");
    }
    check(asc_emu_live_allocations() == 0, "no device allocation left behind");

    const asc_emu_stats s = asc_emu_get_stats();
    printf("emu selftest: %d passed, %d failed (%llu launches, %llu blocks, %llu switches)\n", g_passed, g_failed,
           s.launches, s.blocks, s.switches);
    return g_failed ? 1 : 0;
}
