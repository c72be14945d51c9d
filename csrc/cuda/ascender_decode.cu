/*
 * ascender_decode.cu -- the CUDA forward of a call that is not differentiated and has few query rows
 * (Nq <= 8: generation; docs/decode.md, docs/cuda.md "Decode"): the forward's three sweeps split over chunks
 * of keys sized per call (split-K, dec_chunk), a block of one warp per (b, h, chunk) taking the call's rows in
 * turn with a lane per key (decode_sweeps.cuh), each sweep's partial states merged per row over the chunks.
 * Four launches, no key preparation (each lane forms its key's norms from the one read of its rows):
 *   dec_kernel<A>  F1 per chunk                        -> partial sums, moments of phi, top-k lists
 *   dec_kernel<B>  merge F1; F2 per chunk               -> moments of r and rc
 *   dec_kernel<C>  merge F1, F2; F3 per chunk           -> softmax partials (max, sums, output numerator)
 *   dec_kernel<D>  merge F1, F2, F3; the outputs
 * The values agree with the tiled forward's to rounding, not bit for bit (the CPU's decode kernel has the same
 * property): the backward must take the forward of ascender_fwd.cu, as the binding arranges.
 */
#include "decode_sweeps.cuh"
#include "tiled.h"

namespace asc {
namespace tiled {

enum { DEC_A = 0, DEC_B, DEC_C, DEC_D };

/* What one (row, chunk) leaves for the merges. */
template <typename C> struct DecPart {
    double rho, W, qz, n, nsoft;
    double mom[3][3]; /* mean, std, sum of squared deviations of r (B), phi (A), rc (B) over the chunk */
    double l, ac, as; /* C */
    C mx;
    int32_t cnt;      /* A: entries of the chunk's top-k list */
};

/* Chunks whose top-k lists the warp merges by rounds (two per lane); more take the pushes. */
constexpr int DEC_ROUND_CHUNKS = 64;

/* One-warp blocks of a sweep that fill the device (an H100 / H200 holds about 8 per SM of 132). */
constexpr int64_t DEC_BLOCKS = 1024;

/* Keys per chunk of a call: about DEC_BLOCKS blocks for all (b, h), at most DEC_ROUND_CHUNKS chunks per (b, h)
 * (every block of a sweep merges all of them), a multiple of DEC_KEYS, at most DEC_CHUNK. */
inline int64_t dec_chunk(const asc_params &p) {
    const auto whole = [](int64_t n) { return (n + DEC_KEYS - 1) / DEC_KEYS * DEC_KEYS; };
    const int64_t fill = whole((p.N * p.B * p.H + DEC_BLOCKS - 1) / DEC_BLOCKS);
    const int64_t few = whole((p.N + DEC_ROUND_CHUNKS - 1) / DEC_ROUND_CHUNKS);
    const int64_t c = fill > few ? fill : few;
    return c < DEC_CHUNK ? c : DEC_CHUNK;
}

/* Scratch of one decode call: [rows][chunks] partials, their vectors and lists. */
template <typename T> struct DecScratch {
    using C = typename Elem<T>::C;
    KeyPrep<T> kp;
    DecPart<C> *part;
    C *P;       /* [rows][nch][dz] the centroid numerators */
    C *O;       /* [rows][nch][dv] the output numerators */
    int32_t *idx;
    C *val;     /* [rows][nch][nmax] */
    int64_t chunk, nch, nmax; /* keys per chunk, chunks per (b, h), list entries */
    size_t bytes;
    void place(const asc_params &p, const asc_fwd_args &a, char *base) {
        kp.place(p, a, base, Tiles<T>::Dec::BN, true);
        size_t o = kp.bytes;
        auto take = [&](size_t n) -> char * {
            const size_t at = o;
            o += (n + 255) / 256 * 256;
            return base ? base + at : nullptr;
        };
        const size_t rows = (size_t)(p.B * p.H * p.Nq);
        chunk = dec_chunk(p);
        nch = (p.N + chunk - 1) / chunk;
        nmax = p.variant == ASC_VARIANT_PAPER ? p.n_nbr : 0;
        const size_t rc = rows * (size_t)nch;
        part = (DecPart<C> *)take(sizeof(DecPart<C>) * rc);
        P = (C *)take(sizeof(C) * rc * (size_t)p.dz);
        O = (C *)take(sizeof(C) * rc * (size_t)p.dv);
        idx = (int32_t *)take(sizeof(int32_t) * rc * (size_t)(nmax ? nmax : 1));
        val = (C *)take(sizeof(C) * rc * (size_t)(nmax ? nmax : 1));
        bytes = o;
    }
};

/* The moments x (0: r, 1: phi, 2: rc) of a row over every chunk: each lane joins the chunks lane, lane + 32, ...,
 * then the lanes join in a fixed tree (lane l takes l + o, o = 1, 2, 4, ...); lane 0's result on every lane. */
template <typename C>
__device__ void merge_chan(const DecPart<C> *pc, int64_t nch, int x, int lane, double &n, double &mean, double &m2) {
    n = mean = m2 = 0.0;
    for (int64_t c = lane; c < nch; c += 32) chan_add(n, mean, m2, pc[c].n, pc[c].mom[x][0], pc[c].mom[x][2]);
    for (int o = 1; o < 32; o <<= 1) {
        const double nb = __shfl_down_sync(FULL, n, o), mb = __shfl_down_sync(FULL, mean, o),
                     qb = __shfl_down_sync(FULL, m2, o);
        if ((lane & (2 * o - 1)) == 0) chan_add(n, mean, m2, nb, mb, qb);
    }
    n = __shfl_sync(FULL, n, 0);
    mean = __shfl_sync(FULL, mean, 0);
    m2 = __shfl_sync(FULL, m2, 0);
}

/*
 * The merged top-k list of a row: the chunks' lists pushed in chunk order (topk_push), which is what one sweep
 * over all the keys leaves: ties keep the lower index. Each chunk's list is sorted by value, descending, ties by
 * index; so without a NaN among them (and with at most DEC_ROUND_CHUNKS chunks) the same list comes from nmax
 * rounds of the largest head of the chunks' lists (ties: the lower chunk, the lower key), the warp's lanes
 * holding two chunks each. Otherwise lane 0 pushes every entry as one sweep would.
 */
template <typename T, class Tr>
__device__ void merge_lists(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const DecScratch<T> &D, int row) {
    using C = typename Elem<T>::C;
    const int lane = B.lane;
    const int64_t orow = B.bh * B.p.Nq + row;
    const DecPart<C> *pc = D.part + orow * D.nch;
    int32_t *nidx = S.list_idx(row), *cnt = S.list_cnt(row);
    C *nval = S.list_val(row);
    bool nan = false;
    int32_t total = 0;
    for (int64_t c = lane; c < D.nch; c += 32) {
        total += pc[c].cnt;
        for (int32_t q = 0; q < pc[c].cnt; q++) {
            const C v = D.val[(orow * D.nch + c) * D.nmax + q];
            nan |= v != v;
        }
    }
    total = warp_sum(total);
    if (__any_sync(FULL, nan) || D.nch > DEC_ROUND_CHUNKS) {
        if (lane == 0) {
            *cnt = 0;
            for (int64_t c = 0; c < D.nch; c++)
                for (int32_t q = 0; q < pc[c].cnt; q++) {
                    const int64_t at = (orow * D.nch + c) * D.nmax + q;
                    topk_push(nidx, nval, cnt, B.nmax, D.idx[at], D.val[at]);
                }
        }
        __syncwarp();
        return;
    }
    const int64_t ch[2] = {lane, lane + 32};
    int32_t pos[2] = {0, 0};
    const int32_t out = total < B.nmax ? total : B.nmax;
    for (int32_t q = 0; q < out; q++) {
        /* this lane's best head: (value, key, which of its chunks); none: -inf and no key */
        C bv = -inf_of<C>();
        int32_t bj = INT32_MAX, bs = -1;
        for (int s = 0; s < 2; s++) {
            if (ch[s] >= D.nch || pos[s] >= pc[ch[s]].cnt) continue;
            const int64_t at = (orow * D.nch + ch[s]) * D.nmax + pos[s];
            const C v = D.val[at];
            const int32_t j = D.idx[at];
            if (bs < 0 || v > bv || (v == bv && j < bj)) {
                bv = v;
                bj = j;
                bs = s;
            }
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
        if (bs >= 0 && bj == wj) pos[bs]++; /* keys are unique: the lane that held the winner moves on */
        if (lane == 0) {
            nidx[q] = wj;
            nval[q] = wv;
        }
    }
    if (lane == 0) *cnt = out;
    __syncwarp();
}

/* The merge of F1's partials of every chunk into the block's row state, centroid numerator and lists (the
 * moments of phi by Chan's rule). */
template <typename T, class Tr>
__device__ void merge_geometry(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const DecScratch<T> &D) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const int lane = B.lane;
    const double unb = B.paper ? 0.0 : 1.0;
    for (int row = 0; row < p.Nq; row++) {
        const int64_t orow = B.bh * p.Nq + row;
        const DecPart<C> *pc = D.part + orow * D.nch;
        RowState<C> &rs = S.rs[row];
        double rho = 0, W = 0, qz = 0, ns = 0, n, mean, m2;
        for (int64_t c = lane; c < D.nch; c += 32) {
            rho += pc[c].rho;
            W += pc[c].W;
            qz += pc[c].qz;
            ns += pc[c].nsoft;
        }
        rho = warp_sum(rho);
        W = warp_sum(W);
        qz = warp_sum(qz);
        ns = warp_sum(ns);
        merge_chan(pc, D.nch, 1, lane, n, mean, m2);
        C *Prow = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < p.dz; f += 32) {
            C v = 0;
            for (int64_t c = 0; c < D.nch; c++) v += D.P[(orow * D.nch + c) * p.dz + f];
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
        if (B.nmax) merge_lists(B, S, D, row);
        else if (lane == 0) *S.list_cnt(row) = 0;
        __syncwarp();
    }
}

/* The merge of F2's partials (the moments of r and rc). */
template <typename T, class Tr>
__device__ void merge_moments(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const DecScratch<T> &D) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const double unb = B.paper ? 0.0 : 1.0;
    for (int row = 0; row < p.Nq; row++) {
        const DecPart<C> *pc = D.part + (B.bh * p.Nq + row) * D.nch;
        RowState<C> &rs = S.rs[row];
        for (int x = 0; x < 3; x += 2) {
            double n, mean, m2;
            merge_chan(pc, D.nch, x, B.lane, n, mean, m2);
            if (B.lane == 0) {
                rs.sum.mom[x][0] = mean;
                rs.sum.mom[x][2] = m2;
                rs.sum.mom[x][1] = std_of(m2, n, unb);
            }
        }
        if (B.lane == 0) bias_stats(B, rs);
    }
}

/* The merge of F3's partials: the chunks' sums rescaled to the rows' maximum (flash-decoding). */
template <typename T, class Tr>
__device__ void merge_softmax(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const DecScratch<T> &D) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const int lane = B.lane;
    for (int row = 0; row < p.Nq; row++) {
        const int64_t orow = B.bh * p.Nq + row;
        const DecPart<C> *pc = D.part + orow * D.nch;
        C mx = -inf_of<C>();
        for (int64_t c = lane; c < D.nch; c += 32) mx = pc[c].mx > mx ? pc[c].mx : mx;
        mx = __shfl_sync(FULL, warp_max(mx), 0);
        /* the chunk's factor e^(mx_c - mx); a chunk with nothing in J(i) is left out (a NaN sum is kept) */
        auto scale = [&](int64_t c) { return pc[c].mx == mx ? (C)1 : ex(pc[c].mx - mx); };
        double l = 0, ac = 0, as = 0;
        for (int64_t c = lane; c < D.nch; c += 32) {
            if (pc[c].l == 0.0) continue;
            const C sc = scale(c);
            l += pc[c].l * (double)sc;
            ac += pc[c].ac * (double)sc;
            as += pc[c].as * (double)sc;
        }
        l = warp_sum(l);
        ac = warp_sum(ac);
        as = warp_sum(as);
        C *Orow = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < p.dv; f += 32) {
            C o = 0;
            for (int64_t c = 0; c < D.nch; c++)
                if (pc[c].l != 0.0) o += scale(c) * D.O[(orow * D.nch + c) * p.dv + f];
            Orow[f] = o;
        }
        if (lane == 0) {
            RowState<C> &rs = S.rs[row];
            rs.mx = mx;
            rs.l = l;
            rs.ac = ac;
            rs.as = as;
        }
        __syncwarp();
    }
}

template <typename T, int STEP>
__global__ void __launch_bounds__(32) dec_kernel(const __grid_constant__ asc_params p,
                                                 const __grid_constant__ asc_fwd_args a,
                                                 const __grid_constant__ DecScratch<T> D) {
    using C = typename Elem<T>::C;
    using Tr = typename Tiles<T>::Dec;
    ASC_DYNAMIC_SMEM(smem);
    FwdSmem<T, Tr> S;
    S.place(smem, p);
    const RowBlock<T, Tr> B(p, a, D.kp, (int64_t)blockIdx.y, 0);
    const int64_t c = blockIdx.x, j0 = c * D.chunk, j1 = j0 + D.chunk < p.N ? j0 + D.chunk : p.N;
    const int lane = B.lane;
    stage_rows(B, S);
    if (STEP == DEC_A) {
        dec_geometry(B, S, j0, j1);
        for (int row = 0; row < p.Nq; row++) {
            const int64_t orow = B.bh * p.Nq + row, at = orow * D.nch + c;
            const RowState<C> &rs = S.rs[row];
            const C *Prow = S.O + (int64_t)row * S.ldo;
            for (int64_t f = lane; f < p.dz; f += 32) D.P[at * p.dz + f] = Prow[f];
            const int32_t cnt = *S.list_cnt(row);
            for (int32_t q = lane; q < cnt; q += 32) {
                D.idx[at * D.nmax + q] = S.list_idx(row)[q];
                D.val[at * D.nmax + q] = S.list_val(row)[q];
            }
            if (lane == 0) {
                DecPart<C> &pt = D.part[at];
                pt.rho = rs.st[ASC_STAT_RHO];
                pt.W = rs.st[ASC_STAT_WC_SUM];
                pt.qz = rs.sum.qz;
                pt.n = rs.st[ASC_STAT_COUNT];
                pt.nsoft = (double)rs.nsoft;
                for (int k = 0; k < 3; k++) pt.mom[1][k] = rs.sum.mom[1][k];
                pt.cnt = B.nmax ? cnt : 0;
            }
        }
        return;
    }
    merge_geometry(B, S, D);
    rows_geometry(B, S, STEP == DEC_D);
    if (STEP == DEC_B) {
        for (int row = lane; row < p.Nq; row += 32) /* the moments of this chunk are over its own entries */
            S.rs[row].st[ASC_STAT_COUNT] = D.part[(B.bh * p.Nq + row) * D.nch + c].n;
        __syncwarp();
        dec_moments(B, S, j0, j1);
        if (lane == 0)
            for (int row = 0; row < p.Nq; row++) {
                DecPart<C> &pt = D.part[(B.bh * p.Nq + row) * D.nch + c];
                for (int k = 0; k < 3; k++) {
                    pt.mom[0][k] = S.rs[row].sum.mom[0][k];
                    pt.mom[2][k] = S.rs[row].sum.mom[2][k];
                }
            }
        return;
    }
    merge_moments(B, S, D);
    __syncwarp();
    if (STEP == DEC_C) {
        dec_softmax(B, S, j0, j1);
        for (int row = 0; row < p.Nq; row++) {
            const int64_t at = (B.bh * p.Nq + row) * D.nch + c;
            const C *Orow = S.O + (int64_t)row * S.ldo;
            for (int64_t f = lane; f < p.dv; f += 32) D.O[at * p.dv + f] = Orow[f];
            if (lane == 0) {
                DecPart<C> &pt = D.part[at];
                pt.mx = S.rs[row].mx;
                pt.l = S.rs[row].l;
                pt.ac = S.rs[row].ac;
                pt.as = S.rs[row].as;
            }
        }
        return;
    }
    merge_softmax(B, S, D);
    rows_output(B, S);
}

/* Whether a call takes the decode kernels (ASC_DECODE_ROWS of the CPU kernels: 8; options the tiled kernels
 * implement, tiled.h; their shared memory on the current device). */
template <typename T> bool decode_applies(const asc_params &p, const asc_fwd_args &a) {
    if (p.Nq > 8 || a.map_attn || !asc_tiled_options(&p, &a)) return false;
    FwdSmem<T, typename Tiles<T>::Dec> S;
    S.place(nullptr, p);
    return smem_fits((long)S.bytes);
}

template <typename T>
static cudaError_t decode(const asc_params &p, const asc_fwd_args &a, cudaStream_t stream) {
    using Tr = typename Tiles<T>::Dec;
    if (p.B * p.H > 65535) return cudaErrorInvalidConfiguration;
    FwdSmem<T, Tr> S;
    S.place(nullptr, p);
    cudaError_t e;
    void (*const steps[4])(asc_params, asc_fwd_args, DecScratch<T>) = {dec_kernel<T, DEC_A>, dec_kernel<T, DEC_B>,
                                                                      dec_kernel<T, DEC_C>, dec_kernel<T, DEC_D>};
    for (int k = 0; k < 4; k++)
        if ((e = prepare_smem(steps[k], (long)S.bytes)) != cudaSuccess) return e;
    DecScratch<T> D;
    D.place(p, a, nullptr);
    char *base = nullptr;
    if ((e = scratch_alloc(&base, D.bytes, stream)) != cudaSuccess) return e;
    D.place(p, a, base);
    e = prepare_keys(p, a, D.kp, stream);
    for (int k = 0; k < 4 && e == cudaSuccess; k++)
        e = launch(steps[k], dim3(k == DEC_D ? 1u : (unsigned)D.nch, (unsigned)(p.B * p.H)), dim3(32), (size_t)S.bytes,
                   stream, p, a, D);
    const cudaError_t f = scratch_free(base, stream);
    return e != cudaSuccess ? e : f;
}

/* The decode kernels where they apply, else ascender_cuda_fwd. */
template <typename T> static int infer(const asc_params &p, const asc_fwd_args &a, int dtype, cudaStream_t stream) {
    return decode_applies<T>(p, a) ? (int)decode<T>(p, a, stream) : ascender_cuda_fwd(&p, &a, dtype, stream);
}

}  // namespace tiled
}  // namespace asc

/* The forward of a call whose result is not differentiated: few query rows take the decode kernels, the
 * others (and the inspection maps) ascender_cuda_fwd. */
extern "C" int ascender_cuda_infer(const asc_params *p, const asc_fwd_args *a, int dtype, cudaStream_t stream) {
    if (p->N == 0 || p->Nq == 0 || p->B * p->H == 0) return 0;
    switch (dtype) {
        case ASC_CUDA_F32: return asc::tiled::infer<float>(*p, *a, dtype, stream);
        case ASC_CUDA_F64: return asc::tiled::infer<double>(*p, *a, dtype, stream);
        case ASC_CUDA_F16: return asc::tiled::infer<__half>(*p, *a, dtype, stream);
        case ASC_CUDA_BF16: return asc::tiled::infer<__nv_bfloat16>(*p, *a, dtype, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
