/*
 * chunks.cuh -- the forward's three sweeps split over chunks of keys (split-K), for rows that see far more keys
 * than a block should sweep alone: the decode kernels' few rows (ascender_decode.cu, a lane per key) and the
 * row tiles of a windowed call's global rows (fwd_tiled.cuh, the tensor-core sweeps). A launch per sweep, a block per
 * (rows, chunk): each block runs the sweep over its chunk and writes its rows' partial state, and the last block of
 * its rows to finish (block_last) merges every chunk's partials in chunk order (the same result on every run) into
 * one more slot, the merge, which the next sweep's blocks read:
 *   CHUNK_F1   F1 over the chunk                    -> sums, moments of phi, centroid numerator, top-k list; merged
 *   CHUNK_F2   F2 over the chunk (after F1's merge)  -> moments of r and rc; merged
 *   CHUNK_F3   F3 over the chunk (after both)        -> softmax partials (max, sums, output numerator); the last
 *              block merges them and writes the rows' outputs
 * (docs/cuda.md "Decode", "The global rows over key chunks", "The chunks merged once, by the last block").
 * The values agree with a single sweep's to rounding, not bit for bit.
 */
#ifndef ASCENDER_CUDA_CHUNKS_CUH
#define ASCENDER_CUDA_CHUNKS_CUH

#include "decode_sweeps.cuh"

namespace asc {
namespace tiled {

enum { CHUNK_F1 = 0, CHUNK_F2, CHUNK_F3, CHUNK_STEPS };

/* Chunks whose top-k lists the warp merges by rounds (up to eight heads per lane); more take the pushes. */
constexpr int ROUND_CHUNKS = 256;

/* The most chunks of a long row tile (the last block merges them all after its own sweep). */
constexpr int64_t LONG_CHUNKS = 64;

/* Split only where the long tiles sweep LONG_RATIO times the key tiles a windowed block does, or more. */
constexpr int64_t LONG_RATIO = 4;

/* Blocks of a chunk launch beyond which chunks grow instead of multiplying (about eight waves of two blocks per SM
 * of 132): it bounds the partials, [B H][long rows][chunks], to LONG_BLOCKS tiles of rows. */
constexpr int64_t LONG_BLOCKS = 2048;

/*
 * The leading row tiles (of bm rows, key tiles of bn) of every (b, h) whose rows see far more keys than the call's
 * other blocks, and the keys of a chunk to split their sweeps into (docs/cuda.md "The global rows over key chunks"); 0:
 * none. A call without causality, with both sides of its window bounded and global tokens among its query rows
 * (query_offset shifts them): their row tiles sweep every key tile, a windowed block its window's few. A chunk is
 * twice a windowed block's key tiles, and there are at most LONG_CHUNKS and about LONG_BLOCKS blocks a launch. A
 * global_mask's rows are not looked for (their positions are on the device): their tiles stay long.
 */
inline int64_t long_row_tiles(const asc_params &p, int64_t bm, int64_t bn, int64_t *chunk) {
    if (p.is_causal || p.window_left < 0 || p.window_right < 0 || p.window_left >= p.N || p.window_right >= p.N ||
        p.n_global <= 0 || p.n_global > p.N)
        return 0;
    const int64_t g = p.n_global - (p.N - p.Nq - p.keys_after); /* the query rows i < g are global */
    if (g <= 0) return 0;
    const int64_t span = (p.window_left + p.window_right + bm + bn - 1) / bn + 1 + (p.n_global + bn - 1) / bn;
    const int64_t all = (p.N + bn - 1) / bn, few = (all + LONG_CHUNKS - 1) / LONG_CHUNKS;
    const int64_t tiles = (p.Nq + bm - 1) / bm, n = (g + bm - 1) / bm < tiles ? (g + bm - 1) / bm : tiles;
    if (all < LONG_RATIO * span || n * p.B * p.H > MAX_GRID_Y) return 0;
    const int64_t fill = (all * n * p.B * p.H + LONG_BLOCKS - 1) / LONG_BLOCKS; /* key tiles per chunk */
    const int64_t ct = 2 * span > few ? 2 * span : few;
    *chunk = (ct > fill ? ct : fill) * bn;
    return n;
}

/* What one (row, chunk) leaves for the merges. */
template <typename C> struct ChunkPart {
    double rho, W, qz, n, nsoft;
    double mom[3][3]; /* mean, std, sum of squared deviations of r (F2), phi (F1), rc (F2) over the chunk */
    double l, ac, as; /* F3 */
    C mx;
    int32_t cnt;      /* F1: entries of the chunk's top-k list */
};

/* The partial states of a split call: `rows` query rows per (b, h) (row i of (b, h) at bh rows + i), nch chunks of
 * `chunk` keys each, a slot per chunk and one more for their merge (slot nch), the key preparation the sweeps read,
 * and per group of blocks (a grid row: the chunks of the same rows) a counter per step for block_last, which the
 * launcher clears before the first step (ticket_bytes from `ticket`). */
template <typename T> struct ChunkScratch {
    using C = typename Elem<T>::C;
    KeyPrep<T> kp;
    ChunkPart<C> *part; /* [rows][nch + 1] */
    C *P;               /* [rows][nch + 1][dz] the centroid numerators */
    C *O;               /* [rows][nch + 1][dv] the output numerators */
    int32_t *idx;
    C *val;             /* [rows][nch + 1][nmax] */
    unsigned *ticket;   /* [groups][CHUNK_STEPS] */
    int64_t rows, chunk, nch, nmax;
    size_t bytes;       /* of the partials, from the base given to place_parts */
    size_t ticket_bytes;
    __host__ void place_parts(const asc_params &p, int64_t rows_, int64_t chunk_, int64_t groups, char *base) {
        size_t o = 0;
        auto take = [&](size_t n) -> char * {
            const size_t at = o;
            o += (n + 255) / 256 * 256;
            return base ? base + at : nullptr;
        };
        rows = rows_;
        chunk = chunk_;
        nch = (p.N + chunk - 1) / chunk;
        nmax = p.variant == ASC_VARIANT_PAPER ? p.n_nbr : 0;
        const size_t rc = (size_t)(p.B * p.H * rows) * (size_t)(nch + 1);
        part = (ChunkPart<C> *)take(sizeof(ChunkPart<C>) * rc);
        P = (C *)take(sizeof(C) * rc * (size_t)p.dz);
        O = (C *)take(sizeof(C) * rc * (size_t)p.dv);
        idx = (int32_t *)take(sizeof(int32_t) * rc * (size_t)(nmax ? nmax : 1));
        val = (C *)take(sizeof(C) * rc * (size_t)(nmax ? nmax : 1));
        ticket_bytes = sizeof(unsigned) * (size_t)(groups * CHUNK_STEPS);
        ticket = (unsigned *)take(ticket_bytes);
        bytes = o;
    }
    /* the first partial of query row i of (b, h) bh */
    __device__ int64_t at(int64_t bh, int64_t i) const { return (bh * rows + i) * (nch + 1); }
    /* whether this block is the last of its group to end step `step` (every thread calls it) */
    __device__ bool last(int step) const { return block_last(ticket + grid_y() * CHUNK_STEPS + step, (unsigned)nch); }
};

/* f(row, orow) for each row of the warp that exists (warp-uniform), orow its partials' first index. */
template <typename T, class Tr, typename F>
__device__ __forceinline__ void warp_rows(const RowBlock<T, Tr> &B, const ChunkScratch<T> &D, F f) {
    for (int rr = 0; rr < 16; rr++) {
        const int row = B.w * 16 + rr;
        if (B.i0 + row >= B.p.Nq) break;
        f(row, D.at(B.bh, B.i0 + row));
    }
}

/* The moments x (0: r, 1: phi, 2: rc) of a row over the n slots pc[0 .. n): each lane joins the slots lane, lane + 32,
 * ..., then the lanes join in a fixed tree (lane l takes l + o, o = 1, 2, 4, ...); lane 0's result on every lane. */
template <typename C>
__device__ void merge_chan(const ChunkPart<C> *pc, int64_t n_, int x, int lane, double &n, double &mean, double &m2) {
    n = mean = m2 = 0.0;
    for (int64_t c = lane; c < n_; c += 32) chan_add(n, mean, m2, pc[c].n, pc[c].mom[x][0], pc[c].mom[x][2]);
    for (int o = 1; o < 32; o <<= 1) {
        const double nb = __shfl_down_sync(FULL, n, o), mb = __shfl_down_sync(FULL, mean, o),
                     qb = __shfl_down_sync(FULL, m2, o);
        if ((lane & (2 * o - 1)) == 0) chan_add(n, mean, m2, nb, mb, qb);
    }
    n = __shfl_sync(FULL, n, 0);
    mean = __shfl_sync(FULL, mean, 0);
    m2 = __shfl_sync(FULL, m2, 0);
}

/* The same moments as mean, standard deviation (unb = 1: unbiased) and M2, written to mo by lane 0. */
template <typename C>
__device__ void merge_moment(const ChunkPart<C> *pc, int64_t n_, int x, int lane, double unb, double *mo) {
    double n, mean, m2;
    merge_chan(pc, n_, x, lane, n, mean, m2);
    if (lane == 0) {
        mo[0] = mean;
        mo[1] = std_of(m2, n, unb);
        mo[2] = m2;
    }
}

/* The list of nmax rounds of the largest head of the n sorted lists from slot `from` of row orow (ties: the lower
 * key), lane l holding the lists l, l + 32, ..., l + 32 (PER - 1); the row's list in shared memory. */
template <int PER, typename T, class Tr>
__device__ void merge_list_rounds(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const ChunkScratch<T> &D,
                                  int row, int64_t orow, int64_t from, int64_t n, int32_t total) {
    using C = typename Elem<T>::C;
    const int lane = B.lane;
    const ChunkPart<C> *pc = D.part + orow + from;
    int32_t *nidx = S.list_idx(row), *cnt = S.list_cnt(row);
    C *nval = S.list_val(row);
    /* the heads of this lane's lists (value, key; none: the list is spent), read again only where one moved on */
    int32_t pos[PER] = {};
    C hv[PER] = {};
    int32_t hj[PER] = {};
    bool hx[PER] = {};
    const auto head = [&](int s) {
        const int64_t c = lane + 32 * s;
        hx[s] = c < n && pos[s] < pc[c].cnt;
        if (hx[s]) {
            const int64_t at = (orow + from + c) * D.nmax + pos[s];
            hv[s] = D.val[at];
            hj[s] = D.idx[at];
        }
    };
    ASC_UNROLL
    for (int s = 0; s < PER; s++) head(s);
    const int32_t out = total < B.nmax ? total : B.nmax;
    for (int32_t q = 0; q < out; q++) {
        /* this lane's best head: (value, key, which of its lists); none: -inf and no key */
        C bv = -inf_of<C>();
        int32_t bj = INT32_MAX, bs = -1;
        ASC_UNROLL
        for (int s = 0; s < PER; s++)
            if (hx[s] && (bs < 0 || hv[s] > bv || (hv[s] == bv && hj[s] < bj))) {
                bv = hv[s];
                bj = hj[s];
                bs = s;
            }
        C wv = bv;
        int32_t wj = bj;
        for (int o = 16; o > 0; o >>= 1) {
            const C ov = __shfl_xor_sync(FULL, wv, o);
            const int32_t oj = __shfl_xor_sync(FULL, wj, o);
            if (ov > wv || (ov == wv && oj < wj)) {
                wv = ov;
                wj = oj;
            }
        }
        ASC_UNROLL
        for (int s = 0; s < PER; s++)
            if (s == bs && bj == wj) { /* keys are unique: the winner's list moves on */
                pos[s]++;
                head(s);
            }
        if (lane == 0) {
            nidx[q] = wj;
            nval[q] = wv;
        }
    }
    if (lane == 0) *cnt = out;
    __syncwarp();
}

/*
 * The merged top-k list of a row from its n slots from `from`: the slots' lists pushed in slot order (topk_push), which
 * is what one sweep over all the keys leaves: ties keep the lower index. Each list is sorted by value, descending, ties
 * by index; so without a NaN among them (and with at most ROUND_CHUNKS lists) the same list comes from rounds of the
 * largest head (merge_list_rounds). Otherwise lane 0 pushes every entry as one sweep would.
 */
template <typename T, class Tr>
__device__ void merge_lists(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const ChunkScratch<T> &D, int row,
                            int64_t orow, int64_t from, int64_t n) {
    using C = typename Elem<T>::C;
    const int lane = B.lane;
    const ChunkPart<C> *pc = D.part + orow + from;
    bool nan = false;
    int32_t total = 0;
    for (int64_t c = lane; c < n; c += 32) {
        total += pc[c].cnt;
        const C *vc = D.val + (orow + from + c) * D.nmax;
        for (int32_t q = 0; q < pc[c].cnt; q++) nan |= vc[q] != vc[q];
    }
    total = warp_sum(total);
    const bool rounds = !__any_sync(FULL, nan);
    if (rounds && n <= 64) return merge_list_rounds<2>(B, S, D, row, orow, from, n, total);
    if (rounds && n <= ROUND_CHUNKS) return merge_list_rounds<ROUND_CHUNKS / 32>(B, S, D, row, orow, from, n, total);
    if (lane == 0) {
        int32_t *nidx = S.list_idx(row), *cnt = S.list_cnt(row);
        C *nval = S.list_val(row);
        *cnt = 0;
        for (int64_t c = 0; c < n; c++)
            for (int32_t q = 0; q < pc[c].cnt; q++) {
                const int64_t at = (orow + from + c) * D.nmax + q;
                topk_push(nidx, nval, cnt, B.nmax, D.idx[at], D.val[at]);
            }
    }
    __syncwarp();
}

/* The merge of F1's n slots from `from` into the warp's row states, centroid numerators and lists (the moments of phi
 * by Chan's rule). */
template <typename T, class Tr>
__device__ void merge_geometry(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const ChunkScratch<T> &D,
                               int64_t from, int64_t n_) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const int lane = B.lane;
    const double unb = B.paper ? 0.0 : 1.0;
    warp_rows(B, D, [&](int row, int64_t orow) {
        const ChunkPart<C> *pc = D.part + orow + from;
        RowState<C> &rs = S.rs[row];
        double rho = 0, W = 0, qz = 0, ns = 0, n, mean, m2;
        for (int64_t c = lane; c < n_; c += 32) {
            rho += pc[c].rho;
            W += pc[c].W;
            qz += pc[c].qz;
            ns += pc[c].nsoft;
        }
        rho = warp_sum(rho);
        W = warp_sum(W);
        qz = warp_sum(qz);
        ns = warp_sum(ns);
        merge_chan(pc, n_, 1, lane, n, mean, m2);
        C *Prow = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < p.dz; f += 32) {
            const C *Pc = D.P + (orow + from) * p.dz + f;
            C v = 0;
            for (int64_t c = 0; c < n_; c++, Pc += p.dz) v += *Pc;
            Prow[f] = v;
        }
        if (lane == 0) {
            rs.st[ASC_STAT_RHO] = rho;
            rs.st[ASC_STAT_WC_SUM] = W;
            rs.st[ASC_STAT_COUNT] = n;
            rs.sum.qz = qz;
            rs.nsoft = (int64_t)ns;
            rs.sum.mom[1][0] = mean;
            rs.sum.mom[1][2] = m2;
            rs.sum.mom[1][1] = std_of(m2, n, unb);
        }
        if (B.nmax) merge_lists(B, S, D, row, orow, from, n_);
        else if (lane == 0) *S.list_cnt(row) = 0;
        __syncwarp();
    });
}

/* The merge of F2's n slots from `from` (the moments of r and rc), then the rows' statistics and coefficients. */
template <typename T, class Tr>
__device__ void merge_moments(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const ChunkScratch<T> &D,
                              int64_t from, int64_t n_) {
    using C = typename Elem<T>::C;
    const double unb = B.paper ? 0.0 : 1.0;
    warp_rows(B, D, [&](int row, int64_t orow) {
        const ChunkPart<C> *pc = D.part + orow + from;
        RowState<C> &rs = S.rs[row];
        for (int x = 0; x < 3; x += 2) merge_moment(pc, n_, x, B.lane, unb, rs.sum.mom[x]);
        if (B.lane == 0) bias_stats(B, rs);
    });
    __syncwarp();
}

/* The merge of F3's n slots from `from`: the sums rescaled to the rows' maximum (flash-decoding). */
template <typename T, class Tr>
__device__ void merge_softmax(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const ChunkScratch<T> &D,
                              int64_t from, int64_t n_) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const int lane = B.lane;
    warp_rows(B, D, [&](int row, int64_t orow) {
        const ChunkPart<C> *pc = D.part + orow + from;
        C mx = -inf_of<C>();
        for (int64_t c = lane; c < n_; c += 32) mx = pc[c].mx > mx ? pc[c].mx : mx;
        mx = __shfl_sync(FULL, warp_max(mx), 0);
        /* the slot's factor e^(mx_c - mx); a slot with nothing in J(i) is left out (a NaN sum is kept) */
        auto scale = [&](int64_t c) { return pc[c].mx == mx ? (C)1 : ex(pc[c].mx - mx); };
        double l = 0, ac = 0, as = 0;
        for (int64_t c = lane; c < n_; c += 32) {
            if (pc[c].l == 0.0) continue;
            const C sc = scale(c);
            l += pc[c].l * (double)sc;
            ac += pc[c].ac * (double)sc;
            as += pc[c].as * (double)sc;
        }
        l = warp_sum(l);
        ac = warp_sum(ac);
        as = warp_sum(as);
        /* slot by slot in slot order, the factors of 32 slots formed at once (a lane each) and passed round */
        C *Orow = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < p.dv; f += 32) Orow[f] = (C)0;
        for (int64_t c0 = 0; c0 < n_; c0 += 32) {
            const bool has = c0 + lane < n_ && pc[c0 + lane].l != 0.0;
            const C mine = has ? scale(c0 + lane) : (C)0;
            for (unsigned live = __ballot_sync(FULL, has); live; live &= live - 1) {
                const int k = __ffs(live) - 1;
                const C sc = __shfl_sync(FULL, mine, k), *Oc = D.O + (orow + from + c0 + k) * p.dv;
                for (int64_t f = lane; f < p.dv; f += 32) Orow[f] += sc * Oc[f];
            }
        }
        if (lane == 0) {
            RowState<C> &rs = S.rs[row];
            rs.mx = mx;
            rs.l = l;
            rs.ac = ac;
            rs.as = as;
        }
        __syncwarp();
    });
}

/* The sweeps of a chunk: a lane per key for the decode blocks (no key stages), the tensor-core tiles otherwise. */
template <typename T, class Tr>
__device__ __forceinline__ void chunk_geometry(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, int64_t j0,
                                               int64_t j1) {
    if constexpr (Tr::STAGES == 0) dec_geometry(B, S, j0, j1);
    else sweep_geometry(B, S, j0, j1);
}
template <typename T, class Tr>
__device__ __forceinline__ void chunk_moments(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, int64_t j0,
                                              int64_t j1) {
    if constexpr (Tr::STAGES == 0) dec_moments(B, S, j0, j1);
    else sweep_moments(B, S, j0, j1, false);
}
template <typename T, class Tr>
__device__ __forceinline__ void chunk_softmax(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, int64_t j0,
                                              int64_t j1) {
    if constexpr (Tr::STAGES == 0) dec_softmax(B, S, j0, j1);
    else sweep_softmax(B, S, j0, j1);
}

/* The warp's rows' F1 state (row states, centroid numerators, lists) into slot c. */
template <typename T, class Tr>
__device__ void put_geometry(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const ChunkScratch<T> &D, int64_t c) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const int lane = B.lane;
    __syncwarp(); /* the rows written by their quads' first lanes */
    warp_rows(B, D, [&](int row, int64_t orow) {
        const int64_t at = orow + c;
        const RowState<C> &rs = S.rs[row];
        const C *Prow = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < p.dz; f += 32) D.P[at * p.dz + f] = Prow[f];
        const int32_t cnt = B.nmax ? *S.list_cnt(row) : 0;
        for (int32_t q = lane; q < cnt; q += 32) {
            D.idx[at * D.nmax + q] = S.list_idx(row)[q];
            D.val[at * D.nmax + q] = S.list_val(row)[q];
        }
        if (lane == 0) {
            ChunkPart<C> &pt = D.part[at];
            pt.rho = rs.st[ASC_STAT_RHO];
            pt.W = rs.st[ASC_STAT_WC_SUM];
            pt.qz = rs.sum.qz;
            pt.n = rs.st[ASC_STAT_COUNT];
            pt.nsoft = (double)rs.nsoft;
            for (int k = 0; k < 3; k++) pt.mom[1][k] = rs.sum.mom[1][k];
            pt.cnt = cnt;
        }
    });
}

/* The outputs of the warp's rows from the merged F1 and F2 and F3's n slots (the last block of F3). */
template <typename T, class Tr>
__device__ void chunk_outputs(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const ChunkScratch<T> &D) {
    merge_geometry(B, S, D, D.nch, 1);
    rows_geometry(B, S, true);
    merge_moments(B, S, D, D.nch, 1);
    merge_softmax(B, S, D, 0, D.nch);
    rows_output(B, S);
}

/* One step of the block of rows B.i0 .. (its warps' rows) and chunk c (every thread of the block). */
template <typename T, class Tr, int STEP>
__device__ void chunk_step(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const ChunkScratch<T> &D, int64_t c) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const int64_t j0 = c * D.chunk, j1 = j0 + D.chunk < p.N ? j0 + D.chunk : p.N, merged = D.nch;
    const int lane = B.lane;
    for (int rr = 0; rr < 16; rr++) { /* rows past Nq: a defined state for the sweeps' lanes that read it */
        RowState<C> &rs = S.rs[B.w * 16 + rr];
        if (B.i0 + B.w * 16 + rr < p.Nq) continue;
        for (int k = lane; k < (int)(sizeof(RowState<C>) / sizeof(uint32_t)); k += 32)
            reinterpret_cast<uint32_t *>(&rs)[k] = 0u;
    }
    __syncwarp();
    stage_rows(B, S);
    if (STEP == CHUNK_F1) {
        chunk_geometry(B, S, j0, j1);
        put_geometry(B, S, D, c);
        if (D.last(CHUNK_F1)) {
            merge_geometry(B, S, D, 0, D.nch);
            put_geometry(B, S, D, merged);
        }
        return;
    }
    merge_geometry(B, S, D, merged, 1);
    rows_geometry(B, S, false);
    if (STEP == CHUNK_F2) {
        /* the moments of this chunk are over its own entries */
        warp_rows(B, D, [&](int row, int64_t orow) {
            if (lane == 0) S.rs[row].st[ASC_STAT_COUNT] = D.part[orow + c].n;
        });
        __syncwarp();
        chunk_moments(B, S, j0, j1);
        __syncwarp();
        warp_rows(B, D, [&](int row, int64_t orow) {
            if (lane == 0) {
                ChunkPart<C> &pt = D.part[orow + c];
                for (int k = 0; k < 3; k++) {
                    pt.mom[0][k] = S.rs[row].sum.mom[0][k];
                    pt.mom[2][k] = S.rs[row].sum.mom[2][k];
                }
            }
        });
        if (D.last(CHUNK_F2)) {
            const double unb = B.paper ? 0.0 : 1.0;
            warp_rows(B, D, [&](int, int64_t orow) {
                ChunkPart<C> &pm = D.part[orow + merged];
                for (int x = 0; x < 3; x += 2) merge_moment(D.part + orow, D.nch, x, lane, unb, pm.mom[x]);
            });
        }
        return;
    }
    merge_moments(B, S, D, merged, 1);
    chunk_softmax(B, S, j0, j1);
    __syncwarp();
    warp_rows(B, D, [&](int row, int64_t orow) {
        const int64_t at = orow + c;
        const C *Orow = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < p.dv; f += 32) D.O[at * p.dv + f] = Orow[f];
        if (lane == 0) {
            ChunkPart<C> &pt = D.part[at];
            pt.mx = S.rs[row].mx;
            pt.l = S.rs[row].l;
            pt.ac = S.rs[row].ac;
            pt.as = S.rs[row].as;
        }
    });
    if (D.last(CHUNK_F3)) chunk_outputs(B, S, D);
}

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_CHUNKS_CUH */
