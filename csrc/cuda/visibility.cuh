/*
 * visibility.cuh -- which (query, key) pairs the tensor-core kernels visit and which they count
 * (SPEC sections 3 and 8; the CPU kernels' asc_tile_visibility, asc_next_tile, asc_visible and
 * asc_tile_masks, docs/tiling.md sections 1 and 6).
 *
 * A rectangle of rows (tokens t0 .. tlast) and keys (j0 .. jh) is classified in O(1) from the prefix
 * arrays of the key preparation: NONE (no pair visible: skipped), ALL, or SOME (the per-pair rule
 * decides); windowed row blocks jump over the key tiles outside their window (next_tile). Inside a
 * tile that is not full, each lane evaluates J(i) and T(i) for its own entries.
 */
#ifndef ASCENDER_CUDA_VISIBILITY_CUH
#define ASCENDER_CUDA_VISIBILITY_CUH

#include "keyprep.cuh"

namespace asc {
namespace tiled {

enum { VIS_NONE = 0, VIS_ALL = 1, VIS_SOME = 2 };

/* The visibility rules of one (b, h) of a call. */
struct Vis {
    int64_t N, Nq;
    bool causal, ms;
    int64_t wl, wr;            /* window_size (-1: unbounded) */
    bool windowed;             /* a window, global tokens or documents restrict J(i) */
    const uint8_t *kpm;        /* key_padding_mask row of batch b, or NULL */
    const uint8_t *am;         /* attn_mask of (b, h), or NULL */
    int64_t am_si, am_sj;
    const int32_t *pad, *glob, *gnext, *run; /* of batch b, or NULL */
    const int64_t *doc;        /* document_ids row of batch b, or NULL */
    const int32_t *bad;        /* prefix counts of non-finite keys of (b, h), or NULL (raw keys) */
    bool plain;                /* not windowed, no pad, no am, no non-finite key: every tile VIS_ALL, none with a
                                * bad key, full unless partial or cut by causality (tile_info reads no array) */
};

template <typename T>
__device__ inline Vis make_vis(const asc_params &p, const asc_fwd_args &a, const KeyPrep<T> &kp, int64_t b,
                               int64_t hd) {
    Vis v;
    v.N = p.N;
    v.Nq = p.Nq;
    v.causal = p.is_causal != 0;
    v.ms = p.mask_stats != 0;
    v.wl = p.window_left;
    v.wr = p.window_right;
    v.kpm = a.key_padding_mask ? a.key_padding_mask + b * p.N : nullptr;
    v.am = a.attn_mask ? a.attn_mask + b * p.am_sb + hd * p.am_sh : nullptr;
    v.am_si = p.am_si;
    v.am_sj = p.am_sj;
    v.pad = kp.pad ? kp.pad + b * (p.N + 1) : nullptr;
    v.glob = kp.glob ? kp.glob + b * (p.N + 1) : nullptr;
    v.gnext = kp.gnext ? kp.gnext + b * (p.N + 1) : nullptr;
    v.run = kp.run ? kp.run + b * p.N : nullptr;
    v.doc = a.document_ids ? a.document_ids + b * p.N : nullptr;
    v.windowed = p.window_left >= 0 || p.window_right >= 0 || v.glob || v.doc;
    v.bad = kp.bad ? kp.bad + (b * p.H + hd) * (p.N + 1) : nullptr; /* raw keys: each tile finds out */
    v.plain = !v.windowed && !v.pad && !v.am && (!v.bad || v.bad[p.N] == 0); /* bad[N]: the (b, h)'s count */
    return v;
}

/* Keys a row block's statistics (T) and softmax (J) can reach: [0, end). */
__device__ __forceinline__ int64_t stat_end(const Vis &v, int64_t tlast) { return v.causal && v.ms ? tlast + 1 : v.N; }
__device__ __forceinline__ int64_t soft_end(const Vis &v, int64_t tlast) { return v.causal ? tlast + 1 : v.N; }

/* Structured visibility of rows t0 .. tlast against keys jl .. jh (asc_tile_visibility). */
__device__ inline int rect_vis(const Vis &v, int64_t t0, int64_t tlast, int64_t jl, int64_t jh) {
    if (!v.windowed) return VIS_ALL;
    const int64_t L = v.wl, R = v.wr;
    const bool all_in = (L < 0 || jl >= tlast - L) && (R < 0 || jh <= t0 + R);
    const bool none_in = (L >= 0 && jh < t0 - L) || (R >= 0 && jl > tlast + R);
    const bool globals = v.glob && (v.glob[jh + 1] > v.glob[jl] || v.glob[tlast + 1] > v.glob[t0]);
    int vis = all_in ? VIS_ALL : (none_in && !globals ? VIS_NONE : VIS_SOME);
    if (v.doc && vis != VIS_NONE) {
        const bool rows_one = v.run[tlast] <= t0, keys_one = v.run[jh] <= jl;
        if (rows_one && keys_one) vis = v.doc[t0] == v.doc[jl] ? vis : VIS_NONE;
        else vis = VIS_SOME;
    }
    return vis;
}

/* The first key tile (multiple of bn) at or after j0 that rows t0 .. tlast may see through a window or a
 * global key (asc_next_tile); N when none is left; j0 without a window or for a block with a global row. */
__device__ inline int64_t window_next(const Vis &v, int64_t t0, int64_t tlast, int64_t j0, int bn) {
    const int64_t L = v.wl, R = v.wr;
    if ((L < 0 && R < 0) || j0 >= v.N || (v.glob && v.glob[tlast + 1] > v.glob[t0])) return j0;
    const int64_t lo = L < 0 ? 0 : t0 - L, hi = R < 0 ? v.N : tlast + R + 1;
    if (j0 + bn > lo && j0 < hi) return j0;
    int64_t next = v.gnext ? v.gnext[j0] : v.N;
    if (j0 < lo && lo < next) next = lo;
    return next >= v.N ? v.N : next / bn * bn;
}

/* The next tile at or after j0 (below end) that is not NONE for rows t0 .. tlast; `end` if none. */
__device__ inline int64_t next_tile(const Vis &v, int64_t t0, int64_t tlast, int64_t j0, int64_t end, int bn) {
    for (j0 = window_next(v, t0, tlast, j0, bn); j0 < end; j0 = window_next(v, t0, tlast, j0 + bn, bn)) {
        const int64_t jh = (j0 + bn < v.N ? j0 + bn : v.N) - 1;
        if (rect_vis(v, t0, tlast, j0, jh) != VIS_NONE) return j0;
    }
    return end;
}

/* Token t sees key j through its window, a global token, its document (asc_visible). */
__device__ __forceinline__ bool visible(const Vis &v, int64_t t, int64_t j) {
    bool vis = (v.wl < 0 || j >= t - v.wl) && (v.wr < 0 || j <= t + v.wr);
    if (!vis && v.glob) vis = v.glob[j + 1] > v.glob[j] || v.glob[t + 1] > v.glob[t];
    return vis && (!v.doc || v.doc[t] == v.doc[j]);
}

/* The structured class of one token t (not in a document call) against keys jl .. jh, of which nkg are global
 * (key_globals(v, jl, jh)). A global row sees them all, and so does any row when they are all global or
 * its window holds them all; a row whose window misses them sees none unless one is global. Lets a VIS_SOME tile
 * test its rows once instead of each pair: the row tile of a windowed call's global rows meets every key tile,
 * all its other rows missing all but a few, and B2c's key tile of the global keys meets every query tile. */
__device__ __forceinline__ int64_t key_globals(const Vis &v, int64_t jl, int64_t jh) {
    return v.glob ? (int64_t)(v.glob[jh + 1] - v.glob[jl]) : 0;
}
__device__ __forceinline__ int row_vis(const Vis &v, int64_t t, int64_t jl, int64_t jh, int64_t nkg) {
    if (nkg == jh - jl + 1 || (v.glob && v.glob[t + 1] > v.glob[t])) return VIS_ALL;
    const int64_t L = v.wl, R = v.wr;
    if ((L < 0 || jl >= t - L) && (R < 0 || jh <= t + R)) return VIS_ALL;
    const bool none_in = (L >= 0 && jh < t - L) || (R >= 0 && jl > t + R);
    return none_in && nkg == 0 ? VIS_NONE : VIS_SOME;
}

/* A tile of keys j0 .. j0 + bn - 1 for the rows i0 .. i0 + nrows - 1 (tokens t0 ..): its structured class,
 * whether every pair is in J(i) and T(i) (no per-entry masks), and whether a key of it has a non-finite
 * input (then its row products skip the masked entries one by one). Block-uniform. */
struct TileInfo {
    int vis;
    bool full, badkey;
};

__device__ inline TileInfo tile_info(const Vis &v, int64_t i0, int64_t nrows_full, int64_t t0, int64_t tlast,
                                     int64_t j0, int bn) {
    TileInfo ti;
    const int64_t nj = v.N - j0 < bn ? v.N - j0 : bn, jh = j0 + nj - 1;
    const bool rows_full = i0 + nrows_full <= v.Nq;
    const bool keys_full = nj == bn;
    const bool cut = v.causal && jh > t0;
    if (v.plain) { /* the common call: no prefix array to read per tile */
        ti.vis = VIS_ALL;
        ti.full = rows_full && keys_full && !cut;
        ti.badkey = false;
        return ti;
    }
    ti.vis = rect_vis(v, t0, tlast, j0, jh);
    const bool pad_in = v.pad && v.pad[j0 + nj] - v.pad[j0] > 0;
    ti.full = rows_full && keys_full && !cut && !pad_in && !v.am && ti.vis == VIS_ALL;
    ti.badkey = v.bad && v.bad[j0 + nj] - v.bad[j0] > 0;
    return ti;
}

/* Pair (query row i, its token t, key j) in J(i) (the softmax set) and in T(i) (the statistics set), for a
 * row that exists (i < Nq). vis: the tile's class. */
__device__ __forceinline__ void pair_sets(const Vis &v, int vis, int64_t i, int64_t t, int64_t j, bool &inJ,
                                          bool &inT) {
    const bool key = j < v.N;
    bool ok = key && vis != VIS_NONE && !(v.causal && j > t) && !(v.kpm && v.kpm[j]);
    if (ok && v.am) ok = v.am[i * v.am_si + j * v.am_sj] != 0;
    if (ok && vis == VIS_SOME) ok = visible(v, t, j);
    inJ = ok;
    inT = v.ms ? ok : key;
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_VISIBILITY_CUH */
