"""A short tour of ascender_torch: one ASCenderHead forward on a sample batch.

Prints the output shape, statistics of the score decomposition maps (S_base and the three
normalized biases), and the forward time of the fused op against the pure-PyTorch
reference on the same inputs.

    make demo            (or: python examples/demo.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ascender_torch import ASCenderHead
from ascender_torch.reference import ascender_attention_reference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _measure import median_seconds  # noqa: E402


def main():
    torch.manual_seed(0)
    B, N, d_model, d_head = 2, 512, 256, 64
    X = torch.randn(B, N, d_model)
    for variant in ("reference", "paper"):
        head = ASCenderHead(d_model, d_head, variant=variant)
        with torch.no_grad():
            Y, A, maps = head(X)  # need_weights=True: A and the maps for inspection
        print(f"== ASCenderHead(d_model={d_model}, d_head={d_head}, variant={variant!r}) on X {tuple(X.shape)}")
        print(f"   Y {tuple(Y.shape)}   A {tuple(A.shape)}   rows of A sum to 1: "
              f"{torch.allclose(A.sum(-1), torch.ones(B, N), atol=1e-5)}")
        print("   map       mean       std        min        max")
        for name, m in maps.items():
            print(f"   {name:<8} {m.mean():>+9.4f} {m.std():>9.4f} {m.min():>+10.4f} {m.max():>+10.4f}")

        qkvzh = [mod(X).unsqueeze(1).detach() for mod in (head.WQ, head.WK, head.WV, head.U, head.P)]
        scalars = dict(lambda_align=head.lambda_align, lambda_sep=head.lambda_sep, lambda_coh=head.lambda_coh,
                       omega_align=head.omega_a, omega_sep=head.omega_s, omega_coh=head.omega_c,
                       score_temp=head.score_temp, delta=head.delta, kappa=head.kappa)
        with torch.no_grad():
            y_ref = ascender_attention_reference(*qkvzh, **scalars, k_neighbors=head.k, variant=variant)
            fused_ms = 1e3 * median_seconds(lambda: head(X, need_weights=False), repeats=5)
            ref_ms = 1e3 * median_seconds(lambda: ascender_attention_reference(
                *qkvzh, **scalars, k_neighbors=head.k, variant=variant), repeats=5)
        row_err = (Y - y_ref.squeeze(1)).abs().amax(-1)
        print(f"   forward: fused {fused_ms:.1f} ms (incl. projections), reference.py {ref_ms:.1f} ms "
              f"-> {ref_ms / fused_ms:.1f}x")
        print(f"   |Y_fused - Y_reference|: median row {row_err.median():.1e}, max row {row_err.max():.1e}; "
              f"rows above 1e-5: {(row_err > 1e-5).sum().item()} of {row_err.numel()}"
              + (" (float32 top-k near-ties, see docs/forward.md)" if variant == "paper" else ""))
        print()


if __name__ == "__main__":
    main()
