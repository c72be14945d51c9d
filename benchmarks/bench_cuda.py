"""CUDA benchmark: median forward and forward+backward time (CUDA events, after warm-up) and peak
device memory (torch.cuda.max_memory_allocated above the inputs) of
  (a) the fused ascender op (csrc/cuda), (b) reference.py eager, (c) torch.compile(reference),
  (d) F.scaled_dot_product_attention with the flash backend on the same q, k, v,
  (e) the block-wise path (ascender_torch.backends, cuBLAS products over blocks of query rows), one
      row per block budget of --block-memory (the 256 MiB default makes blocks of 21 rows at N = 4096,
      B*H = 16: 195 blocks of 800 (seed) to 1000 (paper) aten ops each for forward+backward),
for bfloat16 and float32, B*H = 16 (B = 2, H = 8), d = dv = 64, dz = da = 32, k = 16.
(b) and (c) print OOM where they do not fit; ratios are against the fused op of the same run.
--impls picks some of the five (e.g. `--sizes 65536 --impls blockwise sdpa-flash`; without fused,
no ratios). Where a table has N = 4096 in bfloat16, a last line states the issue's targets: fused
forward+backward at least 50x faster than (b), and within 10x of (d).
Needs a CUDA device and the package built with ASCENDER_CUDA=1 (tools/gpu_check.sh does both)."""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

from ascender_torch import _ops, ascender_attention
from ascender_torch.backends import Backend, attention_backend
from ascender_torch.reference import ascender_attention_reference

from _measure import print_table

B, H, D, DZ, K = 2, 8, 64, 32, 16


def make_inputs(N: int, dtype: torch.dtype):
    g = torch.Generator(device="cuda").manual_seed(N)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * s).to(dtype)

    return (rnd(B, H, N, D), rnd(B, H, N, D), rnd(B, H, N, D), rnd(B, H, N, DZ, s=0.5), rnd(B, H, N, DZ))


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


def measure(fn, tensors, repeats: int):
    """(forward ms, forward+backward ms, forward MiB, forward+backward MiB), or None on OOM."""
    try:
        with torch.no_grad():
            fwd = lambda: fn(*tensors)  # noqa: E731
            t_f = cuda_median_ms(fwd, repeats)
            m_f = peak_mib(fwd)
        fb = forward_backward(fn, tensors)
        t_fb = cuda_median_ms(fb, repeats)
        m_fb = peak_mib(fb)
        return t_f, t_fb, m_f, m_fb
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", default="paper", choices=["seed", "paper"])
    ap.add_argument("--impls", nargs="+", default=["fused", "blockwise", "reference", "compiled", "sdpa-flash"],
                    choices=["fused", "blockwise", "reference", "compiled", "sdpa-flash"])
    ap.add_argument("--block-memory", type=int, nargs="+", default=[256], metavar="MIB",
                    help="the block-wise path's block budget(s) in MiB (one table row each; its default is 256)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_cuda: no CUDA device; this benchmark needs a GPU")
    if not _ops.CUDA_BUILT:
        sys.exit("bench_cuda: ascender_torch was built without CUDA kernels; rebuild with ASCENDER_CUDA=1")

    opts = dict(variant=args.variant, k_neighbors=K)
    fused = lambda q, k, v, z, h: ascender_attention(q, k, v, z, h, **opts)  # noqa: E731
    eager = lambda q, k, v, z, h: ascender_attention_reference(q, k, v, z, h, **opts)  # noqa: E731
    compiled = torch.compile(eager, dynamic=False)

    def blockwise_with(budget_mib):
        def blockwise(q, k, v, z, h):
            with attention_backend(Backend.BLOCKWISE, block_memory=budget_mib * 2 ** 20):
                return ascender_attention(q, k, v, z, h, **opts)
        return blockwise

    def flash(q, k, v, z, h):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    print(f"# bench_cuda: {torch.cuda.get_device_name()}, torch {torch.__version__}, variant={args.variant}, "
          f"B*H={B * H}, d={D}, dz=da={DZ}, k={K}, median of {args.repeats} (CUDA events)")
    blockwise = tuple((f"blockwise-{m}M", blockwise_with(m)) for m in args.block_memory) if "blockwise" in args.impls else ()
    names = (("fused", fused),) if "fused" in args.impls else ()
    names += blockwise + tuple(
        (n, f) for n, f in (("reference", eager), ("compiled", compiled), ("sdpa-flash", flash)) if n in args.impls)
    targets = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        rows = []
        for N in args.sizes:
            tensors = make_inputs(N, dtype)
            res = {}
            for name, fn in names:
                if name == "sdpa-flash" and dtype == torch.float32:
                    res[name] = "n/a"  # the flash backend takes float16 / bfloat16 only
                    continue
                try:
                    res[name] = measure(fn, tensors, args.repeats)
                except RuntimeError as e:  # e.g. a backend that refuses the shape
                    res[name] = f"error: {str(e).splitlines()[0][:40]}"
                if res[name] is None:
                    res[name] = "OOM"
            base = res.get("fused")  # ratios against it where it ran
            if N == 4096 and dtype == torch.bfloat16 and isinstance(base, tuple):
                ref, fl = res.get("reference"), res.get("sdpa-flash")
                if isinstance(ref, tuple):
                    targets.append(f"fwd+bwd: fused is {ref[1] / base[1]:.1f}x faster than the {args.variant} "
                                   f"reference's autograd (target >= 50x)")
                if isinstance(fl, tuple):
                    targets.append(f"fwd+bwd: fused takes {base[1] / fl[1]:.1f}x the time of sdpa flash (target <= 10x)")
            for name, _ in names:
                r = res[name]
                if isinstance(r, str):
                    rows.append((dtype_name, N, name, r, r, r, r, "-", "-"))
                    continue
                ratio = (lambda i: f"{r[i] / base[i]:.2f}x") if isinstance(base, tuple) else (lambda i: "-")
                rows.append((dtype_name, N, name, f"{r[0]:.2f}", f"{r[1]:.2f}", f"{r[2]:.0f}", f"{r[3]:.0f}",
                             ratio(0), ratio(1)))
            del tensors
            torch.cuda.empty_cache()
        print_table(("dtype", "N", "impl", "fwd ms", "fwd+bwd ms", "fwd MiB", "fwd+bwd MiB", "fwd vs fused",
                     "fwd+bwd vs fused"), rows)
    for line in targets:
        print(f"# targets at N = 4096, B*H = {B * H}, bfloat16: {line}")


if __name__ == "__main__":
    main()
