/*
 * test_kernels.cpp -- the CUDA kernels of csrc/cuda against the CPU kernels of csrc/cpu, case by
 * case and element type by element type. No torch. Built against the CPU emulator
 * (tests/cuda_emu/Makefile, ASC_CUDA_EMU) for every commit, and with nvcc against the real CUDA
 * runtime by the GPU playbook (tools/gpu_check.sh), where the same grid runs on the device.
 *
 * For each case (random problem, fixed seed) and each dtype (float64, float32, float16, bfloat16):
 *   1. the inputs are rounded to the dtype; the CPU float64 kernels run on those rounded values
 *      (the reference), the CUDA kernels on the same values stored in the dtype;
 *   2. forward: out, the 13 stats columns, u, c, nbr, aux and (where asked) the five maps; a case of at
 *      most 8 query rows without maps also runs the forward of a call that is not differentiated
 *      (ascender_cuda_infer: the decode kernels), held to the same bounds;
 *   3. backward with incoming gradients dL/dy (and, where the case says, dL/daux and dL/du):
 *      dq, dk, dv, dz, dh, the nine scalar gradients, dattn_bias and (with sinks) dsinks.
 * Error measures (compare.h): forward fields norm-wise (max |err| / max |ref| over the field; the
 * densities RHO and WC_SUM row by row; COUNT and nbr exactly); gradients per group (dq, dk, dv, dz,
 * dh, each scalar over its heads, dattn_bias) relative to max(max |ref| of the group, 1e-2 x the
 * largest gradient of the case), like tests/c/test_backward.c. Outputs start as NaN, so an
 * element a kernel never writes fails.
 *
 * Tolerances (TOL below) and the rows left out, per dtype:
 *  - float64 is computed in float64 by both: 1e-10 for every field and gradient.
 *  - float32 / float16 / bfloat16 are computed in float32 by the CUDA kernels (sums included),
 *    against float64: forward 1e-4 / 2e-3 / 1.6e-2 and gradients 3e-4 / 3e-3 / 2e-2: float32
 *    arithmetic over these rows (~1e-5 measured) plus one rounding of the stored output (unit
 *    roundoff 4.9e-4 for float16, 3.9e-3 for bfloat16), with room for a few roundings.
 *  - A row whose raw bias row is constant in exact arithmetic (its std is rounding noise, so its
 *    normalized bias is noise / 1e-6: tests/c/test_kernels.c, ill_conditioned) is unpinnable at the
 *    computing precision. With amp = max_X (|MEAN_X| + STD_X) / (STD_X + 1e-6) from the reference's
 *    stats, rows with amp x u x 8 > TOL_fwd (u of the computing type) are left out of the fields
 *    that depend on S (out, LSE, A, aux, the normalized bias of that X), and rows with amp > AMP_BWD
 *    (1e3 float64, 10 otherwise, as in tests/c/test_backward.c) get zero incoming gradients.
 *  - Neighbour lists must be equal. Below float64 a near-tie of affinities (|a_x - a_y| <= 2e-5,
 *    recomputed here in double) may order two keys differently; such a row is reported, left out of
 *    every row field except c, RHO, WC_SUM, COUNT, and gets zero incoming gradients. A list that
 *    differs without a near-tie fails.
 * Each line: the case, per dtype the worst forward and backward error with its field, the rows left
 * out. Exit status 1 on any failure.
 *
 *   test_kernels [--tsan] [--few] [--only I] [--shard S/N] [--limits] [--determinism] [--dtype f64|f32|f16|bf16]
 *                [--seed-shift K] [--quiet]
 * (--only 1000 + m runs magnitude case m; --few: a handful of cases reaching every kernel path, in
 * float64, float32 and bfloat16, for compute-sanitizer on a GPU; --shard S/N: the cases whose index is
 * S modulo N, and the limits in shard 0, so that N processes run the grid on N cores; --seed-shift K: every
 * case's random draw moved by K, the same grid on other inputs -- a sweep beyond the fixed seeds CI runs, which
 * found the tiled backward's cancelled-heading bug of 2026-11-27, docs/cuda.md)
 * --tsan runs the reduced grid of the ThreadSanitizer build (every variant and masking mode, fewer
 * sizes, float64 and float16; its long-rows case float16 only). The backward gets the CUDA forward's saved outputs,
 * as from the binding; where the tiled backward takes the call, every eighth case (every case with --determinism)
 * runs it a second time without them (it runs the forward first), with the emulator's lanes released in reverse
 * order and on another number of workers (one, or two where the grid runs on one), and needs the same bits.
 */
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "compare.h"
#include "cuda/ascender_cuda.h"
#include "cuda/tiled.h"

#define _Static_assert static_assert
extern "C" {
#include "../c/harness.h"
}
#undef _Static_assert

#include "emu_api.h" /* its functions only under the emulator (ASC_CUDA_EMU); the GPU build reads its constants */

namespace {

/* ---------------------------------------------------------------- tolerances */

struct Tol {
    double u;       /* unit roundoff of the computing type */
    double fwd;     /* forward fields */
    double bwd;     /* gradient groups */
    double amp_bwd; /* rows with a larger amplification get no incoming gradient */
    double tie;     /* affinity difference accepted as a near-tie (0: lists must be equal) */
};

const Tol TOL[NDT] = {
    {0x1p-53, 1e-10, 1e-10, 1e3, 0.0},
    {0x1p-24, 1e-4, 3e-4, 10.0, 2e-5},
    {0x1p-24, 2e-3, 3e-3, 10.0, 2e-5},
    {0x1p-24, 1.6e-2, 2e-2, 10.0, 2e-5},
};

constexpr double FLOOR_REL = 1e-2;

/* ---------------------------------------------------------------- cases */

enum KpmMode { KPM_NONE, KPM_RANDOM, KPM_B1ALL, KPM_FIRST };
const char *kpm_name[] = {"none", "random", "rand+b1all", "first"};
enum AmMode { AMM_NONE, AMM_FULL, AMM_HEAD_BCAST, AMM_BATCH_BCAST, AMM_SHARED, AMM_TRANSPOSED };
const char *amm_name[] = {"none", "BHQN", "B1QN", "1HQN", "QN", "BHQN^T"};
enum BiasMode { AB_NONE, AB_FULL, AB_HEAD, AB_SHARED };
const char *ab_name[] = {"", " bias", " bias1H", " biasQN"};
enum DupMode { DUP_NONE, DUP_SOME, DUP_ALL, DUP_ZERO };
/* non-finite inputs (SPEC section 11): NAN_LAST puts NaN into q, k, v, z, h of the last token of
 * batch 0 (causal: no other row can see it); NAN_PAD_K, _V, _Z, _H into the first entry of the key,
 * value, latent or semantic row of a padded token (NAN_PAD_K is the case of tests/test_inputs.py; with
 * mask_stats no row but the token's own sees it, through its z, h, and its k in the seed variant
 * only); NAN_MASKED into the first entry of k, v and z of token N / 2 of batch 0, unpadded, which an
 * attention mask hides from some rows; NAN_VIS_H into the first entry of h of token N / 2 of batch 0,
 * unpadded (its affinity with every row that sees it is NaN, and phi = ws max(a - delta, 0) must keep
 * it); NAN_EMPTY into the first entry of q, v, z and h of token 0 of batch 0, padded (with causal its
 * row has no visible key: output 0, not NaN; k stays finite, as the seed variant's u = k^_t is an
 * output); NAN_HEAD into omega_sep of head 0 (a per-head scalar: every row of head 0 with a visible key
 * sees it, a causal row 0 with n = 1 too, through omega x 0). The rows that see a non-finite input
 * (seeing_rows: the twin's rule) are left out of the
 * forward comparison and get no incoming gradient; every other row, and every gradient (the loss is
 * over the rows that cannot see it), must be finite and equal to the CPU's. With CaseDef::nan_strict
 * the rows that see it must moreover be NaN in out and aux, and in the maps, as the twin makes them
 * (reference.py, poisoned). */
enum NanMode { NAN_NONE, NAN_LAST, NAN_PAD_K, NAN_PAD_V, NAN_PAD_Z, NAN_PAD_H, NAN_MASKED, NAN_VIS_H, NAN_EMPTY, NAN_HEAD };
const char *nan_name[] = {"", " nan-last", " nan-padded-k", " nan-padded-v", " nan-padded-z", " nan-padded-h",
                          " nan-masked", " nan-visible-h", " nan-empty-row", " nan-head-omega"};
const char *dup_name[] = {"", " dup", " alldup", " zerorows"};

struct CaseDef {
    int variant = ASC_VARIANT_SEED;
    int64_t B = 2, H = 2, N = 7, Nq = -1, d = 6, dv = 5, dz = 4, da = 3, k = 4;
    int causal = 0, ms = 1, kpm = KPM_NONE, am = AMM_NONE, am_zero = 0, dup = DUP_NONE, maps = 0;
    int bias = AB_NONE, alibi = 0, gaux = 0, gu = 0, defaults = 0, tiny = 0, nan = NAN_NONE, nan_strict = 0;
    int nan_unseen = 0; /* with nan_strict: the twin's rule says no row sees the non-finite input */
    double zamp = 0.7, hamp = 1.0; /* amplitudes of z and h */
    /* SPEC sections 8 and 9: window_size (wl, wr; -1 unbounded), global_tokens, a global_mask (each
     * token global with probability 0.1), document_ids (DOC_RUNS: packed runs of 1 .. 12 tokens with
     * increasing ids; DOC_ALTERNATE: the runs' ids alternate 0, 1, so a document is several runs),
     * softcap (0: none), neighbours = "scores"; ALiBi slopes are per (batch, head) */
    int64_t wl = -1, wr = -1, n_global = 0;
    int gmask = 0, docs = 0, scores = 0;
    double softcap = 0.0;
    int outside = 0;      /* softcap_bias = "outside": attn_bias and ALiBi added after the cap */
    double dropout = 0.0; /* dropout_p (SPEC section 9b): both kernel families draw csrc/philox.h's mask */
    int sinks = 0; /* SPEC section 12: sink logits drawn in [-1.5, 1.5]; SINK_HEAD [H], or per row (docs/backward.md) */
    int64_t after = 0; /* query_offset: keys after the query rows (row i is token i + N - Nq - after) */
    /* rows too wide for a block's shared memory at the case's opt-in (smem_optin, else the emulator's default, an
     * A100's): the dtypes (bits 1 << DT_*) whose forward, and whose backward, ascender_cuda_fits refuses (their
     * launchers then fail cleanly) */
    int refuse_fwd = 0, refuse_bwd = 0;
    int smem_optin = 0; /* the emulated device's opt-in shared memory per block in bytes (0: the emulator's setting) */
    int sms = 0;        /* the emulated device's SMs (0: the emulator's setting, an H100's 132) */
    int wide = -1;      /* with smem_optin: the dtypes (bits 1 << DT_*) whose row kernels run shapes for wide heads as
                         * wide_bits says, the others none (-1: not checked) */
    int wide_bits = 7;  /* which (asc_tiled_wide_rows): the forward 1, B1 2, B2r 4, B2c 8 */
    int skip_dt = 0; /* the dtypes (bits 1 << DT_*) the case does not run */
    uint64_t seed = 1;
};
enum DocMode { DOC_NONE, DOC_RUNS, DOC_ALTERNATE };
enum SinkMode { SINK_NONE, SINK_HEAD, SINK_ROWS /* [B, H, Nq] */, SINK_QUERY /* [1, H, Nq] */, SINK_BATCH /* [B, 1, 1] */ };

/* One problem in double (not yet rounded to a dtype). */
struct Problem {
    asc_params p;
    std::vector<double> x[NIN], sc[NSC], bias, slopes, sinks, gout, gaux, gu;
    std::vector<uint8_t> kpm, am, gmask;
    std::vector<int64_t> docs;
    std::vector<int64_t> dseed; /* dropout's (seed, offset, token offset), or empty */
    size_t rows = 0; /* B H Nq */
};

/* The launchers' dtype code (asc_cuda_dtype) of a DT. */
int cuda_code(int dt) {
    return dt == DT_F64 ? ASC_CUDA_F64 : dt == DT_F32 ? ASC_CUDA_F32 : dt == DT_F16 ? ASC_CUDA_F16 : ASC_CUDA_BF16;
}

size_t in_count(const asc_params &p, int t) {
    return (size_t)(p.B * p.H * (t == 0 ? p.Nq : p.N) * input_dim(&p, t));
}

void copy_token(Problem &P, int64_t dst, int64_t src) {
    const asc_params &p = P.p;
    for (int64_t bh = 0; bh < p.B * p.H; bh++)
        for (int t = 1; t < NIN; t++) { /* keys, values, latents, semantics (q rows are queries) */
            const int64_t f = input_dim(&p, t);
            double *base = P.x[t].data() + bh * p.N * f;
            memcpy(base + dst * f, base + src * f, sizeof(double) * (size_t)f);
        }
}

Problem make_problem(const CaseDef &c) {
    Problem P;
    asc_params &p = P.p;
    memset(&p, 0, sizeof(p));
    p.window_left = p.window_right = -1; /* no window (0 would be a window of the token itself) */
    rng r = rng_splitmix(c.seed * 0xD1B54A32D192ED03ULL + 29, 0);
    p.B = c.B; p.H = c.H; p.N = c.N; p.Nq = c.Nq < 0 ? c.N : c.Nq;
    p.keys_after = c.after;
    p.d = c.d; p.dv = c.dv; p.dz = c.dz; p.da = c.da;
    p.variant = c.variant;
    p.k_neighbors = c.k;
    p.is_causal = c.causal;
    p.mask_stats = c.ms;
    p.window_left = c.wl;
    p.window_right = c.wr;
    p.n_global = c.n_global;
    p.softcap = c.softcap;
    p.softcap_outside = c.outside;
    if (c.dropout > 0) { /* as the binding sets them */
        p.dropout_threshold = (uint32_t)(c.dropout * 4294967296.0);
        p.dropout_scale = 1.0 / (1.0 - c.dropout);
        /* (seed, offset, token offset): the offset 0 .. 6 puts the tiles' keys across Philox's groups of four */
        P.dseed = {(int64_t)(c.seed * 0x9E3779B97F4A7C15ULL), (int64_t)(c.seed + 1000), (int64_t)(c.seed % 7)};
    }
    p.neighbours = c.scores ? ASC_NEIGHBOURS_SCORES : ASC_NEIGHBOURS_SEMANTIC;
    draw_hyper(&p, c.defaults, &r);
    P.rows = (size_t)(p.B * p.H * p.Nq);
    for (int t = 0; t < NIN; t++) {
        P.x[t].resize(in_count(p, t));
        const double amp = t == 3 ? c.zamp : (t == 4 ? c.hamp : 1.0);
        for (double &v : P.x[t]) v = rng_unif(&r, -amp, amp);
    }
    double *sc[NSC];
    draw_head_scalars(&p, c.defaults, &r, sc);
    for (int s = 0; s < NSC; s++) {
        P.sc[s].assign(sc[s], sc[s] + p.H);
        free(sc[s]);
    }
    if (c.tiny) /* lambda ~ 1e-5: the epsilon paths of the row normalization carry the gradient */
        for (int s = 0; s < 3; s++)
            for (double &v : P.sc[s]) v = rng_unif(&r, 3e-6, 3e-5);
    /* a third of the scalars, by the case's seed, one value for every head: the device reads them as a single value
     * (DevInputs, asc_fwd_args.scalars_shared), the CPU kernels from their [H] copies */
    for (int s = 0; s < NSC; s++)
        if ((c.seed + (uint64_t)s) % 3 == 0 && p.H > 0) std::fill(P.sc[s].begin(), P.sc[s].end(), P.sc[s][0]);
    const int64_t N = p.N, Nq = p.Nq;
    if (c.dup == DUP_SOME) {
        if (N >= 2) copy_token(P, N - 1, 0);
        if (N >= 4) copy_token(P, N / 2, 1);
        if (N >= 5) copy_token(P, N - 2, 0);
    } else if (c.dup == DUP_ALL) {
        for (int64_t j = 1; j < N; j++) copy_token(P, j, 0);
    } else if (c.dup == DUP_ZERO) { /* token 0: zero key and semantic rows; token 1: z of token 0 */
        for (int64_t bh = 0; bh < p.B * p.H; bh++) {
            std::fill_n(P.x[1].begin() + bh * N * p.d, p.d, 0.0);
            std::fill_n(P.x[4].begin() + bh * N * p.da, p.da, 0.0);
            if (N >= 2)
                std::copy_n(P.x[3].begin() + bh * N * p.dz, p.dz, P.x[3].begin() + (bh * N + 1) * p.dz);
        }
    }
    if (c.kpm != KPM_NONE) {
        P.kpm.assign((size_t)(p.B * N), 0);
        for (int64_t b = 0; b < p.B; b++)
            for (int64_t j = 0; j < N; j++) {
                uint8_t pad = c.kpm == KPM_FIRST ? j == 0 : rng_unif(&r, 0.0, 1.0) < 0.25;
                if (c.kpm == KPM_B1ALL && b == (p.B > 1 ? 1 : 0)) pad = 1;
                P.kpm[(size_t)(b * N + j)] = pad;
            }
    }
    if (c.am != AMM_NONE) {
        const int64_t QN = Nq * N;
        int64_t nb = p.B, nh = p.H;
        switch (c.am) {
            case AMM_FULL: p.am_sb = p.H * QN; p.am_sh = QN; p.am_si = N; p.am_sj = 1; break;
            case AMM_HEAD_BCAST: nh = 1; p.am_sb = QN; p.am_sh = 0; p.am_si = N; p.am_sj = 1; break;
            case AMM_BATCH_BCAST: nb = 1; p.am_sb = 0; p.am_sh = QN; p.am_si = N; p.am_sj = 1; break;
            case AMM_SHARED: nb = nh = 1; p.am_sb = 0; p.am_sh = 0; p.am_si = N; p.am_sj = 1; break;
            default: p.am_sb = p.H * QN; p.am_sh = QN; p.am_si = 1; p.am_sj = Nq; break; /* transposed view */
        }
        P.am.assign((size_t)(nb * nh * QN), 0);
        for (auto &m : P.am) m = rng_unif(&r, 0.0, 1.0) < 0.75;
        if (c.am_zero) /* query row Nq / 2 may attend to nothing */
            for (int64_t b = 0; b < nb; b++)
                for (int64_t hd = 0; hd < nh; hd++)
                    for (int64_t j = 0; j < N; j++)
                        P.am[(size_t)(b * p.am_sb + hd * p.am_sh + (Nq / 2) * p.am_si + j * p.am_sj)] = 0;
    }
    if (c.bias != AB_NONE) {
        const int64_t QN = Nq * N;
        int64_t n = p.B * p.H * QN;
        p.ab_si = N; p.ab_sj = 1;
        if (c.bias == AB_FULL) { p.ab_sb = p.H * QN; p.ab_sh = QN; }
        else if (c.bias == AB_HEAD) { p.ab_sb = 0; p.ab_sh = QN; n = p.H * QN; }
        else { p.ab_sb = 0; p.ab_sh = 0; n = QN; }
        P.bias.resize((size_t)n);
        for (double &v : P.bias) v = rng_unif(&r, -1.0, 1.0);
    }
    if (c.alibi) {
        P.slopes.resize((size_t)(p.B * p.H));
        for (double &v : P.slopes) v = rng_unif(&r, 0.01, 0.3);
    }
    if (c.sinks) { /* the strides of the sinks' [B, H, Nq] view (asc_params.sk_*), compact in their shape */
        const int64_t nb = c.sinks == SINK_ROWS || c.sinks == SINK_BATCH ? p.B : 1;
        const int64_t nh = c.sinks == SINK_BATCH ? 1 : p.H, ni = c.sinks == SINK_ROWS || c.sinks == SINK_QUERY ? Nq : 1;
        p.sk_sb = nb > 1 ? nh * ni : 0, p.sk_sh = nh > 1 ? ni : 0, p.sk_si = ni > 1 ? 1 : 0;
        P.sinks.resize((size_t)(nb * nh * ni));
        for (double &v : P.sinks) v = rng_unif(&r, -1.5, 1.5);
    }
    if (c.nan == NAN_LAST) {
        for (int64_t hd = 0; hd < p.H; hd++)
            for (int t = 0; t < NIN; t++) {
                const int64_t f = input_dim(&p, t), tok = t == 0 ? Nq - 1 : N - 1;
                std::fill_n(P.x[t].begin() + (hd * (t == 0 ? Nq : N) + tok) * f, f, NAN);
            }
    } else if (c.nan == NAN_MASKED) {
        /* token N / 2 of batch 0, unpadded: the first entry of its k, v, z NaN; h finite, so that its
         * affinities are and it may be a neighbour of the paper rows that see it */
        for (int64_t hd = 0; hd < p.H; hd++)
            for (int t = 1; t < 4; t++) P.x[t][(size_t)((hd * N + N / 2) * input_dim(&p, t))] = NAN;
    } else if (c.nan == NAN_VIS_H) {
        for (int64_t hd = 0; hd < p.H; hd++) P.x[4][(size_t)((hd * N + N / 2) * p.da)] = NAN;
    } else if (c.nan == NAN_EMPTY) {
        if (P.kpm.empty()) P.kpm.assign((size_t)(p.B * N), 0);
        P.kpm[0] = 1;
        for (int64_t hd = 0; hd < p.H; hd++)
            for (int t = 0; t < NIN; t++)
                if (t != 1) P.x[t][(size_t)(hd * (t == 0 ? Nq : N) * input_dim(&p, t))] = NAN;
    } else if (c.nan == NAN_HEAD) {
        P.sc[SC_OS][0] = NAN;
    } else if (c.nan >= NAN_PAD_K && c.nan <= NAN_PAD_H) {
        /* token N / 2 of batch 0: padded, the first entry of its k, v, z or h NaN */
        const int t = 1 + (c.nan - NAN_PAD_K);
        const int64_t f = input_dim(&p, t);
        if (P.kpm.empty()) P.kpm.assign((size_t)(p.B * N), 0);
        P.kpm[(size_t)(N / 2)] = 1;
        for (int64_t hd = 0; hd < p.H; hd++) P.x[t][(size_t)((hd * N + N / 2) * f)] = NAN;
    }
    P.gout.resize(P.rows * (size_t)p.dv);
    for (double &v : P.gout) v = rng_unif(&r, -1.0, 1.0);
    if (c.gaux) {
        P.gaux.resize(P.rows * 2);
        for (double &v : P.gaux) v = rng_unif(&r, -1.0, 1.0);
    }
    if (c.gu) {
        P.gu.resize(P.rows * (size_t)p.d);
        for (double &v : P.gu) v = rng_unif(&r, -1.0, 1.0);
    }
    if (c.gmask) {
        P.gmask.resize((size_t)(p.B * N));
        for (auto &g : P.gmask) g = rng_unif(&r, 0.0, 1.0) < 0.1;
    }
    if (c.docs != DOC_NONE) {
        P.docs.resize((size_t)(p.B * N));
        for (int64_t b = 0; b < p.B; b++) {
            int64_t id = 0, left = 0;
            for (int64_t j = 0; j < N; j++) {
                if (left == 0) { /* a new run */
                    left = 1 + (int64_t)rng_unif(&r, 0.0, 12.0);
                    id = j == 0 ? 0 : (c.docs == DOC_RUNS ? id + 1 : 1 - id);
                }
                P.docs[(size_t)(b * N + j)] = id;
                left--;
            }
        }
    }
    return P;
}

/* The problem with every floating input (and incoming gradient) rounded to dtype dt. */
Problem rounded_problem(const Problem &P, int dt) {
    Problem R = P;
    for (auto &x : R.x) x = rounded(dt, x);
    for (auto &s : R.sc) s = rounded(dt, s);
    R.bias = rounded(dt, R.bias);
    R.slopes = rounded(dt, R.slopes);
    R.sinks = rounded(dt, R.sinks);
    R.gout = rounded(dt, R.gout);
    R.gaux = rounded(dt, R.gaux);
    R.gu = rounded(dt, R.gu);
    return R;
}

/* ---------------------------------------------------------------- runs */

enum { MAP_SBASE, MAP_ALIGN, MAP_SEP, MAP_COH, MAP_ATTN, NMAP };
const char *map_name[NMAP] = {"map_sbase", "map_align", "map_sep", "map_coh", "map_attn"};
#define STAT_NAME_(name) #name,
const char *stat_name[ASC_NSTAT] = {ASC_STATS(STAT_NAME_)}; /* csrc/ascender.h's columns, in order */
#undef STAT_NAME_
const char *group_name[(int)NIN + (int)NSC + 2] = {"dq", "dk", "dv", "dz", "dh", "dlambda_align", "dlambda_sep",
                                         "dlambda_coh", "domega_align", "domega_sep", "domega_coh",
                                         "dscore_temp", "ddelta", "dkappa", "dattn_bias", "dsinks"};

struct Fwd {
    std::vector<double> out, stats, u, c, aux, map[NMAP];
    std::vector<float> rows32; /* float16 / bfloat16 forwards with a backward to come: stats | c | u | out | aux */
    std::vector<int64_t> nbr;
    int rc = 0;
};

struct Bwd {
    std::vector<double> g[NIN], dsc, dbias, dsinks;
    int rc = 0;
    bool tiled = false; /* the CUDA call took the tiled backward (asc_tiled_bwd_takes) */
};

/* The CPU float64 kernels on the (already rounded) problem. */
Fwd cpu_fwd(const Problem &P, bool maps) {
    const asc_params &p = P.p;
    Fwd f;
    f.out.assign(P.rows * (size_t)p.dv, NAN);
    f.stats.assign(P.rows * ASC_NSTAT, NAN);
    f.u.assign(P.rows * (size_t)p.d, NAN);
    f.c.assign(P.rows * (size_t)p.dz, NAN);
    f.aux.assign(P.rows * 2, NAN);
    f.nbr.assign(P.rows * (size_t)p.n_nbr, -777);
    if (maps)
        for (auto &m : f.map) m.assign(P.rows * (size_t)p.N, NAN);
    void *x[NIN], *sc[NSC];
    for (int t = 0; t < NIN; t++) x[t] = (void *)P.x[t].data();
    for (int s = 0; s < NSC; s++) sc[s] = (void *)P.sc[s].data();
    asc_fwd_args a = fwd_inputs(x, sc, P.kpm.empty() ? nullptr : P.kpm.data(), P.am.empty() ? nullptr : P.am.data());
    a.attn_bias = P.bias.empty() ? nullptr : P.bias.data();
    a.alibi_slopes = P.slopes.empty() ? nullptr : P.slopes.data();
    a.sinks = P.sinks.empty() ? nullptr : P.sinks.data();
    a.global_mask = P.gmask.empty() ? nullptr : P.gmask.data();
    a.document_ids = P.docs.empty() ? nullptr : P.docs.data();
    a.dropout_seed = P.dseed.empty() ? nullptr : P.dseed.data();
    a.out = f.out.data(); a.stats = f.stats.data(); a.u = f.u.data(); a.c = f.c.data(); a.nbr = f.nbr.data();
    a.aux = f.aux.data();
    if (maps) {
        a.map_sbase = f.map[MAP_SBASE].data(); a.map_align = f.map[MAP_ALIGN].data();
        a.map_sep = f.map[MAP_SEP].data(); a.map_coh = f.map[MAP_COH].data(); a.map_attn = f.map[MAP_ATTN].data();
    }
    f.rc = ascender_fwd_f64(&p, &a);
    return f;
}

Bwd cpu_bwd(const Problem &P, const std::vector<double> &gout, const std::vector<double> &gaux,
            const std::vector<double> &gu) {
    const asc_params &p = P.p;
    Bwd g;
    for (int t = 0; t < NIN; t++) g.g[t].assign(in_count(p, t), NAN);
    g.dsc.assign((size_t)(NSC * p.H), NAN);
    g.dbias.assign(P.rows * (size_t)p.N, NAN);
    if (!P.sinks.empty()) g.dsinks.assign(P.sinks.size(), NAN);
    void *x[NIN], *sc[NSC];
    for (int t = 0; t < NIN; t++) x[t] = (void *)P.x[t].data();
    for (int s = 0; s < NSC; s++) sc[s] = (void *)P.sc[s].data();
    asc_bwd_args ba;
    memset(&ba, 0, sizeof(ba));
    ba.in = fwd_inputs(x, sc, P.kpm.empty() ? nullptr : P.kpm.data(), P.am.empty() ? nullptr : P.am.data());
    ba.in.attn_bias = P.bias.empty() ? nullptr : P.bias.data();
    ba.in.alibi_slopes = P.slopes.empty() ? nullptr : P.slopes.data();
    ba.in.sinks = P.sinks.empty() ? nullptr : P.sinks.data();
    ba.in.global_mask = P.gmask.empty() ? nullptr : P.gmask.data();
    ba.in.document_ids = P.docs.empty() ? nullptr : P.docs.data();
    ba.in.dropout_seed = P.dseed.empty() ? nullptr : P.dseed.data();
    ba.grad_out = gout.data();
    ba.grad_aux = gaux.empty() ? nullptr : gaux.data();
    ba.grad_u = gu.empty() ? nullptr : gu.data();
    ba.dq = g.g[0].data(); ba.dk = g.g[1].data(); ba.dv = g.g[2].data(); ba.dz = g.g[3].data(); ba.dh = g.g[4].data();
    ba.dscalars = g.dsc.data();
    ba.dattn_bias = g.dbias.data();
    ba.dsinks = g.dsinks.empty() ? nullptr : g.dsinks.data();
    g.rc = ascender_bwd_f64(&p, &ba);
    return g;
}

/* The device inputs of one run in element type dt. */
struct DevInputs {
    DevBuf x[NIN], sc[NSC], bias, slopes, sinks, kpm, am, gmask, docs, dseed;
    asc_fwd_args a;
    DevInputs(const Problem &P, int dt) {
        void *xp[NIN], *sp[NSC];
        for (int t = 0; t < NIN; t++) {
            x[t] = upload(dt, P.x[t]);
            xp[t] = x[t].p;
        }
        uint32_t shared = 0; /* a scalar with one value for every head goes up as that one value */
        for (int s = 0; s < NSC; s++) {
            const std::vector<double> &v = P.sc[s];
            const bool one = !v.empty() && std::all_of(v.begin(), v.end(), [&](double e) { return e == v[0]; });
            sc[s] = upload(dt, one ? std::vector<double>(v.begin(), v.begin() + 1) : v);
            sp[s] = sc[s].p;
            shared |= (uint32_t)one << s;
        }
        bias = upload(dt, P.bias);
        slopes = upload(dt, P.slopes);
        sinks = upload(dt, P.sinks);
        kpm = upload_bytes(P.kpm.data(), P.kpm.size());
        am = upload_bytes(P.am.data(), P.am.size());
        gmask = upload_bytes(P.gmask.data(), P.gmask.size());
        docs = upload_bytes(P.docs.data(), P.docs.size() * sizeof(int64_t));
        dseed = upload_bytes(P.dseed.data(), P.dseed.size() * sizeof(int64_t));
        a = fwd_inputs(xp, sp, (const uint8_t *)kpm.p, (const uint8_t *)am.p);
        a.scalars_shared = shared;
        a.attn_bias = bias.p;
        a.alibi_slopes = slopes.p;
        a.sinks = sinks.p;
        a.global_mask = (const uint8_t *)gmask.p;
        a.document_ids = (const int64_t *)docs.p;
        a.dropout_seed = (const int64_t *)dseed.p;
    }
};

/* The CUDA forward (ascender_cuda_fwd), or with `infer` the forward of a call that is not differentiated
 * (ascender_cuda_infer: the decode kernels for up to 8 query rows without maps). */
Fwd cuda_fwd(const Problem &P, int dt, bool maps, bool infer = false) {
    const asc_params &p = P.p;
    const size_t es = dt_size(dt);
    DevInputs in(P, dt);
    DevBuf out(P.rows * (size_t)p.dv * es), stats(P.rows * ASC_NSTAT * es), u(P.rows * (size_t)p.d * es),
        c(P.rows * (size_t)p.dz * es), aux(P.rows * 2 * es), nbr(P.rows * (size_t)p.n_nbr * 8, 0x7f), mp[NMAP];
    const size_t w32 = (dt == DT_F16 || dt == DT_BF16) && !infer ? (size_t)ASC_ROWS32_WIDTH(&p) : 0;
    DevBuf rows32(P.rows * w32 * sizeof(float));
    asc_fwd_args a = in.a;
    a.out = out.p; a.stats = stats.p; a.u = u.p; a.c = c.p; a.nbr = (int64_t *)nbr.p; a.aux = aux.p;
    a.rows32 = (float *)rows32.p;
    if (maps) {
        for (auto &m : mp) m = DevBuf(P.rows * (size_t)p.N * es);
        a.map_sbase = mp[MAP_SBASE].p; a.map_align = mp[MAP_ALIGN].p; a.map_sep = mp[MAP_SEP].p;
        a.map_coh = mp[MAP_COH].p; a.map_attn = mp[MAP_ATTN].p;
    }
    Fwd f;
    const int code = cuda_code(dt);
    f.rc = infer ? ascender_cuda_infer(&p, &a, code, nullptr) : ascender_cuda_fwd(&p, &a, code, nullptr);
    if (f.rc == 0) f.rc = (int)cudaDeviceSynchronize();
    f.out = download(dt, out, P.rows * (size_t)p.dv);
    f.stats = download(dt, stats, P.rows * ASC_NSTAT);
    f.u = download(dt, u, P.rows * (size_t)p.d);
    f.c = download(dt, c, P.rows * (size_t)p.dz);
    f.aux = download(dt, aux, P.rows * 2);
    f.nbr.assign(P.rows * (size_t)p.n_nbr, 0);
    if (nbr.p && !f.nbr.empty()) ck(cudaMemcpy(f.nbr.data(), nbr.p, f.nbr.size() * 8, cudaMemcpyDeviceToHost));
    f.rows32.resize(P.rows * w32);
    if (rows32.p) ck(cudaMemcpy(f.rows32.data(), rows32.p, rows32.bytes, cudaMemcpyDeviceToHost));
    if (maps)
        for (int m = 0; m < NMAP; m++) f.map[m] = download(dt, mp[m], P.rows * (size_t)p.N);
    return f;
}

/* The CUDA backward; with `saved`, the forward's outputs as the binding hands them over (the values of a
 * CUDA forward in the dtype, so uploading them is exact), else only the inputs (the backward then runs the
 * forward into scratch first). */
Bwd cuda_bwd(const Problem &P, int dt, const std::vector<double> &gout, const std::vector<double> &gaux,
             const std::vector<double> &gu, const Fwd *saved = nullptr) {
    const asc_params &p = P.p;
    const size_t es = dt_size(dt);
    DevInputs in(P, dt);
    DevBuf go = upload(dt, gout), ga = upload(dt, gaux), gup = upload(dt, gu), g[NIN];
    for (int t = 0; t < NIN; t++) g[t] = DevBuf(in_count(p, t) * es);
    DevBuf dsc((size_t)(NSC * p.H) * es), dbias(P.rows * (size_t)p.N * es), dsinks(P.sinks.size() * es);
    DevBuf so, ss, su, scb, snb, sa, s32;
    asc_bwd_args ba;
    memset(&ba, 0, sizeof(ba));
    ba.in = in.a;
    if (saved) {
        so = upload(dt, saved->out);
        ss = upload(dt, saved->stats);
        su = upload(dt, saved->u);
        scb = upload(dt, saved->c);
        sa = upload(dt, saved->aux);
        snb = upload_bytes(saved->nbr.data(), saved->nbr.size() * sizeof(int64_t));
        s32 = upload_bytes(saved->rows32.data(), saved->rows32.size() * sizeof(float));
        ba.in.rows32 = (float *)s32.p;
        ba.in.out = so.p;
        ba.in.stats = ss.p;
        ba.in.u = su.p;
        ba.in.c = scb.p;
        ba.in.aux = sa.p;
        ba.in.nbr = (int64_t *)snb.p;
    }
    ba.grad_out = go.p;
    ba.grad_aux = ga.p;
    ba.grad_u = gup.p;
    ba.dq = g[0].p; ba.dk = g[1].p; ba.dv = g[2].p; ba.dz = g[3].p; ba.dh = g[4].p;
    ba.dscalars = dsc.p;
    ba.dattn_bias = dbias.p;
    ba.dsinks = dsinks.p;
    Bwd r;
    const int cdt = cuda_code(dt);
    r.tiled = asc_tiled_bwd_takes(&p, &ba, cdt) != 0;
    r.rc = ascender_cuda_bwd(&p, &ba, cdt, nullptr);
    if (r.rc == 0) r.rc = (int)cudaDeviceSynchronize();
    for (int t = 0; t < NIN; t++) r.g[t] = download(dt, g[t], in_count(p, t));
    r.dsc = download(dt, dsc, (size_t)(NSC * p.H));
    r.dbias = download(dt, dbias, P.rows * (size_t)p.N);
    if (!P.sinks.empty()) r.dsinks = download(dt, dsinks, P.sinks.size());
    return r;
}

/* ---------------------------------------------------------------- checks */

/* rows32 (float16 / bfloat16): per row the stats, c, u, out and aux whose rounding the stored ones are, bit for
 * bit (a field in the wrong place or a value other than the stored one's fails; aux 0 where the forward computed
 * none); the backward reads them. */
void check_rows32(const Problem &R, const Fwd &got, int dt, Verdict &v) {
    if (got.rows32.empty()) return;
    const asc_params &p = R.p;
    const size_t w = (size_t)ASC_ROWS32_WIDTH(&p), ns = ASC_NSTAT, dz = (size_t)p.dz, d = (size_t)p.d,
                 dv = (size_t)p.dv, c0 = ASC_ROWS32_C(&p), u0 = ASC_ROWS32_U(&p), y0 = ASC_ROWS32_OUT(&p),
                 a0 = ASC_ROWS32_AUX(&p);
    const std::vector<double> kept = rounded(dt, std::vector<double>(got.rows32.begin(), got.rows32.end()));
    for (size_t r = 0; r < R.rows; r++)
        for (size_t x = 0; x < w; x++) {
            const double want = x < c0 ? got.stats[r * ns + x]
                                : x < u0 ? got.c[r * dz + x - c0]
                                : x < y0 ? got.u[r * d + x - u0]
                                : x < a0 ? got.out[r * dv + x - y0]
                                : got.aux.empty() ? 0.0
                                                  : got.aux[r * 2 + x - a0];
            const double have = kept[r * w + x];
            if (!(have == want || (have != have && want != want))) {
                v.note("rows32 (rounded) against stats | c | u | out | aux", INFINITY, r * w + x, want, have);
                return;
            }
        }
}

/* Rounding-error amplification of a row's bias normalization (tests/c/test_backward.c). */
double amp_of(const double *st, int x) {
    static const int mean_col[3] = {ASC_STAT_MEAN_A, ASC_STAT_MEAN_S, ASC_STAT_MEAN_C};
    if (!(st[ASC_STAT_COUNT] > 1.0)) return 0.0;
    const double m = fabs(st[mean_col[x]]), s = st[mean_col[x] + 1];
    return (m + s) / (s + 1e-6);
}

double row_amp(const double *st) { return std::max(amp_of(st, 0), std::max(amp_of(st, 1), amp_of(st, 2))); }

/* The neighbours' ranking value of query row i of (bh) and key j in double (for the near-tie check):
 * a_tj = h^_t . h^_j of its token t, or with neighbours = "scores" s_ij = scale q_i . k_j. */
double affinity(const Problem &P, int64_t bh, int64_t i, int64_t j) {
    const int64_t da = P.p.da, t = i + P.p.N - P.p.Nq - P.p.keys_after;
    if (P.p.neighbours == ASC_NEIGHBOURS_SCORES) {
        const int64_t d = P.p.d;
        double s = 0;
        for (int64_t f = 0; f < d; f++) s += P.x[0][(size_t)((bh * P.p.Nq + i) * d + f)] * P.x[1][(size_t)((bh * P.p.N + j) * d + f)];
        return P.p.scale * s;
    }
    const double *h = P.x[4].data() + bh * P.p.N * da;
    double ht = 0, hj = 0, dot = 0;
    for (int64_t f = 0; f < da; f++) {
        ht += h[t * da + f] * h[t * da + f];
        hj += h[j * da + f] * h[j * da + f];
        dot += h[t * da + f] * h[j * da + f];
    }
    return dot / (std::max(sqrt(ht), 1e-12) * std::max(sqrt(hj), 1e-12));
}

/*
 * The scale on which a row's MEAN_X and STD_X carry an absolute rounding error: |theta_X| times the
 * size of the inputs of w_X (w_A = k^_j.u and w_S = ws relu(a - delta) are at most 1 and 1 + |delta|;
 * w_C = ||z_j - c||^2 is formed from z_j and c, so max_j ||z_j||^2 + ||c||^2). A row whose bias is
 * analytically ~0 (N = 1: c = z_t / (1 + 1e-6)) has moments that are pure rounding noise on that scale.
 */
/* The size of a squared latent distance of row r: max_j ||z_j||^2 + ||c_i||^2. */
double latent_scale(const Problem &P, const Fwd &ref, size_t r) {
    const asc_params &p = P.p;
    const int64_t bh = (int64_t)r / p.Nq;
    double zz = 0.0, cc = 0.0;
    for (int64_t j = 0; j < p.N; j++) {
        double s2 = 0.0;
        for (int64_t f = 0; f < p.dz; f++) s2 += P.x[3][(size_t)((bh * p.N + j) * p.dz + f)] * P.x[3][(size_t)((bh * p.N + j) * p.dz + f)];
        zz = std::max(zz, s2);
    }
    for (int64_t f = 0; f < p.dz; f++) cc += ref.c[r * (size_t)p.dz + (size_t)f] * ref.c[r * (size_t)p.dz + (size_t)f];
    return zz + cc;
}

double moment_scale(const Problem &P, const Fwd &ref, size_t r, int x) {
    const asc_params &p = P.p;
    const int64_t bh = (int64_t)r / p.Nq, hd = bh % p.H;
    const double *st = ref.stats.data() + r * ASC_NSTAT;
    if (x == 0) return fabs(P.sc[SC_LA][(size_t)hd] * st[ASC_STAT_GATE_A]);
    if (x == 1) {
        const double eta = std::min(1.0, std::max(0.0, st[ASC_STAT_RHO] / (P.sc[SC_KAPPA][(size_t)hd] + 1e-6)));
        return fabs(P.sc[SC_LS][(size_t)hd] * eta) * (1.0 + fabs(P.sc[SC_DELTA][(size_t)hd]));
    }
    return fabs(P.sc[SC_LC][(size_t)hd] * st[ASC_STAT_GATE_C] / (p.tau_coh + 1e-6)) * latent_scale(P, ref, r);
}

struct RowSets {
    std::vector<char> tie, skip_s, skip_x[3], skip_s_or_tie, skip_x_or_tie[3];
    int n_tie = 0, n_skip = 0, n_zero_grad = 0;
    bool nbr_ok = true;
    std::string nbr_msg;
};

RowSets classify_rows(const Problem &P, const Fwd &ref, const Fwd &got, int dt) {
    const asc_params &p = P.p;
    const Tol &T = TOL[dt];
    RowSets S;
    S.tie.assign(P.rows, 0);
    S.skip_s.assign(P.rows, 0);
    for (auto &v : S.skip_x) v.assign(P.rows, 0);
    for (size_t r = 0; r < P.rows; r++) {
        const double *st = ref.stats.data() + r * ASC_NSTAT;
        S.skip_s[r] = row_amp(st) * T.u * 8.0 > T.fwd;
        for (int x = 0; x < 3; x++) S.skip_x[x][r] = amp_of(st, x) * T.u * 8.0 > T.fwd;
        S.n_skip += S.skip_s[r];
        const int64_t nn = p.n_nbr;
        bool same = true;
        for (int64_t n = 0; n < nn; n++) same &= ref.nbr[r * (size_t)nn + (size_t)n] == got.nbr[r * (size_t)nn + (size_t)n];
        if (same) continue;
        /* a differing list: a near-tie (position by position the affinities agree) or a failure */
        const int64_t bh = (int64_t)r / p.Nq, i = (int64_t)r % p.Nq;
        bool tie = T.tie > 0.0;
        for (int64_t n = 0; n < nn && tie; n++) {
            const int64_t a = ref.nbr[r * (size_t)nn + (size_t)n], b = got.nbr[r * (size_t)nn + (size_t)n];
            if (a == b) continue;
            if (a < 0 || b < 0 || b >= p.N) {
                tie = false;
                break;
            }
            tie = fabs(affinity(P, bh, i, a) - affinity(P, bh, i, b)) <= T.tie;
        }
        if (tie) {
            S.tie[r] = 1;
            S.n_tie++;
        } else if (S.nbr_ok) {
            S.nbr_ok = false;
            char b[160];
            snprintf(b, sizeof(b), "nbr of row %zu differ (first entries ref %lld got %lld)", r,
                     (long long)ref.nbr[r * (size_t)nn], (long long)got.nbr[r * (size_t)nn]);
            S.nbr_msg = b;
        }
    }
    S.skip_s_or_tie = S.skip_s;
    for (int x = 0; x < 3; x++) S.skip_x_or_tie[x] = S.skip_x[x];
    for (size_t r = 0; r < P.rows; r++) {
        S.skip_s_or_tie[r] |= S.tie[r];
        for (int x = 0; x < 3; x++) S.skip_x_or_tie[x][r] |= S.tie[r];
    }
    return S;
}

/* Rows whose reference has a NaN in some output. */
std::vector<char> poisoned_rows(const Fwd &ref, size_t rows) {
    std::vector<char> bad(rows, 0);
    for (const std::vector<double> *f : {&ref.out, &ref.stats, &ref.u, &ref.c, &ref.aux}) {
        const size_t per = rows ? f->size() / rows : 0;
        for (size_t r = 0; r < rows; r++)
            for (size_t e = 0; e < per; e++) bad[r] |= std::isnan((*f)[r * per + e]);
    }
    return bad;
}

bool row_finite(const std::vector<double> &x, size_t at, int64_t f) {
    for (int64_t e = 0; e < f; e++)
        if (!std::isfinite(x[at * (size_t)f + (size_t)e])) return false;
    return true;
}

/* Query token t of batch b sees key j through its window, a global token (j or t) and its document
 * (SPEC section 8, as the twin's allowed_keys writes it). */
bool structured_visible(const Problem &P, int64_t b, int64_t t, int64_t j) {
    const asc_params &p = P.p;
    const int64_t N = p.N;
    const bool near = (p.window_left < 0 || j >= t - p.window_left) && (p.window_right < 0 || j <= t + p.window_right);
    const bool global = j < p.n_global || t < p.n_global ||
                        (!P.gmask.empty() && (P.gmask[(size_t)(b * N + j)] || P.gmask[(size_t)(b * N + t)]));
    return (near || global) && (P.docs.empty() || P.docs[(size_t)(b * N + j)] == P.docs[(size_t)(b * N + t)]);
}

/* Rows that see a non-finite input (SPEC section 11; the twin's rule, `poisoned` in reference.py):
 * q_i, z_t, h_t the row's own token t (k_t too in the seed variant, whose heading is k^_t; the paper
 * variant's heading comes from the neighbours, so a NaN in its own k alone, a padded token's, reaches
 * no row); k_j, z_j, h_j the rows whose statistics set holds j (J(i) with mask_stats, every token
 * without); v_j the rows whose J(i) holds j (causal, key_padding_mask, attn_mask, SPEC section 8).
 * A row without any visible key sees nothing: its output is 0 whatever its inputs. The rows that see
 * one (SEES) are NaN in out and aux (nan_strict checks it); SPEC section 11 itself says only that no
 * other row is touched, in the output or in the gradients of a loss over the other rows. A row without
 * a visible key whose own token or statistics set has a non-finite input (EMPTY_TOUCHED) has out and
 * aux 0, compared; its stats, u and c are left out (with mask_stats = False the statistics of its set
 * are NaN in both kernels, values the twin does not return for such a row). It keeps its incoming
 * gradients: its output is a constant, so they reach nothing (both backwards skip such a row). */
enum { SEES = 1, EMPTY_TOUCHED = 2 };
std::vector<char> seeing_rows(const Problem &P) {
    const asc_params &p = P.p;
    const bool own_k = p.variant != ASC_VARIANT_PAPER;
    std::vector<char> sees(P.rows, 0);
    for (int64_t b = 0; b < p.B; b++)
        for (int64_t hd = 0; hd < p.H; hd++) {
            const int64_t bh = b * p.H + hd;
            std::vector<char> bad_k((size_t)p.N), bad_zh((size_t)p.N), bad_v((size_t)p.N);
            for (int64_t j = 0; j < p.N; j++) {
                const size_t at = (size_t)(bh * p.N + j);
                bad_k[(size_t)j] = !row_finite(P.x[1], at, p.d);
                bad_v[(size_t)j] = !row_finite(P.x[2], at, p.dv);
                bad_zh[(size_t)j] = !row_finite(P.x[3], at, p.dz) || !row_finite(P.x[4], at, p.da);
            }
            for (int64_t i = 0; i < p.Nq; i++) {
                const int64_t t = i + p.N - p.Nq - p.keys_after;
                bool seen = !row_finite(P.x[0], (size_t)(bh * p.Nq + i), p.d) || bad_zh[(size_t)t] ||
                            (own_k && bad_k[(size_t)t]);
                for (int s = 0; s < NSC; s++) seen |= !std::isfinite(P.sc[s][(size_t)hd]); /* its head's scalars */
                bool any_j = false;
                for (int64_t j = 0; j < p.N; j++) {
                    bool in_j = !(p.is_causal && j > t) && (P.kpm.empty() || !P.kpm[(size_t)(b * p.N + j)]);
                    if (in_j && !P.am.empty())
                        in_j = P.am[(size_t)(b * p.am_sb + hd * p.am_sh + i * p.am_si + j * p.am_sj)] != 0;
                    in_j = in_j && structured_visible(P, b, t, j);
                    const bool in_t = p.mask_stats ? in_j : true;
                    any_j |= in_j;
                    seen |= (in_t && (bad_k[(size_t)j] || bad_zh[(size_t)j])) || (in_j && bad_v[(size_t)j]);
                }
                sees[(size_t)(bh * p.Nq + i)] = !seen ? 0 : any_j ? SEES : EMPTY_TOUCHED;
            }
        }
    return sees;
}

/* NaN into the rows `bad` of a field of `rows` rows: compare_field then leaves them out. */
void leave_out(std::vector<double> &f, size_t rows, const std::vector<char> &bad) {
    const size_t per = rows ? f.size() / rows : 0;
    for (size_t r = 0; r < rows; r++)
        if (bad[r]) std::fill_n(f.begin() + (long)(r * per), per, NAN);
}

/* seen (non-finite inputs): the rows that see one, left out of every field; a row that cannot see
 * one must have the reference's finite values (and the reference must have them). strict: a row that
 * sees one must be NaN in every entry of out and aux (the twin's rule), with the maps in every entry
 * of all five maps, in the reference too (the CPU kernels' asc_row_sick), and some row must see it
 * (none where `unseen`: the twin's rule says no row does). With maps, a row that cannot see one has
 * its NaN entries (a column q.k_j of a NaN key in S_base) exactly where the reference has them. */
Verdict compare_fwd(const Problem &P, const Fwd &ref_in, const Fwd &got, const RowSets &S, bool maps, int dt,
                    const std::vector<char> *seen, bool strict, bool unseen) {
    const size_t rows = P.rows;
    const bool nan = seen != nullptr;
    Fwd ref = ref_in;
    Verdict v;
    if (nan) {
        const std::vector<char> bad = poisoned_rows(ref_in, rows);
        for (size_t r = 0; r < rows; r++)
            if (bad[r] && !(*seen)[r]) v.note("cpu: NaN in a row that cannot see the non-finite input", INFINITY, r, 0, 0);
        for (size_t r = 0; r < rows; r++) {
            if ((*seen)[r] != EMPTY_TOUCHED) continue;
            for (const Fwd *f : {&ref_in, &got})
                for (const std::vector<double> *x : {&f->out, &f->aux}) {
                    const size_t per = x->size() / rows;
                    for (size_t e = 0; e < per; e++)
                        if ((*x)[r * per + e] != 0.0)
                            v.note(std::string(f == &got ? "" : "cpu: ") + "out or aux of a row without a visible key is not 0",
                                   INFINITY, r * per + e, 0, (*x)[r * per + e]);
                }
        }
    }
    if (nan && strict) {
        size_t n_seen = 0;
        for (size_t r = 0; r < rows; r++) {
            if ((*seen)[r] != SEES) continue;
            n_seen++;
            bool all_nan = true;
            for (const std::vector<double> *f : {&got.out, &got.aux}) {
                const size_t per = f->size() / rows;
                for (size_t e = 0; e < per; e++) all_nan &= std::isnan((*f)[r * per + e]);
            }
            if (!all_nan) v.note("a row that sees the non-finite input is not NaN", INFINITY, r, 0, 0);
            for (int m = 0; maps && m < NMAP; m++) {
                const size_t per = (size_t)P.p.N;
                bool ref_nan = true, got_nan = true;
                for (size_t e = 0; e < per; e++) {
                    ref_nan &= std::isnan(ref_in.map[m][r * per + e]);
                    got_nan &= std::isnan(got.map[m][r * per + e]);
                }
                if (!ref_nan) v.note(std::string("cpu: ") + map_name[m] + " of a row that sees the non-finite input is not NaN",
                                     INFINITY, r, 0, 0);
                if (!got_nan) v.note(std::string(map_name[m]) + " of a row that sees the non-finite input is not NaN",
                                     INFINITY, r, 0, 0);
            }
        }
        if (n_seen == 0 && !unseen) v.note("no row sees the non-finite input", INFINITY, 0, 0, 0);
        if (n_seen != 0 && unseen) v.note("a row sees a non-finite input that the twin's rule hides", INFINITY, 0, 0, 0);
    }
    if (nan && maps)
        for (int m = 0; m < NMAP; m++) {
            const size_t per = (size_t)P.p.N;
            for (size_t r = 0; r < rows; r++) {
                if ((*seen)[r] == SEES) continue;
                for (size_t e = 0; e < per; e++)
                    if (std::isnan(ref_in.map[m][r * per + e]) != std::isnan(got.map[m][r * per + e])) {
                        v.note(std::string(map_name[m]) + ": NaN pattern of a row that cannot see the non-finite input",
                               INFINITY, r * per + e, ref_in.map[m][r * per + e], got.map[m][r * per + e]);
                        break;
                    }
            }
        }
    if (nan) {
        std::vector<char> sees(rows); /* out, aux and the maps of an EMPTY_TOUCHED row are compared */
        for (size_t r = 0; r < rows; r++) sees[r] = (*seen)[r] == SEES;
        for (std::vector<double> *f : {&ref.stats, &ref.u, &ref.c}) leave_out(*f, rows, *seen);
        for (std::vector<double> *f : {&ref.out, &ref.aux}) leave_out(*f, rows, sees);
        for (int m = 0; m < NMAP; m++) leave_out(ref.map[m], rows, sees);
    }
    const double ae = storage_abs_error(dt);
    if (got.rc != 0) v.note(std::string("rc ") + cudaGetErrorString((cudaError_t)got.rc), INFINITY, 0, 0, got.rc);
    if (!S.nbr_ok) v.note(S.nbr_msg, INFINITY, 0, 0, 0);
    compare_field(v, "out", ref.out, got.out, rows, &S.skip_s_or_tie, 0.0, false, ae, nan);
    for (int s = 0; s < ASC_NSTAT; s++) {
        std::vector<double> rc(rows), gc(rows);
        for (size_t r = 0; r < rows; r++) {
            rc[r] = ref.stats[r * ASC_NSTAT + (size_t)s];
            gc[r] = got.stats[r * ASC_NSTAT + (size_t)s];
        }
        const std::string name = std::string("stats.") + stat_name[s];
        if (s == ASC_STAT_LSE) compare_field(v, name, rc, gc, rows, &S.skip_s_or_tie, 0.0, false, ae, nan);
        else if (s == ASC_STAT_RHO || s == ASC_STAT_WC_SUM) compare_field(v, name, rc, gc, rows, nullptr, 1e-30, true, ae, nan);
        else if (s == ASC_STAT_COUNT) compare_field(v, name, rc, gc, rows, nullptr, 0.0, true, ae, nan);
        else if (s >= ASC_STAT_MEAN_A && s <= ASC_STAT_STD_C) {
            double floor = 0.0;
            for (size_t r = 0; r < rows; r++) floor = std::max(floor, moment_scale(P, ref, r, (s - ASC_STAT_MEAN_A) / 2));
            compare_field(v, name, rc, gc, rows, &S.tie, floor, false, ae, nan);
        } else if (s == ASC_STAT_COH_SPREAD) { /* a mean squared distance: judged against the distances' size */
            double floor = 0.0;
            for (size_t r = 0; r < rows; r++) floor = std::max(floor, latent_scale(P, ref, r));
            compare_field(v, name, rc, gc, rows, &S.tie, floor, false, ae, nan);
        } else {
            compare_field(v, name, rc, gc, rows, &S.tie, 0.0, false, ae, nan);
        }
    }
    compare_field(v, "u", ref.u, got.u, rows, &S.tie, 0.0, false, ae, nan);
    compare_field(v, "c", ref.c, got.c, rows, nullptr, 0.0, false, ae, nan);
    compare_field(v, "aux", ref.aux, got.aux, rows, &S.skip_s_or_tie, 0.0, false, ae, nan);
    if (maps) {
        compare_field(v, map_name[MAP_SBASE], ref.map[MAP_SBASE], got.map[MAP_SBASE], rows, nullptr, 0.0, false, ae, nan);
        for (int x = 0; x < 3; x++) /* a normalized row has entries of order 1 */
            compare_field(v, map_name[MAP_ALIGN + x], ref.map[MAP_ALIGN + x], got.map[MAP_ALIGN + x], rows,
                          &S.skip_x_or_tie[x], 1.0, false, ae, nan);
        compare_field(v, map_name[MAP_ATTN], ref.map[MAP_ATTN], got.map[MAP_ATTN], rows, &S.skip_s_or_tie, 0.0, false, ae, nan);
    }
    return v;
}

/* Every gradient, those of the tokens with a non-finite input included: with non-finite inputs the
 * incoming gradients are a loss over the rows that cannot see them (run_case), whose gradients SPEC
 * section 11 wants finite everywhere, and equal to the reference's. A NaN anywhere fails. */
Verdict compare_bwd(const Problem &P, const Bwd &ref, const Bwd &got, int dt) {
    const asc_params &p = P.p;
    Verdict v;
    if (got.rc != 0) v.note(std::string("rc ") + cudaGetErrorString((cudaError_t)got.rc), INFINITY, 0, 0, got.rc);
    if (ref.rc != 0) v.note("cpu rc", INFINITY, 0, 0, ref.rc);
    /* groups: five tensors, nine scalars over H, dattn_bias, dsinks over H (with sinks) */
    std::vector<std::pair<std::vector<double>, std::vector<double>>> gr;
    for (int t = 0; t < NIN; t++) gr.push_back({ref.g[t], got.g[t]});
    for (int s = 0; s < NSC; s++)
        gr.push_back({std::vector<double>(ref.dsc.begin() + s * p.H, ref.dsc.begin() + (s + 1) * p.H),
                      std::vector<double>(got.dsc.begin() + s * p.H, got.dsc.begin() + (s + 1) * p.H)});
    gr.push_back({ref.dbias, got.dbias});
    if (!P.sinks.empty()) gr.push_back({ref.dsinks, got.dsinks});
    double maxall = 0.0;
    for (auto &g : gr)
        for (double x : g.first)
            if (std::isfinite(x)) maxall = std::max(maxall, fabs(x));
    for (size_t i = 0; i < gr.size(); i++)
        compare_field(v, group_name[i], gr[i].first, gr[i].second, 1, nullptr, FLOOR_REL * maxall, false,
                      storage_abs_error(dt));
    return v;
}

/* ---------------------------------------------------------------- driver */

struct Totals {
    int pass = 0, fail = 0;
    double worst_fwd[NDT] = {0, 0, 0, 0}, worst_bwd[NDT] = {0, 0, 0, 0};
    double worst_mag_fwd[NDT] = {0, 0, 0, 0}, worst_mag_bwd[NDT] = {0, 0, 0, 0};
    int mag_sens = 0; /* case x dtype runs bounded by the CPU kernel's own error instead of TOL_MAG */
    int ties = 0, skipped = 0, zeroed = 0, rows = 0;
};

std::string describe(const CaseDef &c) {
    char b[256], o[224];
    snprintf(o, sizeof(o), "%s%s%s%s%s%s%s%s%s",
             c.wl >= 0 || c.wr >= 0 ? (" window(" + std::to_string(c.wl) + "," + std::to_string(c.wr) + ")").c_str() : "",
             c.n_global ? (" global" + std::to_string(c.n_global)).c_str() : "", c.gmask ? " gmask" : "",
             c.docs == DOC_RUNS ? " docs" : (c.docs == DOC_ALTERNATE ? " docs(alternate)" : ""),
             c.softcap > 0 ? (" softcap" + std::to_string(c.softcap).substr(0, 4)).c_str() : "",
             c.outside ? "(outside)" : "", c.scores ? " scores" : "",
             c.dropout > 0 ? (" dropout" + std::to_string(c.dropout).substr(0, 4)).c_str() : "", c.sinks == SINK_HEAD ? " sinks" : c.sinks ? " row-sinks" : "");
    snprintf(b, sizeof(b), "%-5s N=%-3lld%s B=%lld H=%lld d=%lld dv=%lld dz=%lld da=%lld k=%-3lld%s ms=%d kpm=%s am=%s%s%s%s%s%s%s%s%s%s%s%s%s",
             c.variant == ASC_VARIANT_PAPER ? "paper" : "seed", (long long)c.N,
             c.Nq >= 0 ? (" Nq=" + std::to_string(c.Nq) + (c.after ? "+" + std::to_string(c.after) : "")).c_str() : "",
             (long long)c.B, (long long)c.H,
             (long long)c.d, (long long)c.dv, (long long)c.dz, (long long)c.da, (long long)c.k,
             c.causal ? " causal" : "", c.ms, kpm_name[c.kpm], amm_name[c.am], c.am_zero ? "+zerorow" : "",
             dup_name[c.dup], c.maps ? " maps" : "", ab_name[c.bias], c.alibi ? " alibi" : "",
             c.gaux ? " gaux" : "", c.gu ? " gu" : "", c.defaults ? " defaults" : "", c.tiny ? " tiny" : "",
             nan_name[c.nan], c.nan_strict ? "(NaN rows)" : "", c.hamp != 1.0 ? " big-h" : "");
    return std::string(b) + o + (c.smem_optin ? " optin=" + std::to_string(c.smem_optin) : "") +
           (c.sms ? " sms=" + std::to_string(c.sms) : "");
}

/* Every gradient of a and b has the same bits (NaN payloads aside). */
bool same_bits(const Bwd &a, const Bwd &b) {
    auto same = [](const std::vector<double> &x, const std::vector<double> &y) {
        if (x.size() != y.size()) return false;
        for (size_t e = 0; e < x.size(); e++)
            if (!(x[e] == y[e] || (x[e] != x[e] && y[e] != y[e]))) return false;
        return true;
    };
    bool ok = a.rc == b.rc && same(a.dsc, b.dsc) && same(a.dbias, b.dbias) && same(a.dsinks, b.dsinks);
    for (int t = 0; t < NIN; t++) ok &= same(a.g[t], b.g[t]);
    return ok;
}

/* seconds since t0: each case line ends with its time, which is how the grid's shards are balanced */
double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/* Whether the device is the emulator at the shared-memory opt-in the case's refuse_fwd / refuse_bwd describe: its
 * own (smem_optin), else the emulator's default (an A100's). */
bool case_smem_optin(const CaseDef &c) {
#ifdef ASC_CUDA_EMU
    return c.smem_optin > 0 || getenv("ASC_EMU_SMEM_OPTIN") == nullptr;
#else
    (void)c;
    return false;
#endif
}

/* The case's opt-in and SMs for the emulated device while it lives (on a GPU: the device's own). */
struct CaseDevice {
#ifdef ASC_CUDA_EMU
    asc_emu_settings saved = asc_emu_get_settings();
    explicit CaseDevice(const CaseDef &c) {
        if (c.smem_optin > 0) asc_emu_set_smem_optin(c.smem_optin);
        if (c.sms > 0) asc_emu_set_sms(c.sms);
    }
    ~CaseDevice() {
        asc_emu_set_smem_optin(saved.smem_optin);
        asc_emu_set_sms(saved.sms);
    }
#else
    explicit CaseDevice(const CaseDef &) {}
#endif
};

/* A launcher given a call its kernels' shared memory does not fit: cudaErrorInvalidValue, nothing else. */
void refused(int rc, const char *what, Verdict &v) {
    if (rc != (int)cudaErrorInvalidValue)
        v.note(std::string(what) + " not refused: rc " + cudaGetErrorString((cudaError_t)rc), INFINITY, 0,
               (double)cudaErrorInvalidValue, rc);
}

/* One dtype's verdicts of a case, with the runtime's errors and the emulator's leaks, into the totals and
 * the case's line; whether they pass. */
bool account(int dt, const Verdict &vf, Verdict vb, const RowSets &S, int zeroed, int rows, long long live0,
             const char *tag, Totals &tot, std::string &line) {
    const Tol &T = TOL[dt];
    if (harness_cuda_error() != cudaSuccess)
        vb.note(std::string("CUDA runtime: ") + cudaGetErrorString(harness_cuda_error()), INFINITY, 0, 0, 0);
#ifdef ASC_CUDA_EMU
    if (asc_emu_live_allocations() != live0)
        vb.note("device allocations leaked", INFINITY, 0, (double)live0, (double)asc_emu_live_allocations());
#else
    (void)live0;
#endif
    const bool okf = vf.err <= T.fwd, okb = vb.err <= T.bwd;
    tot.worst_fwd[dt] = std::max(tot.worst_fwd[dt], vf.err);
    tot.worst_bwd[dt] = std::max(tot.worst_bwd[dt], vb.err);
    tot.ties += S.n_tie;
    tot.skipped += S.n_skip;
    tot.zeroed += zeroed;
    tot.rows += rows;
    char b[512];
    snprintf(b, sizeof(b), " | %s fwd %.1e bwd %.1e%s%s%s%s%s", dt_name(dt), vf.err, vb.err, tag,
             okf ? "" : (" FWD@" + vf.where).c_str(), okb ? "" : (" BWD@" + vb.where).c_str(),
             S.n_tie ? (" ties " + std::to_string(S.n_tie)).c_str() : "",
             (S.n_skip || zeroed) ? (" left out " + std::to_string(S.n_skip) + "/" + std::to_string(zeroed)).c_str()
                                  : "");
    line += b;
    return okf && okb;
}

bool run_case(int idx, const CaseDef &c, const std::vector<int> &dts, Totals &tot, bool quiet, bool determinism) {
    const auto t0 = std::chrono::steady_clock::now();
    const CaseDevice device(c);
    const Problem P = make_problem(c);
    bool ok = true;
    std::string line;
    for (int dt : dts) {
        if (dt == DT_F16 && c.hamp > 65504.0) continue; /* h would round to Inf */
        if (c.skip_dt >> dt & 1) continue;
        const Tol &T = TOL[dt];
        const Problem R = rounded_problem(P, dt);
        harness_cuda_error() = cudaSuccess;
        long long live0 = 0;
#ifdef ASC_CUDA_EMU
        asc_emu_reset();
        live0 = asc_emu_live_allocations();
#endif
        /* a launcher whose kernels do not find their shared memory (ascender_cuda_fits) fails cleanly, and the
         * emulator at its default opt-in refuses exactly what the case says */
        const bool fits_fwd = ascender_cuda_fits(&R.p, cuda_code(dt), 0) != 0;
        const bool fits_bwd = ascender_cuda_fits(&R.p, cuda_code(dt), 1) != 0;
        const bool want_fwd = !(c.refuse_fwd >> dt & 1), want_bwd = !(c.refuse_bwd >> dt & 1);
        Verdict vfit;
        if (case_smem_optin(c) && (fits_fwd != want_fwd || fits_bwd != want_bwd))
            vfit.note("ascender_cuda_fits (fwd + 2 bwd)", INFINITY, 0, want_fwd + 2 * want_bwd, fits_fwd + 2 * fits_bwd);
        /* the row shapes the launchers choose on the case's emulated device (wide_rows): what a GPU with its shared
         * memory runs (on a GPU the device is whatever it is: not checked) */
        const int wide = asc_tiled_wide_rows(&R.p, cuda_code(dt)), want_wide = c.wide >> dt & 1 ? c.wide_bits : 0;
        if (case_smem_optin(c) && c.smem_optin > 0 && c.wide >= 0 && wide != want_wide)
            vfit.note("asc_tiled_wide_rows (fwd + 2 B1 + 4 B2r + 8 B2c)", INFINITY, 0, want_wide, wide);
        const Fwd ref = cpu_fwd(R, c.maps);
        const Fwd got = cuda_fwd(R, dt, c.maps);
        if (!fits_fwd) {
            refused(got.rc, "forward", vfit);
            ok &= account(dt, vfit, Verdict(), RowSets(), 0, 0, live0, " (refused)", tot, line);
            continue;
        }
        const RowSets S = classify_rows(R, ref, got, dt);
        const std::vector<char> seen = c.nan != NAN_NONE ? seeing_rows(R) : std::vector<char>(R.rows, 0);
        Verdict vf = compare_fwd(R, ref, got, S, c.maps, dt, c.nan != NAN_NONE ? &seen : nullptr, c.nan_strict,
                                 c.nan_unseen);
        check_rows32(R, got, dt, vf);
        vf.merge(vfit);
        if (ref.rc) vf.note("cpu rc", INFINITY, 0, 0, ref.rc);
        if (R.p.Nq <= 8 && !c.maps) { /* the decode kernels (generation), held to the forward's bounds */
            const Fwd dec = cuda_fwd(R, dt, false, true);
            const RowSets SD = classify_rows(R, ref, dec, dt);
            Verdict vd = compare_fwd(R, ref, dec, SD, false, dt, c.nan != NAN_NONE ? &seen : nullptr, c.nan_strict,
                                     c.nan_unseen);
            vd.where = "decode " + vd.where;
            vf.merge(vd);
        }

        /* incoming gradients, zero on the rows that cannot be pinned at this precision and on the rows
         * that see a non-finite input (the loss is over the other rows: SPEC section 11); a row without
         * a visible key keeps them */
        std::vector<double> gout = R.gout, gaux = R.gaux, gu = R.gu;
        int zeroed = 0;
        for (size_t r = 0; r < R.rows; r++) {
            if (!(row_amp(ref.stats.data() + r * ASC_NSTAT) > T.amp_bwd) && !S.tie[r] && seen[r] != SEES) continue;
            zeroed++;
            std::fill_n(gout.begin() + (long)(r * (size_t)R.p.dv), R.p.dv, 0.0);
            if (!gaux.empty()) std::fill_n(gaux.begin() + (long)(r * 2), 2, 0.0);
            if (!gu.empty()) std::fill_n(gu.begin() + (long)(r * (size_t)R.p.d), R.p.d, 0.0);
        }
        const Bwd gref = cpu_bwd(R, gout, gaux, gu);
        const Bwd ggot = cuda_bwd(R, dt, gout, gaux, gu, &got);
        Verdict vb;
        if (fits_bwd) vb = compare_bwd(R, gref, ggot, dt);
        else refused(ggot.rc, "backward", vb);
        if (dt != DT_F64 && (c.dropout > 0 || c.outside || c.after) && !ggot.tiled) /* issue 26: these options */
            vb.note("took the row-per-warp kernels", INFINITY, 0, 0, 0);             /* are the tiled kernels' */
        if (determinism && ggot.tiled && !ggot.rc) {
            /* the tiled backward: the same gradients, bit for bit, from a second run without the saved outputs
             * (it runs the forward first), with the warps released in another order and the blocks by another number
             * of workers: one, or two if the grid runs on one (the row-per-warp backward adds its columns with
             * atomics: not bit-reproducible) */
#ifdef ASC_CUDA_EMU
            const asc_emu_settings was = asc_emu_get_settings();
            asc_emu_set_order(ASC_EMU_REVERSE, 7);
            asc_emu_set_workers(was.workers > 1 ? 1 : 2);
#endif
            const Bwd again = cuda_bwd(R, dt, gout, gaux, gu);
#ifdef ASC_CUDA_EMU
            asc_emu_set_order(was.order, was.seed);
            asc_emu_set_workers(was.workers);
#endif
            if (!same_bits(ggot, again)) vb.note("not deterministic", INFINITY, 0, 0, 0);
        }
        ok &= account(dt, vf, vb, S, zeroed, (int)R.rows, live0, fits_bwd ? "" : " (bwd refused)", tot, line);
    }
    if (!quiet || !ok)
        printf("[%3d] %s%s | %s (%.1f s)\n", idx, describe(c).c_str(), line.c_str(), ok ? "ok" : "FAIL", since(t0));
    fflush(stdout);
    if (ok) tot.pass++;
    else tot.fail++;
    return ok;
}

uint64_t g_seed_shift = 0; /* --seed-shift */

/* The case grid: the CPU tests' sweep (tests/c/test_kernels.c) plus the CUDA-specific edges. */
std::vector<CaseDef> ascender_cases(bool reduced) {
    std::vector<CaseDef> cs;
    uint64_t seed = 1 + g_seed_shift;
    const int variants[2] = {ASC_VARIANT_SEED, ASC_VARIANT_PAPER};
    const std::vector<int64_t> Ns = reduced ? std::vector<int64_t>{1, 33} : std::vector<int64_t>{1, 2, 7, 33, 65};
    const auto add_case = [&](CaseDef c, int var) { /* a targeted case for one variant, with the next seed */
        c.variant = var;
        c.seed = seed++;
        cs.push_back(c);
    };
    for (int var : variants)
        for (int64_t N : Ns)
            for (int cfg = 0; cfg < 8; cfg++) {
                CaseDef c;
                c.variant = var;
                c.N = N;
                c.seed = seed++;
                switch (cfg) {
                    case 0: c.maps = 1; c.gaux = 1; c.gu = 1; break;                     /* no masks */
                    case 1: c.causal = 1; c.bias = AB_FULL; break;                       /* causal, short rows */
                    case 2: c.causal = 1; c.maps = 1; c.alibi = 1; break;                /* causal, full rows (maps) */
                    case 3: c.kpm = KPM_B1ALL; c.maps = 1; c.gaux = 1; break;            /* batch 1 fully padded */
                    case 4: c.am = AMM_HEAD_BCAST; c.am_zero = 1; c.ms = 0; c.maps = 1; c.bias = AB_HEAD; break;
                    case 5: c.am = AMM_FULL; c.kpm = KPM_RANDOM; c.causal = 1; c.dup = DUP_SOME; c.gu = 1; break;
                    case 6: c.causal = 1; c.kpm = KPM_RANDOM; c.ms = 0; c.maps = 1; c.alibi = 1; c.bias = AB_SHARED; break;
                    default: c.am = AMM_SHARED; c.am_zero = 1; c.dup = DUP_SOME; c.maps = 1; c.gaux = 1; break;
                }
                cs.push_back(c);
            }
    for (int var : variants) {
        const auto add = [&](CaseDef c) { add_case(c, var); };
        CaseDef c;
        c = CaseDef(); c.N = 41; c.Nq = 13; c.causal = 1; c.bias = AB_HEAD; c.alibi = 1; c.gu = 1; add(c); /* decode */
        c = CaseDef(); c.N = 37; c.Nq = 1; c.causal = 1; c.kpm = KPM_RANDOM; c.maps = 1; add(c);
        c = CaseDef(); c.N = 70; c.k = 40; c.dv = 96; c.causal = 1; c.gaux = 1; add(c);       /* list > one tile, kept
        in O's spare columns (dv > dz: docs/cuda.md, "Shared memory") */
        c = CaseDef(); c.N = 45; c.causal = 1; c.nan = NAN_LAST; c.gaux = 1; add(c);           /* NaN in a future token */
        if (reduced) continue;
        c = CaseDef(); c.N = 40; c.Nq = 9; c.causal = 1; c.nan = NAN_LAST; c.maps = 1; add(c);
        c = CaseDef(); c.N = 37; c.nan = NAN_PAD_K; c.gu = 1; c.nan_strict = 1; c.nan_unseen = var == ASC_VARIANT_PAPER;
        add(c); /* seed: the own row's heading k^_t is NaN; paper: no row reads the padded k */
        c = CaseDef(); c.N = 9; c.Nq = 5; c.am = AMM_TRANSPOSED; c.am_zero = 1; c.maps = 1; c.bias = AB_FULL; add(c);
        c = CaseDef(); c.N = 7; c.k = 100; c.maps = 1; add(c);                               /* k > N */
        c = CaseDef(); c.N = 7; c.k = 0; c.maps = 1; add(c);                                 /* k = 0 */
        c = CaseDef(); c.N = 32; c.k = 31; c.gaux = 1; c.gu = 1; add(c);                     /* one full tile */
        c = CaseDef(); c.N = 64; c.causal = 1; c.kpm = KPM_RANDOM; c.k = 8; add(c);          /* two full tiles */
        c = CaseDef(); c.N = 9; c.dup = DUP_ALL; c.maps = 1; c.gaux = 1; add(c);             /* constant rows */
        c = CaseDef(); c.N = 9; c.dup = DUP_ALL; c.causal = 1; c.maps = 1; add(c);
        c = CaseDef(); c.N = 8; c.dup = DUP_ZERO; c.maps = 1; c.gu = 1; add(c);               /* zero k, h rows */
        c = CaseDef(); c.N = 12; c.dup = DUP_SOME; c.k = 3; c.maps = 1; add(c);               /* ties in top-k */
        c = CaseDef(); c.N = 20; c.d = 1; c.k = 4; c.gaux = 1; c.gu = 1; add(c); /* d = 1: unit keys +-1 cancel, zero headings */
        c = CaseDef(); c.N = 20; c.dz = 0; c.da = 0; c.gaux = 1; c.gu = 1; add(c); /* no latent or affinity features: the
        products' zero-width path (score) */
        c = CaseDef(); c.N = 37; c.causal = 1; c.nan = NAN_HEAD; c.nan_strict = 1; c.maps = 1; c.gaux = 1; c.gu = 1;
        add(c); /* a NaN omega in head 0 */
        c = CaseDef(); c.N = 11; c.kpm = KPM_FIRST; c.causal = 1; c.maps = 1; c.gaux = 1; add(c); /* row 0 empty */
        c = CaseDef(); c.N = 6; c.kpm = KPM_B1ALL; c.am = AMM_FULL; c.am_zero = 1; c.ms = 0; c.maps = 1; add(c);
        c = CaseDef(); c.N = 16; c.defaults = 1; c.maps = 1; add(c);                         /* seed defaults */
        c = CaseDef(); c.N = 13; c.B = 1; c.H = 1; c.d = 40; c.dv = 2; c.dz = 1; c.da = 7; c.maps = 1; add(c); /* d > 32 */
        c = CaseDef(); c.N = 20; c.B = 3; c.H = 3; c.d = 3; c.dv = 35; c.dz = 6; c.da = 2; c.am = AMM_BATCH_BCAST;
        c.kpm = KPM_RANDOM; c.gaux = 1; add(c);
        c = CaseDef(); c.N = 24; c.zamp = 4.0; c.maps = 1; add(c);                           /* spread latents */
        c = CaseDef(); c.N = 9; c.tiny = 1; c.am = AMM_FULL; c.k = 2; c.gu = 1; add(c);      /* epsilon paths */
        c = CaseDef(); c.N = 33; c.hamp = 3e19; c.variant = ASC_VARIANT_PAPER; c.maps = 1; c.gu = 1; add(c); /* h^2 > FLT_MAX:
        the affinity is formed from unit rows (issue 17 item 5) */
        c = CaseDef(); c.N = 40; c.B = 1; c.H = 2; c.d = 64; c.dv = 64; c.dz = 32; c.da = 32; c.k = 16; c.causal = 1;
        c.gaux = 1; add(c); /* the benchmark's feature sizes */
    }
    /* SPEC sections 8 and 9 (the CPU kernels implement them: docs/tiling.md section 6): windows (both
     * sides bounded, one unbounded, with causal, padding and attention masks), global tokens and a
     * global mask (a global row sees every key), packed documents (runs, and one document in several
     * runs), their combinations, decode rows, empty visible rows (a window of the token alone, padded;
     * a zero attn_mask row), softcap (alone, and with masks, bias, ALiBi), neighbours = "scores" (the
     * reference variant ignores it), NaN in a key hidden by a window or a document from the other
     * rows. N up to 200 (7 tiles): a windowed block skips tiles, a far global key brings one back. */
    const auto add_structured = [&](bool few) {
        for (int var : variants) {
            const auto add = [&](CaseDef c) { add_case(c, var); };
            CaseDef c;
            c = CaseDef(); c.N = 100; c.wl = 3; c.wr = 2; c.maps = 1; c.gaux = 1; c.gu = 1; add(c);
            c = CaseDef(); c.N = 130; c.wl = 5; c.causal = 1; c.n_global = 2; c.kpm = KPM_RANDOM; c.gaux = 1; add(c);
            c = CaseDef(); c.N = 70; c.wl = 4; c.wr = 4; c.gmask = 1; c.docs = DOC_RUNS; c.am = AMM_FULL; c.bias = AB_FULL;
            c.gu = 1; add(c);
            c = CaseDef(); c.N = 70; c.softcap = 0.5; c.causal = 1; c.kpm = KPM_RANDOM; c.scores = 1; c.gaux = 1; c.gu = 1;
            add(c);
            /* SPEC sections 9 and 9b: an outside softcap with bias and ALiBi, dropout */
            c = CaseDef(); c.N = 70; c.dropout = 0.25; c.softcap = 0.8; c.outside = 1; c.bias = AB_HEAD; c.alibi = 1;
            c.causal = 1; c.gaux = 1; c.gu = 1; add(c);
            if (few) continue;
            c = CaseDef(); c.N = 40; c.softcap = 0.6; c.outside = 1; c.bias = AB_FULL; c.alibi = 1; c.maps = 1; c.gaux = 1;
            add(c);
            c = CaseDef(); c.N = 70; c.dropout = 0.5; c.maps = 1; c.gaux = 1; c.gu = 1; add(c); /* maps: A, no mask */
            c = CaseDef(); c.N = 70; c.Nq = 8; c.after = 20; c.dropout = 0.1; c.kpm = KPM_RANDOM; c.alibi = 1;
            c.bias = AB_SHARED; add(c); /* the rows' tokens (query_offset: 20 keys after them), decode */
            c = CaseDef(); c.N = 70; c.dropout = 0.3; c.sinks = 1; c.causal = 1; c.gaux = 1; c.gu = 1;
            add(c); /* a sink has no value: nothing to drop there, dsinks with the dropped output */
            c = CaseDef(); c.N = 70; c.wr = 6; c.am = AMM_SHARED; c.am_zero = 1; c.maps = 1; add(c); /* left unbounded */
            c = CaseDef(); c.N = 70; c.wl = 6; c.kpm = KPM_RANDOM; c.gaux = 1; add(c);                /* right unbounded */
            c = CaseDef(); c.N = 70; c.wr = 0; c.causal = 1; c.gaux = 1; add(c);                     /* = causal */
            c = CaseDef(); c.N = 200; c.B = 1; c.wl = 2; c.wr = 2; c.gmask = 1; c.maps = 1; c.gaux = 1; c.gu = 1; add(c);
            c = CaseDef(); c.N = 100; c.wl = 0; c.wr = 0; c.n_global = 3; c.gmask = 1; c.causal = 1; c.gaux = 1; add(c);
            c = CaseDef(); c.N = 70; c.docs = DOC_RUNS; c.maps = 1; c.gaux = 1; c.gu = 1; add(c);
            c = CaseDef(); c.N = 70; c.docs = DOC_ALTERNATE; c.causal = 1; c.kpm = KPM_RANDOM; c.n_global = 1; add(c);
            c = CaseDef(); c.N = 70; c.docs = DOC_RUNS; c.wl = 8; c.wr = 8; c.gmask = 1; c.am = AMM_HEAD_BCAST; c.gaux = 1;
            add(c);
            c = CaseDef(); c.N = 70; c.Nq = 9; c.after = 15; c.wl = 10; c.wr = 0; c.causal = 1; c.n_global = 3;
            c.docs = DOC_RUNS; c.gu = 1; add(c); /* decode rows, 15 keys after them (B2c's query tiles) */
            c = CaseDef(); c.N = 11; c.wl = 0; c.wr = 0; c.kpm = KPM_FIRST; c.maps = 1; c.gaux = 1; c.gu = 1; add(c);
            c = CaseDef(); c.N = 40; c.softcap = 2.0; c.maps = 1; c.gaux = 1; c.gu = 1; add(c);
            c = CaseDef(); c.N = 40; c.softcap = 0.3; c.bias = AB_HEAD; c.alibi = 1; c.am = AMM_FULL; c.am_zero = 1;
            c.maps = 1; add(c);
            c = CaseDef(); c.N = 70; c.k = 6; c.scores = 1; c.maps = 1; c.gaux = 1; c.gu = 1; add(c);
            c = CaseDef(); c.N = 45; c.k = 40; c.scores = 1; c.causal = 1; c.am = AMM_FULL; c.gu = 1; add(c); /* > a tile */
            c = CaseDef(); c.N = 70; c.wl = 3; c.wr = 3; c.nan = NAN_VIS_H; c.nan_strict = 1; c.gaux = 1; add(c);
            c = CaseDef(); c.N = 70; c.docs = DOC_RUNS; c.nan = NAN_MASKED; c.nan_strict = 1; c.gaux = 1; c.gu = 1; add(c);
        }
    };
    /* SPEC section 12, attention sinks: plain, causal with an empty row 0 (no gradient to the sink from
     * it), decode rows, mask_stats = False with a zero attn_mask row, softcap with ALiBi and a bias,
     * constant rows, a window with documents, the maps and both aux and heading gradients */
    const auto add_sinks = [&](bool few) {
        for (int var : variants) {
            const auto add = [&](CaseDef c) { c.sinks = SINK_HEAD; add_case(c, var); };
            CaseDef c;
            c = CaseDef(); c.N = 33; c.maps = 1; c.gaux = 1; c.gu = 1; add(c);
            c = CaseDef(); c.N = 37; c.causal = 1; c.kpm = KPM_FIRST; c.maps = 1; c.gaux = 1; add(c);
            if (few) continue;
            c = CaseDef(); c.N = 41; c.Nq = 13; c.causal = 1; c.bias = AB_HEAD; c.gu = 1; add(c);
            c = CaseDef(); c.N = 9; c.am = AMM_FULL; c.am_zero = 1; c.ms = 0; c.maps = 1; c.gaux = 1; add(c);
            c = CaseDef(); c.N = 40; c.softcap = 0.5; c.alibi = 1; c.bias = AB_FULL; c.gaux = 1; add(c);
            c = CaseDef(); c.N = 9; c.dup = DUP_ALL; c.maps = 1; c.gaux = 1; add(c);
            c = CaseDef(); c.N = 70; c.wl = 4; c.wr = 2; c.docs = DOC_RUNS; c.kpm = KPM_RANDOM; c.gaux = 1; c.gu = 1; add(c);
        }
    };
    /* per-row sinks (Inkling 2's, docs/backward.md; after the grid above, which keeps its seeds): [B, H, Nq]
     * with an empty row 0 (its sink gets nothing), with the maps, and on decode rows; [1, H, Nq]; [B, 1, 1] */
    const auto add_row_sinks = [&](bool few) {
        for (int var : variants) {
            const auto add = [&](CaseDef c) { add_case(c, var); };
            CaseDef c;
            c = CaseDef(); c.N = 37; c.causal = 1; c.kpm = KPM_FIRST; c.gaux = 1; c.gu = 1; c.sinks = SINK_ROWS; add(c);
            c = CaseDef(); c.N = 29; c.Nq = 5; c.causal = 1; c.sinks = SINK_ROWS; add(c);
            if (few) continue;
            c = CaseDef(); c.N = 33; c.maps = 1; c.gaux = 1; c.sinks = SINK_ROWS; add(c);
            c = CaseDef(); c.N = 41; c.Nq = 13; c.causal = 1; c.gu = 1; c.sinks = SINK_QUERY; add(c);
            c = CaseDef(); c.N = 40; c.softcap = 0.5; c.bias = AB_FULL; c.gaux = 1; c.sinks = SINK_BATCH; add(c);
        }
    };
    /* decode rows against many chunks of keys (the chunk merges; dec_chunk: chunks of 32 keys, 69 at N = 2200; the
     * one-SM cases take 512): one row, causal and padded; a window with global tokens (whole chunks skipped), softcap
     * and ALiBi, query_offset; documents in several runs with score neighbours (paper) and per-row sinks; a NaN in a
     * visible semantic row. Last in the list, so the cases above keep their seeds. */
    const auto add_decode = [&](bool few) {
        for (int var : variants) {
            const auto add = [&](CaseDef c) { add_case(c, var); };
            CaseDef c;
            c = CaseDef(); c.N = 2200; c.Nq = 1; c.B = 1; c.H = 1; c.k = 6; c.causal = 1; c.kpm = KPM_RANDOM; c.gaux = 1;
            add(c);
            if (few) continue;
            c = CaseDef(); c.N = 1300; c.Nq = 2; c.after = 30; c.B = 1; c.H = 1; c.wl = 300; c.wr = 40; c.n_global = 2;
            c.softcap = 0.7; c.alibi = 1; c.gaux = 1; add(c);
            c = CaseDef(); c.N = 700; c.Nq = 3; c.B = 1; c.H = 2; c.docs = DOC_ALTERNATE; c.scores = 1; c.causal = 1;
            c.sinks = SINK_ROWS; c.gaux = 1; add(c);
            c = CaseDef(); c.N = 140; c.Nq = 2; c.causal = 1; c.nan = NAN_VIS_H; c.nan_strict = 1; c.gaux = 1;
            add(c); /* NaN among the ranks: the lists merge by pushes */
        }
    };
    /* the global rows of a windowed call over key chunks (fwd_tiled.cuh, long_tiles; chunks.cuh): three chunks, the
     * last one short; padding, dropout and both gradients from the rows' saved outputs; then query rows inside the
     * sequence, whose first row tile holds global and windowed rows (two tiles of float32's 32 rows), with softcap,
     * ALiBi and a bias; every row tile long; documents, an attn_mask, padding, per-row sinks and score neighbours; a NaN
     * rank. B2r splits the same tiles (of its 48 rows). Built by add_long_rows, called last in either grid so that the
     * cases before keep their seeds. */
    const auto add_long_rows = [&](bool few) {
        for (int var : variants) {
            const auto add = [&](CaseDef c) { add_case(c, var); };
            CaseDef c;
            c = CaseDef(); c.N = 700; c.B = 3; c.H = 1; c.wl = 8; c.wr = 4; c.n_global = 5; c.kpm = KPM_RANDOM;
            c.dropout = 0.2; c.gaux = 1; c.gu = 1; /* B H = 3: an idle block in the folded grids (add_grid_fold) */
            /* TSan's grid (few): float16 only. Float64 takes the row-per-warp kernels, not the key chunks this case is
             * for, and the grid's smaller cases run their windows, global rows, dropout and folded grids; here, their
             * block barriers (each a vector-clock merge over every fiber) made it 60 % of the case's time. */
            if (few) c.skip_dt = 1 << DT_F64;
            add(c);
            if (few) continue;
            c = CaseDef(); c.N = 1100; c.Nq = 800; c.after = 250; c.B = 1; c.H = 1; c.wl = 16; c.wr = 16; c.n_global = 100;
            c.softcap = 0.5; c.alibi = 1; c.bias = AB_HEAD; c.gaux = 1; c.gu = 1; add(c);
            c = CaseDef(); c.N = 1000; c.Nq = 40; c.after = 960; c.B = 1; c.wl = 8; c.wr = 4; c.n_global = 40; c.gaux = 1;
            c.gu = 1; add(c); /* every row tile long (no fwd_kernel_tc launch), rows past Nq in it */
            c = CaseDef(); c.N = 1000; c.B = 1; c.H = 1; c.wl = 8; c.wr = 4; c.n_global = 20; c.docs = DOC_RUNS;
            c.am = AMM_FULL; c.kpm = KPM_RANDOM; c.sinks = SINK_ROWS; c.scores = 1; c.gaux = 1; add(c);
            c = CaseDef(); c.N = 1000; c.B = 1; c.H = 1; c.wl = 8; c.wr = 4; c.n_global = 20; c.nan = NAN_VIS_H;
            c.nan_strict = 1; c.gaux = 1; add(c); /* NaN ranks: the chunks' lists merge by pushes */
        }
    };
    /* grids whose y (a (b, h) pair, or a pair and a row tile) folds over y and z: the test builds fold beyond 2
     * (common.cuh, grid_fold; tests/cuda_emu/Makefile), so B H = 3 leaves an idle block that must return at once.
     * Full attention (the key sums' kernels, the tiled forward and backward; float64's row-per-warp kernels) and
     * decode; the first case of add_long_rows covers the long tiles' launches. In --few (Nq set, N = 70). */
    const auto add_grid_fold = [&]() {
        for (int var : variants) {
            const auto add = [&](CaseDef c) { add_case(c, var); };
            CaseDef c;
            c = CaseDef(); c.N = 40; c.Nq = 40; c.B = 3; c.H = 1; c.gaux = 1; c.gu = 1; add(c);
            c = CaseDef(); c.N = 70; c.Nq = 1; c.B = 1; c.H = 3; c.causal = 1; add(c);
        }
    };
    if (reduced) {
        add_structured(true);
        add_sinks(true);
        add_row_sinks(true);
        add_decode(true);
        add_long_rows(true);
        add_grid_fold();
        return cs;
    }
    /* added after the grid above, so that its cases keep their indices and seeds (the grid of the
     * H100 run, docs/cuda.md): a NaN in the value, latent or semantic row of a padded token; the
     * tile sums of every pass (centroid, moments, output, aux, maps) must skip the padded key,
     * never multiply it by a zero weight; the same with mask_stats = False, where the padded key is
     * in every row's statistics set (its z and h seen by every row) but never in J(i); a NaN key
     * with the maps; and NaN in the k, v, z of a token that an attention mask hides from some rows */
    for (int var : variants) {
        const auto add = [&](CaseDef c) { add_case(c, var); };
        CaseDef c;
        c = CaseDef(); c.N = 37; c.nan = NAN_PAD_V; c.maps = 1; c.gaux = 1; add(c);
        c = CaseDef(); c.N = 37; c.nan = NAN_PAD_Z; c.maps = 1; c.gaux = 1; c.gu = 1; c.nan_strict = 1; add(c);
        c = CaseDef(); c.N = 37; c.nan = NAN_PAD_H; c.maps = 1; c.gaux = 1; c.gu = 1; c.nan_strict = 1; add(c);
        c = CaseDef(); c.N = 37; c.nan = NAN_PAD_V; c.ms = 0; c.causal = 1; c.maps = 1; c.gaux = 1; add(c);
        c = CaseDef(); c.N = 37; c.nan = NAN_PAD_K; c.maps = 1; c.gaux = 1; c.nan_strict = 1;
        c.nan_unseen = var == ASC_VARIANT_PAPER; add(c);
        c = CaseDef(); c.N = 37; c.nan = NAN_MASKED; c.am = AMM_FULL; c.maps = 1; c.gaux = 1; c.gu = 1; add(c);
    }
    /* the clamps keep NaN: NaN in h of a visible key (causal: the rows from it on see it; its affinity
     * reaches them only through phi = ws max(a - delta, 0)), and in a padded token's own z and h (only
     * its own row sees it); each row that sees it must be NaN, the others as before */
    for (int var : variants) {
        const auto add = [&](CaseDef c) { add_case(c, var); };
        CaseDef c;
        c = CaseDef(); c.N = 37; c.causal = 1; c.nan = NAN_VIS_H; c.nan_strict = 1; c.maps = 1; c.gaux = 1; c.gu = 1; add(c);
        c = CaseDef(); c.N = 37; c.nan = NAN_PAD_Z; c.nan_strict = 1; c.gaux = 1; c.gu = 1; add(c);
        c = CaseDef(); c.N = 37; c.nan = NAN_PAD_H; c.nan_strict = 1; c.gaux = 1; add(c);
    }
    add_structured(false);
    /* the twin's rule of commit 26b5c80 (reference.py, poisoned): a row without a visible key is not
     * poisoned, its output 0 whatever its own q, z, h (with mask_stats = False the other rows, whose
     * statistics set holds the token, see its z and h); a NaN in a padded token's own k reaches its row
     * in the seed variant only (causal, with the maps: a row that sees it is NaN in all five) */
    for (int var : variants) {
        const auto add = [&](CaseDef c) { add_case(c, var); };
        CaseDef c;
        c = CaseDef(); c.N = 37; c.causal = 1; c.nan = NAN_EMPTY; c.nan_strict = 1; c.nan_unseen = 1; c.maps = 1;
        c.gaux = 1; c.gu = 1; add(c);
        c = CaseDef(); c.N = 37; c.causal = 1; c.ms = 0; c.nan = NAN_EMPTY; c.nan_strict = 1; c.maps = 1; c.gaux = 1;
        add(c);
        c = CaseDef(); c.N = 37; c.causal = 1; c.nan = NAN_PAD_K; c.nan_strict = 1; c.maps = 1; c.gaux = 1; c.gu = 1;
        c.nan_unseen = var == ASC_VARIANT_PAPER; add(c);
    }
    add_sinks(false);
    add_row_sinks(false);
    add_decode(false);
    /* (appended last: a case in the middle would move every later case's seed) B2c's whole query tiles in the
     * fixed walk of tiles_load (tile.cuh: 8 and 4 chunks a row), its last tile in the general walk */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 130; c.B = 1; c.H = 1; c.d = 64; c.dv = 64; c.dz = 32; c.da = 32; c.k = 8; c.causal = 1; c.gu = 1;
            add_case(c, var);
        }
    /* rows too wide for some kernels' shared memory at the emulator's default opt-in (an A100's 163 KB). At
     * d = dv = 128 the seed's half types keep the tiled kernels in their standard shapes (B2c's fixed walk at 16
     * chunks a row); the paper's run the forward and B2r in their shapes for wide heads, the only ones that fit
     * (wide_rows); every float32 backward goes to the row-per-warp kernels, and float64's backward is refused; at
     * d = dv = 256 every forward but float64's (refused) runs row-per-warp, every backward is refused. ascender_torch
     * sends what is refused to the block-wise backend (ascender_cuda_fits). */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 130; c.B = 1; c.H = 1; c.d = 128; c.dv = 128; c.dz = 32; c.da = 32; c.k = 8; c.causal = 1; c.gu = 1;
            c.refuse_bwd = 1 << DT_F64;
            c.smem_optin = ASC_EMU_SMEM_OPTIN_A100;
            c.wide = var == ASC_VARIANT_PAPER ? (1 << DT_F16 | 1 << DT_BF16) : 0;
            c.wide_bits = 1 | 4;
            add_case(c, var);
            c = CaseDef();
            c.N = 40; c.B = 1; c.H = 1; c.d = 256; c.dv = 256; c.dz = 32; c.da = 32; c.k = 8; c.gu = 1;
            c.refuse_fwd = 1 << DT_F64; c.refuse_bwd = (1 << NDT) - 1;
            add_case(c, var);
        }
    /* d = 1, paper: unit keys +-1, so a row's neighbour mean often cancels and its heading is 0 by the EPS_HEADING
     * rule, with the rounding residue as UNORM; no gradient may pass through such a heading (the tiled backward's
     * float32 path divided by the residue: errors up to 4 on most draws, docs/cuda.md) -- several draws */
    if (!reduced)
        for (int draw = 0; draw < 4; draw++) {
            CaseDef c;
            c.N = 20; c.d = 1; c.k = 4; c.gaux = 1; c.gu = 1;
            add_case(c, ASC_VARIANT_PAPER);
        }
    /* two keys in a row's T(i) (N = 2, mask_stats = False), pinned draws of the grid's cases 52 and 54 (their
     * seeds under --seed-shift 5000): a normalized bias row's adjoint nearly vanishes there, and the tiled float32
     * backward's dz was off by 1 % of itself (3.3e-4 and 5.7e-4 against the bound 3e-4) until B1 formed dS as B2
     * does, summed w centred and the forward kept c~ as the backward reads it (docs/cuda.md); and of case 14 (the
     * seed variant): bfloat16's dz missed 14 and 54 (2.3e-2 and 2.8e-2 against 2e-2) until P came from the
     * forward's float32 copy of y (rows32) and B1 formed dS as B2 does there too */
    if (!reduced) {
        CaseDef c = cs[52];
        c.seed = 5053 + g_seed_shift;
        cs.push_back(c);
        c = cs[54];
        c.seed = 5055 + g_seed_shift;
        cs.push_back(c);
        c = cs[14];
        c.seed = 5015 + g_seed_shift;
        cs.push_back(c);
    }
    /* the row-major sweeps' whole key tiles in the fixed walk (sweeps.cuh, load_key_tile) while next_tile jumps: a
     * window with global tokens at the benchmark's widths; the last tile takes the general walk */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 200; c.B = 1; c.H = 1; c.d = 64; c.dv = 64; c.dz = 32; c.da = 32; c.k = 8; c.wl = 40; c.wr = 8;
            c.n_global = 2; c.gu = 1;
            add_case(c, var);
        }
    /* the forward's moments in closed form (keymoments.cuh) where a row's statistics run over every key although its
     * softmax is causal (mask_stats = False), at the benchmark's widths over three key chunks; and at wide odd widths
     * (d = 100: a lane holds four features, dz = 37 not a multiple of the sums' 4 x 4 tiles) */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 150; c.B = 1; c.H = 2; c.d = 64; c.dv = 64; c.dz = 32; c.da = 32; c.k = 8; c.causal = 1; c.ms = 0;
            c.maps = 1; c.gaux = 1; c.gu = 1;
            add_case(c, var);
            c = CaseDef();
            c.N = 45; c.d = 100; c.dv = 24; c.dz = 37; c.da = 20; c.k = 6; c.maps = 1; c.gaux = 1;
            add_case(c, var);
        }
    /* causal statistics in closed form: a row block's moments over the keys before its chunk from the chunk's prefix
     * sums, the keys from there to its rows swept (keymoments.cuh): query rows inside the sequence (query_offset), so
     * that no block starts at a chunk's first key and the swept part spans several key tiles; and at wide odd widths */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 300; c.Nq = 150; c.after = 37; c.B = 1; c.H = 2; c.d = 64; c.dv = 64; c.dz = 32; c.da = 32; c.k = 8;
            c.causal = 1; c.maps = 1; c.gaux = 1; c.gu = 1;
            add_case(c, var);
            c = CaseDef();
            c.N = 170; c.d = 100; c.dv = 24; c.dz = 37; c.da = 20; c.k = 6; c.causal = 1; c.gaux = 1;
            add_case(c, var);
        }
    /* key padding in closed form: the sums leave the padded keys out (mask_stats), with a batch all padding (its rows
     * without keys fall back to the sweep) and causal with query rows inside the sequence; and mask_stats = False with
     * an attn_mask and padding (the paper module's call: every key in the statistics, whatever the masks) */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 150; c.d = 64; c.dv = 64; c.dz = 32; c.da = 32; c.k = 8; c.kpm = KPM_B1ALL; c.maps = 1; c.gaux = 1;
            c.gu = 1;
            c.smem_optin = ASC_EMU_SMEM_OPTIN_H100; /* the benchmark's widths on an H100: the standard row shapes */
            c.wide = 0;
            add_case(c, var);
            c = CaseDef();
            c.N = 300; c.Nq = 150; c.after = 37; c.H = 1; c.d = 64; c.dv = 64; c.dz = 32; c.da = 32; c.k = 8;
            c.causal = 1; c.kpm = KPM_RANDOM; c.gaux = 1; c.gu = 1;
            add_case(c, var);
            c = CaseDef();
            c.N = 150; c.H = 1; c.d = 64; c.dv = 64; c.dz = 32; c.da = 32; c.k = 8; c.causal = 1; c.ms = 0;
            c.am = AMM_FULL; c.kpm = KPM_RANDOM; c.maps = 1; c.gaux = 1;
            add_case(c, var);
        }
    add_long_rows(false);
    add_grid_fold();
    /* decode at the benchmark's feature sizes: the 16-byte reads of the key rows and of the row operands (key_dots;
     * only float32 and float64 took them at the grid's other widths), dv = 72 (three feature blocks of the output
     * sums, the last one partial), two rows over seven key chunks; then a semantic row past float's range in its
     * squares, where the half types' decode sums fall back to double (decode_sweeps.cuh, float_overflow) */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 200; c.Nq = 2; c.B = 1; c.H = 2; c.d = 64; c.dv = 72; c.dz = 32; c.da = 16; c.k = 8; c.causal = 1;
            c.scores = var == ASC_VARIANT_PAPER; c.gaux = 1;
            add_case(c, var);
            c = CaseDef();
            c.N = 70; c.Nq = 1; c.B = 1; c.d = 16; c.dv = 8; c.dz = 8; c.da = 16; c.hamp = 3e20; c.gaux = 1;
            add_case(c, var);
        }
    /* decode with rows wider than the heading keeps in registers (rows_geometry: 128 features in a lane's four
     * slots), d = 150 (the half types' rows padded to 160: zero features past d in the second pass; the key rows read
     * element by element), two rows over three chunks */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 90; c.Nq = 2; c.B = 1; c.d = 150; c.dv = 8; c.dz = 4; c.da = 3; c.k = 6; c.gaux = 1; c.gu = 1;
            add_case(c, var);
        }
    /* decode lists pushed a tile at a time by the warp (topk_push_lanes): every rank tied (every token the same: the
     * lowest keys win), a list filled in one tile (N = 130: chunks of one tile), then over several (N = 2200: chunks
     * of two tiles, and padding leaves a tile fewer candidates than k, so the next tile's tie the held entries); a
     * list longer than a warp (lane 0's pushes). The paper variant only: the seed keeps no lists */
    if (!reduced) {
        CaseDef c;
        c.N = 130; c.Nq = 2; c.B = 1; c.k = 6; c.dup = DUP_ALL; c.gaux = 1;
        add_case(c, ASC_VARIANT_PAPER);
        c.N = 2200; c.Nq = 1; c.H = 1; c.k = 32; c.kpm = KPM_RANDOM;
        add_case(c, ASC_VARIANT_PAPER);
        c = CaseDef();
        c.N = 130; c.Nq = 2; c.B = 1; c.k = 40; c.dup = DUP_SOME; c.causal = 1; c.gaux = 1;
        add_case(c, ASC_VARIANT_PAPER);
    }
    /* d = dv = 128, the head size of most large language models, at an H100's (and H200's) opt-in, where the calls
     * of the "rows too wide" cases above that the A100's opt-in sends to the row-per-warp kernels take the tiled
     * ones (the paper forward in the half types, 172 KB; the float32 backward; docs/cuda.md, "Wide heads"). Only
     * float64's backward (239 KB) is refused there. */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 130; c.B = 1; c.H = 1; c.d = 128; c.dv = 128; c.dz = 32; c.da = 32; c.k = 8; c.causal = 1; c.gu = 1;
            c.smem_optin = ASC_EMU_SMEM_OPTIN_H100;
            c.refuse_bwd = 1 << DT_F64;
            c.wide = var == ASC_VARIANT_SEED ? (1 << DT_F16 | 1 << DT_BF16) : 0; /* the paper's are 3 KB too wide */
            add_case(c, var);
        }
    /* decode on a device of one SM: a launch holds about a dozen one-warp blocks at once there (device_wave at the
     * emulator's opt-in), so the chunks grow to DEC_CHUNK = 512 keys (ascender_decode.cu: dec_chunk), five per (b, h)
     * here (the other decode cases: 32 to 64 keys) */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 2200; c.Nq = 1; c.B = 1; c.H = 4; c.k = 6; c.causal = 1; c.gaux = 1; c.sms = 1;
            add_case(c, var);
        }
    /* d = dv = 128 where the half types' forward and B1 run wide rows (Tiles<T>::RowW, B1W: three warps, one key
     * stage) and B2r two warps (B2rW), since the H100's shared memory holds one standard block of them per SM and two
     * wide ones (wide_rows): padding, dropout (the copies with options) and both gradients over four row blocks (B2r:
     * five), the last one partial; then (seed) a windowed call whose global rows take the key chunks in a tile of 64
     * rows, so that the wide forward starts at row 64, inside one of its 48-row tiles' grid, and B2r's chunks run in
     * its 32-row tile (docs/cuda.md, "Wide rows: the forward and B1 at three warps", "B2r at two warps for wide
     * heads") */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 150; c.B = 1; c.H = 1; c.d = 128; c.dv = 128; c.dz = 32; c.da = 32; c.k = 8; c.kpm = KPM_RANDOM;
            c.dropout = 0.2; c.gaux = 1; c.gu = 1; c.smem_optin = ASC_EMU_SMEM_OPTIN_H100; c.refuse_bwd = 1 << DT_F64;
            c.wide = var == ASC_VARIANT_SEED ? (1 << DT_F16 | 1 << DT_BF16) : 0;
            add_case(c, var);
            if (var != ASC_VARIANT_SEED) continue;
            c = CaseDef();
            c.N = 640; c.B = 1; c.H = 1; c.d = 128; c.dv = 128; c.dz = 32; c.da = 32; c.k = 8; c.wl = 8; c.wr = 4;
            c.n_global = 20; c.gaux = 1; c.smem_optin = ASC_EMU_SMEM_OPTIN_H100; c.refuse_bwd = 1 << DT_F64;
            c.wide = 1 << DT_F16 | 1 << DT_BF16;
            add_case(c, var);
        }
    /* d = dv = 256 on an H100: the half types' standard forward rows (253 / 287 KB), B2r's (257 / 283 KB) and B2c's
     * (237 / 254 KB) do not fit, their shapes for wide heads do (170 / 196 KB; 185 / 201 KB; B2c's 16-key blocks 194 /
     * 219 KB), so the forward and the backward run tiled, B1 in its standard shape (197 / 231 KB); float32's backward is
     * the row-per-warp one (216 KB; its B2r: 269 KB), float64's (432 KB) is refused */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 70; c.B = 1; c.H = 1; c.d = 256; c.dv = 256; c.dz = 32; c.da = 32; c.k = 8; c.kpm = KPM_RANDOM;
            c.gaux = 1; c.smem_optin = ASC_EMU_SMEM_OPTIN_H100; c.refuse_bwd = 1 << DT_F64;
            c.wide = 1 << DT_F16 | 1 << DT_BF16;
            c.wide_bits = 1 | 4 | 8;
            add_case(c, var);
        }
    /* B2c's 16-key blocks over query tiles of 48 rows (Tiles<T>::ColW) at the benchmark's widths: a device of 100,000
     * bytes a block, where none of the half types' standard B2c blocks fits (seed 101,520 / paper 106,128 bytes) and
     * the narrow ones do (89,472 / 96,384), so the fixed walk of its query rows runs at 8 chunks a row by 96 threads;
     * causal, padded and dropped keys, both gradients, 150 rows (the last tile partial). The other kernels take the
     * shapes that fit there: the forward and B2r wide in both variants, B1 wide in the paper's (107,664 bytes standard)
     * and standard in the seed's (98,448: one block of four warps against one of three). The FFMA types' shapes are
     * one (float32's B2c needs 130,960 bytes here: its backward would be the row-per-warp one, which has no dropout;
     * float64's is refused), so the case runs the half types only */
    if (!reduced)
        for (int var : variants) {
            CaseDef c;
            c.N = 150; c.B = 1; c.H = 2; c.d = 64; c.dv = 64; c.dz = 32; c.da = 32; c.k = 8; c.causal = 1;
            c.kpm = KPM_RANDOM; c.dropout = 0.1; c.gaux = 1; c.gu = 1; c.smem_optin = 100000;
            c.skip_dt = 1 << DT_F64 | 1 << DT_F32;
            c.wide = 1 << DT_F16 | 1 << DT_BF16;
            c.wide_bits = var == ASC_VARIANT_SEED ? 1 | 4 | 8 : 1 | 2 | 4 | 8;
            add_case(c, var);
        }
    /* d = dv = 96 (seed) on an H100, where B2c's narrow blocks give an SM more warps than its standard one, which fits
     * alone (124,048 bytes: 4 warps; narrow 106,880: two blocks of three), as the forward's and B2r's wide shapes do
     * (B1's standard block keeps its four warps); 100 rows, causal, both gradients: the general walk of the narrow
     * kernel's query rows (12 chunks a row) */
    if (!reduced) {
        CaseDef c;
        c.N = 100; c.B = 1; c.H = 1; c.d = 96; c.dv = 96; c.dz = 32; c.da = 32; c.k = 8; c.causal = 1; c.gaux = 1;
        c.gu = 1; c.smem_optin = ASC_EMU_SMEM_OPTIN_H100;
        c.wide = 1 << DT_F16 | 1 << DT_BF16;
        c.wide_bits = 1 | 4 | 8;
        add_case(c, ASC_VARIANT_SEED);
    }
    return cs;
}

/* ---------------------------------------------------------------- Magnitude Attention */

/*
 * Magnitude Attention (SPEC section 7): magnitude_cuda_fwd / _bwd against magnitude_fwd_f64 / _bwd_f64
 * on the same rounded inputs. Compared: out and mu (norm-wise), dq, dk, dv and each of dt_raw, dbeta,
 * dgamma over its heads (per group, relative to max(max |ref| of the group, 1e-2 x the largest
 * gradient), as above). Tolerances: TOL_MAG (float64 1e-10; float32, float16, bfloat16 as for the
 * ASCender kernels: float32 arithmetic plus one rounding of the stored value). The solve runs in
 * float64 for every dtype; its matrix products take the key distances and exponentials in the
 * compute type.
 * Conditioning: the unrolled CG can amplify rounding enormously -- with duplicate keys (Zm singular,
 * only eps keeps it definite) or with more steps than it needs to converge (the steps past
 * convergence divide rounding noise by rounding noise). There a float64 result may be right to only
 * ~1e-5 whoever computes it (the CPU kernel's result moves that much when the keys move by an ulp).
 * So the kernels are held to what their precision can deliver on each case:
 *  - float64: against mag_ld below, an independent implementation in long double (the same
 *    algorithm and stopping rule, matrices materialized: N is small here), the CUDA error must be
 *    within max(1e-10, 10 x the CPU float64 kernel's error);
 *  - float32, float16, bfloat16 (computed in float32): against the CPU float64 kernel on the same
 *    rounded inputs, within max(TOL_MAG, 10 x the CPU float32 kernel's error there).
 * On well-conditioned cases (the defaults) the second term is far below the first. A line shows
 * "peer" (the CPU kernel's own error, forward/backward) where it sets the bound.
 */
/* Non-finite inputs (SPEC section 11, docs/magnitude.md): `sick` puts sick_val (NaN or Inf) into one
 * entry of q, k or v of token sick_tok of (b, h) = (1, 0); with kpm = KPM_FIRST token 0 is padded.
 * cut: no upstream gradient on the rows of y and the entries of mu that the CPU forward makes
 * non-finite (a loss over what the value does not reach: the backward must skip those rows, and a
 * (b, h) without any). Compared entry by entry: the NaN entries of every output and gradient must be
 * the CPU kernel's, an infinity must be matched exactly, the finite entries within the bounds. */
enum MagSick { SICK_NONE, SICK_Q, SICK_K, SICK_V };
const char *sick_name[] = {"", "q", "k", "v"};

struct MagCase {
    int64_t B = 2, H = 2, N = 7, d = 6, dv = 5, n_iter = 4;
    double eps = 1e-3, kamp = 1.0, t_lo = -1.0, t_hi = 1.0;
    int kpm = KPM_NONE, gmu = 0, dup = 0;
    int sick = SICK_NONE, cut = 0;
    int64_t sick_tok = 0;
    double sick_val = NAN;
    uint64_t seed = 1;
};

struct MagProblem {
    mag_params p;
    std::vector<double> q, k, v, t_raw, beta, gamma, gout, gmu;
    std::vector<uint8_t> kpm;
};

const double TOL_MAG[NDT][2] = {{1e-10, 1e-10}, {1e-4, 5e-4}, {2e-3, 5e-3}, {1.6e-2, 3e-2}}; /* fwd, bwd */

MagProblem make_mag(const MagCase &c) {
    MagProblem M;
    mag_params &p = M.p;
    memset(&p, 0, sizeof(p));
    rng r = rng_splitmix(c.seed * 0x9E3779B97F4A7C15ULL + 7, 0);
    p.B = c.B; p.H = c.H; p.N = c.N; p.d = c.d; p.dv = c.dv; p.n_iter = c.n_iter; p.eps = c.eps;
    p.scale = 1.0 / sqrt((double)(c.d ? c.d : 1));
    const size_t BHN = (size_t)(p.B * p.H * p.N);
    auto fill = [&](std::vector<double> &x, size_t n, double lo, double hi) {
        x.resize(n);
        for (double &e : x) e = rng_unif(&r, lo, hi);
    };
    fill(M.q, BHN * (size_t)p.d, -1, 1);
    fill(M.k, BHN * (size_t)p.d, -c.kamp, c.kamp);
    fill(M.v, BHN * (size_t)p.dv, -1, 1);
    fill(M.t_raw, (size_t)p.H, c.t_lo, c.t_hi);
    fill(M.beta, (size_t)p.H, -2, 2);
    fill(M.gamma, (size_t)p.H, -1, 1);
    fill(M.gout, BHN * (size_t)p.dv, -1, 1);
    if (c.gmu) fill(M.gmu, BHN, -1, 1);
    if (c.dup && p.N >= 3) /* keys 1 and 2 copies of key 0: a singular Zm, eps alone keeps it definite */
        for (int64_t bh = 0; bh < p.B * p.H; bh++)
            for (int64_t t = 1; t < 3; t++)
                std::copy_n(M.k.begin() + bh * p.N * p.d, p.d, M.k.begin() + (bh * p.N + t) * p.d);
    if (c.kpm != KPM_NONE) {
        M.kpm.assign((size_t)(p.B * p.N), 0);
        for (int64_t b = 0; b < p.B; b++)
            for (int64_t j = 0; j < p.N; j++) {
                uint8_t pad = c.kpm == KPM_FIRST ? j == 0 : rng_unif(&r, 0.0, 1.0) < 0.3;
                if (c.kpm == KPM_B1ALL && b == p.B - 1) pad = 1;
                M.kpm[(size_t)(b * p.N + j)] = pad;
            }
    }
    if (c.sick != SICK_NONE) {
        std::vector<double> &x = c.sick == SICK_Q ? M.q : c.sick == SICK_K ? M.k : M.v;
        const int64_t f = c.sick == SICK_V ? p.dv : p.d, bh = 1 * p.H + 0;
        x[(size_t)((bh * p.N + c.sick_tok) * f + f / 2)] = c.sick_val;
    }
    return M;
}

MagProblem rounded_mag(const MagProblem &M, int dt) {
    MagProblem R = M;
    for (auto *x : {&R.q, &R.k, &R.v, &R.t_raw, &R.beta, &R.gamma, &R.gout, &R.gmu}) *x = rounded(dt, *x);
    return R;
}

struct MagOut {
    std::vector<double> out, mu, dq, dk, dv, dpar;
    int rc_f = 0, rc_b = 0;
};

/* The forward and backward of docs/magnitude.md in long double, straight from the formulas with the
 * matrices materialized (O(N^2) memory per (b, h)): the reference of the float64 comparison. */
MagOut mag_ld(const MagProblem &M) {
    typedef long double LD;
    const mag_params &p = M.p;
    const int64_t N = p.N, d = p.d, dv = p.dv, NI = p.n_iter;
    const size_t BHN = (size_t)(p.B * p.H * N);
    MagOut o;
    o.out.assign(BHN * (size_t)dv, 0);
    o.mu.assign(BHN, 0);
    o.dq.assign(BHN * (size_t)d, 0);
    o.dk.assign(BHN * (size_t)d, 0);
    o.dv.assign(BHN * (size_t)dv, 0);
    std::vector<LD> dpar((size_t)(3 * p.H), 0);
    auto at = [&](const std::vector<double> &x, int64_t bh, int64_t j, int64_t f, int64_t fs) {
        return (LD)x[(size_t)((bh * N + j) * fs + f)];
    };
    for (int64_t bh = 0; bh < p.B * p.H; bh++) {
        const int64_t b = bh / p.H, hd = bh % p.H;
        std::vector<char> val((size_t)N);
        for (int64_t j = 0; j < N; j++) val[(size_t)j] = M.kpm.empty() || !M.kpm[(size_t)(b * N + j)];
        const LD tr = M.t_raw[(size_t)hd], t = tr > 30 ? tr : log1pl(expl(tr)), dd = (LD)(d ? d : 1);
        std::vector<LD> Dm((size_t)(N * N)), Z((size_t)(N * N), 0);
        for (int64_t j = 0; j < N; j++)
            for (int64_t l = 0; l < N; l++) {
                LD D = 0;
                for (int64_t f = 0; f < d; f++) {
                    const LD df = at(M.k, bh, l, f, d) - at(M.k, bh, j, f, d);
                    D += df * df;
                }
                Dm[(size_t)(j * N + l)] = D;
                if (val[(size_t)j] && val[(size_t)l]) Z[(size_t)(j * N + l)] = expl(-t * D / dd);
            }
        auto matvec = [&](const std::vector<LD> &in, std::vector<LD> &out) {
            for (int64_t j = 0; j < N; j++) {
                LD acc = 0;
                for (int64_t l = 0; l < N; l++) acc += Z[(size_t)(j * N + l)] * in[(size_t)l];
                out[(size_t)j] = val[(size_t)j] ? acc + (LD)p.eps * in[(size_t)j] : 0;
            }
        };
        auto dot = [&](const std::vector<LD> &a, const std::vector<LD> &c) {
            LD s = 0;
            for (int64_t j = 0; j < N; j++) s += a[(size_t)j] * c[(size_t)j];
            return s;
        };
        /* the solve, with its history */
        std::vector<LD> x((size_t)N, 0), r((size_t)N), pv((size_t)N), w((size_t)N);
        std::vector<std::vector<LD>> Ph, Wh, Rh;
        std::vector<LD> al, be, sg, rho;
        for (int64_t j = 0; j < N; j++) r[(size_t)j] = pv[(size_t)j] = val[(size_t)j] ? 1 : 0;
        rho.push_back(dot(r, r));
        const LD floor = (LD)DBL_EPSILON * (LD)DBL_EPSILON * rho[0];
        for (int64_t it = 0; it < NI && rho[0] > 0; it++) {
            matvec(pv, w);
            const LD s = dot(pv, w);
            if (rho[(size_t)it] <= floor || s <= 0) break;
            const LD a = rho[(size_t)it] / s;
            Ph.push_back(pv);
            Wh.push_back(w);
            for (int64_t j = 0; j < N; j++) {
                x[(size_t)j] += a * pv[(size_t)j];
                r[(size_t)j] -= a * w[(size_t)j];
            }
            const LD r1 = dot(r, r), bb = r1 / rho[(size_t)it];
            for (int64_t j = 0; j < N; j++) pv[(size_t)j] = r[(size_t)j] + bb * pv[(size_t)j];
            Rh.push_back(r);
            al.push_back(a);
            be.push_back(bb);
            sg.push_back(s);
            rho.push_back(r1);
        }
        const int64_t nd = (int64_t)al.size();
        const LD bg = M.beta[(size_t)hd], gg = M.gamma[(size_t)hd];
        std::vector<LD> mu((size_t)N), g((size_t)N);
        for (int64_t j = 0; j < N; j++) {
            mu[(size_t)j] = val[(size_t)j] ? x[(size_t)j] : 0;
            g[(size_t)j] = 1 / (1 + expl(-(bg * mu[(size_t)j] + gg)));
            o.mu[(size_t)(bh * N + j)] = (double)mu[(size_t)j];
        }
        /* attention and its backward */
        std::vector<LD> dvp((size_t)(N * dv), 0), dkv((size_t)(N * d), 0);
        for (int64_t i = 0; i < N && dv > 0; i++) {
            std::vector<LD> s((size_t)N), A((size_t)N, 0);
            LD mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < N; j++) {
                LD dq = 0;
                for (int64_t f = 0; f < d; f++) dq += at(M.q, bh, i, f, d) * at(M.k, bh, j, f, d);
                s[(size_t)j] = (LD)p.scale * dq;
                if (val[(size_t)j]) mx = std::max(mx, s[(size_t)j]);
            }
            for (int64_t j = 0; j < N; j++)
                if (val[(size_t)j]) sum += (A[(size_t)j] = expl(s[(size_t)j] - mx));
            if (!(sum > 0)) continue;
            LD P = 0;
            std::vector<LD> dA((size_t)N, 0);
            for (int64_t j = 0; j < N; j++) {
                A[(size_t)j] /= sum;
                for (int64_t f = 0; f < dv; f++) {
                    dA[(size_t)j] += at(M.gout, bh, i, f, dv) * g[(size_t)j] * at(M.v, bh, j, f, dv);
                }
                P += A[(size_t)j] * dA[(size_t)j];
            }
            for (int64_t f = 0; f < dv; f++) {
                LD y = 0;
                for (int64_t j = 0; j < N; j++) y += A[(size_t)j] * g[(size_t)j] * at(M.v, bh, j, f, dv);
                o.out[(size_t)((bh * N + i) * dv + f)] = (double)y;
            }
            for (int64_t j = 0; j < N; j++) {
                const LD dS = A[(size_t)j] * (dA[(size_t)j] - P);
                for (int64_t f = 0; f < d; f++) {
                    o.dq[(size_t)((bh * N + i) * d + f)] += (double)((LD)p.scale * dS * at(M.k, bh, j, f, d));
                    dkv[(size_t)(j * d + f)] += (LD)p.scale * dS * at(M.q, bh, i, f, d);
                }
                for (int64_t f = 0; f < dv; f++) dvp[(size_t)(j * dv + f)] += A[(size_t)j] * at(M.gout, bh, i, f, dv);
            }
        }
        std::vector<LD> dx((size_t)N, 0);
        for (int64_t j = 0; j < N; j++) {
            LD dgate = 0;
            for (int64_t f = 0; f < dv; f++) {
                o.dv[(size_t)((bh * N + j) * dv + f)] = (double)(g[(size_t)j] * dvp[(size_t)(j * dv + f)]);
                dgate += dvp[(size_t)(j * dv + f)] * at(M.v, bh, j, f, dv);
            }
            const LD dz = val[(size_t)j] ? dgate * g[(size_t)j] * (1 - g[(size_t)j]) : 0;
            const LD gm = (!M.gmu.empty() && val[(size_t)j]) ? (LD)M.gmu[(size_t)(bh * N + j)] : 0;
            dx[(size_t)j] = bg * dz + gm;
            dpar[(size_t)(p.H + hd)] += dz * mu[(size_t)j];
            dpar[(size_t)(2 * p.H + hd)] += dz;
        }
        /* the solve in reverse */
        std::vector<LD> dr((size_t)N, 0), dp((size_t)N, 0), dw((size_t)N), adw((size_t)N);
        std::vector<std::vector<LD>> dWh((size_t)nd);
        LD drho = 0;
        for (int64_t it = nd - 1; it >= 0; it--) {
            const size_t k = (size_t)it;
            const LD dB = dot(dp, Ph[k]);
            LD drho0 = -dB * rho[k + 1] / (rho[k] * rho[k]);
            drho += dB / rho[k];
            for (int64_t j = 0; j < N; j++) dr[(size_t)j] += dp[(size_t)j] + 2 * drho * Rh[k][(size_t)j];
            const LD dal = -dot(dr, Wh[k]) + dot(dx, Ph[k]);
            drho0 += dal / sg[k];
            const LD dsg = -dal * rho[k] / (sg[k] * sg[k]);
            for (int64_t j = 0; j < N; j++) {
                dw[(size_t)j] = -al[k] * dr[(size_t)j] + dsg * Ph[k][(size_t)j];
                dp[(size_t)j] = be[k] * dp[(size_t)j] + al[k] * dx[(size_t)j] + dsg * Wh[k][(size_t)j];
            }
            dWh[k] = dw;
            matvec(dw, adw);
            for (int64_t j = 0; j < N; j++) dp[(size_t)j] += adw[(size_t)j];
            drho = drho0;
        }
        /* the matrix's gradient: dZ_jl = sum_it dw_it,j p_it,l */
        LD dt = 0;
        for (int64_t j = 0; j < N; j++)
            for (int64_t l = 0; l < N; l++) {
                if (!val[(size_t)j] || !val[(size_t)l]) continue;
                LD G = 0, Gt = 0;
                for (int64_t it = 0; it < nd; it++) {
                    G += dWh[(size_t)it][(size_t)j] * Ph[(size_t)it][(size_t)l];
                    Gt += dWh[(size_t)it][(size_t)l] * Ph[(size_t)it][(size_t)j];
                }
                const LD z = Z[(size_t)(j * N + l)], c = z * (-t / dd) * (G + Gt);
                dt += G * z * (-Dm[(size_t)(j * N + l)] / dd);
                for (int64_t f = 0; f < d; f++)
                    dkv[(size_t)(j * d + f)] += 2 * c * (at(M.k, bh, j, f, d) - at(M.k, bh, l, f, d));
            }
        dpar[(size_t)hd] += dt / (1 + expl(-tr));
        for (int64_t j = 0; j < N; j++)
            for (int64_t f = 0; f < d; f++) o.dk[(size_t)((bh * N + j) * d + f)] = (double)dkv[(size_t)(j * d + f)];
    }
    o.dpar.assign(dpar.begin(), dpar.end());
    return o;
}

/* The CPU float32 kernels on the (float-exact) rounded problem, widened: the float peer. */
MagOut mag_cpu32(const MagProblem &M) {
    const mag_params &p = M.p;
    auto f = [](const std::vector<double> &x) { return std::vector<float>(x.begin(), x.end()); };
    std::vector<float> q = f(M.q), k = f(M.k), v = f(M.v), tr = f(M.t_raw), be = f(M.beta), ga = f(M.gamma),
                       go = f(M.gout), gm = f(M.gmu);
    const size_t BHN = (size_t)(p.B * p.H * p.N);
    std::vector<float> out(BHN * (size_t)p.dv), mu(BHN), dq(BHN * (size_t)p.d), dk(BHN * (size_t)p.d),
        dv(BHN * (size_t)p.dv), dpar((size_t)(3 * p.H));
    mag_fwd_args a;
    memset(&a, 0, sizeof(a));
    a.q = q.data(); a.k = k.data(); a.v = v.data(); a.t_raw = tr.data(); a.beta = be.data(); a.gamma = ga.data();
    a.key_padding_mask = M.kpm.empty() ? nullptr : M.kpm.data();
    a.out = out.data(); a.mu = mu.data();
    MagOut o;
    o.rc_f = magnitude_fwd_f32(&p, &a);
    mag_bwd_args ba;
    memset(&ba, 0, sizeof(ba));
    ba.in = a;
    ba.grad_out = go.data();
    ba.grad_mu = gm.empty() ? nullptr : gm.data();
    ba.dq = dq.data(); ba.dk = dk.data(); ba.dv = dv.data(); ba.dparams = dpar.data();
    o.rc_b = magnitude_bwd_f32(&p, &ba);
    auto w = [](const std::vector<float> &x) { return std::vector<double>(x.begin(), x.end()); };
    o.out = w(out); o.mu = w(mu); o.dq = w(dq); o.dk = w(dk); o.dv = w(dv); o.dpar = w(dpar);
    return o;
}

/* One field of mag_errors, norm-wise. With nan (non-finite inputs) the NaN entries of `got` must be
 * those of `ref`, entry by entry; compare_field then leaves them out and holds the rest to the bound. */
void mag_field(Verdict &v, const std::string &name, const std::vector<double> &ref, const std::vector<double> &got,
               double floor, double ae, bool nan) {
    if (nan && ref.size() == got.size())
        for (size_t e = 0; e < ref.size(); e++)
            if (std::isnan(ref[e]) != std::isnan(got[e])) {
                v.note(name + " (NaN pattern)", INFINITY, e, ref[e], got[e]);
                break;
            }
    compare_field(v, name, ref, got, nan ? ref.size() : 1, nullptr, floor, false, ae, nan);
}

/* The forward and backward errors of `got` against `ref` (out, mu; dq, dk, dv and each parameter). */
std::pair<Verdict, Verdict> mag_errors(const MagProblem &R, const MagOut &ref, const MagOut &got, double ae, bool nan) {
    Verdict vf, vb;
    mag_field(vf, "out", ref.out, got.out, 0.0, ae, nan);
    mag_field(vf, "mu", ref.mu, got.mu, 0.0, ae, nan);
    double maxall = 0.0;
    for (const auto *g : {&ref.dq, &ref.dk, &ref.dv, &ref.dpar})
        for (double x : *g)
            if (std::isfinite(x)) maxall = std::max(maxall, fabs(x));
    const double fl = FLOOR_REL * maxall;
    mag_field(vb, "dq", ref.dq, got.dq, fl, ae, nan);
    mag_field(vb, "dk", ref.dk, got.dk, fl, ae, nan);
    mag_field(vb, "dv", ref.dv, got.dv, fl, ae, nan);
    static const char *pn[3] = {"dt_raw", "dbeta", "dgamma"};
    const int64_t H = R.p.H;
    for (int s = 0; s < 3; s++)
        mag_field(vb, pn[s], std::vector<double>(ref.dpar.begin() + s * H, ref.dpar.begin() + (s + 1) * H),
                  std::vector<double>(got.dpar.begin() + s * H, got.dpar.begin() + (s + 1) * H), fl, ae, nan);
    return {vf, vb};
}

MagOut mag_cpu(const MagProblem &M) {
    const mag_params &p = M.p;
    const size_t BHN = (size_t)(p.B * p.H * p.N);
    MagOut o;
    o.out.assign(BHN * (size_t)p.dv, NAN);
    o.mu.assign(BHN, NAN);
    o.dq.assign(BHN * (size_t)p.d, NAN);
    o.dk.assign(BHN * (size_t)p.d, NAN);
    o.dv.assign(BHN * (size_t)p.dv, NAN);
    o.dpar.assign((size_t)(3 * p.H), NAN);
    mag_fwd_args a;
    memset(&a, 0, sizeof(a));
    a.q = M.q.data(); a.k = M.k.data(); a.v = M.v.data();
    a.t_raw = M.t_raw.data(); a.beta = M.beta.data(); a.gamma = M.gamma.data();
    a.key_padding_mask = M.kpm.empty() ? nullptr : M.kpm.data();
    a.out = o.out.data(); a.mu = o.mu.data();
    o.rc_f = magnitude_fwd_f64(&p, &a);
    mag_bwd_args ba;
    memset(&ba, 0, sizeof(ba));
    ba.in = a;
    ba.grad_out = M.gout.data();
    ba.grad_mu = M.gmu.empty() ? nullptr : M.gmu.data();
    ba.dq = o.dq.data(); ba.dk = o.dk.data(); ba.dv = o.dv.data(); ba.dparams = o.dpar.data();
    o.rc_b = magnitude_bwd_f64(&p, &ba);
    return o;
}

MagOut mag_cuda(const MagProblem &M, int dt) {
    const mag_params &p = M.p;
    const size_t BHN = (size_t)(p.B * p.H * p.N), es = dt_size(dt);
    const int cdt = cuda_code(dt);
    DevBuf q = upload(dt, M.q), k = upload(dt, M.k), v = upload(dt, M.v), tr = upload(dt, M.t_raw),
           be = upload(dt, M.beta), ga = upload(dt, M.gamma), go = upload(dt, M.gout), gm = upload(dt, M.gmu),
           kpm = upload_bytes(M.kpm.data(), M.kpm.size());
    DevBuf out(BHN * (size_t)p.dv * es), mu(BHN * es), dq(BHN * (size_t)p.d * es), dk(BHN * (size_t)p.d * es),
        dv(BHN * (size_t)p.dv * es), dpar((size_t)(3 * p.H) * es);
    mag_fwd_args a;
    memset(&a, 0, sizeof(a));
    a.q = q.p; a.k = k.p; a.v = v.p; a.t_raw = tr.p; a.beta = be.p; a.gamma = ga.p;
    a.key_padding_mask = (const uint8_t *)kpm.p;
    a.out = out.p; a.mu = mu.p;
    MagOut o;
    o.rc_f = magnitude_cuda_fwd(&p, &a, cdt, nullptr);
    if (o.rc_f == 0) o.rc_f = (int)cudaDeviceSynchronize();
    mag_bwd_args ba;
    memset(&ba, 0, sizeof(ba));
    ba.in = a;
    ba.grad_out = go.p;
    ba.grad_mu = gm.p;
    ba.dq = dq.p; ba.dk = dk.p; ba.dv = dv.p; ba.dparams = dpar.p;
    o.rc_b = magnitude_cuda_bwd(&p, &ba, cdt, nullptr);
    if (o.rc_b == 0) o.rc_b = (int)cudaDeviceSynchronize();
    o.out = download(dt, out, BHN * (size_t)p.dv);
    o.mu = download(dt, mu, BHN);
    o.dq = download(dt, dq, BHN * (size_t)p.d);
    o.dk = download(dt, dk, BHN * (size_t)p.d);
    o.dv = download(dt, dv, BHN * (size_t)p.dv);
    o.dpar = download(dt, dpar, (size_t)(3 * p.H));
    return o;
}

bool run_mag_case(int idx, const MagCase &c, const std::vector<int> &dts, Totals &tot, bool quiet) {
    const auto t0 = std::chrono::steady_clock::now();
    MagProblem M = make_mag(c);
    const bool sick = c.sick != SICK_NONE;
    if (c.cut) { /* no upstream gradient where the CPU forward is non-finite */
        const MagOut f = mag_cpu(M);
        const size_t dv = (size_t)M.p.dv;
        for (size_t r = 0; r < f.mu.size(); r++) {
            bool hit = false;
            for (size_t e = 0; e < dv; e++) hit |= !std::isfinite(f.out[r * dv + e]);
            if (hit) std::fill_n(M.gout.begin() + (long)(r * dv), dv, 0.0);
            if (!M.gmu.empty() && !std::isfinite(f.mu[r])) M.gmu[r] = 0.0;
        }
    }
    bool ok = true;
    std::string line;
    for (int dt : dts) {
        const MagProblem R = rounded_mag(M, dt);
        harness_cuda_error() = cudaSuccess;
#ifdef ASC_CUDA_EMU
        asc_emu_reset();
        const long long live0 = asc_emu_live_allocations();
#endif
        const MagOut cpu = mag_cpu(R), got = mag_cuda(R, dt);
        /* float64: CUDA and CPU against long double; below: CUDA and CPU float32 against CPU float64.
         * Non-finite inputs: against the CPU kernel (SPEC section 11 is its semantics; mag_ld multiplies
         * masked entries by zero) */
        const MagOut ref = dt == DT_F64 && !sick ? mag_ld(R) : cpu, peer = dt == DT_F64 ? cpu : mag_cpu32(R);
        auto [vf, vb] = mag_errors(R, ref, got, storage_abs_error(dt), sick);
        const auto [pf, pb] = mag_errors(R, ref, peer, 0.0, sick);
        if (cpu.rc_f || cpu.rc_b || peer.rc_f || peer.rc_b) vf.note("cpu rc", INFINITY, 0, cpu.rc_f, cpu.rc_b);
        if (got.rc_f) vf.note(std::string("rc ") + cudaGetErrorString((cudaError_t)got.rc_f), INFINITY, 0, 0, got.rc_f);
        if (got.rc_b) vb.note(std::string("rc ") + cudaGetErrorString((cudaError_t)got.rc_b), INFINITY, 0, 0, got.rc_b);
        if (harness_cuda_error() != cudaSuccess)
            vb.note(std::string("CUDA runtime: ") + cudaGetErrorString(harness_cuda_error()), INFINITY, 0, 0, 0);
#ifdef ASC_CUDA_EMU
        if (asc_emu_live_allocations() != live0) vb.note("device allocations leaked", INFINITY, 0, (double)live0, 0);
#endif
        /* a peer that fails outright (a NaN of its own) widens nothing */
        const double tf = std::max(TOL_MAG[dt][0], std::isfinite(pf.err) ? 10.0 * pf.err : 0.0);
        const double tb = std::max(TOL_MAG[dt][1], std::isfinite(pb.err) ? 10.0 * pb.err : 0.0);
        const bool okf = vf.err <= tf, okb = vb.err <= tb;
        ok &= okf && okb;
        if (tf == TOL_MAG[dt][0]) tot.worst_mag_fwd[dt] = std::max(tot.worst_mag_fwd[dt], vf.err);
        if (tb == TOL_MAG[dt][1]) tot.worst_mag_bwd[dt] = std::max(tot.worst_mag_bwd[dt], vb.err);
        if (tf > TOL_MAG[dt][0] || tb > TOL_MAG[dt][1]) tot.mag_sens++;
        char b[512], sens[96] = "";
        if (tf > TOL_MAG[dt][0] || tb > TOL_MAG[dt][1]) snprintf(sens, sizeof(sens), " (peer %.0e/%.0e)", pf.err, pb.err);
        snprintf(b, sizeof(b), " | %s fwd %.1e bwd %.1e%s%s%s", dt_name(dt), vf.err, vb.err, sens,
                 okf ? "" : (" FWD@" + vf.where).c_str(), okb ? "" : (" BWD@" + vb.where).c_str());
        line += b;
    }
    char sk[64] = "";
    if (sick)
        snprintf(sk, sizeof(sk), " %s in %s of %s token %lld%s",
                 std::isnan(c.sick_val) ? "nan" : c.sick_val > 0 ? "inf" : "-inf", sick_name[c.sick],
                 c.kpm == KPM_FIRST && c.sick_tok == 0 ? "padded" : "valid", (long long)c.sick_tok,
                 c.cut ? " cut" : "");
    if (!quiet || !ok)
        printf("[m%2d] magnitude N=%-3lld B=%lld H=%lld d=%lld dv=%lld n_iter=%lld eps=%g kpm=%s%s%s%s%s | %s (%.1f s)\n", idx,
               (long long)c.N, (long long)c.B, (long long)c.H, (long long)c.d, (long long)c.dv, (long long)c.n_iter,
               c.eps, kpm_name[c.kpm], c.gmu ? " gmu" : "", c.dup ? " dupkeys" : "", sk, line.c_str(),
               ok ? "ok" : "FAIL", since(t0));
    fflush(stdout);
    if (ok) tot.pass++;
    else tot.fail++;
    return ok;
}

std::vector<MagCase> magnitude_cases(bool reduced) {
    std::vector<MagCase> cs;
    uint64_t seed = 500 + g_seed_shift;
    const std::vector<int64_t> Ns = reduced ? std::vector<int64_t>{1, 33} : std::vector<int64_t>{1, 2, 7, 33, 65};
    for (int64_t N : Ns)
        for (int cfg = 0; cfg < 4; cfg++) {
            MagCase c;
            c.N = N;
            c.seed = seed++;
            switch (cfg) {
                case 0: break;                                              /* defaults */
                case 1: c.kpm = KPM_B1ALL; c.gmu = 1; break;                /* a (b, h) without keys */
                case 2: c.kpm = KPM_RANDOM; c.n_iter = 10; c.eps = 0.5; break; /* stops early (converged) */
                default: c.dup = 1; c.kpm = KPM_FIRST; c.gmu = 1; c.n_iter = 6; break;
            }
            cs.push_back(c);
        }
    MagCase c;
    c = MagCase(); c.N = 20; c.n_iter = 0; c.gmu = 1; c.seed = seed++; cs.push_back(c); /* no step: mu = 0 */
    c = MagCase(); c.N = 17; c.dv = 0; c.gmu = 1; c.seed = seed++; cs.push_back(c);    /* only mu (a value gate) */
    if (!reduced) {
        c = MagCase(); c.N = 40; c.d = 40; c.dv = 35; c.n_iter = 1; c.seed = seed++; cs.push_back(c); /* d > 32 */
        c = MagCase(); c.N = 30; c.B = 1; c.H = 3; c.kamp = 0.05; c.t_lo = 3; c.t_hi = 40; c.seed = seed++;
        cs.push_back(c); /* close keys, softplus past 30 */
        c = MagCase(); c.N = 48; c.d = 64; c.dv = 64; c.kpm = KPM_RANDOM; c.gmu = 1; c.seed = seed++; cs.push_back(c);
    }
    /* non-finite inputs in (b, h) = (1, 0), token 0 padded (MagCase) */
    auto sick = [&](int where, int64_t N, int64_t tok, double val, int gmu, int cut) {
        c = MagCase(); c.N = N; c.kpm = KPM_FIRST; c.sick = where; c.sick_tok = tok; c.sick_val = val; c.gmu = gmu;
        c.cut = cut; c.seed = seed++; cs.push_back(c);
    };
    sick(SICK_K, 37, 2, NAN, 1, 0); /* every row and mu of (1, 0), across two key tiles */
    if (!reduced) {
        sick(SICK_Q, 7, 2, NAN, 1, 0);     /* its own row */
        sick(SICK_Q, 37, 35, NAN, 1, 1);   /* ... without upstream gradient there: every gradient finite */
        sick(SICK_Q, 7, 0, NAN, 0, 0);     /* a padded token's query: its row still attends */
        sick(SICK_K, 7, 2, NAN, 1, 1);     /* (1, 0) without upstream gradient: skipped whole */
        sick(SICK_K, 37, 0, NAN, 1, 0);    /* a padded key: never read */
        sick(SICK_V, 7, 2, NAN, 0, 0);     /* one column of every row of (1, 0) */
        sick(SICK_V, 37, 3, NAN, 1, 1);    /* ... cut: only the loss on mu pulls (1, 0) */
        sick(SICK_V, 7, 2, NAN, 0, 1);     /* ... cut, no loss on mu: (1, 0) skipped whole */
        sick(SICK_V, 7, 0, NAN, 1, 0);     /* a padded value: never read */
        sick(SICK_Q, 7, 4, INFINITY, 0, 0);
        sick(SICK_K, 7, 4, -INFINITY, 1, 0);
        sick(SICK_V, 37, 4, INFINITY, 1, 0);
        sick(SICK_K, 7, 0, INFINITY, 0, 0);
    }
    return cs;
}

/* Feature sizes whose tiles do not fit in shared memory: both launchers must return
 * cudaErrorInvalidValue (the binding turns it into a RuntimeError naming it), write nothing past
 * their outputs and free their scratch. Also Nq = 0 (no query rows): success, zero gradients. */
bool run_limits(Totals &tot) {
    bool ok = true;
    CaseDef c;
    c.N = 5;
    c.B = 1;
    c.H = 1;
    c.d = 1024;
    c.dv = 1024;
    Problem P = make_problem(c);
    harness_cuda_error() = cudaSuccess;
#ifdef ASC_CUDA_EMU
    asc_emu_reset();
    const long long live0 = asc_emu_live_allocations();
#endif
    const Fwd f = cuda_fwd(P, DT_F64, false);
    const Bwd g = cuda_bwd(P, DT_F64, P.gout, P.gaux, P.gu);
    ok &= f.rc == (int)cudaErrorInvalidValue && g.rc == (int)cudaErrorInvalidValue;
#ifdef ASC_CUDA_EMU
    ok &= asc_emu_live_allocations() == live0;
#endif
    cudaGetLastError();
    c = CaseDef();
    c.N = 6;
    c.Nq = 0;
    P = make_problem(c);
    const Bwd z = cuda_bwd(P, DT_F64, P.gout, P.gaux, P.gu), zr = cpu_bwd(P, P.gout, P.gaux, P.gu);
    bool zeros = z.rc == 0 && zr.rc == 0;
    for (int t = 1; t < NIN; t++)
        for (size_t e = 0; e < z.g[t].size(); e++) zeros &= z.g[t][e] == 0.0 && zr.g[t][e] == 0.0;
    for (double v : z.dsc) zeros &= v == 0.0;
    ok &= zeros;
    /* hand-made neighbour lists (the op's caller hands the backward its saved nbr): an index past N, below -1, or a
     * key after the -1 that ends a list is read as the end of the row's list (listed_key), nothing outside the
     * call is read (ASan), and the gradients are those of the lists cut there */
    c = CaseDef();
    c.variant = ASC_VARIANT_PAPER;
    c.N = 40;
    c.k = 4;
    c.causal = 1;
    P = rounded_problem(make_problem(c), DT_BF16);
    Fwd bad = cuda_fwd(P, DT_BF16, false), cut = bad;
    const int64_t nn = P.p.n_nbr, N = P.p.N;
    const int64_t edits[3][3] = {{9, 1, N + 5}, {17, 0, -3}, {33, 1, -1}}; /* row, slot, value */
    for (const auto &e : edits) {
        for (int64_t s = e[1]; s < nn; s++) cut.nbr[(size_t)(e[0] * nn + s)] = -1;
        bad.nbr[(size_t)(e[0] * nn + e[1])] = e[2];
    }
    bad.nbr[(size_t)(33 * nn + 2)] = 5; /* after the -1 */
    const Bwd gb = cuda_bwd(P, DT_BF16, P.gout, P.gaux, P.gu, &bad), gc = cuda_bwd(P, DT_BF16, P.gout, P.gaux, P.gu, &cut);
    const bool lists = bad.rc == 0 && gb.rc == 0 && gc.rc == 0 && gb.tiled && same_bits(gb, gc);
    ok &= lists;
    printf("[lim] d = dv = 1024: fwd rc %d, bwd rc %d (want %d, scratch freed); Nq = 0: zero gradients %s; hand-made nbr "
           "read as cut lists %s | %s\n", f.rc, g.rc, (int)cudaErrorInvalidValue, zeros ? "yes" : "no",
           lists ? "yes" : "no", ok ? "ok" : "FAIL");
    if (ok) tot.pass++;
    else tot.fail++;
    return ok;
}

}  // namespace

/* The launchers' scratch through a caller's pair, as the torch binding sets one (ascender_cuda_set_scratch): cases
 * 2, 3, 6, 7, ... take a counting pair around cudaMallocAsync / cudaFreeAsync, the others the default (both in each
 * of make test's two shards, which split the cases by parity); every allocation must be given back. */
static std::atomic<long> g_scratch_allocs{0}, g_scratch_frees{0};
static cudaError_t counting_alloc(void **p, size_t bytes, cudaStream_t stream) {
    g_scratch_allocs++;
    return cudaMallocAsync(p, bytes, stream);
}
static cudaError_t counting_free(void *p, cudaStream_t stream) {
    g_scratch_frees++;
    return cudaFreeAsync(p, stream);
}
static void scratch_by_case(int i) {
    const bool pair = (i >> 1) & 1;
    ascender_cuda_set_scratch(pair ? counting_alloc : nullptr, pair ? counting_free : nullptr);
}

int main(int argc, char **argv) {
    bool tsan = false, quiet = false, limits_only = false, few = false, determinism = false;
    int only = -1, only_dt = -1, shard = 0, nshards = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tsan")) tsan = true;
        else if (!strcmp(argv[i], "--quiet")) quiet = true;
        else if (!strcmp(argv[i], "--limits")) limits_only = true;
        else if (!strcmp(argv[i], "--few")) few = true;
        else if (!strcmp(argv[i], "--determinism")) determinism = true;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed-shift") && i + 1 < argc) g_seed_shift = strtoull(argv[++i], nullptr, 10);
        else if (!strcmp(argv[i], "--shard") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d/%d", &shard, &nshards) != 2 || nshards < 1 || shard < 0 || shard >= nshards) {
                fprintf(stderr, "test_kernels: --shard takes S/N with 0 <= S < N, got '%s'\n", argv[i]);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *n = argv[++i];
            for (int d = 0; d < NDT; d++)
                if (!strcmp(n, dt_name(d))) only_dt = d;
        } else {
            fprintf(stderr,
                    "usage: %s [--tsan] [--few] [--only I] [--shard S/N] [--limits] [--determinism] "
                    "[--dtype f64|f32|f16|bf16] [--seed-shift K] [--quiet]\n",
                    argv[0]);
            return 2;
        }
    }
    /* the forward's rows take their moments in closed form wherever a call can (not only the large calls the size
     * rule picks: the grid's are small), the sweep where it cannot (docs/cuda.md, "F2 in closed form") */
    setenv("ASCENDER_CUDA_MOMENTS", "closed", 0);
    std::vector<int> dts = tsan ? std::vector<int>{DT_F64, DT_F16} : std::vector<int>{DT_F64, DT_F32, DT_F16, DT_BF16};
    if (few) dts = {DT_F64, DT_F32, DT_BF16};
    if (only_dt >= 0) dts = {only_dt};
    const auto t0 = std::chrono::steady_clock::now();
    Totals tot;
    const std::vector<CaseDef> cs = ascender_cases(tsan);
    /* --few: a handful of cases that still reach every kernel path (for compute-sanitizer on a GPU) */
    auto in_few = [&](const std::vector<int64_t> &Ns, int64_t N) {
        return std::find(Ns.begin(), Ns.end(), N) != Ns.end();
    };
    for (size_t i = 0; i < cs.size() && !limits_only; i++) {
        if (few && !((cs[i].N == 33 && (i % 8 == 0 || i % 8 == 5)) || (cs[i].Nq >= 0 && cs[i].Nq > 1) ||
                     in_few({70}, cs[i].N)))
            continue;
        /* every eighth case (all with --determinism) checks that the backward gives the same bits twice */
        if ((only < 0 && (int)i % nshards == shard) || (int)i == only) {
            scratch_by_case((int)i);
            run_case((int)i, cs[i], dts, tot, quiet, determinism || i % 8 == 3);
        }
    }
    if (only < 0 && !few && shard == 0) run_limits(tot);
    const int asc_pass = tot.pass, asc_fail = tot.fail;
    const std::vector<MagCase> ms = magnitude_cases(tsan);
    for (size_t i = 0; i < ms.size() && !limits_only; i++) {
        if (few && !(ms[i].N == 33 && i % 4 < 2) && ms[i].dv != 0) continue;
        if ((only < 0 && (int)i % nshards == shard) || (int)i + 1000 == only) {
            scratch_by_case((int)i);
            run_mag_case((int)i, ms[i], dts, tot, quiet);
        }
    }
    ascender_cuda_set_scratch(nullptr, nullptr);
    if (g_scratch_allocs != g_scratch_frees) {
        printf("FAIL: the launchers took %ld scratch allocations through the caller's pair and gave back %ld\n",
               g_scratch_allocs.load(), g_scratch_frees.load());
        tot.fail++;
    }
    const double secs = since(t0);
    printf("ascender CUDA vs CPU: %d cases passed, %d failed;", asc_pass, asc_fail);
    for (int dt : dts)
        printf(" %s worst fwd %.1e (tol %.0e) bwd %.1e (tol %.0e);", dt_name(dt), tot.worst_fwd[dt], TOL[dt].fwd,
               tot.worst_bwd[dt], TOL[dt].bwd);
    printf(" rows: %d near-ties, %d left out of S fields, %d without incoming gradient, of %d\n", tot.ties,
           tot.skipped, tot.zeroed, tot.rows);
    printf("magnitude CUDA vs CPU: %d cases passed, %d failed;", tot.pass - asc_pass, tot.fail - asc_fail);
    for (int dt : dts)
        printf(" %s worst fwd %.1e (tol %.0e) bwd %.1e (tol %.0e);", dt_name(dt), tot.worst_mag_fwd[dt], TOL_MAG[dt][0],
               tot.worst_mag_bwd[dt], TOL_MAG[dt][1]);
    printf(" %d runs ill-conditioned (bounded by 10 x the CPU kernel's own error, see above)", tot.mag_sens);
    printf("\nscratch through the caller's pair: %ld allocations, %ld given back", g_scratch_allocs.load(),
           g_scratch_frees.load());
    if (nshards > 1) printf("\ntotal of shard %d/%d: %d passed, %d failed (%.1f s)\n", shard, nshards, tot.pass, tot.fail, secs);
    else printf("\ntotal: %d passed, %d failed (%.1f s)\n", tot.pass, tot.fail, secs);
#ifdef ASC_CUDA_EMU
    const asc_emu_stats s = asc_emu_get_stats();
    printf("emulator: %llu launches, %llu blocks, %llu block barriers, %llu warp collectives, %llu fiber switches\n",
           s.launches, s.blocks, s.block_barriers, s.warp_collectives, s.switches);
#endif
    return tot.fail ? 1 : 0;
}
