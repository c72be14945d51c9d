"""The block-wise backend: SPEC section 4 in PyTorch ops on any device and dtype, one block of
query rows at a time against the keys the block can see.

Each block runs the twin's formulas (`reference.ascender_rows`) with every pair product a matrix
product (q kᵀ, ĥ ĥᵀ, the headings against k̂, the centroids against z, A v) and the squared distances
formed from norms and a product (clamped at 0), so no N x N x dz tensor exists and the largest
tensors are [B, H, block, N]. Under autograd each block is a `block_grad.BlockAttention` Function
(its backward recomputes the block without recording it and applies docs/backward.md's derivatives;
under torch.compile, with the maps or a differentiable attn_bias, a `torch.utils.checkpoint` region),
so forward and backward keep O(block x N) memory, one block at a time. The
block has as many rows as fit the memory budget (`backends.attention_backend(block_memory=...)`; on
CUDA by default a share of the free device memory, since there a block's ops cost launches more than
arithmetic), and with `block_compile` the whole call runs under torch.compile (Inductor fuses each
block's elementwise work; the blocks are checkpoint regions then). A causal block with
mask_stats=True reads only the keys up to its last token. float16 and bfloat16 inputs are computed
in float32 and the results returned in their own dtype.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from .. import _spec as spec
from .. import reference as formulas
from . import _transformed
from .block_grad import BlockAttention

# [B, H, block, N] tensors one block keeps alive at the peak of its recomputation with autograd,
# counted in elements of the compute dtype: at most 32 measured (benchmarks/bench_blockwise.py,
# float32, N = 4096, both variants), with a margin
LIVE_PAIR_TENSORS = 48


def rows_per_block(B: int, H: int, N: int, element_size: int, budget: int) -> int:
    """How many query rows a block may hold within `budget` bytes."""
    per_row = max(B * H, 1) * max(N, 1) * element_size * LIVE_PAIR_TENSORS
    return max(1, budget // per_row)


def block_keys(o: dict, part: slice, Nq: int, N: int, device, every_key: bool):
    """The key tokens a block of query rows can see at all (sorted): the window around its tokens and
    the global tokens, up to its last token when causal with mask_stats, within the documents of its
    rows (monotone document_ids); every key for the maps, a global query row, or unsorted documents.
    A slice where they are one range (selecting them is then a view), else a LongTensor on device."""
    base = formulas.first_query(o["query_offset"], Nq, N)
    first, last = part.start + base, part.stop + base - 1  # the block's tokens
    if every_key or part.stop == part.start:
        return slice(0, N)
    lo, hi = 0, N  # keys [lo, hi)
    if o["is_causal"] and o["mask_stats"]:
        hi = last + 1
    gmask = o["global_mask"]
    global_rows = first < o["global_tokens"] or (gmask is not None and bool(gmask[:, first:last + 1].any()))
    if o["window_size"] is not None and not global_rows:
        left, right = o["window_size"]
        lo = max(lo, first - left) if left >= 0 else lo
        hi = min(hi, last + right + 1) if right >= 0 else hi
    if o["document_ids"] is not None and o["document_ids"].numel():  # monotone: a document is a token range
        ids = o["document_ids"].contiguous()
        lo = max(lo, int(torch.searchsorted(ids, ids[:, first:first + 1].contiguous()).min()))
        hi = min(hi, int(torch.searchsorted(ids, ids[:, last:last + 1].contiguous(), right=True).max()))
    hi = max(lo, hi)
    g = min(o["global_tokens"], N)  # the leading global tokens [0, g)
    if gmask is None and (g == 0 or (lo == 0 and g <= hi)):
        return slice(lo, hi)
    extra = [torch.arange(g, device=device)] + ([] if gmask is None else [gmask.any(0).nonzero().flatten().to(device)])
    return torch.unique(torch.cat([torch.arange(lo, hi, device=device)] + extra))


_compiled_attention = None  # torch.compile(attention), made at the first compiled call


def attention(a: dict, return_maps: bool, return_aux: bool, memory: int, rows: int | None = None,
              compiled: bool = False) -> tuple:
    """The op's arguments `a` (by name, checked) -> (y, [maps], [aux]) like the fused backend; a block
    holds `rows` query rows, or as many as fit `memory` bytes; `compiled`: under torch.compile (unless
    the call is being traced already)."""
    global _compiled_attention
    if compiled and not torch.compiler.is_compiling():
        if _compiled_attention is None:
            _compiled_attention = torch.compile(attention, dynamic=False)
        return _compiled_attention(a, return_maps, return_aux, memory, rows)
    q = a["q"]
    compute = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype

    def up(t):
        return t.to(compute) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    q, k, v, z, h = (up(a[n]) for n in ("q", "k", "v", "z", "h"))
    o = {n: up(a[n]) for n in (arg.name for arg in spec.OPTIONS + spec.EXTRAS)}
    if o["document_ids"] is not None:  # any integer dtype as int64, as the binding does (a bijection: same documents)
        o["document_ids"] = o["document_ids"].to(torch.long)
    B, H, Nq, _ = q.shape
    N = k.shape[2]
    sc = formulas.scalars_per_head({n: up(a[n]) for n in spec.SCALAR_NAMES + ("sinks",)}, H, q)  # (with the sinks)
    (q, k, v, z, h, o["attn_bias"]), bad = formulas.finite_inputs(q, k, v, z, h, o["attn_bias"])
    sc, o["alibi_slopes"], bad["head"] = formulas.finite_heads(sc, o["alibi_slopes"], H)
    k_hat, h_hat = formulas._safe_normalize(k), formulas._safe_normalize(h)
    ties = formulas.ranking_ties(o, k, h_hat)  # (once per call: equal keys rank equally in every block)
    n_nbr = min(o["k_neighbors"], max(N - 1, 0)) if o["variant"] == "paper" else 0
    step = rows or rows_per_block(B, H, N, torch.finfo(compute).bits // 8, memory)
    # checkpoint each block when autograd records the call (not under forward AD or torch.func
    # transforms, which checkpointing does not support: there the blocks keep what autograd saves)
    tensors = [t for t in (q, k, v, z, h, o["attn_bias"], *sc.values()) if isinstance(t, torch.Tensor)]
    record = torch.is_grad_enabled() and any(t.requires_grad for t in tensors) and _transformed(tensors) is None
    # the written-out backward (block_grad.py) in eager mode; under torch.compile, with the maps, or with an
    # attn_bias that needs its gradient (an [Nq, N] tensor), checkpointing records the recomputation
    written_backward = record and not (return_maps or torch.compiler.is_compiling() or (
        o["attn_bias"] is not None and o["attn_bias"].requires_grad))
    # (compared, not subtracted: a difference of ids near the ends of the range wraps around)
    ids = o["document_ids"]
    monotone = ids is None or bool((ids[:, 1:] >= ids[:, :-1]).all())

    first = formulas.first_query(o["query_offset"], Nq, N)  # the token of query row 0
    blocks = []
    for r0 in range(0, Nq, step) if Nq else (0,):  # (no query row: one empty block keeps the shapes)
        part = slice(r0, min(Nq, r0 + step))
        take = block_keys(o, part, Nq, N, q.device, every_key=return_maps or not monotone)
        own = slice(part.start + first, part.stop + first)  # the rows' tokens

        # everything of the block's size is made inside the checkpointed region (the keys gathered, the
        # visibility mask, the attn_bias block), so that the backward rebuilds it: made outside, it
        # would stay alive until the backward as an input of the recomputation, O(N^2) over all blocks
        def block(qb, kk, vv, zz, hk, hh, zo, hatko, hatho, *scalars, part=part, take=take, t0=own.start, keep=None):
            keys = torch.arange(take.start, take.stop, device=qb.device) if isinstance(take, slice) else take
            J = formulas.visible(o, B, H, Nq, N, qb.device, rows=part, keys=keys)
            ob = dict(o, attn_bias=None if o["attn_bias"] is None else formulas.block_of(o["attn_bias"], Nq, part, keys))
            kb, vb, zb, hatk, hath = (x[..., take, :] for x in (kk, vv, zz, hk, hh))
            return formulas.ascender_rows(qb, kb, vb, zb, hatk, hath, dict(z=zo, k_hat=hatko, h_hat=hatho),
                                          dict(zip(sc, scalars)), ob, J, t0, N, keys, exact=False,
                                          want_maps=return_maps, want_aux=return_aux, bad=bad, keep=keep,
                                          ties=ties)

        # (per-row sinks [B', H', Nq', 1] give the block its rows; every other scalar is [1, H, 1, 1])
        scalars = (s[..., part, :] if s.shape[-2] > 1 else s for s in sc.values())
        inputs = (q[..., part, :], k, v, z, k_hat, h_hat, *(x[..., own, :] for x in (z, k_hat, h_hat)), *scalars)
        if written_backward:
            outs = list(BlockAttention.apply(block, dict(take=take, o=o, aux=return_aux, scalars=tuple(sc)), *inputs))
            r = dict(y=outs.pop(0), nbr=outs.pop())
            r.update(dict(coh=outs.pop(0), sep=outs.pop(0)) if return_aux else {})
            r.update(u=outs.pop(0) if o["variant"] == "paper" else None)
        else:
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
