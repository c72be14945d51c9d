"""The fused op against its anchors, in one run: torch.matmul's float32 FLOP rate, SDPA
(F.scaled_dot_product_attention), and the dense twin (reference.py) under torch.compile.

One ASCenderHead problem (B = H = 1, d = dv = 64, dz = da = 32, float32, the benchmark head of
bench_forward.py), for N in --sizes, forward and forward + backward, both variants. Per N every
contender is timed once per round, the rounds interleaved (--repeats of them), and the median is
printed: on a shared machine the load changes during the run, and interleaving spreads it
evenly. The effective rate is ascender_torch.flops() (the operation count of the formulas, see
ascender_torch/flops.py) divided by the time; "% mm" is that rate over torch.matmul's measured rate.

    python benchmarks/bench_anchors.py [--sizes 1024 2048 4096 8192] [--repeats 3] [--threads 2]
                                       [--no-compile] [--scaling] [--busy]

--scaling adds forward + backward at N = 4096 with 1 and 2 threads; --busy adds the same with one
competing busy process (a python busy loop, killed afterwards). The load average (uptime) is
printed before and after: compare runs only at similar load.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from ascender_torch import AttentionConfig, ascender_attention, flops
from ascender_torch.reference import ascender_attention_reference

from _measure import forward_backward, print_table
from bench_forward import problem

TWIN_MAX_N = 4096  # the twin holds N x N x dz tensors (2 GiB at 4096)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def matmul_rate(n: int = 2048, repeats: int = 5) -> float:
    """torch.matmul's float32 rate (FLOP/s) on an n x n x n product, median of repeats."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)
    return 2.0 * n ** 3 / statistics.median(timed(lambda: torch.matmul(a, b)) for _ in range(repeats))


def contenders(N: int, args):
    """name -> zero-argument callable; the fused op in both variants, SDPA, the compiled twin."""
    out = {}
    for variant in ("paper", "seed"):
        tensors, kw = problem(N, variant)

        def fwd(tensors=tensors, kw=kw):
            with torch.no_grad():
                return ascender_attention(*tensors, **kw)

        out[f"fused {variant} fwd"] = fwd
        out[f"fused {variant} fwd+bwd"] = lambda tensors=tensors, kw=kw: forward_backward(ascender_attention, tensors, kw)
        if not args.no_compile and N <= TWIN_MAX_N:
            twin = torch.compile(ascender_attention_reference, dynamic=False)

            def twin_fwd(tensors=tensors, kw=kw, twin=twin):
                with torch.no_grad():
                    return twin(*tensors, **kw)

            out[f"twin {variant} fwd"] = twin_fwd
    q, k, v = problem(N, "paper")[0][:3]

    def sdpa_fwd():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v)

    out["sdpa fwd"] = sdpa_fwd
    out["sdpa fwd+bwd"] = lambda: forward_backward(F.scaled_dot_product_attention, (q, k, v), {})
    return out


def measure(N: int, args) -> dict:
    fns = contenders(N, args)
    for fn in fns.values():  # warm-up (and compilation)
        fn()
    time.sleep(1.0)
    times = {name: [] for name in fns}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled dense twin")
    ap.add_argument("--scaling", action="store_true", help="also 1 vs 2 threads at N = 4096")
    ap.add_argument("--busy", action="store_true", help="also with one competing busy process")
    args = ap.parse_args()
    # compile in this process: inductor's pool of compile workers stays busy for seconds after a
    # compilation and would slow down whatever is timed next
    import torch._inductor.config as inductor_config
    inductor_config.compile_threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    print(f"# bench_anchors: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, {threads} threads, float32, median of {args.repeats} interleaved rounds; "
          f"load average before: {load()}")
    rate = matmul_rate()
    print(f"# torch.matmul float32 (2048^3): {rate / 1e9:.1f} GFLOP/s")

    rows = []
    for N in args.sizes:
        t = measure(N, args)
        for variant in ("paper", "seed"):
            fl = flops(AttentionConfig(d=64, dv=64, dz=32, da=32, k_neighbors=16, variant=variant), N)["ascender"]
            for mode, key in (("fwd", "forward"), ("fwd+bwd", "total")):
                tf, ts = t[f"fused {variant} {mode}"], t[f"sdpa {mode}"]
                tw = t.get(f"twin {variant} {mode}")
                eff = fl[key] / tf
                rows.append((N, variant, mode, f"{tf * 1e3:.1f}", f"{ts * 1e3:.1f}", f"{tf / ts:.1f}x",
                             f"{tw * 1e3:.1f}" if tw else "-", f"{tw / tf:.1f}x" if tw else "-",
                             f"{eff / 1e9:.1f}", f"{100 * eff / rate:.0f}%"))
        print(f"N = {N} done (load {load()})", flush=True)
    print()
    print_table(("N", "variant", "mode", "fused ms", "sdpa ms", "fused/sdpa", "twin ms", "twin/fused",
                 "GFLOP/s", "% mm"), rows)

    if args.scaling or args.busy:
        print()
        N = 4096
        tensors, kw = problem(N, "paper")
        q, k, v = tensors[:3]
        fused = lambda: forward_backward(ascender_attention, tensors, kw)  # noqa: E731
        sdpa = lambda: forward_backward(F.scaled_dot_product_attention, (q, k, v), {})  # noqa: E731
        srows = []
        settings = []
        if args.scaling:
            settings += [(1, False), (2, False)]
        if args.busy:
            settings += [(2, True)]
        for nt, busy in settings:
            torch.set_num_threads(nt)
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                time.sleep(0.5 if busy else 0)
                fused(), sdpa()
                tf, ts = [], []
                for _ in range(args.repeats):
                    tf.append(timed(fused))
                    ts.append(timed(sdpa))
            finally:
                if proc:
                    proc.kill()
                    proc.wait()
            srows.append((N, nt, "yes" if busy else "no", f"{statistics.median(tf) * 1e3:.1f}",
                          f"{statistics.median(ts) * 1e3:.1f}"))
        torch.set_num_threads(threads)
        print("forward + backward, paper variant, N = 4096:")
        print_table(("N", "threads", "busy process", "fused ms", "sdpa ms"), srows)
    print(f"\n# load average after: {load()}")


if __name__ == "__main__":
    main()
