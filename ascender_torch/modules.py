"""nn.Modules: parameters and shape handling only; all arithmetic is in the op."""

from __future__ import annotations

import math

import torch
from torch import nn

from . import _spec as spec
from . import distributed
from .functional import alibi_slopes, ascender_attention, magnitude_attention

_OPTION = {a.name: a.default for a in spec.OPTIONS}  # the op's option defaults


class ASCenderHead(nn.Module):
    """Drop-in replacement for the seed paper's single-head ``ASCenderHead``.

    Same positional arguments, defaults, parameter names and shapes, so a state_dict
    moves between the two both ways; ``forward`` returns ``(Y, A, maps)`` like the seed.
    ``variant="seed"`` (default; "reference" is the same) reproduces the seed module's numbers
    (including its key-cosine alignment term, see docs/api.md); ``variant="paper"`` is the method
    as written in the paper. The omega parameters keep the seed's names ``omega_a``, ``omega_s``,
    ``omega_c``; ``scalar_attributes`` maps the op's scalar names to the attributes.

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

    # the op's learnable scalars (SPEC names) -> this module's attributes (the seed's names)
    scalar_attributes = dict(zip(spec.SCALAR_NAMES, ("lambda_align", "lambda_sep", "lambda_coh", "omega_a", "omega_s",
                                                     "omega_c", "score_temp", "delta", "kappa")))

    def __init__(self, d_model, d_head, k=16, tau_sep=1.0, tau_coh=1.0,
                 lambda_align=1.0, lambda_sep=1.0, lambda_coh=1.0, *,
                 variant="seed", alpha_align=_OPTION["alpha_align"], alpha_coh=_OPTION["alpha_coh"]):
        super().__init__()
        self.WQ = nn.Linear(d_model, d_head, bias=False)
        self.WK = nn.Linear(d_model, d_head, bias=False)
        self.WV = nn.Linear(d_model, d_head, bias=False)
        self.U = nn.Linear(d_model, d_head // 2, bias=False)  # latent coordinates Z
        self.P = nn.Linear(d_model, d_head // 2, bias=False)  # semantic projection H
        self.k = k
        self.tau_sep = tau_sep
        self.tau_coh = tau_coh
        self.variant = spec.canonical_variant(variant)
        self.alpha_align = alpha_align
        self.alpha_coh = alpha_coh
        initial = dict(spec.SCALAR_DEFAULTS, lambda_align=lambda_align, lambda_sep=lambda_sep, lambda_coh=lambda_coh)
        for name, attribute in self.scalar_attributes.items():  # the seed's order and 0-dim float32 parameters
            self.register_parameter(attribute, nn.Parameter(torch.tensor(float(initial[name]), dtype=torch.float32)))

    def extra_repr(self) -> str:
        return (f"k={self.k}, tau_sep={self.tau_sep}, tau_coh={self.tau_coh}, "
                f"variant={self.variant!r}")

    def op_keywords(self) -> dict:
        """The op's learnable scalars and fixed options of this module, by their op names."""
        return _op_keywords(self)

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
            *heads, **self.op_keywords(), is_causal=is_causal, key_padding_mask=key_padding_mask,
            attn_mask=attn_mask, mask_stats=mask_stats, return_maps=need_weights,
        )
        if not need_weights:
            return out.squeeze(1), None, None
        Y, maps = out
        maps = {name: m.squeeze(1) for name, m in maps.items()}
        A = maps.pop("A")
        return Y.squeeze(1), A, maps


def _op_keywords(module) -> dict:
    """The op keywords of an ASCender module: its scalars (through ``scalar_attributes``) and options."""
    return dict(**{name: getattr(module, attr) for name, attr in module.scalar_attributes.items()},
                k_neighbors=module.k, tau_sep=module.tau_sep, tau_coh=module.tau_coh, alpha_align=module.alpha_align,
                alpha_coh=module.alpha_coh, variant=module.variant)


def _inverse_softplus(t: float) -> float:
    """t_raw with softplus(t_raw) = t > 0, computed stably."""
    return t + math.log(-math.expm1(-t))


class _MultiHeadProjections(nn.Module):
    """The q/k/v/out projections and head layout shared by the multi-head modules."""

    def __init__(self, d_model, n_heads, d_head, bias, batch_first):
        super().__init__()
        name = type(self).__name__
        if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
            raise ValueError(f"{name}: n_heads must be a positive int, got {n_heads!r}")
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"{name}: d_model ({d_model}) is not divisible by n_heads ({n_heads}); pass d_head")
            d_head = d_model // n_heads
        self.n_heads, self.d_head, self.batch_first = n_heads, d_head, batch_first
        self.q_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.out_proj = nn.Linear(n_heads * d_head, d_model, bias=bias)

    def _heads(self, proj, x):
        B, N, _ = x.shape
        return proj(x).reshape(B, N, self.n_heads, proj.out_features // self.n_heads).transpose(1, 2)  # [B, H, N, f]

    def _input(self, x):
        if x.dim() != 3:
            raise ValueError(f"{type(self).__name__}: x must be 3-D [B, N, d_model] (batch_first) or "
                             f"[N, B, d_model], got shape {tuple(x.shape)}")
        return x if self.batch_first else x.transpose(0, 1)

    def _output(self, y):
        """Heads [B, H, N, d_head] -> out_proj -> the input's layout."""
        B, H, N, _ = y.shape
        y = self.out_proj(y.transpose(1, 2).reshape(B, N, H * self.d_head))
        return y if self.batch_first else y.transpose(0, 1)


class ASCenderAttention(_MultiHeadProjections):
    """Multi-head ASCender self-attention (SPEC section 6), all heads in one fused op call.

    Each head h has its own latent and semantic projections U_h, P_h (stored together as
    ``U`` and ``P``, Linear(d_model, n_heads * d_latent)) and its own learnable scalars
    (``[n_heads]`` parameters: the paper's head specialization, section 7), plus the usual
    q/k/v/out projections. ``variant="paper"`` by default. There is no dropout on the
    attention weights.

    ``alibi=True`` adds ALiBi (slopes ``alibi_slopes(n_heads)``, computed inside the kernel).
    ``window_size=(left, right)``, ``global_tokens``, ``neighbours`` and ``softcap`` are passed to the
    op (SPEC sections 8, 9; see ``ascender_attention``).
    ``magnitude_gate=True`` gates the values by Magnitude Attention's sigmoid(beta mu + gamma)
    before the ASCender op (per-head ``mag_t_raw``, ``mag_beta``, ``mag_gamma``; mu from the
    fused O(N) solve; bidirectional only).

    forward(x, key_padding_mask=None, attn_mask=None, need_weights=False, *, is_causal=False,
            attn_bias=None, return_aux=False, context_parallel=None)
        x: [B, N, d_model] (``batch_first=True``) or [N, B, d_model]. key_padding_mask:
        [B, N] bool, True = padding. attn_mask: bool, broadcastable to [B, H, N, N] (or
        [N, N]), True = may attend. attn_bias: an additive float bias broadcastable to
        [B, H, N, N] (beta^(other), differentiable). Returns ``(out, A)``: out like x; A is
        None, or with need_weights=True the per-head attention weights [B, H, N, N]
        (detached; O(N^2): the inspection pass computes all maps of return_maps=True).
        ``mask_stats`` (constructor) chooses whether the masks also restrict every statistic
        (default True: nothing about a hidden token reaches a row).
        ``context_parallel=ContextParallel(group, layout)`` (or inside
        ``ascender_torch.distributed.context_parallel(group, layout)``): x is this rank's shard of the
        sequence and so is out (docs/context_parallel.md; the masks are given as this rank's shard too).
        ``return_aux=True`` returns ``(out, A, aux)``: aux holds the per-row terms of the
        auxiliary losses of paper section 8 ([B, H, N] tensors "coh", "sep" and, for the paper
        variant, "align"; see ``ascender_attention``), differentiable; e.g.
        ``loss = task + 0.1 * aux["coh"].mean()``.
    """

    scalar_attributes = {name: name for name in spec.SCALAR_NAMES}  # the op's scalars, same names here

    def __init__(self, d_model, n_heads, *, d_head=None, d_latent=None, k=_OPTION["k_neighbors"],
                 tau_sep=_OPTION["tau_sep"], tau_coh=_OPTION["tau_coh"], lambda_align=1.0, lambda_sep=1.0,
                 lambda_coh=1.0, variant="paper", alpha_align=_OPTION["alpha_align"],
                 alpha_coh=_OPTION["alpha_coh"], bias=True, batch_first=True, mask_stats=True, alibi=False,
                 magnitude_gate=False, magnitude_n_iter=4, magnitude_eps=1e-3, window_size=_OPTION["window_size"],
                 global_tokens=_OPTION["global_tokens"], neighbours=_OPTION["neighbours"], softcap=_OPTION["softcap"]):
        super().__init__(d_model, n_heads, d_head, bias, batch_first)
        # SPEC sections 8 and 9: structured visibility, the neighbourhood and softcap (types checked now)
        given = dict(window_size=window_size, global_tokens=global_tokens, neighbours=neighbours, softcap=softcap)
        checked = spec.options(type(self).__name__, spec.ASCENDER_KEYWORDS, given)
        self.structure = {name: checked[name] for name in given}
        self.d_latent = d_latent = self.d_head // 2 if d_latent is None else d_latent
        self.k, self.tau_sep, self.tau_coh = k, tau_sep, tau_coh
        self.variant, self.alpha_align, self.alpha_coh = spec.canonical_variant(variant), alpha_align, alpha_coh
        self.mask_stats = mask_stats
        self.U = nn.Linear(d_model, n_heads * d_latent, bias=False)  # latent coordinates, per head
        self.P = nn.Linear(d_model, n_heads * d_latent, bias=False)  # semantic projections, per head
        initial = dict(spec.SCALAR_DEFAULTS, lambda_align=lambda_align, lambda_sep=lambda_sep, lambda_coh=lambda_coh)
        for name, value in initial.items():
            self.register_parameter(name, nn.Parameter(torch.full((n_heads,), float(value))))
        # ALiBi (computed inside the kernel): fixed per-head slopes, not part of the state_dict
        self.register_buffer("alibi_slopes", alibi_slopes(n_heads) if alibi else None, persistent=False)
        # Magnitude value gate (SPEC section 7): v_j <- sigmoid(mag_beta mu_j + mag_gamma) v_j
        self.magnitude_gate, self.magnitude_n_iter, self.magnitude_eps = magnitude_gate, magnitude_n_iter, magnitude_eps
        if magnitude_gate:
            self.mag_t_raw = nn.Parameter(torch.full((n_heads,), _inverse_softplus(1.0)))  # t = 1
            self.mag_beta = nn.Parameter(torch.ones(n_heads))
            self.mag_gamma = nn.Parameter(torch.zeros(n_heads))

    def extra_repr(self) -> str:
        structure = "".join(f", {n}={v!r}" for n, v in self.structure.items() if v != _OPTION[n])
        return (f"n_heads={self.n_heads}, d_head={self.d_head}, d_latent={self.d_latent}, k={self.k}, "
                f"variant={self.variant!r}, mask_stats={self.mask_stats}{structure}")

    def op_keywords(self) -> dict:
        """The op's learnable scalars and fixed options of this module (mask_stats and ALiBi
        included), by their op names."""
        return dict(_op_keywords(self), mask_stats=self.mask_stats, alibi_slopes=self.alibi_slopes, **self.structure)

    def head_tensors(self, x):
        """q, k, v, z, h [B, H, N, *] of a batch-first input x [B, N, d_model]."""
        return [self._heads(p, x) for p in (self.q_proj, self.k_proj, self.v_proj, self.U, self.P)]

    def forward(self, x, key_padding_mask=None, attn_mask=None, need_weights=False, *, is_causal=False,
                attn_bias=None, return_aux=False, context_parallel=None):
        x = self._input(x)
        tensors = self.head_tensors(x)
        cp = context_parallel or distributed.active()
        if cp is not None:  # x is this rank's shard of the sequence (docs/context_parallel.md section 5)
            if need_weights or self.magnitude_gate:
                raise ValueError("ASCenderAttention: context parallelism takes neither need_weights (O(N^2) maps) "
                                 "nor magnitude_gate (its weights solve a system over every key)")
            out = distributed.context_parallel_attention(
                *tensors, group=cp.group, layout=cp.layout, **self.op_keywords(), is_causal=is_causal,
                key_padding_mask=key_padding_mask, attn_mask=attn_mask, attn_bias=attn_bias, return_aux=return_aux)
            return (self._output(out[0]), None, out[1]) if return_aux else (self._output(out), None)
        if self.magnitude_gate:
            tensors[2] = self._magnitude_gated(tensors[1], tensors[2], key_padding_mask, is_causal, attn_mask)
        out = ascender_attention(
            *tensors, **self.op_keywords(), is_causal=is_causal, key_padding_mask=key_padding_mask,
            attn_mask=attn_mask, attn_bias=attn_bias, return_maps=need_weights, return_aux=return_aux,
        )
        out = out if isinstance(out, tuple) else (out,)
        y, maps = out[0], (out[1] if need_weights else None)
        weights = maps["A"] if maps is not None else None
        return (self._output(y), weights, out[-1]) if return_aux else (self._output(y), weights)


    def _magnitude_gated(self, k, v, key_padding_mask, is_causal, attn_mask):
        """v gated by sigmoid(mag_beta mu + mag_gamma), mu the keys' magnitude weights (the
        fused solve alone: no attention pass, v of width 0)."""
        if is_causal or attn_mask is not None:
            raise ValueError("ASCenderAttention: magnitude_gate needs bidirectional attention without attn_mask "
                             "(the magnitude weights mu depend on every key)")
        _, mu = magnitude_attention(k, k, v[..., :0], t_raw=self.mag_t_raw, n_iter=self.magnitude_n_iter,
                                               eps=self.magnitude_eps, key_padding_mask=key_padding_mask,
                                               return_mu=True)
        gate = torch.sigmoid(self.mag_beta.view(1, -1, 1) * mu + self.mag_gamma.view(1, -1, 1))
        return v * gate.unsqueeze(-1)


class MagnitudeAttention(_MultiHeadProjections):
    """Multi-head Magnitude Attention (SPEC section 7, seed 004), all heads in one op call.

    q/k/v/out projections like ASCenderAttention, plus per-head learnable ``[n_heads]``
    parameters ``t_raw`` (the kernel sharpness is t = softplus(t_raw), initialized to t_init),
    ``beta`` and ``gamma`` (the magnitude gate sigmoid(beta * mu + gamma)). ``n_iter`` CG steps
    and the Tikhonov ``eps`` solve (Zm + eps I) mu = 1. Bidirectional only (mu depends on
    every key), no dropout.

    forward(x, key_padding_mask=None, need_weights=False)
        x: [B, N, d_model] (``batch_first=True``) or [N, B, d_model]. key_padding_mask: [B, N]
        bool, True = padding. Returns ``(out, mu)``: out like x; mu is None, or with
        need_weights=True the per-head magnitude weights [B, H, N] (0 at padded keys; part of
        the autograd graph).
    """

    def __init__(self, d_model, n_heads, n_iter=4, eps=1e-3, *, d_head=None, bias=True, batch_first=True,
                 t_init=1.0, beta_init=1.0, gamma_init=0.0):
        super().__init__(d_model, n_heads, d_head, bias, batch_first)
        if t_init <= 0:
            raise ValueError(f"MagnitudeAttention: t_init must be > 0 (t = softplus(t_raw)), got {t_init}")
        self.n_iter, self.eps = n_iter, eps
        self.t_raw = nn.Parameter(torch.full((n_heads,), _inverse_softplus(t_init)))
        self.beta = nn.Parameter(torch.full((n_heads,), float(beta_init)))
        self.gamma = nn.Parameter(torch.full((n_heads,), float(gamma_init)))

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, d_head={self.d_head}, n_iter={self.n_iter}, eps={self.eps}"

    def forward(self, x, key_padding_mask=None, need_weights=False):
        x = self._input(x)
        q, k, v = (self._heads(p, x) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = magnitude_attention(
            q, k, v, t_raw=self.t_raw, beta=self.beta, gamma=self.gamma, n_iter=self.n_iter, eps=self.eps,
            key_padding_mask=key_padding_mask, return_mu=need_weights)
        y, mu = out if need_weights else (out, None)
        return self._output(y), mu
