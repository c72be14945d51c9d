/*
 * ascender_decode.cu -- the CUDA forward of a call that is not differentiated and has few query rows
 * (Nq <= 8: generation; docs/decode.md, docs/cuda.md "Decode"): the forward's three sweeps split over chunks
 * of DEC_CHUNK keys (split-K), a block of one warp per (b, h, chunk) holding all the call's rows, each sweep's
 * partial states merged per row in chunk order. Four launches, no key preparation (each key tile prepares its
 * own norms from the one read of the cache):
 *   dec_kernel<A>  F1 per chunk                        -> partial sums, moments of phi, top-k lists
 *   dec_kernel<B>  merge F1; F2 per chunk               -> moments of r and rc
 *   dec_kernel<C>  merge F1, F2; F3 per chunk           -> softmax partials (max, sums, output numerator)
 *   dec_kernel<D>  merge F1, F2, F3; the outputs
 * The values agree with the tiled forward's to rounding, not bit for bit (the CPU's decode kernel has the same
 * property): the backward must take the forward of ascender_fwd.cu, as the binding arranges.
 */
#include "forward.cuh"
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

/* Scratch of one decode call: [rows][chunks] partials, their vectors and lists. */
template <typename T> struct DecScratch {
    using C = typename Elem<T>::C;
    KeyPrep<T> kp;
    DecPart<C> *part;
    C *P;       /* [rows][nch][dz] the centroid numerators */
    C *O;       /* [rows][nch][dv] the output numerators */
    int32_t *idx;
    C *val;     /* [rows][nch][nmax] */
    int64_t nch, nmax;
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
        nch = (p.N + DEC_CHUNK - 1) / DEC_CHUNK;
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

/* The merge of F1's partials of every chunk into the block's row state, centroid numerator and lists (the
 * moments of phi by Chan's rule, the lists pushed in chunk order: ties keep the lower index, as in one sweep). */
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
        double rho = 0, W = 0, qz = 0, n = 0, ns = 0, mean = 0, m2 = 0;
        for (int64_t c = 0; c < D.nch; c++) {
            rho += pc[c].rho;
            W += pc[c].W;
            qz += pc[c].qz;
            ns += pc[c].nsoft;
            const double nb = pc[c].n;
            if (nb > 0) { /* Chan et al.: (n, mean, M2) of two parts */
                const double nt = n + nb, dl = pc[c].mom[1][0] - mean;
                mean += dl * nb / nt;
                m2 += pc[c].mom[1][2] + dl * dl * n * nb / nt;
                n = nt;
            }
        }
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
            rs.qz = qz;
            rs.nsoft = (int64_t)ns;
            rs.mom[1][0] = mean;
            rs.mom[1][2] = m2;
            rs.mom[1][1] = n > 1 ? sqrt(m2 / (n - unb)) : 0.0;
            int32_t *cnt = S.ncnt + row;
            *cnt = 0;
            for (int64_t c = 0; c < D.nch; c++)
                for (int32_t q = 0; q < pc[c].cnt; q++) {
                    const int64_t at = (orow * D.nch + c) * D.nmax + q;
                    topk_push(S.nidx + (int64_t)row * B.nmax, S.nval + (int64_t)row * B.nmax, cnt, B.nmax, D.idx[at],
                              D.val[at]);
                }
        }
        __syncwarp();
    }
}

/* The merge of F2's partials (the moments of r and rc). */
template <typename T, class Tr>
__device__ void merge_moments(const RowBlock<T, Tr> &B, const FwdSmem<T, Tr> &S, const DecScratch<T> &D) {
    using C = typename Elem<T>::C;
    const asc_params &p = B.p;
    const double unb = B.paper ? 0.0 : 1.0;
    if (B.lane != 0) return;
    for (int row = 0; row < p.Nq; row++) {
        const DecPart<C> *pc = D.part + (B.bh * p.Nq + row) * D.nch;
        RowState<C> &rs = S.rs[row];
        for (int x = 0; x < 3; x += 2) {
            double n = 0, mean = 0, m2 = 0;
            for (int64_t c = 0; c < D.nch; c++) {
                const double nb = pc[c].n;
                if (nb > 0) {
                    const double nt = n + nb, dl = pc[c].mom[x][0] - mean;
                    mean += dl * nb / nt;
                    m2 += pc[c].mom[x][2] + dl * dl * n * nb / nt;
                    n = nt;
                }
            }
            rs.mom[x][0] = mean;
            rs.mom[x][2] = m2;
            rs.mom[x][1] = n > 1 ? sqrt(m2 / (n - unb)) : 0.0;
        }
        bias_stats(B, rs);
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
        for (int64_t c = 0; c < D.nch; c++) mx = pc[c].mx > mx ? pc[c].mx : mx;
        double l = 0, ac = 0, as = 0;
        C *Orow = S.O + (int64_t)row * S.ldo;
        for (int64_t f = lane; f < p.dv; f += 32) Orow[f] = (C)0;
        for (int64_t c = 0; c < D.nch; c++) {
            if (pc[c].l == 0.0) continue; /* nothing in J(i) there (a NaN sum is kept) */
            const C sc = pc[c].mx == mx ? (C)1 : ex(pc[c].mx - mx);
            l += pc[c].l * (double)sc;
            ac += pc[c].ac * (double)sc;
            as += pc[c].as * (double)sc;
            for (int64_t f = lane; f < p.dv; f += 32) Orow[f] += sc * D.O[(orow * D.nch + c) * p.dv + f];
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
    const int64_t c = blockIdx.x, j0 = c * DEC_CHUNK, j1 = j0 + DEC_CHUNK < p.N ? j0 + DEC_CHUNK : p.N;
    const int lane = B.lane;
    stage_rows(B, S);
    if (STEP == DEC_A) {
        sweep_geometry(B, S, j0, j1);
        __syncwarp(); /* row r's sums were written by its quad's first lane, 4 (r mod 8), not by lane 0 */
        for (int row = 0; row < p.Nq; row++) {
            const int64_t orow = B.bh * p.Nq + row, at = orow * D.nch + c;
            const RowState<C> &rs = S.rs[row];
            const C *Prow = S.O + (int64_t)row * S.ldo;
            for (int64_t f = lane; f < p.dz; f += 32) D.P[at * p.dz + f] = Prow[f];
            const int32_t cnt = S.ncnt[row];
            for (int32_t q = lane; q < cnt; q += 32) {
                D.idx[at * D.nmax + q] = S.nidx[(int64_t)row * B.nmax + q];
                D.val[at * D.nmax + q] = S.nval[(int64_t)row * B.nmax + q];
            }
            if (lane == 0) {
                DecPart<C> &pt = D.part[at];
                pt.rho = rs.st[ASC_STAT_RHO];
                pt.W = rs.st[ASC_STAT_WC_SUM];
                pt.qz = rs.qz;
                pt.n = rs.st[ASC_STAT_COUNT];
                pt.nsoft = (double)rs.nsoft;
                for (int k = 0; k < 3; k++) pt.mom[1][k] = rs.mom[1][k];
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
        sweep_moments(B, S, j0, j1);
        __syncwarp(); /* as after F1: the rows' moments come from their quads' first lanes */
        if (lane == 0)
            for (int row = 0; row < p.Nq; row++) {
                DecPart<C> &pt = D.part[(B.bh * p.Nq + row) * D.nch + c];
                for (int k = 0; k < 3; k++) {
                    pt.mom[0][k] = S.rs[row].mom[0][k];
                    pt.mom[2][k] = S.rs[row].mom[2][k];
                }
            }
        return;
    }
    merge_moments(B, S, D);
    __syncwarp();
    if (STEP == DEC_C) {
        sweep_softmax(B, S, j0, j1);
        __syncwarp(); /* the rows' softmax state and output sums, written by their quads */
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
 * implement, tiled.h). */
inline bool decode_applies(const asc_params &p, const asc_fwd_args &a) {
    return p.Nq <= 8 && !a.map_attn && asc_tiled_options(&p, &a);
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
    if ((e = cudaMallocAsync((void **)&base, D.bytes, stream)) != cudaSuccess) return e;
    D.place(p, a, base);
    e = prepare_keys(p, a, D.kp, stream);
    for (int k = 0; k < 4 && e == cudaSuccess; k++)
        e = launch(steps[k], dim3(k == DEC_D ? 1u : (unsigned)D.nch, (unsigned)(p.B * p.H)), dim3(32), (size_t)S.bytes,
                   stream, p, a, D);
    const cudaError_t f = cudaFreeAsync(base, stream);
    return e != cudaSuccess ? e : f;
}

}  // namespace tiled
}  // namespace asc

/* The forward of a call whose result is not differentiated: few query rows take the decode kernels, the
 * others (and the inspection maps) ascender_cuda_fwd. */
extern "C" int ascender_cuda_infer(const asc_params *p, const asc_fwd_args *a, int dtype, cudaStream_t stream) {
    if (p->N == 0 || p->Nq == 0 || p->B * p->H == 0) return 0;
    if (!asc::tiled::decode_applies(*p, *a)) return ascender_cuda_fwd(p, a, dtype, stream);
    switch (dtype) {
        case ASC_CUDA_F32: return (int)asc::tiled::decode<float>(*p, *a, stream);
        case ASC_CUDA_F64: return (int)asc::tiled::decode<double>(*p, *a, stream);
        case ASC_CUDA_F16: return (int)asc::tiled::decode<__half>(*p, *a, stream);
        case ASC_CUDA_BF16: return (int)asc::tiled::decode<__nv_bfloat16>(*p, *a, stream);
        default: return (int)cudaErrorInvalidValue;
    }
}
