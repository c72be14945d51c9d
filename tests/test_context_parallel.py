"""Context parallelism (ascender_torch/distributed.py, docs/context_parallel.md): a sequence sharded over
gloo ranks gives the single-process fused op's outputs, aux and every gradient (float64, 1e-10).

One torch.multiprocessing launch of four ranks runs every case for the groups {0}, {0, 1}, {0, 1, 2}
and {0, 1, 2, 3} (world sizes 1 to 4; N never divisible by all of them), and the cases of bad input
that must raise on every rank; the parent compares each rank's rows and gradients with the single
process. A hang becomes a failure: the process group's timeout and the launch's deadline."""

from __future__ import annotations

import datetime
import os
import socket
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ascender_torch import ASCenderAttention, ascender_attention, reference
from ascender_torch import distributed as cp
from ascender_torch import _spec
from ascender_torch._spec import SCALAR_NAMES

WORLDS = (1, 2, 3, 4)
TIMEOUT_S = 60  # each collective; the launch as a whole gets LAUNCH_S
LAUNCH_S = 240
B, H, D, DV, DZ = 2, 2, 5, 4, 3

# name, N, layout, options (tensors made by _problem), return_aux
CASES = (
    ("paper", 11, "contiguous", dict(variant="paper", k_neighbors=3), False),
    ("paper-causal-balanced", 13, "balanced", dict(variant="paper", k_neighbors=3, is_causal=True), True),
    ("seed-causal-padding", 13, "contiguous", dict(variant="seed", is_causal=True, padding="last-shard"), False),
    ("paper-window-globals", 17, "contiguous", dict(variant="paper", k_neighbors=2, window_size=(3, 2),
                                                    global_tokens=2), False),
    ("paper-causal-documents", 14, "balanced", dict(variant="paper", k_neighbors=2, is_causal=True,
                                                    documents=True), True),
    ("seed-softcap-alibi-sinks", 10, "contiguous", dict(variant="seed", softcap=2.0, alibi=True, sinks="head"), False),
    ("paper-causal-row-sinks", 13, "balanced", dict(variant="paper", k_neighbors=3, is_causal=True, sinks="rows"),
     False),
    ("paper-mask_stats-off", 12, "contiguous", dict(variant="paper", k_neighbors=3, is_causal=True,
                                                    mask_stats=False), False),
    ("paper-scores-global_mask", 15, "balanced", dict(variant="paper", k_neighbors=3, neighbours="scores",
                                                      global_mask=True, is_causal=True), True),
    # SPEC section 9b: the caller's stream (with a token offset of its own), and rank 0's draw
    ("seed-dropout-window", 14, "contiguous", dict(variant="seed", window_size=(4, 1), dropout="given"), False),
    ("paper-causal-dropout-drawn", 13, "balanced", dict(variant="paper", k_neighbors=3, is_causal=True,
                                                        dropout="drawn"), True),
)
BAD = ("dtype", "shard-length", "attn_mask", "dropout_seed", "sinks")
LEARNED = (*SCALAR_NAMES, "sinks")  # leaves whose gradients are compared (sinks when the case has them)
DROPOUT_P, DRAW_SEED = 0.3, 11  # rank 0's generator and the single process's; the other ranks' differ


def _problem(N: int, opts: dict, world: int, layout: str, device: str = "cpu"):
    """The full inputs (the same on every process: seeded) and the op keywords of one case, on `device`."""
    g = torch.Generator().manual_seed(N * 7 + len(opts))
    f64 = dict(dtype=torch.float64, generator=g)
    tensors = [torch.randn(B, H, N, f, **f64) for f in (D, D, DV, DZ, DZ)]
    kw = {n: v for n, v in opts.items() if n not in ("padding", "documents", "alibi", "global_mask", "sinks",
                                                       "dropout")}
    if opts.get("dropout"):
        kw["dropout_p"] = DROPOUT_P
    if opts.get("dropout") == "given":
        kw["dropout_seed"] = torch.tensor([-0x12345678ABCDEF, 2 ** 62 + 9, 3], dtype=torch.int64)
    kw.update({name: 0.3 + 0.5 * torch.rand(H, **f64) for name in SCALAR_NAMES})
    if opts.get("padding") == "last-shard":  # a rank whose shard is all padding (the last one), and one more key
        pad = torch.zeros(B, N, dtype=torch.bool)
        pad[:, cp.shard_tokens(N, world, layout)[-1][0][0]:] = True
        pad[0, 1] = True
        kw["key_padding_mask"] = pad
    if opts.get("documents"):  # packed documents crossing the shard boundaries
        kw["document_ids"] = torch.tensor([[0] * 5 + [1] * 6 + [2] * (N - 11), [0] * 2 + [1] * (N - 2)])
    if opts.get("alibi"):
        kw["alibi_slopes"] = torch.tensor([0.5, 0.25], dtype=torch.float64)
    if opts.get("sinks") == "head":  # SPEC section 12: no token axis, each rank's rows see their whole softmax
        kw["sinks"] = torch.tensor([0.7, -0.4], dtype=torch.float64)
    if opts.get("sinks") == "rows":  # per query row [B, H, N]: a rank passes its rows' [B, H, N_r]
        kw["sinks"] = torch.rand(B, H, N, **f64) * 3 - 1.5
    if opts.get("global_mask"):
        gm = torch.zeros(B, N, dtype=torch.bool)
        gm[0, N // 2] = gm[1, 3] = True
        kw["global_mask"] = gm
    grad_y = torch.randn(B, H, N, DV, **f64)
    grad_aux = torch.randn(3, B, H, N, **f64)
    on = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    return [on(t) for t in tensors], {n: on(v) for n, v in kw.items()}, on(grad_y), on(grad_aux)


def _loss(y, aux, grad_y, grad_aux):
    loss = (y * grad_y).sum()
    if aux is not None:
        loss = loss + sum((aux[n] * g).sum() for n, g in zip(("coh", "sep", "align"), grad_aux) if n in aux)
    return loss


def _sharded_case(case, world: int, rank: int, group, device: str = "cpu"):
    name, N, layout, opts, want_aux = case
    tensors, kw, grad_y, grad_aux = _problem(N, opts, world, layout, device)
    leaves = [cp.shard(t, rank, world, layout).requires_grad_() for t in tensors]
    scalars = {n: kw[n].clone().requires_grad_() for n in LEARNED if n in kw}
    if opts.get("sinks") == "rows":
        scalars["sinks"] = cp.shard(kw["sinks"], rank, world, layout).requires_grad_()
    local = {n: cp.shard(t, rank, world, layout, dim=1) if n in ("key_padding_mask", "document_ids", "global_mask")
             else t for n, t in kw.items() if n not in scalars}
    if opts.get("dropout") == "drawn":  # only rank 0's generator matters
        local["generator"] = torch.Generator(device).manual_seed(DRAW_SEED if rank == 0 else DRAW_SEED + 1 + rank)
    before = cp.traffic()
    out = cp.context_parallel_attention(*leaves, group=group, layout=layout, return_aux=want_aux, **local, **scalars)
    y, aux = out if want_aux else (out, None)
    middle = cp.traffic()
    shard_g = [cp.shard(g, rank, world, layout) for g in (grad_y, *grad_aux)]
    _loss(y, aux, shard_g[0], shard_g[1:]).backward()
    after = cp.traffic()
    return dict(y=y.detach(), aux=None if aux is None else {n: t.detach() for n, t in aux.items()},
                grads=[t.grad for t in leaves], scalars={n: s.grad for n, s in scalars.items()},
                sent=dict(forward=middle["forward"] - before["forward"],
                          backward=after["backward"] - middle["backward"]))


MODULE_N, MODULE_D = 13, 8


def _module_problem():
    torch.manual_seed(5)
    model = ASCenderAttention(MODULE_D, 2, k=3).double()
    g = torch.Generator().manual_seed(6)
    x = torch.randn(B, MODULE_N, MODULE_D, dtype=torch.float64, generator=g)
    return model, x, torch.randn(B, MODULE_N, MODULE_D, dtype=torch.float64, generator=g)


def _module_case(world: int, rank: int, group):
    """ASCenderAttention inside context_parallel(): this rank's shard in and out; its share of the parameters'
    gradients."""
    model, x, grad = _module_problem()
    xs = cp.shard(x, rank, world, "balanced", dim=1).requires_grad_()
    with cp.context_parallel(group, layout="balanced"):
        y, _ = model(xs, is_causal=True)
    (y * cp.shard(grad, rank, world, "balanced", dim=1)).sum().backward()
    return dict(y=y.detach(), dx=xs.grad, params={n: p.grad for n, p in model.named_parameters()})


def _bad_case(what: str, world: int, rank: int, group):
    """Every rank must raise (the message) instead of hanging."""
    N = 9
    tensors = [cp.shard(torch.randn(1, 1, N, f, dtype=torch.float64), rank, world) for f in (D, D, DV, DZ, DZ)]
    kw = {}
    if what == "dtype" and rank == 0:
        tensors = [t.float() for t in tensors]
    if what == "shard-length" and rank == world - 1:  # two more tokens on the last rank: no layout gives that
        tensors = [torch.cat([t, t[:, :, :2]], dim=2) for t in tensors]
    if what == "attn_mask":
        kw["attn_mask"] = torch.ones(N, N, dtype=torch.bool)
    if what == "dropout_seed":
        kw.update(dropout_p=0.1, dropout_seed=torch.zeros(4, dtype=torch.int64))
    if what == "sinks":  # per-row sinks of the whole sequence, not of the rank's rows
        kw["sinks"] = torch.zeros(1, 1, N, dtype=torch.float64)
    try:
        cp.context_parallel_attention(*tensors, group=group, **kw)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def _worker(rank: int, size: int, port: int, out_dir: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    torch.set_num_threads(1)
    results = {}
    try:
        groups = {w: dist.new_group(list(range(w))) for w in WORLDS}
        for w in WORLDS:
            if rank >= w:
                continue
            for case in CASES:
                results[w, case[0]] = _sharded_case(case, w, rank, groups[w])
            results[w, "module"] = _module_case(w, rank, groups[w])
            for what in BAD:
                runs = w > 1 or what in ("attn_mask", "dropout_seed")  # (the others: disagreements between ranks)
                results[w, "bad-" + what] = _bad_case(what, w, rank, groups[w]) if runs else "(one rank)"
        dist.barrier()
    except Exception:  # recorded for the parent; the peers' collectives then time out into errors too
        results["error"] = traceback.format_exc()
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("context_parallel"))
    size = max(WORLDS)
    ctx = mp.start_processes(_worker, args=(size, _free_port(), out_dir), nprocs=size, join=False, start_method="spawn")
    deadline = time.monotonic() + LAUNCH_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"context-parallel launch did not finish in {LAUNCH_S} s (a hang)")
    per_rank = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(size)]
    for r, res in enumerate(per_rank):
        assert "error" not in res, f"rank {r}:\n{res['error']}"
    return per_rank


def _reference_run(case, world, device: str = "cpu"):
    name, N, layout, opts, want_aux = case
    tensors, kw, grad_y, grad_aux = _problem(N, opts, world, layout, device)
    leaves = [t.clone().requires_grad_() for t in tensors]
    scalars = {n: kw[n].clone().requires_grad_() for n in LEARNED if n in kw}
    rest = {n: t for n, t in kw.items() if n not in scalars}
    if opts.get("dropout") == "drawn":
        rest["generator"] = torch.Generator(device).manual_seed(DRAW_SEED)
    out = ascender_attention(*leaves, **rest, **scalars, return_aux=want_aux)
    y, aux = out if want_aux else (out, None)
    _loss(y, aux, grad_y, grad_aux).backward()
    return y.detach(), aux, [t.grad for t in leaves], {n: s.grad for n, s in scalars.items()}


def _close(got, want, what):
    scale = max(want.abs().max().item(), 1e-300)
    err = (got - want).abs().max().item() / scale if want.numel() else 0.0
    assert err <= 1e-10, f"{what}: max |difference| / max |value| = {err:.2e}"


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sharded_equals_single_process(sharded, case, world):
    name, N, layout, opts, want_aux = case
    y, aux, grads, sgrads = _reference_run(case, world)
    ranks = [sharded[r][world, name] for r in range(world)]
    _close(torch.cat([r["y"] for r in ranks], 2), torch.cat([cp.shard(y, r, world, layout) for r in range(world)], 2),
           "y")
    if want_aux:
        for n in aux:
            _close(torch.cat([r["aux"][n] for r in ranks], 2),
                   torch.cat([cp.shard(aux[n].detach(), r, world, layout) for r in range(world)], 2), f"aux {n}")
    for t, g in enumerate(grads):
        _close(torch.cat([r["grads"][t] for r in ranks], 2),
               torch.cat([cp.shard(g, r, world, layout) for r in range(world)], 2), "dq dk dv dz dh".split()[t])
    for n, g in sgrads.items():  # per-row sinks: each rank's rows; the others: each rank's share of the sum
        if n == "sinks" and opts["sinks"] == "rows":
            _close(torch.cat([r["scalars"][n] for r in ranks], 2),
                   torch.cat([cp.shard(g, r, world, layout) for r in range(world)], 2), "dsinks")
        else:
            _close(sum(r["scalars"][n] for r in ranks), g, f"d{n}")


def _nccl_worker(rank: int, port: int, out_dir: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=1, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    results = {}
    try:
        for case in CASES:
            results[case[0]] = _sharded_case(case, 1, rank, dist.group.WORLD, device="cuda")
    except Exception:
        results["error"] = traceback.format_exc()
    finally:
        torch.save(results, os.path.join(out_dir, "nccl.pt"))
        dist.destroy_process_group()


@pytest.mark.skipif(not (torch.cuda.is_available() and dist.is_nccl_available()), reason="needs a CUDA device and NCCL")
def test_nccl_world_of_one_on_cuda(tmp_path):
    """A world of one through NCCL on CUDA tensors gives the single-process op on the same device (every
    case, outputs, aux and gradients); the multi-GPU run waits for a machine with several GPUs."""
    ctx = mp.start_processes(_nccl_worker, args=(_free_port(), str(tmp_path)), nprocs=1, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + LAUNCH_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            ctx.processes[0].kill()
            pytest.fail(f"the NCCL launch did not finish in {LAUNCH_S} s (a hang)")
    res = torch.load(os.path.join(str(tmp_path), "nccl.pt"), weights_only=False)
    assert "error" not in res, res["error"]
    for case in CASES:
        name, _, _, _, want_aux = case
        y, aux, grads, sgrads = _reference_run(case, 1, device="cuda")
        got = res[name]
        assert got["y"].is_cuda
        _close(got["y"], y, f"{name}: y")
        for n in aux if want_aux else ():
            _close(got["aux"][n], aux[n].detach(), f"{name}: aux {n}")
        for t, g in enumerate(grads):
            _close(got["grads"][t], g, f"{name}: " + "dq dk dv dz dh".split()[t])
        for n, g in sgrads.items():
            _close(got["scalars"][n], g, f"{name}: d{n}")


@pytest.mark.parametrize("world", WORLDS)
def test_communication_model(sharded, world):
    """Bytes each rank sends equal docs/context_parallel.md section 6: with full visibility every rank
    receives the N - N_r tokens of k, v, z, h it lacks (so sends its N_r tokens to each of the W - 1
    others) and sends the gradients of what it received back."""
    name, N, layout, opts, _ = CASES[0]
    lengths = [sum(e - s for s, e in held) for held in cp.shard_tokens(N, world, layout)]
    per_token = B * H * (D + DV + DZ + DZ) * 8  # k, v, z, h of one token, float64
    sent = [sharded[r][world, name]["sent"] for r in range(world)]
    assert [s["forward"] for s in sent] == [(world - 1) * n * per_token for n in lengths]
    assert [s["backward"] for s in sent] == [(N - n) * per_token for n in lengths]
    assert all(s["backward"] <= N * per_token for s in sent)  # received: at most the sequence's K, V, Z, H bytes


@pytest.mark.parametrize("world", WORLDS[1:])
def test_window_exchanges_with_reached_ranks_only(world):
    """With a window of w tokens a rank's keys come from the ranks within w tokens of its rows."""
    N, w = 40, 3
    ranges = cp.shard_tokens(N, world)
    o = dict(is_causal=False, mask_stats=True, window_size=(w, w), global_tokens=0, global_mask=None,
             document_ids=None, key_padding_mask=None, query_offset=None)
    intervals = [[cp._key_interval(o, s, e, N, True) for s, e in held] for held in ranges]
    for requester, wanted in enumerate(intervals):
        owners = {p.owner for p in cp._pieces(ranges, intervals) if p.requester == requester}
        assert owners <= {requester - 1, requester, requester + 1}, (requester, owners)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("what", BAD)
def test_bad_input_raises_on_every_rank(sharded, world, what):
    messages = [sharded[r][world, "bad-" + what] for r in range(world)]
    if world == 1 and what not in ("attn_mask", "dropout_seed"):
        return  # a disagreement (or a shard shorter than the sequence) needs two ranks
    assert all(m is not None for m in messages), messages
    key = {"dtype": "dtype differs", "shard-length": "shard lengths", "attn_mask": "attn_mask",
           "dropout_seed": "dropout_seed must be an int64 tensor [2] (seed, offset) or [3]",
           "sinks": "sinks of 3 dims is per query row: its last dim must be this rank's N_r"}[what]
    assert all(key in m for m in messages), messages


def test_layout_covers_every_token_once():
    for N in (0, 1, 5, 13, 16):
        for world in WORLDS:
            for layout in cp.LAYOUTS:
                tokens = sorted(t for held in cp.shard_tokens(N, world, layout) for s, e in held for t in range(s, e))
                assert tokens == list(range(N))


@pytest.mark.parametrize("backend", ["fused", "blockwise", "dense"])
def test_query_offset_rows_equal_the_full_call(backend):
    """query_offset: rows from the middle of the sequence against all its keys equal those rows of the
    full call, on every backend (the twin's own rows are checked against the full twin)."""
    from ascender_torch.backends import attention_backend

    g = torch.Generator().manual_seed(3)
    N = 23
    q, k, v, z, h = (torch.randn(2, 2, N, f, dtype=torch.float64, generator=g) for f in (D, D, DV, DZ, DZ))
    for kw in (dict(variant="paper", k_neighbors=3, is_causal=True), dict(variant="seed", window_size=(2, 4),
                                                                           global_tokens=1)):
        full = reference.ascender_attention_reference(q, k, v, z, h, **kw)
        with attention_backend(backend, block_rows=4):
            for s, e in ((0, 7), (7, 16), (16, 23)):
                rows = ascender_attention(q[:, :, s:e], k, v, z, h, query_offset=s, **kw)
                _close(rows, full[:, :, s:e], f"{backend} rows {s}..{e}")
    with pytest.raises(RuntimeError, match="query_offset"):
        ascender_attention(q[:, :, :5], k, v, z, h, query_offset=N - 4)


@pytest.mark.parametrize("world", WORLDS)
def test_module_shards_equal_one_process(sharded, world):
    model, x, grad = _module_problem()
    x.requires_grad_()
    y, _ = model(x, is_causal=True)
    (y * grad).sum().backward()
    ranks = [sharded[r][world, "module"] for r in range(world)]
    full = lambda t: torch.cat([cp.shard(t, r, world, "balanced", dim=1) for r in range(world)], 1)  # noqa: E731
    _close(torch.cat([r["y"] for r in ranks], 1), full(y.detach()), "module output")
    _close(torch.cat([r["dx"] for r in ranks], 1), full(x.grad), "module dx")
    for n, p in model.named_parameters():
        _close(sum(r["params"][n] for r in ranks), p.grad, f"module d{n}")


def test_every_tensor_argument_has_token_axes():
    """The sharded path refuses a tensor argument it cannot place; every one the spec has is placed."""
    tensors = {a.name for a in _spec.EXTRAS if a.type.startswith("Tensor")}
    assert tensors == set(_spec.TOKEN_AXES)
