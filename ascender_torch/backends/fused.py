"""The fused backend: the registered ops (C kernels on the CPU, CUDA kernels when built)."""

from __future__ import annotations

import torch

from .. import _spec as spec
from ..reference import alignment_rows


def attention(args: tuple, variant: str, return_maps: bool, return_aux: bool) -> tuple:
    """ascender_fwd on the op's arguments `args` (schema order): (y, [maps], [aux])."""
    fwd = dict(zip(spec.ASCENDER_FWD.returns, torch.ops.ascender.ascender_fwd(*args)))
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
