/*
 * bwd_tiled.cuh -- the tiled tensor-core backward of the ASCender op: the kernels of backward.cuh's plan and
 * their launcher (math: docs/backward.md; design: docs/cuda.md, "The backward: B1 and B2r row-major, B2c
 * key-major"), instantiated one dtype per translation unit (ascender_bwd_tiled_f32.cu, _f16.cu, _bf16.cu) so
 * that a parallel build compiles the three side by side; ascender_bwd_tiled.cu dispatches to them. Plain CUDA
 * C++, no torch.
 */
#ifndef ASCENDER_CUDA_BWD_TILED_CUH
#define ASCENDER_CUDA_BWD_TILED_CUH

#include "backward.cuh"
#include "chunks.cuh"
#include "tiled.h"

namespace asc {
namespace tiled {

/* ---------------------------------------------------------------- B1 */

/* OPT (B1, B2r): the instantiation for calls with dropout or an outside softcap, or that ask for the gradient of
 * attn_bias (B2r writes it per entry): `has_opt`; the other one is the common case's code without them. A run-time
 * branch alone cost B1 and B2r 100-220 bytes of spills (ptxas, sm_90: the out-of-line call in the sweep changes the
 * register allocation), and B2r's per-entry test of the attn_bias gradient a compare and a branch on each of its 16
 * entries; B2c keeps the branch (no spill cost). */
__host__ __device__ inline bool has_opt(const asc_params &p, const asc_bwd_args &ba) {
    return ba.in.dropout_seed != nullptr || other_outside(p, ba.in) || ba.dattn_bias != nullptr;
}

/* The saved neighbour lists (a.nbr, rows of n_nbr slots): a row's list ends at its first entry outside [0, N), where
 * the forward writes -1. The CPU backward refuses a hand-made list with any other entry (the binding); this one,
 * which could not check it without a synchronization, reads no key outside. list_length: a row's; listed_key: the
 * key that entry e names, or -1 past its row's list. */
__device__ inline bool listable(const asc_params &p, int64_t l) { return l >= 0 && l < p.N; }

__device__ inline int64_t list_length(const asc_params &p, const int64_t *row) {
    int64_t n = 0;
    while (n < p.n_nbr && listable(p, row[n])) n++;
    return n;
}

__device__ inline int64_t listed_key(const asc_params &p, const int64_t *nbr, int64_t e) {
    for (int64_t s = e - e % p.n_nbr; s <= e; s++)
        if (!listable(p, nbr[s])) return -1;
    return nbr[e];
}

/* Statistic x of output row orow as the backward reads it: the forward's compute-type copy (rows32: bf16 /
 * fp16), else the stored one. */
template <typename T>
__device__ double row_stat(const asc_params &p, const asc_fwd_args &a, int64_t orow, int x) {
    const float *r32 = rows32_at(p, a.rows32, orow, x);
    return r32 ? (double)*r32 : (double)up(((const T *)a.stats)[orow * ASC_NSTAT + x]);
}

/* All of them. */
template <typename T>
__device__ void row_stats(double (&st)[ASC_NSTAT], const asc_params &p, const asc_fwd_args &a, int64_t orow) {
    for (int x = 0; x < ASC_NSTAT; x++) st[x] = row_stat<T>(p, a, orow, x);
}

/* A row's Coef (120 bytes) is formed from its statistics where B1 needs it, before and after the sweep, instead
 * of kept in shared memory through it: two blocks per SM (docs/cuda.md, "Two blocks per SM for the backward"). */
template <typename T, class Tr, bool OPT>
__global__ void __launch_bounds__(Tr::THREADS)
    b1_kernel(const __grid_constant__ asc_params p, const __grid_constant__ asc_bwd_args ba,
              const __grid_constant__ KeyPrep<T> kp, const __grid_constant__ BwdRows<T> sr) {
    using C = typename Elem<T>::C;
    constexpr int NT = Tr::NT;
    ASC_DYNAMIC_SMEM(smem);
    BwdRowSmem<T, Tr> S;
    S.place(smem, p, true);
    const asc_fwd_args &a = ba.in;
    const TileBlock tb = tile_block((p.Nq + Tr::BM - 1) / Tr::BM, p.B * p.H, p.is_causal);
    const RowBlock<T, Tr> B(p, a, kp, tb.bh, tb.tile * Tr::BM);
    const int lane = B.lane, w = B.w, wrow = w * 16;
    const C *z0 = kp.z0 ? kp.z0 + B.bh * p.dz : nullptr;
    const double tcoh = p.tau_coh + EPS_TAU;

    /* ---- the rows from the saved outputs (warp per row, lane per feature) ---- */
    for (int rr = 0; rr < 16; rr++) {
        const int row = wrow + rr;
        const int64_t i = B.i0 + row, t = i + p.N - p.Nq - p.keys_after, orow = B.bh * p.Nq + i;
        BRow<C> &br = S.br[row];
        bool live = false, upstream = false;
        if (i < p.Nq) {
            const T *dy = (const T *)ba.grad_out + orow * p.dv;
            bool nz = false;
            for (int64_t f = lane; f < p.dv; f += 32) nz |= up(dy[f]) != 0;
            const C gco = ba.grad_aux ? (C)up(((const T *)ba.grad_aux)[orow * 2]) : (C)0;
            const C gse = ba.grad_aux ? (C)up(((const T *)ba.grad_aux)[orow * 2 + 1]) : (C)0;
            double st[ASC_NSTAT];
            row_stats<T>(st, p, a, orow);
            const float *r32 = rows32_at(p, a.rows32, orow);
            live = (__any_sync(FULL, nz) || gco != (C)0 || gse != (C)0) && st[ASC_STAT_LSE] != (double)INFINITY;
            bool gu = false;
            if (ba.grad_u)
                for (int64_t f = lane; f < p.d; f += 32) gu |= up(((const T *)ba.grad_u)[orow * p.d + f]) != 0;
            upstream = live || __any_sync(FULL, gu);
            /* P = dy.y + the aux terms of the saved outputs (docs/backward.md), known before the sweep, so that
             * B1's sums and B2 take each dS from the same expression (entry_dS); y and aux in the compute type
             * (rows32: bf16 / fp16, whose own 8 or 11 bits of y would miss P by 2^-9 of itself) */
            const float *y32 = r32 ? r32 + ASC_ROWS32_OUT(&p) : nullptr;
            const T *y = (const T *)a.out + orow * p.dv;
            double Py = 0.0;
            for (int64_t f = lane; f < p.dv; f += 32)
                Py += (double)up(dy[f]) * (y32 ? (double)y32[f] : (double)up(y[f]));
            Py = warp_sum(Py);
            if (a.aux) {
                const float *x32 = r32 ? r32 + ASC_ROWS32_AUX(&p) : nullptr;
                const T *x = (const T *)a.aux + orow * 2;
                Py += (double)gco * (x32 ? (double)x32[0] : (double)up(x[0])) +
                      (double)gse * (x32 ? (double)x32[1] : (double)up(x[1]));
            }
            const Coef<C> cf = coef_from_stats<C>(st, p, B.hd);
            /* the row operands: c~ (and the paper variant's u) split as the forward used them; the others exact */
            T *Cl = S.ro.Clo ? S.ro.Clo + (int64_t)row * S.ro.Cr.ld : nullptr;
            T *Ul = S.ro.Ulo ? S.ro.Ulo + (int64_t)row * S.ro.U.ld : nullptr;
            double cc2 = 0.0;
            for (int64_t f = lane; f < fpad_of<T>(p.dz); f += 32) {
                C ct = (C)0;
                if (f < p.dz)
                    ct = (r32 ? (C)r32[ASC_ROWS32_C(&p) + f] : (C)up(((const T *)a.c)[orow * p.dz + f])) -
                         (z0 ? z0[f] : (C)0);
                put_operand(S.ro.Cr.row(row), Cl, f, ct);
                if (f < p.dz) put_operand(sr.cop + orow * p.dz, sr.copl ? sr.copl + orow * p.dz : nullptr, f, ct);
                cc2 += (double)ct * (double)ct;
            }
            cc2 = warp_sum(cc2);
            const T zero = to_elem<T>(0.0f);
            const T *qi = (const T *)a.q + orow * p.d;
            for (int64_t f = lane; f < fpad_of<T>(p.d); f += 32) {
                S.ro.Q.row(row)[f] = f < p.d ? qi[f] : zero;
                if (!B.paper) {
                    S.ro.U.row(row)[f] = f < p.d ? B.kb[t * p.d + f] : zero;
                } else {
                    const C u = f >= p.d ? (C)0
                                : r32    ? (C)r32[ASC_ROWS32_U(&p) + f]
                                         : (C)up(((const T *)a.u)[orow * p.d + f]);
                    put_operand(S.ro.U.row(row), Ul, f, u);
                    if (f < p.d) put_operand(sr.uop + orow * p.d, sr.uopl ? sr.uopl + orow * p.d : nullptr, f, u);
                }
            }
            for (int64_t f = lane; f < fpad_of<T>(p.dz); f += 32) S.ro.Zr.row(row)[f] = f < p.dz ? B.zb[t * p.dz + f] : zero;
            for (int64_t f = lane; f < fpad_of<T>(p.da); f += 32) S.ro.Hr.row(row)[f] = f < p.da ? B.hb[t * p.da + f] : zero;
            for (int64_t f = lane; f < fpad_of<T>(p.dv); f += 32) S.ro.dY.row(row)[f] = f < p.dv ? dy[f] : zero;
            if (lane == 0) {
                br.xc = xcoef(cf);
                br.rv = RowVals<C>{B.nzb[t], (C)cc2, B.paper ? (C)1 : B.rkb[t], B.shb[t]};
                br.lse = (C)st[ASC_STAT_LSE];
                br.P = (C)Py;
                for (int x = 0; x < 3; x++) br.wm[x] = cf.theta[x] != (C)0 ? cf.mean[x] / cf.theta[x] : (C)0;
                br.gco = gco;
                br.gse = gse;
            }
        }
        __syncwarp();
        if (!live) zero_row_ops<T, false>(S.ro, row, p, lane); /* selected away, never multiplied */
        if (lane == 0) br.flags = (live ? ROW_LIVE : 0) | (upstream ? ROW_UP : 0);
        __syncwarp();
    }
    __syncthreads();

    /* ---- the sweep ---- */
    const LaneRows L = live_rows(B.L, S.br);
    const RowSlice<T> R = row_slice(S.ro, wrow);
    XCoef<C> xc[2];
    RowVals<C> rv[2];
    C gco[2], gse[2], k1[2];
    C wm[2][3]; /* the rows' bias means in w units: the sums of w are centred on them */
    for (int r = 0; r < 2; r++) {
        const BRow<C> &b = S.br[L.lr[r]];
        xc[r] = b.xc;
        rv[r] = b.rv;
        gco[r] = b.gco;
        gse[r] = b.gse;
        for (int x = 0; x < 3; x++) wm[r][x] = b.wm[x];
        k1[r] = (C)0; /* crc pc: the centroid's weight of dS (docs/tiling.md section 4) */
        if (!L.act[r]) continue;
        double st[ASC_NSTAT];
        row_stats<T>(st, p, a, B.bh * p.Nq + L.i[r]);
        const Coef<C> cf = coef_from_stats<C>(st, p, B.hd);
        if (cf.norm)
            k1[r] = (C)(-B.hd.v[H_LC] * (double)cf.gate_c / tcoh * B.hd.v[H_OC] / ((double)cf.sd[2] + EPS_STD));
    }
    /* Per entry dS_j = A_j (dA_j - P) / T~ (times the softcap's factor), P = sum_J A_j dA_j of the saved outputs
     * (dy.y and the aux terms, set up above) and A by the stored LSE: the sweep forms each dS_j as B2 does
     * (entry_dS, the same bits), so that the sums below and B2's entries agree where the normalized biases'
     * adjoints nearly cancel (docs/cuda.md "Fixed: float32 dz of rows with two keys"). dSx: dS before the
     * softcap's factor. */
    enum { SL, SD, SDR, SDP, SDC, SDX, SR, SP, SC, NSUM };
    double sums[2][NSUM];
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < NSUM; k++) sums[r][k] = 0.0;
    C *accw = S.acc + (int64_t)wrow * S.lda;
    for (int64_t e = lane; e < 16 * (int64_t)S.lda; e += 32) accw[e] = (C)0;
    __syncwarp();
    const bool aux = ba.grad_aux != nullptr, outside = OPT && other_outside(p, a),
               drop = OPT && a.dropout_seed != nullptr;
    const C delta = (C)B.hd.v[H_DELTA], dscale = (C)p.dropout_scale;
    sweep(B, S.ks, 0, stat_end(B.vis, B.tlast), NEED_K | NEED_V | NEED_Z | NEED_H, false,
          [&](int s, int64_t j0, const TileInfo &ti) {
              C xo[NT][4]; /* with an outside cap: the part of x past it */
              const unsigned keep =
                  drop || outside ? tile_extras<T, NT>(p, a, B.b, B.h, L, lane, j0, xc[0].itemp, xc[1].itemp, xo) : 0u;
              const KeySlice<T> K = key_slice(S.ks, s, 0, j0);
              PairVals<C, NT> pv;
              tile_scores<T, NT, OPT>(p, a, B.b, B.h, delta, L, R, K, lane, xc, rv, pv);
              C gdA[NT][4];
              score<T, NT>(gdA, R.dY, nullptr, K.V, p.dv, lane);
              if (drop) drop_scale(gdA, keep, dscale); /* dA = m dy.v / (1 - p) + aux */
              if (aux) add_aux_dA(gdA, pv, gco, gse);
              unsigned J, Ts, own;
              entry_sets<NT>(B.vis, L, lane, j0, ti, J, Ts, own);
              C wa[NT][4], wT[NT][4], wrc[NT][4];
              C ts[2][NSUM];
              ASC_UNROLL /* these small loops: g++ unrolls them as nvcc does (the cost model's line counts) */
              for (int r = 0; r < 2; r++)
                  ASC_UNROLL
                  for (int k = 0; k < NSUM; k++) ts[r][k] = (C)0;
              /* the tiles whose every entry is in J(i) and T(i) (all but the diagonal and partial ones) take a copy
               * without the per-entry tests (docs/cuda.md, "Full-tile fast paths in the backward's entry loops") */
              every_or_not(J == all_bits<NT>() && Ts == all_bits<NT>(), [&](auto every) {
                  constexpr bool all = decltype(every)::value;
                  ASC_UNROLL
                  for (int n = 0; n < NT; n++)
                      ASC_UNROLL
                      for (int e = 0; e < 4; e++) {
                          const int r = e >> 1, bit = 4 * n + e;
                          const bool inJ = all || ((J >> bit) & 1u), inT = all || ((Ts >> bit) & 1u);
                          C A = 0, dS = 0, dSx = 0;
                          if (inJ) {
                              entry_dS<T>(S.br[L.lr[r]], pv.x[n][e], outside ? pv.x[n][e] - xo[n][e] : pv.x[n][e],
                                          gdA[n][e], A, dS, dSx);
                          }
                          const C xv = inJ ? pv.x[n][e] : (C)0;
                          const C rr = inT ? pv.r[n][e] - wm[r][0] : (C)0,
                                  ph = inT ? pv.phi[n][e] - wm[r][1] : (C)0;
                          const C rc = inT ? pv.rc[n][e] - wm[r][2] : (C)0;
                          ts[r][SL] += A;
                          ts[r][SD] += dS;
                          ts[r][SDR] += dS * rr;
                          ts[r][SDP] += dS * ph;
                          ts[r][SDC] += dS * rc;
                          ts[r][SDX] += dSx * xv; /* the temperature's: through the capped score */
                          ts[r][SR] += rr;
                          ts[r][SP] += ph;
                          ts[r][SC] += rc;
                          wa[n][e] = inJ ? k1[r] * dS + gco[r] * A : (C)0;
                          wT[n][e] = inT ? (C)1 : (C)0;
                          wrc[n][e] = rc;
                      }
              });
              ASC_UNROLL
              for (int r = 0; r < 2; r++)
                  ASC_UNROLL
                  for (int k = 0; k < NSUM; k++) sums[r][k] += (double)ts[r][k];
              const bool safe = !ti.full && ti.badkey;
              const C one[2] = {(C)1, (C)1};
              /* for dc: sum_J (crc pc dS + g_coh A) z~, sum_T z~, sum_T (rc - wm) z~ */
              row_product<T, NT, true>(accw, S.lda, wa, one, J, safe, K.Z, p.dz, lane);
              row_product<T, NT, false>(accw + S.o1, S.lda, wT, one, Ts, safe, K.Z, p.dz, lane);
              row_product<T, NT, true>(accw + S.o2, S.lda, wrc, one, Ts, safe, K.Z, p.dz, lane);
          });

    /* ---- the row constants (docs/tiling.md section 4; the CPU backward after B1) ---- */
    double dsc[BWD_NACC];
    for (int s = 0; s < BWD_NACC; s++) dsc[s] = 0.0;
    const double la = B.hd.v[H_LA], ls = B.hd.v[H_LS], lc = B.hd.v[H_LC];
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < NSUM; k++) sums[r][k] = quad_sum(sums[r][k]);
        if ((lane & 3) != 0 || !L.act[r]) continue;
        const int row = L.lr[r];
        double st[ASC_NSTAT];
        row_stats<T>(st, p, a, B.bh * p.Nq + L.i[r]);
        const Coef<C> cf = coef_from_stats<C>(st, p, B.hd);
        BRow<C> &b = S.br[row];
        /* with a sink (SPEC section 12) its share exp(sink - LSE) joins L: sum_J A = 1 - that share */
        const double sink = a.sinks ? (double)up(((const T *)a.sinks)[ASC_SINK_AT(&p, B.b, B.h, B.i0 + row)]) : 0.0;
        const double *sm = sums[r], sh = a.sinks ? exp(sink - (double)b.lse) : 0.0, P = (double)b.P;
        /* dsink = -sum_i exp(sink - LSE_i) P_i: per block where its rows share the sink, else per row */
        if (sr.dsr) sr.dsr[B.bh * p.Nq + B.i0 + row] = -sh * P;
        else dsc[ACC_SINK] += -sh * P;
        const double n = (double)cf.n, n1 = B.paper ? n : n - 1.0, Sd = sm[SD];
        /* sum_J dS_j (w_j - wm) and sum_T (w_j - wm): centred on the row's means (BRow) */
        const double Sdw[3] = {sm[SDR], sm[SDP], sm[SDC]}, Sw[3] = {sm[SR], sm[SP], sm[SC]};
        double pq[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0}, Rx[3] = {0, 0, 0};
        dsc[H_TEMP] += -sm[SDX]; /* d temp~ = -sum_J dSx_j x_j */
        for (int x = 0; x < 3 && cf.norm; x++) {
            const double om = B.hd.v[H_OA + x], th = (double)cf.theta[x], mu = (double)cf.mean[x];
            const double sd = (double)cf.sd[x], den = sd + EPS_STD;
            const double off = th * (double)b.wm[x] - mu; /* the centring's offset in b: 0 but for rounding */
            const double Cdw = th * Sdw[x] + off * Sd;     /* sum_J dS_j (b_j - mu) */
            const double Gam = om * Cdw;                   /* sum_T g_j (b_j - mu) */
            dsc[H_OA + x] += Cdw / den;                    /* d omega = sum_J dS_j b~_j */
            const double gbar = om * Sd / n, dsig = -Gam / (den * den);
            const double csig = sd > 0.0 ? dsig / (n1 * sd) : 0.0;
            const double dev = th * Sw[x] + n * off; /* sum_T (b_j - mu): 0 but for rounding */
            pq[3 * x] = om / den;
            pq[3 * x + 1] = -gbar / den - csig * (dev / n - off); /* the constant of B^X on w - wm */
            pq[3 * x + 2] = csig * th;
            /* per-row factor: sum_T B_j w_j = eps / (sd + eps)^2 omega sum_J dS_j (w_j - mean_T w) */
            Rx[x] = EPS_STD / (den * den) * om * (Sdw[x] - Sw[x] / n * Sd);
        }
        const double ga = (double)cf.gate_a, gc = (double)cf.gate_c, eta = (double)cf.eta, kap = (double)cf.kap;
        const double rho = (double)cf.rho;
        dsc[H_LA] += ga * Rx[0];
        dsc[H_LS] += -eta * Rx[1];
        const double deta = -ls * Rx[1], ratio = rho / kap;
        const bool in_clamp = ratio >= 0.0 && ratio <= 1.0;
        if (in_clamp) dsc[H_KAPPA] += -deta * rho / (kap * kap);
        dsc[H_LC] += -(gc / tcoh) * Rx[2];
        const double dG = B.paper ? -(lc / tcoh) * Rx[2] * gc * (1.0 - gc) * p.alpha_coh : 0.0;
        const double Wd = (double)cf.wsum + EPS_TAU, crc = -lc * gc / tcoh;
        const double factor[3] = {la * ga, -ls * eta, crc}; /* cA, cphi, crc: BRow::kq */
        for (int k = 0; k < 9; k++) b.kq[k] = (C)(factor[k / 3] * pq[k]);
        b.drho = (C)(in_clamp ? deta / kap : 0.0);
        b.iW = (C)(1.0 / Wd);
        b.G = cf.G;
        b.dG = (C)dG;
        b.Ra = (C)Rx[0];
        /* for dc below: sum_T of the drc weights (docs/tiling.md section 4), crc qc, crc rcc */
        const double k1d = (double)k1[r];
        C *rx = S.rx + row * 3;
        rx[0] = (C)(k1d * Sd + (double)gco[r] * sm[SL] + crc * pq[7] * n + crc * pq[8] * sm[SC]); /* sum_J A < 1: sinks */
        rx[1] = (C)(crc * pq[7]);
        rx[2] = (C)(crc * pq[8]);
    }
    for (int s = 0; s < BWD_NACC; s++) {
        const double v = warp_sum(dsc[s]);
        if (lane == 0) S.dsc[w * BWD_NACC + s] = v;
    }
    __syncwarp();

    /* ---- per row: dc (warp per row) ---- */
    for (int rr = 0; rr < 16; rr++) {
        const int row = wrow + rr;
        const int64_t i = B.i0 + row, orow = B.bh * p.Nq + i;
        if (i >= p.Nq) continue;
        BRow<C> &b = S.br[row];
        const C *ar = S.acc + (int64_t)row * S.lda;
        if (!(b.flags & ROW_LIVE)) {
            for (int64_t f = lane; f < p.dz; f += 32) {
                sr.dchi[orow * p.dz + f] = to_elem<T>(0.0f);
                if (sr.dclo) sr.dclo[orow * p.dz + f] = to_elem<T>(0.0f);
            }
            if (lane == 0) sr.row[orow].r = b;
            continue;
        }
        const C *rx = S.rx + row * 3;
        const C sdrc = rx[0], e2 = rx[1], e3 = rx[2];
        double dcc = 0.0;
        const T *ctr = S.ro.Cr.row(row);
        for (int64_t f = lane; f < p.dz; f += 32) {
            const C ct = (C)up(ctr[f]), c = ct + (z0 ? z0[f] : (C)0);
            const C Edc = ar[f] + e2 * ar[S.o1 + f] + e3 * ar[S.o2 + f];
            const C dc = (C)-2 * (Edc - ct * sdrc + b.dG * b.iW * (C)EPS_TAU * c);
            put_operand(sr.dchi + orow * p.dz, sr.dclo ? sr.dclo + orow * p.dz : nullptr, f, dc);
            dcc += (double)dc * (double)ct;
        }
        dcc = warp_sum(dcc);
        if (lane == 0) {
            b.dcc = (C)dcc;
            sr.row[orow].r = b;
        }
        __syncwarp();
    }
    __syncthreads();
    if (threadIdx.x < BWD_NACC) {
        double v = 0.0;
        for (int k = 0; k < Tr::NW; k++) v += S.dsc[k * BWD_NACC + threadIdx.x];
        sr.dsc[(B.bh * sr.nslot + tb.tile) * BWD_NACC + threadIdx.x] = v;
    }
}

/* ---------------------------------------------------------------- staging a block of rows for B2r / B2c */

/* The sources of a block's row operands (from the inputs and B1's scratch), each as the address of its row 0: the
 * (b, h)'s query row 0, or the token of query row 0 (N - Nq - keys_after), so that row q0 is src + q0 * f; NULL
 * where the operand has no such array (the splits of the seed variant and of float32). In the order of
 * load_row_ops' walks: the width d (q, u, u's split), dz (c~, its split, z, dc, its split), da (h^), dv (dy). */
template <typename T> struct RowSrc {
    const T *s[10];
};

template <typename T, class Tr>
__device__ RowSrc<T> row_sources(const RowBlock<T, Tr> &B, const asc_bwd_args &ba, const BwdRows<T> &sr) {
    const asc_params &p = B.p;
    const asc_fwd_args &a = ba.in;
    const int64_t off = p.N - p.Nq - p.keys_after;
    auto qrow = [&](const void *x, int64_t f) { return x ? (const T *)x + B.bh * p.Nq * f : nullptr; };
    auto trow = [&](const T *x, int64_t f) { return x + off * f; };
    return RowSrc<T>{{qrow(a.q, p.d), B.paper ? qrow(sr.uop, p.d) : trow(B.kb, p.d), qrow(sr.uopl, p.d),
                      qrow(sr.cop, p.dz), qrow(sr.copl, p.dz), trow(B.zb, p.dz), qrow(sr.dchi, p.dz),
                      qrow(sr.dclo, p.dz), trow(B.hb, p.da), qrow(ba.grad_out, p.dv)}};
}

/* The four walks of load_row_ops: M destinations of one width f from sources src[first ..] at row q0. The walks
 * read a source only where its destination exists (every destination has its source: the same flags place both),
 * so the row offset is added without a test for a NULL source, in integers (what a NULL source gets is never read). */
template <unsigned OPT, typename T, int M, typename Walk>
__device__ __forceinline__ void row_walk(const RowSrc<T> &src, int first, const Smem2D<T> (&dst)[M], int64_t f,
                                         int64_t q0, Walk walk) {
    const T *s[M];
    const uintptr_t off = (uintptr_t)(q0 * f) * sizeof(T);
    ASC_UNROLL
    for (int m = 0; m < M; m++) s[m] = (const T *)((uintptr_t)src.s[first + m] + off);
    walk(dst, s, f, std::integral_constant<unsigned, OPT>{});
}

/* Copies the row operands of rows q0 .. q0 + rows - 1 (q0 < Nq) into ro (cp.async; the caller commits and waits,
 * then zeros the rows that do not take part, among them every row at or past Nq). The tiles of one width share a
 * walk (tiles_load); rows past Nq load as zeros from every source, the token arrays' too. Fixed (B2c's whole query
 * tiles in its shape Fixed::QB rows by Fixed::THREADS threads, when its block found every source aligned and every
 * width 4, 8 or 16 chunks: b2c_kernel): the fixed walk, whose offsets are compile-time (tiles_load_rows); void: the
 * general walk. */
template <typename T, class Fixed = void>
__device__ void load_row_ops(const RowSrc<T> &src, const asc_params &p, const RowOps<T> &ro, int64_t q0, int rows,
                             int tid, int nthr) {
    auto walk = [&](const auto &dst, const auto &s, int64_t f, auto opt) {
        if constexpr (!std::is_void<Fixed>::value && sizeof(T) == 2)
            tiles_load_fixed<T, Fixed::THREADS, Fixed::QB, decltype(opt)::value>(dst, s, f, tid);
        else tiles_load(dst, s, f, rows, p.Nq - q0, tid, nthr);
    };
    const Smem2D<T> dd[3] = {ro.Q, ro.U, Smem2D<T>{ro.Ulo, ro.U.ld}};
    const Smem2D<T> dz[5] = {ro.Cr, Smem2D<T>{ro.Clo, ro.Cr.ld}, ro.Zr, ro.dC, Smem2D<T>{ro.dClo, ro.dC.ld}};
    const Smem2D<T> da[1] = {ro.Hr}, dv[1] = {ro.dY};
    /* the fixed walk tests only u's split for NULL (the paper variant's): row_walk_fixed has checked the others */
    row_walk<4u>(src, 0, dd, p.d, q0, walk);
    row_walk<0u>(src, 3, dz, p.dz, q0, walk);
    row_walk<0u>(src, 8, da, p.da, q0, walk);
    row_walk<0u>(src, 9, dv, p.dv, q0, walk);
}

/* Whether every whole query tile of B2c takes the fixed walk: each source 16-byte aligned at every row (its row 0
 * and its row length: f 2-byte elements, f a multiple of 8), each width 4, 8 or 16 chunks, and every destination
 * there but u's split (load_row_ops tests no other for NULL). Once per block. */
template <typename T> __device__ bool row_walk_fixed(const RowSrc<T> &src, const RowOps<T> &ro, const asc_params &p) {
    if constexpr (sizeof(T) != 2) {
        (void)src;
        (void)ro;
        (void)p;
        return false;
    } else {
        const int64_t f[10] = {p.d, p.d, p.d, p.dz, p.dz, p.dz, p.dz, p.dz, p.da, p.dv};
        bool ok = ro.Clo && ro.dY.p && ro.dC.p && ro.dClo;
        for (int m = 0; m < 10; m++)
            ok = ok && fixed_walk_fits(src.s[m], f[m]);
        return ok;
    }
}

/* ---------------------------------------------------------------- B2r */

/*
 * B2r's launches (docs/cuda.md "The global rows over key chunks"): B2R_WHOLE, the row tiles after the long ones of
 * every (b, h), each over all its keys; the leading row tiles of a windowed call's global rows (long_row_tiles) in two
 * launches,
 * B2R_CHUNK, a block per (b, h, row tile, chunk of keys) leaving its rows' sums (the four accumulators, sum da and
 * sum dD) in `acc` and `sums`, and B2R_MERGE, a block per (b, h, row tile) adding them in chunk order and finishing
 * the rows as B2R_WHOLE does.
 */
enum { B2R_WHOLE = 0, B2R_CHUNK, B2R_MERGE };
template <typename C> struct B2rSplit {
    int mode;
    int64_t rows;      /* query rows per (b, h) in the partials: the long tiles' (B2R_WHOLE starts after them) */
    int64_t chunk, nch, w; /* keys per chunk, chunks, accumulator columns per row */
    C *acc;            /* [BH][rows][nch][w] */
    double *sums;      /* [BH][rows][nch][2]: sum da, sum dD */
    __device__ int64_t at(int64_t bh, int64_t i) const { return (bh * rows + i) * nch; }
};

template <typename T, class Tr, bool OPT>
__global__ void __launch_bounds__(Tr::THREADS)
    b2r_kernel(const __grid_constant__ asc_params p, const __grid_constant__ asc_bwd_args ba,
               const __grid_constant__ KeyPrep<T> kp, const __grid_constant__ BwdRows<T> sr,
               const __grid_constant__ B2rSplit<typename Elem<T>::C> sp) {
    using C = typename Elem<T>::C;
    constexpr int NT = Tr::NT;
    ASC_DYNAMIC_SMEM(smem);
    BwdRowSmem<T, Tr> S;
    S.place(smem, p, false);
    const asc_fwd_args &a = ba.in;
    const int64_t BH = p.B * p.H, ntile = sp.rows / Tr::BM;
    const bool whole = sp.mode == B2R_WHOLE;
    const int64_t y = grid_y(); /* the long tiles' blocks: (b, h) and tile */
    if (!whole && y >= ntile * BH) return;
    const TileBlock tb = whole ? tile_block((p.Nq + Tr::BM - 1) / Tr::BM - ntile, BH, p.is_causal)
                               : TileBlock{y % ntile, y / ntile};
    const int64_t tile = whole ? ntile + tb.tile : tb.tile, c = sp.mode == B2R_CHUNK ? (int64_t)blockIdx.x : 0;
    const RowBlock<T, Tr> B(p, a, kp, tb.bh, tile * Tr::BM);
    /* the keys this block sweeps ([0, 0): the merge), and the columns of dattn_bias it zeroes first */
    const int64_t send = stat_end(B.vis, B.tlast);
    int64_t jbeg = 0, jend = sp.mode == B2R_MERGE ? 0 : send, zbeg = 0, zend = sp.mode == B2R_MERGE ? 0 : p.N;
    if (sp.mode == B2R_CHUNK) {
        zbeg = jbeg = c * sp.chunk;
        zend = jbeg + sp.chunk < p.N ? jbeg + sp.chunk : p.N;
        jend = zend < send ? zend : send;
    }
    const int lane = B.lane, w = B.w, wrow = w * 16;
    for (int row = B.tid; row < Tr::BM; row += Tr::THREADS) {
        const int64_t i = B.i0 + row;
        if (i < p.Nq) S.br[row] = sr.row[B.bh * p.Nq + i].r;
        else S.br[row].flags = 0;
    }
    load_row_ops(row_sources(B, ba, sr), p, S.ro, B.i0, Tr::BM, B.tid, Tr::THREADS);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    zero_dead_rows(S.ro, S.br, wrow, B.i0, p.Nq, p, lane);
    /* dattn_bias: zeros, then the entries of the visited tiles */
    T *const dbias = OPT ? (T *)ba.dattn_bias : nullptr; /* OPT: the launch took it when this is asked for */
    if (dbias)
        for (int rr = 0; rr < 16; rr++) {
            const int64_t i = B.i0 + wrow + rr;
            if (i < p.Nq)
                for (int64_t j = zbeg + lane; j < zend; j += 32) put(dbias + (B.bh * p.Nq + i) * p.N + j, (C)0);
        }
    __syncthreads();

    const LaneRows L = live_rows(B.L, S.br);
    const RowSlice<T> R = row_slice(S.ro, wrow);
    XCoef<C> xc[2];
    RowVals<C> rv[2];
    for (int r = 0; r < 2; r++) {
        xc[r] = S.br[L.lr[r]].xc;
        rv[r] = S.br[L.lr[r]].rv;
    }
    C *accw = S.acc + (int64_t)wrow * S.lda;
    for (int64_t e = lane; e < 16 * (int64_t)S.lda; e += 32) accw[e] = (C)0;
    __syncwarp();
    const bool aux = ba.grad_aux != nullptr, outside = OPT && other_outside(p, a),
               drop = OPT && a.dropout_seed != nullptr;
    const C delta = (C)B.hd.v[H_DELTA], dscale = (C)p.dropout_scale;
    const C nis = (C)(-1.0 / (p.tau_sep + EPS_TAU)), nic = (C)(-1.0 / (p.tau_coh + EPS_TAU));
    const C nicx = (C)(-exp_scale<T>() / (p.tau_coh + EPS_TAU)); /* the forward's wc: the exp's scale folded in */
    double sda[2] = {0, 0}, sdD[2] = {0, 0};
    sweep(B, S.ks, jbeg, jend, NEED_K | NEED_V | NEED_Z | NEED_H, false,
          [&](int s, int64_t j0, const TileInfo &ti) {
              C xo[NT][4]; /* with an outside cap: the part of x past it */
              const unsigned keep =
                  drop || outside ? tile_extras<T, NT>(p, a, B.b, B.h, L, lane, j0, xc[0].itemp, xc[1].itemp, xo) : 0u;
              const KeySlice<T> K = key_slice(S.ks, s, 0, j0);
              PairVals<C, NT> pv;
              tile_scores<T, NT, OPT>(p, a, B.b, B.h, delta, L, R, K, lane, xc, rv, pv);
              C gdA[NT][4], gdc[NT][4];
              score<T, NT>(gdA, R.dY, nullptr, K.V, p.dv, lane);
              if (drop) drop_scale(gdA, keep, dscale);
              if (aux) {
                  const BRow<C> &b0 = S.br[L.lr[0]], &b1 = S.br[L.lr[1]];
                  const C gco[2] = {b0.gco, b1.gco}, gse[2] = {b0.gse, b1.gse};
                  add_aux_dA(gdA, pv, gco, gse);
              }
              score<T, NT>(gdc, R.dC, R.dClo, K.Z, p.dz, lane);
              unsigned J, Ts, own;
              entry_sets<NT>(B.vis, L, lane, j0, ti, J, Ts, own);
              C wTA[NT][4], wD[NT][4], wda[NT][4], wdS[NT][4], tda[2] = {0, 0}, tdD[2] = {0, 0};
              /* full tiles without the own token: a copy without the per-entry tests (as B1) */
              every_or_not(J == all_bits<NT>() && Ts == all_bits<NT>() && own == 0u, [&](auto every) {
                  constexpr bool all = decltype(every)::value;
                  ASC_UNROLL
                  for (int n = 0; n < NT; n++)
                      ASC_UNROLL
                      for (int e = 0; e < 4; e++) {
                          const int r = e >> 1, bit = 4 * n + e, col = frag_col(lane, n, e);
                          const bool inJ = all || ((J >> bit) & 1u), inT = all || ((Ts >> bit) & 1u),
                                     self = !all && ((own >> bit) & 1u);
                          const BRow<C> &b = S.br[L.lr[r]];
                          C A = 0, dS = 0, dSx = 0;
                          if (inJ) {
                              entry_dS<T>(b, pv.x[n][e], outside ? pv.x[n][e] - xo[n][e] : pv.x[n][e], gdA[n][e], A,
                                          dS, dSx);
                          }
                          const C wc = ex_scaled<T>(pv.D[n][e] * nicx);
                          const bool dens = inT && !(B.paper && self);
                          const Adj<C> j = entry_adj(b, inT, dens, dS, A, pv.r[n][e], pv.phi[n][e], pv.rc[n][e],
                                                     pv.ws[n][e], wc, pv.red[n][e], gdc[n][e], nis, nic);
                          wTA[n][e] = j.TA * K.rk[col];
                          wD[n][e] = j.dD;
                          wdS[n][e] = dS;
                          wda[n][e] = j.da * K.sh[col];
                          tda[r] += j.da;
                          tdD[r] += j.dD;
                          if (dbias && L.act[r] && K.j0 + col < p.N)
                              put(dbias + (B.bh * p.Nq + L.i[r]) * p.N + K.j0 + col, outside ? dSx : dS);
                      }
              });
              for (int r = 0; r < 2; r++) {
                  sda[r] += (double)tda[r];
                  sdD[r] += (double)tdD[r];
              }
              const bool safe = !ti.full && ti.badkey;
              const C one[2] = {(C)1, (C)1};
              row_product<T, NT, false>(accw, S.lda, wTA, one, Ts, safe, K.K, p.d, lane);
              /* dz_t = 2 (z~_t sum dD - sum dD z~_j): the two cancel where z_j is near z_t, so dD enters split */
              row_product<T, NT, true>(accw + S.o1, S.lda, wD, one, Ts, safe, K.Z, p.dz, lane);
              row_product<T, NT, false>(accw + S.o2, S.lda, wda, one, Ts, safe, K.H, p.da, lane);
              row_product<T, NT, false>(accw + S.o3, S.lda, wdS, one, J, safe, K.K, p.d, lane);
          });
    for (int r = 0; r < 2; r++) {
        sda[r] = quad_sum(sda[r]);
        sdD[r] = quad_sum(sdD[r]);
    }
    if (sp.mode == B2R_CHUNK) { /* the rows' sums over this chunk */
        for (int rr = 0; rr < 16; rr++) {
            const int row = wrow + rr, src = (rr & 7) << 2;
            const double da = __shfl_sync(FULL, rr < 8 ? sda[0] : sda[1], src),
                         dD = __shfl_sync(FULL, rr < 8 ? sdD[0] : sdD[1], src);
            if (B.i0 + row >= p.Nq) break;
            const int64_t at = sp.at(B.bh, B.i0 + row) + c;
            const C *ar = S.acc + (int64_t)row * S.lda;
            for (int64_t f = lane; f < sp.w; f += 32) sp.acc[at * sp.w + f] = ar[f];
            if (lane == 0) {
                sp.sums[2 * at] = da;
                sp.sums[2 * at + 1] = dD;
            }
        }
        return;
    }
    if (sp.mode == B2R_MERGE) { /* every chunk's sums, in chunk order */
        for (int rr = 0; rr < 16; rr++) {
            const int row = wrow + rr;
            if (B.i0 + row >= p.Nq) break;
            const int64_t at = sp.at(B.bh, B.i0 + row);
            C *ar = S.acc + (int64_t)row * S.lda;
            for (int64_t f = lane; f < sp.w; f += 32) {
                C v = (C)0;
                for (int64_t k = 0; k < sp.nch; k++) v += sp.acc[(at + k) * sp.w + f];
                ar[f] = v;
            }
        }
        for (int r = 0; r < 2; r++) {
            if (B.i0 + L.lr[r] >= p.Nq) continue;
            const int64_t at = sp.at(B.bh, B.i0 + L.lr[r]);
            sda[r] = sdD[r] = 0.0;
            for (int64_t k = 0; k < sp.nch; k++) {
                sda[r] += sp.sums[2 * (at + k)];
                sdD[r] += sp.sums[2 * (at + k) + 1];
            }
        }
        __syncwarp();
    }
    double ddelta = 0.0;
    for (int r = 0; r < 2; r++)
        if ((lane & 3) == 0 && L.act[r]) ddelta += -sda[r];
    ddelta = warp_sum(ddelta);
    if (lane == 0) S.dsc[w] = ddelta;
    /* ---- per row: the heading's gradient, the own token's dz and dh^ ---- */
    for (int rr = 0; rr < 16; rr++) {
        const int row = wrow + rr, src = (rr & 7) << 2;
        const int64_t i = B.i0 + row, orow = B.bh * p.Nq + i;
        const double SDD = __shfl_sync(FULL, rr < 8 ? sdD[0] : sdD[1], src);
        if (i >= p.Nq) continue;
        const BRow<C> &b = S.br[row];
        const C *ar = S.acc + (int64_t)row * S.lda;
        const bool live = b.flags & ROW_LIVE;
        T *dq = (T *)ba.dq + orow * p.d;
        for (int64_t f = lane; f < p.d; f += 32) put(dq + f, live ? (C)p.scale * ar[S.o3 + f] : (C)0);
        if (live) {
            const T *zt = S.ro.Zr.row(row);
            for (int64_t f = lane; f < p.dz; f += 32)
                sr.dzr[orow * p.dz + f] = (C)(2.0 * ((double)up(zt[f]) * SDD - (double)ar[S.o1 + f]));
            for (int64_t f = lane; f < p.da; f += 32) sr.dhr[orow * p.da + f] = ar[S.o2 + f];
        }
        if (!(b.flags & ROW_UP)) continue;
        C *hd = sr.head + orow * p.d;
        const T *gu = ba.grad_u ? (const T *)ba.grad_u + orow * p.d : nullptr;
        for (int64_t f = lane; f < p.d; f += 32) hd[f] = (live ? ar[f] : (C)0) + (gu ? (C)up(gu[f]) : (C)0);
        __syncwarp();
        if (!B.paper) continue; /* u = k^_t: du goes to dk^_t */
        const int64_t cnt = list_length(p, a.nbr + orow * p.n_nbr);
        /* UNORM, the gate and u in the compute type where the forward kept them (rows32: bf16 / fp16), so that the
         * rule below decides on the value the forward decided on */
        const double un = row_stat<T>(p, a, orow, ASC_STAT_UNORM), ga = row_stat<T>(p, a, orow, ASC_STAT_GATE_A);
        const float *u32 = rows32_at(p, a.rows32, orow, ASC_ROWS32_U(&p));
        const T *u = (const T *)a.u + orow * p.d;
        auto uf = [&](int64_t f) { return u32 ? (double)u32[f] : (double)up(u[f]); };
        /* u = m / ||m||, or 0 where the unit keys cancel to rounding (the forward's EPS_HEADING rule on the stored
         * UNORM): no gradient through u there, and m (the gate's mean times cnt) is u ||m|| = 0 */
        const bool heading = un > EPS_HEADING * (double)cnt;
        double udu = 0.0;
        for (int64_t f = lane; f < p.d; f += 32) udu += uf(f) * (double)hd[f];
        udu = warp_sum(udu);
        for (int64_t f = lane; f < p.d; f += 32) hd[f] = heading ? (C)(((double)hd[f] - uf(f) * udu) / un) : (C)0;
        if (lane == 0) {
            const double dV = B.hd.v[H_LA] * (live ? (double)b.Ra : 0.0) * ga * (1.0 - ga) * p.alpha_align;
            sr.hc[orow * 2] = cnt > 0 ? (C)(2.0 * dV / (double)cnt) : (C)0;
            sr.hc[orow * 2 + 1] = heading && cnt > 0 ? (C)(un / (double)cnt) : (C)0;
        }
        __syncwarp();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double v = 0.0;
        for (int k = 0; k < Tr::NW; k++) v += S.dsc[k];
        sr.dsc[(B.bh * sr.nslot + tile) * BWD_NACC + H_DELTA] = v;
    }
}

/* ---------------------------------------------------------------- B2c */

/* The key-major kernel's shared memory: its key block (one stage), Cl::STAGES stages of query-tile operands
 * (one: two standard blocks per SM at d = 64, docs/cuda.md), the pair weights of a step, the column accumulators. */
template <typename T, class Cl> struct B2cSmem {
    using C = typename Elem<T>::C;
    using W = typename std::conditional<Elem<T>::kMma, T, C>::type; /* the weight tiles' type */
    KeyStages<T> ks;
    RowOps<T> ro0;
    int64_t rstage;             /* bytes from query stage 0 to 1 */
    Smem2D<W> wt[9];            /* [QB][KB]: scale dS, A, TA u-scale, -2 drc, wc / W, -2 dD, da sh; the mma path's
                                 * rounding errors of -2 drc and -2 dD (dz_j's terms cancel against 2 z~_j sum) */
    C *acc;                     /* [KB][lda]: dk | dk^ | dv | dz | dh^ */
    int lda;
    int64_t oKh, oV, oZ, oH;
    C *csum;                    /* [WR][KB]: per warp row of the layout, sum_i (drc + dD) */
    C *ctot;                    /* [KB] */
    int32_t *flags;             /* [STAGES][QB] */
    int32_t *dead;              /* [STAGES]: some row of the stage does not take part (its operands get zeroed) */
    RowSrc<T> *src;             /* the sources of the query tiles' row operands (once per block) */
    int32_t *fixed;             /* whole query tiles take the fixed walk (row_walk_fixed) */
    float *wmax;                /* [NW][7]: fp16: the largest |weight| per warp of each tile of a step */
    float *wsc;                 /* [7]: the factors the weight tiles of a step were stored with */
    int64_t bytes;

    __host__ __device__ void place(unsigned char *base, const asc_params &p) {
        Carve cv(base);
        ks.place(cv, p, Cl::KB, 1);
        const int64_t at = cv.off;
        ro0.place(cv, p, Cl::QB, Elem<T>::kMma && p.variant == ASC_VARIANT_PAPER, Elem<T>::kMma, true);
        rstage = cv.off - at;
        cv.take(rstage * (Cl::STAGES - 1));
        for (int k = 0; k < (Elem<T>::kMma ? 9 : 7); k++) wt[k] = cv.tile<W>(Cl::QB, Cl::KB);
        const int64_t d = fpad_of<T>(p.d), dv = fpad_of<T>(p.dv), dz = fpad_of<T>(p.dz), da = fpad_of<T>(p.da);
        oKh = d;
        oV = 2 * d;
        oZ = 2 * d + dv;
        oH = 2 * d + dv + dz;
        lda = (int)acc_stride<T>(oH + da);
        acc = cv.array<C>((int64_t)Cl::KB * lda);
        csum = cv.array<C>(Cl::WR * Cl::KB);
        ctot = cv.array<C>(Cl::KB);
        flags = cv.array<int32_t>(Cl::STAGES * Cl::QB);
        dead = cv.array<int32_t>(Cl::STAGES);
        src = cv.array<RowSrc<T>>(1);
        fixed = cv.array<int32_t>(1);
        wmax = cv.array<float>(Cl::NW * 7);
        wsc = cv.array<float>(7);
        bytes = cv.off;
    }
    __device__ RowOps<T> ro(int s) const {
        RowOps<T> r = ro0;
        const int64_t o = s * rstage;
        auto mv = [&](Smem2D<T> &x) { if (x.p) x.p = reinterpret_cast<T *>(reinterpret_cast<unsigned char *>(x.p) + o); };
        auto mvp = [&](T *&x) { if (x) x = reinterpret_cast<T *>(reinterpret_cast<unsigned char *>(x) + o); };
        mv(r.Q); mv(r.U); mv(r.Cr); mv(r.Zr); mv(r.Hr); mv(r.dY); mv(r.dC);
        mvp(r.Ulo); mvp(r.Clo); mvp(r.dClo);
        return r;
    }
};

/* The first query tile (a multiple of QB rows) at or after row q whose tokens may see keys j0 .. jh through a
 * window or a global token (the mirror of window_next); Nq when none is left. off: the token of query row 0
 * (N - Nq - keys_after). */
__device__ inline int64_t row_tile_next(const Vis &v, int64_t off, int64_t j0, int64_t jh, int64_t q, int qb) {
    const int64_t L = v.wl, R = v.wr;
    if ((L < 0 && R < 0) || q >= v.Nq || (v.glob && v.glob[jh + 1] > v.glob[j0])) return q;
    const int64_t lo = R < 0 ? 0 : j0 - R, hi = L < 0 ? v.N : jh + L + 1; /* tokens that see them */
    const int64_t t = q + off;
    if (t + qb > lo && t < hi) return q;
    int64_t next = v.gnext ? v.gnext[t < v.N ? t : v.N] : v.N;
    if (t < lo && lo < next) next = lo;
    if (next >= v.N) return v.Nq;
    return (next - off) / qb * qb; /* >= q (next >= t); q itself when a global row of tile q is next */
}

template <typename T, class Cl>
__global__ void __launch_bounds__(Cl::THREADS)
    b2c_kernel(const __grid_constant__ asc_params p, const __grid_constant__ asc_bwd_args ba,
               const __grid_constant__ KeyPrep<T> kp, const __grid_constant__ BwdRows<T> sr) {
    using C = typename Elem<T>::C;
    using Wt = typename B2cSmem<T, Cl>::W;
    constexpr int KB = Cl::KB, QB = Cl::QB, NT = Cl::NT, NWK = Cl::NW, MT = KB / 16;
    ASC_DYNAMIC_SMEM(smem);
    B2cSmem<T, Cl> S;
    S.place(smem, p);
    const asc_fwd_args &a = ba.in;
    const TileBlock tb = tile_block((p.N + KB - 1) / KB, p.B * p.H, false); /* causal: the first keys have most rows */
    const RowBlock<T, typename Tiles<T>::Row> B(p, a, kp, tb.bh, 0);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, wm = w % Cl::WR, wn = w / Cl::WR;
    const int64_t j0 = tb.tile * KB, jh = (j0 + KB < p.N ? j0 + KB : p.N) - 1,
                  off = p.N - p.Nq - p.keys_after; /* the token of query row 0 */
    const Vis &vis = B.vis;
    for (int64_t e = tid; e < (int64_t)KB * S.lda; e += Cl::THREADS) S.acc[e] = (C)0;
    for (int k = tid; k < KB; k += Cl::THREADS) S.ctot[k] = (C)0;
    load_key_tile<KB, Cl::THREADS>(B, S.ks, 0, j0, NEED_K | NEED_V | NEED_Z | NEED_H, false, tid); /* once a block */
    /* the query tiles whose rows may have a pair in T(i) with these keys */
    const int64_t qstart = vis.causal && vis.ms ? (j0 - off > 0 ? (j0 - off) / QB * QB : 0) : 0;
    auto next = [&](int64_t q) {
        for (q = row_tile_next(vis, off, j0, jh, q, QB); q < p.Nq; q = row_tile_next(vis, off, j0, jh, q + QB, QB)) {
            const int64_t t0 = q + off, tl = (q + QB < p.Nq ? q + QB : p.Nq) - 1 + off;
            if (rect_vis(vis, t0, tl, j0, jh) != VIS_NONE) break;
        }
        return q;
    };
    if (tid == 0) {
        *S.src = row_sources(B, ba, sr);
        *S.fixed = row_walk_fixed(*S.src, S.ro(0), p);
    }
    __syncthreads();
    auto stage = [&](int st, int64_t q) {
        const RowOps<T> ro = S.ro(st);
        if (*S.fixed && q + QB <= p.Nq) load_row_ops<T, Cl>(*S.src, p, ro, q, QB, tid, Cl::THREADS);
        else load_row_ops(*S.src, p, ro, q, QB, tid, Cl::THREADS);
        if (w == 0) { /* the rows' flags, and whether one of them does not take part, by one warp */
            bool none = false;
            for (int k = lane; k < QB; k += 32) {
                const int64_t i = q + k;
                const int32_t f = i < p.Nq ? sr.row[B.bh * p.Nq + i].r.flags : 0;
                S.flags[st * QB + k] = f;
                none |= !(f & ROW_LIVE);
            }
            none = __any_sync(FULL, none);
            if (lane == 0) S.dead[st] = none;
        }
    };
    int64_t q = next(qstart);
    if (q < p.Nq) stage(0, q);
    cp_async_commit();
    const bool aux = ba.grad_aux != nullptr, outside = other_outside(p, a), drop = a.dropout_seed != nullptr;
    const C delta = (C)B.hd.v[H_DELTA], scale = (C)p.scale, dscale = (C)p.dropout_scale;
    const C nis = (C)(-1.0 / (p.tau_sep + EPS_TAU)), nic = (C)(-1.0 / (p.tau_coh + EPS_TAU));
    const C nicx = (C)(-exp_scale<T>() / (p.tau_coh + EPS_TAU)); /* the forward's wc: the exp's scale folded in */
    const KeySlice<T> K = key_slice(S.ks, 0, wn * 16, j0);
    constexpr bool two = Cl::STAGES == 2;
    int s = 0;
    while (q < p.Nq) {
        const int64_t qn = next(q + QB);
        if (two) {
            if (qn < p.Nq) stage(s ^ 1, qn);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const RowOps<T> ro = S.ro(s);
        if (S.dead[s]) { /* rows that do not take part: their operands as zeros (warp w: QB / NW of them from w QB / NW) */
            for (int rr = 0; rr < QB / NWK; rr++) {
                const int row = w * (QB / NWK) + rr;
                if (!(S.flags[s * QB + row] & ROW_LIVE)) zero_row_ops(ro, row, p, lane);
            }
            __syncthreads();
        }
        /* ---- the pair tile (queries 16 wm .., keys 16 wn ..) ---- */
        {
            LaneRows L = lane_rows(p, q, wm * 16, lane);
            BRow<C> b[2];
            const int64_t ri = B.bh * p.Nq + L.i[0]; /* row L.i[1] is ri + 8 */
            for (int r = 0; r < 2; r++) { /* a row that does not take part reads the zero row: loads without a predicate */
                L.act[r] = L.act[r] && (S.flags[s * QB + L.lr[r]] & ROW_LIVE);
                b[r] = (L.act[r] ? &sr.row[ri + 8 * r] : sr.zero)->r;
            }
            const XCoef<C> xc[2] = {b[0].xc, b[1].xc};
            C xo[NT][4]; /* with an outside cap: the part of x past it */
            const unsigned keep =
                drop || outside ? tile_extras<T, NT>(p, a, B.b, B.h, L, lane, K.j0, xc[0].itemp, xc[1].itemp, xo) : 0u;
            const RowVals<C> rv[2] = {b[0].rv, b[1].rv};
            const RowSlice<T> R = row_slice(ro, wm * 16);
            PairVals<C, NT> pv;
            tile_scores<T, NT>(p, a, B.b, B.h, delta, L, R, K, lane, xc, rv, pv);
            C gdA[NT][4], gdc[NT][4];
            score<T, NT>(gdA, R.dY, nullptr, K.V, p.dv, lane);
            if (drop) drop_scale(gdA, keep, dscale);
            if (aux) {
                const C gco[2] = {b[0].gco, b[1].gco}, gse[2] = {b[0].gse, b[1].gse};
                add_aux_dA(gdA, pv, gco, gse);
            }
            score<T, NT>(gdc, R.dC, R.dClo, K.Z, p.dz, lane);
            const int64_t t0 = q + off, tl = (q + QB < p.Nq ? q + QB : p.Nq) - 1 + off;
            const int64_t nq = p.Nq - q < QB ? p.Nq - q : QB;
            TileInfo ti;
            {
                const int64_t nj = jh - j0 + 1;
                ti.vis = rect_vis(vis, t0, tl, j0, jh);
                ti.full = nq == QB && nj == KB && !(vis.causal && jh > t0) &&
                          !(vis.pad && vis.pad[j0 + nj] - vis.pad[j0] > 0) && !vis.am && ti.vis == VIS_ALL;
                ti.badkey = false;
            }
            unsigned J, Ts, own;
            entry_sets<NT>(vis, L, lane, K.j0, ti, J, Ts, own);
            C cs[NT][2], wv[NT][4][7];
            ASC_UNROLL
            for (int n = 0; n < NT; n++) cs[n][0] = cs[n][1] = (C)0;
            /* full tiles without the own token: a copy without the per-entry tests (as B1) */
            every_or_not(J == all_bits<NT>() && Ts == all_bits<NT>() && own == 0u, [&](auto every) {
                constexpr bool all = decltype(every)::value;
                ASC_UNROLL
                for (int n = 0; n < NT; n++)
                    ASC_UNROLL
                    for (int e = 0; e < 4; e++) {
                        const int r = e >> 1, bit = 4 * n + e;
                        const bool inJ = all || ((J >> bit) & 1u), inT = all || ((Ts >> bit) & 1u),
                                   self = !all && ((own >> bit) & 1u);
                        C A = 0, dS = 0, dSx = 0;
                        if (inJ)
                            entry_dS<T>(b[r], pv.x[n][e], outside ? pv.x[n][e] - xo[n][e] : pv.x[n][e], gdA[n][e], A,
                                        dS, dSx);
                        const C wc = ex_scaled<T>(pv.D[n][e] * nicx);
                        const bool dens = inT && !(B.paper && self);
                        const Adj<C> j = entry_adj(b[r], inT, dens, dS, A, pv.r[n][e], pv.phi[n][e], pv.rc[n][e],
                                                   pv.ws[n][e], wc, pv.red[n][e], gdc[n][e], nis, nic);
                        const C w7[7] = {scale * dS, A, j.TA * b[r].rv.usc, (C)-2 * j.drc, j.wcT * b[r].iW,
                                         (C)-2 * j.dD, j.da * b[r].rv.shr};
                        ASC_UNROLL
                        for (int k = 0; k < 7; k++) wv[n][e][k] = w7[k];
                        cs[n][e & 1] += j.drc + j.dD;
                    }
            });
            if (drop) /* dv_j = sum_i A_ij m_ij / (1 - p) dy_i */
                ASC_UNROLL
                for (int n = 0; n < NT; n++)
                    ASC_UNROLL
                    for (int e = 0; e < 4; e++) wv[n][e][1] *= (keep >> (4 * n + e)) & 1u ? dscale : (C)0;
            /* fp16: each weight tile scaled by a power of two that keeps it in range (range_scale) */
            float wsc[7] = {1, 1, 1, 1, 1, 1, 1};
            if constexpr (std::is_same<T, __half>::value) {
                for (int k = 0; k < 7; k++) {
                    float m = 0.0f;
                    for (int n = 0; n < NT; n++)
                        for (int e = 0; e < 4; e++) m = fabsf(wv[n][e][k]) > m ? fabsf(wv[n][e][k]) : m;
                    for (int o = 16; o > 0; o >>= 1) {
                        const float x = __shfl_xor_sync(FULL, m, o);
                        m = x > m ? x : m;
                    }
                    if (lane == 0) S.wmax[w * 7 + k] = m;
                }
                __syncthreads();
                auto scale_of = [&](int k) {
                    float m = 0.0f;
                    for (int x = 0; x < NWK; x++) m = S.wmax[x * 7 + k] > m ? S.wmax[x * 7 + k] : m;
                    return half_range(m);
                };
                ASC_UNROLL
                for (int k = 0; k < 7; k++) wsc[k] = scale_of(k);
                if (tid < 7) S.wsc[tid] = scale_of(tid); /* not wsc[tid]: a run-time index puts wsc in local memory */
            } else {
                if (tid < 7) S.wsc[tid] = 1.0f;
            }
            ASC_UNROLL
            for (int n = 0; n < NT; n++)
                ASC_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int qr = wm * 16 + frag_row(lane, e), kc = wn * 16 + frag_col(lane, n, e);
                    if constexpr (Elem<T>::kMma) {
                        /* entries e, e + 1: columns kc, kc + 1 of one row, one 32-bit store of the pair per tile */
                        if (e & 1) continue;
                        auto put2 = [&](int k, float lo, float hi) {
                            *reinterpret_cast<uint32_t *>(S.wt[k].row(qr) + kc) = pack2<T>(lo, hi);
                        };
                        float v[2][7]; /* ASC_UNROLL: g++ unrolls these as nvcc does (the cost model's line counts) */
                        ASC_UNROLL
                        for (int h = 0; h < 2; h++)
                            ASC_UNROLL
                            for (int k = 0; k < 7; k++) v[h][k] = wv[n][e + h][k] * wsc[k];
                        ASC_UNROLL
                        for (int k = 0; k < 7; k++) put2(k, v[0][k], v[1][k]);
                        put2(7, v[0][3] - rounded<T>(v[0][3]), v[1][3] - rounded<T>(v[1][3]));
                        put2(8, v[0][5] - rounded<T>(v[0][5]), v[1][5] - rounded<T>(v[1][5]));
                    } else {
                        for (int k = 0; k < 7; k++) S.wt[k].row(qr)[kc] = to_elem<Wt>(wv[n][e][k] * (C)wsc[k]);
                    }
                }
            /* column sums over the warp's 16 rows: lanes of equal t hold equal columns */
            ASC_UNROLL
            for (int n = 0; n < NT; n++)
                for (int h = 0; h < 2; h++) {
                    C v = cs[n][h];
                    v += __shfl_xor_sync(FULL, v, 4);
                    v += __shfl_xor_sync(FULL, v, 8);
                    v += __shfl_xor_sync(FULL, v, 16);
                    if ((lane >> 2) == 0) S.csum[wm * KB + wn * 16 + n * 8 + 2 * (lane & 3) + h] = v;
                }
        }
        __syncthreads();
        /* ---- the column products: warp w takes the keys 16 (w % MT) .. and every (NWK / MT)-th 16 features ---- */
        {
            const int mk = w % MT, par = w / MT;
            C *acc = S.acc + (int64_t)(mk * 16) * S.lda;
            const int kc = mk * 16, f0 = 16 * par, fstep = 16 * (NWK / MT);
            if constexpr (Elem<T>::kMma) { /* the weight tiles 0 .. 6 as in w7 above, 7 and 8 the splits of 3 and 5 */
                auto term = [&](int wi, int wlo, Smem2D<T> Y, const T *Ylo) {
                    return ColTerm<T>{S.wt[wi], wlo >= 0 ? S.wt[wlo].p : nullptr, S.wsc[wi], Y, Ylo};
                };
                /* dk, dk^, dv, dh^ one term each; dz's three terms in one pass over its accumulators. fpad of a
                 * shared-memory row: far below 2^31. The four single terms stay a loop: as straight-line calls ptxas
                 * held their tile pointers through the query loop and spilled (docs/cuda.md, "B2c's staging") */
                struct One { int wi; Smem2D<T> Y; const T *Ylo; int64_t off, f; };
                const One one[4] = {{0, ro.Q, nullptr, 0, p.d},
                                    {2, ro.U, ro.Ulo, S.oKh, p.d},
                                    {1, ro.dY, nullptr, S.oV, p.dv},
                                    {6, ro.Hr, nullptr, S.oH, p.da}};
                for (int k = 0; k < 4; k++) {
                    const ColTerm<T> t[1] = {term(one[k].wi, -1, one[k].Y, one[k].Ylo)};
                    col_mma<T, QB>(acc + one[k].off, S.lda, t, kc, f0, fstep, (int)fpad_of<T>(one[k].f), lane);
                }
                const ColTerm<T> dz[3] = {term(3, 7, ro.Cr, ro.Clo), term(4, -1, ro.dC, ro.dClo),
                                          term(5, 8, ro.Zr, nullptr)};
                col_mma<T, QB>(acc + S.oZ, S.lda, dz, kc, f0, fstep, (int)fpad_of<T>(p.dz), lane);
            } else {
                struct Prod { int wi; Smem2D<T> Y; int64_t off, f; };
                const Prod prods[7] = {{0, ro.Q, 0, p.d},      {2, ro.U, S.oKh, p.d},  {1, ro.dY, S.oV, p.dv},
                                       {3, ro.Cr, S.oZ, p.dz}, {4, ro.dC, S.oZ, p.dz}, {5, ro.Zr, S.oZ, p.dz},
                                       {6, ro.Hr, S.oH, p.da}};
                for (int k = 0; k < 7; k++)
                    col_ffma<T, C>(acc + prods[k].off, S.lda, S.wt[prods[k].wi], kc, QB, prods[k].Y, f0, fstep,
                                   fpad_of<T>(prods[k].f), lane);
            }
            if (tid < KB)
                for (int k = 0; k < Cl::WR; k++) S.ctot[tid] += S.csum[k * KB + tid];
        }
        __syncthreads();
        if (!two && qn < p.Nq) {
            stage(0, qn);
            cp_async_commit();
        }
        q = qn;
        s = two ? s ^ 1 : 0;
    }
    cp_async_wait<0>();
    __syncthreads();

    /* ---- per key: the heading terms, the own rows' dz and dh^, the normalizations, the stores ---- */
    for (int kk = w; kk < KB; kk += NWK) {
        const int64_t j = j0 + kk;
        if (j >= p.N) break;
        const int64_t tok = B.bh * p.N + j, i = j - off, orow = B.bh * p.Nq + i;
        C *ar = S.acc + (int64_t)kk * S.lda;
        const bool own = i >= 0 && i < p.Nq;
        const int flags = own ? sr.row[orow].r.flags : 0;
        const T *kj = (const T *)a.k + tok * p.d;
        if (!B.paper) {
            if (flags & ROW_UP)
                for (int64_t f = lane; f < p.d; f += 32) ar[S.oKh + f] += sr.head[orow * p.d + f];
        } else if (sr.ncnt) {
            const int32_t *cnt = sr.ncnt + B.bh * (p.N + 1);
            const C rkj = B.rkb[j];
            for (int32_t e = cnt[j]; e < cnt[j + 1]; e++) {
                const int64_t ri = B.bh * p.Nq + sr.nlist[B.bh * p.Nq * p.n_nbr + e];
                if (!(sr.row[ri].r.flags & ROW_UP)) continue;
                const C c2 = sr.hc[ri * 2], mb = sr.hc[ri * 2 + 1];
                /* u in the compute type where the forward kept it (rows32: bf16 / fp16), as B2r's rule read it */
                const T *ui = (const T *)a.u + ri * p.d;
                const float *u32 = rows32_at(p, a.rows32, ri, ASC_ROWS32_U(&p));
                for (int64_t f = lane; f < p.d; f += 32) {
                    const C kh = (C)up(kj[f]) * rkj, uf = u32 ? (C)u32[f] : (C)up(ui[f]);
                    ar[S.oKh + f] += sr.head[ri * p.d + f] + c2 * (kh - uf * mb);
                }
            }
        }
        if (flags & ROW_LIVE)
            for (int64_t f = lane; f < p.da; f += 32) ar[S.oH + f] += sr.dhr[orow * p.da + f];
        __syncwarp();
        normalize_backward_store((T *)ba.dk + tok * p.d, ar, kj, ar + S.oKh, p.d, lane);
        normalize_backward_store((T *)ba.dh + tok * p.da, (const C *)nullptr, (const T *)a.h + tok * p.da, ar + S.oH,
                                 p.da, lane);
        for (int64_t f = lane; f < p.dv; f += 32) put((T *)ba.dv + tok * p.dv + f, ar[S.oV + f]);
        const T *zj = S.ks.Z(0).row(kk);
        for (int64_t f = lane; f < p.dz; f += 32) {
            C v = ar[S.oZ + f];
            if (S.ctot[kk] != (C)0) v += (C)2 * S.ctot[kk] * (C)up(zj[f]); /* skipped, not times 0: z_j may be NaN */
            if (flags & ROW_LIVE) v += sr.dzr[orow * p.dz + f];
            put((T *)ba.dz + tok * p.dz + f, v);
        }
        __syncwarp();
    }
}

/* ---------------------------------------------------------------- the paper variant's inverted neighbour lists */

/* The forward's neighbour lists (row -> its listed keys) as per-key lists of rows for B2c; the same in every
 * dtype's translation unit (static: a copy in each, a few instructions). */

/* count[bh][l + 1] += 1 per (row, listed neighbour l) */
static __global__ void __launch_bounds__(256) nbr_count_kernel(const asc_params p, const int64_t *nbr, int32_t *cnt) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per = p.Nq * p.n_nbr;
    if (e >= p.B * p.H * per) return;
    const int64_t bh = e / per, l = listed_key(p, nbr, e);
    if (l >= 0) atomicAdd(cnt + bh * (p.N + 1) + l + 1, 1);
}

/* the counts' prefix sums per (b, h): cnt[bh][l] = the start of key l's rows */
static __global__ void __launch_bounds__(256) nbr_scan_kernel(const asc_params p, int32_t *cnt, int32_t *cursor) {
    int32_t *c = cnt + (int64_t)blockIdx.x * (p.N + 1);
    auto sum = [](int32_t x, int32_t y) { return x + y; };
    block_scan<int32_t>(p.N + 1, 0, [&](int64_t j) { return c[j]; }, sum, c);
    for (int64_t j = threadIdx.x; j <= p.N; j += blockDim.x) cursor[(int64_t)blockIdx.x * (p.N + 1) + j] = c[j];
}

/* fill[bh][start(l) ..] = the rows that list l, in the atomics' order (any) */
static __global__ void __launch_bounds__(256) nbr_fill_kernel(const asc_params p, const int64_t *nbr, int32_t *cursor,
                                                       int32_t *fill) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per = p.Nq * p.n_nbr;
    if (e >= p.B * p.H * per) return;
    const int64_t bh = e / per, l = listed_key(p, nbr, e);
    if (l < 0) return;
    const int32_t at = atomicAdd(cursor + bh * (p.N + 1) + l, 1);
    fill[bh * per + at] = (int32_t)((e - bh * per) / p.n_nbr);
}

/* list[bh][start(l) ..] = key l's rows in row order, so that the gather sums in a fixed order: each (row, listed key)
 * goes to its rank among the key's rows, the row's own earlier slots that list the same key breaking a tie (the
 * forward lists a key once per row; a hand-made nbr may not, and every slot is still written once). A thread per
 * entry reads its key's rows: sum over keys of (rows per key)^2 reads in parallel, whatever order the fill left (an
 * insertion sort per key, before 2026-11-27, took that many dependent steps in one thread for a key that most rows
 * list, and its work depended on the atomics' order). */
static __global__ void __launch_bounds__(256) nbr_rank_kernel(const asc_params p, const int64_t *nbr, const int32_t *cnt,
                                                       const int32_t *fill, int32_t *list) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, per = p.Nq * p.n_nbr;
    if (e >= p.B * p.H * per) return;
    const int64_t bh = e / per, l = listed_key(p, nbr, e);
    if (l < 0) return;
    const int32_t row = (int32_t)((e - bh * per) / p.n_nbr);
    const int32_t lo = cnt[bh * (p.N + 1) + l], hi = cnt[bh * (p.N + 1) + l + 1];
    const int32_t *x = fill + bh * per;
    int32_t rank = 0;
    for (int32_t a = lo; a < hi; a++) rank += x[a] < row;
    for (int64_t s = e - (e - bh * per) % p.n_nbr; s < e; s++) rank += nbr[s] == l;
    list[bh * per + lo + rank] = row;
}

/* ---------------------------------------------------------------- the per-head gradients */

/* The nine scalars' gradients into out [9][H] and, when not NULL, the sinks' into dsinks (ASC_SINK_COUNT of
 * them, in the sinks' layout), from nslot block partials per (b, h) (a slot no block wrote holds zeros): sink m
 * sums, in row order, the block partials (dsr NULL: the rows of a block share it) or the rows' own gradients dsr
 * of the (b, h, i) that read it. */
template <typename T>
__global__ void __launch_bounds__(256) dsc_kernel(const asc_params p, const double *dsc, const double *dsr,
                                                  int64_t nslot, T *out, T *dsinks) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= ASC_NSCALAR * p.H + (dsinks ? ASC_SINK_COUNT(&p) : 0)) return;
    double v = 0.0;
    if (e < ASC_NSCALAR * p.H) {
        const int64_t s = e / p.H, h = e - s * p.H;
        for (int64_t b = 0; b < p.B; b++)
            for (int64_t k = 0; k < nslot; k++) v += dsc[((b * p.H + h) * nslot + k) * BWD_NACC + s];
        put(out + e, (typename Elem<T>::C)v);
        return;
    }
    const int64_t m = e - ASC_NSCALAR * p.H, nh = p.sk_sh ? p.H : 1, ni = p.sk_si ? p.Nq : 1;
    const int64_t bm = m / (nh * ni), hm = m / ni % nh, im = m % ni;
    for (int64_t b = p.sk_sb ? bm : 0; b < (p.sk_sb ? bm + 1 : p.B); b++)
        for (int64_t h = p.sk_sh ? hm : 0; h < (p.sk_sh ? hm + 1 : p.H); h++) {
            if (dsr) v += dsr[(b * p.H + h) * p.Nq + im];
            else
                for (int64_t k = 0; k < nslot; k++) v += dsc[((b * p.H + h) * nslot + k) * BWD_NACC + ACC_SINK];
        }
    put(dsinks + m, (typename Elem<T>::C)v);
}

/* ---------------------------------------------------------------- the launcher */

/* Scratch of one backward call (one stream-ordered allocation): the key preparation, the forward's outputs
 * when the caller did not pass them, the per-row constants and row-side terms. */
template <typename T> struct BwdScratch {
    using C = typename Elem<T>::C;
    KeyPrep<T> kp;
    BwdRows<T> sr;
    asc_fwd_args fwd;  /* the saved outputs: the caller's, or computed into scratch */
    bool run_fwd;
    int32_t *nfill;    /* paper: the inverted lists as nbr_fill_kernel leaves them, before nbr_rank_kernel orders them */
    bool b1w, b2rw;    /* B1 and B2r in their shapes for wide heads (Tiles<T>::B1W, B2rW): b1_wide, b2r_wide, before
                        * place */
    int64_t nb1, nb2r; /* the row-major grids' blocks per (b, h): B1's, B2r's */
    B2rSplit<C> b2s;   /* B2r's long row tiles over key chunks (b2s.rows = 0: none) */
    size_t bytes;
    void place(const asc_params &p, const asc_bwd_args &ba, char *base) {
        const size_t rows = (size_t)(p.B * p.H * p.Nq);
        kp.place(p, ba.in, base, Tiles<T>::Row::BN);
        size_t o = kp.bytes;
        auto take = [&](size_t n) -> char * {
            const size_t at = o;
            o += (n + 255) / 256 * 256;
            return base ? base + at : nullptr;
        };
        const asc_fwd_args &in = ba.in;
        const bool mma = Elem<T>::kMma, paper = p.variant == ASC_VARIANT_PAPER;
        /* bf16 / fp16 read the compute-type stats, c and u (rows32): without them the forward runs again */
        run_fwd = !(in.out && in.stats && in.u && in.c && (in.nbr || p.n_nbr == 0) && (in.aux || !ba.grad_aux) &&
                    (in.rows32 || !mma));
        fwd = in;
        if (run_fwd) {
            fwd.out = take(sizeof(T) * rows * (size_t)p.dv);
            fwd.stats = take(sizeof(T) * rows * ASC_NSTAT);
            fwd.u = take(sizeof(T) * rows * (size_t)p.d);
            fwd.c = take(sizeof(T) * rows * (size_t)p.dz);
            fwd.nbr = (int64_t *)take(8 * rows * (size_t)(p.n_nbr ? p.n_nbr : 1));
            fwd.aux = take(sizeof(T) * rows * 2);
            fwd.rows32 = mma ? (float *)take(sizeof(float) * rows * (size_t)ASC_ROWS32_WIDTH(&p)) : nullptr;
            fwd.map_sbase = fwd.map_align = fwd.map_sep = fwd.map_coh = fwd.map_attn = nullptr;
        }
        const int64_t bm1 = b1w ? Tiles<T>::B1W::BM : Tiles<T>::B1::BM;
        const int64_t bm2 = b2rw ? Tiles<T>::B2rW::BM : Tiles<T>::B2r::BM;
        nb1 = (p.Nq + bm1 - 1) / bm1;
        nb2r = (p.Nq + bm2 - 1) / bm2;
        sr.nslot = nb1 > nb2r ? nb1 : nb2r;
        sr.row = (BRowG<C> *)take(sizeof(BRowG<C>) * (rows + 1));
        sr.zero = sr.row ? sr.row + rows : nullptr;
        sr.cop = (T *)take(sizeof(T) * rows * (size_t)p.dz);
        sr.copl = mma ? (T *)take(sizeof(T) * rows * (size_t)p.dz) : nullptr;
        sr.uop = paper ? (T *)take(sizeof(T) * rows * (size_t)p.d) : nullptr;
        sr.uopl = mma && paper ? (T *)take(sizeof(T) * rows * (size_t)p.d) : nullptr;
        sr.dchi = (T *)take(sizeof(T) * rows * (size_t)p.dz);
        sr.dclo = Elem<T>::kMma ? (T *)take(sizeof(T) * rows * (size_t)p.dz) : nullptr;
        sr.head = (C *)take(sizeof(C) * rows * (size_t)p.d);
        sr.hc = (C *)take(sizeof(C) * rows * 2);
        sr.dzr = (C *)take(sizeof(C) * rows * (size_t)p.dz);
        sr.dhr = (C *)take(sizeof(C) * rows * (size_t)p.da);
        sr.dsc = (double *)take(sizeof(double) * (size_t)(p.B * p.H * sr.nslot) * BWD_NACC);
        sr.dsr = ba.in.sinks && p.sk_si ? (double *)take(sizeof(double) * rows) : nullptr;
        const bool lists = p.variant == ASC_VARIANT_PAPER && p.n_nbr > 0;
        sr.ncnt = lists ? (int32_t *)take(sizeof(int32_t) * (size_t)(p.B * p.H) * (size_t)(p.N + 1) * 2) : nullptr;
        sr.nlist = lists ? (int32_t *)take(sizeof(int32_t) * rows * (size_t)p.n_nbr) : nullptr;
        nfill = lists ? (int32_t *)take(sizeof(int32_t) * rows * (size_t)p.n_nbr) : nullptr;
        static_assert(Tiles<T>::B2r::BN == Tiles<T>::B2rW::BN, "B2r's shapes share their key tiles");
        int64_t chunk = 0;
        const int64_t nlong = long_row_tiles(p, bm2, Tiles<T>::B2r::BN, &chunk);
        b2s = B2rSplit<C>{B2R_WHOLE, nlong * bm2, chunk, nlong ? (p.N + chunk - 1) / chunk : 0,
                          2 * fpad_of<T>(p.d) + fpad_of<T>(p.dz) + fpad_of<T>(p.da), nullptr, nullptr};
        if (nlong) {
            const size_t parts = (size_t)(p.B * p.H * b2s.rows * b2s.nch);
            b2s.acc = (C *)take(sizeof(C) * parts * (size_t)b2s.w);
            b2s.sums = (double *)take(sizeof(double) * parts * 2);
        }
        bytes = o;
    }
};

/* B1's, B2r's and B2c's shared memory per block in their standard shapes and in their shapes for wide heads. */
template <typename T> void b1_shape_bytes(const asc_params &p, long *standard, long *wide) {
    shape_bytes<BwdRowSmem, T, typename Tiles<T>::B1, typename Tiles<T>::B1W>(p, standard, wide, true);
}
template <typename T> void b2r_shape_bytes(const asc_params &p, long *standard, long *wide) {
    shape_bytes<BwdRowSmem, T, typename Tiles<T>::B2r, typename Tiles<T>::B2rW>(p, standard, wide, false);
}
template <typename T> void b2c_shape_bytes(const asc_params &p, long *standard, long *wide) {
    shape_bytes<B2cSmem, T, typename Tiles<T>::Col, typename Tiles<T>::ColW>(p, standard, wide);
}

/* Whether B1, B2r and B2c run their shapes for wide heads (Tiles<T>::B1W: three warps, B2rW: two, ColW: 16 keys over
 * three warps) on the current device: runs_wide (d = dv = 128 on an H100, seed: one standard B1 or B2r block per SM,
 * two wide ones; d = dv = 256: B2c's standard block does not fit, its narrow one does). */
template <typename T> bool b1_wide(const asc_params &p) {
    long standard, wide;
    b1_shape_bytes<T>(p, &standard, &wide);
    return runs_wide<typename Tiles<T>::B1, typename Tiles<T>::B1W>(standard, wide);
}
template <typename T> bool b2r_wide(const asc_params &p) {
    long standard, wide;
    b2r_shape_bytes<T>(p, &standard, &wide);
    return runs_wide<typename Tiles<T>::B2r, typename Tiles<T>::B2rW>(standard, wide);
}
template <typename T> bool b2c_wide(const asc_params &p) {
    long standard, wide;
    b2c_shape_bytes<T>(p, &standard, &wide);
    return runs_wide<typename Tiles<T>::Col, typename Tiles<T>::ColW>(standard, wide);
}

/* B1's launch in the shape Tr (Tiles<T>::B1 or B1W), nb1 blocks per (b, h). */
template <typename T, class Tr>
cudaError_t launch_b1(const asc_params &p, const asc_bwd_args &ba, const BwdScratch<T> &sc, bool opt,
                      cudaStream_t stream) {
    BwdRowSmem<T, Tr> s1;
    s1.place(nullptr, p, true);
    void (*const b1)(asc_params, asc_bwd_args, KeyPrep<T>, BwdRows<T>) =
        opt ? b1_kernel<T, Tr, true> : b1_kernel<T, Tr, false>;
    dim3 g1;
    cudaError_t e = prepare_smem(b1, (long)s1.bytes);
    if (e == cudaSuccess && !tile_grid(sc.nb1, p.B * p.H, &g1)) e = cudaErrorInvalidConfiguration;
    return e != cudaSuccess ? e : launch(b1, g1, dim3(Tr::THREADS), (size_t)s1.bytes, stream, p, ba, sc.kp, sc.sr);
}

/* B2r's launches in the shape Tr (Tiles<T>::B2r or B2rW): a windowed call's long row tiles over key chunks and their
 * merge (sc.b2s), then the other row tiles of every (b, h). */
template <typename T, class Tr>
cudaError_t launch_b2r(const asc_params &p, const asc_bwd_args &ba, const BwdScratch<T> &sc, bool opt,
                       cudaStream_t stream) {
    BwdRowSmem<T, Tr> s2;
    s2.place(nullptr, p, false);
    void (*const b2r)(asc_params, asc_bwd_args, KeyPrep<T>, BwdRows<T>, B2rSplit<typename Elem<T>::C>) =
        opt ? b2r_kernel<T, Tr, true> : b2r_kernel<T, Tr, false>;
    cudaError_t e = prepare_smem(b2r, (long)s2.bytes);
    if (e != cudaSuccess) return e;
    const int64_t BH = p.B * p.H, nlong = sc.b2s.rows / Tr::BM;
    dim3 g2;
    if (sc.nb2r > nlong && !tile_grid(sc.nb2r - nlong, BH, &g2)) return cudaErrorInvalidConfiguration;
    B2rSplit<typename Elem<T>::C> sp = sc.b2s;
    if (nlong) {
        sp.mode = B2R_CHUNK;
        if ((e = launch(b2r, dim3((unsigned)sp.nch, (unsigned)(nlong * BH)), dim3(Tr::THREADS), (size_t)s2.bytes,
                        stream, p, ba, sc.kp, sc.sr, sp)) != cudaSuccess)
            return e;
        sp.mode = B2R_MERGE;
        if ((e = launch(b2r, dim3(1u, (unsigned)(nlong * BH)), dim3(Tr::THREADS), (size_t)s2.bytes, stream, p, ba,
                        sc.kp, sc.sr, sp)) != cudaSuccess)
            return e;
    }
    sp.mode = B2R_WHOLE;
    return sc.nb2r > nlong ? launch(b2r, g2, dim3(Tr::THREADS), (size_t)s2.bytes, stream, p, ba, sc.kp, sc.sr, sp)
                           : cudaSuccess;
}

/* B2c's launch in the shape Cl (Tiles<T>::Col or ColW): a block per Cl::KB keys of every (b, h). */
template <typename T, class Cl>
cudaError_t launch_b2c(const asc_params &p, const asc_bwd_args &ba, const BwdScratch<T> &sc, cudaStream_t stream) {
    B2cSmem<T, Cl> s3;
    s3.place(nullptr, p);
    dim3 g3;
    cudaError_t e = prepare_smem(b2c_kernel<T, Cl>, (long)s3.bytes);
    if (e == cudaSuccess && !tile_grid((p.N + Cl::KB - 1) / Cl::KB, p.B * p.H, &g3)) e = cudaErrorInvalidConfiguration;
    return e != cudaSuccess ? e
                            : launch(b2c_kernel<T, Cl>, g3, dim3(Cl::THREADS), (size_t)s3.bytes, stream, p, ba, sc.kp,
                                     sc.sr);
}

template <typename T>
static cudaError_t backward_launches(const asc_params &p, const asc_bwd_args &ba_in, BwdScratch<T> &sc, int dtype,
                                     cudaStream_t stream) {
    cudaError_t e;
    const int64_t BH = p.B * p.H;
    asc_bwd_args ba = ba_in;
    ba.in = sc.fwd;
    if (sc.run_fwd && (e = (cudaError_t)asc_tiled_fwd(&p, &sc.fwd, dtype, stream)) != cudaSuccess) return e;
    if ((e = prepare_keys(p, ba.in, sc.kp, stream)) != cudaSuccess) return e;
    if ((e = cudaMemsetAsync(sc.sr.dsc, 0, sizeof(double) * (size_t)(BH * sc.sr.nslot) * BWD_NACC, stream)) !=
        cudaSuccess)
        return e;
    if ((e = cudaMemsetAsync((void *)sc.sr.zero, 0, sizeof(*sc.sr.zero), stream)) != cudaSuccess) return e;
    if (sc.sr.dsr && (e = cudaMemsetAsync(sc.sr.dsr, 0, sizeof(double) * (size_t)(BH * p.Nq), stream)) != cudaSuccess)
        return e;
    const bool opt = has_opt(p, ba);
    e = sc.b1w ? launch_b1<T, typename Tiles<T>::B1W>(p, ba, sc, opt, stream)
               : launch_b1<T, typename Tiles<T>::B1>(p, ba, sc, opt, stream);
    if (e != cudaSuccess) return e;
    e = sc.b2rw ? launch_b2r<T, typename Tiles<T>::B2rW>(p, ba, sc, opt, stream)
                : launch_b2r<T, typename Tiles<T>::B2r>(p, ba, sc, opt, stream);
    if (e != cudaSuccess) return e;
    if (sc.sr.ncnt) {
        int32_t *cursor = sc.sr.ncnt + BH * (p.N + 1);
        if ((e = cudaMemsetAsync(sc.sr.ncnt, 0, sizeof(int32_t) * (size_t)(BH * (p.N + 1)), stream)) != cudaSuccess)
            return e;
        const int64_t ent = BH * p.Nq * p.n_nbr, eb = (ent + 255) / 256;
        if ((e = launch(nbr_count_kernel, dim3((unsigned)eb), dim3(256), 0, stream, p, ba.in.nbr, sc.sr.ncnt)) !=
            cudaSuccess)
            return e;
        if ((e = launch(nbr_scan_kernel, dim3((unsigned)BH), dim3(256), 0, stream, p, sc.sr.ncnt, cursor)) !=
            cudaSuccess)
            return e;
        if ((e = launch(nbr_fill_kernel, dim3((unsigned)eb), dim3(256), 0, stream, p, ba.in.nbr, cursor, sc.nfill)) !=
            cudaSuccess)
            return e;
        if ((e = launch(nbr_rank_kernel, dim3((unsigned)eb), dim3(256), 0, stream, p, ba.in.nbr, sc.sr.ncnt, sc.nfill,
                        sc.sr.nlist)) != cudaSuccess)
            return e;
    }
    e = b2c_wide<T>(p) ? launch_b2c<T, typename Tiles<T>::ColW>(p, ba, sc, stream)
                       : launch_b2c<T, typename Tiles<T>::Col>(p, ba, sc, stream);
    if (e != cudaSuccess) return e;
    const int64_t nsc = ASC_NSCALAR * p.H + (ba.in.sinks ? ASC_SINK_COUNT(&p) : 0);
    return launch(dsc_kernel<T>, dim3((unsigned)((nsc + 255) / 256)), dim3(256), 0, stream, p,
                  (const double *)sc.sr.dsc, (const double *)sc.sr.dsr, sc.sr.nslot, (T *)ba.dscalars,
                  ba.in.sinks ? (T *)ba.dsinks : nullptr);
}

template <typename T>
cudaError_t backward(const asc_params &p, const asc_bwd_args &ba, int dtype, cudaStream_t stream) {
    cudaError_t e;
    const size_t BHN = (size_t)(p.B * p.H * p.N);
    if (p.H > 0 && (e = cudaMemsetAsync(ba.dscalars, 0, sizeof(T) * ASC_NSCALAR * (size_t)p.H, stream)) != cudaSuccess)
        return e;
    if (p.H > 0 && ba.in.sinks && ba.dsinks &&
        (e = cudaMemsetAsync(ba.dsinks, 0, sizeof(T) * (size_t)ASC_SINK_COUNT(&p), stream)) != cudaSuccess)
        return e;
    if (p.B * p.H == 0 || p.N == 0) return cudaSuccess;
    if (p.Nq == 0) { /* no query rows: every gradient is zero */
        void *outs[4] = {ba.dk, ba.dv, ba.dz, ba.dh};
        const int64_t fs[4] = {p.d, p.dv, p.dz, p.da};
        for (int k = 0; k < 4; k++)
            if ((e = cudaMemsetAsync(outs[k], 0, sizeof(T) * BHN * (size_t)fs[k], stream)) != cudaSuccess) return e;
        return cudaSuccess;
    }
    if (p.B * p.H > MAX_GRID_Y) return cudaErrorInvalidConfiguration;
    BwdScratch<T> sc;
    sc.b1w = b1_wide<T>(p);
    sc.b2rw = b2r_wide<T>(p);
    sc.place(p, ba, nullptr);
    char *base = nullptr;
    if ((e = scratch_alloc(&base, sc.bytes, stream)) != cudaSuccess) return e;
    sc.place(p, ba, base);
    e = backward_launches<T>(p, ba, sc, dtype, stream);
    const cudaError_t f = scratch_free(base, stream);
    return e != cudaSuccess ? e : f;
}

/* Whether every kernel of the backward gets its shared memory on the current device, B1, B2r and B2c in some shape
 * (shape_fits), the forward's as fwd_smem_fits (bf16 / fp16 paper at d = dv = 64, dz = da = 32: 115 KB at most, in B1
 * and the forward; an A100 has 163 KB per block, an H100 or H200 227 KB; at d = dv = 256, dz = da = 32 B2c's standard
 * 237 KB fit neither, its narrow 194 KB an H100); where not, the row-per-warp backward takes the call. */
template <typename T> bool bwd_smem_fits(const asc_params &p) {
    long s1, w1, s2, w2, s3, w3;
    b1_shape_bytes<T>(p, &s1, &w1);
    b2r_shape_bytes<T>(p, &s2, &w2);
    b2c_shape_bytes<T>(p, &s3, &w3);
    return fwd_smem_fits<T>(p) && shape_fits<typename Tiles<T>::B1, typename Tiles<T>::B1W>(s1, w1) &&
           shape_fits<typename Tiles<T>::B2r, typename Tiles<T>::B2rW>(s2, w2) &&
           shape_fits<typename Tiles<T>::Col, typename Tiles<T>::ColW>(s3, w3);
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_BWD_TILED_CUH */
