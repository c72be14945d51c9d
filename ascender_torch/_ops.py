"""The registered ops `torch.ops.ascender.*`: their schemas (from `_spec`), the C++ kernels (loading
`_C` runs its TORCH_LIBRARY_IMPL registrations), fake kernels for torch.compile and the autograd
rules of the two forwards (each backward is itself a registered op; differentiating it again
raises). Everything here names arguments through the spec, never by position."""

from __future__ import annotations

import torch

from . import _C
from . import _spec as spec

CUDA_BUILT = bool(getattr(_C, "CUDA_BUILT", 0))  # the ops have CUDA kernels (setup.py, ASCENDER_CUDA=1)


def _check_build_matches_spec() -> None:
    """The compiled library's constants (csrc/ascender.h) must be the spec's."""
    built = dict(EPS_TAU=_C.EPS_TAU, EPS_STD=_C.EPS_STD, EPS_NORM=_C.EPS_NORM, EPS_HEADING=_C.EPS_HEADING,
                 SCALAR_NAMES=_C.SCALAR_NAMES, STAT_NAMES=_C.STAT_NAMES)
    want = dict(EPS_TAU=spec.EPS_TAU, EPS_STD=spec.EPS_STD, EPS_NORM=spec.EPS_NORM, EPS_HEADING=spec.EPS_HEADING,
                SCALAR_NAMES=spec.SCALAR_NAMES, STAT_NAMES=tuple(s.name for s in spec.Stat))
    wrong = [name for name in want if built[name] != want[name]]
    if wrong:
        raise ImportError(f"ascender_torch: the compiled extension disagrees with ascender_torch/_spec.py on "
                          f"{', '.join(wrong)} (csrc/ascender.h vs _spec.py); rebuild it or fix the one that is wrong")


_check_build_matches_spec()

_LIBRARY = torch.library.Library("ascender", "DEF")  # kept alive: it owns the op definitions
for _op in spec.OPS:
    _LIBRARY.define(_op.schema())


def _validate(check: spec.OpSpec, a: dict) -> None:
    """The device-independent checks of a call (ascender_check / magnitude_check, the kernels' own
    checks without reading data) on the fake or meta tensors of a fake kernel, so that
    torch.compile and the meta device refuse what the kernels refuse, and mixed devices are an
    error. Skipped under symbolic sizes: a dynamic-shape trace follows a static one that ran them."""
    args = check.ordered(a)
    if any(isinstance(s, torch.SymInt) for t in args if isinstance(t, torch.Tensor) for s in t.shape):
        return
    getattr(torch.ops.ascender, check.name)(*args)


def _check_one_slice(check_op):
    """The vmap rule of a check op: the checks of one batch element (every element has its shape)."""
    def rule(info, in_dims, *args):
        def element(x, dim):
            if dim is None:
                return x
            x = x.movedim(dim, 0)
            return x[0] if x.shape[0] > 0 else x.new_empty(x.shape[1:])
        check_op(*(element(x, d) for x, d in zip(args, in_dims)))
        return None, None
    return rule


for _check in (spec.ASCENDER_CHECK, spec.MAGNITUDE_CHECK):
    torch.library.register_vmap(f"ascender::{_check.name}", _check_one_slice(getattr(torch.ops.ascender, _check.name)))


def _n_nbr(variant: str, k_neighbors: int, N) -> int:
    return min(k_neighbors, max(N - 1, 0)) if spec.canonical_variant(variant) == "paper" else 0


def _forward_fake(args, kwargs, backward: bool):
    a = spec.ASCENDER_FWD.bind(args, kwargs)
    _validate(spec.ASCENDER_CHECK, a)
    q, k = a["q"], a["k"]
    B, H, Nq, d = q.shape  # one output row per query; the keys have N = k.shape[2] rows
    dz, dv = a["z"].shape[-1], a["v"].shape[-1]
    half = q.dtype in (torch.float16, torch.bfloat16)
    return (
        q.new_empty(B, H, Nq, dv),
        q.new_empty(B, H, Nq, len(spec.Stat)),
        q.new_empty(B, H, Nq, d),
        q.new_empty(B, H, Nq, dz),
        q.new_empty(B, H, Nq, _n_nbr(a["variant"], a["k_neighbors"], k.shape[2]), dtype=torch.long),
        q.new_empty(B, H, Nq, 2),
        q.new_empty(B, H, Nq, len(spec.Stat) + dz + d + dv + 2 if backward and half else 0, dtype=torch.float32),
    )


@torch.library.register_fake("ascender::ascender_fwd")
def _ascender_fwd_fake(*args, **kwargs):
    return _forward_fake(args, kwargs, backward=True)


@torch.library.register_fake("ascender::ascender_infer")
def _ascender_infer_fake(*args, **kwargs):
    return _forward_fake(args, kwargs, backward=False)


@torch.library.register_fake("ascender::ascender_maps")
def _ascender_maps_fake(*args, **kwargs):
    a = spec.ASCENDER_MAPS.bind(args, kwargs)
    _validate(spec.ASCENDER_CHECK, a)
    B, H, Nq, _ = a["q"].shape
    return tuple(a["q"].new_empty(B, H, Nq, a["k"].shape[2]) for _ in spec.ASCENDER_MAPS.returns)


@torch.library.register_fake("ascender::ascender_bwd")
def _ascender_bwd_fake(*args, **kwargs):
    a = spec.ASCENDER_BWD.bind(args, kwargs)
    _validate(spec.ASCENDER_CHECK, a)
    q = a["q"]
    B, H, Nq, _ = q.shape
    want = a["attn_bias"] is not None and a["attn_bias_grad"]
    dbias = q.new_empty(B, H, Nq, a["k"].shape[2]) if want else q.new_empty(0)
    sinks = a["sinks"]
    dsinks = q.new_empty(0) if sinks is None else q.new_empty(sinks.shape if sinks.dim() == 3 else (H,))
    # the kernel returns contiguous gradients whatever the inputs' strides
    inputs = (a[t.name].new_empty(a[t.name].shape) for t in spec.INPUTS)
    return (*inputs, q.new_empty(len(spec.SCALARS), H), dbias, dsinks)


_SAVED_TENSORS = tuple(a.name for a in spec.ASCENDER_FWD.args if a.type.startswith("Tensor"))
_OPTIONS = tuple(a.name for a in spec.ASCENDER_FWD.args if not a.type.startswith("Tensor"))


def _setup_context(ctx, inputs, output):
    out = dict(zip(spec.ASCENDER_FWD.returns, output))
    ctx.mark_non_differentiable(*(out[n] for n in spec.ASCENDER_FWD.returns
                                  if n not in spec.ASCENDER_DIFFERENTIABLE_OUTPUTS))
    # an output the loss does not use has no gradient (None), not a tensor of zeros: the kernels skip the
    # aux and u paths of the backward when grad_aux / grad_u are None, and ran them on zeros before
    ctx.set_materialize_grads(False)
    a = spec.ASCENDER_FWD.named(inputs)
    ctx.save_for_backward(*(a[n] for n in _SAVED_TENSORS), *output)  # the backward reads the outputs
    ctx.options = {n: a[n] for n in _OPTIONS}


def _backward(ctx, *grads):
    incoming = dict(zip(spec.ASCENDER_FWD.returns, grads))
    a = dict(zip(_SAVED_TENSORS + spec.ASCENDER_FWD.returns, ctx.saved_tensors), **ctx.options)
    bias_grad = a["attn_bias"] is not None and ctx.needs_input_grad[spec.ASCENDER_FWD.index("attn_bias")]
    grad_out = incoming["out"] if incoming["out"] is not None else torch.zeros_like(a["out"])  # (only aux or u used)
    outputs = torch.ops.ascender.ascender_bwd(grad_out, **a, attn_bias_grad=bias_grad,
                                              grad_aux=incoming["aux"], grad_u=incoming["u"])
    d = dict(zip(spec.ASCENDER_BWD.returns, outputs))
    grads = {t.name: d[f"d{t.name}"] for t in spec.INPUTS}
    # likewise a broadcast attn_bias gets dS summed over its broadcast dimensions
    grads.update(_scalar_grads(ctx, spec.ASCENDER_FWD, spec.SCALAR_NAMES, d["dscalars"], a))
    if bias_grad:
        grads["attn_bias"] = d["dattn_bias"].sum_to_size(a["attn_bias"].shape)
    if a["sinks"] is not None:
        grads["sinks"] = d["dsinks"] if a["sinks"].dim() in (1, 3) else d["dsinks"].sum()  # (3-D: per row, its shape)
    return spec.ASCENDER_FWD.ordered(grads)


def _scalar_grads(ctx, op: spec.OpSpec, names, per_head: torch.Tensor, a: dict) -> dict:
    """The learnable scalars' gradients from the backward's [len(names), H] per-head rows: an [H] scalar takes
    its row, a 0-dim one acts on every head and takes the row's sum (one reduction for all of them), one that
    needs no gradient None."""
    out, sums = {}, None
    for i, name in enumerate(names):
        if not ctx.needs_input_grad[op.index(name)]:
            out[name] = None
        elif a[name].dim() == 1:
            out[name] = per_head[i]
        else:
            sums = per_head.sum(-1) if sums is None else sums
            out[name] = sums[i]
    return out


def _no_double_backward(ctx, *grads):
    raise NotImplementedError(
        "ascender: double backward (gradients of gradients) is not supported by the fused op; "
        "use ascender_torch.reference.ascender_attention_reference for higher-order derivatives."
    )


def _setup_nothing(ctx, inputs, output):
    pass


def _register_autograd(name: str, backward, setup_context) -> None:
    """torch.library.register_autograd's rule for op `name`, without its per-call cost: the dispatcher hands a Python
    kernel the arguments up to the last one that differs from its default, and torch's rule fills in the rest by
    walking the schema's argument list, which pybind rebuilds at every access (quadratic: 0.31 ms a call for
    ascender_fwd's 38 arguments, torch 2.13, about an eighth of a small training step). Here the defaults are
    read once. The rule is torch's otherwise: an autograd.Function that redispatches below autograd, its ctx set up
    by `setup_context` and its gradients from `backward` (its needs_input_grad without the key set's entry)."""
    op = getattr(torch.ops.ascender, name).default
    defaults = tuple(a.default_value for a in op._schema.arguments)
    below = torch._C._after_autograd_keyset

    def run(keyset, args):
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & below, *args)

    def forward(ctx, *args):
        keyset, args = args[-1], args[:-1]
        output = run(keyset, args)
        setup_context(ctx, args + defaults[len(args):], output)
        return output

    def backward_rule(ctx, *grads):
        needs = ctx.needs_input_grad
        ctx.needs_input_grad = needs[:-1]
        try:
            return (*backward(ctx, *grads), None)
        finally:
            ctx.needs_input_grad = needs

    rule = type(f"ascender_{name}_autograd", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward_rule)})

    def kernel(keyset, *args):
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return rule.apply(*args, keyset)
        return run(keyset, args)

    _LIBRARY.impl(name, kernel, "Autograd", with_keyset=True)


_register_autograd("ascender_fwd", _backward, _setup_context)
_register_autograd("ascender_bwd", _no_double_backward, _setup_nothing)


# ---------------------------------------------------------------- Magnitude Attention

@torch.library.register_fake("ascender::magnitude_fwd")
def _magnitude_fwd_fake(*args, **kwargs):
    a = spec.MAGNITUDE_FWD.bind(args, kwargs)
    _validate(spec.MAGNITUDE_CHECK, a)
    B, H, N, _ = a["q"].shape
    return a["q"].new_empty(B, H, N, a["v"].shape[-1]), a["q"].new_empty(B, H, N)


@torch.library.register_fake("ascender::magnitude_bwd")
def _magnitude_bwd_fake(*args, **kwargs):
    a = spec.MAGNITUDE_BWD.bind(args, kwargs)
    _validate(spec.MAGNITUDE_CHECK, a)
    inputs = (a[t.name].new_empty(a[t.name].shape) for t in spec.MAGNITUDE_INPUTS)
    return (*inputs, a["q"].new_empty(len(spec.MAGNITUDE_SCALARS), a["q"].shape[1]))


_MAG_SAVED = tuple(a.name for a in spec.MAGNITUDE_FWD.args if a.type.startswith("Tensor"))
_MAG_OPTIONS = tuple(a.name for a in spec.MAGNITUDE_FWD.args if not a.type.startswith("Tensor"))


def _magnitude_setup_context(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # an unused mu has no gradient: the kernel skips its path (as _setup_context)
    a = spec.MAGNITUDE_FWD.named(inputs)
    ctx.save_for_backward(*(a[n] for n in _MAG_SAVED))
    ctx.options = {n: a[n] for n in _MAG_OPTIONS}


def _magnitude_backward(ctx, grad_out, grad_mu):
    a = dict(zip(_MAG_SAVED, ctx.saved_tensors), **ctx.options)
    if grad_out is None:  # only mu is used
        grad_out = a["q"].new_zeros(*a["q"].shape[:3], a["v"].shape[-1])
    outputs = torch.ops.ascender.magnitude_bwd(grad_out, **a, grad_mu=grad_mu)
    d = dict(zip(spec.MAGNITUDE_BWD.returns, outputs))
    grads = {t.name: d[f"d{t.name}"] for t in spec.MAGNITUDE_INPUTS}
    grads.update(_scalar_grads(ctx, spec.MAGNITUDE_FWD, [s.name for s in spec.MAGNITUDE_SCALARS], d["dparams"], a))
    return spec.MAGNITUDE_FWD.ordered(grads)


_register_autograd("magnitude_fwd", _magnitude_backward, _magnitude_setup_context)
_register_autograd("magnitude_bwd", _no_double_backward, _setup_nothing)
