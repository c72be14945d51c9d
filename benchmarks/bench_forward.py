"""Forward time and peak memory: fused C op vs reference.py (pure PyTorch).

One ASCenderHead problem (B = 1, d_model = 256, d_head = 64, so d = dv = 64, dz = da = 32),
float32, no gradient. Median of --repeats runs; ratios come from the same run. Peak memory is
resident memory above what the process held before the call (inputs excluded).

    python benchmarks/bench_forward.py [--repeats 5] [--variant reference] [--sizes 512 1024 ...]
"""

from __future__ import annotations

import torch

from ascender_torch import ASCenderHead, ascender_attention
from ascender_torch.reference import ascender_attention_reference

from _measure import HEADERS, compare_row, parse_args, print_header, print_table

REF_MAX_N = 4096  # above this reference.py needs O(N^2 * dz) memory beyond this machine


def problem(N: int, variant: str):
    torch.manual_seed(0)
    head = ASCenderHead(256, 64, variant=variant)
    X = torch.randn(1, N, 256)
    with torch.no_grad():
        tensors = tuple(m(X).unsqueeze(1).contiguous() for m in (head.WQ, head.WK, head.WV, head.U, head.P))
    return tensors, {n: v.detach() if isinstance(v, torch.Tensor) else v for n, v in head.op_keywords().items()}


def main():
    args = parse_args(__doc__)
    print_header("bench_forward", args, "forward")
    rows = []
    for N in args.sizes:
        tensors, kw = problem(N, args.variant)
        with torch.no_grad():
            fused = lambda: ascender_attention(*tensors, **kw)  # noqa: E731
            ref = (lambda: ascender_attention_reference(*tensors, **kw)) if N <= REF_MAX_N else None  # noqa: E731
            rows.append(compare_row(N, fused, ref, args.repeats, lambda a, b: (a - b).abs().max().item(),
                                    ref_bytes=4 * N * N * 32))
        print(f"N = {N} done", flush=True)
    print()
    print_table(HEADERS + ("max |diff|",), rows)


if __name__ == "__main__":
    main()
