"""The test cases every backend runs (pytorch_scatter's testing.py): the grid's axes (dtype,
device, variant, masking), random ASCender problems, and the call helper that runs a registered
op with the functional's defaults (every argument by its name in ascender_torch/_spec.py)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ascender_torch import _ops, _spec
from ascender_torch._spec import Stat
from ascender_torch.backends import attention_backend

VARIANTS = _spec.VARIANTS
MASK_MODES = ("none", "causal", "key_padding", "attn_mask_stats", "attn_mask_seed", "all")
DTYPES = (pytest.param(torch.float64, id="f64"), pytest.param(torch.float32, id="f32"))


def _cuda_available() -> bool:
    return torch.cuda.is_available() and _ops.CUDA_BUILT


# Norm-wise relative error bounds (rel_err) of a backend's forward against the float64 twin on the
# same rounded inputs. The CUDA kernels keep float32 sums in float32 (the CPU's in double); the
# block-wise path forms distances from norms and a product.
FORWARD_TOL = {("cpu", "fused", torch.float64): 1e-10, ("cpu", "fused", torch.float32): 1e-5,
               ("cuda", "fused", torch.float64): 1e-10, ("cuda", "fused", torch.float32): 1e-4,
               ("cpu", "blockwise", torch.float64): 1e-10, ("cpu", "blockwise", torch.float32): 1e-4,
               ("cuda", "blockwise", torch.float64): 1e-10, ("cuda", "blockwise", torch.float32): 1e-4}


@dataclass(frozen=True)
class Target:
    """Where a grid case runs: a device and a backend of ascender_attention."""

    device: str
    backend: str

    def use(self, N: int = 0):
        """The backend (for the duration of a test); block-wise blocks of 3 rows, so that every grid
        case crosses block boundaries, or a quarter of N for long rows."""
        return attention_backend(self.backend, block_rows=max(3, N // 4) if self.backend == "blockwise" else None)

    def tolerance(self, dtype) -> float:
        return FORWARD_TOL[self.device, self.backend, dtype]

    @property
    def nondet_tol(self) -> float:
        """gradcheck's bound on two backward runs differing: on a GPU both backends add gradients with
        atomics (the fused backward's key-side sums, the block-wise path's index_add_), so the order of a
        float64 sum, and its last bits, change from run to run; the CPU backends are deterministic."""
        return 1e-12 if self.device == "cuda" else 0.0


CPU_FUSED = Target("cpu", "fused")  # what runs by default on the CPU
_NO_CUDA = pytest.mark.skipif(not _cuda_available(),
                              reason="needs a CUDA device and the CUDA kernels (build with ASCENDER_CUDA=1)")
# Every device x backend; a device this machine lacks is skipped, not dropped, so each grid reads
# the same everywhere. The `target` fixture (conftest.py) runs a test under each.
TARGETS = (
    pytest.param(CPU_FUSED, id="cpu-fused"),
    pytest.param(Target("cpu", "blockwise"), id="cpu-blockwise"),
    pytest.param(Target("cuda", "fused"), id="cuda-fused", marks=_NO_CUDA),
    pytest.param(Target("cuda", "blockwise"), id="cuda-blockwise", marks=_NO_CUDA),
)


class LargestTensor(TorchDispatchMode):
    """Inside `with LargestTensor() as m:`, m.largest is the most elements of any tensor an op created,
    and m.peak the most elements alive at once among the tensors ops created with storage of their
    own (views are not counted again; a tensor counts until it is freed)."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.live = 0
        self.peak = 0

    def _freed(self, n):
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        fresh = not (func._schema.is_mutable or any(r.alias_info for r in func._schema.returns))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
                if fresh:
                    self.live += t.numel()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(t, self._freed, t.numel())
        return out


def on(device, tree):
    """tree (a tensor, or a tuple / dict of them and other values) moved to device."""
    if isinstance(tree, dict):
        return {n: on(device, v) for n, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(on(device, v) for v in tree)
    return tree.to(device) if isinstance(tree, torch.Tensor) else tree


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (norm-wise relative error, robust to tiny entries)."""
    want = want.to(torch.float64)
    scale = want.abs().max().item() if want.numel() else 0.0
    diff = (got.to(torch.float64) - want).abs().max().item() if want.numel() else 0.0
    return diff / max(scale, 1e-300)


def make_problem(B=2, H=2, N=7, d=8, dv=6, dz=4, da=4, dtype=torch.float64, seed=0,
                 duplicates=False, per_head=True, k_neighbors=3):
    """Random q, k, v, z, h [B, H, N, *] and learnable scalars, scaled so that every bias term
    matters (z near 1 so kernel weights are neither all 0 nor all 1)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * s).to(dtype)

    q, k, v = rnd(B, H, N, d), rnd(B, H, N, d), rnd(B, H, N, dv)
    z, h = rnd(B, H, N, dz, s=0.5), rnd(B, H, N, da)
    if duplicates and N >= 3:  # tokens 1 and 2 are copies of token 0
        for t in (q, k, v, z, h):
            t[:, :, 1:3] = t[:, :, :1]
    if per_head:
        scalars = dict(
            lambda_align=rnd(H).abs() + 0.5, lambda_sep=rnd(H).abs() + 0.5,
            lambda_coh=rnd(H).abs() + 0.5, omega_align=rnd(H, s=0.5), omega_sep=rnd(H, s=0.5),
            omega_coh=rnd(H, s=0.5), score_temp=(rnd(H, s=0.2).abs() + 0.7),
            delta=rnd(H, s=0.2), kappa=(rnd(H).abs() + 0.5) * N / 4,
        )
    else:
        scalars = dict(omega_align=torch.tensor(0.7, dtype=dtype), omega_sep=torch.tensor(-0.4, dtype=dtype),
                       omega_coh=torch.tensor(0.5, dtype=dtype), kappa=torch.tensor(1.5, dtype=dtype))
    return (q, k, v, z, h), scalars, dict(k_neighbors=k_neighbors, alpha_align=-1.3, alpha_coh=0.7)


def make_masks(mode: str, B: int, H: int, N: int, seed: int = 0) -> dict:
    """Keyword arguments for one masking mode. Includes a fully masked row where possible."""
    g = torch.Generator().manual_seed(seed + 1)
    kpm = torch.rand(B, N, generator=g) < 0.3
    if B > 1:
        kpm[-1] = True  # one batch element has no visible key at all
    am = torch.rand(B, 1, N, N, generator=g) < 0.7
    am[..., 0, :] = False  # query 0 sees nothing
    if mode == "none":
        return {}
    if mode == "causal":
        return dict(is_causal=True)
    if mode == "key_padding":
        return dict(key_padding_mask=kpm)
    if mode == "attn_mask_stats":
        return dict(attn_mask=am, mask_stats=True)
    if mode == "attn_mask_seed":
        return dict(attn_mask=am, mask_stats=False)
    if mode == "all":
        return dict(is_causal=True, key_padding_mask=kpm, attn_mask=am[0, 0], mask_stats=True)
    raise ValueError(mode)


def op_arguments(tensors, scalars, opts, masks, variant, **extra):
    """Every argument of ascender_fwd by name: the tensors, each learnable scalar (given or the
    spec's default, as a tensor of q's dtype and device), the options with the spec's defaults."""
    q = tensors[0]
    values = dict(zip(("q", "k", "v", "z", "h"), tensors))
    for name, default in _spec.SCALAR_DEFAULTS.items():
        values[name] = scalars[name] if name in scalars else torch.tensor(default, dtype=q.dtype, device=q.device)
    given = dict(opts, **masks, **extra, variant=variant)
    options = _spec.options("op_arguments", _spec.ASCENDER_KEYWORDS,
                            {n: v for n, v in given.items() if n not in _spec.SCALAR_DEFAULTS})
    options["scale"] = _spec.resolved_scale(options["scale"], q)
    for a in _spec.ASCENDER_FWD.args:
        values.setdefault(a.name, options.get(a.name))
    return values


def fused_forward(tensors, scalars, opts, masks, variant, **extra) -> dict:
    """The registered forward's outputs by name (out, stats, u, c, nbr, aux, rows32)."""
    outputs = torch.ops.ascender.ascender_fwd(**op_arguments(tensors, scalars, opts, masks, variant, **extra))
    return dict(zip(_spec.ASCENDER_FWD.returns, outputs))


def saved_stats(tensors, scalars, opts, masks, variant):
    """The forward's saved statistics (float64 inputs give float64 statistics)."""
    return fused_forward(tensors, scalars, opts, masks, variant)["stats"]


def resolvable_rows(tensors, scalars, opts, masks, variant, rel=1e-6, floor=0.0):
    """Rows whose three bias rows have a std above rel * (|mean| + std) + floor, judged by the
    float64 CPU kernel on the same inputs (rows with n_i <= 1 have no normalized bias and count as
    resolvable). A bias row that is constant in exact arithmetic (the paper variant's alignment
    row of a query whose visible keys are exactly its two neighbours) has a std made of rounding
    noise; its normalized values, and their derivatives, are that noise amplified by
    1/(std + 1e-6) in any implementation (docs/forward.md). The checks give such rows no upstream
    gradient (rel = 1e-6), and compare low precision only on rows it can resolve (larger rel)."""
    cpu64 = lambda t: t.detach().to("cpu", torch.float64) if t.is_floating_point() else t.to("cpu")  # noqa: E731
    st = saved_stats(tuple(map(cpu64, tensors)), {n: cpu64(s) for n, s in scalars.items()}, opts,
                     {n: cpu64(m) if isinstance(m, torch.Tensor) else m for n, m in masks.items()}, variant)
    ok = torch.ones(st.shape[:3], dtype=torch.bool)
    for mean, std in _spec.BIAS_MOMENTS:
        ok &= st[..., std] > rel * (st[..., mean].abs() + st[..., std]) + floor
    return (ok | (st[..., Stat.COUNT] <= 1)).to(tensors[0].device)


def full_scalars(scalars, H, dtype):
    """Every learnable scalar as an [H] tensor: the given ones, the spec's defaults for the rest."""
    return {n: scalars.get(n, torch.full((H,), v, dtype=dtype)).clone() for n, v in _spec.SCALAR_DEFAULTS.items()}
