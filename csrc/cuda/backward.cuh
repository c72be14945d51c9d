/*
 * backward.cuh -- the tensor-core backward of the ASCender op (docs/backward.md for the math, docs/tiling.md
 * section 4 for the two CPU sweeps, docs/cuda.md "The tensor-core kernels" for this layout). Every per-row
 * coefficient comes from the forward's saved outputs (stats, u, c, nbr, y, aux) with the forward's own
 * function; nothing of the forward is recomputed but the pair terms.
 *   B1  (row-major)  x, A, dA, dS on each tile; dq; the row sums that fix the bias rows' gradients and the
 *                    centroid's (dc); every per-row constant of B2, into scratch
 *   B2r (row-major)  the per-pair adjoints; the row side: du (the heading), dz_i, dh^_i
 *   B2c (key-major)  the same adjoints per (query tile, key block); the column side dk, dk^, dv, dz_j, dh^_j,
 *                    then per key the heading terms, the normalizations' backward and the stores
 * Deterministic: every sum has a fixed order, nothing is added with an atomic but integer counts.
 */
#ifndef ASCENDER_CUDA_BACKWARD_CUH
#define ASCENDER_CUDA_BACKWARD_CUH

#include "sweeps.cuh"

namespace asc {
namespace tiled {

enum { ROW_LIVE = 1, ROW_UP = 2 }; /* the row takes part in the pairs; an upstream gradient reaches it */

/* The per-block partial sums of the per-head gradients: the nine scalars in SPEC order, then the sink's. */
enum { ACC_SINK = ASC_NSCALAR, BWD_NACC };

/* A row's constants of the backward (B1 writes them, B2r and B2c read them): the CPU backward's coef, rv
 * and pqr (docs/tiling.md section 4). B^X_j = pq[3X] dS_j + pq[3X+1] + pq[3X+2] (w^X_j - wm[X]) on T(i): centred on
 * the row's mean in w units, as are B1's sums of w, so no term carries the mean (pq[3X+2] w^X alone can exceed the
 * row's B^X by 10^4 where its w spread little: the cancellation cost float32 dz 1 %). The pair adjoints need each B^X
 * only times a row factor (cA, cphi, crc), so B1 stores the products: kq[3X + k] = factor_X pq[3X + k], in double
 * before the rounding, one multiply an entry fewer for each. */
template <typename C> struct BRow {
    XCoef<C> xc;
    RowVals<C> rv;
    C wm[3];    /* the forward's mean of each bias row over T(i) in w units: mean / theta (0 where theta is 0) */
    C lse;      /* log-sum-exp of the row as B1 and B2 form A: the stored one */
    C P, gco, gse;
    C kq[9];    /* lambda_a gamma_a pq[0..2], -lambda_s eta pq[3..5], crc pq[6..8] */
    C drho, dcc, iW, G, dG, Ra; /* drc's weight of wc: dG iW (no field: B1's shared memory) */
    int flags;
};

/* A row's constants in device memory, 16-byte aligned: B2c reads its lanes' two rows from there every query step,
 * as 16-byte vectors. B1 and B2r keep the unpadded BRow in shared memory, where the padding would cost them 12 bytes
 * a row. */
template <typename C> struct alignas(16) BRowG {
    BRow<C> r;
};

/* Per-row scratch of a call's backward (device memory, [BH * Nq] rows). */
template <typename T> struct BwdRows {
    using C = typename Elem<T>::C;
    BRowG<C> *row;
    const BRowG<C> *zero; /* one row of zeros (after the last): what B2c's lanes read for a row that does not take part */
    T *cop, *copl;   /* [rows][dz]: c~ as the products use it (and its rounding error on the mma path) */
    T *uop, *uopl;   /* [rows][d]: the paper variant's heading u, likewise (the seed variant's is k_t) */
    T *dchi, *dclo;  /* [rows][dz]: dc (and its rounding error on the mma path) */
    C *head;         /* [rows][d]: du + grad_u (seed: to dk^_t) or dm (paper: to the neighbours' dk^_l) */
    C *hc;           /* [rows][2]: paper: 2 dV / |N|, ||m|| / |N| (0 where the heading is 0: EPS_HEADING) */
    C *dzr, *dhr;    /* [rows][dz], [rows][da]: the row's own dz_t and dh^_t terms */
    double *dsc;     /* [BH][nslot][BWD_NACC]: the per-head gradients per block of B1 (delta: per block of B2r) */
    int64_t nslot;   /* blocks per (b, h) in dsc: the larger of B1's and B2r's grids (B2r's blocks are smaller) */
    double *dsr;     /* [rows]: per-query sinks' (sk_si != 0) gradient per row, else NULL (docs/backward.md) */
    int32_t *ncnt, *nlist; /* paper: the inverted neighbour lists, [BH][N + 1] starts and [BH][Nq n_nbr] rows */
};

/* ---------------------------------------------------------------- the row-major kernels' shared memory */

template <typename T, class Tr> struct BwdRowSmem {
    using C = typename Elem<T>::C;
    KeyStages<T> ks;
    RowOps<T> ro;
    C *acc;          /* [BM][lda]: B1: Ra | R2 | R3 (for dc); B2r: du | dzr | dhr | dq */
    int lda;
    int64_t o1, o2, o3; /* column offsets of the 2nd, 3rd (and B2r's 4th) accumulator */
    double *dsc;     /* [NW][BWD_NACC] (after the sweep): the key stages' first bytes, idle then */
    C *rx;           /* [BM][3] (B1, after the sweep): in the key stages after dsc */
    BRow<C> *br;     /* [BM] */
    int64_t bytes;

    /* dsc and rx fit in a key stage of the smallest features (four tiles of BN rows, the per-key arrays); in
     * shared memory of their own they would cost the paper variant's bf16 B1 its second block per SM */
    static_assert(4 * Tr::BN * ld_of<T>(0) * sizeof(T) + 3 * Tr::BN * sizeof(C) >=
                      Tr::NW * BWD_NACC * sizeof(double) + 3 * Tr::BM * sizeof(C),
                  "B1's dsc and rx must fit in the key stages");

    /* B1 and B2r place only what they read (docs/cuda.md, "Two blocks per SM for the backward"). */
    __host__ __device__ void place(unsigned char *base, const asc_params &p, bool b1) {
        Carve cv(base);
        ks.place(cv, p, Tr::BN, Tr::STAGES);
        dsc = reinterpret_cast<double *>(base);
        rx = reinterpret_cast<C *>(dsc + Tr::NW * BWD_NACC); /* (a branch on b1 here cost B2r 232 / 604 bytes of
                                                                spills: ptxas) */
        ro.place(cv, p, Tr::BM, Elem<T>::kMma && p.variant == ASC_VARIANT_PAPER, Elem<T>::kMma, true, !b1);
        const int64_t d = fpad_of<T>(p.d), dz = fpad_of<T>(p.dz), da = fpad_of<T>(p.da);
        o1 = b1 ? dz : d;
        o2 = b1 ? 2 * dz : d + dz;
        o3 = d + dz + da; /* (B2r's) */
        const int64_t w = b1 ? 3 * dz : 2 * d + dz + da;
        lda = (int)acc_stride<T>(w);
        acc = cv.array<C>((int64_t)Tr::BM * lda);
        br = cv.array<BRow<C>>(Tr::BM);
        bytes = cv.off;
    }
};

/* The lanes' rows with `act` = the row takes part in the pairs. */
template <typename C>
__device__ __forceinline__ LaneRows live_rows(LaneRows L, const BRow<C> *br) {
    for (int r = 0; r < 2; r++) L.act[r] = L.act[r] && (br[L.lr[r]].flags & ROW_LIVE);
    return L;
}

/* Zeros row `row` of every operand tile (lane per feature); DC: the block has the dc tiles (B1 has none). */
template <typename T, bool DC = true>
__device__ void zero_row_ops(const RowOps<T> &ro, int row, const asc_params &p, int lane) {
    const Smem2D<T> tiles[7] = {ro.Q, ro.U, ro.Cr, ro.Zr, ro.Hr, ro.dY, ro.dC};
    const int64_t fs[7] = {p.d, p.d, p.dz, p.dz, p.da, p.dv, p.dz};
    const T zero = to_elem<T>(0.0f);
    for (int k = 0; k < (DC ? 7 : 6); k++)
        for (int64_t f = lane; f < fpad_of<T>(fs[k]); f += 32) tiles[k].row(row)[f] = zero;
    T *const lo[3] = {ro.Ulo, ro.Clo, ro.dClo};
    const int lds[3] = {ro.U.ld, ro.Cr.ld, ro.dC.ld};
    const int64_t fl[3] = {p.d, p.dz, p.dz};
    for (int k = 0; k < 3; k++)
        if (lo[k])
            for (int64_t f = lane; f < fpad_of<T>(fl[k]); f += 32) lo[k][(int64_t)row * lds[k] + f] = zero;
}

/* Zeros the operand rows of the block's rows that do not take part (a row that does not exist, or has no
 * upstream gradient, may hold non-finite values: selected away, never multiplied). Per warp, its rows. */
template <typename T, typename C>
__device__ void zero_dead_rows(const RowOps<T> &ro, const BRow<C> *br, int first, int64_t i0, int64_t Nq,
                               const asc_params &p, int lane) {
    for (int rr = 0; rr < 16; rr++) {
        const int row = first + rr;
        if (i0 + row < Nq && (br[row].flags & ROW_LIVE)) continue;
        zero_row_ops(ro, row, p, lane);
    }
    __syncwarp();
}

/* ---------------------------------------------------------------- the pair adjoints */

/* A, dS (the gradient of the uncapped score) and dSx = dL/dx / (score_temp + 1e-6) of an entry in J(i); A by
 * the forward's exp of the element type T (tile.cuh: ex_scaled); xk: the part of x under the softcap (x, or
 * x - xo with an outside cap: tile_extras). */
template <typename T, typename C>
__device__ __forceinline__ void entry_dS(const BRow<C> &b, C x, C xk, C dA, C &A, C &dS, C &dSx) {
    const C L = (C)exp_scale<T>();
    A = ex_scaled<T>(x * L - b.lse * L);
    dSx = A * (dA - b.P) * b.xc.itemp;
    const C th = xk * b.xc.icap; /* tanh(S / c) with a softcap */
    dS = b.xc.cap != (C)0 ? dSx * ((C)1 - th * th) : dSx;
}

/* dA's part from the aux losses' gradients (gco, gse of the lane's rows g and g + 8), added to the upstream part gdA
 * of every entry (those outside J(i) are not read), by the caller under one test of grad_aux: a test inside the entry
 * loop was made again for each entry (a 64-bit compare of the pointer). */
template <typename C, int NT>
__device__ __forceinline__ void add_aux_dA(C (&gdA)[NT][4], const PairVals<C, NT> &pv, const C (&gco)[2],
                                           const C (&gse)[2]) {
    ASC_UNROLL
    for (int n = 0; n < NT; n++)
        ASC_UNROLL
        for (int e = 0; e < 4; e++) gdA[n][e] = gdA[n][e] + (gco[e >> 1] * pv.rc[n][e] + gse[e >> 1] * pv.phi[n][e]);
}

/* The adjoints of one entry in T(i) after B1 (docs/backward.md passes 2-4): what B2r and B2c both need. */
template <typename C> struct Adj {
    C TA;  /* lambda_a gamma_a B^a (to k^_j and the heading) */
    C da;  /* dL/da_ij */
    C drc; /* dL/drc_ij */
    C dD;  /* dL/dD_ij */
    C wcT; /* wc_ij */
};

template <typename C>
__device__ __forceinline__ Adj<C> entry_adj(const BRow<C> &b, bool inT, bool dens, C dS, C A, C r, C phi, C rc, C ws,
                                            C wc, C red, C gdc, C nis, C nic) {
    Adj<C> j;
    j.TA = inT ? b.kq[0] * dS + b.kq[1] + b.kq[2] * (r - b.wm[0]) : (C)0;                          /* cA B^a */
    const C Bs = inT ? b.kq[3] * dS + b.kq[4] + b.kq[5] * (phi - b.wm[1]) : (C)0;                  /* cphi B^s */
    const C Bc = inT ? b.kq[6] * dS + b.kq[7] + b.kq[8] * (rc - b.wm[2]) : (C)0;                   /* crc B^c */
    j.wcT = inT ? wc : (C)0;
    const C dphi = Bs + b.gse * A;
    const C dws = dphi * relu(red) + (dens ? b.drho : (C)0);
    j.da = inT && red > (C)0 ? dphi * ws : (C)0;
    j.drc = Bc + b.dG * b.iW * j.wcT + b.gco * A;
    /* dwc nic, the row's iW nic one product per row (the caller's entries share b) */
    const C dwcn = (gdc - b.dcc + b.dG * (rc - b.G)) * (b.iW * nic);
    j.dD = inT ? dws * ws * nis + dwcn * wc : (C)0;
    return j;
}


}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_BACKWARD_CUH */
