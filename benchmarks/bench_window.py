"""Windowed attention (SPEC section 8, the paper's long-context recipe): causal rows that see the
last --window tokens plus --globals global tokens, against full causal attention, fused and
block-wise, forward and forward+backward, one run.

One ASCenderHead problem (B = 1, d_model = 256, d_head = 64: d = dv = 64, dz = da = 32), float32,
median of --repeats; ratios from the same run. The windowed work is O(N (w + g)) per (batch,
head), so its time should grow linearly in N while the full causal time grows as N^2: the last
column is the windowed time per token relative to the first size's (1.0 = linear). The fused
windowed call is checked against the fused call with the equivalent boolean attn_mask (float32,
max |diff|) at the sizes up to --check-max-n.

    python benchmarks/bench_window.py [--sizes 1024 2048 4096 8192 16384] [--window 256]
        [--globals 4] [--repeats 3] [--variant seed]
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from ascender_torch import ascender_attention
from ascender_torch.backends import attention_backend

from _measure import forward_backward, median_seconds, print_table
from bench_forward import problem


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--window", type=int, default=256, help="tokens each row sees, itself included")
    ap.add_argument("--globals", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variant", default="seed", choices=["seed", "paper"])
    ap.add_argument("--check-max-n", type=int, default=2048)
    ap.add_argument("--full-max-n", type=int, default=8192, help="largest N for the full causal baseline")
    args = ap.parse_args()
    print(f"# bench_window: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, variant={args.variant}, "
          f"window {args.window} (causal), {args.globals} global tokens, median of {args.repeats}")
    windowed = dict(is_causal=True, window_size=(args.window - 1, 0), global_tokens=args.globals)

    def timed(backend, mode, tensors, kw):
        def run():
            with attention_backend(backend):
                if mode == "fwd":
                    with torch.no_grad():
                        return ascender_attention(*tensors, **kw)
                return forward_backward(ascender_attention, tensors, kw)
        return median_seconds(run, args.repeats)

    rows, first = [], {}
    for N in args.sizes:
        tensors, kw = problem(N, args.variant)
        if N <= args.check_max_n:
            t = torch.arange(N)
            mask = ((t[:, None] - t[None, :] < args.window) | (t[None, :] < args.globals) |
                    (t[:, None] < args.globals)) & (t[None, :] <= t[:, None])
            with torch.no_grad(), attention_backend("fused"):
                err = (ascender_attention(*tensors, **kw, **windowed) -
                       ascender_attention(*tensors, **kw, attn_mask=mask)).abs().max().item()
            check = f"{err:.1e}"
        else:
            check = "-"
        for mode in ("fwd", "fwd+bwd"):
            t_w = timed("fused", mode, tensors, dict(kw, **windowed))
            t_b = timed("blockwise", mode, tensors, dict(kw, **windowed))
            t_f = timed("fused", mode, tensors, dict(kw, is_causal=True)) if N <= args.full_max_n else float("nan")
            n0, t0 = first.setdefault(mode, (N, t_w))
            rows.append((N, mode, f"{t_w * 1e3:.1f}", f"{t_b * 1e3:.1f}", f"{t_f * 1e3:.1f}",
                         f"{t_f / t_w:.1f}x" if t_f == t_f else "-", check, f"{(t_w / N) / (t0 / n0):.2f}"))
        print(f"N = {N} done", flush=True)
    print()
    print_table(("N", "mode", "fused window ms", "block-wise window ms", "fused full causal ms", "full / window",
                 "max |diff| vs mask", "window time per token (rel.)"), rows)


if __name__ == "__main__":
    main()
