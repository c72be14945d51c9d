"""Context parallelism: one ASCender sequence sharded over the ranks of a torch.distributed group
(docs/context_parallel.md).

Each rank holds its query rows (one or two token ranges of the layout) and gathers, once per call,
the key tokens those rows can see (from the ranks that hold them, point to point); the fused op then
computes each range's rows over their complete visible sets (`query_offset`), so every statistic is
the single process's. The exchange is an autograd function whose backward returns the gradients of
the gathered keys to their owners: gradients are exact.

    shard(x, rank, world, layout)                the rank's part of a full [B, H, N, *] (or [B, N, *]) tensor
    shard_tokens(N, world, layout)               every rank's token ranges
    context_parallel_attention(q, k, v, z, h, *, group, layout, **op keywords)
    ContextParallel(group, layout), context_parallel(group, layout)   for ASCenderAttention
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import _spec as spec
from . import dropout
from .backends import blockwise, fused_unsupported
from .functional import _op_arguments, _resolve, ascender_attention
from .reference import alignment_rows

LAYOUTS = ("contiguous", "balanced")


# ---------------------------------------------------------------------------------------------
# the layout
# ---------------------------------------------------------------------------------------------

def _split_bounds(N: int, parts: int) -> list:
    """The [start, stop) of each of x.tensor_split(parts) along a dim of size N."""
    small, extra = divmod(N, parts)
    bounds, start = [], 0
    for p in range(parts):
        stop = start + small + (1 if p < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def shard_tokens(N: int, world: int, layout: str = "contiguous") -> list:
    """Every rank's token ranges [(start, stop), ...] in token order: "contiguous", rank r holds the r-th
    of tensor_split(world); "balanced" (causal attention), chunks r and 2 world - 1 - r of tensor_split(2 world),
    so every rank has the same number of causal (query, key) pairs."""
    if layout not in LAYOUTS:
        raise ValueError(f"context parallel: layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "contiguous":
        return [[b] for b in _split_bounds(N, world)]
    chunks = _split_bounds(N, 2 * world)
    return [[chunks[r], chunks[2 * world - 1 - r]] for r in range(world)]


def shard(x: torch.Tensor, rank: int, world: int, layout: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """Rank `rank`'s part of a full tensor x along its token dim `dim` (2 for [B, H, N, *] op inputs, 1 for
    [B, N, *] module inputs and [B, N] masks)."""
    ranges = shard_tokens(x.shape[dim], world, layout)[rank]
    return torch.cat([x.narrow(dim, s, e - s) for s, e in ranges], dim=dim)


# ---------------------------------------------------------------------------------------------
# the exchange: who sends which tokens to whom, and its autograd function
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Piece:
    """Tokens [start, stop) of owner's shard (at offset `at` in it) that requester needs for its
    interval `interval` (at offset `into` there)."""

    owner: int
    requester: int
    interval: int
    start: int
    stop: int
    at: int
    into: int


def _pieces(ranges: list, intervals: list) -> list:
    """Every piece of the exchange: ranges[r] the token ranges rank r holds (in shard order), intervals[r]
    the key intervals [lo, hi) rank r needs. Every rank computes the same list, in the same order."""
    out = []
    for requester, wanted in enumerate(intervals):
        for interval, (lo, hi) in enumerate(wanted):
            for owner, held in enumerate(ranges):
                at = 0
                for s, e in held:
                    a, b = max(s, lo), min(e, hi)
                    if a < b:
                        out.append(_Piece(owner, requester, interval, a, b, at + a - s, a - lo))
                    at += e - s
    return out


class _Traffic:
    """Bytes this process sent through the exchange, by direction (tests/test_context_parallel.py
    checks them against the model of docs/context_parallel.md section 6)."""

    forward = 0
    backward = 0


def traffic() -> dict:
    """The bytes this process has sent so far: dict(forward=..., backward=...)."""
    return dict(forward=_Traffic.forward, backward=_Traffic.backward)


class _Exchange:
    """One exchange of a call: the pieces, this rank, the group, and the sends still in flight."""

    def __init__(self, pieces: list, rank: int, group, widths: list, n_intervals: int, lengths: list):
        self.pieces, self.rank, self.group, self.widths = pieces, rank, group, widths
        self.n_intervals, self.lengths = n_intervals, lengths  # lengths[i]: tokens of this rank's interval i
        self.pending = []  # (work, buffer) of sends not yet known to be complete
        self.received = {}  # piece index -> (work, buffer) of this rank's receives

    def peer(self, r: int) -> int:
        return dist.get_global_rank(self.group, r) if self.group is not None else r

    def send(self, tensor: torch.Tensor, to: int, tag: int, direction: str) -> None:
        buf = tensor.contiguous()
        self.pending.append((dist.isend(buf, self.peer(to), group=self.group, tag=tag), buf))
        setattr(_Traffic, direction, getattr(_Traffic, direction) + buf.numel() * buf.element_size())

    def finish_sends(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending = []


def _packed(tensors, start: int, stop: int) -> torch.Tensor:
    """The tokens [start, stop) of every tensor [B, H, n, f_t], side by side along the features."""
    return torch.cat([t[:, :, start:stop] for t in tensors], dim=-1)


class _Post(torch.autograd.Function):
    """Forward: posts the sends of this rank's pieces that other ranks need and the receives of the pieces
    this rank needs; returns its inputs. Backward: receives the gradients of its pieces from the ranks that
    used them and adds them to its own gradient."""

    @staticmethod
    def forward(ctx, ex: _Exchange, *local):
        ctx.ex, ctx.shapes = ex, [t.shape for t in local]
        ctx.dtype, ctx.device = local[0].dtype, local[0].device
        B, H = local[0].shape[:2]
        F = sum(ex.widths)
        for n, p in enumerate(ex.pieces):
            if p.owner == ex.rank and p.requester != ex.rank:
                ex.send(_packed(local, p.at, p.at + p.stop - p.start), p.requester, n, "forward")
            elif p.requester == ex.rank and p.owner != ex.rank:
                buf = local[0].new_empty(B, H, p.stop - p.start, F)
                ex.received[n] = (dist.irecv(buf, ex.peer(p.owner), group=ex.group, tag=n), buf)
        return tuple(t.view_as(t) for t in local)

    @staticmethod
    def backward(ctx, *grads):
        ex = ctx.ex
        incoming = []
        for n, p in enumerate(ex.pieces):
            if p.owner == ex.rank and p.requester != ex.rank:
                B, H = grads[0].shape[:2]
                buf = grads[0].new_empty(B, H, p.stop - p.start, sum(ex.widths))
                incoming.append((dist.irecv(buf, ex.peer(p.requester), group=ex.group, tag=n), buf, p))
        grads = [torch.zeros(shape, dtype=ctx.dtype, device=ctx.device) if g is None else g.clone() if incoming
                 else g for shape, g in zip(ctx.shapes, grads)]  # (added to in place only when pieces come in)
        for work, buf, p in incoming:
            work.wait()
            for g, part in zip(grads, buf.split(ex.widths, dim=-1)):
                g[:, :, p.at:p.at + p.stop - p.start] += part
        ex.finish_sends()
        return (None, *grads)


class _Gather(torch.autograd.Function):
    """Forward: this rank's key interval `interval`, its own pieces copied and the received ones waited
    for. Backward: the gradient of each received piece goes back to its owner (a send, completed by the
    owner's _Post backward); the own pieces' gradients are returned."""

    @staticmethod
    def forward(ctx, ex: _Exchange, interval: int, *local):
        ctx.ex, ctx.interval = ex, interval
        ctx.shapes = [t.shape for t in local]
        ctx.dtype, ctx.device = local[0].dtype, local[0].device
        n_tok = ex.lengths[interval]
        B, H = local[0].shape[:2]
        mine = [p for p in ex.pieces if p.requester == ex.rank and p.interval == interval]
        if len(mine) == 1 and mine[0].owner == ex.rank:  # the interval is a piece of this rank's shard: no copy
            return tuple(t[:, :, mine[0].at:mine[0].at + n_tok] for t in local)
        out = [t.new_empty(B, H, n_tok, t.shape[-1]) for t in local]
        for n, p in enumerate(ex.pieces):
            if p.requester != ex.rank or p.interval != interval:
                continue
            length = p.stop - p.start
            if p.owner == ex.rank:
                parts = [t[:, :, p.at:p.at + length] for t in local]
            else:
                work, buf = ex.received.pop(n)
                work.wait()
                parts = buf.split(ex.widths, dim=-1)
            for o, part in zip(out, parts):
                o[:, :, p.into:p.into + length] = part
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        ex = ctx.ex
        local = [torch.zeros(s, dtype=ctx.dtype, device=ctx.device) for s in ctx.shapes]
        grads = [torch.zeros(ctx.shapes[n][:2] + (ex.lengths[ctx.interval], ctx.shapes[n][3]), dtype=ctx.dtype,
                             device=ctx.device) if g is None else g for n, g in enumerate(grads)]
        for n, p in enumerate(ex.pieces):
            if p.requester != ex.rank or p.interval != ctx.interval:
                continue
            length = p.stop - p.start
            if p.owner == ex.rank:
                for g_local, g in zip(local, grads):
                    g_local[:, :, p.at:p.at + length] += g[:, :, p.into:p.into + length]
            else:
                ex.send(_packed(grads, p.into, p.into + length), p.owner, n, "backward")
        return (None, None, *local)


# ---------------------------------------------------------------------------------------------
# the call
# ---------------------------------------------------------------------------------------------

_KEY_AXES = {name for name, axes in spec.TOKEN_AXES.items() if axes == "tokens"}


def _key_interval(o: dict, start: int, stop: int, N: int, monotone: bool) -> tuple:
    """The hull [lo, hi) of the keys that query tokens start .. stop - 1 can see at all, from the
    block-wise backend's rule (blockwise.block_keys on full [B, N] masks)."""
    if stop == start:
        return start, start
    take = blockwise.block_keys(dict(o, query_offset=None), slice(start, stop), N, N, "cpu", every_key=not monotone)
    if isinstance(take, slice):
        return take.start, max(take.start, take.stop)
    return (int(take.min()), int(take.max()) + 1) if take.numel() else (start, start)


def _dropout_stream(o: dict, device, generator) -> tuple:
    """(seed, offset, token offset) as numbers when dropout_p > 0 (else None), and whether the caller gave it:
    o's dropout_seed ([2] or [3]) or one drawn from generator on this rank."""
    if o["dropout_p"] <= 0:
        return None, False
    seed = o["dropout_seed"]
    given = seed is not None
    if not given:
        seed = dropout.draw_seed(device, generator)
    if not (isinstance(seed, torch.Tensor) and seed.dtype == torch.int64 and seed.dim() == 1
            and seed.shape[0] in (2, 3)):
        got = f"{seed.dtype} {list(seed.shape)}" if isinstance(seed, torch.Tensor) else type(seed).__name__
        raise ValueError(f"dropout_seed must be an int64 tensor [2] (seed, offset) or [3] (seed, offset, token "
                         f"offset), got {got}")
    return [int(x) for x in seed.tolist()] + [0] * (3 - seed.shape[0]), given


def _describe(q, tensors: dict, o: dict, layout) -> dict:
    """What must agree across ranks, and this rank's local error (raised on every rank after the gather)."""
    d = dict(dtype=str(q.dtype), device=q.device.type, layout=layout)
    error = None
    try:
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"{name} must be a 4-D tensor [B, H, N_r, *] (this rank's shard), got "
                                 f"{type(t).__name__ if not isinstance(t, torch.Tensor) else tuple(t.shape)}")
        d.update(B=q.shape[0], H=q.shape[1], **{f"{n} features": t.shape[-1] for n, t in tensors.items()})
        d["shard length"] = q.shape[2]
        for name, t in tensors.items():
            if t.shape[:3] != q.shape[:3] or t.dtype != q.dtype or t.device != q.device:
                raise ValueError(f"{name} must have the [B, H, N_r] of q {tuple(q.shape[:3])} and its dtype "
                                 f"{q.dtype} and device {q.device}, got {tuple(t.shape)} {t.dtype} {t.device}")
        for name, axes in spec.TOKEN_AXES.items():  # this rank's [B, N_r] shard of a mask
            t = o[name]
            if axes == "tokens" and t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) !=
                                                       (q.shape[0], q.shape[2])):
                raise ValueError(f"{name} must be this rank's [B, N_r] = [{q.shape[0]}, {q.shape[2]}] shard, got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
            if axes == "rows" and _per_row(t) and t.shape[-1] not in (1, q.shape[2]):
                raise ValueError(f"{name} of 3 dims is per query row: its last dim must be this rank's N_r = "
                                 f"{q.shape[2]} rows (or 1), got {tuple(t.shape)}")
    except ValueError as e:
        error = str(e)
    for a in spec.OPTIONS:  # fixed options must be the same everywhere
        d[a.name] = o[a.name]
    for name in spec.TOKEN_AXES:
        t = o[name]
        d[f"{name}"] = None if t is None else (str(t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__)
    for name in spec.SCALAR_NAMES:  # a number, or a tensor of this shape
        d[name] = tuple(o[name].shape) if isinstance(o[name], torch.Tensor) else "number"
    for name in ("k", "v", "z", "h"):  # the exchange's backward runs on every rank or on none
        d[f"{name} requires grad"] = isinstance(tensors[name], torch.Tensor) and tensors[name].requires_grad
    return dict(agree=d, error=error)


def _per_row(t) -> bool:
    """Whether a "rows" argument (_spec.TOKEN_AXES) has a query-row axis: a 3-D tensor [., ., Nq]."""
    return isinstance(t, torch.Tensor) and t.dim() == 3


def _agree(group, world: int, mine: dict) -> list:
    """All ranks' descriptors; the same ValueError on every rank when any rank had a local error or the
    ranks disagree."""
    every = [None] * world
    dist.all_gather_object(every, mine, group=group)
    errors = [(r, e["error"]) for r, e in enumerate(every) if e["error"]]
    if errors:
        raise ValueError("context_parallel_attention: " + "; ".join(f"rank {r}: {e}" for r, e in errors))
    for name in mine["agree"]:
        values = [e["agree"].get(name) for e in every]
        if name != "shard length" and any(v != values[0] for v in values):
            raise ValueError(f"context_parallel_attention: {name} differs across ranks: "
                             + ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values)))
    return every


def _gather_tokens(t: torch.Tensor, lengths: list, group, world: int) -> torch.Tensor:
    """The full [B, N] tensor from every rank's [B, N_r] shard (in shard order: rank-major), padded to the
    longest shard for the collective."""
    wire = torch.uint8 if t.dtype == torch.bool else t.dtype
    padded = torch.zeros(t.shape[0], max(lengths), dtype=wire, device=t.device)
    padded[:, :t.shape[1]] = t
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:, :n] for p, n in zip(parts, lengths)], dim=1).to(t.dtype)


def _unshard_tokens(t: torch.Tensor, ranges: list, N: int) -> torch.Tensor:
    """A [B, N] tensor in shard order (rank-major) -> token order."""
    out = torch.empty_like(t)
    at = 0
    for held in ranges:
        for s, e in held:
            out[:, s:e] = t[:, at:at + e - s]
            at += e - s
    assert at == N
    return out


def context_parallel_attention(q, k, v, z, h, *, group=None, layout="contiguous", return_aux=False, generator=None,
                               **keywords):
    """ASCender attention of a sequence sharded over the ranks of `group` (default: the default group).

    q, k, v, z, h: this rank's shard [B, H, N_r, *] of the sequence's [B, H, N, *] tensors, cut by
    `layout` (shard_tokens: "contiguous" = tensor_split(world), so N need not divide; "balanced" =
    the zigzag for causal attention). Keyword arguments: those of ascender_attention (the spec's, by
    name); the [B, N] masks (key_padding_mask, global_mask, document_ids) are given as this rank's
    [B, N_r] shard like q, and per-row sinks (3-D, [B, H, N] broadcastable) as this rank's rows
    [B, H, N_r] (or a last dim of 1). attn_mask, attn_bias ([.., N, N]), query_offset and return_maps are
    refused. return_aux=True returns (y, aux) with aux's [B, H, N_r] rows (coh, sep and, paper, align).
    dropout_p > 0 draws the one-process mask (SPEC section 9b): the stream is dropout_seed (the same on
    every rank) or, without one, the one rank 0 draws from `generator` (or torch's default generator of
    its device); each rank's calls give it the token offset of their keys (dropout.keep_mask).

    Returns this rank's rows y [B, H, N_r, dv]. Differentiable (exact): the gradients of this rank's
    shard include what the other ranks' rows send back; the learnable scalars' gradients are this
    rank's part of the sum (all_reduce them, or let DistributedDataParallel do it).
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    tensors = dict(q=q, k=k, v=v, z=z, h=h)
    local_error = None
    try:
        o = _resolve("context_parallel_attention", spec.ASCENDER_KEYWORDS, keywords, q)
        for name, axes in spec.TOKEN_AXES.items():
            if o[name] is not None and axes == "pairs":
                raise ValueError(f"{name} is a [..., N, N] tensor: the sharded path does not take it (O(N^2))")
            if o[name] is not None and axes not in (None, "tokens", "rows"):
                raise ValueError(f"{name}: the sharded path does not know its token axes {axes!r} (_spec.TOKEN_AXES)")
        for name in spec.ASCENDER_KEYWORDS.by_name:
            if name not in spec.TOKEN_AXES and spec.ASCENDER_KEYWORDS.by_name[name].type.startswith("Tensor?") \
                    and o[name] is not None:
                raise ValueError(f"{name}: the sharded path does not know this argument's token axes "
                                 "(_spec.TOKEN_AXES)")
        if o["query_offset"] is not None:
            raise ValueError("query_offset is set by the sharded path itself (each rank's rows)")
        stream, given = _dropout_stream(o, q.device, generator)
    except (TypeError, ValueError) as e:
        o, local_error, stream, given = None, f"{type(e).__name__}: {e}", None, False
    if o is None:  # still take part in the agreement, so that every rank raises
        o = {a.name: a.default for a in spec.ASCENDER_KEYWORDS}
    mine = _describe(q, tensors, o, layout)
    mine["error"] = mine["error"] or local_error
    if given:  # a caller's stream must be the same everywhere; a drawn one is rank 0's
        mine["agree"]["dropout_seed"] = stream
    mine["dropout stream"] = stream
    every = _agree(group, world, mine)
    stream = every[0]["dropout stream"]

    lengths = [e["agree"]["shard length"] for e in every]
    N = sum(lengths)
    ranges = shard_tokens(N, world, layout)
    want = [sum(e - s for s, e in held) for held in ranges]
    if lengths != want:
        raise ValueError(f"context_parallel_attention: the shard lengths {lengths} (ranks 0 .. {world - 1}) are "
                         f"not the {layout} layout of N = {N} tokens over {world} ranks, which gives {want}")

    # the [B, N] masks, whole on every rank (small: O(N))
    full = {name: _unshard_tokens(_gather_tokens(o[name], lengths, group, world), ranges, N)
            for name in sorted(_KEY_AXES) if o[name] is not None}
    o_full = dict(o, **full)
    ids = full.get("document_ids")
    monotone = ids is None or bool((ids.diff(dim=1) >= 0).all())
    intervals = [[_key_interval(o_full, s, e, N, monotone) for s, e in held] for held in ranges]

    # the exchange of k, v, z, h (and, for L_align, of the headings)
    widths = [t.shape[-1] for t in (k, v, z, h)]
    mine_iv = intervals[rank]
    ex = _Exchange(_pieces(ranges, intervals), rank, group, widths, len(mine_iv), [hi - lo for lo, hi in mine_iv])
    posted = _Post.apply(ex, k, v, z, h)
    order = sorted(range(len(mine_iv)), key=lambda i: sum(  # the range needing the fewest remote tokens first
        p.stop - p.start for p in ex.pieces if p.requester == rank and p.interval == i and p.owner != rank))

    at, offsets = 0, []
    for s, e in ranges[rank]:
        offsets.append(at)
        at += e - s
    results = [None] * len(mine_iv)
    for i in order:
        (s, e), (lo, hi), r0 = ranges[rank][i], mine_iv[i], offsets[i]
        keys = _Gather.apply(ex, i, *posted)
        kw = {name: o[name] for name in spec.ASCENDER_KEYWORDS.by_name}
        kw.update({name: t[:, lo:hi] for name, t in full.items()})
        kw.update({name: o[name][..., r0:r0 + e - s] for name, axes in spec.TOKEN_AXES.items()
                   if axes == "rows" and _per_row(o[name]) and o[name].shape[-1] > 1})
        kw["global_tokens"] = min(max(o["global_tokens"] - lo, 0), hi - lo)
        kw["query_offset"] = s - lo
        if stream is not None:  # the call's pair (t, j) is the sequence's (t + lo, j + lo)
            kw["dropout_seed"] = torch.tensor([stream[0], stream[1], stream[2] + lo], dtype=torch.int64,
                                              device=q.device)
        results[i] = _rows(q[:, :, r0:r0 + e - s], keys, kw, lo, return_aux)
    ex.finish_sends()  # every rank posted its receives first: the peers consume these
    y = torch.cat([r[0] for r in results], dim=2) if len(results) > 1 else results[0][0]
    if not return_aux:
        return y
    aux = {name: torch.cat([r[1][name] for r in results], dim=2) for name in ("coh", "sep")}
    if spec.canonical_variant(o["variant"]) == "paper":
        u = torch.cat([r[1]["u"] for r in results], dim=2)
        kk = min(o["k_neighbors"], max(N - 1, 0))  # a range with fewer keys has fewer columns: -1 past the end
        nbr = torch.cat([torch.nn.functional.pad(r[1]["nbr"], (0, kk - r[1]["nbr"].shape[-1]), value=-1)
                         for r in results], dim=2)
        aux["align"] = alignment_rows(u, nbr, _all_tokens(u, ranges, N, rank, group))
    return y, aux


def _rows(q, keys, kw: dict, lo: int, return_aux: bool):
    """One range's rows against its gathered keys [lo, hi): y, and for return_aux the op's aux, u and the
    neighbours as token indices of the whole sequence."""
    if not return_aux:
        return (ascender_attention(q, *keys, **kw),)
    o = _resolve("context_parallel_attention", spec.ASCENDER_KEYWORDS, kw, q)
    args = _op_arguments(spec.ASCENDER_FWD, dict(zip(("q", "k", "v", "z", "h"), (q, *keys))), o, q)
    why = fused_unsupported(q, [q, *keys], spec.ASCENDER_FWD.named(args))
    if why or q.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"context_parallel_attention: return_aux runs the fused op on float32 or float64 "
                         f"tensors: {why or q.dtype}")
    out = dict(zip(spec.ASCENDER_FWD.returns, torch.ops.ascender.ascender_fwd(*args)))
    nbr = torch.where(out["nbr"] >= 0, out["nbr"] + lo, out["nbr"])
    return out["out"], dict(coh=out["aux"][..., 0], sep=out["aux"][..., 1], u=out["u"], nbr=nbr)


def _all_tokens(u: torch.Tensor, ranges: list, N: int, rank: int, group) -> torch.Tensor:
    """Every token's heading [B, H, N, d] from every rank's rows (the same differentiable exchange)."""
    ex = _Exchange(_pieces(ranges, [[(0, N)]] * len(ranges)), rank, group, [u.shape[-1]], 1, [N])
    (posted,) = _Post.apply(ex, u)
    (everyone,) = _Gather.apply(ex, 0, posted)
    ex.finish_sends()
    return everyone


# ---------------------------------------------------------------------------------------------
# modules
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ContextParallel:
    """How ASCenderAttention shards its sequence: the process group (None: the default) and the layout."""

    group: object = None
    layout: str = "contiguous"

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"ContextParallel: layout must be one of {LAYOUTS}, got {self.layout!r}")


# A plain list, not a ContextVar: torch.compile traces a read of a module-level list (and guards on it),
# but not ContextVar.get. The stack is process-wide, as a process group is.
_ACTIVE: list[ContextParallel] = []


@contextlib.contextmanager
def context_parallel(group=None, layout: str = "contiguous"):
    """Inside the block, every ASCenderAttention takes its input as this rank's shard of the sequence
    and returns this rank's shard of the output (ContextParallel(group, layout))."""
    _ACTIVE.append(ContextParallel(group, layout))
    try:
        yield
    finally:
        _ACTIVE.pop()


def active() -> ContextParallel | None:
    """The ContextParallel of the innermost context_parallel block, or None."""
    return _ACTIVE[-1] if _ACTIVE else None
