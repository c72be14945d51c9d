"""Shared test inputs: random ASCender problems and the masking modes of SPEC section 3."""

from __future__ import annotations

import torch

from ascender_torch.reference import SCALAR_NAMES

MASK_MODES = ("none", "causal", "key_padding", "attn_mask_stats", "attn_mask_seed", "all")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (norm-wise relative error, robust to tiny entries)."""
    want = want.to(torch.float64)
    scale = want.abs().max().item() if want.numel() else 0.0
    diff = (got.to(torch.float64) - want).abs().max().item() if want.numel() else 0.0
    return diff / max(scale, 1e-300)


def make_problem(B=2, H=2, N=7, d=8, dv=6, dz=4, da=4, dtype=torch.float64, seed=0,
                 duplicates=False, per_head=True, k_neighbors=3):
    """Random q, k, v, z, h [B, H, N, *] and learnable scalars, scaled so that every bias term
    matters (z near 1 so kernel weights are neither all 0 nor all 1)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * s).to(dtype)

    q, k, v = rnd(B, H, N, d), rnd(B, H, N, d), rnd(B, H, N, dv)
    z, h = rnd(B, H, N, dz, s=0.5), rnd(B, H, N, da)
    if duplicates and N >= 3:  # tokens 1 and 2 are copies of token 0
        for t in (q, k, v, z, h):
            t[:, :, 1:3] = t[:, :, :1]
    if per_head:
        scalars = dict(
            lambda_align=rnd(H).abs() + 0.5, lambda_sep=rnd(H).abs() + 0.5,
            lambda_coh=rnd(H).abs() + 0.5, omega_align=rnd(H, s=0.5), omega_sep=rnd(H, s=0.5),
            omega_coh=rnd(H, s=0.5), score_temp=(rnd(H, s=0.2).abs() + 0.7),
            delta=rnd(H, s=0.2), kappa=(rnd(H).abs() + 0.5) * N / 4,
        )
    else:
        scalars = dict(omega_align=torch.tensor(0.7, dtype=dtype), omega_sep=torch.tensor(-0.4, dtype=dtype),
                       omega_coh=torch.tensor(0.5, dtype=dtype), kappa=torch.tensor(1.5, dtype=dtype))
    return (q, k, v, z, h), scalars, dict(k_neighbors=k_neighbors, alpha_align=-1.3, alpha_coh=0.7)


def make_masks(mode: str, B: int, H: int, N: int, seed: int = 0) -> dict:
    """Keyword arguments for one masking mode. Includes a fully masked row where possible."""
    g = torch.Generator().manual_seed(seed + 1)
    kpm = torch.rand(B, N, generator=g) < 0.3
    if B > 1:
        kpm[-1] = True  # one batch element has no visible key at all
    am = torch.rand(B, 1, N, N, generator=g) < 0.7
    am[..., 0, :] = False  # query 0 sees nothing
    if mode == "none":
        return {}
    if mode == "causal":
        return dict(is_causal=True)
    if mode == "key_padding":
        return dict(key_padding_mask=kpm)
    if mode == "attn_mask_stats":
        return dict(attn_mask=am, mask_stats=True)
    if mode == "attn_mask_seed":
        return dict(attn_mask=am, mask_stats=False)
    if mode == "all":
        return dict(is_causal=True, key_padding_mask=kpm, attn_mask=am[0, 0], mask_stats=True)
    raise ValueError(mode)


def saved_stats(tensors, scalars, opts, masks, variant):
    """The forward's saved statistics (float64), in the functional's argument order."""
    return torch.ops.ascender.ascender_fwd(
        *tensors, *(scalars[n] for n in SCALAR_NAMES), masks.get("key_padding_mask"), masks.get("attn_mask"),
        variant, opts["k_neighbors"], 1.0, 1.0, opts["alpha_align"], opts["alpha_coh"], tensors[0].shape[-1] ** -0.5,
        masks.get("is_causal", False), masks.get("mask_stats", True))[1]


def resolvable_rows(tensors, scalars, opts, masks, variant, rel=1e-6):
    """Rows whose three bias rows have a std well above rounding. A bias row that is constant in
    exact arithmetic (the paper variant's alignment row of a query whose visible keys are exactly
    its two neighbours) has a std made of rounding noise; its normalized values, and their
    derivatives, are that noise amplified by 1/(std + 1e-6) in any implementation (docs/forward.md).
    The checks below give such rows no upstream gradient."""
    st = saved_stats(tuple(t.detach().double() for t in tensors), {n: s.detach().double() for n, s in scalars.items()},
                opts, masks, variant)
    ok = torch.ones(st.shape[:3], dtype=torch.bool)
    for mean, std in ((1, 2), (3, 4), (5, 6)):
        ok &= (st[..., std] > rel * (st[..., mean].abs() + st[..., std])) | (st[..., 12] <= 1)
    return ok


def full_scalars(scalars, H, dtype):
    defaults = dict(lambda_align=1.0, lambda_sep=1.0, lambda_coh=1.0, omega_align=0.1, omega_sep=0.1,
                    omega_coh=0.1, score_temp=1.0, delta=0.2, kappa=32.0)
    return {n: scalars.get(n, torch.full((H,), v, dtype=dtype)).clone() for n, v in defaults.items()}
