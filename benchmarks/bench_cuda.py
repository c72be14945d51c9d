"""CUDA benchmark of the issue's targets (docs/cuda.md): median times by CUDA events after warm-up and
peak device memory (torch.cuda.max_memory_allocated above the inputs), B*H = 16 (B = 2, H = 8),
d = dv = 64, dz = da = 32, k = 16.

Main table (--sizes, --dtypes), forward and forward+backward of
  fused               the CUDA kernels (csrc/cuda): the tiled forward where it takes the call
  fused-rowwarp       the same with ASCENDER_CUDA_TILED=0: the row-per-warp kernels (the same-run A/B)
  fused-f2sweep       the same with ASCENDER_CUDA_MOMENTS=sweep: the tiled forward's F2 as a sweep over the pairs
                      where the fused row takes its closed form (docs/cuda.md, "F2 in closed form"; with
                      --causal: "Causal statistics from prefix key sums")
  blockwise           the block-wise path (ascender_torch.backends) with its automatic block: a share of
                      the free device memory (backends.CUDA_FREE_MEMORY_SHARE)
  blockwise-compiled  the same under torch.compile (block_compile=True; compile time excluded, its first
                      call is printed)
  blockwise-<M>M      the block-wise path with an M MiB block budget (--block-memory M ...), e.g. the
                      CPU's 256 MiB, which made it launch-bound on an H100 (190k kernels at N = 4096)
  reference           the dense twin (reference.py) eager, and "compiled": torch.compile of it
  sdpa-flash          F.scaled_dot_product_attention, flash backend, on the same q, k, v
Ratios are against the fused op of the same run; with N = 4096 in bfloat16 the target lines follow.
--head-dim D runs the main table at d = dv = D (default 64, the targets' size; 128 is most large language
models' head size, where every tiled kernel's block needs more shared memory than two blocks per SM leave:
docs/cuda.md, "Wide heads"); no target lines then.
--causal runs every row of the main table causal (is_causal=True, sdpa flash too): the training call of a
decoder, which the issue's targets (full attention) do not cover.
--scenarios adds the issue's other targets, each against sdpa in the same run:
  decode    one new token (Nq = 1, B = 1, H = 8) against a cache of --decode-n (16384) keys, forward
  window    N = --window-n (65536), window_size=(256, 0) and 16 global tokens, forward and fwd+bwd,
            against dense sdpa flash (and causal flash)
  long      N = --long-n (131072), fused forward+backward: the time and peak memory of one call (no warm-up)
  matmul    the bf16 8192^3 matrix product rate (the ceiling of the tensor-FLOP target)
--kernels profiles one fused forward and one forward+backward at the largest N (bfloat16, after a warm-up
call), one decode call with --scenarios decode and one window forward and forward+backward with --scenarios
window, with torch.profiler: each kernel's launches and device time, and the call's span on the device against
the time some kernel ran (the rest: gaps, e.g. a host synchronization or slow launches between kernels). The
fused forward's time was 1.3 ms above its kernel's ncu duration on 2026-11-29.
--estimate FILE (the output of `make cuda-cost`) puts the cost model's estimate of the fused op at
N = 4096 beside the measurement, with their ratio (docs/cuda.md, "The cost model": its calibration).
A fused measurement projected (from its time at the largest main N, by the pair count) past
--max-seconds is skipped with the projection printed (the row-per-warp kernels took 1.3 s at N = 4096).
Needs a CUDA device and the package built with ASCENDER_CUDA=1 (tools/gpu_check.sh does both); without
the fused kernels (--impls without fused) the block-wise rows still run."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from ascender_torch import _ops, ascender_attention
from ascender_torch.backends import Backend, attention_backend
from ascender_torch.reference import ascender_attention_reference

from _measure import print_table

B, H, D, DZ, K = 2, 8, 64, 32, 16
IMPLS = ["fused", "fused-rowwarp", "fused-f2sweep", "blockwise", "blockwise-compiled", "reference", "compiled", "sdpa-flash"]


def make_inputs(b: int, h: int, nq: int, n: int, dtype: torch.dtype, d: int = D):
    g = torch.Generator(device="cuda").manual_seed(n + nq)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * s).to(dtype)

    return (rnd(b, h, nq, d), rnd(b, h, n, d), rnd(b, h, n, d), rnd(b, h, n, DZ, s=0.5), rnd(b, h, n, DZ))


def cuda_median_ms(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_mib(fn) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def forward_backward(fn, tensors):
    def run():
        inputs = [t.detach().requires_grad_() for t in tensors]
        y = fn(*inputs)
        y.backward(torch.ones_like(y))
    return run


def measure(fn, tensors, repeats: int, backward: bool = True):
    """(forward ms, forward+backward ms, forward MiB, forward+backward MiB) (None where not asked), or None on OOM."""
    try:
        with torch.no_grad():
            fwd = lambda: fn(*tensors)  # noqa: E731
            t_f = cuda_median_ms(fwd, repeats)
            m_f = peak_mib(fwd)
        if not backward:
            return t_f, None, m_f, None
        fb = forward_backward(fn, tensors)
        t_fb = cuda_median_ms(fb, repeats)
        m_fb = peak_mib(fb)
        return t_f, t_fb, m_f, m_fb
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


def single_forward_backward(fn, tensors):
    """(ms, peak MiB above the inputs) of one forward+backward, its first at the shape, or None on OOM: for
    calls of seconds (the long scenario), where warm-ups would cost more than they correct."""
    try:
        run = forward_backward(fn, tensors)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        ms = cuda_median_ms(run, 1, warmup=0)
        return ms, (torch.cuda.max_memory_allocated() - base) / 2**20
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


def first_call_seconds(fn, tensors) -> float:
    """Wall time of the first forward+backward (a compiled function compiles then)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    forward_backward(fn, tensors)()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def with_env(fn, name: str, value: str):
    """fn with the environment variable `name` set to `value` during the call: the CUDA kernels read
    ASCENDER_CUDA_TILED (tiled.h) and ASCENDER_CUDA_MOMENTS (keymoments.cuh) per call"""
    def run(*args, **kwargs):
        before = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn(*args, **kwargs)
        finally:
            if before is None:
                del os.environ[name]
            else:
                os.environ[name] = before
    return run


def flash(causal: bool = False):
    def run(q, k, v, *_):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def device_intervals(fn) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every kernel, copy and set that one call of fn ran on the device,
    after a warm-up call (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]


def kernel_rows(intervals: list[tuple[str, float, float]]):
    """Per name (a kernel's parameter list cut, at most 70 characters): launches, ms, share of the busy time,
    heaviest first; and (span ms, busy ms): first start to last end, and the union of the intervals."""
    per: dict[str, list[float]] = {}
    for name, t0, t1 in intervals:
        short = re.sub(r"^void (.*?)\(.*", r"\1", name)[:70]
        acc = per.setdefault(short, [0, 0.0])
        acc[0] += 1
        acc[1] += (t1 - t0) / 1e3
    busy, end = 0.0, None
    for _, t0, t1 in sorted(intervals, key=lambda x: x[1]):
        if end is None or t0 >= end:
            busy += t1 - t0
            end = t1
        elif t1 > end:
            busy += t1 - end
            end = t1
    span = (max(t1 for *_, t1 in intervals) - min(t0 for _, t0, _ in intervals)) / 1e3 if intervals else 0.0
    total = sum(ms for _, ms in per.values()) or 1.0
    rows = [(k, n, f"{ms:.3f}", f"{100 * ms / total:.1f}%") for k, (n, ms) in
            sorted(per.items(), key=lambda kv: -kv[1][1])]
    return rows, span, busy / 1e3


def no_grad_call(fn, tensors):
    """fn on tensors without autograd: the call an inference step makes (the op without its saved outputs)"""
    def run():
        with torch.no_grad():
            fn(*tensors)
    return run


def print_kernels(what: str, fn):
    rows, span, busy = kernel_rows(device_intervals(fn))
    print(f"# kernels of one {what}: the device was busy {busy:.3f} ms of a {span:.3f} ms span "
          f"({span - busy:.3f} ms idle between its first and last kernel)")
    print_table(("kernel", "launches", "ms", "share"), rows)


def read_estimate(path: str, variant: str):
    """(forward ms, forward+backward ms) of `variant` from a `make cuda-cost` report, or None."""
    with open(path) as f:
        for line in f:
            m = re.match(r"variant (\w+): forward ([\d.]+) ms, backward ([\d.]+) ms", line)
            if m and m.group(1) == variant:
                fwd, bwd = float(m.group(2)), float(m.group(3))
                return fwd, fwd + bwd
    return None


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16"], choices=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", default="paper", choices=["seed", "paper"])
    ap.add_argument("--impls", nargs="+", default=IMPLS, choices=IMPLS)
    ap.add_argument("--block-memory", type=int, nargs="*", default=[], metavar="MIB",
                    help="block-wise rows with these fixed block budgets in MiB, besides the automatic one")
    ap.add_argument("--scenarios", nargs="*", default=[], choices=["decode", "window", "long", "matmul"])
    ap.add_argument("--decode-n", type=int, default=16384)
    ap.add_argument("--window-n", type=int, default=65536)
    ap.add_argument("--long-n", type=int, default=131072)
    ap.add_argument("--estimate", metavar="FILE", help="a `make cuda-cost` report to compare with")
    ap.add_argument("--forward-only", action="store_true", help="main table: forward times only")
    ap.add_argument("--causal", action="store_true", help="main table: is_causal=True for every row")
    ap.add_argument("--head-dim", type=int, default=D, metavar="D",
                    help=f"main table: d = dv = D (default {D}; the targets are set at {D}, e.g. 128 for most LLMs)")
    ap.add_argument("--kernels", action="store_true",
                    help="profile one fused forward and forward+backward at the largest N: time per kernel")
    ap.add_argument("--max-seconds", type=float, default=20.0,
                    help="skip a fused measurement whose projected forward+backward time exceeds this")
    args = ap.parse_args()
    if args.head_dim < 1:
        ap.error(f"--head-dim must be positive; got {args.head_dim}")
    if args.head_dim != D and args.scenarios:
        ap.error(f"--scenarios are set at d = {D} (their projections read the main table): run them without --head-dim")
    if not torch.cuda.is_available():
        sys.exit("bench_cuda: no CUDA device; this benchmark needs a GPU")
    fused_ok = _ops.CUDA_BUILT
    if "fused" in args.impls and not fused_ok:
        print("# bench_cuda: ascender_torch was built without CUDA kernels (ASCENDER_CUDA=1): no fused rows")

    opts = dict(variant=args.variant, k_neighbors=K, is_causal=args.causal)
    fused = lambda q, k, v, z, h, **o: ascender_attention(q, k, v, z, h, **opts, **o)  # noqa: E731
    eager = lambda q, k, v, z, h: ascender_attention_reference(q, k, v, z, h, **opts)  # noqa: E731

    def blockwise_with(**how):
        def run(q, k, v, z, h):
            with attention_backend(Backend.BLOCKWISE, **how):
                return ascender_attention(q, k, v, z, h, **opts)
        return run

    print(f"# bench_cuda: {torch.cuda.get_device_name()}, torch {torch.__version__}, variant={args.variant}, "
          f"B*H={B * H}, d=dv={args.head_dim}, dz=da={DZ}, k={K}, {'causal, ' if args.causal else ''}median of {args.repeats} (CUDA events), "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    names = []
    for name in args.impls:
        if name == "fused" and fused_ok:
            names.append(("fused", fused))
        elif name == "fused-rowwarp" and fused_ok:
            names.append((name, with_env(fused, "ASCENDER_CUDA_TILED", "0")))
        elif name == "fused-f2sweep" and fused_ok:
            names.append((name, with_env(fused, "ASCENDER_CUDA_MOMENTS", "sweep")))
        elif name == "blockwise":
            names.append(("blockwise", blockwise_with()))
            names += [(f"blockwise-{m}M", blockwise_with(block_memory=m * 2 ** 20)) for m in args.block_memory]
        elif name == "blockwise-compiled":
            names.append((name, blockwise_with(block_compile=True)))
        elif name == "reference":
            names.append((name, eager))
        elif name == "compiled":
            names.append((name, torch.compile(eager, dynamic=False)))
        elif name == "sdpa-flash":
            names.append((name, flash(causal=args.causal)))
    targets, notes, skipped = [], [], []
    fused_base = None  # (N, fused measurement) at the largest main N in bfloat16: the projections' base
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        rows = []
        for N in args.sizes:
            tensors = make_inputs(B, H, N, N, dtype, args.head_dim)
            res = {}
            for name, fn in names:
                if name == "sdpa-flash" and dtype == torch.float32:
                    res[name] = "n/a"  # the flash backend takes float16 / bfloat16 only
                    continue
                if name in ("compiled", "blockwise-compiled"):
                    try:
                        notes.append(f"{name} {dtype_name} N={N}: first fwd+bwd (compiles) "
                                     f"{first_call_seconds(fn, tensors):.1f} s")
                    except (RuntimeError, torch.OutOfMemoryError) as e:
                        torch.cuda.empty_cache()
                        notes.append(f"{name} {dtype_name} N={N}: first call failed: {str(e).splitlines()[0][:60]}")
                try:
                    res[name] = measure(fn, tensors, args.repeats, backward=not args.forward_only)
                except RuntimeError as e:  # e.g. a backend that refuses the shape
                    res[name] = f"error: {str(e).splitlines()[0][:40]}"
                if res[name] is None:
                    res[name] = "OOM"
            base = res.get("fused")
            if isinstance(base, tuple) and dtype == torch.bfloat16:
                fused_base = (N, base)
            if N == 4096 and dtype == torch.bfloat16 and isinstance(base, tuple) and args.head_dim == D:
                fl, comp = res.get("sdpa-flash"), res.get("compiled")
                if isinstance(fl, tuple):
                    if fl[1] is not None:
                        targets.append(f"fwd+bwd: fused takes {base[1] / fl[1]:.1f}x the time of sdpa flash "
                                       "(target <= 10x)")
                    targets.append(f"fwd: fused takes {base[0] / fl[0]:.1f}x the time of sdpa flash (target <= 6x)")
                if isinstance(comp, tuple) and comp[1] is not None:
                    targets.append(f"fwd+bwd: fused is {comp[1] / base[1]:.1f}x faster than torch.compile of the "
                                   f"dense twin (target >= 10x)")
                est = read_estimate(args.estimate, args.variant) if args.estimate else None
                if est and base[1] is not None:
                    targets.append(f"the cost model ({args.estimate}) estimated fwd {est[0]:.3f} ms, fwd+bwd "
                                   f"{est[1]:.3f} ms; measured {base[0]:.3f} / {base[1]:.3f} ms: measured / estimated "
                                   f"= {base[0] / est[0]:.2f} / {base[1] / est[1]:.2f}")
            for name, _ in names:
                r = res[name]
                if isinstance(r, str):
                    rows.append((dtype_name, N, name, r, r, r, r, "-", "-"))
                    continue
                ratio = (lambda i: f"{r[i] / base[i]:.2f}x" if isinstance(base, tuple) and r[i] is not None
                         and base[i] is not None else "-")
                rows.append((dtype_name, N, name, fmt(r[0]), fmt(r[1]), fmt(r[2], 0), fmt(r[3], 0), ratio(0),
                             ratio(1)))
            del tensors
            torch.cuda.empty_cache()
        print_table(("dtype", "N", "impl", "fwd ms", "fwd+bwd ms", "fwd MiB", "fwd+bwd MiB", "fwd vs fused",
                     "fwd+bwd vs fused"), rows)
    for line in notes:
        print(f"# {line}")
    if args.kernels and fused_ok:
        n = max(args.sizes)
        tensors = make_inputs(B, H, n, n, torch.bfloat16, args.head_dim)
        tag = f"fused call at N = {n}, d = {args.head_dim}, bfloat16, {args.variant}{', causal' if args.causal else ''}"
        print_kernels(f"forward ({tag})", no_grad_call(fused, tensors))
        if not args.forward_only:
            print_kernels(f"forward+backward ({tag})", forward_backward(fused, tensors))
        del tensors
    for line in targets:
        what = "causal, the targets' ratios for comparison only" if args.causal else "targets"
        print(f"# {what} at N = 4096, B*H = {B * H}, bfloat16, variant {args.variant}: {line}")

    def projected(pairs: float) -> float | None:
        """fused fwd+bwd seconds for `pairs` (query, key) pairs, scaled from the largest main N"""
        return None if fused_base is None or fused_base[1][1] is None else fused_base[1][1] / 1e3 * pairs / fused_base[0] ** 2

    scen = []
    bf16 = torch.bfloat16
    if "decode" in args.scenarios:
        n = args.decode_n
        tensors = make_inputs(1, 8, 1, n, bf16)
        sdpa = lambda q, k, v, *_: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
        s = measure(sdpa, tensors, args.repeats, backward=False)
        f = measure(fused, tensors, args.repeats, backward=False) if fused_ok else None
        scen.append(("decode", f"Nq=1, H=8, cache {n}", fmt(f and f[0], 3), fmt(s and s[0], 3),
                     f"{f[0] / s[0]:.1f}x (target <= 4x)" if f and s else "-", fmt(f and f[2], 0)))
        if args.kernels and fused_ok:
            print_kernels(f"decode call (Nq = 1, H = 8, cache {n}, bfloat16, {args.variant})",
                          no_grad_call(fused, tensors))
        del tensors
    if "window" in args.scenarios:
        n = args.window_n
        tensors = make_inputs(B, H, n, n, bf16)
        win = dict(window_size=(256, 0), global_tokens=16)
        s = measure(flash(), tensors, args.repeats)
        sc = measure(flash(causal=True), tensors, args.repeats)
        proj = projected(n * (256 + 16))
        if fused_ok and (proj is None or proj <= args.max_seconds):
            windowed = lambda *t: fused(*t, **win)  # noqa: E731
            f = measure(windowed, tensors, args.repeats)
            if args.kernels and f:
                print_kernels(f"window forward (N = {n}, (256, 0), 16 global, bfloat16, {args.variant})",
                              no_grad_call(windowed, tensors))
                print_kernels(f"window forward+backward (N = {n}, (256, 0), 16 global, bfloat16, {args.variant})",
                              forward_backward(windowed, tensors))
        else:
            f = None
            if fused_ok:
                skipped.append(f"window: fused skipped, projected {proj:.0f} s per fwd+bwd")
        for what, i in (("fwd", 0), ("fwd+bwd", 1)):
            scen.append((f"window {what}", f"N={n}, (256, 0), 16 global", fmt(f and f[i]), fmt(s and s[i]),
                         f"{f[i] / s[i]:.2f}x of dense flash (target < 1); causal flash {fmt(sc and sc[i])} ms"
                         if f and s else "-", fmt(f and f[i + 2], 0)))
        del tensors
    if "long" in args.scenarios:
        n = args.long_n
        tensors = make_inputs(B, H, n, n, bf16)
        s = single_forward_backward(flash(), tensors)
        proj = projected(n * n)
        if fused_ok and (proj is None or proj <= args.max_seconds):
            f = single_forward_backward(fused, tensors)  # one call: it takes seconds (26 s projected on 2026-11-29)
        else:
            f = None
            if fused_ok:
                skipped.append(f"long: fused skipped, projected {proj:.0f} s per fwd+bwd")
        scen.append(("long fwd+bwd", f"N={n}, one call", fmt(f and f[0]), fmt(s and s[0]),
                     "runs (memory linear in N)" if f else "-", fmt(f and f[1], 0)))
        del tensors
    if "matmul" in args.scenarios:
        a = torch.randn(8192, 8192, device="cuda", dtype=bf16)
        b = torch.randn(8192, 8192, device="cuda", dtype=bf16)
        ms = cuda_median_ms(lambda: a @ b, max(args.repeats, 10))
        scen.append(("matmul", "bf16 8192^3", "-", fmt(ms, 3), f"{2 * 8192 ** 3 / ms / 1e9:.0f} TFLOP/s", "-"))
        del a, b
    torch.cuda.empty_cache()
    if scen:
        print_table(("scenario", "shape", "fused ms", "sdpa ms", "result", "fused peak MiB"), scen)
    for line in skipped:
        print(f"# {line}")


if __name__ == "__main__":
    main()
