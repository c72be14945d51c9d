"""The fused backend: the registered ops (C kernels on the CPU, CUDA kernels when built). The C
kernels compute in float32 and float64: float16 and bfloat16 CPU calls run the float32 kernels on
float32 copies of the floating inputs (O(N d) memory) and return results in the input dtype, as the
CUDA kernels and the block-wise path compute half types in float32."""

from __future__ import annotations

import torch

from .. import _spec as spec
from ..reference import alignment_rows


HALF_TYPES = (torch.float16, torch.bfloat16)


def attention(args: tuple, variant: str, return_maps: bool, return_aux: bool) -> tuple:
    """ascender_fwd on the op's arguments `args` (schema order): (y, [maps], [aux])."""
    q = args[0]
    if q.device.type == "cpu" and q.dtype in HALF_TYPES:
        torch.ops.ascender.ascender_check(*args)  # every check and message on the caller's dtypes first
        wide = tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        return tuple(_cast(out, q.dtype) for out in attention(wide, variant, return_maps, return_aux))
    op = torch.ops.ascender.ascender_fwd if differentiated(args) else torch.ops.ascender.ascender_infer
    fwd = dict(zip(spec.ASCENDER_FWD.returns, op(*args)))
    outputs = (fwd["out"],)
    if return_maps:
        with torch.no_grad():
            detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            outputs += (dict(zip(spec.ASCENDER_MAPS.returns, torch.ops.ascender.ascender_maps(*detached))),)
    if return_aux:
        aux = dict(coh=fwd["aux"][..., 0], sep=fwd["aux"][..., 1])
        if variant == "paper":
            aux["align"] = alignment_rows(fwd["u"], fwd["nbr"])
        outputs += (aux,)
    return outputs


def differentiated(args) -> bool:
    """Whether autograd will want the backward of a call on `args` (ascender_fwd, else ascender_infer)."""
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _cast(out, dtype):
    return {n: t.to(dtype) for n, t in out.items()} if isinstance(out, dict) else out.to(dtype)
