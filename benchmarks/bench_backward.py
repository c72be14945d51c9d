"""Forward + backward time and peak memory: fused C ops vs reference.py autograd.

One ASCenderHead problem (B = 1, d_model = 256, d_head = 64, so d = dv = 64, dz = da = 32),
float32, gradients w.r.t. q, k, v, z, h and the nine learnable scalars. Median of --repeats
runs; ratios come from the same run. Peak memory is resident memory above what the process
held before the call (inputs excluded).

    python benchmarks/bench_backward.py [--repeats 5] [--variant reference] [--sizes 512 1024 ...]
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from ascender_torch import ascender_attention
from ascender_torch.reference import ascender_attention_reference

from _measure import median_seconds, peak_mib, print_table
from bench_forward import REF_MAX_N, problem


def forward_backward(fn, tensors, kw):
    inputs = [t.detach().requires_grad_() for t in tensors]
    scalars = {n: v.detach().requires_grad_() for n, v in kw.items() if isinstance(v, torch.Tensor)}
    options = {n: v for n, v in kw.items() if not isinstance(v, torch.Tensor)}
    y = fn(*inputs, **scalars, **options)
    y.backward(torch.ones_like(y))
    return [t.grad for t in inputs]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096, 16384])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", default="reference", choices=["reference", "paper"])
    args = ap.parse_args()

    print(f"# bench_backward: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, variant={args.variant}, "
          f"forward+backward, median of {args.repeats}")
    rows = []
    for N in args.sizes:
        tensors, kw = problem(N, args.variant)
        fused = lambda: forward_backward(ascender_attention, tensors, kw)  # noqa: E731
        big = N > REF_MAX_N
        t_f = median_seconds(fused, 1 if big else args.repeats, warmup=0 if big else 1)
        m_f = peak_mib(fused)
        if not big:
            ref = lambda: forward_backward(ascender_attention_reference, tensors, kw)  # noqa: E731
            t_r = median_seconds(ref, min(args.repeats, 3) if N >= 4096 else args.repeats)
            m_r = peak_mib(ref)
            err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(fused(), ref()))
            rows.append((N, f"{t_f * 1e3:.1f}", f"{t_r * 1e3:.1f}", f"{t_r / t_f:.1f}x", f"{m_f:.1f}",
                         f"{m_r:.0f}", f"{m_r / max(m_f, 1e-3):.0f}x", f"{err:.1e}"))
        else:
            need = 4 * N * N * 32 / 2**30
            rows.append((N, f"{t_f * 1e3:.1f}", "-", "-", f"{m_f:.1f}", f"(>{need:.0f} GiB)", "-", "-"))
        print(f"N = {N} done", flush=True)
    print()
    print_table(("N", "fused ms", "reference ms", "speed-up", "fused MiB", "reference MiB", "memory ratio",
                 "max rel. grad diff"), rows)


if __name__ == "__main__":
    main()
