"""The backends of `ascender_attention` and their selection, in the style of
`torch.nn.attention.sdpa_kernel`:

* ``Backend.FUSED``: the fused kernels (C on the CPU: float32, float64, and float16, bfloat16 on
  the float32 kernels; CUDA when built with ASCENDER_CUDA=1: all four). O(N) memory.
* ``Backend.BLOCKWISE``: PyTorch ops on any device and every floating dtype, one block of query
  rows at a time (every pair product a matrix product, recomputed per block in the backward);
  O(block x N) memory, the block sized from a memory budget (``block_memory``).
* ``Backend.DENSE``: the dense twin (`reference.py`), O(N^2 dz) memory: the oracle, for
  inspection and tests.

The automatic choice takes the fused kernels where they are compiled for the device and dtype,
else the block-wise path, and says so once (a RuntimeWarning naming the backend and why).
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


class Backend(str, enum.Enum):
    FUSED = "fused"
    BLOCKWISE = "blockwise"
    DENSE = "dense"


AUTOMATIC = (Backend.FUSED, Backend.BLOCKWISE)
DEFAULT_BLOCK_MEMORY = int(os.environ.get("ASCENDER_BLOCK_MEMORY", 256 * 2 ** 20))


class _State:
    allowed = AUTOMATIC
    block_memory = DEFAULT_BLOCK_MEMORY
    block_rows = None
    warned = set()


def _positive(name, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"attention_backend: {name} must be a positive int, got {value!r}")


@contextlib.contextmanager
def attention_backend(backends=AUTOMATIC, *, block_memory: int | None = None, block_rows: int | None = None):
    """Inside the block, ascender_attention uses the first of `backends` (a Backend, its name, or a
    list of them, in order of preference) that runs the call's device and dtype. block_memory
    (bytes) bounds what the block-wise path keeps alive for one block of rows (default 256 MiB, or
    the environment variable ASCENDER_BLOCK_MEMORY); block_rows sets the rows of a block directly."""
    allowed = (backends,) if isinstance(backends, (str, Backend)) else tuple(backends)
    allowed = tuple(Backend(b) for b in allowed)
    if not allowed:
        raise ValueError("attention_backend: give at least one backend")
    _positive("block_memory", block_memory)
    _positive("block_rows", block_rows)
    saved = (_State.allowed, _State.block_memory, _State.block_rows)
    _State.allowed = allowed
    _State.block_memory = block_memory or _State.block_memory
    _State.block_rows = block_rows
    try:
        yield
    finally:
        _State.allowed, _State.block_memory, _State.block_rows = saved


def block_size() -> dict:
    """The block-wise path's block: dict(memory=bytes for one block of rows, rows=None or a fixed count)."""
    return dict(memory=_State.block_memory, rows=_State.block_rows)


def _transformed(tensors) -> str | None:
    """Forward-mode AD or a torch.func transform on any of the tensors (the fused ops have no jvp,
    vmap or functorch rule; the block-wise path is plain PyTorch ops and has them all)."""
    if torch.compiler.is_compiling():
        return None
    if any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors):
        return "the fused kernels have no torch.func rules (vmap, grad, jvp, jacfwd, ...)"
    if any(fwAD.unpack_dual(t).tangent is not None for t in tensors):
        return "the fused kernels have no forward-mode AD rule"
    return None


def fused_unsupported(q: torch.Tensor, tensors=()) -> str | None:
    """Why the fused kernels cannot run this call (q's device and dtype, forward AD or torch.func
    transforms of `tensors`), or None when they can."""
    transformed = _transformed(tensors)
    if transformed:
        return transformed
    if q.device.type == "cpu":  # float16 / bfloat16 on the float32 kernels (fused.attention)
        return None if q.dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16) else \
            f"no fused {q.dtype} kernel for cpu tensors"
    if q.device.type == "cuda":
        if not _ops.CUDA_BUILT:
            return "no fused kernel for cuda tensors (the extension was built without ASCENDER_CUDA=1)"
        return None
    return f"no fused kernel for {q.device.type} tensors"


def choose(q: torch.Tensor, tensors=()) -> Backend:
    """The first allowed backend that runs the call (q's device and dtype; `tensors`, every tensor
    argument, for forward AD and torch.func transforms), with one warning per reason when the
    automatic choice passes over the fused kernels."""
    why = fused_unsupported(q, tensors)
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
