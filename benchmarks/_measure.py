"""Measurement helpers shared by the benchmark scripts: median wall time and peak resident
memory above a baseline (Linux /proc: VmHWM is reset through clear_refs before each run, after
free heap pages went back to the system, so memory that an earlier run freed is not reused
unseen)."""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import platform
import statistics
import time

import torch


_libc = ctypes.CDLL("libc.so.6")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_mib(fn) -> float:
    """Peak resident memory (MiB) that fn() adds above what the process holds before it."""
    gc.collect()
    _libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current VmRSS
    before = _status_kib("VmRSS")
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    gc.collect()
    return (peak - before) / 1024.0


def median_seconds(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def print_table(headers, rows) -> None:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = " | ".join(str(h).rjust(w) for h, w in zip(headers, widths))
    print(line)
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(c).rjust(w) for c, w in zip(r, widths)))


HEADERS = ("N", "fused ms", "reference ms", "speed-up", "fused MiB", "reference MiB", "memory ratio")


def parse_args(doc: str):
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096, 16384])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", default="seed", choices=["seed", "paper"])
    return ap.parse_args()


def print_header(name: str, args, what: str) -> None:
    print(f"# {name}: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, float32, variant={args.variant}, {what}, median of {args.repeats}")


def compare_row(N: int, fused, ref, repeats: int, error, ref_bytes: float):
    """One table row: median time and peak memory of fused() and, when ref is not None, of ref()
    with the ratios and error(fused(), ref()); else the memory ref would need (ref_bytes)."""
    t_f = median_seconds(fused, repeats if ref is not None else 1, warmup=1 if ref is not None else 0)
    m_f = peak_mib(fused)
    if ref is None:
        return (N, f"{t_f * 1e3:.1f}", "-", "-", f"{m_f:.1f}", f"(>{ref_bytes / 2**30:.0f} GiB)", "-", "-")
    t_r = median_seconds(ref, min(repeats, 3) if N >= 4096 else repeats)
    m_r = peak_mib(ref)
    err = error(fused(), ref())
    return (N, f"{t_f * 1e3:.1f}", f"{t_r * 1e3:.1f}", f"{t_r / t_f:.1f}x", f"{m_f:.1f}", f"{m_r:.0f}",
            f"{m_r / max(m_f, 1e-3):.0f}x", f"{err:.1e}")


def forward_backward(fn, tensors, kw):
    """fn(*tensors, **kw) and its backward with an upstream gradient of ones; every tensor in
    tensors and kw is a fresh leaf. Returns the gradients: tensors' first, then kw's tensors'."""
    inputs = [t.detach().requires_grad_() for t in tensors]
    params = {n: v.detach().requires_grad_() for n, v in kw.items() if isinstance(v, torch.Tensor)}
    options = {n: v for n, v in kw.items() if not isinstance(v, torch.Tensor)}
    y = fn(*inputs, **params, **options)
    y.backward(torch.ones_like(y))
    return [t.grad for t in inputs] + [p.grad for p in params.values()]


def max_relative_difference(got, want):
    """max over pairs of max |got - want| / max |want| (got cast to want's precision)."""
    return max(((a.to(b.dtype) - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want))
