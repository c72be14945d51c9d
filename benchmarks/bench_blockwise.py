"""The three backends of ascender_attention side by side: block-wise (PyTorch ops, one block of
query rows at a time), fused (the C kernels) and dense (the twin), forward and forward+backward,
time and peak memory, one run.

One ASCenderHead problem (B = 1, d_model = 256, d_head = 64: d = dv = 64, dz = da = 32),
float32 unless --dtype says otherwise; median of --repeats; ratios from the same run. Peak memory
is resident memory above what the process held before the call (inputs excluded). The dense twin
runs up to --dense-max-n; above it its peak is extrapolated from the largest measured one (it
grows as N^2) and marked "(est.)". On a CUDA machine pass --device cuda (peak memory then comes
from torch.cuda.max_memory_allocated).

glibc's malloc raises its mmap threshold each time a large block is freed, after which the many
tensors of one block-wise block come from the heap and the freed ones stay resident: the process's
peak RSS then grows like N^2 (1.6 GiB at N = 4096) although the live tensors stay O(block x N)
(55 MiB). The script fixes the threshold (mallopt M_MMAP_THRESHOLD, --mmap-threshold, 64 KiB by
default; MALLOC_MMAP_THRESHOLD_=65536 in the environment does the same for any program), so the
peaks below are what the backends hold; --mmap-threshold 0 keeps glibc's default.

    python benchmarks/bench_blockwise.py [--sizes 1024 2048 4096 8192 16384] [--repeats 3]
        [--variant seed] [--block-memory BYTES] [--dense-max-n 2048] [--device cpu]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform

import torch

from ascender_torch import ascender_attention
from ascender_torch.backends import attention_backend

from _measure import forward_backward, median_seconds, peak_mib, print_table
from bench_forward import problem


def peak(fn, device: str) -> float:
    if device == "cpu":
        return peak_mib(fn)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2 ** 20


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variant", default="seed", choices=["seed", "paper"])
    ap.add_argument("--block-memory", type=int, default=None)
    ap.add_argument("--dense-max-n", type=int, default=2048)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    ap.add_argument("--mmap-threshold", type=int, default=65536)
    args = ap.parse_args()
    if args.mmap_threshold:
        ctypes.CDLL("libc.so.6").mallopt(-3, args.mmap_threshold)  # M_MMAP_THRESHOLD
    dtype = getattr(torch, args.dtype)
    print(f"# bench_blockwise: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.device}, {args.dtype}, "
          f"variant={args.variant}, median of {args.repeats}, glibc mmap threshold {args.mmap_threshold or 'default'}")

    def timed(backend, mode, tensors, kw):
        def run():
            with attention_backend(backend, block_memory=args.block_memory):
                if mode == "fwd":
                    with torch.no_grad():
                        return ascender_attention(*tensors, **kw)
                return forward_backward(ascender_attention, tensors, kw)

        def synced():
            out = run()
            if args.device != "cpu":
                torch.cuda.synchronize()
            return out

        return median_seconds(synced, args.repeats), peak(synced, args.device)

    rows, dense_peak = [], {}
    for N in args.sizes:
        tensors, kw = problem(N, args.variant)
        tensors = tuple(t.to(args.device, dtype) for t in tensors)
        kw = {n: v.to(args.device, dtype) if isinstance(v, torch.Tensor) else v for n, v in kw.items()}
        for mode in ("fwd", "fwd+bwd"):
            t_b, m_b = timed("blockwise", mode, tensors, kw)
            fused = "fused" if (args.device == "cpu" and dtype in (torch.float32, torch.float64)) or \
                args.device == "cuda" else None
            t_f, m_f = timed("fused", mode, tensors, kw) if fused else (float("nan"), float("nan"))
            if N <= args.dense_max_n:
                t_d, m_d = timed("dense", mode, tensors, kw)
                dense_peak[mode] = (N, m_d)
                dense = (f"{t_d * 1e3:.0f}", f"{m_d:.0f}")
            else:
                n0, m0 = dense_peak.get(mode, (None, None))
                dense = ("-", f"{m0 * (N / n0) ** 2:.0f} (est.)" if n0 else "-")
            rows.append((N, mode, f"{t_b * 1e3:.1f}", f"{t_f * 1e3:.1f}", f"{t_b / t_f:.2f}x", dense[0],
                         f"{m_b:.1f}", f"{m_f:.1f}", dense[1]))
        print(f"N = {N} done", flush=True)
    print()
    print_table(("N", "mode", "blockwise ms", "fused ms", "blockwise / fused", "dense ms", "blockwise MiB",
                 "fused MiB", "dense MiB"), rows)


if __name__ == "__main__":
    main()
