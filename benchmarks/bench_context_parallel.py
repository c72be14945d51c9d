"""Context parallelism (docs/context_parallel.md): forward+backward time and peak memory per rank of
context_parallel_attention on W gloo ranks of one thread each, against the one-process fused op on one
thread; then the communication model of one layer at N = 1M tokens on 8 ranks.

    python benchmarks/bench_context_parallel.py [--n 16384] [--worlds 1 2 3 4] [--repeats 3]

Every configuration runs in fresh processes (the one-process op in one of its own). Time: the median
over repeats of the slowest rank's fwd+bwd, wall (barriers around it) and CPU time of the process (what
a rank computes, without waiting: on a machine that other work shares, the steadier of the two).
Memory: the peak resident memory a rank adds during one fwd+bwd above what it held before (its shard
of the inputs), the largest over the ranks. The model counts the bytes of the exchange plan itself
(ascender_torch.distributed's pieces; tests/test_context_parallel.py checks that the bytes sent equal
it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import peak_mib, print_table  # noqa: E402

from ascender_torch import ascender_attention  # noqa: E402
from ascender_torch import distributed as cp  # noqa: E402

D, DV, DZ = 64, 64, 32


def _inputs(args, rank: int, world: int):
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(1, args.heads, args.n, f, generator=g) for f in (D, D, DV, DZ, DZ)]
    if world == 0:  # the one-process op
        return [t.requires_grad_() for t in full]
    return [cp.shard(t, rank, world, args.layout).requires_grad_() for t in full]


def _step(args, tensors, world: int):
    kw = dict(variant=args.variant, is_causal=True, k_neighbors=16)
    if world == 0:
        y = ascender_attention(*tensors, **kw)
    else:
        y = cp.context_parallel_attention(*tensors, layout=args.layout, **kw)
    y.backward(torch.ones_like(y))
    for t in tensors:
        t.grad = None


def _rank(rank: int, world: int, port: int, args, out):
    torch.set_num_threads(1)
    if world:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=1800))
    tensors = _inputs(args, rank, world)
    sync = dist.barrier if world else (lambda: None)
    _step(args, tensors, world)  # warm-up
    times, cpu = [], []
    for _ in range(args.repeats):
        sync()
        t0, c0 = time.perf_counter(), time.process_time()
        _step(args, tensors, world)
        c1 = time.process_time()
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(c1 - c0)
    sync()
    mem = peak_mib(lambda: _step(args, tensors, world))
    out[rank] = (statistics.median(times), statistics.median(cpu), mem)
    if world:
        dist.destroy_process_group()


def _launch(world: int, args):
    out = mp.Manager().dict()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(world, port, args, out), nprocs=max(world, 1))
    return tuple(max(r[x] for r in out.values()) for x in range(3))


def _model(N: int, world: int, layout: str, heads: int, element: int, **o):
    """Bytes per rank of one layer's exchange: forward (k, v, z, h received) and backward (their gradients
    sent back), the largest over the ranks, and as a multiple of the sequence's K, V, Z, H bytes."""
    opts = dict(is_causal=False, mask_stats=True, window_size=None, global_tokens=0, global_mask=None,
                document_ids=None, key_padding_mask=None, query_offset=None)
    opts.update(o)
    ranges = cp.shard_tokens(N, world, layout)
    intervals = [[cp._key_interval(opts, s, e, N, True) for s, e in held] for held in ranges]
    per_token = heads * (D + DV + DZ + DZ) * element
    received = [0] * world
    for p in cp._pieces(ranges, intervals):
        if p.owner != p.requester:
            received[p.requester] += (p.stop - p.start) * per_token
    top = max(received)
    return top, top / (N * per_token)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variant", default="paper", choices=["seed", "paper"])
    ap.add_argument("--layout", default="balanced", choices=list(cp.LAYOUTS))
    args = ap.parse_args()
    print(f"# bench_context_parallel: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, {datetime.date.today()}, float32, B = 1, H = {args.heads}, N = {args.n}, "
          f"d = dv = {D}, "
          f"dz = da = {DZ}, variant={args.variant}, causal, layout={args.layout}, one thread per rank, "
          f"fwd+bwd median of {args.repeats}")
    base_t, base_c, base_m = _launch(0, args)
    rows = [("1 process (ascender_attention)", f"{base_t:.2f}", "1.00x", f"{base_c:.2f}", "1.00x", f"{base_m:.0f}",
             "1.00x")]
    for world in args.worlds:
        t, c, m = _launch(world, args)
        rows.append((f"{world} rank(s) (context_parallel_attention)", f"{t:.2f}", f"{base_t / t:.2f}x", f"{c:.2f}",
                     f"{base_c / c:.2f}x", f"{m:.0f}", f"{m / base_m:.2f}x"))
    print_table(("run", "wall s", "speed-up", "CPU s (slowest rank)", "CPU speed-up", "peak MiB per rank",
                 "memory ratio"), rows)

    print("\n# communication model, one layer, N = 1,048,576 tokens on 8 ranks, H = 8, bfloat16: bytes a rank "
          "receives in the forward (k, v, z, h) and sends back in the backward (their gradients), the largest rank")
    N, W = 1 << 20, 8
    table = []
    for label, layout, o in (("bidirectional", "contiguous", {}),
                             ("causal", "contiguous", dict(is_causal=True)),
                             ("causal", "balanced", dict(is_causal=True)),
                             ("window (4096, 0)", "contiguous", dict(is_causal=True, window_size=(4096, 0)))):
        top, ratio = _model(N, W, layout, 8, 2, **o)
        table.append((label, layout, f"{top / 2**20:.0f} MiB", f"{ratio:.3f}x", f"{top / 2**20:.0f} MiB"))
    print_table(("attention", "layout", "forward per rank", "of the sequence's K,V,Z,H", "backward per rank"),
                table)


if __name__ == "__main__":
    main()
