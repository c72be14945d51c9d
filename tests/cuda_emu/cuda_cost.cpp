/*
 * cuda_cost.cpp -- `make cuda-cost`: what the CUDA kernels' launches would cost an H100, from the
 * emulator's counters (emu_cost.h) and the compiler's resource report; docs/cuda.md, "The cost model".
 *
 * The benchmark's problem (bench_cuda.py: N = 4096, B*H = 16, d = dv = 64, dz = da = 32, k = 16,
 * bfloat16, no mask) is too large to emulate, so each variant runs the forward and the backward
 * launchers at three smaller N (--sizes, default 192 384 576) with B*H = --heads (default 1): every
 * counter of every launch is fitted by the quadratic in N through the three points (exact for counts
 * that are polynomials of degree <= 2 in N, as pair work is without a mask when N is a multiple of the
 * kernels' tiles: the default sizes are multiples of 192, the least common multiple of the row blocks, 64
 * and B2r's 48, and the key tiles, 32) and evaluated at --target-n, then scaled linearly to --target-bh
 * (the grid's (b, h) dimension). Per launch the table gives the counts, the occupancy from registers and shared memory
 * (nvcc -Xptxas -v for sm_90, --ptxas FILE) and a roofline time: the largest of
 *   memory    (global sectors read + written) x 32 B / 3.0 TB/s
 *   tensor    mma FLOPs / 790 TFLOP/s
 *   fp32      declared FP32 FLOPs / 66.9 TFLOP/s
 *   mufu      special-function operations / 4.18 T/s
 *   shared    shared-memory wavefronts / (132 SMs x 1 per clock x SM clock)
 *   issue     warp instructions / (132 SMs x min(4, 0.141 x resident warps per SM) per clock x SM clock)
 *             (a grid short of one wave: the warps of the blocks on one busy SM, the time of those SMs),
 *             the instructions estimated by tools/sass_icount.py from the SASS and this run's basic-block
 *             counts (--bbs FILE writes them, --icount FILE reads the estimate back; `make cuda-cost`
 *             runs the three steps), the issue rate per warp measured on the GPU (Gpu::issue_per_warp)
 * times the wave quantization ceil(w) / w of w = blocks / (132 x blocks per SM); and no less than
 *   longest block  the mean block's warp instructions x its most barriers over the mean block's, at the
 *             issue rate of that one block's warps (a launch ends no sooner than its longest block). The rates and their
 * sources are in the table H100 below. It ends with the line
 *   estimated H100 fwd+bwd at N=4096, B*H=16, bf16: <x> ms
 * for the last variant listed (default: paper, then seed).
 *
 *   cuda_cost [--sizes N1 N2 N3] [--heads H] [--variant seed|paper]... [--causal] [--window L R G] [--dims D DV DZ DA]
 *             [--decode] [--ptxas FILE] [--target-n N] [--target-bh BH] [--bbs FILE] [--icount FILE] [--clock GHZ] [--raw]
 * (--dims: the feature sizes d, dv, dz, da instead of the benchmark's 64 64 32 32, e.g. 128 128 32 32 for the
 * head size of most large language models; the shared memory per block, and with it the occupancy, follow)
 * (--decode: the inference call of one query row, bench_cuda.py's decode scenario, alone (the decode kernels: no
 * backward); its chunks depend on N and B*H, so it runs at the target itself: --sizes N --heads BH --target-n N
 * --target-bh BH, e.g. 16384 and 8; it ends with "estimated H100 decode at ..." per variant)
 * (--causal: is_causal with mask_stats, the causal training call, instead of the benchmark's full attention;
 * --window L R G: window_size = (L, R) and the first G tokens global, bench_cuda.py's window scenario with
 * 256 0 16 at --target-n 65536, fitted from sizes past the window where the global rows already split over key
 * chunks (from 48 key tiles: --sizes 1536 2304 3072; fwd_tiled.cuh, long_row_tiles); a block that outlasts the
 * rest, such as B2c's key tile of the global keys, shows in the longest-block term)
 * (--clock: the SM clock the clock-bound rates assume; default 1.80, the clock ncu read under these kernels on
 * the H200 of 2026-11-29 (1.76 in the runs of 2026-11-26); the datasheet's boost is 1.98)
 */
#include <cxxabi.h>

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "compare.h"
#include "cuda/ascender_cuda.h"
#include "emu_api.h"

#define _Static_assert static_assert
extern "C" {
#include "../c/harness.h"
}
#undef _Static_assert

namespace {

/* ---------------------------------------------------------------- the GPU */

/* H100 SXM5 (the GPU of the first lent session, docs/cuda.md "GPU runs") */
struct Gpu {
    double sms = 132;             /* multiprocessors (torch.cuda, that session) */
    double clock = 1.98e9;        /* Hz: boost clock of the datasheet, which the rates below assume */
    double dram = 3.0e12;         /* B/s: device-to-device copy measured on this workplace's H100
                                   * (.library/device/KINDS.md, bytes read + written; datasheet 3.35) */
    double tensor = 790e12;       /* dense bf16 FLOP/s: the issue's figure (cuBLAS 8192^3 measured 798 on
                                   * that H100, KINDS.md; mma.sync may reach less than wgmma there) */
    double fp32 = 66.9e12;        /* FLOP/s: 132 SMs x 128 FP32 lanes x 2 (FMA) x 1.98 GHz (datasheet 67) */
    double mufu = 132 * 16 * 1.98e9; /* special-function results per second: 16 per clock per SM (CUDA C++
                                      * Programming Guide, arithmetic instruction throughput, cc 9.0) */
    double smem_wavefronts = 132 * 1.98e9; /* one shared-memory wavefront (128 B) per clock per SM */
    /* warp instructions issued per clock per SM: at most 4 (one per scheduler), otherwise 0.141 per
     * resident warp: at 8 warps per SM (two blocks of four) ncu measured fwd_kernel_tc<bf16> 1.270e9 in
     * 8.353e6 cycles on 132 SMs (0.144 per warp), b2c_kernel 2.108e9 in 14.38e6 (0.139), b1_kernel 1.011e9
     * in 6.818e6 (0.140) (H200, 2026-11-29, the tree of 3f62674). Before: 0.161 from the forward of
     * f542306 (4.094e9 in 24.02e6 cycles, 2026-11-26), when index arithmetic filled the gaps that the mma
     * chains leave now; b1_kernel then, at 4 warps per SM: 0.173 per warp */
    double issue_per_warp = 0.141, issue_max = 4;
    static constexpr double MEASURED_CLOCK = 1.80e9; /* Hz: ncu's SM clock under these kernels (H200) */
    void set_clock(double hz) {
        fp32 *= hz / clock;
        mufu *= hz / clock;
        smem_wavefronts *= hz / clock;
        clock = hz;
    }
    /* occupancy limits of compute capability 9.0 (CUDA C++ Programming Guide, "Technical
     * Specifications per Compute Capability") */
    int max_threads = 2048, max_blocks = 32, regs = 65536, reg_unit = 256; /* registers per warp, rounded */
    long smem = 233472, smem_reserved = 1024; /* shared memory per SM; reserved per block */
};

/* ---------------------------------------------------------------- ptxas -v */

struct Resources {
    int regs = 0;
    long smem = 0, stack = 0, spill_stores = 0, spill_loads = 0;
};

/* `nvcc -Xptxas -v` output for sm_90: per entry function (mangled) its registers, static shared memory,
 * stack frame and spills. */
std::map<std::string, Resources> read_ptxas(const char *path) {
    std::map<std::string, Resources> out;
    FILE *f = path ? fopen(path, "r") : nullptr;
    if (!f) return out;
    char line[4096];
    std::string fn;
    bool sm90 = false;
    while (fgets(line, sizeof(line), f)) {
        const char *p;
        if ((p = strstr(line, "Compiling entry function '"))) {
            p += strlen("Compiling entry function '");
            const char *e = strchr(p, '\'');
            fn = e ? std::string(p, e) : std::string();
            sm90 = strstr(line, "for 'sm_90") != nullptr;
        } else if ((p = strstr(line, "Function properties for "))) {
            std::string name = p + strlen("Function properties for ");
            while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
            fn = name;
        } else if (!fn.empty() && (p = strstr(line, "bytes stack frame"))) {
            Resources &r = out[fn];
            sscanf(line, " %ld bytes stack frame, %ld bytes spill stores, %ld bytes spill loads", &r.stack,
                   &r.spill_stores, &r.spill_loads);
        } else if (!fn.empty() && sm90 && (p = strstr(line, "Used "))) {
            Resources &r = out[fn];
            sscanf(p, "Used %d registers", &r.regs);
            if (const char *q = strstr(p, "bytes smem")) {
                while (q > p && q[-1] == ' ') q--;
                while (q > p && (q[-1] >= '0' && q[-1] <= '9')) q--;
                r.smem = atol(q);
            }
        }
    }
    fclose(f);
    return out;
}

/* A demangled name without what only internal linkage adds ("(anonymous namespace)::"). */
std::string plain_name(const std::string &symbol) {
    int status = 0;
    char *d = abi::__cxa_demangle(symbol.c_str(), nullptr, nullptr, &status);
    std::string n = status == 0 && d ? d : symbol;
    free(d);
    for (size_t at; (at = n.find("(anonymous namespace)::")) != std::string::npos;) n.erase(at, 23);
    return n;
}

/* the resources of a kernel by its (g++) symbol: nvcc mangles it the same way (Itanium ABI), except
 * that it may decorate a name of internal linkage; then by the demangled names */
const Resources *find_resources(const std::map<std::string, Resources> &res, const std::string &sym) {
    const auto it = res.find(sym);
    if (it != res.end()) return &it->second;
    const std::string want = plain_name(sym);
    for (const auto &kv : res)
        if (plain_name(kv.first) == want) return &kv.second;
    return nullptr;
}

/* ---------------------------------------------------------------- running the launchers */

constexpr int NCOUNT = (int)(sizeof(asc_emu_counters) / sizeof(unsigned long long));

/* tools/sass_icount.py's estimate of a launch at the target shape: its warp instructions (anchored: the
 * blocks holding HMMA / LDSM scaled to the exact mma and ldmatrix counts), and before the anchor its HMMA,
 * its LDSM and its total (-1: not given), which the report sets beside the exact counts. */
struct IcountEstimate {
    double insts = -1, hmma = -1, ldsm = -1, raw = -1;
};

struct Launch {
    std::string kernel, symbol;
    unsigned threads = 0;
    double smem = 0;
    double c[NCOUNT] = {}; /* the counters, as doubles (fitted and scaled later) */
    IcountEstimate icount; /* at the target, from --icount (-1: not estimated) */
    std::vector<asc_emu_bb_count> bbs; /* warp executions of the kernel code's basic blocks */
    std::vector<asc_emu_product_count> products; /* warp mma and ldmatrix instructions per call site */
};

std::vector<Launch> take_records() {
    std::vector<Launch> out;
    for (int i = 0; i < asc_emu_cost_count(); i++) {
        const asc_emu_launch_cost *r = asc_emu_cost_record(i);
        Launch l;
        l.kernel = r->kernel;
        l.symbol = r->symbol;
        l.threads = r->block[0] * r->block[1] * r->block[2];
        l.smem = (double)r->smem;
        const unsigned long long *c = reinterpret_cast<const unsigned long long *>(&r->c);
        for (int k = 0; k < NCOUNT; k++) l.c[k] = (double)c[k];
        l.bbs.assign(r->bbs, r->bbs + r->nbbs);
        l.products.assign(r->products, r->products + r->nproducts);
        out.push_back(l);
    }
    asc_emu_cost_clear();
    return out;
}

/* The forward and the backward launchers at the benchmark's feature sizes, bf16: their launches; with decode, the
 * inference call of one query row (ascender_cuda_infer: the decode kernels) alone. */
struct Shape {
    bool causal = false, decode = false;
    int64_t wl = -1, wr = -1, global = 0; /* --window */
    int64_t d = 64, dv = 64, dz = 32, da = 32; /* --dims */
    bool other_dims() const { return d != 64 || dv != 64 || dz != 32 || da != 32; }
};

void run(int variant, const Shape &sh, int64_t N, int64_t H, std::vector<Launch> *fwd, std::vector<Launch> *bwd) {
    asc_params p;
    memset(&p, 0, sizeof(p));
    p.B = 1; p.H = H; p.N = N; p.Nq = sh.decode ? 1 : N;
    p.d = sh.d; p.dv = sh.dv; p.dz = sh.dz; p.da = sh.da;
    p.variant = variant;
    p.k_neighbors = 16;
    p.mask_stats = 1;
    p.is_causal = sh.causal;
    p.window_left = sh.wl;
    p.window_right = sh.wr;
    p.n_global = sh.global;
    p.neighbours = ASC_NEIGHBOURS_SEMANTIC;
    rng r = rng_splitmix(0xC057 + (uint64_t)N, 0);
    draw_hyper(&p, 1, &r);
    double *x[NIN], *sc[NSC];
    draw_inputs(&p, 0.5, &r, x);
    draw_head_scalars(&p, 1, &r, sc);
    const size_t rows = (size_t)(p.B * p.H * p.Nq);
    DevBuf dx[NIN], dsc[NSC];
    void *xp[NIN], *sp[NSC];
    for (int t = 0; t < NIN; t++) {
        dx[t] = upload(DT_BF16, std::vector<double>(x[t], x[t] + input_count(&p, t)));
        xp[t] = dx[t].p;
        free(x[t]);
    }
    for (int s = 0; s < NSC; s++) {
        dsc[s] = upload(DT_BF16, std::vector<double>(sc[s], sc[s] + p.H));
        sp[s] = dsc[s].p;
        free(sc[s]);
    }
    DevBuf out(rows * p.dv * 2), stats(rows * ASC_NSTAT * 2), u(rows * p.d * 2), c(rows * p.dz * 2),
        nbr(rows * (size_t)std::max<int64_t>(p.n_nbr, 1) * 8), rows32(rows * (size_t)ASC_ROWS32_WIDTH(&p) * 4);
    asc_fwd_args a = fwd_inputs(xp, sp, nullptr, nullptr);
    a.out = out.p; a.stats = stats.p; a.u = u.p; a.c = c.p; a.nbr = (int64_t *)nbr.p;
    a.rows32 = (float *)rows32.p; /* as the binding passes it: the backward reads it */
    asc_emu_cost_clear();
    asc_emu_cost_enable(1);
    int rc = sh.decode ? ascender_cuda_infer(&p, &a, ASC_CUDA_BF16, nullptr) : ascender_cuda_fwd(&p, &a, ASC_CUDA_BF16, nullptr);
    asc_emu_cost_enable(0);
    if (rc != 0) {
        fprintf(stderr, "cuda_cost: the forward failed (%d) at N = %lld\n", rc, (long long)N);
        exit(2);
    }
    *fwd = take_records();
    if (sh.decode) {
        bwd->clear();
        return;
    }

    std::vector<double> gout(rows * p.dv);
    for (double &g : gout) g = rng_unif(&r, -1, 1);
    DevBuf go = upload(DT_BF16, gout), g[NIN], gs(NSC * p.H * 2);
    for (int t = 0; t < NIN; t++) g[t] = DevBuf(input_count(&p, t) * 2);
    asc_bwd_args ba;
    memset(&ba, 0, sizeof(ba));
    ba.in = a;
    ba.grad_out = go.p;
    ba.dq = g[0].p; ba.dk = g[1].p; ba.dv = g[2].p; ba.dz = g[3].p; ba.dh = g[4].p;
    ba.dscalars = gs.p;
    asc_emu_cost_enable(1);
    rc = ascender_cuda_bwd(&p, &ba, ASC_CUDA_BF16, nullptr);
    asc_emu_cost_enable(0);
    if (rc != 0) {
        fprintf(stderr, "cuda_cost: the backward failed (%d) at N = %lld\n", rc, (long long)N);
        exit(2);
    }
    *bwd = take_records();
}

/* Launch l's counter `name` */
#define CNT(name) l.c[offsetof(asc_emu_counters, name) / sizeof(unsigned long long)]

/* A launch's warp-level mma instructions (every shape and type) and ldmatrix instructions: exact counts, the
 * anchors of the instruction estimate (HMMA and LDSM in the SASS). */
double mma_instructions(const Launch &l) { return CNT(mma_bf16) + CNT(mma_f16) + CNT(mma_tf32); }
double ldmatrix_instructions(const Launch &l) { return CNT(ldmatrix); }

/* Every launch's basic-block executions, for tools/sass_icount.py: a line "launch VARIANT CALL INDEX N BH
 * SYMBOL", a line "exact MMA LDMATRIX" (the launch's mma and ldmatrix instructions), one "product HMMA|LDSM
 * SITE WARP_EXECS" per call site of an mma or ldmatrix (the return address of the call), then one
 * "SITE WARP_EXECS" per basic block (SITE in hex, an address in the executable's file). */
void write_bbs(FILE *f, const char *variant, const char *call, const std::vector<Launch> &ls, double n, double bh) {
    for (size_t i = 0; i < ls.size(); i++) {
        fprintf(f, "launch %s %s %zu %.0f %.0f %s\n", variant, call, i, n, bh, ls[i].symbol.c_str());
        fprintf(f, "exact %.0f %.0f\n", mma_instructions(ls[i]), ldmatrix_instructions(ls[i]));
        for (const asc_emu_product_count &s : ls[i].products)
            fprintf(f, "product %s %llx %llu\n", s.ldmatrix ? "LDSM" : "HMMA", s.site, s.warp_execs);
        for (const asc_emu_bb_count &b : ls[i].bbs) fprintf(f, "%llx %llu\n", b.site, b.warp_execs);
    }
}

/* "icount VARIANT CALL INDEX WARP_INSTRUCTIONS SYMBOL [HMMA LDSM [RAW]]" per launch, and lines starting with '#',
 * which the report repeats (why there is no estimate, say). */
std::map<std::string, IcountEstimate> read_icount(const char *path, std::vector<std::string> *notes) {
    std::map<std::string, IcountEstimate> out;
    FILE *f = path ? fopen(path, "r") : nullptr;
    if (!f) {
        if (path) notes->push_back(std::string("cannot read ") + path);
        return out;
    }
    char line[4096], variant[32], call[32];
    int index;
    IcountEstimate v;
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#') {
            std::string n = line + 1;
            while (!n.empty() && (n.back() == '\n' || n.back() == ' ')) n.pop_back();
            notes->push_back(n);
        } else if (sscanf(line, "icount %31s %31s %d %lf %*s %lf %lf %lf", variant, call, &index, &v.insts, &v.hmma,
                          &v.ldsm, &v.raw) >= 4) {
            out[std::string(variant) + " " + call + " " + std::to_string(index)] = v;
            v = IcountEstimate{};
        }
    }
    fclose(f);
    return out;
}

/* The quadratic through (n[i], y[i]), i < 3, at t (Lagrange); with fewer points, the polynomial through them. */
double extrapolate(const double *n, const double *y, int k, double t) {
    double s = 0;
    for (int i = 0; i < k; i++) {
        double w = y[i];
        for (int j = 0; j < k; j++)
            if (j != i) w *= (t - n[j]) / (n[i] - n[j]);
        s += w;
    }
    return s;
}

/* Per launch index: the counters at the target (N, B*H), from the runs at sizes[]. */
std::vector<Launch> fit(const std::vector<std::vector<Launch>> &runs, const std::vector<double> &sizes, double heads,
                        double target_n, double target_bh, const char *what) {
    const std::vector<Launch> &last = runs.back();
    for (const auto &rs : runs)
        if (rs.size() != last.size()) {
            fprintf(stderr, "cuda_cost: the %s launches a different number of kernels at different N (%zu, %zu)\n",
                    what, rs.size(), last.size());
            exit(2);
        }
    std::vector<Launch> out = last;
    for (size_t i = 0; i < last.size(); i++)
        for (int k = 0; k < NCOUNT; k++) {
            double y[3];
            for (size_t s = 0; s < sizes.size(); s++) y[s] = runs[s][i].c[k];
            const double v = extrapolate(sizes.data(), y, (int)sizes.size(), target_n);
            /* the longest block's barriers are one block's, whatever the (b, h) count */
            const bool per_block = k == (int)(offsetof(asc_emu_counters, max_block_barriers) / sizeof(unsigned long long));
            out[i].c[k] = std::max(0.0, v) * (per_block ? 1.0 : target_bh / heads);
        }
    return out;
}

/* ---------------------------------------------------------------- the estimate */

enum { T_MEM, T_TENSOR, T_FP32, T_MUFU, T_SMEM, T_ISSUE, T_LONGEST, NTERM };
const char *term_name[NTERM] = {"memory", "tensor", "fp32", "mufu", "shared", "issue", "longest block"};

struct Estimate {
    double term[NTERM] = {};
    double blocks_per_sm = 0, occupancy = 0, quant = 1, seconds = 0;
    int bound = 0;
    const Resources *res = nullptr;
};

Estimate estimate(const Launch &l, const Gpu &g, const std::map<std::string, Resources> &ptxas) {
    Estimate e;
    e.term[T_MEM] = (CNT(gld_sectors) + CNT(gst_sectors)) * 32.0 / g.dram;
    e.term[T_TENSOR] = CNT(mma_flops) / g.tensor;
    e.term[T_FP32] = CNT(fp32_flops) / g.fp32;
    e.term[T_MUFU] = CNT(mufu_ops) / g.mufu;
    e.term[T_SMEM] = (CNT(lds_wavefronts) + CNT(sts_wavefronts)) / g.smem_wavefronts;
    e.res = find_resources(ptxas, l.symbol);
    const double blocks = CNT(blocks);
    if (e.res && l.threads) {
        const int warps = (int)((l.threads + 31) / 32);
        const int regs_warp = (e.res->regs * 32 + g.reg_unit - 1) / g.reg_unit * g.reg_unit;
        int bps = std::min(g.max_blocks, g.max_threads / (warps * 32));
        if (regs_warp > 0) bps = std::min(bps, g.regs / (regs_warp * warps));
        const long smem = (long)l.smem + e.res->smem + g.smem_reserved;
        bps = (int)std::min<long>(bps, g.smem / smem);
        e.blocks_per_sm = bps;
        e.occupancy = bps * warps / 64.0;
        if (bps > 0 && blocks > 0) {
            const double waves = blocks / (g.sms * bps);
            e.quant = std::ceil(waves) / waves;
            /* The busiest SM runs ceil(waves) waves of `per_sm` blocks at the issue rate of their warps: bps blocks,
             * or fewer when the grid does not fill the SMs (a grid of 32 blocks puts one on each of 32 SMs, at the
             * rate of one block's warps). The term is that time before the quantization the estimate multiplies in
             * (so that term x quant is the busiest SM's time, for full and partial grids alike). */
            const double per_sm = std::min<double>(bps, std::ceil(blocks / g.sms));
            const double rate = std::min(g.issue_max, g.issue_per_warp * per_sm * warps) * g.clock;
            if (l.icount.insts >= 0)
                e.term[T_ISSUE] = std::ceil(waves) * per_sm * (l.icount.insts / blocks) / rate / e.quant;
            /* The longest block: a launch ends no sooner than its longest block, which runs at its own warps' rate
             * however the rest spreads over the SMs (the global rows' row tile of a windowed call meets every key
             * tile). Its instructions: the mean block's, times its barriers over the mean block's (the tiled
             * kernels' barriers come per key or query tile step). Divided by quant: the estimate multiplies it in. */
            const double bars = CNT(barriers), longest = CNT(max_block_barriers);
            if (l.icount.insts >= 0 && bars > 0 && longest > 0) {
                const double block_rate = std::min(g.issue_max, g.issue_per_warp * warps) * g.clock;
                e.term[T_LONGEST] = (l.icount.insts / blocks) * (longest / (bars / blocks)) / block_rate / e.quant;
            }
        }
    }
    for (int t = 0; t < NTERM; t++)
        if (e.term[t] > e.term[e.bound]) e.bound = t;
    e.seconds = e.term[e.bound] * e.quant;
    return e;
}

std::string short_name(const std::string &k) {
    std::string s = k.substr(0, k.find('('));
    if (s.rfind("void ", 0) == 0) s = s.substr(5);
    return s.size() > 46 ? s.substr(0, 43) + "..." : s;
}

double print_launches(const char *call, const std::vector<Launch> &ls, const Gpu &g,
                      const std::map<std::string, Resources> &ptxas) {
    double total = 0;
    for (const Launch &l : ls) {
        const Estimate e = estimate(l, g, ptxas);
        total += e.seconds;
        const double gld = CNT(gld_sectors) * 32, gst = CNT(gst_sectors) * 32;
        const double need = CNT(gld_bytes) + CNT(gst_bytes);
        const double lreq = CNT(lds_requests) + CNT(sts_requests);
        const double wav = CNT(lds_wavefronts) + CNT(sts_wavefronts), ideal = CNT(lds_ideal) + CNT(sts_ideal);
        char res[64] = "-";
        if (e.res)
            snprintf(res, sizeof(res), "%d/%ld/%ld%s", e.res->regs, (long)l.smem + e.res->smem, e.res->stack,
                     e.res->spill_stores + e.res->spill_loads ? "!" : "");
        char insts[48] = "-", issue[32] = "-", anchor[48] = "-";
        if (l.icount.raw >= 0) snprintf(insts, sizeof(insts), "%.3g (%.3g)", l.icount.insts / 1e9, l.icount.raw / 1e9);
        else if (l.icount.insts >= 0) snprintf(insts, sizeof(insts), "%.3g", l.icount.insts / 1e9);
        /* the block counts' HMMA and LDSM (before the anchor) against the exact counts: how far they are off */
        const double mma = mma_instructions(l), ldm = ldmatrix_instructions(l);
        if (l.icount.hmma >= 0 && mma > 0)
            snprintf(anchor, sizeof(anchor), "%.2f / %.2f", l.icount.hmma / mma, ldm > 0 ? l.icount.ldsm / ldm : 0.0);
        if (e.term[T_ISSUE] > 0) snprintf(issue, sizeof(issue), "%.3g", e.term[T_ISSUE] * 1e3);
        char longest[48] = "-";
        if (e.term[T_LONGEST] > 0)
            snprintf(longest, sizeof(longest), "%.3g (%.3gx)", e.term[T_LONGEST] * e.quant * 1e3,
                     CNT(max_block_barriers) / (CNT(barriers) / CNT(blocks)));
        printf("| %s | %s | %.0f | %u | %s | %.0f%% | %.1f / %.1f | %.0f%% | %.1f (%.1f) | %.3g | %.3g | %.3g | %.3g | %.3g "
               "| %s | %s | %.3g | %.3g | %s | %s | %s | %.3f |\n",
               call, short_name(l.kernel).c_str(), CNT(blocks), l.threads, res, e.occupancy * 100, gld / 1e6,
               gst / 1e6, need > 0 ? 100.0 * need / (gld + gst) : 100.0, lreq > 0 ? wav / lreq : 0.0,
               lreq > 0 ? ideal / lreq : 0.0, CNT(ldmatrix) / 1e6, CNT(mma_flops) / 1e9, CNT(fp32_flops) / 1e9,
               CNT(mufu_ops) / 1e9, CNT(barriers) / 1e6, insts, anchor, e.term[T_MEM] * 1e3, e.term[T_SMEM] * 1e3, issue,
               longest, term_name[e.bound], e.seconds * 1e3);
    }
    return total;
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<double> sizes{192, 384, 576};
    double heads = 1, target_n = 4096, target_bh = 16;
    std::vector<int> variants;
    const char *ptxas_path = nullptr, *bbs_path = nullptr, *icount_path = nullptr;
    double clock = 0;
    Shape shape_of;
    bool raw = false; /* also print every run's counters, unfitted (in asc_emu_counters order) */
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--sizes") {
            sizes.clear();
            while (i + 1 < argc && argv[i + 1][0] != '-') sizes.push_back(atof(argv[++i]));
        } else if (a == "--heads" && i + 1 < argc) heads = atof(argv[++i]);
        else if (a == "--target-n" && i + 1 < argc) target_n = atof(argv[++i]);
        else if (a == "--target-bh" && i + 1 < argc) target_bh = atof(argv[++i]);
        else if (a == "--ptxas" && i + 1 < argc) ptxas_path = argv[++i];
        else if (a == "--bbs" && i + 1 < argc) bbs_path = argv[++i];
        else if (a == "--icount" && i + 1 < argc) icount_path = argv[++i];
        else if (a == "--clock" && i + 1 < argc) clock = atof(argv[++i]) * 1e9;
        else if (a == "--raw") raw = true;
        else if (a == "--causal") shape_of.causal = true;
        else if (a == "--decode") shape_of.decode = true;
        else if (a == "--window" && i + 3 < argc) {
            shape_of.wl = atoll(argv[++i]);
            shape_of.wr = atoll(argv[++i]);
            shape_of.global = atoll(argv[++i]);
        } else if (a == "--dims" && i + 4 < argc) {
            shape_of.d = atoll(argv[++i]);
            shape_of.dv = atoll(argv[++i]);
            shape_of.dz = atoll(argv[++i]);
            shape_of.da = atoll(argv[++i]);
            if (shape_of.d < 1 || shape_of.dv < 1 || shape_of.dz < 1 || shape_of.da < 1) {
                fprintf(stderr, "cuda_cost: --dims D DV DZ DA takes four positive feature sizes\n");
                return 2;
            }
        }
        else if (a == "--variant" && i + 1 < argc) {
            const std::string v = argv[++i];
            variants.push_back(v == "paper" ? ASC_VARIANT_PAPER : ASC_VARIANT_SEED);
        } else {
            fprintf(stderr, "usage: %s [--sizes N1 N2 N3] [--heads H] [--variant seed|paper]... [--causal] [--window L R G] [--dims D DV DZ DA] "
                            "[--decode] [--ptxas FILE] [--target-n N] [--target-bh BH] [--bbs FILE] [--icount FILE] [--clock GHZ] [--raw]\n", argv[0]);
            return 2;
        }
    }
    /* the benchmark's shape (N = 4096) takes the closed-form moments; the fitted sizes would not by the size rule */
    setenv("ASCENDER_CUDA_MOMENTS", "closed", 0);
    /* the device the estimate is for, unless ASC_EMU_SMEM_OPTIN says otherwise: an H100's opt-in shared memory per
     * block, where the emulator's default is an A100's (wide rows, e.g. the paper variant at d = 128, would take the
     * row-per-warp kernels there) */
    if (!getenv("ASC_EMU_SMEM_OPTIN")) asc_emu_set_smem_optin(ASC_EMU_SMEM_OPTIN_H100);
    if (sizes.empty() || sizes.size() > 3) {
        fprintf(stderr, "cuda_cost: give one to three --sizes\n");
        return 2;
    }
    if (variants.empty()) variants = {ASC_VARIANT_PAPER, ASC_VARIANT_SEED};
    if (!asc_emu_cost_enable(0)) {
        fprintf(stderr, "cuda_cost: this emulator build does not count (build/cost is the one that does)\n");
        return 2;
    }
    FILE *bbs = bbs_path ? fopen(bbs_path, "w") : nullptr;
    if (bbs_path && !bbs) {
        fprintf(stderr, "cuda_cost: cannot write %s\n", bbs_path);
        return 2;
    }
    Gpu g;
    g.set_clock(clock > 0 ? clock : Gpu::MEASURED_CLOCK);
    const auto ptxas = read_ptxas(ptxas_path);
    std::vector<std::string> icount_notes;
    const auto icount = read_icount(icount_path, &icount_notes);
    if (bbs) fprintf(bbs, "target %.0f %.0f\n", target_n, target_bh);
    char shape[192] = "";
    snprintf(shape, sizeof(shape), "%s%s", shape_of.causal ? ", causal" : "", shape_of.decode ? ", decode (Nq = 1)" : "");
    if (shape_of.wl >= 0 || shape_of.wr >= 0 || shape_of.global > 0)
        snprintf(shape + strlen(shape), sizeof(shape) - strlen(shape), ", window (%lld, %lld), %lld global",
                 (long long)shape_of.wl, (long long)shape_of.wr, (long long)shape_of.global);
    if (shape_of.other_dims())
        snprintf(shape + strlen(shape), sizeof(shape) - strlen(shape), ", d = %lld, dv = %lld, dz = %lld, da = %lld",
                 (long long)shape_of.d, (long long)shape_of.dv, (long long)shape_of.dz, (long long)shape_of.da);
    printf("# cuda_cost: the CUDA kernels' launches at N = %.0f, B*H = %.0f, %sk = 16, bf16%s,\n"
           "# fitted from N =", target_n, target_bh, shape_of.other_dims() ? "" : "d = dv = 64, dz = da = 32, ", shape);
    for (double n : sizes) printf(" %.0f", n);
    printf(" with B*H = %.0f (quadratic in N, linear in B*H); %s\n", heads,
           ptxas.empty() ? "no ptxas report (occupancy unknown)" : "registers and shared memory from ptxas -v, sm_90");
    printf("# SM clock %.2f GHz%s\n", g.clock / 1e9, clock > 0 ? " (--clock)" : " (measured under these kernels, H200)");
    if (icount.empty()) printf("# issue term: no instruction estimate (--icount)\n");
    else printf("# issue term: warp instructions from %s (tools/sass_icount.py)\n", icount_path);
    for (const std::string &n : icount_notes) printf("#%s\n", n.c_str());
    double last = 0;
    for (int variant : variants) {
        std::vector<std::vector<Launch>> fr, br;
        for (double n : sizes) {
            std::vector<Launch> f, b;
            run(variant, shape_of, (int64_t)n, (int64_t)heads, &f, &b);
            const char *vn = variant == ASC_VARIANT_PAPER ? "paper" : "seed";
            if (bbs) {
                write_bbs(bbs, vn, shape_of.decode ? "dec" : "fwd", f, n, heads);
                write_bbs(bbs, vn, "bwd", b, n, heads);
            }
            if (raw)
                for (const auto *ls : {&f, &b})
                    for (const Launch &l : *ls) {
                        printf("# raw N=%.0f %s:", n, short_name(l.kernel).c_str());
                        for (int k = 0; k < NCOUNT; k++) printf(" %.0f", l.c[k]);
                        printf("\n");
                    }
            fr.push_back(f);
            br.push_back(b);
        }
        std::vector<Launch> fwd = fit(fr, sizes, heads, target_n, target_bh, "forward");
        std::vector<Launch> bwd = fit(br, sizes, heads, target_n, target_bh, "backward");
        const char *vname = variant == ASC_VARIANT_PAPER ? "paper" : "seed";
        const char *fcall = shape_of.decode ? "dec" : "fwd";
        for (auto [call, ls] : {std::pair<const char *, std::vector<Launch> *>{fcall, &fwd}, {"bwd", &bwd}})
            for (size_t i = 0; i < ls->size(); i++) {
                const auto it = icount.find(std::string(vname) + " " + call + " " + std::to_string(i));
                if (it != icount.end()) (*ls)[i].icount = it->second;
            }
        printf("\n## variant %s\n\n", vname);
        printf("| call | kernel | blocks | threads | regs/smem/stack | occupancy | global MB read / written | "
               "bytes used | wavefronts per smem request (ideal) | ldmatrix M | mma GFLOP | fp32 GFLOP | mufu G "
               "| barriers M | warp inst G (before the anchor) | HMMA / LDSM est. / exact | memory ms | shared ms | issue ms "
               "| longest block ms (its barriers / the mean block's) | bound "
               "| estimate ms |\n");
        printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        const double tf = print_launches(fcall, fwd, g, ptxas);
        const double tb = print_launches("bwd", bwd, g, ptxas);
        /* other feature sizes in the summary's name: bench_cuda.py --estimate reads "variant NAME: forward" */
        const std::string vtag = std::string(vname) + (shape_of.other_dims() ? " (" + std::string(shape + 2) + ")" : "");
        if (shape_of.decode) printf("\nvariant %s: decode %.3f ms\n", vtag.c_str(), tf * 1e3);
        else printf("\nvariant %s: forward %.3f ms, backward %.3f ms\n", vtag.c_str(), tf * 1e3, tb * 1e3);
        last = tf + tb;
        if (shape_of.decode)
            printf("estimated H100 decode at N=%.0f, B*H=%.0f, bf16 (variant %s): %.3f ms\n", target_n, target_bh, vname,
                   last * 1e3);
        else if (variant != variants.back())
            printf("estimated H100 fwd+bwd at N=%.0f, B*H=%.0f, bf16%s (variant %s): %.3f ms\n", target_n, target_bh,
                   shape, vname, last * 1e3);
    }
    if (!shape_of.decode)
        printf("estimated H100 fwd+bwd at N=%.0f, B*H=%.0f, bf16%s: %.3f ms\n", target_n, target_bh, shape, last * 1e3);
    if (bbs) fclose(bbs);
    return 0;
}
