"""The three backends of ascender_attention side by side: block-wise (PyTorch ops, one block of
query rows at a time), fused (the C kernels) and dense (the twin), forward and forward+backward,
time and peak memory, one run.

One ASCenderHead problem (B = 1, d_model = 256, d_head = 64: d = dv = 64, dz = da = 32),
float32 unless --dtype says otherwise; median of --repeats; ratios from the same run. Peak memory
is resident memory above what the process held before the call (inputs excluded). The dense twin
runs up to --dense-max-n; above it its peak is extrapolated from the largest measured one (it
grows as N^2) and marked "(est.)". On a CUDA machine pass --device cuda (peak memory then comes
from torch.cuda.max_memory_allocated).

glibc's malloc decides what the block-wise path's churn of short-lived [B, H, block, N] tensors
costs. Each time it frees a mapped block of up to 32 MiB it raises its mmap threshold to that size;
below the threshold tensors come from its heap and reuse its pages, above it each one is a fresh
mapping whose pages fault in again. A training process has long freed tensors of 32 MiB or more,
so the script first frees one (--cold-malloc skips that: a fresh process then runs the block-wise
path up to ~30% slower, varying from run to run) and times in that state, with glibc's other
settings at their defaults. Two peaks are shown for the CPU: the process's peak RSS ("RSS"), which
includes freed memory the heap keeps, and what the backend holds ("live"), measured in a child
process whose threshold is fixed (MALLOC_MMAP_THRESHOLD_=65536, --mmap-threshold; 0 skips the
child): there every large tensor is a fresh mapping returned when freed, so nothing freed stays
resident, but the block-wise path runs some 2-3x slower.

    python benchmarks/bench_blockwise.py [--sizes 1024 2048 4096 8192 16384] [--repeats 3]
        [--variant seed] [--block-memory BYTES] [--dense-max-n 2048] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

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


def cases(args, dtype):
    """[(N, mode, {backend: a call that runs it})] in the order of the table."""
    def call(backend, mode, tensors, kw):
        def synced():
            with attention_backend(backend, block_memory=args.block_memory):
                if mode == "fwd":
                    with torch.no_grad():
                        out = ascender_attention(*tensors, **kw)
                else:
                    out = forward_backward(ascender_attention, tensors, kw)
            if args.device != "cpu":
                torch.cuda.synchronize()
            return out
        return synced

    fused_runs = args.device == "cuda" or (args.device == "cpu" and dtype in (torch.float32, torch.float64))
    out = []
    for N in args.sizes:
        tensors, kw = problem(N, args.variant)
        tensors = tuple(t.to(args.device, dtype) for t in tensors)
        kw = {n: v.to(args.device, dtype) if isinstance(v, torch.Tensor) else v for n, v in kw.items()}
        for mode in ("fwd", "fwd+bwd"):
            backends = ["blockwise"] + ["fused"] * fused_runs + ["dense"] * (N <= args.dense_max_n)
            out.append((N, mode, {b: call(b, mode, tensors, kw) for b in backends}))
    return out


def live_peaks(argv: list, threshold: int) -> dict:
    """The block-wise peaks of every case, from a child process whose malloc has the fixed threshold."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(threshold))
    child = subprocess.run([sys.executable, __file__, *argv, "--live-peaks-only"], env=env, check=True,
                           capture_output=True, text=True)
    return {(N, mode): m for N, mode, m in json.loads(child.stdout.splitlines()[-1])}


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
    ap.add_argument("--cold-malloc", action="store_true")
    ap.add_argument("--live-peaks-only", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.live_peaks_only:
        print(json.dumps([(N, mode, peak(runs["blockwise"], args.device)) for N, mode, runs in cases(args, dtype)]))
        return
    print(f"# bench_blockwise: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.device}, {args.dtype}, "
          f"variant={args.variant}, median of {args.repeats}, glibc's default malloc settings"
          f"{' (cold)' if args.cold_malloc else ', 32 MiB freed first'}; live peaks with mmap threshold "
          f"{args.mmap_threshold or '(not measured)'}")
    if not args.cold_malloc:
        torch.empty(31 << 20, dtype=torch.uint8)  # allocated and freed at once: glibc's mmap threshold -> 31 MiB
    live = live_peaks(argv, args.mmap_threshold) if args.device == "cpu" and args.mmap_threshold else {}
    rows, dense_peak = [], {}
    for N, mode, runs in cases(args, dtype):
        t = {b: median_seconds(fn, args.repeats) for b, fn in runs.items()}
        m = {b: peak(fn, args.device) for b, fn in runs.items()}
        if "dense" in m:
            dense_peak[mode] = (N, m["dense"])
            dense = (f"{t['dense'] * 1e3:.0f}", f"{m['dense']:.0f}")
        else:
            n0, m0 = dense_peak.get(mode, (None, None))
            dense = ("-", f"{m0 * (N / n0) ** 2:.0f} (est.)" if n0 else "-")
        t_f, m_f = t.get("fused", float("nan")), m.get("fused", float("nan"))
        rows.append((N, mode, f"{t['blockwise'] * 1e3:.1f}", f"{t_f * 1e3:.1f}", f"{t['blockwise'] / t_f:.2f}x",
                     dense[0], f"{m['blockwise']:.1f}", f"{live.get((N, mode), float('nan')):.1f}", f"{m_f:.1f}",
                     dense[1]))
        print(f"N = {N} {mode} done", flush=True)
    print()
    print_table(("N", "mode", "blockwise ms", "fused ms", "blockwise / fused", "dense ms", "blockwise MiB RSS",
                 "blockwise MiB live", "fused MiB", "dense MiB"), rows)


if __name__ == "__main__":
    main()
