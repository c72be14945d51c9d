/*
 * emu_api.h -- control of the CUDA emulator (cuda_emu.cpp) from a test program. Plain C.
 *
 * Settings come from the environment at the first launch and can be changed here:
 *   ASC_EMU_WORKERS   OS threads that run blocks concurrently (default 2)
 *   ASC_EMU_ORDER     order in which the lanes released by a barrier run: "shuffle" (default,
 *                     seeded), "forward", "reverse"
 *   ASC_EMU_SEED      seed of the shuffle (default 1)
 *   ASC_EMU_SMEM_OPTIN  emulated cudaDevAttrMaxSharedMemoryPerBlockOptin in bytes (default 166912,
 *                     the A100's 163 KiB: the smallest of the targets sm_80 / sm_90)
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

/* The reason of the last kernel fault ("" if none). */
const char *asc_emu_last_fault(void);

/* Clears a sticky fault (like a device reset; allocations stay valid). */
void asc_emu_reset(void);

void asc_emu_set_order(int order, unsigned long long seed);
void asc_emu_set_workers(int workers);

/* Counters since the start: launches, blocks, barriers (block), warp collectives, fiber switches. */
typedef struct asc_emu_stats {
    unsigned long long launches, blocks, block_barriers, warp_collectives, switches;
} asc_emu_stats;
asc_emu_stats asc_emu_get_stats(void);

/* Device allocations (cudaMalloc, cudaMallocAsync) not yet freed. */
long long asc_emu_live_allocations(void);

#ifdef __cplusplus
}
#endif

#endif /* ASC_EMU_API_H */
