/*
 * emu_api.h -- control of the CUDA emulator (cuda_emu.cpp) from a test program. Plain C.
 *
 * Settings come from the environment at the first launch and can be changed here:
 *   ASC_EMU_WORKERS   OS threads that run blocks concurrently (default 2)
 *   ASC_EMU_ORDER     order in which the lanes released by a barrier run: "shuffle" (default,
 *                     seeded), "forward", "reverse"
 *   ASC_EMU_SEED      seed of the shuffle (default 1)
 *   ASC_EMU_SMEM_OPTIN  emulated cudaDevAttrMaxSharedMemoryPerBlockOptin in bytes (default
 *                     ASC_EMU_SMEM_OPTIN_A100, the smallest of the targets sm_80 / sm_90)
 *   ASC_EMU_SMS       emulated cudaDevAttrMultiProcessorCount (default ASC_EMU_SMS_H100, 132)
 * A kernel fault (deadlock, mismatched collectives, a lane outside its mask, ...) aborts the
 * launch with cudaErrorLaunchFailure, prints the reason to stderr and is sticky (every later
 * runtime call fails) until asc_emu_reset().
 */
#ifndef ASC_EMU_API_H
#define ASC_EMU_API_H

#ifdef __cplusplus
extern "C" {
#endif

enum asc_emu_order { ASC_EMU_SHUFFLE = 0, ASC_EMU_FORWARD = 1, ASC_EMU_REVERSE = 2 };

/* The targets' opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin): an A100's 163 KiB (the
 * emulator's default) and an H100's or H200's 227 KiB; an H100's SMs (SXM5; an H200 has as many). */
enum { ASC_EMU_SMEM_OPTIN_A100 = 166912, ASC_EMU_SMEM_OPTIN_H100 = 232448, ASC_EMU_SMS_H100 = 132 };

/* The reason of the last kernel fault ("" if none). */
const char *asc_emu_last_fault(void);

/* Clears a sticky fault (like a device reset; allocations stay valid). */
void asc_emu_reset(void);

/* How blocks run: the order in which a block's warps are released (enum asc_emu_order, with the shuffle's seed) and
 * the workers (threads) that run a launch's blocks; the device's opt-in shared memory per block in bytes (an SM holds
 * that and the 1 KiB the runtime reserves per block) and its SMs (what cudaDevAttrMultiProcessorCount and the
 * occupancy calculator report; ASC_EMU_SMS_H100 by default). The environment's (ASC_EMU_ORDER, ASC_EMU_SEED,
 * ASC_EMU_WORKERS, ASC_EMU_SMEM_OPTIN, ASC_EMU_SMS) until set. */
typedef struct asc_emu_settings {
    int order;
    unsigned long long seed;
    int workers;
    int smem_optin;
    int sms;
} asc_emu_settings;
asc_emu_settings asc_emu_get_settings(void);
void asc_emu_set_order(int order, unsigned long long seed);
void asc_emu_set_workers(int workers);
void asc_emu_set_smem_optin(int bytes);
void asc_emu_set_sms(int sms);

/* Counters since the start: launches, blocks, barriers (block), warp collectives, fiber switches. */
typedef struct asc_emu_stats {
    unsigned long long launches, blocks, block_barriers, warp_collectives, switches;
} asc_emu_stats;
asc_emu_stats asc_emu_get_stats(void);

/* Device allocations (cudaMalloc, cudaMallocAsync) not yet freed. */
long long asc_emu_live_allocations(void);

/* ---------------------------------------------------------------- the cost counters
 * Only in the cost build (tests/cuda_emu/Makefile: build/cost, `make cuda-cost`), whose kernels are
 * compiled with their loads and stores instrumented; elsewhere asc_emu_cost_enable returns 0 and
 * nothing is counted. docs/cuda.md, "The cost model". Counts of one launch: */
typedef struct asc_emu_counters {
    unsigned long long blocks, threads;
    /* global memory: warp requests, their distinct 32-byte sectors, and the bytes the lanes asked for
     * (distinct per request); sectors distinct over the whole launch (the least the DRAM must move) */
    unsigned long long gld_requests, gld_sectors, gld_bytes, gst_requests, gst_sectors, gst_bytes;
    unsigned long long gld_sectors_distinct, gst_sectors_distinct;
    /* shared memory: warp requests, wavefronts (bank conflicts serialize a request into more), and the
     * wavefronts a conflict-free request of the same bytes would take */
    unsigned long long lds_requests, lds_wavefronts, lds_ideal, sts_requests, sts_wavefronts, sts_ideal;
    /* warp instructions: mma (each form), their FLOPs (the 16-bit and tf32 forms': the tensor term's rate; the f64
     * form's DMMA are issued instructions only), ldmatrix */
    unsigned long long mma_bf16, mma_f16, mma_tf32, mma_f64, mma_flops, ldmatrix;
    /* lane operations the kernels declare (asc::cost_scalar in mma.cuh) or the intrinsics count: FP32
     * FLOPs (an FMA is 2) and special-function (MUFU) operations, asc::ex2 included */
    unsigned long long fp32_flops, mufu_ops;
    /* block barriers (completed, per block) and warp collectives (completed, per warp) */
    unsigned long long barriers, warp_collectives;
    /* the most block barriers one block completed: the length of the launch's longest block (a maximum over
     * the blocks, not a sum; cuda_cost's "longest block") */
    unsigned long long max_block_barriers;
} asc_emu_counters;

/* A basic block of the kernel code (the return address of its -fsanitize-coverage=trace-pc call, as an
 * address in the executable's file) and its warp executions over the launch: per warp and epoch between two
 * of the warp's synchronizations, the executions of its busiest lane, summed (the input of
 * tools/sass_icount.py: docs/cuda.md, "Issued instructions"). */
typedef struct asc_emu_bb_count {
    unsigned long long site, warp_execs;
} asc_emu_bb_count;

/* A call site of a warp mma or ldmatrix (the return address of the kernel code's call of the emulator's
 * matrix intrinsic, as an address in the executable's file) and its warp executions over the launch:
 * what tools/sass_icount.py scales each product's SASS to (docs/cuda.md, "Issued instructions", step 4). */
typedef struct asc_emu_product_count {
    unsigned long long site, warp_execs;
    int ldmatrix; /* 0: mma, 1: ldmatrix */
} asc_emu_product_count;

typedef struct asc_emu_launch_cost {
    const char *kernel, *symbol; /* demangled and mangled name */
    unsigned grid[3], block[3];
    unsigned long long smem; /* dynamic shared memory bytes */
    asc_emu_counters c;
    int nbbs; /* basic blocks executed, sorted by site */
    const asc_emu_bb_count *bbs;
    int nproducts; /* mma and ldmatrix call sites executed, sorted by site */
    const asc_emu_product_count *products;
} asc_emu_launch_cost;

/* Turns counting on (1) or off (0); returns 1 if this build counts. Each launch while on appends a record. */
int asc_emu_cost_enable(int on);
/* Records appended since the last clear; record i (valid until the next clear). */
int asc_emu_cost_count(void);
const asc_emu_launch_cost *asc_emu_cost_record(int i);
void asc_emu_cost_clear(void);

#ifdef __cplusplus
}
#endif

#endif /* ASC_EMU_API_H */
