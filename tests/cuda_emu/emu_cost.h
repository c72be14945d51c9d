/*
 * emu_cost.h -- what a kernel launch would cost a GPU, counted by the emulator (the cost build only,
 * ASC_EMU_COST; docs/cuda.md, "The cost model"). Internal to the runtime (cuda_emu.cpp calls it; the
 * kernels know nothing of it).
 *
 * Memory accesses arrive one lane at a time (the instrumentation of the kernels' loads and stores,
 * cuda_emu.cpp). The host compiler may split what nvcc issues as one vector access (a float4 read as
 * four 4-byte loads): an access that continues the same lane's previous one in the same space and
 * direction, inside one aligned 16-byte chunk, extends it instead of starting a new instruction. The lanes of a warp run one after another between two synchronization points of the
 * warp, so the k-th execution of an instruction by each lane is one execution of that instruction by
 * the warp: accesses are grouped into warp requests by (instruction address, occurrence count in the
 * lane) and a group is closed when the warp synchronizes (a warp collective or a block barrier
 * completes, the block ends). A closed global request costs its distinct 32-byte sectors; a shared one
 * its wavefronts: per phase of the request (the whole warp for accesses up to 4 bytes, half-warps for
 * 8, quarter-warps for 16 bytes -- an ldmatrix row is 16 bytes, one matrix per phase), the largest
 * number of distinct 4-byte words any of the 32 banks must deliver.
 */
#ifndef ASC_EMU_COST_H
#define ASC_EMU_COST_H

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "emu_api.h"

namespace asc_emu {
namespace cost {

enum Space { GLOBAL = 0, SHARED = 1 };

/* One lane's access: the bytes [addr, addr + size). */
struct Access {
    uintptr_t addr;
    uint32_t size;
    uint8_t lane;
};

struct Request {
    uint8_t space = 0, write = 0;
    std::vector<Access> acc;
};

struct SiteKey {
    uintptr_t site;
    uint32_t occurrence;
    bool operator==(const SiteKey &o) const { return site == o.site && occurrence == o.occurrence; }
};
struct SiteKeyHash {
    size_t operator()(const SiteKey &k) const {
        return (size_t)(k.site * 0x9E3779B97F4A7C15ull ^ (uint64_t)k.occurrence * 0xC2B2AE3D27D4EB4Full);
    }
};

/* A lane's last access, which the next one may extend (see access()). */
struct LastAccess {
    Request *req = nullptr;
    size_t index = 0; /* in req->acc */
};

/* One basic block's executions by a warp: per lane in the current epoch (since the warp's last
 * synchronization), and the warp's executions of the epochs closed. */
struct BlockExecs {
    uint32_t lane[32] = {};
    bool touched = false;
    unsigned long long warp = 0;
};

/* The open requests of one warp. */
struct WarpRequests {
    std::unordered_map<uintptr_t, uint32_t> occurrences[32]; /* per lane: executions of each instruction */
    std::unordered_map<SiteKey, Request, SiteKeyHash> open;  /* node-based: Request pointers stay valid */
    LastAccess last[32];
    /* executions of each basic block of the kernel code (its -fsanitize-coverage=trace-pc call's return
     * address): per lane since the warp last synchronized, and the warp's total of the epochs before */
    std::unordered_map<uintptr_t, BlockExecs> bb;
    std::vector<BlockExecs *> bb_touched; /* the blocks with lane counts in this epoch (node-based map) */
};

/* The counts of one worker during one launch (summed over the workers at its end). */
struct Tally {
    asc_emu_counters c{};
    std::vector<WarpRequests> warps;
    std::unordered_set<uint64_t> sectors_read, sectors_written; /* distinct over the launch */
    /* warp executions of each basic block over the launch: per warp, the most executions of a lane */
    std::unordered_map<uintptr_t, unsigned long long> bb_warp_execs;
    /* warp mma (index 0) and ldmatrix (1) instructions per call site (the return address of the call) */
    std::unordered_map<uintptr_t, unsigned long long> product_execs[2];
    void begin(int nwarps);
};

/* An access of `lane` of warp `warp`, by the instruction at `site`. */
void access(Tally &t, int warp, int lane, uintptr_t site, uintptr_t addr, uint32_t size, bool write, Space space);
/* The warp synchronized: its requests are complete. */
void close_warp(Tally &t, int warp);
void close_all(Tally &t);
/* A basic block of the kernel code starts on `lane` of `warp`. Between two synchronizations of the warp (an
 * epoch), the warp executes a basic block as often as its busiest lane (the lanes that skip it are predicated
 * off or wait at the divergent branch's join); the epochs add up, so that lanes taking turns between
 * __syncwarp's (a quad's lanes, one after another) cost the warp every turn. close_warp ends an epoch; the
 * block of threads ended (end_block): the warp executions go to the launch's. */
inline void enter_bb(Tally &t, int warp, int lane, uintptr_t site) {
    WarpRequests &w = t.warps[(size_t)warp];
    BlockExecs &b = w.bb[site];
    if (!b.touched) {
        b.touched = true;
        w.bb_touched.push_back(&b);
    }
    ++b.lane[lane];
}
void end_block(Tally &t);
/* Adds b into a (the distinct-sector counts are set by finish). */
void add(asc_emu_counters &a, const asc_emu_counters &b);

/* The (mangled) name of the function at `fn` (a kernel) in the executable's symbol table, "" if none;
 * and a mangled name demangled (itself if it is not one). */
std::string function_symbol(const void *fn);
/* The load bias of the (position-independent) executable: an address minus it is its address in the file. */
uintptr_t image_bias();
std::string demangled(const std::string &symbol);

}  // namespace cost
}  // namespace asc_emu

#endif /* ASC_EMU_COST_H */
