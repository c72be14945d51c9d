"""Forward + backward time and peak memory: fused C ops vs reference.py autograd.

One ASCenderHead problem (B = 1, d_model = 256, d_head = 64, so d = dv = 64, dz = da = 32),
float32, gradients w.r.t. q, k, v, z, h and the nine learnable scalars. Median of --repeats
runs; ratios come from the same run. Peak memory is resident memory above what the process
held before the call (inputs excluded).

    python benchmarks/bench_backward.py [--repeats 5] [--variant seed] [--sizes 512 1024 ...]
"""

from __future__ import annotations

from ascender_torch import ascender_attention
from ascender_torch.reference import ascender_attention_reference

from _measure import (HEADERS, compare_row, forward_backward, max_relative_difference, parse_args, print_header,
                      print_table)
from bench_forward import REF_MAX_N, problem


def main():
    args = parse_args(__doc__)
    print_header("bench_backward", args, "forward+backward")
    rows = []
    for N in args.sizes:
        tensors, kw = problem(N, args.variant)
        fused = lambda: forward_backward(ascender_attention, tensors, kw)  # noqa: E731
        ref = (lambda: forward_backward(ascender_attention_reference, tensors, kw)) if N <= REF_MAX_N else None  # noqa: E731,E501
        rows.append(compare_row(N, fused, ref, args.repeats, lambda got, want: max_relative_difference(got[:5], want[:5]),
                                ref_bytes=4 * N * N * 32))  # q, k, v, z, h
        print(f"N = {N} done", flush=True)
    print()
    print_table(HEADERS + ("max rel. grad diff",), rows)


if __name__ == "__main__":
    main()
