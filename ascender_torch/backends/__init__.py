"""The backends of `ascender_attention` and their selection, in the style of
`torch.nn.attention.sdpa_kernel`:

* ``Backend.FUSED``: the fused kernels (C on the CPU: float32, float64, and float16, bfloat16 on
  the float32 kernels; CUDA when built with ASCENDER_CUDA=1: all four). O(N) memory.
* ``Backend.BLOCKWISE``: PyTorch ops on any device and every floating dtype, one block of query
  rows at a time (every pair product a matrix product, recomputed per block in the backward);
  O(block x N) memory, the block sized from a memory budget (``block_memory``: 256 MiB on the CPU,
  a quarter of the free device memory on CUDA, where each block costs about a thousand kernel
  launches), optionally under torch.compile (``block_compile``).
* ``Backend.DENSE``: the dense twin (`reference.py`), O(N^2 dz) memory: the oracle, for
  inspection and tests.

The automatic choice takes the fused kernels where they are compiled for the device and dtype (on
CUDA: where their shared memory holds the call's rows, which very wide ones outgrow), else the
block-wise path, and says so once (a RuntimeWarning naming the backend and why).
`attention_backend(...)` restricts the choice inside a ``with`` block. The choice is made when a
call is traced, so under torch.compile it is fixed for the compiled graph.
"""

from __future__ import annotations

import contextlib
import enum
import os
import warnings

import torch
import torch.autograd.forward_ad as fwAD

from .. import _ops
from .. import _spec as spec
from . import fused


class Backend(str, enum.Enum):
    FUSED = "fused"
    BLOCKWISE = "blockwise"
    DENSE = "dense"


AUTOMATIC = (Backend.FUSED, Backend.BLOCKWISE)
DEFAULT_BLOCK_MEMORY = 256 * 2 ** 20
_ENV_BLOCK_MEMORY = os.environ.get("ASCENDER_BLOCK_MEMORY")
# On CUDA a block's ~1000 small kernels cost launches more than arithmetic (docs/cuda.md: 190k launches,
# 2.7 s per fwd+bwd at N = 4096, B*H = 16 with 256 MiB blocks on an H100): the automatic budget is this
# share of the device's free memory when the block-wise path first runs there (about 20 GiB of an
# idle H100: 3 blocks at that size).
CUDA_FREE_MEMORY_SHARE = 0.25
# Whether CUDA tensors run the block-wise path under torch.compile when neither the call nor
# attention_backend(block_compile=...) says. Prediction, to be measured by the playbook (bench_cuda.py
# prints blockwise and blockwise-compiled, docs/cuda.md): compiled is 2-4x faster per call at a fixed
# shape once compiled (Inductor fuses a block's elementwise ops, which otherwise each read and write
# [B, H, rows, N] tensors), but every new shape compiles for tens of seconds, so eager stays the
# default until a GPU run shows the compiled path faster over a training run's shapes.
CUDA_BLOCKWISE_COMPILED = False


class _State:
    allowed = AUTOMATIC
    block_memory = int(_ENV_BLOCK_MEMORY) if _ENV_BLOCK_MEMORY else None  # None: automatic
    block_rows = None
    block_compile = None  # None: automatic
    cuda_budget = {}  # device index -> bytes, fixed at the first block-wise call there
    cuda_fits = {}  # _cuda_fits' answers
    warned = set()


def _positive(name, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"attention_backend: {name} must be a positive int, got {value!r}")


@contextlib.contextmanager
def attention_backend(backends=AUTOMATIC, *, block_memory: int | None = None, block_rows: int | None = None,
                      block_compile: bool | None = None):
    """Inside the block, ascender_attention uses the first of `backends` (a Backend, its name, or a
    list of them, in order of preference) that runs the call's device and dtype. block_memory
    (bytes) bounds what the block-wise path keeps alive for one block of rows (default: the
    environment variable ASCENDER_BLOCK_MEMORY, else 256 MiB on the CPU and a quarter of the free
    device memory on CUDA); block_rows sets the rows of a block directly; block_compile runs the
    block-wise path under torch.compile (default: CUDA_BLOCKWISE_COMPILED on CUDA, off elsewhere)."""
    allowed = (backends,) if isinstance(backends, (str, Backend)) else tuple(backends)
    allowed = tuple(Backend(b) for b in allowed)
    if not allowed:
        raise ValueError("attention_backend: give at least one backend")
    _positive("block_memory", block_memory)
    _positive("block_rows", block_rows)
    if block_compile is not None and not isinstance(block_compile, bool):
        raise ValueError(f"attention_backend: block_compile must be a bool or None, got {block_compile!r}")
    saved = (_State.allowed, _State.block_memory, _State.block_rows, _State.block_compile)
    _State.allowed = allowed
    _State.block_memory = block_memory or _State.block_memory
    _State.block_rows = block_rows
    _State.block_compile = _State.block_compile if block_compile is None else block_compile
    try:
        yield
    finally:
        _State.allowed, _State.block_memory, _State.block_rows, _State.block_compile = saved


def _cuda_budget(device: torch.device) -> int:
    """CUDA_FREE_MEMORY_SHARE of the device's free memory at the first block-wise call on it (at least
    the CPU's default); under tracing, where the device cannot be asked, that default."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _State.cuda_budget:
        if torch.compiler.is_compiling():
            return DEFAULT_BLOCK_MEMORY
        free, _ = torch.cuda.mem_get_info(index)
        _State.cuda_budget[index] = max(DEFAULT_BLOCK_MEMORY, int(free * CUDA_FREE_MEMORY_SHARE))
    return _State.cuda_budget[index]


def block_size(device: torch.device | None = None) -> dict:
    """The block-wise path's block for tensors on `device`: dict(memory=bytes for one block of rows,
    rows=None or a fixed count, compiled=whether to run it under torch.compile)."""
    cuda = device is not None and device.type == "cuda"
    memory = _State.block_memory or (_cuda_budget(device) if cuda else DEFAULT_BLOCK_MEMORY)
    compiled = _State.block_compile if _State.block_compile is not None else (cuda and CUDA_BLOCKWISE_COMPILED)
    return dict(memory=memory, rows=_State.block_rows, compiled=compiled)


def _transformed(tensors) -> str | None:
    """Forward-mode AD or a torch.func transform on any of the tensors (the fused ops have no jvp,
    vmap or functorch rule; the block-wise path is plain PyTorch ops and has them all)."""
    if torch.compiler.is_compiling():
        return None
    if any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors):
        return "the fused kernels have no torch.func rules (vmap, grad, jvp, jacfwd, ...)"
    # (a tangent exists only inside a dual level: outside one, skip the per-tensor unpacking)
    if getattr(fwAD, "_current_level", 0) >= 0 and any(fwAD.unpack_dual(t).tangent is not None for t in tensors):
        return "the fused kernels have no forward-mode AD rule"
    return None


@torch.compiler.assume_constant_result
def _cuda_fits(*sizes) -> bool:
    """The extension's cuda_fits (csrc/binding/module.cpp) for (device index, dtype name, paper, k_neighbors,
    d, dv, dz, da, backward), asked once per distinct call shape; a constant under torch.compile."""
    if sizes not in _State.cuda_fits:
        _State.cuda_fits[sizes] = _ops._C.cuda_fits(*sizes)
    return _State.cuda_fits[sizes]


def _cuda_too_wide(q: torch.Tensor, call: dict, backward: bool) -> str | None:
    """Why the CUDA kernels cannot take an ascender call (`call`: its named op arguments): rows whose tiles
    outgrow a block's shared memory on q's device (the float64 backward from d = 128, bfloat16 from 256), or
    None. Misshapen tensors pass (the op's own checks name them), and so do symbolic sizes under
    torch.compile (the sizes of a traced call are static where it matters: the feature sizes)."""
    x = [call[n] for n in ("k", "v", "z", "h")]
    if q.dim() != 4 or any(t.dim() != 4 for t in x):
        return None
    d, dv, dz, da = q.shape[3], x[1].shape[3], x[2].shape[3], x[3].shape[3]
    if any(isinstance(s, torch.SymInt) for s in (d, dv, dz, da)):
        return None
    paper = spec.canonical_variant(call["variant"]) == "paper"
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    dtype = str(q.dtype).removeprefix("torch.")
    if _cuda_fits(index, dtype, paper, call["k_neighbors"], d, dv, dz, da, backward):
        return None
    k = f", k_neighbors = {call['k_neighbors']}" if paper else ""
    return (f"the fused CUDA kernels need more shared memory per block than cuda:{index} has for this {dtype} call "
            f"(d = {d}, dv = {dv}, dz = {dz}, da = {da}{k}{', with its backward' if backward else ''})")


def fused_unsupported(q: torch.Tensor, tensors=(), call: dict | None = None) -> str | None:
    """Why the fused kernels cannot run this call (q's device and dtype, forward AD or torch.func
    transforms of `tensors`; with `call`, the named op arguments of an ascender call, whether its rows fit
    the CUDA kernels' shared memory), or None when they can."""
    transformed = _transformed(tensors)
    if transformed:
        return transformed
    if q.device.type == "cpu":  # float16 / bfloat16 on the float32 kernels (fused.attention)
        return None if q.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16) else \
            f"no fused {q.dtype} kernel for cpu tensors"
    if q.device.type == "cuda":
        if not _ops.CUDA_BUILT:
            return "no fused kernel for cuda tensors (the extension was built without ASCENDER_CUDA=1)"
        if call is None or q.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            return None
        return _cuda_too_wide(q, call, fused.differentiated(tensors))
    return f"no fused kernel for {q.device.type} tensors"


def choose(q: torch.Tensor, tensors=(), call: dict | None = None) -> Backend:
    """The first allowed backend that runs the call (q's device and dtype; `tensors`, every tensor
    argument, for forward AD and torch.func transforms; `call`, an ascender call's named op arguments,
    for the CUDA kernels' shared memory), with one warning per reason when the automatic choice passes
    over the fused kernels."""
    why = fused_unsupported(q, tensors, call)
    for backend in _State.allowed:
        if backend is Backend.FUSED and why is not None:
            continue
        if why is not None and _State.allowed == AUTOMATIC and q.is_floating_point() and why not in _State.warned:
            _State.warned.add(why)
            warnings.warn(f"ascender_torch: {why}; using the {backend.value} backend "
                          f"(O(block x N) memory, ascender_torch.backends)", RuntimeWarning, stacklevel=3)
        return backend
    raise RuntimeError(f"ascender: none of the allowed backends ({', '.join(b.value for b in _State.allowed)}) "
                       f"runs this call: {why}")
