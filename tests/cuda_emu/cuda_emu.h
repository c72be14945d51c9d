/*
 * cuda_emu.h -- a CPU emulator of the CUDA execution model, for running the kernels of csrc/cuda
 * (and their launchers) on a machine without a GPU. Design, checks and limits: docs/cuda.md,
 * section "The emulator".
 *
 * Force-included (-include cuda_emu.h) when a .cu file is compiled by the host C++ compiler with
 * -DASC_CUDA_EMU -x c++ -std=c++20. It takes the toolkit's own host headers for the runtime types,
 * __half and __nv_bfloat16 (their host-side conversions), and provides what only a GPU has:
 *   threadIdx, blockIdx, blockDim, gridDim, warpSize
 *   __syncthreads, __syncwarp, __shfl_sync, __shfl_xor_sync, __shfl_up_sync, __shfl_down_sync,
 *   __ballot_sync, __any_sync, __all_sync (warp collectives: a barrier of the lanes in the mask
 *   plus the data exchange), __ffs, __popc, atomicAdd on global and shared memory (and mma.cuh's arrive),
 *   the matrix intrinsics of csrc/cuda/mma.cuh (mma, ldmatrix, cp.async: emu_matrix.h),
 *   static __shared__ variables (per block) and the block's dynamic shared memory
 *   (ASC_DYNAMIC_SMEM in csrc/cuda/common.cuh), the kernel launch (asc::launch), and the runtime
 *   API calls the launchers and the tests make (cuda_emu.cpp).
 * Every thread of a block is a fiber with its own stack; a block's fibers run cooperatively on one
 * OS thread and switch only at barriers and warp collectives, in a shuffled order, so code that
 * relies on implicit warp lock-step reads stale data (and ThreadSanitizer, which is told about the
 * fibers and about the barriers' happens-before edges and nothing else, reports the race).
 */
#ifndef ASC_CUDA_EMU_H
#define ASC_CUDA_EMU_H

#ifndef ASC_CUDA_EMU
#define ASC_CUDA_EMU 1
#endif

/* Every system header the kernels may pull in, before the macros below are defined. */
#include <atomic>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

#include <math.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "emu_api.h"

/* In host compilation the toolkit defines __host__, __device__, __global__ as nothing and
 * __forceinline__ as always_inline; __shared__ becomes per-block storage (the emulator runs the
 * blocks of a worker one at a time, each worker on its own OS thread). */
#undef __shared__
#define __shared__ static thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif

namespace asc_emu {

/* What a running CUDA thread sees of itself (cuda_emu.cpp keeps one per fiber). */
struct ThreadView {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
    unsigned char *dynamic_smem;
};

/* The CUDA thread running on this OS thread (inside a kernel only). */
const ThreadView *view();

enum Collective {
    C_SYNCWARP = 1,
    C_SHFL,
    C_SHFL_UP,
    C_SHFL_DOWN,
    C_SHFL_XOR,
    C_BALLOT,
    C_ANY,
    C_ALL,
    C_MMA,      /* the matrix intrinsics (emu_matrix.h): the payload points at the lane's operands, */
    C_LDMATRIX, /* arg is the instruction's form */
};

/* One warp collective of the calling lane: waits for every lane of `mask`, then returns its
 * result (shuffles: the source lane's payload; votes: the ballot; syncwarp: 0). */
uint64_t warp_collective(int kind, unsigned mask, uint64_t payload, int arg, int width, const char *file,
                         unsigned line);
void block_barrier(const char *file, unsigned line);

template <typename V>
inline V shuffle(int kind, unsigned mask, V v, int arg, int width, const std::source_location &at) {
    static_assert(std::is_trivially_copyable_v<V> && sizeof(V) <= 8, "shuffle of a type CUDA does not shuffle");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(V));
    bits = warp_collective(kind, mask, bits, arg, width, at.file_name(), at.line());
    V out;
    std::memcpy(&out, &bits, sizeof(V));
    return out;
}

/* The launch: every thread of every block calls body(ctx). */
cudaError_t launch_grid(const void *kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        void (*body)(void *), void *ctx);

template <typename... P>
struct KernelCall {
    void (*kernel)(P...);
    std::tuple<P...> args;
    static void run(void *self) {
        auto *c = static_cast<const KernelCall *>(self);
        std::apply(c->kernel, c->args); /* each thread gets its own copy of the parameters */
    }
};

template <typename... P>
inline cudaError_t launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          P... args) {
    KernelCall<P...> call{kernel, std::tuple<P...>(args...)};
    return launch_grid(reinterpret_cast<const void *>(kernel), grid, block, smem, stream, &KernelCall<P...>::run,
                       &call);
}

/* Per-kernel attributes (cudaFuncSetAttribute), by the kernel's address. */
cudaError_t set_func_attribute(const void *kernel, cudaFuncAttribute attr, int value);

}  // namespace asc_emu

/* ---------------------------------------------------------------- built-in variables */

#define threadIdx (::asc_emu::view()->thread_idx)
#define blockIdx (::asc_emu::view()->block_idx)
#define blockDim (::asc_emu::view()->block_dim)
#define gridDim (::asc_emu::view()->grid_dim)
#ifndef warpSize
#define warpSize 32
#endif

/* ---------------------------------------------------------------- barriers and warp collectives */

inline void __syncthreads(const std::source_location at = std::source_location::current()) {
    ::asc_emu::block_barrier(at.file_name(), at.line());
}

inline void __syncwarp(unsigned mask = 0xffffffffu, const std::source_location at = std::source_location::current()) {
    ::asc_emu::warp_collective(::asc_emu::C_SYNCWARP, mask, 0, 0, 32, at.file_name(), at.line());
}

template <typename V>
inline V __shfl_sync(unsigned mask, V var, int src_lane, int width = 32,
                     const std::source_location at = std::source_location::current()) {
    return ::asc_emu::shuffle(::asc_emu::C_SHFL, mask, var, src_lane, width, at);
}

template <typename V>
inline V __shfl_up_sync(unsigned mask, V var, unsigned delta, int width = 32,
                        const std::source_location at = std::source_location::current()) {
    return ::asc_emu::shuffle(::asc_emu::C_SHFL_UP, mask, var, (int)delta, width, at);
}

template <typename V>
inline V __shfl_down_sync(unsigned mask, V var, unsigned delta, int width = 32,
                          const std::source_location at = std::source_location::current()) {
    return ::asc_emu::shuffle(::asc_emu::C_SHFL_DOWN, mask, var, (int)delta, width, at);
}

template <typename V>
inline V __shfl_xor_sync(unsigned mask, V var, int lane_mask, int width = 32,
                         const std::source_location at = std::source_location::current()) {
    return ::asc_emu::shuffle(::asc_emu::C_SHFL_XOR, mask, var, lane_mask, width, at);
}

inline unsigned __ballot_sync(unsigned mask, int pred, const std::source_location at = std::source_location::current()) {
    return (unsigned)::asc_emu::warp_collective(::asc_emu::C_BALLOT, mask, pred != 0, 0, 32, at.file_name(), at.line());
}

inline int __any_sync(unsigned mask, int pred, const std::source_location at = std::source_location::current()) {
    return (int)::asc_emu::warp_collective(::asc_emu::C_ANY, mask, pred != 0, 0, 32, at.file_name(), at.line());
}

inline int __all_sync(unsigned mask, int pred, const std::source_location at = std::source_location::current()) {
    return (int)::asc_emu::warp_collective(::asc_emu::C_ALL, mask, pred != 0, 0, 32, at.file_name(), at.line());
}

/* ---------------------------------------------------------------- integer intrinsics */

inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }

/* ---------------------------------------------------------------- atomics (relaxed, like CUDA's) */

namespace asc_emu {
/* the cost build counts an atomic as a store of its thread (the instrumentation does not see it) */
void cost_atomic(const void *address, unsigned bytes);
}  // namespace asc_emu

template <typename V>
inline V asc_emu_atomic_add(V *address, V val) {
#ifdef ASC_EMU_COST
    ::asc_emu::cost_atomic(address, sizeof(V));
#endif
    return std::atomic_ref<V>(*address).fetch_add(val, std::memory_order_relaxed);
}
inline int atomicAdd(int *address, int val) { return asc_emu_atomic_add(address, val); }
inline unsigned atomicAdd(unsigned *address, unsigned val) { return asc_emu_atomic_add(address, val); }
inline unsigned long long atomicAdd(unsigned long long *address, unsigned long long val) {
    return asc_emu_atomic_add(address, val);
}
inline float atomicAdd(float *address, float val) { return asc_emu_atomic_add(address, val); }
inline double atomicAdd(double *address, double val) { return asc_emu_atomic_add(address, val); }
/* mma.cuh's arrive (atom.acq_rel.gpu.global.add.u32 on the GPU): a release and an acquire, the happens-before edge
 * between blocks that ThreadSanitizer sees (the relaxed atomics above carry none) */
inline unsigned asc_emu_arrive(unsigned *address) {
#ifdef ASC_EMU_COST
    ::asc_emu::cost_atomic(address, sizeof(unsigned));
#endif
    return std::atomic_ref<unsigned>(*address).fetch_add(1u, std::memory_order_acq_rel);
}

/* ---------------------------------------------------------------- runtime API (C++ overloads) */

/* cuda_runtime.h's template overload: a kernel (function pointer) instead of const void *. */
template <typename K>
inline cudaError_t cudaFuncSetAttribute(K *kernel, cudaFuncAttribute attr, int value) {
    return ::asc_emu::set_func_attribute(reinterpret_cast<const void *>(kernel), attr, value);
}

/* ---------------------------------------------------------------- matrix intrinsics (csrc/cuda/mma.cuh) */

#include "emu_matrix.h"

#endif /* ASC_CUDA_EMU_H */
