"""The block-wise backend: SPEC section 4 in PyTorch ops on any device and dtype, one block of
query rows at a time against the keys the block can see.

Each block runs the twin's formulas (`reference.ascender_rows`) with every pair product a matrix
product (q kᵀ, ĥ ĥᵀ, the headings against k̂, the centroids against z, A v) and the squared distances
formed from norms and a product (clamped at 0), so no N x N x dz tensor exists and the largest
tensors are [B, H, block, N]. Under autograd each block is a `torch.utils.checkpoint` region: the
backward recomputes one block at a time, so forward and backward keep O(block x N) memory. The
block has as many rows as fit the memory budget (`backends.attention_backend(block_memory=...)`). A causal block with
mask_stats=True reads only the keys up to its last token. float16 and bfloat16 inputs are computed
in float32 and the results returned in their own dtype.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from .. import _spec as spec
from .. import reference as formulas

# [B, H, block, N] tensors one block keeps alive at the peak of its recomputation with autograd,
# counted in elements of the compute dtype: at most 32 measured (benchmarks/bench_blockwise.py,
# float32, N = 4096, both variants), with a margin
LIVE_PAIR_TENSORS = 48


def rows_per_block(B: int, H: int, N: int, element_size: int, budget: int) -> int:
    """How many query rows a block may hold within `budget` bytes."""
    per_row = B * H * max(N, 1) * element_size * LIVE_PAIR_TENSORS
    return max(1, budget // per_row)


def attention(a: dict, return_maps: bool, return_aux: bool, memory: int, rows: int | None = None) -> tuple:
    """The op's arguments `a` (by name, checked) -> (y, [maps], [aux]) like the fused backend; a block
    holds `rows` query rows, or as many as fit `memory` bytes."""
    q = a["q"]
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype

    def up(t):
        return t.to(compute) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    q, k, v, z, h = (up(a[n]) for n in ("q", "k", "v", "z", "h"))
    o = {n: up(a[n]) for n in (arg.name for arg in spec.OPTIONS + spec.EXTRAS)}
    B, H, Nq, _ = q.shape
    N = k.shape[2]
    sc = formulas.scalars_per_head({n: up(a[n]) for n in spec.SCALAR_NAMES}, H, q)
    k_hat, h_hat = formulas._safe_normalize(k), formulas._safe_normalize(h)
    n_nbr = min(o["k_neighbors"], max(N - 1, 0)) if o["variant"] == "paper" else 0
    # a causal block with mask_stats sees no key past its last token (the maps keep all N columns)
    prefix = o["is_causal"] and o["mask_stats"] and not return_maps
    step = rows or rows_per_block(B, H, N, torch.finfo(compute).bits // 8, memory)
    record = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, z, h, o["attn_bias"], *sc.values()))

    blocks = []
    for r0 in range(0, Nq, step):
        part = slice(r0, min(Nq, r0 + step))
        n = part.stop + N - Nq if prefix else N  # keys [0, n)
        J = formulas.allowed_keys(B, H, Nq, N, q.device, o["is_causal"], o["key_padding_mask"], o["attn_mask"],
                                  rows=part, keys=n)
        ob = dict(o, attn_bias=None if o["attn_bias"] is None else formulas.block_of(o["attn_bias"], Nq, part, n))

        def block(qb, kb, vb, zb, hatk, hath, *scalars, J=J, ob=ob, t0=part.start + N - Nq):
            return formulas.ascender_rows(qb, kb, vb, zb, hatk, hath, dict(zip(spec.SCALAR_NAMES, scalars)),
                                          ob, J, t0, N, exact=False, want_maps=return_maps)

        inputs = (q[..., part, :], k[..., :n, :], v[..., :n, :], z[..., :n, :], k_hat[..., :n, :],
                  h_hat[..., :n, :], *sc.values())
        r = checkpoint(block, *inputs, use_reentrant=False) if record else block(*inputs)
        if r["nbr"].shape[-1] < n_nbr:  # fewer keys than neighbours in this block: pad like the kernel
            r["nbr"] = torch.nn.functional.pad(r["nbr"], (0, n_nbr - r["nbr"].shape[-1]), value=-1)
        blocks.append(r)

    def joined(name):
        return torch.cat([r[name] for r in blocks], dim=2)

    outputs = (joined("y").to(a["q"].dtype),)
    if return_maps:
        outputs += ({name: torch.cat([r["maps"][name] for r in blocks], 2).detach().to(a["q"].dtype)
                     for name in spec.ASCENDER_MAPS.returns},)
    if return_aux:
        aux = dict(coh=joined("coh"), sep=joined("sep"))
        if o["variant"] == "paper":
            aux["align"] = formulas.alignment_rows(joined("u"), joined("nbr"))
        outputs += ({name: t.to(a["q"].dtype) for name, t in aux.items()},)
    return outputs
