"""Forward + backward time and peak memory: fused C ops vs reference.py autograd.

One ASCenderHead problem (B = 1, d_model = 256, d_head = 64, so d = dv = 64, dz = da = 32),
float32, gradients w.r.t. q, k, v, z, h and the nine learnable scalars. Median of --repeats
runs; ratios come from the same run. Peak memory is resident memory above what the process
held before the call (inputs excluded).

    python benchmarks/bench_backward.py [--repeats 5] [--variant seed] [--sizes 512 1024 ...]

--short-queries: the fused forward and backward of a few query rows against many keys (chunked
prefill, speculative-decoding training): causal, float32, d = dv = 64, dz = da = 16, the queries the
last Nq of N tokens, Nq in {1, 3, 16, 96, N}, N = 799 with B.H = 240 and N = 4096 with B.H = 8, on
--threads threads (default 1). Times are the process's CPU time (on one thread, the kernel's own
time, undisturbed by other processes on a shared machine), median of --repeats; the inputs' .grad is
cleared before each run, as optimizer.zero_grad() does, so that the time is the op's backward and not
torch adding its gradients into those of the previous run. With --baseline DIR
the same table is measured in the same run for the ascender_torch of another tree (a checkout with
its extension built in place), interleaved with this one, and the ratios are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from ascender_torch import ascender_attention
from ascender_torch.reference import ascender_attention_reference

from _measure import (HEADERS, compare_row, forward_backward, max_relative_difference, parse_args, print_header,
                      print_table)
from bench_forward import REF_MAX_N, problem

SHORT_SHAPES = ((799, 240), (4096, 8))  # (N, B.H)
SHORT_NQ = (1, 3, 16, 96, None)  # None: N


def short_query_times(N: int, BH: int, Nq: int, repeats: int) -> tuple:
    """Median CPU seconds of the fused forward and of its backward, separately."""
    g = torch.Generator().manual_seed(0)
    shapes = ((Nq, 64), (N, 64), (N, 64), (N, 16), (N, 16))
    inputs = [torch.randn(1, BH, n, f, generator=g).requires_grad_() for n, f in shapes]
    fwd, bwd = [], []
    for r in range(repeats + 1):  # (the first run warms up)
        for x in inputs:  # as optimizer.zero_grad() does: the backward's gradients become .grad, nothing is added
            x.grad = None
        t0 = time.process_time()
        y = ascender_attention(*inputs, is_causal=True)
        t1 = time.process_time()
        y.backward(torch.ones_like(y))
        t2 = time.process_time()
        if r:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return statistics.median(fwd), statistics.median(bwd)


def short_query_rows(repeats: int) -> list:
    rows = []
    for N, BH in SHORT_SHAPES:
        for Nq in SHORT_NQ:
            f, b = short_query_times(N, BH, Nq or N, repeats)
            rows.append(dict(N=N, BH=BH, Nq=Nq or N, fwd=f, bwd=b))
    return rows


def _measure_tree(tree: str | None, repeats: int, threads: int) -> list:
    """short_query_rows() in a fresh process, for the ascender_torch of `tree` (None: this script's tree)."""
    here = os.path.dirname(os.path.abspath(__file__))
    tree = os.path.dirname(here) if tree is None else os.path.abspath(tree)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = (f"import sys, json, torch; sys.path.insert(0, {here!r}); torch.set_num_threads({threads}); "
            f"import bench_backward as b; print(json.dumps(b.short_query_rows({repeats})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def short_queries(args) -> None:
    print(f"# bench_backward --short-queries: {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} "
          f"thread(s), float32, causal, d = dv = 64, dz = da = 16, CPU time, median of {args.repeats}"
          + (f"; baseline: {args.baseline}" if args.baseline else ""))
    rounds = [("this", None)] + ([("baseline", args.baseline)] if args.baseline else [])
    got = {name: [] for name, _ in rounds}
    for _ in range(args.rounds):  # interleaved, so that both see the same machine
        for name, tree in rounds:
            got[name].append(_measure_tree(tree, args.repeats, args.threads))
    med = {name: [{k: (statistics.median(r[i][k] for r in runs) if k in ("fwd", "bwd") else runs[0][i][k])
                   for k in runs[0][i]} for i in range(len(runs[0]))] for name, runs in got.items()}
    headers = ("N", "B.H", "Nq", "fwd ms", "bwd ms", "bwd ms per (b, h)", "bwd / fwd")
    if args.baseline:
        headers += ("baseline fwd ms", "baseline bwd ms", "baseline bwd / fwd", "bwd speed-up")
    table = []
    for i, r in enumerate(med["this"]):
        row = (r["N"], r["BH"], r["Nq"], f"{r['fwd'] * 1e3:.1f}", f"{r['bwd'] * 1e3:.1f}",
               f"{r['bwd'] * 1e3 / r['BH']:.2f}", f"{r['bwd'] / r['fwd']:.2f}")
        if args.baseline:
            b = med["baseline"][i]
            row += (f"{b['fwd'] * 1e3:.1f}", f"{b['bwd'] * 1e3:.1f}", f"{b['bwd'] / b['fwd']:.2f}",
                    f"{b['bwd'] / r['bwd']:.2f}x")
        table.append(row)
    print_table(headers, table)


def main():
    if "--short-queries" in sys.argv:
        ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--short-queries", action="store_true")
        ap.add_argument("--repeats", type=int, default=5)
        ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds of this tree and the baseline")
        ap.add_argument("--threads", type=int, default=1)
        ap.add_argument("--baseline", default=None, help="another tree's root, its extension built in place")
        short_queries(ap.parse_args())
        return
    args = parse_args(__doc__)
    print_header("bench_backward", args, "forward+backward")
    rows = []
    for N in args.sizes:
        tensors, kw = problem(N, args.variant)
        fused = lambda: forward_backward(ascender_attention, tensors, kw)  # noqa: E731
        ref = (lambda: forward_backward(ascender_attention_reference, tensors, kw)) if N <= REF_MAX_N else None  # noqa: E731,E501
        rows.append(compare_row(N, fused, ref, args.repeats, lambda got, want: max_relative_difference(got[:5], want[:5]),
                                ref_bytes=4 * N * N * 32))  # q, k, v, z, h
        print(f"N = {N} done", flush=True)
    print()
    print_table(HEADERS + ("max rel. grad diff",), rows)


if __name__ == "__main__":
    main()
