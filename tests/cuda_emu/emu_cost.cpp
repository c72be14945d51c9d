/*
 * emu_cost.cpp -- the cost counters' bookkeeping (emu_cost.h): warp requests from lane accesses,
 * sectors and bank-conflict wavefronts, and the names of the kernels. Part of the runtime of the cost
 * build only (tests/cuda_emu/Makefile, build/cost).
 */
#include "emu_cost.h"

#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace asc_emu {
namespace cost {

void Tally::begin(int nwarps) {
    c = asc_emu_counters{};
    warps.assign((size_t)nwarps, WarpRequests());
    sectors_read.clear();
    sectors_written.clear();
    bb_warp_execs.clear();
    product_execs[0].clear();
    product_execs[1].clear();
}

void access(Tally &t, int warp, int lane, uintptr_t site, uintptr_t addr, uint32_t size, bool write, Space space) {
    WarpRequests &w = t.warps[(size_t)warp];
    LastAccess &last = w.last[lane];
    if (last.req && last.req->space == (uint8_t)space && last.req->write == (uint8_t)write) {
        Access &a = last.req->acc[last.index];
        const uintptr_t lo = std::min(a.addr, addr), hi = std::max(a.addr + a.size, addr + size);
        const bool adjacent = addr == a.addr + a.size || addr + size == a.addr;
        if (adjacent && hi - lo <= 16 && lo / 16 == (hi - 1) / 16) { /* one vector access on the GPU */
            a.addr = lo;
            a.size = (uint32_t)(hi - lo);
            return;
        }
    }
    const uint32_t occurrence = ++w.occurrences[lane][site];
    Request &r = w.open[SiteKey{site, occurrence}];
    if (r.acc.empty()) {
        r.space = (uint8_t)space;
        r.write = write;
    }
    r.acc.push_back(Access{addr, size, (uint8_t)lane});
    last.req = &r;
    last.index = r.acc.size() - 1;
}

namespace {

/* The bytes of the union of the accesses' ranges. */
uint64_t distinct_bytes(std::vector<Access> &acc) {
    std::sort(acc.begin(), acc.end(), [](const Access &a, const Access &b) { return a.addr < b.addr; });
    uint64_t bytes = 0;
    uintptr_t end = 0;
    for (const Access &a : acc) {
        const uintptr_t lo = std::max(a.addr, end), hi = a.addr + a.size;
        if (hi > lo) bytes += hi - lo;
        end = std::max(end, hi);
    }
    return bytes;
}

void close_global(Tally &t, Request &r) {
    std::vector<uint64_t> sectors;
    for (const Access &a : r.acc)
        for (uint64_t s = a.addr >> 5; s <= (a.addr + a.size - 1) >> 5; s++) sectors.push_back(s);
    std::sort(sectors.begin(), sectors.end());
    sectors.erase(std::unique(sectors.begin(), sectors.end()), sectors.end());
    const uint64_t bytes = distinct_bytes(r.acc);
    auto &seen = r.write ? t.sectors_written : t.sectors_read;
    seen.insert(sectors.begin(), sectors.end());
    if (r.write) {
        t.c.gst_requests++;
        t.c.gst_sectors += sectors.size();
        t.c.gst_bytes += bytes;
    } else {
        t.c.gld_requests++;
        t.c.gld_sectors += sectors.size();
        t.c.gld_bytes += bytes;
    }
}

/* Wavefronts of a shared-memory request: per phase (32 lanes for accesses up to 4 bytes, 16 for 8, 8
 * for 16), the most distinct 4-byte words one bank holds (a word read by several lanes is broadcast);
 * ideal: the phase's distinct bytes over 128 (32 banks x 4 bytes), at least 1. */
void close_shared(Tally &t, Request &r) {
    uint32_t widest = 0;
    for (const Access &a : r.acc) widest = std::max(widest, a.size);
    const int lanes_per_phase = widest <= 4 ? 32 : widest <= 8 ? 16 : 8;
    uint64_t wavefronts = 0, ideal = 0;
    for (int p0 = 0; p0 < 32; p0 += lanes_per_phase) {
        std::vector<Access> phase;
        for (const Access &a : r.acc)
            if (a.lane >= p0 && a.lane < p0 + lanes_per_phase) phase.push_back(a);
        if (phase.empty()) continue;
        std::vector<uint64_t> words;
        for (const Access &a : phase)
            for (uint64_t w = a.addr >> 2; w <= (a.addr + a.size - 1) >> 2; w++) words.push_back(w);
        std::sort(words.begin(), words.end());
        words.erase(std::unique(words.begin(), words.end()), words.end());
        uint32_t per_bank[32] = {};
        uint32_t most = 0;
        for (uint64_t w : words) most = std::max(most, ++per_bank[w % 32]);
        wavefronts += most;
        ideal += std::max<uint64_t>(1, (distinct_bytes(phase) + 127) / 128);
    }
    if (r.write) {
        t.c.sts_requests++;
        t.c.sts_wavefronts += wavefronts;
        t.c.sts_ideal += ideal;
    } else {
        t.c.lds_requests++;
        t.c.lds_wavefronts += wavefronts;
        t.c.lds_ideal += ideal;
    }
}

/* The epoch of warp w ends: each touched basic block's busiest lane adds to the warp's executions. */
void close_epoch(WarpRequests &w) {
    for (BlockExecs *b : w.bb_touched) {
        uint32_t most = 0;
        for (uint32_t &n : b->lane) {
            most = std::max(most, n);
            n = 0;
        }
        b->warp += most;
        b->touched = false;
    }
    w.bb_touched.clear();
}

}  // namespace

void close_warp(Tally &t, int warp) {
    WarpRequests &w = t.warps[(size_t)warp];
    close_epoch(w);
    if (w.open.empty()) return;
    for (auto &kv : w.open) {
        if (kv.second.space == GLOBAL) close_global(t, kv.second);
        else close_shared(t, kv.second);
    }
    w.open.clear();
    for (auto &o : w.occurrences) o.clear();
    for (auto &l : w.last) l = LastAccess();
}

void close_all(Tally &t) {
    for (size_t w = 0; w < t.warps.size(); w++) close_warp(t, (int)w);
}

void end_block(Tally &t) {
    for (WarpRequests &w : t.warps) {
        close_epoch(w);
        for (const auto &kv : w.bb) t.bb_warp_execs[kv.first] += kv.second.warp;
        w.bb.clear();
    }
}

void add(asc_emu_counters &a, const asc_emu_counters &b) {
    const unsigned long long longest = std::max(a.max_block_barriers, b.max_block_barriers);
    const unsigned long long *pb = reinterpret_cast<const unsigned long long *>(&b);
    unsigned long long *pa = reinterpret_cast<unsigned long long *>(&a);
    for (size_t i = 0; i < sizeof(asc_emu_counters) / sizeof(unsigned long long); i++) pa[i] += pb[i];
    a.max_block_barriers = longest; /* a maximum, not a sum */
}

/* ---------------------------------------------------------------- kernel names */

namespace {

/* The executable's function symbols by address (its .symtab: static and template functions too). */
struct Symbols {
    std::map<uintptr_t, std::string> by_addr;
    uintptr_t bias = 0;
    Symbols() {
        const int fd = open("/proc/self/exe", O_RDONLY);
        if (fd < 0) return;
        struct stat st;
        if (fstat(fd, &st) != 0) {
            close(fd);
            return;
        }
        void *m = mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (m == MAP_FAILED) return;
        const unsigned char *base = static_cast<const unsigned char *>(m);
        const Elf64_Ehdr *eh = reinterpret_cast<const Elf64_Ehdr *>(base);
        const Elf64_Shdr *sh = reinterpret_cast<const Elf64_Shdr *>(base + eh->e_shoff);
        for (int i = 0; i < eh->e_shnum; i++) {
            if (sh[i].sh_type != SHT_SYMTAB) continue;
            const Elf64_Sym *sym = reinterpret_cast<const Elf64_Sym *>(base + sh[i].sh_offset);
            const char *names = reinterpret_cast<const char *>(base + sh[sh[i].sh_link].sh_offset);
            for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); k++)
                if (ELF64_ST_TYPE(sym[k].st_info) == STT_FUNC && sym[k].st_value)
                    by_addr[(uintptr_t)sym[k].st_value] = names + sym[k].st_name;
        }
        /* a position-independent executable is loaded at a bias: find it from a known function */
        const auto self = by_addr.end();
        for (auto it = by_addr.begin(); it != self; ++it)
            if (it->second == "asc_emu_cost_enable") {
                bias = (uintptr_t)(void *)&asc_emu_cost_enable - it->first;
                break;
            }
        munmap(m, (size_t)st.st_size);
    }
};

}  // namespace

namespace {
Symbols &symbols() {
    static Symbols *syms = new Symbols; /* built at the first use, never freed */
    return *syms;
}
}  // namespace

uintptr_t image_bias() {
    static const uintptr_t bias = symbols().bias;
    return bias;
}

std::string function_symbol(const void *fn) {
    Symbols *syms = &symbols();
    static std::mutex mu;
    std::lock_guard<std::mutex> lk(mu);
    const auto it = syms->by_addr.find((uintptr_t)fn - syms->bias);
    return it == syms->by_addr.end() ? std::string() : it->second;
}

std::string demangled(const std::string &symbol) {
    int status = 0;
    char *d = abi::__cxa_demangle(symbol.c_str(), nullptr, nullptr, &status);
    std::string name = status == 0 && d ? d : symbol;
    free(d);
    return name;
}

}  // namespace cost
}  // namespace asc_emu
