/*
 * cuda_emu.cpp -- the runtime of the CUDA emulator (cuda_emu.h, docs/cuda.md "The emulator").
 *
 * A launch runs the blocks of the grid on ASC_EMU_WORKERS OS threads (the calling thread and a
 * pool), one block at a time per worker. A block's CUDA threads are fibers (own stacks, a
 * hand-written context switch on x86-64, ucontext elsewhere) scheduled cooperatively on the
 * worker: a fiber runs until it reaches a block barrier, a warp collective or the end of the
 * kernel, then the next runnable fiber of the run queue takes over. A barrier or collective
 * completes when every participant has arrived; its participants re-enter the run queue in a
 * shuffled (or forward / reverse) order. If the run queue empties while fibers still wait, the
 * block can never finish: the launch fails with a description of every waiting thread instead
 * of hanging.
 *
 * Sanitizers. This file is compiled without ThreadSanitizer instrumentation (ASC_EMU_TSAN tells
 * it to drive TSan's fiber API): the kernels (instrumented) see each CUDA thread as a TSan fiber,
 * switches between fibers carry no synchronization, and the only happens-before edges are the
 * ones CUDA guarantees: block start, __syncthreads, __syncwarp (memory ordering among its lanes)
 * and block end. Shuffles and votes exchange register values and order no memory, as on the GPU.
 * Under AddressSanitizer the stack switches are announced (__sanitizer_*_switch_fiber); dynamic
 * shared memory is a heap block of exactly the launch's size, global memory is malloc'ed.
 */
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#if !defined(__x86_64__) || defined(ASC_EMU_UCONTEXT)
#define ASC_EMU_USE_UCONTEXT 1
#include <ucontext.h>
#endif

#if defined(ASC_EMU_ASAN) || defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#ifndef ASC_EMU_ASAN
#define ASC_EMU_ASAN 1
#endif
#endif

#if defined(ASC_EMU_TSAN) || defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#ifndef ASC_EMU_TSAN
#define ASC_EMU_TSAN 1
#endif
#endif

#ifdef ASC_EMU_COST
#include <link.h>

#include <map>

#include "emu_cost.h"
#endif

#include "cuda_emu.h" /* after every system header: it defines CUDA's keywords as macros */

/* ---------------------------------------------------------------- context switch */

#ifndef ASC_EMU_USE_UCONTEXT
/* asc_emu_ctx_switch(save, to): pushes the callee-saved registers (and MXCSR, the x87 control
 * word), stores the stack pointer in *save, loads `to` and pops the same frame from it. A new
 * fiber's stack holds such a frame whose return address is the trampoline, with r12 = entry and
 * r13 = its argument. */
extern "C" void asc_emu_ctx_switch(void **save, void *to);
extern "C" void asc_emu_ctx_trampoline(void);
asm(R"(
    .pushsection .text
    .globl asc_emu_ctx_switch
    .type asc_emu_ctx_switch, @function
asc_emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size asc_emu_ctx_switch, .-asc_emu_ctx_switch

    .globl asc_emu_ctx_trampoline
    .type asc_emu_ctx_trampoline, @function
asc_emu_ctx_trampoline:
    movq %r13, %rdi
    callq *%r12
    ud2
    .size asc_emu_ctx_trampoline, .-asc_emu_ctx_trampoline
    .popsection
)");
#endif

namespace asc_emu {

namespace {

/* ---------------------------------------------------------------- settings and statistics */

struct Config {
    int workers = 2;
    int order = ASC_EMU_SHUFFLE;
    unsigned long long seed = 1;
    int smem_optin = ASC_EMU_SMEM_OPTIN_A100;
    int sms = ASC_EMU_SMS_H100;
    bool loaded = false;
};

std::mutex g_cfg_mu;
Config g_cfg;

Config config() {
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    if (!g_cfg.loaded) {
        g_cfg.loaded = true;
        if (const char *s = getenv("ASC_EMU_WORKERS")) g_cfg.workers = std::max(1, atoi(s));
        if (const char *s = getenv("ASC_EMU_ORDER")) {
            const std::string o = s;
            g_cfg.order = o == "forward" ? ASC_EMU_FORWARD : (o == "reverse" ? ASC_EMU_REVERSE : ASC_EMU_SHUFFLE);
        }
        if (const char *s = getenv("ASC_EMU_SEED")) g_cfg.seed = strtoull(s, nullptr, 10);
        if (const char *s = getenv("ASC_EMU_SMEM_OPTIN")) g_cfg.smem_optin = atoi(s);
        if (const char *s = getenv("ASC_EMU_SMS")) g_cfg.sms = std::max(1, atoi(s));
    }
    return g_cfg;
}

/* statistics: per worker while a launch runs (no shared cache line on the hot path), summed after */
std::atomic<unsigned long long> st_launches{0}, st_blocks{0}, st_bars{0}, st_colls{0}, st_switches{0};

/* A sticky kernel fault (cudaErrorLaunchFailure) and its description. */
std::mutex g_fault_mu;
std::string g_fault;
std::atomic<bool> g_sticky{false};

/* The last non-sticky error (cudaGetLastError), per host thread like CUDA's. */
thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t record(cudaError_t e) {
    if (e != cudaSuccess) t_last_error = e;
    return e;
}

/* ---------------------------------------------------------------- fibers */

constexpr size_t STACK_BYTES = 512 * 1024;

struct Fiber {
    void *sp = nullptr;
#ifdef ASC_EMU_USE_UCONTEXT
    ucontext_t uc;
#endif
    char *map = nullptr; /* mmap'ed region: a guard page, then the stack */
    size_t map_bytes = 0;
    const void *stack_lo = nullptr;
    size_t stack_bytes = 0;
    void *tsan = nullptr;
    void *asan_fake = nullptr;
};

enum State { RUNNABLE, AT_WARP, AT_BLOCK, EXITED };

/* A cp.async issued by a thread and not yet completed: its 16 bytes (read at the issue) and its group
 * (the count of cp.async.commit_group calls of the thread before it). */
struct PendingCopy {
    void *dst;
    unsigned char data[16];
    unsigned long long group;
};

struct Worker;

struct Thread {
    ThreadView v{};
    Worker *w = nullptr;
    int linear = 0, warp = 0, lane = 0;
    int state = EXITED;
    uint64_t payload = 0, result = 0;
    int arg = 0;
    uintptr_t product_site = 0; /* the return address of its last matrix intrinsic call (the cost build's) */
    std::vector<PendingCopy> copies; /* in issue order */
    unsigned long long groups = 0;   /* cp.async.commit_group calls so far */
    Fiber fib;
};

/* A warp: its lanes, and the collective in flight (one at a time). */
struct Warp {
    unsigned members = 0, exited = 0, arrived = 0, mask = 0;
    int kind = 0, width = 32, arg = 0;
    const char *file = nullptr;
    unsigned line = 0;
};

/* One launch, shared by the workers. */
struct Launch {
    void (*body)(void *) = nullptr;
    void *ctx = nullptr;
    dim3 grid, block;
    size_t smem = 0;
    long nblocks = 0;
    unsigned long long id = 0;
    Config cfg;
    std::atomic<long> next{0};
    std::atomic<bool> failed{false};
#ifdef ASC_EMU_COST
    bool counting = false;
    std::vector<std::pair<uintptr_t, uintptr_t>> global_ranges; /* device allocations [lo, hi), sorted */
#endif
};

struct Worker {
    std::vector<std::unique_ptr<Thread>> thr; /* fibers, grown to the largest block seen */
    int nthreads = 0;
    std::vector<Warp> warps;
    std::vector<Thread *> ring, scratch;
    size_t head = 0, count = 0;
    Fiber main;
    Launch *L = nullptr;
    long block = 0;
    int bar_arrived = 0;
    const char *bar_file = nullptr;
    unsigned bar_line = 0;
    int nexited = 0;
    bool fault = false;   /* the block faulted: fault_msg says why */
    bool aborting = false; /* its fibers are being unwound */
    std::string fault_msg;
    unsigned long long rng = 1;
    unsigned long long n_switches = 0, n_colls = 0, n_bars = 0, n_blocks = 0;
    unsigned char *smem = nullptr;
#ifdef ASC_EMU_COST
    cost::Tally tally;
#endif
    /* addresses used as TSan synchronization objects */
    char sync_start = 0, sync_end = 0, sync_block = 0, sync_warp[32] = {}, sync_lane[1024] = {};
    ~Worker();
};

thread_local Thread *t_cur = nullptr; /* the CUDA thread running on this OS thread */

unsigned long long next_rand(unsigned long long &s) {
    s += 0x9E3779B97F4A7C15ULL;
    unsigned long long z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void tsan_acquire(void *addr) {
#ifdef ASC_EMU_TSAN
    __tsan_acquire(addr);
#else
    (void)addr;
#endif
}

void tsan_release(void *addr) {
#ifdef ASC_EMU_TSAN
    __tsan_release(addr);
#else
    (void)addr;
#endif
}

void switch_to(Fiber *from, Fiber *to, Thread *to_thread) {
    t_cur = to_thread;
#ifdef ASC_EMU_ASAN
    __sanitizer_start_switch_fiber(&from->asan_fake, to->stack_lo, to->stack_bytes);
#endif
#ifdef ASC_EMU_TSAN
    __tsan_switch_to_fiber(to->tsan, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef ASC_EMU_USE_UCONTEXT
    swapcontext(&from->uc, &to->uc);
#else
    asc_emu_ctx_switch(&from->sp, to->sp);
#endif
#ifdef ASC_EMU_ASAN
    __sanitizer_finish_switch_fiber(from->asan_fake, nullptr, nullptr);
#endif
}

void fiber_entry(void *arg);

#ifdef ASC_EMU_USE_UCONTEXT
void fiber_entry_uc(unsigned lo, unsigned hi) {
    fiber_entry((void *)(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
#endif

void fiber_create(Fiber *f, Thread *t) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    f->map_bytes = STACK_BYTES + page;
    void *m = mmap(nullptr, f->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "cuda_emu: cannot map a fiber stack\n");
        abort();
    }
    f->map = (char *)m;
    mprotect(f->map, page, PROT_NONE); /* guard page: a stack overflow faults */
    f->stack_lo = f->map + page;
    f->stack_bytes = STACK_BYTES;
#ifdef ASC_EMU_TSAN
    f->tsan = __tsan_create_fiber(0);
    char name[64];
    snprintf(name, sizeof(name), "cuda thread %d (warp %d lane %d)", t->linear, t->warp, t->lane);
    __tsan_set_fiber_name(f->tsan, name);
#endif
#ifdef ASC_EMU_USE_UCONTEXT
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = (void *)f->stack_lo;
    f->uc.uc_stack.ss_size = f->stack_bytes;
    f->uc.uc_link = nullptr;
    const uintptr_t a = (uintptr_t)t;
    makecontext(&f->uc, (void (*)())fiber_entry_uc, 2, (unsigned)(a & 0xffffffffu), (unsigned)(a >> 32));
#else
    uint64_t *sp = (uint64_t *)((char *)f->stack_lo + f->stack_bytes);
    *--sp = (uint64_t)(uintptr_t)asc_emu_ctx_trampoline; /* return address of the first switch */
    *--sp = 0;                                          /* rbp: ends frame-pointer unwinding */
    *--sp = 0;                                          /* rbx */
    *--sp = (uint64_t)(uintptr_t)fiber_entry;           /* r12 */
    *--sp = (uint64_t)(uintptr_t)t;                     /* r13 */
    *--sp = 0;                                          /* r14 */
    *--sp = 0;                                          /* r15 */
    *--sp = 0x1F80ULL | (0x037FULL << 32);              /* MXCSR, x87 control word: defaults */
    f->sp = sp;
#endif
}

void fiber_destroy(Fiber *f) {
#ifdef ASC_EMU_TSAN
    if (f->tsan) __tsan_destroy_fiber(f->tsan);
#endif
#ifdef ASC_EMU_ASAN
    /* a fiber abandoned inside a kernel leaves poisoned stack frames behind */
    __asan_unpoison_memory_region(f->stack_lo, f->stack_bytes);
#endif
    if (f->map) munmap(f->map, f->map_bytes);
    *f = Fiber();
}

Worker::~Worker() {
    for (auto &t : thr) fiber_destroy(&t->fib); /* each waits at the bottom of fiber_entry */
}

/* ---------------------------------------------------------------- run queue and faults */

void push(Worker *w, Thread *t) {
    size_t at = w->head + w->count;
    if (at >= w->ring.size()) at -= w->ring.size();
    w->ring[at] = t;
    w->count++;
}

Thread *pop(Worker *w) {
    if (w->count == 0) return nullptr;
    Thread *t = w->ring[w->head];
    if (++w->head == w->ring.size()) w->head = 0;
    w->count--;
    return t;
}

/* Makes `n` threads runnable in the order policy of the launch. */
void release_group(Worker *w, Thread **ts, int n) {
    const int order = w->L->cfg.order;
    if (order == ASC_EMU_SHUFFLE) {
        for (int i = n - 1; i > 0; i--) /* Fisher-Yates; the index by a multiply-high, not a division */
            std::swap(ts[i], ts[(int)(((next_rand(w->rng) >> 32) * (unsigned long long)(i + 1)) >> 32)]);
    } else if (order == ASC_EMU_REVERSE) {
        std::reverse(ts, ts + n);
    }
    for (int i = 0; i < n; i++) {
        ts[i]->state = RUNNABLE;
        push(w, ts[i]);
    }
}

const char *kind_name(int kind) {
    switch (kind) {
        case C_SYNCWARP: return "__syncwarp";
        case C_SHFL: return "__shfl_sync";
        case C_SHFL_UP: return "__shfl_up_sync";
        case C_SHFL_DOWN: return "__shfl_down_sync";
        case C_SHFL_XOR: return "__shfl_xor_sync";
        case C_BALLOT: return "__ballot_sync";
        case C_ANY: return "__any_sync";
        case C_ALL: return "__all_sync";
        case C_MMA: return "mma.sync";
        case C_LDMATRIX: return "ldmatrix";
        default: return "?";
    }
}

std::string where(const char *file, unsigned line) {
    if (!file) return "?";
    const char *s = strrchr(file, '/');
    return std::string(s ? s + 1 : file) + ":" + std::to_string(line);
}

std::string block_name(const Worker *w) {
    const ThreadView &v = w->thr[0]->v;
    char b[96];
    snprintf(b, sizeof(b), "block (%u,%u,%u) of grid (%u,%u,%u)", v.block_idx.x, v.block_idx.y, v.block_idx.z,
             v.grid_dim.x, v.grid_dim.y, v.grid_dim.z);
    return b;
}

std::string thread_name(const Thread *t) {
    char b[96];
    snprintf(b, sizeof(b), "thread (%u,%u,%u) [warp %d lane %d]", t->v.thread_idx.x, t->v.thread_idx.y,
             t->v.thread_idx.z, t->warp, t->lane);
    return b;
}

/* A list of lanes or threads as ranges: "0-5,9". */
std::string ranges(const std::vector<int> &xs) {
    std::string s;
    for (size_t i = 0; i < xs.size();) {
        size_t j = i;
        while (j + 1 < xs.size() && xs[j + 1] == xs[j] + 1) j++;
        if (!s.empty()) s += ",";
        s += std::to_string(xs[i]);
        if (j > i) s += "-" + std::to_string(xs[j]);
        i = j + 1;
    }
    return s.empty() ? "none" : s;
}

std::string lanes_of(unsigned m) {
    std::vector<int> xs;
    for (int l = 0; l < 32; l++)
        if (m >> l & 1u) xs.push_back(l);
    return ranges(xs);
}

/* Where every thread of the block stands (for a deadlock). */
std::string block_state(const Worker *w) {
    std::string s;
    std::vector<int> at_block, exited;
    for (int i = 0; i < w->nthreads; i++) {
        const Thread *t = w->thr[i].get();
        if (t->state == AT_BLOCK) at_block.push_back(i);
        if (t->state == EXITED) exited.push_back(i);
    }
    if (!at_block.empty())
        s += "\n  threads " + ranges(at_block) + " wait at __syncthreads (" + where(w->bar_file, w->bar_line) + ")";
    for (size_t wi = 0; wi < w->warps.size(); wi++) {
        const Warp &wp = w->warps[wi];
        if (wp.arrived)
            s += "\n  warp " + std::to_string(wi) + ": lanes " + lanes_of(wp.arrived) + " wait at " + kind_name(wp.kind) +
                 " (" + where(wp.file, wp.line) + ", mask lanes " + lanes_of(wp.mask) + "), lanes " +
                 lanes_of(wp.mask & ~wp.arrived) + " never arrive";
    }
    if (!exited.empty()) s += "\n  threads " + ranges(exited) + " have exited";
    return s;
}

/* Thrown by fault() in the faulting fiber, and in every other fiber of the block when the worker
 * resumes it to unwind it; caught at the bottom of the fiber. */
struct KernelFault {};

/* Ends the block with a fault about `subject`: the message goes to the launch and the block's
 * fibers are unwound (this one now, the others by run_block). */
[[noreturn]] void fault(Worker *w, const Thread *subject, const std::string &what) {
    w->fault = true;
    w->aborting = true;
    w->fault_msg = "cuda_emu: kernel fault in " + block_name(w) + ", " + thread_name(subject) + ": " + what;
    throw KernelFault();
}

/* The current thread has blocked (or re-queued itself): run the next runnable one. */
void yield(Thread *t) {
    Worker *w = t->w;
    Thread *n = pop(w);
    if (n == t) return;
    w->n_switches++;
    if (n) {
        switch_to(&t->fib, &n->fib, n);
        return;
    }
    if (w->nexited == w->nthreads) { /* the block is done; t has exited */
        switch_to(&t->fib, &w->main, nullptr);
        return;
    }
    fault(w, t, "deadlock: no thread can proceed" + block_state(w));
}

void thread_exit(Thread *t) {
    Worker *w = t->w;
    Warp &wp = w->warps[t->warp];
    t->state = EXITED;
    w->nexited++;
    wp.exited |= 1u << t->lane;
    if (wp.arrived && (wp.mask >> t->lane & 1u))
        fault(w, t, "exited while lanes " + lanes_of(wp.arrived) + " of its warp wait for it at " + kind_name(wp.kind) +
                     " (" + where(wp.file, wp.line) + ")");
    if (w->bar_arrived)
        fault(w, t, "exited while " + std::to_string(w->bar_arrived) + " threads wait at __syncthreads (" +
                     where(w->bar_file, w->bar_line) + "): the barrier can never complete");
    yield(t);
}

void fiber_entry(void *arg) {
    Thread *t = (Thread *)arg;
#ifdef ASC_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    for (;;) {
        Worker *w = t->w;
        if (!w->aborting) {
            try {
                tsan_acquire(&w->sync_start);
                w->L->body(w->L->ctx);
                tsan_release(&w->sync_end);
                thread_exit(t); /* returns when the next block re-arms this fiber */
                continue;
            } catch (const KernelFault &) {
            }
        }
        /* unwound by a fault of the block: hand back to the worker, which re-arms the fiber later */
        tsan_release(&w->sync_end);
        t->state = EXITED;
        switch_to(&t->fib, &w->main, nullptr);
    }
}

/* ---------------------------------------------------------------- collectives */

/* Source lane of a shuffle (PTX shfl.sync with c = ((32 - width) << 8) | clamp). */
int shuffle_source(int kind, int lane, int arg, int width) {
    const int segmask = (32 - width) & 0x1f;
    const int clamp = kind == C_SHFL_UP ? 0 : 0x1f;
    const int min_lane = lane & segmask, max_lane = min_lane | (clamp & ~segmask);
    const int b = arg & 0x1f;
    int j = lane;
    bool ok = true;
    switch (kind) {
        case C_SHFL: j = min_lane | (b & ~segmask); ok = j <= max_lane; break;
        case C_SHFL_UP: j = lane - b; ok = j >= max_lane; break;
        case C_SHFL_DOWN: j = lane + b; ok = j <= max_lane; break;
        case C_SHFL_XOR: j = lane ^ b; ok = j <= max_lane; break;
        default: break;
    }
    return ok ? j : lane;
}

void resolve_warp(Worker *w, Warp &wp, int warp_index) {
    Thread *ts[32];
    int n = 0;
    const int base = warp_index * 32;
    uint64_t ballot = 0;
    for (int l = 0; l < 32; l++)
        if (wp.mask >> l & 1u && w->thr[base + l]->payload) ballot |= 1ull << l;
    for (int l = 0; l < 32; l++) {
        if (!(wp.mask >> l & 1u)) continue;
        Thread *t = w->thr[base + l].get();
        switch (wp.kind) {
            case C_SHFL: case C_SHFL_UP: case C_SHFL_DOWN: case C_SHFL_XOR: {
                const int src = shuffle_source(wp.kind, l, t->arg, wp.width);
                if (!(wp.mask >> src & 1u))
                    fault(w, t, std::string(kind_name(wp.kind)) + " (" + where(wp.file, wp.line) + ") reads lane " +
                                 std::to_string(src) + ", which is not in the mask (lanes " + lanes_of(wp.mask) +
                                 "): undefined value");
                t->result = w->thr[base + src]->payload;
                break;
            }
            case C_BALLOT: t->result = ballot; break;
            case C_ANY: t->result = ballot != 0; break;
            case C_ALL: t->result = ballot == (uint64_t)wp.mask; break;
            default: t->result = 0; break;
        }
        ts[n++] = t;
    }
    if (wp.kind == C_MMA || wp.kind == C_LDMATRIX) { /* .aligned: the mask is the whole warp */
        void *lanes[32];
        for (int l = 0; l < 32; l++) lanes[l] = (void *)(uintptr_t)w->thr[base + l]->payload;
        if (wp.kind == C_MMA) resolve_mma(wp.arg, lanes);
        else resolve_ldmatrix(wp.arg, reinterpret_cast<LdmatrixLane *const *>(lanes));
    }
#ifdef ASC_EMU_COST
    if (w->L->counting) {
        asc_emu_counters &c = w->tally.c;
        /* every lane runs the same call: lane 0's site (HMMA and LDSM, the estimate's anchors; not DMMA) */
        if ((wp.kind == C_MMA && wp.arg != MMA_F64_884) || wp.kind == C_LDMATRIX)
            ++w->tally.product_execs[wp.kind == C_LDMATRIX][w->thr[base]->product_site];
        if (wp.kind == C_MMA && wp.arg == MMA_F64_884) {
            c.mma_f64++;
        } else if (wp.kind == C_MMA) {
            (wp.arg == MMA_BF16_16816 ? c.mma_bf16 : wp.arg == MMA_F16_16816 ? c.mma_f16 : c.mma_tf32)++;
            c.mma_flops += 2ull * 16 * 8 * (wp.arg == MMA_TF32_1688 ? 8 : 16);
        } else if (wp.kind == C_LDMATRIX) {
            c.ldmatrix++;
        } else {
            c.warp_collectives++;
        }
        cost::close_warp(w->tally, warp_index);
    }
#endif
    wp.arrived = 0;
    release_group(w, ts, n);
}

/* Synchronization objects of a __syncwarp: one per warp for the whole warp, one per lane for a
 * partial mask (each lane releases its own, then acquires every other participant's). */
void syncwarp_release(Worker *w, Thread *t, unsigned mask) {
    tsan_release(mask == 0xffffffffu ? (void *)&w->sync_warp[t->warp] : (void *)&w->sync_lane[t->linear]);
}

void syncwarp_acquire(Worker *w, Thread *t, unsigned mask) {
    if (mask == 0xffffffffu) {
        tsan_acquire(&w->sync_warp[t->warp]);
        return;
    }
    for (int l = 0; l < 32; l++)
        if (mask >> l & 1u) tsan_acquire(&w->sync_lane[t->warp * 32 + l]);
}

}  // namespace

/* ---------------------------------------------------------------- device-side entry points */

const ThreadView *view() {
    if (!t_cur) {
        fprintf(stderr, "cuda_emu: threadIdx / blockIdx / blockDim / gridDim read outside a kernel\n");
        abort();
    }
    return &t_cur->v;
}

uint64_t warp_collective(int kind, unsigned mask, uint64_t payload, int arg, int width, const char *file,
                         unsigned line) {
    Thread *t = t_cur;
    if (!t) {
        fprintf(stderr, "cuda_emu: %s called outside a kernel (%s)\n", kind_name(kind), where(file, line).c_str());
        abort();
    }
    Worker *w = t->w;
    w->n_colls++;
    Warp &wp = w->warps[t->warp];
    const unsigned bit = 1u << t->lane;
    auto here = [&] { return std::string(kind_name(kind)) + " (" + where(file, line) + ")"; };
    if (!(mask & bit)) fault(w, t, here() + " with mask lanes " + lanes_of(mask) + ", which does not include the caller");
    if (mask & ~wp.members)
        fault(w, t, here() + " with mask lanes " + lanes_of(mask) + ": lanes " + lanes_of(mask & ~wp.members) +
                     " do not exist (blockDim " + std::to_string(w->nthreads) + ")");
    if (width < 1 || width > 32 || (width & (width - 1)))
        fault(w, t, here() + " with width " + std::to_string(width) + " (must be a power of 2 up to 32)");
    if (mask & wp.exited)
        fault(w, t, here() + ": lanes " + lanes_of(mask & wp.exited) + " of the mask have exited; it can never complete");
    if (wp.arrived == 0) {
        wp.kind = kind;
        wp.mask = mask;
        wp.width = width;
        wp.arg = arg;
        wp.file = file;
        wp.line = line;
    } else if (wp.kind != kind || wp.mask != mask || wp.width != width ||
               ((kind == C_MMA || kind == C_LDMATRIX) && wp.arg != arg) ||
               (kind != C_SYNCWARP && (wp.line != line || (wp.file != file && strcmp(wp.file, file) != 0)))) {
        fault(w, t, here() + " with mask lanes " + lanes_of(mask) + " while lanes " + lanes_of(wp.arrived) + " wait at " +
                     kind_name(wp.kind) + " (" + where(wp.file, wp.line) + ", mask lanes " + lanes_of(wp.mask) +
                     "): mismatched warp collectives");
    }
    t->payload = payload;
    t->arg = arg;
    t->state = AT_WARP;
    if (kind == C_SYNCWARP) syncwarp_release(w, t, mask);
    wp.arrived |= bit;
    if (wp.arrived == wp.mask) resolve_warp(w, wp, t->warp);
    yield(t);
    if (w->aborting) throw KernelFault();
    if (kind == C_SYNCWARP) syncwarp_acquire(w, t, mask);
    return t->result;
}

void block_barrier(const char *file, unsigned line) {
    Thread *t = t_cur;
    if (!t) {
        fprintf(stderr, "cuda_emu: __syncthreads called outside a kernel (%s)\n", where(file, line).c_str());
        abort();
    }
    Worker *w = t->w;
    w->n_bars++;
    if (w->nexited > 0)
        fault(w, t, "__syncthreads (" + where(file, line) + ") after " + std::to_string(w->nexited) +
                     " threads of the block have exited: the barrier can never complete" + block_state(w));
    const Warp &wp = w->warps[t->warp];
    if (wp.arrived && (wp.mask >> t->lane & 1u))
        fault(w, t, "__syncthreads (" + where(file, line) + ") while lanes " + lanes_of(wp.arrived) + " of its warp wait at " +
                     kind_name(wp.kind) + " (" + where(wp.file, wp.line) + ")");
    if (w->bar_arrived == 0) {
        w->bar_file = file;
        w->bar_line = line;
    } else if (w->bar_line != line || (w->bar_file != file && strcmp(w->bar_file, file) != 0)) {
        fault(w, t, "__syncthreads at " + where(file, line) + " while " + std::to_string(w->bar_arrived) +
                     " threads wait at __syncthreads (" + where(w->bar_file, w->bar_line) +
                     "): divergent block barriers");
    }
    tsan_release(&w->sync_block);
    t->state = AT_BLOCK;
    if (++w->bar_arrived == w->nthreads) {
        Thread **ts = w->scratch.data();
        for (int i = 0; i < w->nthreads; i++) ts[i] = w->thr[(size_t)i].get();
        w->bar_arrived = 0;
#ifdef ASC_EMU_COST
        if (w->L->counting) {
            w->tally.c.barriers++;
            cost::close_all(w->tally);
        }
#endif
        release_group(w, ts, w->nthreads);
    }
    yield(t);
    if (w->aborting) throw KernelFault();
    tsan_acquire(&w->sync_block);
}

/* ---------------------------------------------------------------- matrix intrinsics (emu_matrix.h) */

namespace {

Thread *current(const char *what, const SourceAt &at) {
    Thread *t = t_cur;
    if (!t) {
        fprintf(stderr, "cuda_emu: %s called outside a kernel (%s)\n", what, where(at.file_name(), at.line()).c_str());
        abort();
    }
    return t;
}

std::string hex(const void *p) {
    char b[32];
    snprintf(b, sizeof(b), "%p", p);
    return b;
}

}  // namespace

/* Not inlined: its return address is the kernel code's call site (the cost build counts per site). */
__attribute__((noinline)) void matrix_collective(int kind, int op, void *lane_data, const SourceAt &at) {
#ifdef ASC_EMU_COST
    if (t_cur) t_cur->product_site = (uintptr_t)__builtin_return_address(0);
#endif
    warp_collective(kind == 0 ? C_MMA : C_LDMATRIX, 0xffffffffu, (uint64_t)(uintptr_t)lane_data, op, 32, at.file_name(),
                    at.line());
}

int lane_id() { return current("a matrix intrinsic", SourceAt::current())->lane; }

void check_aligned_16(const void *p, const char *what, const SourceAt &at) {
    Thread *t = current(what, at);
    if ((uintptr_t)p % 16 != 0)
        fault(t->w, t, std::string(what) + " " + hex(p) + " (" + where(at.file_name(), at.line()) +
                           ") is not 16-byte aligned (PTX ISA: the address of a 16-byte row or copy must be)");
}

void check_smem_row(const void *p, const char *what, const SourceAt &at) {
    Thread *t = current(what, at);
    const Worker *w = t->w;
    const unsigned char *lo = w->smem, *q = static_cast<const unsigned char *>(p);
    const size_t n = w->L ? w->L->smem : 0;
    if (!lo || q < lo || q + 16 > lo + n)
        fault(t->w, t, std::string(what) + " " + hex(p) + " (" + where(at.file_name(), at.line()) +
                           "): [address, address + 16) is not inside the block's dynamic shared memory (" +
                           std::to_string(n) + " bytes at " + hex(lo) +
                           "; under the emulator ldmatrix and cp.async take ASC_DYNAMIC_SMEM memory)");
    check_aligned_16(p, what, at);
}

void cp_async_enqueue(void *dst, const unsigned char (&data)[16]) {
    Thread *t = current("cp.async", SourceAt::current());
    PendingCopy c;
    c.dst = dst;
    std::memcpy(c.data, data, 16);
    c.group = t->groups;
    t->copies.push_back(c);
}

void cp_async_commit() { current("cp.async.commit_group", SourceAt::current())->groups++; }

bool cp_async_next(int n, void **dst, unsigned char (&data)[16]) {
    Thread *t = current("cp.async.wait_group", SourceAt::current());
    /* complete: every committed group but the n most recent, i.e. group < groups - n (uncommitted
     * copies have group == groups and stay pending) */
    for (size_t i = 0; i < t->copies.size(); i++) {
        const PendingCopy &c = t->copies[i];
        if (c.group + (unsigned long long)n < t->groups) {
            *dst = c.dst;
            std::memcpy(data, c.data, 16);
            t->copies.erase(t->copies.begin() + (long)i);
            return true;
        }
    }
    return false;
}

/* ---------------------------------------------------------------- cost counters (emu_cost.h) */

#ifdef ASC_EMU_COST

namespace {

thread_local bool t_cost_paused = false;

/* [lo, hi) of the executable's static TLS block on this OS thread: the static __shared__ variables of
 * the kernels (cuda_emu.h: static thread_local) live there (x86-64: the block ends at the thread pointer) */
struct TlsRange {
    uintptr_t lo = 0, hi = 0;
    TlsRange() {
        std::pair<size_t, size_t> tls{0, 1}; /* p_memsz, p_align of the executable's PT_TLS */
        dl_iterate_phdr(
            [](struct dl_phdr_info *info, size_t, void *out) {
                for (int i = 0; i < info->dlpi_phnum; i++)
                    if (info->dlpi_phdr[i].p_type == PT_TLS) {
                        auto *r = static_cast<std::pair<size_t, size_t> *>(out);
                        *r = {info->dlpi_phdr[i].p_memsz, info->dlpi_phdr[i].p_align ? info->dlpi_phdr[i].p_align : 1};
                    }
                return 1; /* the executable comes first: stop after it */
            },
            &tls);
        hi = (uintptr_t)__builtin_thread_pointer();
        lo = hi - (tls.first + tls.second - 1) / tls.second * tls.second;
    }
};

/* An access of the running CUDA thread: global (a device allocation), shared (the block's dynamic shared
 * memory, or a static __shared__ variable), anything else (its stack, host memory) not counted. */
inline void count_access(uintptr_t site, uintptr_t addr, uint32_t size, bool write) {
    Thread *t = t_cur;
    if (!t || t_cost_paused) return;
    Worker *w = t->w;
    Launch *L = w->L;
    if (!L || !L->counting) return;
    if (addr >= (uintptr_t)t->fib.stack_lo && addr < (uintptr_t)t->fib.stack_lo + t->fib.stack_bytes) return;
    cost::Space space;
    if (w->smem && addr >= (uintptr_t)w->smem && addr < (uintptr_t)w->smem + L->smem) {
        space = cost::SHARED;
    } else {
        static thread_local TlsRange tls;
        if (addr >= tls.lo && addr < tls.hi) {
            space = cost::SHARED;
        } else {
            const auto &g = L->global_ranges;
            auto it = std::upper_bound(g.begin(), g.end(), std::make_pair(addr, ~(uintptr_t)0));
            if (it == g.begin() || addr >= std::prev(it)->second) return;
            space = cost::GLOBAL;
        }
    }
    cost::access(w->tally, t->warp, t->lane, site, addr, size, write, space);
}

}  // namespace

void cost_pause(bool pause) { t_cost_paused = pause; }

/* The cost build compiles the kernel code with -fsanitize-coverage=trace-pc: every basic block starts
 * with this call; the running lane counts it (emu_cost.h, enter_bb). */
extern "C" void __sanitizer_cov_trace_pc(void) {
    Thread *t = t_cur;
    if (!t || t_cost_paused) return;
    Worker *w = t->w;
    if (!w->L || !w->L->counting) return;
    cost::enter_bb(w->tally, t->warp, t->lane, (uintptr_t)__builtin_return_address(0));
}

void cost_count(unsigned fp32_flops, unsigned mufu_ops) {
    Thread *t = t_cur;
    if (!t || !t->w->L || !t->w->L->counting) return;
    t->w->tally.c.fp32_flops += fp32_flops;
    t->w->tally.c.mufu_ops += mufu_ops;
}

/* called from the kernel's inlined atomicAdd: the return address is the atomic's own site */
__attribute__((noinline)) void cost_atomic(const void *address, unsigned bytes) {
    count_access((uintptr_t)__builtin_return_address(0), (uintptr_t)address, bytes, true);
}

#else

void cost_pause(bool) {}
void cost_count(unsigned, unsigned) {}
void cost_atomic(const void *, unsigned) {}

#endif


/* ---------------------------------------------------------------- workers and launches */

namespace {

void worker_begin(Worker *w, Launch *L, int nthreads) {
    w->L = L;
    w->fault = false;
    w->aborting = false;
    w->fault_msg.clear();
    while ((int)w->thr.size() < nthreads) {
        auto t = std::make_unique<Thread>();
        t->w = w;
        t->linear = (int)w->thr.size();
        t->warp = t->linear / 32;
        t->lane = t->linear % 32;
        fiber_create(&t->fib, t.get());
        w->thr.push_back(std::move(t));
    }
    w->nthreads = nthreads;
    w->ring.assign((size_t)nthreads, nullptr);
    w->scratch.assign((size_t)nthreads, nullptr);
    w->warps.assign((size_t)((nthreads + 31) / 32), Warp());
    /* the main fiber: this OS thread's own stack, looked up once per worker (for the main thread
     * pthread_getattr_np parses /proc/self/maps, which the sanitizers' shadow mappings make long: ~3 % of a
     * grid under ASan, 2026-11-29) */
    const void *lo = w->main.stack_lo;
    size_t sz = w->main.stack_bytes;
    pthread_attr_t attr;
    if (!lo && pthread_getattr_np(pthread_self(), &attr) == 0) {
        void *a = nullptr;
        pthread_attr_getstack(&attr, &a, &sz);
        lo = a;
        pthread_attr_destroy(&attr);
    }
    w->main = Fiber();
    w->main.stack_lo = lo;
    w->main.stack_bytes = sz;
#ifdef ASC_EMU_TSAN
    w->main.tsan = __tsan_get_current_fiber();
#endif
}

void run_block(Worker *w, long b) {
    Launch *L = w->L;
    const dim3 g = L->grid, bd = L->block;
    const uint3 bi = {(unsigned)(b % g.x), (unsigned)(b / g.x % g.y), (unsigned)(b / ((long)g.x * g.y))};
    w->block = b;
#ifdef ASC_EMU_COST
    const unsigned long long barriers_before = w->tally.c.barriers;
#endif
    w->rng = L->cfg.seed * 0x2545F4914F6CDD1DULL + L->id * 0x9E3779B97F4A7C15ULL + (unsigned long long)b;
    /* dynamic shared memory: exactly the launch's bytes, filled with 0xff (NaN as float or double)
     * so that a read of an element nothing wrote shows up */
    w->smem = nullptr;
    if (L->smem > 0) {
        void *p = nullptr;
        if (posix_memalign(&p, 128, L->smem) != 0) {
            fprintf(stderr, "cuda_emu: out of memory for shared memory\n");
            abort();
        }
        memset(p, 0xff, L->smem);
        w->smem = (unsigned char *)p;
    }
    for (auto &wp : w->warps) wp = Warp();
    for (int i = 0; i < w->nthreads; i++) {
        Thread *t = w->thr[(size_t)i].get();
        t->v.thread_idx = {(unsigned)(i % bd.x), (unsigned)(i / bd.x % bd.y), (unsigned)(i / (bd.x * bd.y))};
        t->v.block_idx = bi;
        t->v.block_dim = bd;
        t->v.grid_dim = g;
        t->v.dynamic_smem = w->smem;
        t->payload = t->result = 0;
        t->copies.clear(); /* copies a thread never waited for end with its block */
        t->groups = 0;
        w->warps[(size_t)t->warp].members |= 1u << t->lane;
    }
    w->bar_arrived = 0;
    w->nexited = 0;
    w->head = w->count = 0;
    Thread **all = w->scratch.data();
    for (int i = 0; i < w->nthreads; i++) all[i] = w->thr[(size_t)i].get();
    release_group(w, all, w->nthreads);
    tsan_release(&w->sync_start);
    Thread *first = pop(w);
    w->n_switches++;
    switch_to(&w->main, &first->fib, first);
    if (w->aborting) /* a fault: resume every fiber still inside the kernel so that it unwinds */
        for (int i = 0; i < w->nthreads; i++) {
            Thread *t = w->thr[(size_t)i].get();
            if (t->state != EXITED) switch_to(&w->main, &t->fib, t);
        }
    t_cur = nullptr;
    tsan_acquire(&w->sync_end);
#ifdef ASC_EMU_COST
    if (L->counting) {
        cost::close_all(w->tally);
        cost::end_block(w->tally);
        w->tally.c.max_block_barriers = std::max(w->tally.c.max_block_barriers, w->tally.c.barriers - barriers_before);
        w->tally.c.blocks++;
        w->tally.c.threads += (unsigned long long)w->nthreads;
    }
#endif
    free(w->smem);
    w->smem = nullptr;
    w->n_blocks++;
}

void run_worker(Worker *w, Launch *L) {
    const int nthreads = (int)(L->block.x * L->block.y * L->block.z);
    worker_begin(w, L, nthreads);
#ifdef ASC_EMU_COST
    if (L->counting) w->tally.begin((nthreads + 31) / 32);
#endif
    for (;;) {
        if (L->failed.load()) break;
        const long b = L->next.fetch_add(1);
        if (b >= L->nblocks) break;
        run_block(w, b);
        if (w->fault) {
            {
                std::lock_guard<std::mutex> lk(g_fault_mu);
                if (!g_sticky.load()) g_fault = w->fault_msg;
                g_sticky.store(true);
            }
            L->failed.store(true);
            break;
        }
    }
    w->L = nullptr;
    st_switches.fetch_add(w->n_switches);
    st_colls.fetch_add(w->n_colls);
    st_bars.fetch_add(w->n_bars);
    st_blocks.fetch_add(w->n_blocks);
    w->n_switches = w->n_colls = w->n_bars = w->n_blocks = 0;
}

/* Worker 0 is the launching thread; workers 1.. are pool threads that wait for launches. */
struct Pool {
    std::mutex mu;
    std::condition_variable cv_go, cv_done;
    std::vector<std::unique_ptr<Worker>> workers; /* [0] unused: the caller's worker is thread_local */
    std::vector<std::thread> threads;
    Launch *launch = nullptr;
    unsigned long long generation = 0;
    int busy = 0;
    int want = 0; /* pool threads taking part in the current launch */
};

/* never destroyed: the pool threads wait on its condition variable until the process ends */
Pool &g_pool = *new Pool;
std::mutex g_launch_mu; /* one launch at a time */
thread_local std::unique_ptr<Worker> t_worker;

void pool_main(int index) {
    Worker *w = g_pool.workers[(size_t)index].get();
    unsigned long long seen = 0;
    for (;;) {
        Launch *L;
        {
            std::unique_lock<std::mutex> lk(g_pool.mu);
            g_pool.cv_go.wait(lk, [&] { return g_pool.generation != seen; });
            seen = g_pool.generation;
            if (index > g_pool.want) continue;
            L = g_pool.launch;
        }
        run_worker(w, L);
        {
            std::lock_guard<std::mutex> lk(g_pool.mu);
            if (--g_pool.busy == 0) g_pool.cv_done.notify_all();
        }
    }
}

struct Attrs {
    std::mutex mu;
    std::unordered_map<const void *, int> max_dynamic_smem;
} g_attrs;

struct Allocs {
    std::mutex mu;
    std::unordered_map<void *, size_t> live;
} g_allocs;

#ifdef ASC_EMU_COST
/* The cost records of the launches since the last clear (emu_api.h). */
struct CostRecords {
    std::atomic<bool> on{false};
    std::mutex mu;
    std::vector<asc_emu_launch_cost> recs;
    std::vector<std::unique_ptr<std::string>> names; /* the records' strings */
    std::vector<std::unique_ptr<std::vector<asc_emu_bb_count>>> bbs; /* the records' basic blocks */
    std::vector<std::unique_ptr<std::vector<asc_emu_product_count>>> products; /* the records' product sites */

    /* one launch: the workers' tallies summed, distinct sectors over all of them */
    void finish(const void *kernel, const Launch &L, const std::vector<Worker *> &ws) {
        asc_emu_launch_cost r{};
        std::unordered_set<uint64_t> rd, wr;
        std::map<uintptr_t, unsigned long long> sites;
        std::map<std::pair<uintptr_t, int>, unsigned long long> psites;
        for (Worker *w : ws) {
            cost::add(r.c, w->tally.c);
            rd.insert(w->tally.sectors_read.begin(), w->tally.sectors_read.end());
            wr.insert(w->tally.sectors_written.begin(), w->tally.sectors_written.end());
            for (const auto &kv : w->tally.bb_warp_execs) sites[kv.first - cost::image_bias()] += kv.second;
            for (int k = 0; k < 2; k++)
                for (const auto &kv : w->tally.product_execs[k]) psites[{kv.first - cost::image_bias(), k}] += kv.second;
            w->tally.begin(0);
        }
        auto bb = std::make_unique<std::vector<asc_emu_bb_count>>();
        for (const auto &kv : sites) bb->push_back(asc_emu_bb_count{kv.first, kv.second});
        auto pr = std::make_unique<std::vector<asc_emu_product_count>>();
        for (const auto &kv : psites) pr->push_back(asc_emu_product_count{kv.first.first, kv.second, kv.first.second});
        r.c.gld_sectors_distinct = rd.size();
        r.c.gst_sectors_distinct = wr.size();
        r.grid[0] = L.grid.x, r.grid[1] = L.grid.y, r.grid[2] = L.grid.z;
        r.block[0] = L.block.x, r.block[1] = L.block.y, r.block[2] = L.block.z;
        r.smem = L.smem;
        const std::string sym = cost::function_symbol(kernel);
        std::lock_guard<std::mutex> lk(mu);
        names.push_back(std::make_unique<std::string>(sym));
        r.symbol = names.back()->c_str();
        names.push_back(std::make_unique<std::string>(sym.empty() ? "(unnamed kernel)" : cost::demangled(sym)));
        r.kernel = names.back()->c_str();
        r.nbbs = (int)bb->size();
        r.bbs = bb->data();
        bbs.push_back(std::move(bb));
        r.nproducts = (int)pr->size();
        r.products = pr->data();
        products.push_back(std::move(pr));
        recs.push_back(r);
    }
} g_cost;
#endif

}  // namespace

/* The dynamic shared memory a launch of `kernel` may ask for: 48 KiB, or more where cudaFuncSetAttribute opted in. */
static int max_dynamic_smem(const void *kernel) {
    std::lock_guard<std::mutex> lk(g_attrs.mu);
    auto it = g_attrs.max_dynamic_smem.find(kernel);
    return it != g_attrs.max_dynamic_smem.end() ? std::max(48 * 1024, it->second) : 48 * 1024;
}

cudaError_t set_func_attribute(const void *kernel, cudaFuncAttribute attr, int value) {
    if (g_sticky.load()) return record(cudaErrorLaunchFailure);
    if (!kernel) return record(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > config().smem_optin) return record(cudaErrorInvalidValue);
        std::lock_guard<std::mutex> lk(g_attrs.mu);
        g_attrs.max_dynamic_smem[kernel] = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return record(cudaErrorInvalidValue);
}

cudaError_t launch_grid(const void *kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        void (*body)(void *), void *ctx) {
    (void)stream; /* every launch runs to completion before it returns: stream order holds trivially */
    if (g_sticky.load()) return record(cudaErrorLaunchFailure);
    const Config cfg = config();
    const unsigned long long nthreads = (unsigned long long)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        nthreads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
        grid.z > 65535)
        return record(cudaErrorInvalidConfiguration);
    if (smem > (size_t)max_dynamic_smem(kernel)) return record(cudaErrorInvalidValue);

    std::lock_guard<std::mutex> one(g_launch_mu);
    Launch L;
    L.body = body;
    L.ctx = ctx;
    L.grid = grid;
    L.block = block;
    L.smem = smem;
    L.nblocks = (long)grid.x * grid.y * grid.z;
    L.id = st_launches.fetch_add(1);
    L.cfg = cfg;
#ifdef ASC_EMU_COST
    L.counting = g_cost.on.load();
    if (L.counting) {
        std::lock_guard<std::mutex> lk(g_allocs.mu);
        for (const auto &kv : g_allocs.live)
            L.global_ranges.emplace_back((uintptr_t)kv.first, (uintptr_t)kv.first + kv.second);
        std::sort(L.global_ranges.begin(), L.global_ranges.end());
    }
#endif
    const int helpers = (int)std::min<long>(cfg.workers, L.nblocks) - 1;
    if (helpers > 0) {
        std::lock_guard<std::mutex> lk(g_pool.mu);
        while ((int)g_pool.threads.size() < helpers) {
            const int index = (int)g_pool.threads.size() + 1;
            while ((int)g_pool.workers.size() <= index) g_pool.workers.push_back(std::make_unique<Worker>());
            g_pool.threads.emplace_back(pool_main, index);
            g_pool.threads.back().detach();
        }
        g_pool.launch = &L;
        g_pool.want = helpers;
        g_pool.busy = helpers;
        g_pool.generation++;
        g_pool.cv_go.notify_all();
    }
    if (!t_worker) t_worker = std::make_unique<Worker>();
    run_worker(t_worker.get(), &L);
    if (helpers > 0) {
        std::unique_lock<std::mutex> lk(g_pool.mu);
        g_pool.cv_done.wait(lk, [] { return g_pool.busy == 0; });
        g_pool.launch = nullptr;
    }
    if (L.failed.load()) {
        std::lock_guard<std::mutex> lk(g_fault_mu);
        fprintf(stderr, "%s\n", g_fault.c_str());
        return record(cudaErrorLaunchFailure);
    }
#ifdef ASC_EMU_COST
    if (L.counting) {
        std::vector<Worker *> ws{t_worker.get()};
        for (int i = 1; i <= helpers; i++) ws.push_back(g_pool.workers[(size_t)i].get());
        g_cost.finish(kernel, L, ws);
    }
#endif
    return cudaSuccess;
}

}  // namespace asc_emu

using namespace asc_emu;

/* ---------------------------------------------------------------- control API (emu_api.h) */

extern "C" const char *asc_emu_last_fault(void) {
    std::lock_guard<std::mutex> lk(g_fault_mu);
    static thread_local std::string copy;
    copy = g_fault;
    return copy.c_str();
}

extern "C" void asc_emu_reset(void) {
    std::lock_guard<std::mutex> lk(g_fault_mu);
    g_fault.clear();
    g_sticky.store(false);
    t_last_error = cudaSuccess;
}

extern "C" asc_emu_settings asc_emu_get_settings(void) {
    const Config c = config();
    return asc_emu_settings{c.order, c.seed, c.workers, c.smem_optin, c.sms};
}

extern "C" void asc_emu_set_sms(int sms) {
    config();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    g_cfg.sms = std::max(1, sms);
}

extern "C" void asc_emu_set_smem_optin(int bytes) {
    config();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    g_cfg.smem_optin = std::max(0, bytes);
}

extern "C" void asc_emu_set_order(int order, unsigned long long seed) {
    config();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    g_cfg.order = order;
    g_cfg.seed = seed;
}

extern "C" void asc_emu_set_workers(int workers) {
    config();
    std::lock_guard<std::mutex> lk(g_cfg_mu);
    g_cfg.workers = std::max(1, workers);
}

extern "C" asc_emu_stats asc_emu_get_stats(void) {
    return asc_emu_stats{st_launches.load(), st_blocks.load(), st_bars.load(), st_colls.load(), st_switches.load()};
}

extern "C" long long asc_emu_live_allocations(void) {
    std::lock_guard<std::mutex> lk(g_allocs.mu);
    return (long long)g_allocs.live.size();
}

/* ---------------------------------------------------------------- runtime API (host memory) */

namespace {

cudaError_t sticky() { return g_sticky.load() ? record(cudaErrorLaunchFailure) : cudaSuccess; }

cudaError_t emu_alloc(void **ptr, size_t size) {
    if (!ptr) return record(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (cudaError_t e = sticky()) return e;
    if (size == 0) return cudaSuccess;
    void *p = nullptr; /* aligned as cudaMalloc's (256 bytes): what a kernel's coalescing depends on */
    if (posix_memalign(&p, 256, size) != 0) return record(cudaErrorMemoryAllocation);
    memset(p, 0xff, size); /* device memory starts as garbage: NaN as float or double */
    std::lock_guard<std::mutex> lk(g_allocs.mu);
    g_allocs.live[p] = size;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t emu_free(void *ptr) {
    if (!ptr) return sticky();
    {
        std::lock_guard<std::mutex> lk(g_allocs.mu);
        auto it = g_allocs.live.find(ptr);
        if (it == g_allocs.live.end()) return record(cudaErrorInvalidValue);
        g_allocs.live.erase(it);
    }
    free(ptr);
    return sticky();
}

}  // namespace

extern "C" {

cudaError_t cudaMalloc(void **devPtr, size_t size) { return emu_alloc(devPtr, size); }
cudaError_t cudaFree(void *devPtr) { return emu_free(devPtr); }
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t) { return emu_alloc(devPtr, size); }
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t) { return emu_free(devPtr); }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind) {
    if (cudaError_t e = sticky()) return e;
    if (count) memcpy(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t) {
    return cudaMemcpy(dst, src, count, kind);
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    if (cudaError_t e = sticky()) return e;
    if (count) memset(devPtr, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t) {
    return cudaMemset(devPtr, value, count);
}

cudaError_t cudaGetLastError(void) {
    if (g_sticky.load()) return cudaErrorLaunchFailure;
    const cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return g_sticky.load() ? cudaErrorLaunchFailure : t_last_error; }

cudaError_t cudaDeviceSynchronize(void) { return sticky(); }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return sticky(); }

cudaError_t cudaGetDevice(int *device) {
    if (!device) return record(cudaErrorInvalidValue);
    *device = 0;
    return sticky();
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? sticky() : record(cudaErrorInvalidDevice); }

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return record(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (!value || device != 0) return record(cudaErrorInvalidValue);
    switch (attr) {
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = config().smem_optin; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
        case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = config().smem_optin + 1024; break;
        case cudaDevAttrReservedSharedMemoryPerBlock: *value = 1024; break;
        case cudaDevAttrWarpSize: *value = 32; break;
        case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
        case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
        case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *value = 65535; break;
        case cudaDevAttrMultiProcessorCount: *value = config().sms; break;
        case cudaDevAttrComputeCapabilityMajor: *value = 8; break;
        case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
        default: return record(cudaErrorInvalidValue);
    }
    return sticky();
}

/* The blocks of `func` an SM holds at once: the least of 32 blocks, 64 warps and the SM's shared memory (the opt-in
 * limit and 1 KiB, the runtime's reservation per block: an A100's 164 KiB, an H100's 228 KiB) over the block's
 * shared memory and that reservation; none where the dynamic bytes pass what the kernel may launch with (48 KiB or
 * its cudaFuncSetAttribute opt-in), as on a GPU. The registers and the kernel's static shared memory are not known
 * here: the static memory is taken as 1 KiB (common.cuh's STATIC_SMEM, the most any kernel here has: decode's 336
 * bytes), and a GPU holds fewer blocks where registers bind (decode's 96-128 registers a lane allow 16-21 one-warp
 * blocks an SM). */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func, int blockSize,
                                                           size_t dynamicSMemSize) {
    if (!numBlocks || !func || blockSize <= 0 || blockSize > 1024) return record(cudaErrorInvalidValue);
    if (dynamicSMemSize > (size_t)max_dynamic_smem(func)) {
        *numBlocks = 0;
        return sticky();
    }
    const long sm = (long)config().smem_optin + 1024, per_block = (long)dynamicSMemSize + 1024 + 1024;
    const long warps = (blockSize + 31) / 32;
    long n = std::min(32L, 64 / warps);
    n = std::min(n, sm / per_block);
    *numBlocks = (int)n;
    return sticky();
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    return set_func_attribute(func, attr, value);
}

const char *cudaGetErrorName(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
        case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
        default: return "cudaError (emulator: unnamed)";
    }
}

const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        case cudaErrorLaunchFailure: return "unspecified launch failure (emulator: see asc_emu_last_fault)";
        default: return "unknown error";
    }
}

}  // extern "C"

/* ---------------------------------------------------------------- cost counters: the kernels' accesses
 * The cost build compiles the kernels with -fsanitize=kernel-address and outlined checks: every load
 * and store of their code calls one of these with its address (no sanitizer runtime is linked). */

#ifdef ASC_EMU_COST
extern "C" {
#define ASC_EMU_ACCESS(N)                                                                                  \
    void __asan_load##N##_noabort(uintptr_t a) {                                                           \
        count_access((uintptr_t)__builtin_return_address(0), a, N, false);                                 \
    }                                                                                                      \
    void __asan_store##N##_noabort(uintptr_t a) { count_access((uintptr_t)__builtin_return_address(0), a, N, true); }
ASC_EMU_ACCESS(1)
ASC_EMU_ACCESS(2)
ASC_EMU_ACCESS(4)
ASC_EMU_ACCESS(8)
ASC_EMU_ACCESS(16)
#undef ASC_EMU_ACCESS
void __asan_loadN_noabort(uintptr_t a, size_t n) {
    count_access((uintptr_t)__builtin_return_address(0), a, (uint32_t)n, false);
}
void __asan_storeN_noabort(uintptr_t a, size_t n) {
    count_access((uintptr_t)__builtin_return_address(0), a, (uint32_t)n, true);
}
void __asan_handle_no_return(void) {}

int asc_emu_cost_enable(int on) {
    g_cost.on.store(on != 0);
    return 1;
}
int asc_emu_cost_count(void) {
    std::lock_guard<std::mutex> lk(g_cost.mu);
    return (int)g_cost.recs.size();
}
const asc_emu_launch_cost *asc_emu_cost_record(int i) {
    std::lock_guard<std::mutex> lk(g_cost.mu);
    return i >= 0 && i < (int)g_cost.recs.size() ? &g_cost.recs[(size_t)i] : nullptr;
}
void asc_emu_cost_clear(void) {
    std::lock_guard<std::mutex> lk(g_cost.mu);
    g_cost.recs.clear();
    g_cost.names.clear();
    g_cost.bbs.clear();
    g_cost.products.clear();
}
}
#else
extern "C" {
int asc_emu_cost_enable(int) { return 0; }
int asc_emu_cost_count(void) { return 0; }
const asc_emu_launch_cost *asc_emu_cost_record(int) { return nullptr; }
void asc_emu_cost_clear(void) {}
}
#endif
