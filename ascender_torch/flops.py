"""Attention FLOP counts of plain softmax attention and of ASCender (both variants), forward and
backward, per head and per layer: ``ascender_torch.flops(config, N)``.

What is counted: the attention operation itself, from q, k, v (and z, h for ASCender) to y and
back to their gradients -- not the linear projections that produce them (ASCender's extra
projections U, P cost 2 N d_model (dz + da) per head forward and twice that backward; add them
yourself when comparing whole layers).

Conventions: a multiply-add is 2 FLOPs; +, -, *, /, max, a comparison and a relu are 1; exp,
sqrt and sigmoid count 1 each (transcendentals as one operation, as in most FLOP tables). Work
per (query, key) pair is multiplied by the number of pairs: N^2, or N (N + 1) / 2 when causal
(every kept reduction in the kernels is over the visible keys only). Work per query row or per
token (norms, the neighbour heading u_i, gates, row moments' finalization) is listed separately;
it is O(N) and vanishes next to the pair terms for large N.

Plain attention: forward QK^T, scale, online-softmax max/subtract/exp/sum and A V; backward as
FlashAttention 2 does it (recompute S and A, dP = dO V^T, dS, dQ, dK, dV). ASCender: the passes of
docs/forward.md, counted from the formulas of SPEC section 4; the backward recomputes a row's
forward state (passes 1 to 3, not the output) and then runs passes 1 to 4 of docs/backward.md.
These are operation counts of the formulas as the kernels evaluate them, not measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _spec as spec


@dataclass(frozen=True)
class AttentionConfig:
    """Shapes of one attention layer: d (q/k head dim), dv (value head dim, default d), dz and da
    (latent and semantic dims, default d // 2), k_neighbors (paper variant's top-k), heads, variant
    ("paper" or "seed"; "reference" is accepted for "seed"), causal, and the structured visibility
    of SPEC section 8: window (left, right) with -1 unbounded, global_tokens."""

    d: int
    dv: int | None = None
    dz: int | None = None
    da: int | None = None
    k_neighbors: int = 16
    heads: int = 1
    variant: str = "paper"
    causal: bool = False
    window: tuple | None = None
    global_tokens: int = 0

    def __post_init__(self):
        object.__setattr__(self, "variant", spec.canonical_variant(self.variant))
        if self.variant not in spec.VARIANTS:
            raise ValueError(f"AttentionConfig: variant must be 'paper' or 'seed' (alias 'reference'), "
                             f"got {self.variant!r}")
        for name in ("dv", "dz", "da"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.d if name == "dv" else self.d // 2)

    @classmethod
    def of(cls, module, causal=False):
        """The config of an ASCenderAttention or ASCenderHead module."""
        from .modules import ASCenderAttention, ASCenderHead

        if isinstance(module, ASCenderAttention):
            return cls(d=module.d_head, dz=module.d_latent, da=module.d_latent, k_neighbors=module.k,
                       heads=module.n_heads, variant=module.variant, causal=causal)
        if isinstance(module, ASCenderHead):
            d = module.WQ.out_features
            return cls(d=d, dz=module.U.out_features, da=module.P.out_features, k_neighbors=module.k,
                       variant=module.variant, causal=causal)
        raise TypeError(f"AttentionConfig.of: expected ASCenderAttention or ASCenderHead, got {type(module).__name__}")


def _plain_pair(c):
    forward = {"s = q.k (+ scale)": 2 * c.d + 1, "softmax: max, subtract, exp, sum": 4, "y += e v": 2 * c.dv}
    backward = {"recompute s and A (scale, subtract, exp)": 2 * c.d + 3, "dP = dO.v": 2 * c.dv,
                "dS = A (dP - D), scale": 3, "dQ += dS k": 2 * c.d, "dK += dS q": 2 * c.d, "dV += A dO": 2 * c.dv}
    return forward, backward


def _plain_row(c):
    return {"y /= sum": c.dv}, {"D = dO.O": 2 * c.dv}


def _ascender_pair(c):
    """Forward terms without the output (the backward recomputes these), the output, the backward."""
    paper = c.variant == "paper"
    state = {
        "pass 1: D = |z_i - z_j|^2": 3 * c.dz,
        "pass 1: a = (h_i.h_j) rh_i rh_j": 2 * c.da + 2,
        "pass 1: ws, wc (scale, exp)": 4,
        "pass 1: rho, sum wc, centroid sum wc z": 2 + 2 * c.dz,
        "neighbours: top-k candidate test": 1 if paper else 0,
        "pass 2: s = scale q.k": 2 * c.d + 1,
        "pass 2: r = rk_j (u_i.k_j)": 2 * c.d + 1,
        "pass 2: |z_j - c_i|^2": 3 * c.dz,
        "pass 2: raw biases (align 1, sep 4, coh 1)": 6,
        "pass 2: cohesion gate sum wc rc": 2 if paper else 0,
        "moments: mean and two-pass variance of 3 rows": 12,
        "pass 3: normalize 3 rows, S = s + sum omega b, / temp": 13,
        "pass 3: max, subtract, exp, sum": 4,
    }
    output = {"pass 4: y += e v": 2 * c.dv}
    backward = {
        "pass 1: dA = dy.v, dx, dS": 2 * c.dv + 3,
        "pass 1: dv += A dy": 2 * c.dv,
        "pass 1: d temp, d omega (3), g = omega dS (3)": 2 + 6 + 3,
        "pass 1: dq += dS k, dk += dS q": 4 * c.d + 1,
        "pass 2: row normalization backward (3 rows)": 33,
        "pass 3: alignment (k^, dlambda, dk^_j, du / dk^_i)": 5 * c.d + 3,
        "pass 3: separation (dphi, dws, da, ddelta)": 9,
        "pass 3: cohesion (drc, dc, dz_j, dwc)": 9 * c.dz + (11 if paper else 7),
        "pass 4: dD, dz_i, dz_j": 5 * c.dz + 5,
        "pass 4: dh^_i, dh^_j (h^_j)": 5 * c.da,
    }
    return state, output, backward


def _ascender_row(c):
    """Per query row (forward; the backward recomputes it and adds its own row terms)."""
    paper = c.variant == "paper"
    k = c.k_neighbors
    forward = {"moments: 3 std (sqrt, divide)": 9, "centroid divide, eta clamp": c.dz + 4, "y /= sum, log": c.dv + 1}
    if paper:
        forward["u_i = normalize(sum of k neighbour k^), gate a (mean, spread, sigmoid)"] = 4 * k * c.d + 4 * c.d + 6
        forward["gate c (divide, sigmoid)"] = 3
    backward = {"row sums (P, g-bar, Gamma, d sigma) for 3 rows": 2 * c.dv + 12, "dc, dG, deta, drho, dkappa": c.dz + 8}
    if paper:
        backward["du -> dm (projection), dV -> neighbours' dk^"] = 4 * c.d + 4 * k * c.d + 4
    return forward, backward


def _ascender_token(c):
    """Per token: inverse norms of k and h (forward); their normalization backward."""
    return {"1/|k|, 1/|h|": 2 * c.d + 2 * c.da + 4}, {"dk, dh through the normalization": 5 * c.d + 5 * c.da}


def visible_pairs(N: int, causal: bool = False, window=None, global_tokens: int = 0) -> int:
    """The number of (query, key) pairs with j in J(i) (SPEC sections 3 and 8, no padding or
    attn_mask): per query token t the keys of its window (and j <= t when causal), plus the global
    keys outside it; a global query sees every key (every earlier one when causal)."""
    left, right = window if window is not None else (-1, -1)
    g = min(global_tokens, N)
    total = 0
    for t in range(N):
        last = t if causal else N - 1  # the last key t may see at all
        if t < g or window is None:
            total += last + 1
            continue
        lo = 0 if left < 0 else max(0, t - left)
        hi = last if right < 0 else min(last, t + right)
        inside = max(0, hi - lo + 1)
        globals_outside = sum(1 for j in range(min(g, last + 1)) if not lo <= j <= hi)
        total += inside + globals_outside
    return total


def flops(config, N: int) -> dict:
    """Attention FLOPs at sequence length N (see the module docstring for what and how).

    config: an AttentionConfig, a dict of its fields, or an ASCenderAttention / ASCenderHead module
    (non-causal; pass AttentionConfig.of(module, causal=True) for causal).

    Returns {"plain": {...}, "ascender": {...}, "ratio": {...}, "config": AttentionConfig} where each
    of plain/ascender holds "forward", "backward", "total" per head and "forward_layer",
    "backward_layer", "total_layer" (times heads), "per_pair" (forward, backward FLOPs per (i, j)
    pair) and "terms" (the itemized per-pair, per-row and per-token counts); "ratio" is ascender /
    plain for forward, backward and total.
    """
    if isinstance(config, dict):
        config = AttentionConfig(**config)
    elif not isinstance(config, AttentionConfig):
        config = AttentionConfig.of(config)
    c = config
    pairs = visible_pairs(N, c.causal, c.window, c.global_tokens)

    plain_fwd_pair, plain_bwd_pair = _plain_pair(c)
    plain_fwd_row, plain_bwd_row = _plain_row(c)
    state, output, asc_bwd_pair = _ascender_pair(c)
    asc_fwd_row, asc_bwd_row = _ascender_row(c)
    asc_fwd_tok, asc_bwd_tok = _ascender_token(c)

    def model(fwd_pair, bwd_pair, fwd_row, bwd_row, fwd_tok, bwd_tok):
        f_pair, b_pair = sum(fwd_pair.values()), sum(bwd_pair.values())
        f_lin = N * (sum(fwd_row.values()) + sum(fwd_tok.values()))
        b_lin = N * (sum(bwd_row.values()) + sum(bwd_tok.values()))
        forward, backward = pairs * f_pair + f_lin, pairs * b_pair + b_lin
        return {"forward": forward, "backward": backward, "total": forward + backward,
                "forward_layer": c.heads * forward, "backward_layer": c.heads * backward,
                "total_layer": c.heads * (forward + backward), "per_pair": (f_pair, b_pair),
                "terms": {"forward_pair": fwd_pair, "backward_pair": bwd_pair, "forward_row": fwd_row,
                          "backward_row": bwd_row, "forward_token": fwd_tok, "backward_token": bwd_tok}}

    plain = model(plain_fwd_pair, plain_bwd_pair, plain_fwd_row, plain_bwd_row, {}, {})
    recompute = {f"recompute {name}": value for name, value in state.items()}
    ascender = model({**state, **output}, {**recompute, **asc_bwd_pair}, asc_fwd_row,
                     {**{f"recompute {n}": v for n, v in asc_fwd_row.items() if not n.startswith("y")}, **asc_bwd_row},
                     asc_fwd_tok, {**asc_fwd_tok, **asc_bwd_tok})
    ratio = {key: ascender[key] / plain[key] for key in ("forward", "backward", "total")}
    return {"plain": plain, "ascender": ascender, "ratio": ratio, "config": c}
