/*
 * kernel_traits.cuh -- the compile-time shape of the tensor-core ASCender kernels (docs/cuda.md, "The
 * tensor-core kernels: the GPU tile plan"): the tile sizes and warps of each kernel family, and per
 * element type its compute type and whether its pair products run on the tensor cores.
 */
#ifndef ASCENDER_CUDA_KERNEL_TRAITS_CUH
#define ASCENDER_CUDA_KERNEL_TRAITS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

/* Loop unrolling hints for nvcc (the emulator's g++ unrolls as it sees fit, except in the cost build,
 * which unrolls as nvcc does: docs/cuda.md, "Issued instructions"). */
#ifdef __CUDACC__
#define ASC_UNROLL _Pragma("unroll")
#define ASC_NOUNROLL _Pragma("unroll 1")
#elif defined(ASC_EMU_COST)
#define ASC_UNROLL _Pragma("GCC unroll 64")
#define ASC_NOUNROLL _Pragma("GCC unroll 1")
#else
#define ASC_UNROLL
#define ASC_NOUNROLL
#endif

namespace asc {
namespace tiled {

/* Per element type: C, the type everything is computed and accumulated in, and kMma: the products
 * run as mma.sync m16n8k16 on operands of the element type (fp32 accumulation); otherwise (float32,
 * float64) each lane forms the same accumulator entries by fused multiply-adds in C (the FFMA path). */
template <typename T> struct Elem;
template <> struct Elem<__nv_bfloat16> { using C = float; static constexpr bool kMma = true; };
template <> struct Elem<__half> { using C = float; static constexpr bool kMma = true; };
template <> struct Elem<float> { using C = float; static constexpr bool kMma = false; };
template <> struct Elem<double> { using C = double; static constexpr bool kMma = false; };

/* The row-major kernels (forward sweeps, maps, backward B1 and B2r, decode chunks): a block of BM query
 * rows, NW warps of WM = 16 rows each (one m16 tile per warp), key tiles of BN keys (NT n8 tiles), STAGES
 * key tiles in flight (double-buffered cp.async on the mma path; the FFMA path copies synchronously). */
template <int NW_, int STAGES_> struct RowTiles {
    static constexpr int NW = NW_;
    static constexpr int WM = 16;
    static constexpr int BM = NW * WM;
    static constexpr int BN = 32;
    static constexpr int NT = BN / 8;
    static constexpr int THREADS = NW * 32;
    static constexpr int STAGES = STAGES_;
};

/* The key-major kernel (backward B2c): a block of KB keys, query tiles of QB rows, WR x WC warps over the
 * (query, key) pair tile of a step (16 x 16 each: NT = 2 n8 tiles of keys), STAGES query tiles in flight. */
template <int QB_, int KB_, int WR_, int WC_, int STAGES_> struct ColTiles {
    static constexpr int QB = QB_;
    static constexpr int KB = KB_;
    static constexpr int WR = WR_;
    static constexpr int WC = WC_;
    static constexpr int NW = WR * WC;
    static constexpr int NT = 2;
    static constexpr int THREADS = NW * 32;
    static constexpr int STAGES = STAGES_;
};

/* The shapes per element type: bf16 / fp16 (the tensor cores) as the plan says (docs/cuda.md); the FFMA
 * types in smaller blocks, since their tiles hold 4- and 8-byte values (float64 exists for gradcheck:
 * correct, not fast), and one stage. The backward's B1 and B2c take one stage on the mma path too: that
 * lets two blocks share an SM at the benchmark's sizes, and the other block computes while one copies
 * (docs/cuda.md, "Two blocks per SM for the backward"). */
template <typename T> struct Tiles {
    static constexpr bool mma = Elem<T>::kMma;
    using Row = RowTiles<mma ? 4 : (sizeof(T) == 8 ? 1 : 2), mma ? 2 : 1>;
    using B1 = RowTiles<Row::NW, 1>;
    /* B2r: three warps and one key stage on the mma path. Its per-warp state (16 rows of ten row operands, the
     * fp32 accumulators du | dz | dh^ | dq, the rows' constants: 29,440 / 31,744 bytes seed / paper at the
     * benchmark's sizes) puts four warps over the two-block limit; three with one stage fit twice (6 warps per
     * SM against 4: docs/cuda.md, "B2r at three warps per block"). */
    using B2r = RowTiles<mma ? 3 : Row::NW, 1>;
    /* Wide rows: the forward and B1 where an SM holds only one block of their standard shape (d = dv = 128: shared
     * memory), three warps and one key stage, two blocks per SM as B2r (4 -> 6 warps; docs/cuda.md, "Wide rows: the
     * forward and B1 at three warps"). The FFMA types keep their shapes (B2rW too). */
    using RowW = typename std::conditional<mma, RowTiles<3, 1>, Row>::type;
    using B1W = typename std::conditional<mma, RowTiles<3, 1>, B1>::type;
    /* B2r's shape for wide heads: two warps, where an SM holds one block of three (d = dv = 128, seed: 3 -> 4 warps per
     * SM; docs/cuda.md, "B2r at two warps for wide heads"). */
    using B2rW = typename std::conditional<mma, RowTiles<2, 1>, B2r>::type;
    using Col = typename std::conditional<sizeof(T) == 8, ColTiles<16, 16, 1, 1, 1>, ColTiles<32, 32, 2, 2, 1>>::type;
    /* B2c's narrow shape: 16 keys a block, their fp32 accumulators and key tiles half as large, query tiles of 48 rows
     * over three warps. It runs where it gives an SM more warps than the standard block (runs_wide): where that does
     * not fit at all (d = dv = 256 on an H100 or H200, 160 on an A100) and where it fits alone and two narrow ones do
     * (d = dv = 96 seed, 80 paper on an H100; 48 seed on an A100; docs/cuda.md, "B2c in narrow key blocks"). The FFMA
     * types keep theirs. */
    using ColW = typename std::conditional<mma, ColTiles<48, 16, 3, 1, 1>, Col>::type;
    using Dec = RowTiles<1, 0>; /* decode: the call's rows (Nq <= 8) in one warp, a lane per key, no key stages */
};

/* The most keys per CUDA decode chunk (the chunk is sized per call: dec_chunk in ascender_decode.cu; the CPU
 * decode kernel's DC = 512, docs/decode.md). */
constexpr int DEC_CHUNK = 512;

}  // namespace tiled
}  // namespace asc

#endif /* ASCENDER_CUDA_KERNEL_TRAITS_CUH */
