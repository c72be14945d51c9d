"""Pure-PyTorch twin of the ASCender operator (shared/SPEC.md, section 4).

Written to be read next to the paper. `ascender_rows` evaluates SPEC section 4 for a block of
query rows against all keys; `ascender_attention_reference`, the dense twin, runs it on every row
at once with squared distances formed as differences, as the SPEC writes them (it materializes
every N x N and the N x N x dz tensors): the oracle of the tests. The block-wise backend
(backends/blockwise.py) runs the same `ascender_rows` one block of rows at a time, with distances
from norms and a product (no N x N x dz tensor). Everything is autograd-differentiable, with the
gradient rules of SPEC section 4: finite for finite inputs, no gradient through masked entries,
zero gradient for the std at std = 0 and for the normalization of a zero vector.
"""

from __future__ import annotations

import math

import torch

from . import _spec as spec
from . import dropout
from ._spec import EPS_NORM, EPS_STD, EPS_TAU, SCALAR_NAMES  # noqa: F401  (SCALAR_NAMES: public name)


def _safe_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / max(||x||, 1e-12) over the last dim; exactly 0 (and no gradient) for x = 0. Scale-safe:
    the norm is taken of u = x / m, m the row's largest magnitude, so rows whose squares overflow the
    dtype (float32 beyond ~1e19, where torch's vector_norm returns inf) normalize exactly (issue 17
    item 5). m is a constant for autograd: x / ||x|| = u / ||u|| does not depend on it."""
    if x.shape[-1] == 0:  # no feature: nothing to normalize (amax needs one)
        return x.clone()
    m = x.detach().abs().amax(-1, keepdim=True)
    some = m > 0
    u = x / torch.where(some, m, torch.ones_like(m))
    nu = torch.linalg.vector_norm(u, dim=-1, keepdim=True)  # in [1, sqrt(f)] where some
    unit = u / torch.where(some, nu, torch.ones_like(nu))
    return torch.where(some, torch.where(m * nu >= EPS_NORM, unit, x / EPS_NORM), torch.zeros_like(x))


def _per_head(value, H: int, like: torch.Tensor) -> torch.Tensor:
    """A python number, 0-dim or [H] tensor as a [1, H, 1, 1] tensor (keeps autograd)."""
    t = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if t.dim() == 0:
        t = t.expand(H)
    return t.reshape(1, H, 1, 1)


def _sinks(value, H: int, like: torch.Tensor) -> torch.Tensor:
    """Sink logits (SPEC section 12) as a [1, H, 1, 1] tensor (a number, 0-dim or [H]: per head) or, from a
    3-D tensor broadcastable to [B, H, Nq], as [B', H', Nq', 1]: per row (docs/backward.md). Keeps autograd."""
    t = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    return t.unsqueeze(-1) if t.dim() == 3 else _per_head(t, H, like)


def _alibi_slopes(value, H: int, like: torch.Tensor) -> torch.Tensor:
    """ALiBi slopes (a number, 0-dim, [H] or [B, H]) as a [1 or B, H, 1, 1] tensor, without gradient."""
    t = torch.as_tensor(value, dtype=like.dtype, device=like.device).detach()
    return t.reshape(t.shape[0], H, 1, 1) if t.dim() == 2 else _per_head(t, H, like)


def allowed_keys(
    B: int,
    H: int,
    Nq: int,
    N: int,
    device,
    is_causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    rows: slice | None = None,
    keys: torch.Tensor | None = None,
    window_size=None,
    global_tokens: int = 0,
    global_mask: torch.Tensor | None = None,
    document_ids: torch.Tensor | None = None,
    first: int | None = None,
) -> torch.Tensor:
    """J: [B, H, b, n] bool, True where query row i (token first + i; first = N - Nq unless given) may
    attend key j (SPEC sections 3 and 8): for the query rows `rows` (default all Nq) and the key tokens
    `keys` (a LongTensor of token indices, default all N):

        J(i) = (window(t) or a global key or a global query) and same document and (j <= t if causal)
               and not padding and attn_mask
    """
    rows = rows or slice(0, Nq)
    keys = torch.arange(N, device=device) if keys is None else keys
    tokens = torch.arange(rows.start, rows.stop, device=device) + first_query(first, Nq, N)  # the rows' own tokens
    J = torch.ones(B, H, rows.stop - rows.start, keys.numel(), dtype=torch.bool, device=device)
    if is_causal:
        J = J & (keys.unsqueeze(0) <= tokens.unsqueeze(1))
    if key_padding_mask is not None:
        J = J & ~key_padding_mask[:, keys].to(torch.bool).reshape(B, 1, 1, keys.numel())
    if attn_mask is not None:
        J = J & block_of(attn_mask, Nq, rows, keys).to(torch.bool)
    if window_size is not None or global_tokens or global_mask is not None:
        left, right = window_size if window_size is not None else (-1, -1)
        local = torch.ones(tokens.numel(), keys.numel(), dtype=torch.bool, device=device)  # [b, n]
        if left >= 0:
            local = local & (keys.unsqueeze(0) >= tokens.unsqueeze(1) - left)
        if right >= 0:
            local = local & (keys.unsqueeze(0) <= tokens.unsqueeze(1) + right)
        local = local | (keys < global_tokens).unsqueeze(0) | (tokens < global_tokens).unsqueeze(1)
        if global_mask is not None:
            g = global_mask.to(torch.bool)
            local = local | g[:, keys].unsqueeze(1) | g[:, tokens].unsqueeze(2)  # [B, b, n]
        J = J & (local.unsqueeze(1) if local.dim() == 3 else local)  # [B, 1, b, n] or [b, n]
    if document_ids is not None:
        same = document_ids[:, tokens].unsqueeze(2) == document_ids[:, keys].unsqueeze(1)  # [B, b, n]
        J = J & same.unsqueeze(1)
    return J


def first_query(query_offset: int | None, Nq: int, N: int) -> int:
    """The token of query row 0: query_offset, or N - Nq (the queries are the last Nq tokens)."""
    return N - Nq if query_offset is None else query_offset


def block_of(m: torch.Tensor, Nq: int, rows: slice, keys: torch.Tensor) -> torch.Tensor:
    """The query rows `rows` and the key tokens `keys` of m, broadcastable to [B, H, Nq, N]."""
    if m.dim() >= 2 and m.shape[-2] == Nq and Nq > 1:
        m = m[..., rows, :]
    return m if m.shape[-1] == 1 else m[..., keys]


def rowdot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """sum_j x_ij y_ij over the last dim, kept [.., b, 1] (no [.., b, n] product is allocated)."""
    return torch.einsum("...j,...j->...", x, y).unsqueeze(-1)


def _row_scaling(beta: torch.Tensor, Tf: torch.Tensor, n: torch.Tensor, unbiased: bool):
    """The row normalization (beta - mean) / (std + 1e-6) over the set T of each row, in two parts:
    dev = (beta - mean) on T, 0 outside it, and std [.., b, 1] (Tf: T as 0/1 in beta's
    dtype, n = |T| [.., b, 1]). Where n <= 1, dev = 0 (n = 1: beta - beta). beta is finite, so T is
    applied by multiplying with Tf (on the CPU a torch.where costs some 20 multiplications). beta's
    storage becomes dev."""
    mean = rowdot(beta, Tf) / n.clamp_min(1)
    dev = beta.sub_(mean).mul_(Tf)  # (in place: beta is the caller's scratch)
    # (vector_norm's gradient is 0 where the norm is 0: the std's gradient at std = 0, SPEC section 4)
    std = torch.linalg.vector_norm(dev, dim=-1, keepdim=True) / (n - 1 if unbiased else n).clamp_min(1).sqrt()
    return dev, std


def eager_cpu(*tensors: torch.Tensor) -> bool:
    """True where a data-dependent branch on these tensors is cheap and allowed: eager mode on the
    CPU, outside torch.compile and torch.func transforms."""
    return not (torch.compiler.is_compiling() or any(t.device.type != "cpu" for t in tensors)
                or any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors))


# Two primes below 2^31 for equal_rows' hashes (products of two residues stay below 2^62)
_HASH_PRIMES = (2 ** 31 - 1, 2 ** 31 - 19)


def equal_rows(x: torch.Tensor) -> torch.Tensor | None:
    """For finite rows x [B, H, N, f]: [B, H, N] the lowest index of a row exactly equal to each (its
    own where none), or None where no two rows are equal (said without a host sync on the CPU only).
    Equal keys must rank equally (SPEC section 4: ties -> lower index), but a matrix product can
    round a_il for two equal keys differently (BLAS blocks the columns), so the ranking reads every
    key's value from its lowest equal key (`tied_positions`). Rows are grouped by a hash of their bits
    (-0.0 as 0.0) modulo two primes, in integers, exactly; a row that differs from the lowest of its
    hash keeps its own index."""
    B, H, N, f = x.shape
    if N < 2:
        return None
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}[x.element_size()]
    bits = (x.detach() + 0.0).contiguous().view(ints).to(torch.int64)
    key = torch.zeros(B, H, N, dtype=torch.int64, device=x.device)
    for i, p in enumerate(_HASH_PRIMES):
        weights = (torch.arange(1, f + 1, device=x.device) * (0x9E3779B1 + i)).remainder(p)
        key = key * p + (bits.remainder(p) * weights).remainder(p).sum(-1).remainder(p)
    sorted_key, perm = key.sort(dim=-1, stable=True)
    repeated = sorted_key[..., 1:] == sorted_key[..., :-1]
    if eager_cpu(x) and not bool(repeated.any()):
        return None
    pos = torch.arange(N, device=x.device).expand(B, H, N)
    start = torch.cat([torch.ones_like(repeated[..., :1]), ~repeated], -1)
    lowest = perm.gather(-1, torch.where(start, pos, torch.zeros_like(pos)).cummax(-1).values)
    canon = torch.empty_like(perm).scatter_(-1, perm, lowest)
    same = (x.gather(2, canon.unsqueeze(-1).expand_as(x)) == x).all(-1)
    return torch.where(same, canon, pos)


def ranking_ties(o: dict, k: torch.Tensor, h_hat: torch.Tensor) -> torch.Tensor | None:
    """equal_rows of what the paper variant's neighbours rank: the keys k for neighbours='scores'
    (s_il = scale q_i . k_l), else the unit semantic rows h_hat (a_il); None for the seed variant."""
    if o["variant"] != "paper":
        return None
    return equal_rows(k if o["neighbours"] == "scores" else h_hat)


def tied_positions(ties: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[B, H, n]: for the key tokens `keys` (sorted), the position among them of the lowest key equal
    to each, from equal_rows' [B, H, N] (whose lowest equal token may lie outside `keys`)."""
    B, H, N = ties.shape
    group = ties[..., keys]
    pos = torch.arange(keys.numel(), device=keys.device).expand_as(group)
    first = torch.full((B, H, N), keys.numel(), dtype=torch.long, device=keys.device)
    return first.scatter_reduce_(-1, group, pos, "amin").gather(-1, group)


def _top_neighbours(a: torch.Tensor, T: torch.Tensor, is_self: torch.Tensor, k_neighbors: int, N: int,
                    tied: torch.Tensor | None = None):
    """N(i): indices [B,H,b,kk] of the top-k a_il over l in T(i), l != the query's own token,
    ties -> lower index, and a validity mask for rows with fewer than kk candidates
    (kk = min(k_neighbors, N - 1), N the number of tokens). tied [B, H, n] (tied_positions): equal
    keys rank by the value of the lowest of them, so that they tie exactly."""
    cand = T & ~is_self
    kk = min(k_neighbors, max(N - 1, 0), a.shape[-1])
    a = a.detach()
    if tied is not None:
        a = a.gather(-1, tied.unsqueeze(2).expand_as(a))
    ranked = a + torch.log(cand.to(a.dtype))  # -inf outside the candidates (a is finite)

    def by_sort():
        return torch.sort(ranked, dim=-1, descending=True, stable=True).indices[..., :kk]

    if kk == 0 or not eager_cpu(ranked):
        order = by_sort()
    else:  # (on the CPU a stable sort of the rows costs ~20x torch.topk)
        values, order = torch.topk(ranked, kk, dim=-1, sorted=False)
        order, at = order.sort(dim=-1)  # the kk by value, ties by lower index
        values, at = values.gather(-1, at).sort(dim=-1, descending=True, stable=True)
        order = order.gather(-1, at)
        # topk picks any of the values equal to the kk-th: exact unless one of them was left out
        last = values[..., -1:]
        left_out = ((ranked >= last).sum(-1, keepdim=True) > kk) & (last > -math.inf)
        if bool(left_out.any()):
            order = torch.where(left_out, by_sort(), order)
    valid = torch.gather(cand, -1, order)
    return order, valid


def neighbour_heading(k_hat: torch.Tensor, order: torch.Tensor, valid: torch.Tensor, alpha_align: float):
    """The paper variant's heading u_i = normalize(m_i), m_i = sum of k^_l over N(i), [B, H, b, d] and its
    gate sigmoid(alpha_align * mean_N ||k^_l - mean_N k^||^2) [B, H, b, 1], from the neighbours' indices
    `order` [B, H, b, kk] into k_hat's rows and their validity. u_i = 0 (no gradient) where ||m_i|| <=
    EPS_HEADING |N(i)|: unit keys that cancel in exact arithmetic (d = 1 with signs +, +, -, -) leave a
    rounding residue that differs between implementations and must not become a unit vector."""
    B, H, b, kk = order.shape
    d = k_hat.shape[-1]
    index = order.reshape(B, H, b * kk, 1).expand(B, H, b * kk, d)
    nb = torch.gather(k_hat, 2, index).reshape(B, H, b, kk, d)  # k^_l, l in N(i)
    nb = nb * valid.unsqueeze(-1).to(k_hat.dtype)
    m = nb.sum(3)
    cnt = valid.sum(-1, keepdim=True).to(k_hat.dtype)
    heading = torch.linalg.vector_norm(m.detach(), dim=-1, keepdim=True) > spec.EPS_HEADING * cnt
    u = torch.where(heading, _safe_normalize(m), torch.zeros_like(m))
    nb_mean = nb.sum(3, keepdim=True) / cnt.unsqueeze(-1).clamp_min(1)
    spread = (((nb - nb_mean) ** 2).sum(-1) * valid.to(k_hat.dtype)).sum(-1, keepdim=True)
    return u, torch.sigmoid(alpha_align * spread / cnt.clamp_min(1))


def _sqdist(x: torch.Tensor, y: torch.Tensor, exact: bool) -> torch.Tensor:
    """||x_i - y_j||^2 for rows x [.., b, f] and y [.., n, f]: [.., b, n]. exact: as differences
    (an [.., b, n, f] tensor, as the SPEC writes it); else ||x_i||^2 + ||y_j||^2 - 2 x_i.y_j as one
    matrix product of the rows extended by their squared norm and a 1, clamped at 0 (by relu: the same
    values, and a backward that costs a third of clamp_min's on the CPU; it passes no gradient at
    exactly 0, where the exact form's is 2 (x_i - y_j) = 0 too)."""
    if exact:
        return ((x.unsqueeze(-2) - y.unsqueeze(-3)) ** 2).sum(-1)
    xx, yy = (x * x).sum(-1, keepdim=True), (y * y).sum(-1, keepdim=True)
    rows = torch.cat([-2.0 * x, xx, torch.ones_like(xx)], -1)
    cols = torch.cat([y, torch.ones_like(yy), yy], -1)
    return (rows @ cols.transpose(-2, -1)).relu_()


def _finite_rows(x: torch.Tensor):
    """x with every NaN / Inf replaced by 0, and the rows (last dim) that had one."""
    ok = torch.isfinite(x)
    return torch.where(ok, x, torch.zeros_like(x)), ~ok.all(-1)


def finite_inputs(q, k, v, z, h, attn_bias=None):
    """SPEC section 11 for autograd: the inputs with every NaN / Inf replaced by 0 (NaN and +Inf in
    attn_bias; -Inf there blocks the key), and which tokens had one: dict(q: [B, H, Nq] rows,
    k, zh, v: [B, H, N] tokens with a non-finite k, z or h, v; bias: like attn_bias). The
    formulas run on the clean values, so a bad token's NaN never meets a zero weight (0 x NaN) in
    a row that cannot see it, forward or backward, and ascender_rows turns the rows that can see it
    into NaN (`poisoned`)."""
    (q, bad_q), (k, bad_k), (v, bad_v), (z, bad_z), (h, bad_h) = (_finite_rows(x) for x in (q, k, v, z, h))
    bad = dict(q=bad_q, k=bad_k, zh=bad_z | bad_h, v=bad_v, bias=None)
    if attn_bias is not None:
        blocked = attn_bias == float("-inf")
        bad["bias"] = ~torch.isfinite(attn_bias) & ~blocked
        attn_bias = torch.where(bad["bias"], torch.zeros_like(attn_bias), attn_bias)
    return (q, k, v, z, h, attn_bias), bad


def finite_heads(sc: dict, slopes, H: int):
    """SPEC section 11 for the per-head values, as finite_inputs for the tokens': the learnable scalars
    sc (scalars_per_head) with every NaN / Inf replaced by the spec's default, the sink logits with
    every NaN replaced by 0 (an infinite sink has finite limits, which the formulas give: +inf makes
    every weight 0, -inf is no sink), the ALiBi slopes (None, a 0-dim, [H] or [B, H] tensor) with theirs
    replaced by 0, and the heads that had one ([1, H], or [B, H] with per-batch slopes). The formulas run on the clean values, so the NaN of
    one head's scalar never meets another head's zero gradient (0 x NaN: a per-head scalar multiplies
    [B, H, ...] tensors, and the gradient of a loss over the other heads is 0, not absent, in its
    head), and `poisoned` makes the head's rows NaN. Per-row sinks ([B', H', Nq', 1]) poison the rows
    that read them: the flags are [1, H, 1], or [B', H', Nq'] as the sinks and slopes broadcast."""
    like = next(iter(sc.values()))
    bad = torch.zeros(1, H, 1, dtype=torch.bool, device=like.device)
    clean = {}
    for name, t in sc.items():
        ok = ~torch.isnan(t) if name == "sinks" else torch.isfinite(t)
        bad = bad | ~ok[..., 0]
        clean[name] = torch.where(ok, t, torch.full_like(t, spec.SCALAR_DEFAULTS.get(name, 0.0)))
    if slopes is not None:
        slopes = torch.as_tensor(slopes, dtype=like.dtype, device=like.device)
        ok = torch.isfinite(slopes)
        bad = bad | ~(ok if ok.dim() == 2 else ok.reshape(1, -1)).unsqueeze(-1)  # (ALiBi [B, H]: that batch's head only)
        slopes = torch.where(ok, slopes, torch.zeros_like(slopes))
    return clean, slopes, bad


def poisoned(bad: dict, J, T, rows: slice, keys: torch.Tensor, Nq: int, first: int, own_k: bool) -> torch.Tensor:
    """[B, H, b] rows that see a non-finite input: their own q, z, h (and k where own_k: the seed
    variant's heading is the row's own key; the paper variant's comes from its neighbours); a token
    of their statistics set with a non-finite k, z or h; a visible key with a non-finite v or bias;
    a non-finite scalar of their head (bad["head"], finite_heads). A row without a visible key sees
    nothing: its output is 0 whatever the inputs."""
    own = torch.arange(rows.start, rows.stop, device=J.device) + first
    kzh = bad["k"] | bad["zh"]
    seen = bad["q"][..., rows] | (kzh if own_k else bad["zh"])[..., own] | (T & kzh[..., None, keys]).any(-1)
    if bad.get("head") is not None:  # [1 or B, H, 1 or Nq]
        seen = seen | (bad["head"][..., rows] if bad["head"].shape[-1] > 1 else bad["head"])
    visible_bad = bad["v"][..., None, keys]
    if bad["bias"] is not None:
        visible_bad = visible_bad | block_of(bad["bias"], Nq, rows, keys)
    return (seen | (J & visible_bad).any(-1)) & J.any(-1)


def scalars_per_head(o: dict, H: int, like: torch.Tensor) -> dict:
    """The nine learnable scalars of the options o, and its sink logits where it has them (SPEC
    section 12), as [1, H, 1, 1] tensors of like's dtype (per-row sinks [B', H', Nq', 1]: _sinks)."""
    sc = {name: _per_head(o[name], H, like) for name in SCALAR_NAMES}
    if o.get("sinks") is not None:
        sc["sinks"] = _sinks(o["sinks"], H, like)
    return sc


def ascender_rows(q, k, v, z, k_hat, h_hat, own: dict, sc: dict, o: dict, J, t0: int, N: int, keys: torch.Tensor,
                  exact: bool, want_maps: bool = False, want_aux: bool = False, bad: dict | None = None,
                  keep: dict | None = None, ties: torch.Tensor | None = None) -> dict:
    """SPEC section 4 for a block of query rows: q [B, H, b, d] holds tokens t0 .. t0 + b - 1; k, v, z
    [B, H, n, *] the key tokens `keys` (a LongTensor [n], sorted, holding every key the rows can see:
    all N tokens, or fewer for a causal or windowed block), k_hat, h_hat their normalized keys and
    semantic projections; own = dict(z, k_hat, h_hat) of the rows' own tokens [B, H, b, *]; sc the
    scalars (scalars_per_head, with the sink logits), o the options (attn_bias: this block's), J [B, H, b, n] the visible
    keys, bad the flags of finite_inputs (the inputs given are its clean ones). Returns dict(y, u,
    nbr) (u the headings; nbr the neighbours' tokens, -1 past the end), with want_aux the rows' aux
    terms coh and sep, with want_maps the maps over the n keys; a row that sees a non-finite input
    has NaN in all of them. keep: a dict that receives the intermediate tensors (the block-wise
    backward's recomputation, backends/block_grad.py). ties: equal_rows of what the paper variant's
    neighbours rank (h_hat, or k for neighbours='scores') over all N tokens, or None."""
    B, H, b, d = q.shape
    paper = o["variant"] == "paper"
    T = J if o["mask_stats"] else torch.ones_like(J)  # the statistics set of each row
    Tf = T.to(q.dtype)  # masks multiply (every pair quantity is finite for finite inputs): see _row_scaling
    n = Tf.sum(-1, keepdim=True)
    tokens = torch.arange(t0, t0 + b, device=q.device)  # the rows' own tokens
    is_self = keys.unsqueeze(0) == tokens.unsqueeze(1)  # [b, n]

    s = (o["scale"] * q) @ k.transpose(-2, -1)
    a = own["h_hat"] @ h_hat.transpose(-2, -1)
    D = _sqdist(own["z"], z, exact)
    ws = (D * (-1.0 / (o["tau_sep"] + EPS_TAU))).exp_()
    wc = ws if o["tau_coh"] == o["tau_sep"] else (D * (-1.0 / (o["tau_coh"] + EPS_TAU))).exp_()

    # Alignment
    if paper:  # N(i): the top-k of a_il (or of s_il, neighbours="scores") over T(i) minus i
        tied = None if ties is None else tied_positions(ties, keys)
        order, valid = _top_neighbours(s if o["neighbours"] == "scores" else a, T, is_self, o["k_neighbors"], N, tied)
        u, gate_a = neighbour_heading(k_hat, order, valid, o["alpha_align"])
        beta_align = (sc["lambda_align"] * gate_a * u) @ k_hat.transpose(-2, -1)
        nbr = torch.where(valid, keys[order], torch.full_like(order, -1))
    else:
        u = own["k_hat"]
        beta_align = (sc["lambda_align"] * u) @ k_hat.transpose(-2, -1)
        nbr = torch.zeros(B, H, b, 0, dtype=torch.long, device=q.device)

    # Separation
    dens = Tf * (~is_self).to(q.dtype) if paper else Tf
    rho = rowdot(ws, dens)
    eta = torch.clamp(rho / (sc["kappa"] + EPS_TAU), 0.0, 1.0)
    near = a.sub_(sc["delta"]).relu_()  # (a's storage: a is not needed after the neighbours)
    phi = ws * near
    beta_sep = (-sc["lambda_sep"] * eta) * phi

    # Cohesion
    wcT = wc * Tf
    wc_sum = wcT.sum(-1, keepdim=True)
    c = (wcT @ z) / (wc_sum + EPS_TAU)  # [B,H,b,dz]
    rc = _sqdist(c, z, exact)  # [B,H,b,n]: ||z_j - c_i||^2
    if paper:
        gate_c = torch.sigmoid(o["alpha_coh"] * rowdot(wcT, rc) / (wc_sum + EPS_TAU))
    else:
        gate_c = 1.0
    beta_coh = (sc["lambda_coh"] * gate_c * (-1.0 / (o["tau_coh"] + EPS_TAU))) * rc

    # Row normalization and combination: S = s + sum_X omega_X b~_X, b~_X = dev_X / (std_X + 1e-6)
    scaled = {X: _row_scaling(beta, Tf, n, unbiased=not paper)
              for X, beta in (("align", beta_align), ("sep", beta_sep), ("coh", beta_coh))}
    # (updated in place, which autograd allows here; under torch.func transforms, which have no batching
    # rule for addcmul_, out of place)
    S = s.clone() if want_maps else s
    batched = not torch.compiler.is_compiling() and torch._C._functorch.is_functorch_wrapped_tensor(S)
    add = torch.addcmul if batched else torch.Tensor.addcmul_
    for X, (dev, std) in scaled.items():
        S = add(S, dev, sc["omega_" + X] / (std + EPS_STD))

    # beta^(other): a dense additive bias and ALiBi, -m_h |t - j| (paper sections 1, 11)
    other = o["attn_bias"]
    if o["alibi_slopes"] is not None:
        distance = (tokens.unsqueeze(1) - keys.unsqueeze(0)).abs().to(q.dtype)
        alibi = -_alibi_slopes(o["alibi_slopes"], H, q) * distance
        other = alibi if other is None else other + alibi
    # SPEC section 9: the softcap on the full score (inside), or on the score without beta^(other), which
    # is added after the cap (outside: FlashAttention's order); both before the temperature
    outside = o["softcap"] is not None and o["softcap_bias"] == "outside"
    if other is not None and not outside:
        S = S + other
    if o["softcap"] is not None:
        S = o["softcap"] * torch.tanh(S / o["softcap"])
    capped = S  # (the softcap's output: its derivative is 1 - (capped / softcap)^2)
    if other is not None and outside:
        S = S + other

    # Softmax over J(i); masked entries never reach the score_temp gradient; empty rows -> 0
    # (added to x, log(Jf) is -inf at a masked key, where A is then exactly 0 and passes no gradient to
    # x; a row without a visible key gets log(1) = 0 everywhere, and its outputs are zeroed: `seen`)
    Jf = Tf if o["mask_stats"] else J.to(q.dtype)
    empty = (n == 0 if o["mask_stats"] else ~J.any(-1, keepdim=True)).to(q.dtype)
    x = S / (sc["score_temp"] + EPS_TAU)
    x = x.add_((Jf + empty).log_())
    if sc.get("sinks") is None:
        A = torch.softmax(x, dim=-1)
    else:  # SPEC section 12: the sink logit joins the denominator only, A_ij = exp(x_ij - log(e^sink + sum_l e^x_il))
        # relative to the row's largest x (A does not depend on it, so it is held fixed): x - lse of
        # logits near 1e11 lost their last digits (3e-5 relative in y where the largest weights tie)
        top = x.detach().amax(-1, keepdim=True) if x.shape[-1] else x.new_zeros(*x.shape[:-1], 1)  # (no key)
        lse_x = torch.logsumexp(x - top, dim=-1, keepdim=True)
        lse = torch.logaddexp(lse_x, sc["sinks"] - top)
        A = torch.exp(x - top - lse)
    seen = 1.0 - empty  # [B,H,b,1]
    # SPEC section 9b: dropout on the weights of the output only (the statistics, aux and maps keep A), each
    # pair kept (factor 1 / (1 - p)) or dropped by dropout.keep_mask, the kernels' Philox mask
    drop = None
    if o["dropout_p"] > 0:
        kept = dropout.keep_mask(o["dropout_seed"], o["dropout_p"], B, H, tokens, keys, inspect_keys=eager_cpu(keys))
        drop = kept.to(q.dtype) * (1.0 / (1.0 - o["dropout_p"]))
    Av = (A if drop is None else A * drop) @ v
    out = dict(y=Av * seen, u=u)
    if want_aux:
        out.update(coh=(rowdot(A, rc) * seen)[..., 0], sep=(rowdot(A, phi) * seen)[..., 0])
    if want_maps:
        out["maps"] = dict(S_base=s, **{"b_" + X: dev / (std + EPS_STD) for X, (dev, std) in scaled.items()},
                           A=A * seen)
    # (eager on the CPU, a data-dependent branch: rows that see no non-finite input keep the tensors as
    # they are, and with no non-finite input at all `poisoned`'s [b, n] passes are skipped; elsewhere no
    # host sync, and no data-dependent branch under torch.compile or torch.func transforms)
    flags = [f for f in (bad or {}).values() if f is not None]
    on_cpu = eager_cpu(q, *flags)
    sick = None
    if bad is not None and not (on_cpu and not any(bool(f.any()) for f in flags)):
        Nq = bad["q"].shape[-1]
        first = first_query(o["query_offset"], Nq, N)
        rows = slice(t0 - first, t0 - first + b)
        sick = poisoned(bad, J, T, rows, keys, Nq, first, own_k=not paper)
        if not on_cpu or bool(sick.any()):
            out = {name: _nan_rows(t, sick) for name, t in out.items()}
            if want_maps:
                out["maps"] = {name: _nan_rows(m, sick) for name, m in out["maps"].items()}
    out["nbr"] = nbr
    if keep is not None:
        keep.update(Tf=Tf, n=n, dens=dens, D=D, ws=ws, wc=wc, near=near, rho=rho, eta=eta,
                    phi=phi, wcT=wcT, wc_sum=wc_sum, c=c, rc=rc, gate_c=gate_c, scaled=scaled, S=S, capped=capped,
                    A=A, drop=drop, seen=seen, Av=Av, u=u, sick=sick)
        if sc.get("sinks") is not None:
            # the sink's weight exp(sink - lse), [B, H, b, 1], written so that a sink of +inf gives 1, not inf - inf
            keep["a_sink"] = torch.exp(-torch.nn.functional.softplus(lse_x + top - sc["sinks"]))
        if paper:
            keep.update(order=order, valid=valid, gate_a=gate_a)
    return out


def _nan_rows(t, rows: torch.Tensor):
    """t ([B, H, b] or [B, H, b, *]) with NaN in the given rows (dicts pass through)."""
    if isinstance(t, dict):
        return t
    mask = rows if t.dim() == rows.dim() else rows.unsqueeze(-1)
    return torch.where(mask, torch.full_like(t, math.nan), t)


def alignment_rows(u: torch.Tensor, nbr: torch.Tensor, u_all: torch.Tensor | None = None) -> torch.Tensor:
    """L_align's per-row term 1 - u_i . mean_{l in N(i)} u_l (1 where N(i) is empty), from the rows'
    headings u [B, H, N, d], their neighbour indices nbr [B, H, N, kk] (-1 past the end) and the
    headings of every token u_all (default u: the rows are every token): O(N kk d) memory,
    differentiable in u and u_all."""
    B, H, N, d = u.shape
    kk = nbr.shape[-1]
    valid = nbr >= 0
    index = nbr.clamp_min(0).reshape(B, H, N * kk, 1).expand(B, H, N * kk, d)
    u_nb = torch.gather(u if u_all is None else u_all, 2, index).reshape(B, H, N, kk, d)
    u_nb = torch.where(valid.unsqueeze(-1), u_nb, torch.zeros_like(u_nb))  # (never 0 x a NaN heading)
    u_bar = u_nb.sum(3) / valid.sum(-1, keepdim=True).clamp_min(1).to(u.dtype)
    return 1.0 - (u * u_bar).sum(-1)


def visible(o: dict, B: int, H: int, Nq: int, N: int, device, rows: slice | None = None,
            keys: torch.Tensor | None = None) -> torch.Tensor:
    """allowed_keys with the options o's masks, windows, global tokens and documents."""
    return allowed_keys(B, H, Nq, N, device, o["is_causal"], o["key_padding_mask"], o["attn_mask"], rows, keys,
                        o["window_size"], o["global_tokens"], o["global_mask"], o["document_ids"], o["query_offset"])


def check_variant(o: dict) -> None:
    if o["variant"] not in spec.VARIANTS:
        raise ValueError(f"variant must be one of {spec.VARIANTS} (or 'reference' for 'seed'), got {o['variant']!r}")


def ascender_attention_reference(q, k, v, z, h, *, return_maps=False, return_aux=False, generator=None, **keywords):
    """ASCender attention, SPEC section 4: q [B, H, Nq, d], k, v, z, h [B, H, N, *], with the
    keyword arguments of the op (ascender_torch/_spec.py; defaults shown):
{keywords}

    The queries are the last Nq <= N tokens (query i is token t = i + N - Nq; Nq = N for
    self-attention), so a cached decoder can ask for its newest rows only, or with query_offset the
    tokens query_offset .. query_offset + Nq - 1 (a context-parallel rank's rows). attn_bias
    (broadcastable to [B, H, Nq, N], finite: block keys with attn_mask) and ALiBi slopes ([H])
    add beta^(other) to S; sinks ([H], 0-dim or a number; or 3-D, broadcastable to [B, H, Nq]: one per
    row) join the softmax's denominator only (SPEC section 12). Returns
    y [B, H, Nq, dv], or (y, maps) with return_maps=True, where maps holds the [B, H, Nq, N]
    tensors S_base, b_align, b_sep, b_coh (normalized biases before omega, 0 outside the
    statistics set) and A (attention weights). return_aux=True appends the per-row terms of the
    auxiliary losses of paper section 8 (SPEC section 5), a dict of [B, H, N] tensors:
    coh_i = sum_j A_ij ||z_j - c_i||^2, sep_i = sum_j A_ij phi_ij and, for the paper variant,
    align_i = 1 - u_i . mean_{{l in N(i)}} u_l (1 when N(i) is empty); self-attention only.
    dropout_p > 0 without a dropout_seed draws one from generator (or torch's default generator of q's
    device), as ascender_attention does.
    """
    o = spec.options("ascender_attention_reference", spec.ASCENDER_KEYWORDS, keywords)
    check_variant(o)
    if o["softcap_bias"] not in ("inside", "outside"):
        raise ValueError(f"softcap_bias must be 'inside' or 'outside', got {o['softcap_bias']!r}")
    dropout.resolve_seed(o, q.device, generator)
    B, H, Nq, _ = q.shape
    N = k.shape[2]
    if return_aux and Nq != N:
        raise ValueError(f"return_aux needs self-attention (Nq = N): L_align uses the headings of every token, "
                         f"got Nq = {Nq} queries for N = {N} keys")
    o["scale"] = spec.resolved_scale(o["scale"], q)
    J = visible(o, B, H, Nq, N, q.device)
    (q, k, v, z, h, o["attn_bias"]), bad = finite_inputs(q, k, v, z, h, o["attn_bias"])
    sc, o["alibi_slopes"], bad["head"] = finite_heads(scalars_per_head(o, H, q), o["alibi_slopes"], H)
    k_hat, h_hat = _safe_normalize(k), _safe_normalize(h)
    first = first_query(o["query_offset"], Nq, N)
    own = {name: x[..., first:first + Nq, :] for name, x in dict(z=z, k_hat=k_hat, h_hat=h_hat).items()}
    r = ascender_rows(q, k, v, z, k_hat, h_hat, own, sc, o, J, first, N,
                      torch.arange(N, device=q.device), exact=True, want_maps=return_maps, want_aux=return_aux,
                      bad=bad, ties=ranking_ties(o, k, h_hat))
    outputs = (r["y"],)
    if return_maps:
        outputs += (r["maps"],)
    if return_aux:
        aux = dict(coh=r["coh"], sep=r["sep"])
        if o["variant"] == "paper":
            aux["align"] = alignment_rows(r["u"], r["nbr"])
        outputs += (aux,)
    return outputs if len(outputs) > 1 else r["y"]


# ---------------------------------------------------------------------------------------------
# Magnitude Attention (SPEC section 7, seed 004)
# ---------------------------------------------------------------------------------------------


def _magnitude_cg(A: torch.Tensor, b: torch.Tensor, n_iter: int) -> torch.Tensor:
    """Exactly n_iter unrolled conjugate-gradient steps for A mu = b from mu = 0, batched over
    [B, H]: A [B, H, N, N] symmetric, b [B, H, N]. Returns mu [B, H, N].

    Freeze rule (the fused kernel's): a (b, h) whose rho = r.r is not above eps_dtype^2 rho_0
    (converged to rounding), or whose sigma = p.A p is not > 0, at a step stops iterating for
    good (its mu stays); further steps would only amplify rounding noise.
    Every division goes through a safe denominator, so a frozen (b, h) makes no NaN or inf in
    the forward or the backward pass.
    """
    x = torch.zeros_like(b)
    r = b  # r0 = b - A x0 = b
    p = r
    rho = (r * r).sum(-1)  # [B, H]
    floor = torch.finfo(b.dtype).eps ** 2 * rho
    active = torch.ones_like(rho, dtype=torch.bool)
    for _ in range(n_iter):
        w = (A @ p.unsqueeze(-1)).squeeze(-1)  # A p
        sigma = (p * w).sum(-1)
        active = active & (rho > floor) & (sigma > 0)  # once False, stays False
        alpha = torch.where(active, rho, torch.zeros_like(rho)) / torch.where(active, sigma, torch.ones_like(sigma))
        x_new = x + alpha.unsqueeze(-1) * p
        r_new = r - alpha.unsqueeze(-1) * w
        rho_new = (r_new * r_new).sum(-1)
        beta_cg = torch.where(active, rho_new, torch.zeros_like(rho_new)) / torch.where(active, rho, torch.ones_like(rho))
        p_new = r_new + beta_cg.unsqueeze(-1) * p
        keep = active.unsqueeze(-1)
        x, r, p = torch.where(keep, x_new, x), torch.where(keep, r_new, r), torch.where(keep, p_new, p)
        rho = torch.where(active, rho_new, rho)
    return x


def magnitude_attention_reference(q, k, v, *, is_causal=False, return_mu=False, **keywords):
    """Magnitude Attention, SPEC section 7 (seed 004): q, k [B, H, N, d], v [B, H, N, dv], with the
    keyword arguments of the op (ascender_torch/_spec.py; defaults shown):
{keywords}

    t_raw, beta, gamma: python numbers, 0-dim or per-head [H] tensors (learnable; t = softplus(t_raw)).
    key_padding_mask: [B, N] bool, True = padding. Per (b, h), over the valid keys:

        Zm_jl  = exp(-t ||k_j - k_l||^2 / d_k)                     Gaussian kernel of the key set
        (Zm + eps I) mu = 1                                     n_iter CG steps from mu = 0
        gate_j = sigmoid(beta mu_j + gamma)                     magnitude gate
        y      = softmax(scale q k^T) (gate * v)                 scale = 1/sqrt(d) by default

    A padded key's row and column of Zm + eps I are removed (zero, with its mu fixed at 0), and a
    query row with no valid key outputs 0. The gradients are those of the truncated solve as
    computed (the unrolled iterations). Materializes the N x N x d differences: an oracle, not
    fast. Returns y [B, H, N, dv], or (y, mu) with return_mu=True (mu [B, H, N], 0 at padded keys).
    """
    if is_causal:
        raise ValueError("magnitude_attention: is_causal is not supported: the magnitude weights mu depend on "
                         "every key (the solve couples all of them), so a query cannot be restricted to a prefix")
    o = spec.options("magnitude_attention_reference", spec.MAGNITUDE_KEYWORDS, keywords)
    B, H, Nq, d = q.shape
    N = k.shape[2]
    if Nq != N:
        raise ValueError(f"magnitude_attention: q must have as many rows as k (self-attention), got {Nq} and {N}")
    scale = spec.resolved_scale(o["scale"], q)
    key_padding_mask, n_iter, eps = o["key_padding_mask"], o["n_iter"], o["eps"]
    t = torch.nn.functional.softplus(_per_head(o["t_raw"], H, q))  # [1, H, 1, 1]
    beta = _per_head(o["beta"], H, q)[..., 0]  # [1, H, 1]
    gamma = _per_head(o["gamma"], H, q)[..., 0]

    if key_padding_mask is None:
        valid = torch.ones(B, 1, N, dtype=torch.bool, device=q.device)
    else:
        valid = ~key_padding_mask.to(torch.bool).reshape(B, 1, N)
    valid = valid.expand(B, H, N)
    (q, k, v), poison_rows, poison_mu = _magnitude_finite(q, k, v, valid, n_iter)
    pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)  # [B, H, N, N]: both keys valid

    # Step 1: key-space geometry, Zm_jl = exp(-t ||k_j - k_l||^2 / d_k), squared distances as differences
    D = ((k.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1)  # [B, H, N, N]
    Zm = torch.exp(-t * D / d)
    eye = torch.eye(N, dtype=torch.bool, device=q.device)
    A = torch.where(pair, Zm + eps * eye.to(q.dtype), torch.zeros_like(Zm))  # Zm + eps I on the valid keys

    # Step 2: the uniqueness weights, (Zm + eps I) mu = 1 by truncated CG (padded keys: b = 0, mu = 0)
    mu = _magnitude_cg(A, valid.to(q.dtype), n_iter)

    # Step 3: the magnitude gate on the values, then softmax attention over the valid keys
    gate = torch.sigmoid(beta * mu + gamma)  # [B, H, N]
    s = scale * (q @ k.transpose(-2, -1))
    J = valid.unsqueeze(-2).expand(B, H, Nq, N)
    s = torch.where(J, s, torch.full_like(s, -math.inf))
    empty = ~J.any(-1, keepdim=True)
    s = torch.where(empty, torch.zeros_like(s), s)
    P = torch.where(J, torch.softmax(s, dim=-1), torch.zeros_like(s))
    y = P @ (gate.unsqueeze(-1) * v)
    y = torch.where(poison_rows.unsqueeze(-1), torch.full_like(y, math.nan), y)
    mu = torch.where(poison_mu, torch.full_like(mu, math.nan), mu)
    return (y, mu) if return_mu else y


def _magnitude_finite(q, k, v, valid, n_iter: int):
    """SPEC section 11 for Magnitude Attention, valid [B, H, N] the keys that are not padding: the
    inputs with every non-finite entry replaced by 0 (the computation runs on those, so its gradients
    stay finite), the rows [B, H, N] to set to NaN afterwards, and the entries of mu to set to NaN. A
    non-finite query makes its own row NaN (unless the row has no valid key: then it outputs 0 and
    reads no query); a non-finite key or value of a valid key makes every row of its (batch, head)
    NaN, since every row attends to every valid key, and a key's also every valid entry of mu once
    the solve takes a step (n_iter > 0); a padded key is never read."""
    (q, bad_q), (k, bad_k), (v, bad_v) = (_finite_rows(x) for x in (q, k, v))
    sick_k, sick_v = bad_k & valid, bad_v & valid  # [B, H, N]
    poison_rows = (bad_q & valid.any(-1, keepdim=True)) | (sick_k | sick_v).any(-1, keepdim=True)
    poison_mu = sick_k.any(-1, keepdim=True) & valid & (n_iter > 0)
    return (q, k, v), poison_rows, poison_mu


ascender_attention_reference.__signature__ = spec.signature(spec.INPUTS, spec.ASCENDER_KEYWORDS,
                                                            dict(return_maps=False, return_aux=False, generator=None))
ascender_attention_reference.__doc__ = ascender_attention_reference.__doc__.format(
    keywords=spec.keyword_doc(spec.ASCENDER_KEYWORDS))
magnitude_attention_reference.__signature__ = spec.signature(spec.MAGNITUDE_INPUTS, spec.MAGNITUDE_KEYWORDS,
                                                             dict(is_causal=False, return_mu=False))
magnitude_attention_reference.__doc__ = magnitude_attention_reference.__doc__.format(
    keywords=spec.keyword_doc(spec.MAGNITUDE_KEYWORDS))
