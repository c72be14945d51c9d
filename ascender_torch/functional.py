"""Functional API, `torch.nn.functional` style: `ascender_attention(q, k, v, z, h, ...)`."""

from __future__ import annotations

import warnings

import torch

from . import _ops  # noqa: F401  (registers torch.ops.ascender)

_warned_fallback = set()


def _scalar(value, q: torch.Tensor) -> torch.Tensor:
    """A learnable scalar (python number, 0-dim or [H] tensor) in q's dtype, keeping autograd."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype=q.dtype)
    return torch.tensor(float(value), dtype=q.dtype, device=q.device)


def _check_tensors_and_scale(op: str, scale, **tensors) -> float:
    """Type-checks the tensor arguments (the binding checks the rest); returns the scale,
    1/sqrt(d) by default."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if scale is not None:
        return scale
    q = tensors["q"]
    return q.shape[-1] ** -0.5 if q.dim() > 0 and q.shape[-1] > 0 else 1.0


def _warn_fallback_once(device: torch.device) -> None:
    if device.type not in _warned_fallback:
        _warned_fallback.add(device.type)
        warnings.warn(
            f"ascender_torch: no fused kernel for {device.type} tensors yet; using the pure-PyTorch "
            "reference (O(N^2 * dz) memory).",
            RuntimeWarning,
            stacklevel=3,
        )


def ascender_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    z: torch.Tensor,
    h: torch.Tensor,
    *,
    lambda_align=1.0,
    lambda_sep=1.0,
    lambda_coh=1.0,
    omega_align=0.1,
    omega_sep=0.1,
    omega_coh=0.1,
    score_temp=1.0,
    delta=0.2,
    kappa=32.0,
    k_neighbors: int = 16,
    tau_sep: float = 1.0,
    tau_coh: float = 1.0,
    alpha_align: float = -1.0,
    alpha_coh: float = -1.0,
    scale: float | None = None,
    variant: str = "reference",
    is_causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    mask_stats: bool = True,
    attn_bias: torch.Tensor | None = None,
    alibi_slopes=None,
    return_maps: bool = False,
    return_aux: bool = False,
):
    """ASCender attention (shared/SPEC.md section 4) with the fused O(N)-memory kernel.

    Args:
        q: [B, H, Nq, d] queries; k: [B, H, N, d] keys; v: [B, H, N, dv]; z: [B, H, N, dz]
            latent coordinates; h: [B, H, N, da] semantic projections. float32 or float64;
            on CUDA (when built with ASCENDER_CUDA=1) also float16 and bfloat16.
            Nq = N for self-attention; Nq < N means the queries are the last Nq tokens
            (decode: causal alignment at the bottom right, every statistic of query i is
            that of token N - Nq + i).
        lambda_*, omega_*, score_temp, delta, kappa: learnable scalars, each a number, a
            0-dim tensor or a per-head [H] tensor (cast to q's dtype).
        k_neighbors: top-k size of the paper variant's neighbourhood (no effect in the
            reference variant). tau_sep, tau_coh: kernel widths (> 0). alpha_align,
            alpha_coh: gate slopes (paper variant). scale: multiplies q.k (1/sqrt(d)).
        variant: "reference" (what the seed module computes) or "paper" (the method as
            written); see the README's Semantics table.
        is_causal, key_padding_mask ([B, N] bool, True = padding), attn_mask (bool,
            broadcastable to [B, H, Nq, N], True = may attend): which keys each query sees.
        mask_stats: True restricts every statistic to the visible keys; False lets the
            statistics see all N tokens and masks only the softmax (the seed's behaviour).
        attn_bias: beta^(other), a float bias broadcastable to [B, H, Nq, N] added to S_ij
            before the temperature (relative-position biases and the like); differentiable.
            A -inf entry blocks that key exactly like attn_mask=False (so with mask_stats it
            is also hidden from the statistics).
        alibi_slopes: ALiBi, a number, 0-dim or [H] tensor of slopes m_h (see alibi_slopes());
            adds -m_h * |t - j| to S_ij (t the query's token) inside the kernel, without any
            N x N tensor. Not differentiable.
        return_maps: also return the inspection maps (O(N^2) memory, detached, no gradient).
        return_aux: also return the per-row terms of the auxiliary losses of paper section 8
            (SPEC section 5), from the same pass and differentiable: a dict of [B, H, N] tensors
            coh (sum_j A_ij ||z_j - c_i||^2), sep (sum_j A_ij phi_ij) and, for the paper
            variant, align (1 - u_i . mean_{l in N(i)} u_l; 1 when N(i) is empty). The losses
            are their means over the rows you train on, e.g. aux["coh"].mean(). Self-attention
            only (Nq = N). The reference variant has no "align": the seed module's headings
            are the tokens' own keys, so its L_align would be identically 0.

    Returns:
        y [B, H, Nq, dv]; with return_maps and/or return_aux, the tuple (y, maps, aux) without
        the ones not asked for; maps = dict(S_base, b_align, b_sep, b_coh, A), each [B, H, Nq, N].

    Rows whose visible set is empty return 0. The op is differentiable (exact gradients for
    q, k, v, z, h and every learnable scalar, from the fused C backward with O(N) memory per
    thread; docs/backward.md); double backward is not supported and raises.
    """
    scale = _check_tensors_and_scale("ascender_attention", scale, q=q, k=k, v=v, z=z, h=h)
    options = dict(
        k_neighbors=k_neighbors, tau_sep=tau_sep, tau_coh=tau_coh, alpha_align=alpha_align,
        alpha_coh=alpha_coh, scale=scale, variant=variant, is_causal=is_causal,
        key_padding_mask=key_padding_mask, attn_mask=attn_mask, mask_stats=mask_stats,
    )
    if attn_bias is not None:
        # a -inf entry (an sdpa-style additive mask) blocks the key: fold it into attn_mask so
        # that no -inf reaches the arithmetic (it would give NaN rows and NaN gradients)
        attn_bias = attn_bias.to(dtype=q.dtype)
        if attn_mask is None or attn_mask.dtype == torch.bool:  # (a non-bool mask is refused below)
            open_keys = attn_bias != float("-inf")
            attn_mask = open_keys if attn_mask is None else attn_mask & open_keys
            attn_bias = attn_bias.masked_fill(~open_keys, 0.0)
    if alibi_slopes is not None:
        alibi_slopes = torch.as_tensor(alibi_slopes, dtype=q.dtype, device=q.device).detach()
    scalars = (lambda_align, lambda_sep, lambda_coh, omega_align, omega_sep, omega_coh,
               score_temp, delta, kappa)

    if q.device.type != "cpu" and not (q.device.type == "cuda" and _ops.CUDA_BUILT):
        from . import reference

        _warn_fallback_once(q.device)
        named = dict(zip(reference.SCALAR_NAMES, scalars))
        return reference.ascender_attention_reference(q, k, v, z, h, **named, **options, attn_bias=attn_bias,
                                                      alibi_slopes=alibi_slopes, return_maps=return_maps,
                                                      return_aux=return_aux)
    if return_aux and q.shape[2] != k.shape[2]:
        raise ValueError(f"ascender_attention: return_aux needs self-attention (Nq = N): L_align uses the headings "
                         f"of every token, got Nq = {q.shape[2]} queries for N = {k.shape[2]} keys")

    args = (
        q, k, v, z, h, *(_scalar(s, q) for s in scalars), key_padding_mask, attn_mask,
        variant, int(k_neighbors), float(tau_sep), float(tau_coh), float(alpha_align),
        float(alpha_coh), float(scale), bool(is_causal), bool(mask_stats), attn_bias, alibi_slopes,
    )
    y, _stats, u, _centroid, nbr, aux_rows = torch.ops.ascender.ascender_fwd(*args)
    outputs = (y,)
    if return_maps:
        with torch.no_grad():
            detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            names = ("S_base", "b_align", "b_sep", "b_coh", "A")
            outputs += (dict(zip(names, torch.ops.ascender.ascender_maps(*detached))),)
    if return_aux:
        aux = dict(coh=aux_rows[..., 0], sep=aux_rows[..., 1])
        if variant == "paper":
            aux["align"] = _alignment_rows(u, nbr)
        outputs += (aux,)
    return outputs if len(outputs) > 1 else y


def _alignment_rows(u: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
    """1 - u_i . mean_{l in N(i)} u_l per row, from the op's headings u [B, H, N, d] and neighbour
    indices nbr [B, H, N, n_nbr] (-1 past the end): O(N n_nbr d) memory, differentiable in u."""
    B, H, N, d = u.shape
    valid = nbr >= 0
    index = nbr.clamp_min(0).reshape(B, H, -1, 1).expand(-1, -1, -1, d)
    u_nb = torch.gather(u, 2, index).reshape(B, H, N, -1, d) * valid.unsqueeze(-1).to(u.dtype)
    u_bar = u_nb.sum(3) / valid.sum(-1, keepdim=True).clamp_min(1).to(u.dtype)
    return 1.0 - (u * u_bar).sum(-1)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The ALiBi slopes of Press et al. for n_heads heads: the geometric sequence
    2^(-8/n), 2^(-16/n), ... for a power of two n, interleaved with the next power's odd terms
    otherwise. Pass them as ``ascender_attention(..., alibi_slopes=...)``."""

    if n_heads < 1:
        raise ValueError(f"alibi_slopes: n_heads must be >= 1, got {n_heads}")

    def powers_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    p = 1 << (n_heads.bit_length() - 1)  # largest power of two <= n_heads
    slopes = powers_of_two(p)
    if p < n_heads:
        slopes += powers_of_two(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes)


def magnitude_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    t_raw=0.0,
    beta=1.0,
    gamma=0.0,
    n_iter: int = 4,
    eps: float = 1e-3,
    scale: float | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    return_mu: bool = False,
):
    """Magnitude Attention (shared/SPEC.md section 7, seed 004) with the fused O(N)-memory kernel.

    Per batch and head, over the keys not marked in key_padding_mask ([B, N] bool, True =
    padding): Zm_jl = exp(-t ||k_j - k_l||^2 / d) with t = softplus(t_raw); (Zm + eps I) mu = 1 is
    solved by n_iter unrolled conjugate-gradient steps from mu = 0 (never materializing Zm);
    gate_j = sigmoid(beta mu_j + gamma); y = softmax(scale q k^T) (gate * v).

    q, k: [B, H, N, d]; v: [B, H, N, dv]; t_raw, beta, gamma: numbers, 0-dim or [H] tensors
    (learnable; cast to q's dtype). Gradients are exact for the truncated solve as computed
    (the unrolled iterations), w.r.t. q, k, v, t_raw, beta, gamma. is_causal is not supported:
    mu depends on every key. Returns y [B, H, N, dv], or (y, mu) with mu [B, H, N] (0 at padding).
    """
    if is_causal:
        raise ValueError("magnitude_attention: is_causal is not supported: the magnitude weights mu solve a "
                         "system over every key, so a query would see the future through them")
    scale = _check_tensors_and_scale("magnitude_attention", scale, q=q, k=k, v=v)
    if q.device.type != "cpu":
        from . import reference

        _warn_fallback_once(q.device)
        return reference.magnitude_attention_reference(
            q, k, v, t_raw=t_raw, beta=beta, gamma=gamma, n_iter=n_iter, eps=eps, scale=scale,
            key_padding_mask=key_padding_mask, return_mu=return_mu)
    y, mu = torch.ops.ascender.magnitude_fwd(q, k, v, _scalar(t_raw, q), _scalar(beta, q), _scalar(gamma, q),
                                             key_padding_mask, int(n_iter), float(eps), float(scale))
    return (y, mu) if return_mu else y
