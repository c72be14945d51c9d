"""nn.Modules: parameters and shape handling only; all arithmetic is in the op."""

from __future__ import annotations

import torch
from torch import nn

from .functional import ascender_attention


class ASCenderHead(nn.Module):
    """Drop-in replacement for the seed paper's single-head ``ASCenderHead``.

    Same positional arguments, defaults, parameter names and shapes, so a state_dict
    moves between the two both ways; ``forward`` returns ``(Y, A, maps)`` like the seed.
    ``variant="reference"`` (default) reproduces the seed module's numbers (including its
    key-cosine alignment term, see the README); ``variant="paper"`` is the method as
    written in the paper.

    forward(X, attn_mask=None, need_weights=True, *, is_causal=False,
            key_padding_mask=None, mask_stats=None)
        X: [B, N, d_model]. attn_mask: broadcastable to [B, N, N], 0/False = blocked (the
        seed's convention). key_padding_mask: [B, N] bool, True = padding.
        mask_stats: None means False when attn_mask is given (the seed's behaviour: the
        statistics see every token and the mask only blocks the softmax) and True
        otherwise (is_causal / key_padding_mask: nothing about a hidden token reaches a
        row); pass a bool to choose.

        Y [B, N, d_head] always comes from the fused O(N)-memory op. With
        need_weights=True, A [B, N, N] and maps (S_base, b_align, b_sep, b_coh, each
        [B, N, N]) are extra inspection tensors: they cost O(N^2) memory, are detached and
        carry no gradient. With need_weights=False the return is (Y, None, None) and no
        N x N tensor is ever built.
    """

    def __init__(self, d_model, d_head, k=16, tau_sep=1.0, tau_coh=1.0,
                 lambda_align=1.0, lambda_sep=1.0, lambda_coh=1.0, *,
                 variant="reference", alpha_align=-1.0, alpha_coh=-1.0):
        super().__init__()
        self.WQ = nn.Linear(d_model, d_head, bias=False)
        self.WK = nn.Linear(d_model, d_head, bias=False)
        self.WV = nn.Linear(d_model, d_head, bias=False)
        self.U = nn.Linear(d_model, d_head // 2, bias=False)  # latent coordinates Z
        self.P = nn.Linear(d_model, d_head // 2, bias=False)  # semantic projection H
        self.k = k
        self.tau_sep = tau_sep
        self.tau_coh = tau_coh
        self.variant = variant
        self.alpha_align = alpha_align
        self.alpha_coh = alpha_coh

        def scalar(value):
            return nn.Parameter(torch.tensor(value, dtype=torch.float32))

        self.lambda_align = scalar(lambda_align)
        self.lambda_sep = scalar(lambda_sep)
        self.lambda_coh = scalar(lambda_coh)
        self.omega_a = scalar(0.1)
        self.omega_s = scalar(0.1)
        self.omega_c = scalar(0.1)
        self.score_temp = scalar(1.0)
        self.delta = scalar(0.2)  # redundancy threshold
        self.kappa = scalar(32.0)  # density scale

    def extra_repr(self) -> str:
        return (f"k={self.k}, tau_sep={self.tau_sep}, tau_coh={self.tau_coh}, "
                f"variant={self.variant!r}")

    def forward(self, X, attn_mask=None, need_weights=True, *, is_causal=False,
                key_padding_mask=None, mask_stats=None):
        if X.dim() != 3:
            raise ValueError(f"ASCenderHead: X must be [B, N, d_model], got shape {tuple(X.shape)}")
        heads = [m(X).unsqueeze(1) for m in (self.WQ, self.WK, self.WV, self.U, self.P)]
        if attn_mask is not None:
            attn_mask = attn_mask != 0
            if attn_mask.dim() == 3:  # [B, N, N] -> [B, 1, N, N]
                attn_mask = attn_mask.unsqueeze(1)
        if mask_stats is None:
            mask_stats = attn_mask is None
        out = ascender_attention(
            *heads,
            lambda_align=self.lambda_align, lambda_sep=self.lambda_sep, lambda_coh=self.lambda_coh,
            omega_align=self.omega_a, omega_sep=self.omega_s, omega_coh=self.omega_c,
            score_temp=self.score_temp, delta=self.delta, kappa=self.kappa,
            k_neighbors=self.k, tau_sep=self.tau_sep, tau_coh=self.tau_coh,
            alpha_align=self.alpha_align, alpha_coh=self.alpha_coh, variant=self.variant,
            is_causal=is_causal, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
            mask_stats=mask_stats, return_maps=need_weights,
        )
        if not need_weights:
            return out.squeeze(1), None, None
        Y, maps = out
        maps = {name: m.squeeze(1) for name, m in maps.items()}
        A = maps.pop("A")
        return Y.squeeze(1), A, maps
