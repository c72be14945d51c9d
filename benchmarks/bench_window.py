"""Windowed ASCender (SPEC section 8, the paper's long-context recipe) on the fused kernels against
plain attention, forward and forward+backward, one run.

B = H = 1, d = dv = 64, dz = da = 32, float32, --variant (paper by default), --globals global
tokens (16), two windows: (128, 128) (non-causal) and (256, 0) with is_causal (each row sees the
last 257 tokens). For each N: the fused windowed call's median time, its peak memory (resident
memory above what the process held before, inputs excluded), its effective rate (the FLOPs of
ascender_torch.flops for the windowed pairs over the time), dense SDPA (plain attention over every
key, causal for the causal window) where N <= --sdpa-max-n, and SDPA with the equivalent boolean
mask (plain windowed attention, an N x N mask) where N <= --mask-max-n; ratios from the same run.
"check" is max |fused windowed - fused with the equivalent attn_mask| of the forward (N <=
--check-max-n only: it builds the N x N mask). The last column is the time per token relative to the first N of
the same window and mode (1.0 = linear scaling).

    python benchmarks/bench_window.py [--sizes 4096 16384 65536 131072] [--repeats 3]
        [--variant paper] [--globals 16] [--sdpa-max-n 16384] [--mask-max-n 16384] [--check-max-n 4096]
"""

from __future__ import annotations

import argparse
import os
import platform

import torch
import torch.nn.functional as F

from ascender_torch import AttentionConfig, ascender_attention, flops
from ascender_torch.backends import attention_backend

from _measure import forward_backward, median_seconds, peak_mib, print_table

WINDOWS = (((128, 128), False), ((256, 0), True))


def equivalent_mask(N, window, causal, g):
    t = torch.arange(N)
    left, right = window
    m = ((t[None, :] >= t[:, None] - left) & (t[None, :] <= t[:, None] + right)) | (t[None, :] < g) | (t[:, None] < g)
    return m & (t[None, :] <= t[:, None]) if causal else m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variant", default="paper", choices=["seed", "paper"])
    ap.add_argument("--globals", type=int, default=16)
    ap.add_argument("--sdpa-max-n", type=int, default=16384)
    ap.add_argument("--mask-max-n", type=int, default=16384)
    ap.add_argument("--check-max-n", type=int, default=4096)
    args = ap.parse_args()
    print(f"# bench_window: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, B = H = 1, d = 64, dz = da = 32, "
          f"variant={args.variant}, {args.globals} global tokens, median of {args.repeats}")

    def timed(fn, mode, tensors, kw):
        if mode == "fwd":
            def run():
                with torch.no_grad():
                    return fn(*tensors, **kw)
        else:
            def run():
                return forward_backward(fn, tensors, kw)
        return median_seconds(run, args.repeats), peak_mib(run)

    def sdpa(q, k, v, **kw):
        return F.scaled_dot_product_attention(q, k, v, **kw)

    rows, first = [], {}
    for N in args.sizes:
        g = torch.Generator().manual_seed(N)
        q, k, v = (torch.randn(1, 1, N, 64, generator=g) for _ in range(3))
        z, h = (torch.randn(1, 1, N, 32, generator=g) * 0.3 for _ in range(2))
        for window, causal in WINDOWS:
            kw = dict(variant=args.variant, window_size=window, is_causal=causal, global_tokens=args.globals)
            config = AttentionConfig(d=64, dz=32, da=32, variant=args.variant, causal=causal, window=window,
                                     global_tokens=args.globals)
            work = flops(config, N)["ascender"]
            check = "-"
            if N <= args.check_max_n:
                with torch.no_grad(), attention_backend("fused"):
                    mask = equivalent_mask(N, window, causal, args.globals)
                    dense = ascender_attention(q, k, v, z, h, variant=args.variant, attn_mask=mask)
                    check = f"{(ascender_attention(q, k, v, z, h, **kw) - dense).abs().max().item():.1e}"
            for mode in ("fwd", "fwd+bwd"):
                with attention_backend("fused"):
                    t_w, m_w = timed(ascender_attention, mode, (q, k, v, z, h), kw)
                rate = (work["forward"] if mode == "fwd" else work["total"]) / t_w / 1e9
                t_s = timed(sdpa, mode, (q, k, v), dict(is_causal=causal))[0] if N <= args.sdpa_max_n else None
                if N <= args.mask_max_n:
                    mask = equivalent_mask(N, window, causal, args.globals)
                    t_m = timed(lambda *x: sdpa(*x, attn_mask=mask), mode, (q, k, v), {})[0]
                else:
                    t_m = None
                n0, t0 = first.setdefault((window, mode), (N, t_w))
                fmt = lambda t: f"{t * 1e3:.1f}" if t is not None else "-"  # noqa: E731
                rows.append((N, f"{window}{' causal' if causal else ''}", mode, fmt(t_w), f"{m_w:.0f}", f"{rate:.1f}",
                             fmt(t_s), f"{t_s / t_w:.2f}x" if t_s else "-", fmt(t_m),
                             f"{t_m / t_w:.2f}x" if t_m else "-", check, f"{(t_w / N) / (t0 / n0):.2f}"))
            print(f"N = {N} {window} done", flush=True)
    print()
    print_table(("N", "window", "mode", "fused ms", "fused MiB", "GFLOP/s", "SDPA dense ms", "dense / fused",
                 "SDPA+mask ms", "mask / fused", "check", "time per token (rel.)"), rows)


if __name__ == "__main__":
    main()
