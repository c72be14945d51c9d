"""Magnitude Attention: time and peak memory of the fused C op vs reference.py (pure PyTorch).

One MagnitudeAttention(64, 1) problem (B = 1, H = 1, d = dv = 64), float32, n_iter = 4,
eps = 1e-3. Two tables from the same run: forward only (no gradient), and forward + backward
(gradients w.r.t. q, k, v, t_raw, beta, gamma). Median of --repeats runs; ratios come from the
same run. The error columns compare the fused float32 result with the reference run in float64
(the float32 reference itself is off by up to ~50% in dk at N = 1024: four CG steps on this
ill-conditioned kernel amplify its float32 rounding). Peak memory is resident memory above what
the process held before the call (inputs excluded). The reference materializes the N x N x d key differences (and their square); sizes
where that would pass --ref-max-gib are run fused only, and the table says how much the reference
would need.

    python benchmarks/bench_magnitude.py [--repeats 5] [--sizes 1024 4096 16384] [--ref-max-gib 8]
"""

from __future__ import annotations

import argparse
import os
import platform

import torch

from ascender_torch import MagnitudeAttention
from ascender_torch.functional import magnitude_attention
from ascender_torch.reference import magnitude_attention_reference

from _measure import HEADERS, compare_row, forward_backward, max_relative_difference, print_table

D_HEAD = 64
N_ITER = 4


def reference_bytes(N: int, backward: bool = False, d: int = D_HEAD) -> float:
    """Peak float32 bytes of the reference: the N x N x d difference and its square plus about
    eight N x N matrices (distances, kernel, A, scores, probabilities); about twice that with
    autograd (saved tensors and their gradients). Matches the measured peak at N = 1024."""
    return 4.0 * N * N * (2 * d + 8) * (2 if backward else 1)


def problem(N: int):
    torch.manual_seed(0)
    module = MagnitudeAttention(D_HEAD, 1, n_iter=N_ITER)
    X = torch.randn(1, N, D_HEAD)
    with torch.no_grad():
        tensors = tuple(module._heads(p, X).contiguous() for p in (module.q_proj, module.k_proj, module.v_proj))
    params = dict(t_raw=module.t_raw.detach(), beta=module.beta.detach(), gamma=module.gamma.detach())
    return tensors, dict(params, n_iter=N_ITER, eps=module.eps)


def _as_float64(tensors, kw):
    return (tuple(t.double() for t in tensors),
            {n: v.double() if isinstance(v, torch.Tensor) else v for n, v in kw.items()})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ref-max-gib", type=float, default=8.0, help="skip the reference above this estimate")
    args = ap.parse_args()
    print(f"# bench_magnitude: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, B = H = 1, d = {D_HEAD}, "
          f"n_iter = {N_ITER}, median of {args.repeats}")
    forward_rows, backward_rows = [], []
    for N in args.sizes:
        tensors, kw = problem(N)
        run_ref = reference_bytes(N) <= args.ref_max_gib * 2**30
        if run_ref:  # the accuracy baseline: the reference in float64 (compare_row's ref() is only timed)
            t64, kw64 = _as_float64(tensors, kw)
            with torch.no_grad():
                y64 = magnitude_attention_reference(*t64, **kw64)
            grads64 = forward_backward(magnitude_attention_reference, t64, kw64)
            del t64
        with torch.no_grad():
            fused = lambda: magnitude_attention(*tensors, **kw)  # noqa: E731
            ref = (lambda: magnitude_attention_reference(*tensors, **kw)) if run_ref else None  # noqa: E731
            forward_rows.append(compare_row(N, fused, ref, args.repeats,
                                            lambda got, _: max_relative_difference([got], [y64]),
                                            ref_bytes=reference_bytes(N)))
        fused = lambda: forward_backward(magnitude_attention, tensors, kw)  # noqa: E731
        ref = (lambda: forward_backward(magnitude_attention_reference, tensors, kw)) if run_ref else None  # noqa: E731
        backward_rows.append(compare_row(N, fused, ref, args.repeats,
                                         lambda got, _: max_relative_difference(got, grads64),
                                         ref_bytes=reference_bytes(N, backward=True)))
        skipped = f" (reference skipped: its forward alone needs ~{reference_bytes(N) / 2**30:.1f} GiB > --ref-max-gib)"
        print(f"N = {N} done" + ("" if run_ref else skipped), flush=True)
    print("\nforward")
    print_table(HEADERS + ("rel. diff vs f64 ref",), forward_rows)
    print("\nforward + backward")
    print_table(HEADERS + ("max rel. grad diff vs f64 ref",), backward_rows)


if __name__ == "__main__":
    main()
