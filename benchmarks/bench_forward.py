"""Forward time and peak memory: fused C op vs reference.py (pure PyTorch).

One ASCenderHead problem (B = 1, d_model = 256, d_head = 64, so d = dv = 64, dz = da = 32),
float32, no gradient. Median of --repeats runs; ratios come from the same run. Peak memory is
resident memory above what the process held before the call (inputs excluded).

    python benchmarks/bench_forward.py [--repeats 5] [--variant reference] [--sizes 512 1024 ...]
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from ascender_torch import ASCenderHead, ascender_attention
from ascender_torch.reference import ascender_attention_reference

from _measure import median_seconds, peak_mib, print_table

REF_MAX_N = 4096  # above this reference.py needs O(N^2 * dz) memory beyond this machine


def problem(N: int, variant: str):
    torch.manual_seed(0)
    head = ASCenderHead(256, 64, variant=variant)
    X = torch.randn(1, N, 256)
    with torch.no_grad():
        tensors = tuple(m(X).unsqueeze(1).contiguous() for m in (head.WQ, head.WK, head.WV, head.U, head.P))
    scalars = dict(lambda_align=head.lambda_align, lambda_sep=head.lambda_sep, lambda_coh=head.lambda_coh,
                   omega_align=head.omega_a, omega_sep=head.omega_s, omega_coh=head.omega_c,
                   score_temp=head.score_temp, delta=head.delta, kappa=head.kappa)
    scalars = {n: s.detach() for n, s in scalars.items()}
    return tensors, dict(scalars, k_neighbors=head.k, variant=variant)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096, 16384])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", default="reference", choices=["reference", "paper"])
    args = ap.parse_args()

    print(f"# bench_forward: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, variant={args.variant}, "
          f"median of {args.repeats}")
    rows = []
    for N in args.sizes:
        tensors, kw = problem(N, args.variant)
        with torch.no_grad():
            fused = lambda: ascender_attention(*tensors, **kw)  # noqa: E731
            reps = args.repeats if N <= REF_MAX_N else 1
            t_f = median_seconds(fused, reps, warmup=1 if N <= REF_MAX_N else 0)
            m_f = peak_mib(fused)
            if N <= REF_MAX_N:
                ref = lambda: ascender_attention_reference(*tensors, **kw)  # noqa: E731
                t_r = median_seconds(ref, max(1, min(reps, 3)) if N >= 4096 else reps)
                m_r = peak_mib(ref)
                err = (fused() - ref()).abs().max().item()
                rows.append((N, f"{t_f * 1e3:.1f}", f"{t_r * 1e3:.1f}", f"{t_r / t_f:.1f}x", f"{m_f:.1f}",
                             f"{m_r:.0f}", f"{m_r / max(m_f, 1e-3):.0f}x", f"{err:.1e}"))
            else:
                need = 4 * N * N * 32 / 2**30
                rows.append((N, f"{t_f * 1e3:.1f}", "-", "-", f"{m_f:.1f}", f"(>{need:.0f} GiB)", "-", "-"))
        print(f"N = {N} done", flush=True)
    print()
    print_table(("N", "fused ms", "reference ms", "speed-up", "fused MiB", "reference MiB", "memory ratio",
                 "max |diff|"), rows)


if __name__ == "__main__":
    main()
