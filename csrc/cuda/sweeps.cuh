/*
 * sweeps.cuh -- what the row-major sweeps of the tensor-core kernels share (docs/cuda.md, "The tensor-core
 * kernels"): a block's identity and its lanes' rows, the double-buffered key tiles and the loop over them,
 * the row operands, the J(i) / T(i) bits of a tile's entries, and the scores of a tile (the five products and
 * the epilogue that forms x_ij, identical wherever a kernel recomputes them: forward F3, the maps, B1, B2r,
 * B2c).
 */
#ifndef ASCENDER_CUDA_SWEEPS_CUH
#define ASCENDER_CUDA_SWEEPS_CUH

#include "keyrow.cuh"
#include "rowcoef.cuh"
#include "visibility.cuh"

namespace asc {
namespace tiled {

/* ---------------------------------------------------------------- key tiles */

/* Which arrays a sweep reads of each key tile. */
enum { NEED_K = 1, NEED_V = 2, NEED_Z = 4, NEED_H = 8 };

/* Key tiles of `rows` keys, double-buffered: stage s lies `stage` bytes after stage 0 (a run-time stage index
 * must not index an array of tiles: the array would live in local memory). */
template <typename T> struct KeyStages {
    using C = typename Elem<T>::C;
    Smem2D<T> K0, V0, Z0, H0;
    C *rk0, *nz0, *sh0;
    int32_t *bad0;     /* raw keys: a key of the tile has a non-finite input */
    int64_t stage;
    int stages;

    __host__ __device__ void place(Carve &cv, const asc_params &p, int rows, int nstages) {
        stages = nstages;
        const int64_t at = cv.off;
        K0 = cv.tile<T>(rows, p.d);
        V0 = cv.tile<T>(rows, p.dv);
        Z0 = cv.tile<T>(rows, p.dz);
        H0 = cv.tile<T>(rows, p.da);
        rk0 = cv.array<C>(rows);
        nz0 = cv.array<C>(rows);
        sh0 = cv.array<C>(rows);
        bad0 = cv.array<int32_t>(1);
        stage = cv.off - at;
        cv.take(stage * (nstages - 1));
    }
    template <typename P> __device__ P *at(P *p0, int s) const {
        return reinterpret_cast<P *>(reinterpret_cast<unsigned char *>(p0) + s * stage);
    }
    __device__ Smem2D<T> K(int s) const { return Smem2D<T>{at(K0.p, s), K0.ld}; }
    __device__ Smem2D<T> V(int s) const { return Smem2D<T>{at(V0.p, s), V0.ld}; }
    __device__ Smem2D<T> Z(int s) const { return Smem2D<T>{at(Z0.p, s), Z0.ld}; }
    __device__ Smem2D<T> H(int s) const { return Smem2D<T>{at(H0.p, s), H0.ld}; }
    __device__ C *rk(int s) const { return at(rk0, s); }
    __device__ C *nz(int s) const { return at(nz0, s); }
    __device__ C *sh(int s) const { return at(sh0, s); }
    __device__ int32_t *bad(int s) const { return at(bad0, s); }
};

/* Keys j0 .. j0 + 8 NT - 1 of a key tile, as a pair epilogue reads them. */
template <typename T> struct KeySlice {
    Smem2D<T> K, V, Z, H;
    const typename Elem<T>::C *rk, *nz, *sh;
    int64_t j0;
};

template <typename T> __device__ __forceinline__ KeySlice<T> key_slice(const KeyStages<T> &ks, int s, int first,
                                                                        int64_t j0) {
    const Smem2D<T> K = ks.K(s), V = ks.V(s), Z = ks.Z(s), H = ks.H(s);
    return KeySlice<T>{Smem2D<T>{K.row(first), K.ld}, Smem2D<T>{V.row(first), V.ld}, Smem2D<T>{Z.row(first), Z.ld},
                       Smem2D<T>{H.row(first), H.ld}, ks.rk(s) + first, ks.nz(s) + first, ks.sh(s) + first,
                       j0 + first};
}

/* ---------------------------------------------------------------- row operands */

/*
 * The row operands of a block (rows x f tiles): q, the heading (u, or the seed variant's exact row k_t), the
 * centred centroid c~, the row's own latent z~_t and scaled semantic row hs_t; the backward's dy and dc.
 * A computed operand that the element type cannot hold exactly has a second tile (its rounding error) on
 * the mma path: `lo` pointers, NULL otherwise.
 */
template <typename T> struct RowOps {
    Smem2D<T> Q, U, Cr, Zr, Hr, dY, dC;
    T *Ulo, *Clo, *dClo;

    __host__ __device__ void place(Carve &cv, const asc_params &p, int rows, bool ulo, bool clo,
                                   bool backward = false, bool dc = true) { /* dc: B1 makes dc, reads none */
        Q = cv.tile<T>(rows, p.d);
        U = cv.tile<T>(rows, p.d);
        Cr = cv.tile<T>(rows, p.dz);
        Zr = cv.tile<T>(rows, p.dz);
        Hr = cv.tile<T>(rows, p.da);
        Ulo = ulo ? cv.tile<T>(rows, p.d).p : nullptr;
        Clo = clo ? cv.tile<T>(rows, p.dz).p : nullptr;
        dY = backward ? cv.tile<T>(rows, p.dv) : Smem2D<T>{nullptr, 0};
        dC = backward && dc ? cv.tile<T>(rows, p.dz) : Smem2D<T>{nullptr, 0};
        dClo = backward && dc && Elem<T>::kMma ? cv.tile<T>(rows, p.dz).p : nullptr;
    }
};

/* 16 rows (first .. first + 15) of the row operands. */
template <typename T> struct RowSlice {
    Smem2D<T> Q, U, Cr, Zr, Hr, dY, dC;
    const T *Ulo, *Clo, *dClo;
};

/* B2c takes a slice every query step, so its offsets are 32-bit (a row of a shared-memory tile) and only the
 * tiles a kernel may lack (dy, dc and the splits: RowOps::place) are tested for NULL, which stays NULL. */
template <typename T> __device__ __forceinline__ RowSlice<T> row_slice(const RowOps<T> &ro, int first) {
    auto at = [&](const Smem2D<T> &t) { return Smem2D<T>{t.p + first * t.ld, t.ld}; };
    auto opt = [&](const Smem2D<T> &t) { return Smem2D<T>{t.p ? t.p + first * t.ld : nullptr, t.ld}; };
    auto lo = [&](const T *x, int ld) { return x ? x + first * ld : nullptr; };
    return RowSlice<T>{at(ro.Q), at(ro.U), at(ro.Cr), at(ro.Zr), at(ro.Hr), opt(ro.dY), opt(ro.dC),
                       lo(ro.Ulo, ro.U.ld), lo(ro.Clo, ro.Cr.ld), lo(ro.dClo, ro.dC.ld)};
}

/* T hi (and lo: the rounding error of hi) of x into an operand row. */
template <typename T, typename C>
__device__ __forceinline__ void put_operand(T *hi, T *lo, int64_t f, C x) {
    const T h = to_elem<T>(x);
    hi[f] = h;
    if (lo) lo[f] = to_elem<T>(x - (C)up(h));
}

/* ---------------------------------------------------------------- a row-major block */

/* A lane's two rows of its warp's m16 tile (g and g + 8): block-local index, query row, token, exists. */
struct LaneRows {
    int lr[2];
    int64_t i[2], t[2];
    bool act[2];
};

__device__ __forceinline__ LaneRows lane_rows(const asc_params &p, int64_t i0, int first, int lane) {
    LaneRows L;
    for (int r = 0; r < 2; r++) {
        L.lr[r] = first + (lane >> 2) + 8 * r;
        L.i[r] = i0 + L.lr[r];
        L.t[r] = L.i[r] + p.N - p.Nq - p.keys_after;
        L.act[r] = L.i[r] < p.Nq;
    }
    return L;
}

/* What is the same for every thread of a row-major block: its (b, h), its rows, their visibility, the head's
 * scalars and the (b, h)'s key-side arrays. block_ctx makes it once, by the block's first thread, in shared memory
 * (every thread of the block calls it). The sweeps read these once or twice per tile; copies in registers would stay
 * live through every sweep, and did: about 60 registers of 64-bit pointers and indices at each tile boundary, which
 * ptxas made room for by spilling (docs/cuda.md, "Where a sweep's registers go"). One RowBlock per block and launch:
 * a second one of the same T and BM would rewrite the first one's context. */
template <typename T> struct BlockCtx {
    Vis vis;
    Heads hd;
    int64_t b, h, bh, i0, nrows, t0, tlast;
    const T *kb, *vb, *zb, *hb; /* key-side arrays of (b, h) */
    const typename Elem<T>::C *rkb, *nzb, *shb;
};

template <typename T, int BM>
__device__ inline const BlockCtx<T> &block_ctx(const asc_params &p, const asc_fwd_args &a, const KeyPrep<T> &kp,
                                               int64_t bh, int64_t i0) {
    __shared__ BlockCtx<T> c;
    if (threadIdx.x == 0) {
        c.bh = bh;
        c.b = bh / p.H;
        c.h = bh % p.H;
        c.vis = make_vis(p, a, kp, c.b, c.h);
        c.hd = load_heads<T>(a, c.h);
        c.i0 = i0;
        c.nrows = p.Nq - i0 < BM ? p.Nq - i0 : BM;
        c.t0 = i0 + p.N - p.Nq - p.keys_after;
        c.tlast = c.t0 + c.nrows - 1;
        c.kb = (const T *)a.k + bh * p.N * p.d;
        c.vb = (const T *)a.v + bh * p.N * p.dv;
        c.zb = kp.zsrc(a) + bh * p.N * p.dz;
        c.hb = kp.hsrc(a) + bh * p.N * p.da;
        c.rkb = kp.rk ? kp.rk + bh * kp.Npad : nullptr;
        c.nzb = kp.nz ? kp.nz + bh * kp.Npad : nullptr;
        c.shb = kp.sh ? kp.sh + bh * kp.Npad : nullptr;
    }
    __syncthreads();
    return c;
}

/* What a row-major block knows about itself: the call (by reference to the kernel's __grid_constant__
 * parameters, no copies), the block's shared BlockCtx (by reference: its fields are read where used), its lanes'
 * rows. */
template <typename T, class Tr> struct RowBlock {
    using C = typename Elem<T>::C;
    const asc_params &p;
    const asc_fwd_args &a;
    const KeyPrep<T> &kp;
    const BlockCtx<T> &ctx;
    const Vis &vis;
    const Heads &hd;
    const int64_t &b, &h, &bh, &i0, &nrows, &t0, &tlast;
    const T *const &kb, *const &vb, *const &zb, *const &hb;
    const C *const &rkb, *const &nzb, *const &shb;
    int tid, w, lane;
    bool paper, scores;
    int nmax;
    LaneRows L;

    __device__ RowBlock(const asc_params &p_, const asc_fwd_args &a_, const KeyPrep<T> &kp_, int64_t bh_, int64_t i0_)
        : p(p_), a(a_), kp(kp_), ctx(block_ctx<T, Tr::BM>(p_, a_, kp_, bh_, i0_)), vis(ctx.vis), hd(ctx.hd),
          b(ctx.b), h(ctx.h), bh(ctx.bh), i0(ctx.i0), nrows(ctx.nrows), t0(ctx.t0), tlast(ctx.tlast), kb(ctx.kb),
          vb(ctx.vb), zb(ctx.zb), hb(ctx.hb), rkb(ctx.rkb), nzb(ctx.nzb), shb(ctx.shb) {
        tid = threadIdx.x;
        w = tid >> 5;
        lane = tid & 31;
        paper = p.variant == ASC_VARIANT_PAPER;
        scores = paper && p.neighbours == ASC_NEIGHBOURS_SCORES;
        nmax = paper ? (int)p.n_nbr : 0;
        L = lane_rows(p, i0_, w * 16, lane);
    }
};

/* ||x||^2 of a row of f values (global or shared), in double, by the whole warp. */
template <typename S> __device__ inline double warp_sq(const S *x, int64_t f, int lane) {
    double ss = 0.0;
    for (int64_t c = lane; c < f; c += 32) {
        const double v = (double)up(x[c]);
        ss += v * v;
    }
    return warp_sum(ss);
}

/* 1 / max(||k_j||, 1e-12) of key j of the block's (b, h): the prepared value, or (raw keys) from the row; the
 * whole warp. */
template <typename T, class Tr> __device__ inline typename Elem<T>::C key_rk(const RowBlock<T, Tr> &B, int64_t j) {
    using C = typename Elem<T>::C;
    if (B.rkb) return B.rkb[j];
    return (C)inv_norm(warp_sq(B.kb + j * B.p.d, B.p.d, B.lane));
}

/* key_rk by one lane (a lane per key: the heading's neighbours). */
template <typename T, class Tr>
__device__ inline typename Elem<T>::C key_rk_lane(const RowBlock<T, Tr> &B, int64_t j) {
    return B.rkb ? B.rkb[j] : lane_inv_norm(B.kb + j * B.p.d, B.p.d);
}

/* The power of two at the norm of a semantic row and the row's scale 2^e / max(||h||, 1e-12) (keyprep.cuh). */
__device__ inline int semantic_exp(double hh, double *scale) {
    const double hn = sqrt(hh), rh = 1.0 / (hn > EPS_NORM ? hn : EPS_NORM);
    int e = 0;
    if (hn > 0.0 && finite(hn)) frexp(hn, &e);
    *scale = ldexp(rh, e);
    return e;
}

/* Raw keys: the per-key values of a tile from its rows in shared memory (1 / ||k||, ||z||^2, the semantic
 * rows scaled in place to the power of two at their norm, and whether a key is non-finite), as keys_kernel
 * prepares them for the other calls. A warp per key; every thread of the block calls it. */
template <typename T>
__device__ void prepare_tile(const KeyStages<T> &ks, int s, int64_t j0, int rows, int need, const asc_params &p,
                             int tid, int nthr) {
    using C = typename Elem<T>::C;
    const int lane = tid & 31, w = tid >> 5, nw = nthr >> 5;
    if (tid == 0) *ks.bad(s) = 0;
    __syncthreads();
    for (int r = w; r < rows; r += nw) {
        const bool key = j0 + r < p.N;
        bool ok = true;
        const Smem2D<T> K = ks.K(s), V = ks.V(s), Z = ks.Z(s), H = ks.H(s);
        if (need & NEED_K) {
            const double kk = warp_sq(K.row(r), p.d, lane);
            ok &= finite(kk);
            if (lane == 0) ks.rk(s)[r] = key ? (C)(1.0 / (sqrt(kk) > EPS_NORM ? sqrt(kk) : EPS_NORM)) : (C)0;
        }
        if (need & NEED_V) ok &= finite(warp_sq(V.row(r), p.dv, lane));
        if (need & NEED_Z) {
            const double zz = warp_sq(Z.row(r), p.dz, lane);
            ok &= finite(zz);
            if (lane == 0) ks.nz(s)[r] = key ? (C)zz : (C)0;
        }
        if (need & NEED_H) {
            const double hh = warp_sq(H.row(r), p.da, lane);
            ok &= finite(hh);
            double sc;
            const int e = semantic_exp(hh, &sc);
            for (int64_t c = lane; c < p.da; c += 32) H.row(r)[c] = to_elem<T>(ldexp((double)up(H.row(r)[c]), -e));
            if (lane == 0) ks.sh(s)[r] = key ? (C)sc : (C)0;
        }
        if (lane == 0 && key && !ok) *ks.bad(s) = 1;
    }
    __syncthreads();
}

/* Whether this call's whole key tiles take the fixed walk (tiles_load_fixed): 2-byte elements, and each array of
 * `need` 16-byte aligned at (b, h) with 32, 64 or 128 features (then every row of it is). Once per sweep. */
template <typename T, class Tr> __device__ bool key_walk_fixed(const RowBlock<T, Tr> &B, int need) {
    const asc_params &p = B.p;
    auto ok = [](int want, const T *src, int64_t f) { return !want || fixed_walk_fits(src, f); };
    return sizeof(T) == 2 && ok(need & NEED_K, B.kb, p.d) && ok(need & NEED_V, B.vb, p.dv) &&
           ok(need & NEED_Z, B.zb, p.dz) && ok(need & NEED_H, B.hb, p.da);
}

/* Copies the arrays of key tile j0 (`need`, ROWS keys) into stage s of ks; every thread of the block (NTHR). A whole
 * tile of a `fixed` call (key_walk_fixed) takes the fixed walk, whose offsets past a thread's first chunk are
 * immediates; the general walk worked out the split of tid, the validity and the 64-bit offsets of every chunk
 * (~100 instructions an array at 64 features, docs/cuda.md "The key tiles' fixed walk"). */
template <int ROWS, int NTHR, typename T, class Tr>
__device__ void load_key_tile(const RowBlock<T, Tr> &B, const KeyStages<T> &ks, int s, int64_t j0, int need,
                              bool fixed, int tid) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const bool whole = fixed && j0 + ROWS <= p.N;
    auto one = [&](Smem2D<T> d, const T *base, int64_t f) {
        if constexpr (sizeof(T) == 2)
            if (whole) {
                const Smem2D<T> dst[1] = {d};
                const T *const src[1] = {base + j0 * f};
                tiles_load_fixed<T, NTHR, ROWS, 0u>(dst, src, f, tid);
                return;
            }
        tile_load(d, base, f, j0, ROWS, p.N, tid, NTHR);
    };
    if (need & NEED_K) one(ks.K(s), B.kb, p.d);
    if (need & NEED_V) one(ks.V(s), B.vb, p.dv);
    if (need & NEED_Z) one(ks.Z(s), B.zb, p.dz);
    if (need & NEED_H) one(ks.H(s), B.hb, p.da);
    if (B.kp.raw) return; /* prepare_tile, once the copies are in */
    C *const dst[3] = {ks.rk(s), ks.nz(s), ks.sh(s)};
    const C *const src[3] = {B.rkb + j0, B.nzb + j0, B.shb + j0};
    vecs_load(dst, src, ROWS, tid, NTHR);
}

/*
 * Runs body(stage, j0, info) over the key tiles [jbeg, end) that the block's rows can see (next_tile; every
 * tile with `every`). With two stages tile n + 1 is copied while tile n is used; with one, after. Every
 * thread of the block calls it.
 */
template <typename T, class Tr, typename Body>
__device__ void sweep(const RowBlock<T, Tr> &B, const KeyStages<T> &ks, int64_t jbeg, int64_t end, int need,
                      bool every, Body body) {
    auto next = [&](int64_t j) { return every ? j : next_tile(B.vis, B.t0, B.tlast, j, end, Tr::BN); };
    constexpr bool two = Tr::STAGES == 2;
    const bool fixed = key_walk_fixed(B, need);
    int64_t j0 = next(jbeg);
    if (j0 < end) load_key_tile<Tr::BN, Tr::THREADS>(B, ks, 0, j0, need, fixed, B.tid);
    cp_async_commit();
    int s = 0;
    while (j0 < end) {
        const int64_t jn = next(j0 + Tr::BN);
        if (two) {
            if (jn < end) load_key_tile<Tr::BN, Tr::THREADS>(B, ks, s ^ 1, jn, need, fixed, B.tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        TileInfo ti = tile_info(B.vis, B.i0, Tr::BM, B.t0, B.tlast, j0, Tr::BN);
        if (B.kp.raw) {
            prepare_tile(ks, s, j0, Tr::BN, need, B.p, B.tid, Tr::THREADS);
            ti.badkey = *ks.bad(s) != 0;
        }
        body(s, j0, ti);
        __syncthreads();
        if (!two && jn < end) {
            load_key_tile<Tr::BN, Tr::THREADS>(B, ks, 0, jn, need, fixed, B.tid);
            cp_async_commit();
        }
        j0 = jn;
        s = two ? s ^ 1 : 0;
    }
    cp_async_wait<0>();
}

/* J(i) and T(i) bits (bit 4 n + e) of a lane's entries of keys j0 .. j0 + 8 NT - 1, and the bits of its rows'
 * own tokens. A full tile (every pair in J and T) takes the rows' bits as they are; the own token's column
 * d = t - j0 is held by lane (g, (d % 8) / 2) as entry 2 r + d % 2 of n8 tile d / 8. Only the other tiles ask
 * pair_sets, entry by entry. */
template <int NT>
__device__ __forceinline__ void entry_sets(const Vis &vis, const LaneRows &L, int lane, int64_t j0,
                                           const TileInfo &ti, unsigned &J, unsigned &Tset, unsigned &own) {
    own = 0u;
    /* the lane's rows are t and t + 8 (lane_rows): neither own token is in the tile unless t - j0 is in [-8, 8 NT),
     * which one compare says on all but the one or two tiles of the warp's diagonal */
    if ((uint64_t)(L.t[0] - j0 + 8) < (uint64_t)(8 * NT + 8))
        for (int r = 0; r < 2; r++) {
            const int64_t d = L.t[r] - j0;
            if (d >= 0 && d < 8 * NT && (int)((d & 7) >> 1) == (lane & 3))
                own |= 1u << (4 * (int)(d >> 3) + 2 * r + (int)(d & 1));
        }
    const unsigned rows = (L.act[0] ? row_bits<NT>(0) : 0u) | (L.act[1] ? row_bits<NT>(1) : 0u);
    if (ti.full) {
        J = Tset = rows;
        return;
    }
    J = Tset = 0u;
    /* a structured tile without documents: each row's own class (row_vis) spares its entries the window and
     * global tests where it sees all or none of the tile's keys */
    const bool by_row = ti.vis == VIS_SOME && !vis.doc && j0 < vis.N; /* (B2c's second slice may start past N) */
    const int64_t jh = (j0 + 8 * NT < vis.N ? j0 + 8 * NT : vis.N) - 1;
    const int64_t kg = by_row ? key_globals(vis, j0, jh) : 0;
    ASC_NOUNROLL
    for (int r = 0; r < 2; r++) {
        if (!L.act[r]) continue;
        const int64_t i = L.i[r], t = L.t[r];
        const int rv = by_row ? row_vis(vis, t, j0, jh, kg) : ti.vis;
        ASC_NOUNROLL
        for (int c = 0; c < 2 * NT; c++) { /* the lane's 2 NT columns of row r: n8 tile c / 2, entry 2 r + c % 2 */
            const int n = c >> 1, e = 2 * r + (c & 1);
            bool inJ, inT;
            pair_sets(vis, rv, i, t, j0 + frag_col(lane, n, e), inJ, inT);
            const unsigned bit = 1u << (4 * n + e);
            if (inJ) J |= bit;
            if (inT) Tset |= bit;
        }
    }
}

/* ---------------------------------------------------------------- attention dropout */

/*
 * The dropout keep bits of a lane's entries of a tile (bit 4 n + e, as entry_sets; SPEC section 9b,
 * docs/dropout.md): pair (t, j) of (b, h) is kept when word (j + o) mod 4 of the Philox block of counter
 * ((j + o) / 4, t + o, offset + bh) is >= dropout_threshold (csrc/philox.h). A lane's two keys of a row in an
 * n8 tile (columns 2t', 2t' + 1) share one Philox call unless they straddle a group of four. Rows that do not
 * exist get 0. Out of line: only calls with dropout reach it.
 */
template <int NT>
__device__ __noinline__ unsigned drop_bits(const asc_params &p, const asc_fwd_args &a, int64_t bh, const LaneRows &L,
                                           int lane, int64_t j0) {
    const asc_dropout_stream s = asc_dropout_stream_of(a.dropout_seed, bh);
    unsigned keep = 0u;
    for (int r = 0; r < 2; r++) {
        if (!L.act[r]) continue;
        const int64_t tok = L.t[r] + s.tok;
        for (int n = 0; n < NT; n++) {
            const int64_t J = j0 + frag_col(lane, n, 2 * r) + s.tok;
            asc_philox4 wd = asc_dropout_words(s, tok, J >> 2);
            const unsigned k0 = wd.w[J & 3] >= p.dropout_threshold;
            if ((J & 3) == 3) wd = asc_dropout_words(s, tok, (J + 1) >> 2);
            const unsigned k1 = wd.w[(J + 1) & 3] >= p.dropout_threshold;
            keep |= (k0 | k1 << 1) << (4 * n + 2 * r);
        }
    }
    return keep;
}

/* v times its entry's dropout factor m / (1 - p): rho = dropout_scale where drop_bits keeps it, 0 elsewhere (a
 * product, so a dropped non-finite value stays NaN, as in the twin: docs/dropout.md). */
template <typename C, int NT>
__device__ __forceinline__ void drop_scale(C (&v)[NT][4], unsigned keep, C rho) {
    ASC_UNROLL
    for (int n = 0; n < NT; n++)
        ASC_UNROLL
        for (int e = 0; e < 4; e++) v[n][e] *= (keep >> (4 * n + e)) & 1u ? rho : (C)0;
}

/* ---------------------------------------------------------------- the scores of a tile */

/* The pair's attn_bias + ALiBi term (0 without them), out of line: only calls with one reach it. */
template <typename T, typename C>
__device__ __noinline__ C pair_other(const asc_params &p, const asc_fwd_args &a, int64_t b, int64_t h, int64_t i,
                                     int64_t t, int64_t j) {
    C o = 0;
    if (a.attn_bias) {
        const T *ab = (const T *)a.attn_bias + b * p.ab_sb + h * p.ab_sh;
        o += (C)up(ab[i * p.ab_si + j * p.ab_sj]);
    }
    if (a.alibi_slopes) o -= (C)up(((const T *)a.alibi_slopes)[b * p.H + h]) * (C)(t > j ? t - j : j - t);
    return o;
}

/* x of a pair with attn_bias / ALiBi or a softcap (SPEC section 9) from xv, the score without them: itemp
 * beta_other added, and the cap x <- cap tanh(x / cap) taken, before it (softcap_bias = "inside") or after it
 * ("outside"). Out of line, one call per entry: only calls with one of these options reach it. */
template <typename T, typename C>
__device__ __noinline__ C score_extras(const asc_params &p, const asc_fwd_args &a, int64_t b, int64_t h,
                                       const LaneRows &L, int r, int64_t j, C xv, const XCoef<C> &c) {
    const C o = (a.attn_bias || a.alibi_slopes) && L.act[r] && j < p.N
                    ? c.itemp * pair_other<T, C>(p, a, b, h, L.i[r], L.t[r], j)
                    : (C)0;
    const bool outside = p.softcap_outside != 0;
    if (!outside) xv += o;
    if (c.cap != (C)0) xv = softcap(xv, c.cap, c.icap);
    return outside ? xv + o : xv;
}

/* Per-row values of the lanes' rows that the scores read besides the coefficients. */
template <typename C> struct RowVals {
    C nzr, ncc, usc, shr; /* ||z~_t||^2, ||c~_i||^2, the heading's scale, the semantic row's scale */
};

/* The pair values of a tile that the epilogues read. */
template <typename C, int NT> struct PairVals {
    C x[NT][4];   /* the score x = S / (score_temp + 1e-6), softcapped, before the masks */
    C gs[NT][4];  /* q.k (unscaled) */
    C r[NT][4], phi[NT][4], rc[NT][4]; /* the raw bias rows */
    C ws[NT][4], D[NT][4], red[NT][4]; /* exp(-D / ts), ||z_i - z_j||^2, a - delta */
};

/*
 * The five score products of a tile and, per entry, x (before the masks) with its ingredients: each product
 * followed by its part of the epilogue, so one product accumulator is live at a time. The same function in
 * every kernel that forms x, so forward and backward agree to the bit. EXTRAS: beta_other and the softcap by
 * score_extras, either cap order (one out-of-line call per entry); false: the inside order alone by two calls,
 * for the backward's B1 and B2r instantiations for calls without an outside cap (ptxas allocates their
 * registers better so: docs/cuda.md "Dropout, an outside softcap and query_offset").
 */
template <typename T, int NT, bool EXTRAS = true>
__device__ __forceinline__ void tile_scores(const asc_params &p, const asc_fwd_args &a, int64_t b, int64_t h,
                                            typename Elem<T>::C delta, const LaneRows &L, const RowSlice<T> &R,
                                            const KeySlice<T> &K, int lane, const XCoef<typename Elem<T>::C> (&cf)[2],
                                            const RowVals<typename Elem<T>::C> (&rv)[2],
                                            PairVals<typename Elem<T>::C, NT> &pv) {
    using C = typename Elem<T>::C;
    const C nis = (C)(-exp_scale<T>() / (p.tau_sep + EPS_TAU)); /* the exp's scale folded in (tile.cuh) */
    C acc[NT][4];
    score<T, NT>(pv.gs, R.Q, nullptr, K.K, p.d, lane);
    score<T, NT>(acc, R.Zr, nullptr, K.Z, p.dz, lane);
    const int oc[2] = {own_col<NT>(L.t[0], K.j0, lane), own_col<NT>(L.t[1], K.j0, lane)};
    ASC_UNROLL
    for (int n = 0; n < NT; n++)
        ASC_UNROLL
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1, col = frag_col(lane, n, e);
            C D = sq_dist(rv[r].nzr + K.nz[col], acc[n][e]);
            if (oc[r] == n * 8 + (e & 1)) D = (C)0; /* the row's own token */
            pv.D[n][e] = D;
            pv.ws[n][e] = ex_scaled<T>(D * nis);
        }
    score<T, NT>(acc, R.Hr, nullptr, K.H, p.da, lane);
    ASC_UNROLL
    for (int n = 0; n < NT; n++)
        ASC_UNROLL
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1, col = frag_col(lane, n, e);
            pv.red[n][e] = acc[n][e] * rv[r].shr * K.sh[col] - delta;
            pv.phi[n][e] = pv.ws[n][e] * relu(pv.red[n][e]);
        }
    score<T, NT>(acc, R.Cr, R.Clo, K.Z, p.dz, lane);
    ASC_UNROLL
    for (int n = 0; n < NT; n++)
        ASC_UNROLL
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1, col = frag_col(lane, n, e);
            pv.rc[n][e] = sq_dist(rv[r].ncc + K.nz[col], acc[n][e]);
        }
    score<T, NT>(acc, R.U, R.Ulo, K.K, p.d, lane);
    ASC_UNROLL
    for (int n = 0; n < NT; n++)
        ASC_UNROLL
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1, col = frag_col(lane, n, e);
            pv.r[n][e] = acc[n][e] * rv[r].usc * K.rk[col];
            pv.x[n][e] = pair_score(cf[r], pv.gs[n][e], pv.r[n][e], pv.phi[n][e], pv.rc[n][e]);
        }
    /* beta_other and the softcap on top: one block-uniform test per tile, not one per entry */
    const bool other = a.attn_bias || a.alibi_slopes, capped = cf[0].cap != (C)0 || cf[1].cap != (C)0;
    if (other || capped)
        ASC_UNROLL
        for (int n = 0; n < NT; n++)
            ASC_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                const int64_t j = K.j0 + frag_col(lane, n, e);
                const XCoef<C> &c = cf[r];
                C xv = pv.x[n][e];
                if constexpr (EXTRAS) {
                    xv = score_extras<T, C>(p, a, b, h, L, r, j, xv, c);
                } else {
                    if (other && L.act[r] && j < p.N) xv += c.itemp * pair_other<T, C>(p, a, b, h, L.i[r], L.t[r], j);
                    if (capped && c.cap != (C)0) xv = softcap(xv, c.cap, c.icap);
                }
                pv.x[n][e] = xv;
            }
}

/* Whether beta_other (attn_bias, ALiBi) enters x after the softcap (softcap_bias = "outside"): then the
 * backward forms the cap's tanh from tile_extras' xo, and dattn_bias is dL/dx / (score_temp + 1e-6). */
__host__ __device__ inline bool other_outside(const asc_params &p, const asc_fwd_args &a) {
    return p.softcap > 0 && p.softcap_outside && (a.attn_bias || a.alibi_slopes);
}

/*
 * What a backward epilogue reads of dropout and an outside softcap, per tile, out of line (one call per tile,
 * only for calls with one of them, so that the common case keeps its registers): returns the lane's dropout keep
 * bits (drop_bits; 0 without dropout) and, with other_outside, fills xo with each entry's itemp beta_other, the
 * part of x past the cap (the row-per-warp kernels' xo): the cap's tanh(S / c) = (x - xo) / cap in
 * dS = dSx (1 - tanh^2). itemp0, itemp1: the lane's rows' 1 / (score_temp + 1e-6).
 */
template <typename T, int NT>
__device__ __noinline__ unsigned tile_extras(const asc_params &p, const asc_fwd_args &a, int64_t b, int64_t h,
                                             const LaneRows &L, int lane, int64_t j0, typename Elem<T>::C itemp0,
                                             typename Elem<T>::C itemp1, typename Elem<T>::C (&xo)[NT][4]) {
    using C = typename Elem<T>::C;
    if (other_outside(p, a))
        for (int n = 0; n < NT; n++)
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                const int64_t j = j0 + frag_col(lane, n, e);
                xo[n][e] = L.act[r] && j < p.N ? (r ? itemp1 : itemp0) * pair_other<T, C>(p, a, b, h, L.i[r], L.t[r], j)
                                               : (C)0;
            }
    return a.dropout_seed ? drop_bits<NT>(p, a, b * p.H + h, L, lane, j0) : 0u;
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_SWEEPS_CUH */
