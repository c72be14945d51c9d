"""The registered ops `torch.ops.ascender.*`: loads the C++ library, adds fake (meta)
kernels for torch.compile and the autograd rule of the fused forward."""

from __future__ import annotations

import torch

from . import _C  # noqa: F401  (registers the ascender ops)

NSTAT = 13  # columns of the saved per-row statistics, enum asc_stat in csrc/ascender.h


def _n_nbr(variant: str, k_neighbors: int, N) -> int:
    return min(k_neighbors, max(N - 1, 0)) if variant == "paper" else 0


@torch.library.register_fake("ascender::ascender_fwd")
def _ascender_fwd_fake(
    q, k, v, z, h,
    lambda_align, lambda_sep, lambda_coh, omega_align, omega_sep, omega_coh, score_temp, delta, kappa,
    key_padding_mask, attn_mask, variant, k_neighbors, tau_sep, tau_coh, alpha_align, alpha_coh, scale,
    is_causal, mask_stats,
):
    B, H, N, d = q.shape
    return (
        q.new_empty(B, H, N, v.shape[-1]),
        q.new_empty(B, H, N, NSTAT),
        q.new_empty(B, H, N, d),
        q.new_empty(B, H, N, z.shape[-1]),
        q.new_empty(B, H, N, _n_nbr(variant, k_neighbors, N), dtype=torch.long),
    )


@torch.library.register_fake("ascender::ascender_maps")
def _ascender_maps_fake(q, *_same_arguments_as_ascender_fwd):
    B, H, N, _ = q.shape
    return tuple(q.new_empty(B, H, N, N) for _ in range(5))


def _setup_context(ctx, inputs, output):
    pass


def _backward(ctx, *grads):
    raise NotImplementedError(
        "ascender: the fused op has no backward kernel yet; gradients through "
        "ascender_torch's fused path are not available. Use "
        "ascender_torch.reference.ascender_attention_reference to train until the "
        "backward lands."
    )


torch.library.register_autograd("ascender::ascender_fwd", _backward, setup_context=_setup_context)
