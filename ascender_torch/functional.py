"""Functional API, `torch.nn.functional` style: `ascender_attention(q, k, v, z, h, ...)`."""

from __future__ import annotations

import functools
import math
import numbers
import warnings

import torch

from . import _ops  # registers torch.ops.ascender
from . import _spec as spec
from . import backends, dropout, reference
from .backends import blockwise, fused

_warned_fallback = set()


def _warn_fallback_once(device: torch.device) -> None:
    """Magnitude Attention has fused kernels for the CPU (and CUDA when built); elsewhere the twin runs."""
    if device.type not in _warned_fallback:
        _warned_fallback.add(device.type)
        warnings.warn(
            f"ascender_torch: no fused magnitude kernel for {device.type} tensors yet; using the pure-PyTorch "
            "reference (O(N^2 * d) memory).",
            RuntimeWarning,
            stacklevel=3,
        )


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels compute inputs of `dtype` in."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _scalar(name: str, value, q: torch.Tensor, stream: int | None) -> torch.Tensor:
    """A learnable scalar (a real number, a 0-dim or [H] real tensor; sinks also 3-D) in q's dtype, keeping autograd.
    A number must be finite in that dtype and, where it divides as value + 1e-6, not make it 0 (a
    tensor's values: _check_learnable_tensors). stream: _constant_stream(q)."""
    kinds = "a 0-dim, an [H] or a 3-D (per row) real tensor" if name == "sinks" else "a 0-dim or an [H] real tensor"
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be a real number, {kinds}, got a {value.dtype} tensor")
        return value.to(dtype=q.dtype)
    if type(value) not in (float, int) and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be a real number, {kinds}, got {type(value).__name__} {value!r}")
    value = float(value)  # (float() would take "1.5" and True)
    if stream is not None:
        return _constant(name, value, q.dtype, q.device, stream)
    _check_number(name, value, q.dtype)
    # a fill on q's device, not torch.tensor(value, device=...): that copies from the host and, on CUDA,
    # synchronizes the stream, twelve times a call (found on the H200, 2026-11-29)
    return torch.full((), value, dtype=q.dtype, device=q.device)


def _check_number(name: str, value: float, dtype: torch.dtype) -> None:
    """_scalar's checks of a number given for learnable scalar `name` in a call of `dtype`."""
    if dtype.is_floating_point and not abs(value) <= torch.finfo(dtype).max:  # (other dtypes: the checks refuse q)
        raise ValueError(f"{name} must be a finite number in the dtype of q ({dtype}), got {value!r}")
    if name in spec.SHIFTED_DENOMINATORS and (value + spec.EPS_TAU == 0.0 or (
            dtype.is_floating_point and _zero_denominator_number(value, dtype))):
        raise ValueError(f"{name} + 1e-6 is a denominator and must not be 0, got {name} = {value!r}")


def _constant_stream(q: torch.Tensor) -> int | None:
    """Where _scalar may hand out a cached constant for a call on q: the stream the call runs on (its handle;
    0 off CUDA) when it runs eagerly on plain tensors, else None: under torch.compile, inside a torch.func
    transform (a fill there is the transform's wrapper even when q comes from outside it, and cached it would
    send every later call to the block-wise path), under a dispatch mode (fake tensors) or CUDA graph capture
    (a constant made there would live in the graph's memory pool). Streams are told apart by their handle:
    a build on CUDA's per-thread default stream (one handle in every thread) is not told apart."""
    if (torch.compiler.is_compiling() or type(q) is not torch.Tensor
            or torch._C._functorch.is_functorch_wrapped_tensor(q)
            or torch._C._functorch.maybe_current_level() is not None  # (inside a transform a fill is a wrapper)
            or torch.utils._python_dispatch._get_current_dispatch_mode() is not None):
        return None
    if not q.is_cuda:
        return 0
    with torch.cuda.device(q.device):  # (capture is asked of the current device's stream)
        return None if torch.cuda.is_current_stream_capturing() else torch.cuda.current_stream().cuda_stream


@functools.lru_cache(maxsize=256)
def _constant(name: str, value: float, dtype: torch.dtype, device: torch.device, stream: int) -> torch.Tensor:
    """Number `value` of learnable scalar `name`, checked (_check_number), as a 0-dim tensor of `dtype` on
    `device`, made once per stream: the defaults come every call, and a fill per scalar was nine kernel
    launches a call on CUDA (a refused number raises again on every call: lru_cache keeps no exception).
    Each stream's constant is filled on that stream, so its readers there come after the fill without the
    host waiting for the device; made outside inference mode (an inference tensor could not be saved for a
    later training call's backward). No caller writes to it."""
    _check_number(name, value, dtype)
    with torch.inference_mode(False), torch.no_grad():
        return torch.full((), value, dtype=dtype, device=device)


@functools.lru_cache(maxsize=16)
def _minus_eps(dtype: torch.dtype) -> float:
    """The one value v with v + 1e-6 == 0 in the compute dtype of `dtype` (the block-wise path's and the CUDA kernels'
    arithmetic): -(1e-6 rounded to it), since a sum of two floats is 0 only where one is the other's negative."""
    return -float(torch.tensor(spec.EPS_TAU, dtype=_compute_dtype(dtype)))


@functools.lru_cache(maxsize=256)
def _zero_denominator_number(value: float, dtype: torch.dtype) -> bool:
    """Whether value + 1e-6 is 0 for a number rounded to `dtype` (the same few defaults come every call)."""
    return float(torch.tensor(value, dtype=dtype)) == _minus_eps(dtype)


def _check_learnable_tensors(given: dict, cast: dict, q: torch.Tensor) -> None:
    """The checks of _scalar's numbers for the learnable scalars given as tensors (`given`, and `cast`
    to q's dtype): a finite value must stay finite in q's dtype, and score_temp + 1e-6,
    kappa + 1e-6 must not be 0. A NaN or Inf in a tensor is data (SPEC section 11: it makes its
    head's rows NaN). Values are read on the CPU in eager mode only: elsewhere reading them would
    synchronize the device every call (and torch.compile and torch.func cannot branch on them).
    Only what can fail is read: a cast to another dtype, and the two denominators (a module's call
    in q's dtype reads those two, as Python lists: a few tensor ops here were a third of a small call)."""
    names = [n for n, t in given.items() if isinstance(t, torch.Tensor) and t.numel()]
    if not names or not reference.eager_cpu(q, *(given[n] for n in names)):
        return
    for name in names:
        t, c = given[name], cast[name]
        shifted = name in spec.SHIFTED_DENOMINATORS and q.dtype.is_floating_point
        if t.dtype == c.dtype and not shifted:
            continue
        t, c = t.detach(), c.detach()
        values = c.reshape(-1).tolist()
        if t.dtype != c.dtype and any(math.isfinite(x) and not math.isfinite(y)
                                      for x, y in zip(t.reshape(-1).tolist(), values)):
            raise ValueError(f"{name} must be finite in the dtype of q ({q.dtype}) where it is finite, got "
                             f"{t.tolist()} ({t.dtype})")
        if shifted and _minus_eps(q.dtype) in values:
            raise ValueError(f"{name} + 1e-6 is a denominator and must not be 0, got {name} = {t.tolist()}")


def _check_tensors(op: str, optional: bool = False, **tensors) -> None:
    """Type-checks the tensor arguments (the binding checks the rest); optional: None is allowed."""
    for name, t in tensors.items():
        if not (isinstance(t, torch.Tensor) or (optional and t is None)):
            raise TypeError(f"{op}: {name} must be a torch.Tensor{' or None' if optional else ''}, "
                            f"got {type(t).__name__}")


def _broadcasts_to(shape, target) -> bool:
    """Whether a tensor of `shape` broadcasts to `target` (at most as many dimensions, each equal or 1)."""
    return len(shape) <= len(target) and all(x == y or x == 1 for x, y in zip(reversed(shape), reversed(target)))


@functools.lru_cache(maxsize=256)
def _constants(names: tuple, values: tuple, dtype: torch.dtype, device: torch.device, stream: int) -> tuple:
    """_constant of each learnable scalar `names` given as a plain number (`values`): one cache lookup a call where
    the call's numbers came before (the defaults come every call)."""
    return tuple(_constant(n, float(v), dtype, device, stream) for n, v in zip(names, values))


_ARGUMENT_PLANS: dict = {}


def _argument_plan(op: spec.OpSpec) -> tuple:
    """(the names of op's learnable scalars, the names of all its arguments in schema order)."""
    plan = _ARGUMENT_PLANS.get(op.name)
    if plan is None:
        learnable = tuple(a.name for a in op.args if a.name in spec.LEARNABLE)
        plan = _ARGUMENT_PLANS[op.name] = (learnable, tuple(a.name for a in op.args))
    return plan


def _op_arguments(op: spec.OpSpec, tensors: dict, o: dict, q: torch.Tensor) -> tuple:
    """The arguments of a registered op in its schema order (the spec's): its input tensors, the
    learnable scalars as tensors of q's dtype and every other argument from the resolved options `o`."""
    learnable, names = _argument_plan(op)
    stream = _constant_stream(q)
    values = tuple(o[n] for n in learnable)
    if stream is not None and all(type(v) is float or type(v) is int for v in values):
        scalars = dict(zip(learnable, _constants(learnable, values, q.dtype, q.device, stream)))
    else:
        scalars = {n: _scalar(n, o[n], q, stream) for n in learnable}
        _check_learnable_tensors({n: o[n] for n in scalars}, scalars, q)
    given = {**o, **scalars, **tensors}
    return tuple(given[n] for n in names)


def _resolve(op: str, keywords: tuple, given: dict, q: torch.Tensor) -> dict:
    """The spec's options of entry point `op` (defaults filled, types checked) with scale resolved."""
    o = spec.options(op, keywords, given)
    o["scale"] = spec.resolved_scale(o["scale"], q)
    return o


def ascender_attention(q, k, v, z, h, *, return_maps=False, return_aux=False, generator=None, **keywords):
    """ASCender attention (shared/SPEC.md section 4) with the fused O(N)-memory kernel.

    Args:
        q: [B, H, Nq, d] queries; k: [B, H, N, d] keys; v: [B, H, N, dv]; z: [B, H, N, dz]
            latent coordinates; h: [B, H, N, da] semantic projections. float32 or float64;
            on CUDA (when built with ASCENDER_CUDA=1) also float16 and bfloat16.
            Nq = N for self-attention; Nq < N means the queries are the last Nq tokens
            (decode: causal alignment at the bottom right, every statistic of query i is
            that of token N - Nq + i).
        keyword arguments (ascender_torch/_spec.py; defaults shown):
{keywords}
            The learnable scalars (lambda_* .. kappa) are each a number, a 0-dim tensor or a
            per-head [H] tensor (cast to q's dtype). A -inf entry of attn_bias blocks that key
            exactly like attn_mask=False (so with mask_stats it is also hidden from the
            statistics). alibi_slopes (a number, 0-dim, [H] or [B, H]; see alibi_slopes()) is
            not differentiable. sinks (a number, 0-dim, [H] or 3-D, cast to q's dtype, differentiable):
            a logit per head that joins the softmax's denominator only (GPT-OSS), so a row's
            weights sum to less than 1; the statistics never see it. A 3-D sinks tensor,
            broadcastable to [B, H, Nq], gives each query row its own logit (Inkling 2), its
            gradient summed over the dimensions it broadcasts. mask_stats=False lets the
            statistics see all N tokens (the seed's behaviour). softcap_bias="outside" caps the
            score without attn_bias and ALiBi and adds them after the cap (FlashAttention's
            order). dropout_p > 0 drops each weight A_ij of the output with probability p (a
            training-mode option: pass 0 in eval); the mask is a Philox stream keyed by
            dropout_seed, drawn from `generator` (or torch's default generator of q's device)
            when not given, the same on every backend.
        return_maps: also return the inspection maps (O(N^2) memory, detached, no gradient;
            A without the dropout mask).
        return_aux: also return the per-row terms of the auxiliary losses of paper section 8
            (SPEC section 5), from the same pass and differentiable: a dict of [B, H, N] tensors
            coh (sum_j A_ij ||z_j - c_i||^2), sep (sum_j A_ij phi_ij) and, for the paper
            variant, align (1 - u_i . mean_{{l in N(i)}} u_l; 1 when N(i) is empty). The losses
            are their means over the rows you train on, e.g. aux["coh"].mean(). Self-attention
            only (Nq = N). The seed variant has no "align": the seed module's headings are the
            tokens' own keys, so its L_align would be identically 0.
        generator: the torch.Generator that draws dropout_seed (None: torch's default one of q's
            device).

    Returns:
        y [B, H, Nq, dv]; with return_maps and/or return_aux, the tuple (y, maps, aux) without
        the ones not asked for; maps = dict(S_base, b_align, b_sep, b_coh, A), each [B, H, Nq, N].

    Rows whose visible set is empty return 0. The op is differentiable (exact gradients for
    q, k, v, z, h and every learnable scalar, from the fused C backward with O(N) memory per
    thread; docs/backward.md); double backward is not supported and raises.
    """
    _check_tensors("ascender_attention", q=q, k=k, v=v, z=z, h=h)
    o = _resolve("ascender_attention", spec.ASCENDER_KEYWORDS, keywords, q)
    _check_tensors("ascender_attention", optional=True,
                   **{a.name: o[a.name] for a in spec.EXTRAS if a.name not in ("alibi_slopes", "sinks")})  # (or numbers)
    attn_bias, attn_mask = o["attn_bias"], o["attn_mask"]
    if attn_bias is not None:
        if attn_bias.dtype == torch.bool or attn_bias.is_complex():
            raise TypeError(f"ascender_attention: attn_bias must be a real tensor, added to the scores, got a "
                            f"{attn_bias.dtype} tensor (a boolean mask goes in attn_mask, True = may attend)")
        # a -inf entry (an sdpa-style additive mask) blocks the key: fold it into attn_mask so
        # that no -inf reaches the arithmetic (it would give NaN rows and NaN gradients)
        attn_bias = attn_bias.to(dtype=q.dtype)
        # (only where the bias and the mask are each valid, so that the checks refuse a bad one by its own
        # name and shape: a non-bool mask, one that does not broadcast to [B, H, Nq, N], another device)
        target = (*q.shape[:3], k.shape[2]) if q.dim() == 4 and k.dim() == 4 else ()
        foldable = attn_bias.device == q.device and _broadcasts_to(attn_bias.shape, target) and (
            attn_mask is None or (attn_mask.dtype == torch.bool and attn_mask.device == q.device and
                                  _broadcasts_to(attn_mask.shape, target)))
        if foldable:
            open_keys = attn_bias != float("-inf")
            attn_mask = open_keys if attn_mask is None else attn_mask & open_keys
            attn_bias = attn_bias.masked_fill(~open_keys, 0.0)
        o.update(attn_bias=attn_bias, attn_mask=attn_mask)
    if o["alibi_slopes"] is not None:
        given = o["alibi_slopes"]
        if isinstance(given, torch.Tensor):
            o["alibi_slopes"] = given.to(dtype=q.dtype, device=q.device).detach()
        else:  # numbers: checked on the host, then one copy that does not wait for the device
            slopes = torch.as_tensor(given, dtype=q.dtype)
            if not bool(torch.isfinite(slopes).all()):
                raise ValueError(f"alibi_slopes must be finite in the dtype of q ({q.dtype}), got {given!r}")
            o["alibi_slopes"] = slopes.to(q.device, non_blocking=True)
    if o["sinks"] is not None:  # a number, 0-dim, [H] or 3-D per-row tensor, differentiable (SPEC section 12)
        o["sinks"] = _scalar("sinks", o["sinks"], q, _constant_stream(q))
    dropout.resolve_seed(o, q.device, generator)
    if return_aux and q.dim() == 4 and k.dim() == 4 and q.shape[2] != k.shape[2]:
        raise ValueError(f"ascender_attention: return_aux needs self-attention (Nq = N): L_align uses the headings "
                         f"of every token, got Nq = {q.shape[2]} queries for N = {k.shape[2]} keys")

    args = _op_arguments(spec.ASCENDER_FWD, dict(q=q, k=k, v=v, z=z, h=h), o, q)
    backend = backends.choose(q, [t for t in args if isinstance(t, torch.Tensor)], spec.ASCENDER_FWD.named(args))
    if backend is backends.Backend.FUSED:
        outputs = fused.attention(args, o["variant"], return_maps, return_aux)
    else:
        torch.ops.ascender.ascender_check(*args)  # the fused op's checks and messages, on any device
        if backend is backends.Backend.BLOCKWISE:
            outputs = blockwise.attention(spec.ASCENDER_FWD.named(args), return_maps, return_aux,
                                          **backends.block_size(q.device))
        else:
            outputs = _dense(spec.ASCENDER_FWD.named(args), return_maps, return_aux)
    return outputs if len(outputs) > 1 else outputs[0]


def _dense(a: dict, return_maps: bool, return_aux: bool) -> tuple:
    """The dense twin on the op's (checked) arguments, float16 / bfloat16 computed in float32."""
    q = a["q"]
    compute = _compute_dtype(q.dtype)
    named = {n: t.to(compute) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for n, t in a.items()}
    tensors = [named.pop(n) for n in ("q", "k", "v", "z", "h")]
    out = reference.ascender_attention_reference(*tensors, **named, return_maps=return_maps, return_aux=return_aux)
    out = out if isinstance(out, tuple) else (out,)
    cast = lambda t: {n: x.to(q.dtype) for n, x in t.items()} if isinstance(t, dict) else t.to(q.dtype)  # noqa: E731
    return tuple(cast(t) for t in out)


ascender_attention.__signature__ = spec.signature(spec.INPUTS, spec.ASCENDER_KEYWORDS,
                                                  dict(return_maps=False, return_aux=False, generator=None))
ascender_attention.__doc__ = ascender_attention.__doc__.format(keywords=spec.keyword_doc(spec.ASCENDER_KEYWORDS))


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The ALiBi slopes of Press et al. for n_heads heads: the geometric sequence
    2^(-8/n), 2^(-16/n), ... for a power of two n, interleaved with the next power's odd terms
    otherwise. Pass them as ``ascender_attention(..., alibi_slopes=...)``."""

    if n_heads < 1:
        raise ValueError(f"alibi_slopes: n_heads must be >= 1, got {n_heads}")

    def powers_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    p = 1 << (n_heads.bit_length() - 1)  # largest power of two <= n_heads
    slopes = powers_of_two(p)
    if p < n_heads:
        slopes += powers_of_two(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes)


def magnitude_attention(q, k, v, *, is_causal=False, return_mu=False, **keywords):
    """Magnitude Attention (shared/SPEC.md section 7, seed 004) with the fused O(N)-memory kernel.

    Per batch and head, over the keys not marked in key_padding_mask ([B, N] bool, True =
    padding): Zm_jl = exp(-t ||k_j - k_l||^2 / d) with t = softplus(t_raw); (Zm + eps I) mu = 1 is
    solved by n_iter unrolled conjugate-gradient steps from mu = 0 (never materializing Zm);
    gate_j = sigmoid(beta mu_j + gamma); y = softmax(scale q k^T) (gate * v).

    q, k: [B, H, N, d]; v: [B, H, N, dv]. Keyword arguments (ascender_torch/_spec.py; defaults shown):
{keywords}
    t_raw, beta, gamma: numbers, 0-dim or [H] tensors (learnable; cast to q's dtype). Gradients
    are exact for the truncated solve as computed (the unrolled iterations), w.r.t. q, k, v, t_raw,
    beta, gamma. is_causal is not supported: mu depends on every key. Returns y [B, H, N, dv], or
    (y, mu) with mu [B, H, N] (0 at padding) when return_mu.
    """
    if is_causal:
        raise ValueError("magnitude_attention: is_causal is not supported: the magnitude weights mu solve a "
                         "system over every key, so a query would see the future through them")
    _check_tensors("magnitude_attention", q=q, k=k, v=v)
    o = _resolve("magnitude_attention", spec.MAGNITUDE_KEYWORDS, keywords, q)
    fused = q.device.type == "cpu" or (q.device.type == "cuda" and _ops.CUDA_BUILT)
    if not fused:
        _warn_fallback_once(q.device)
        named = {a.name: o[a.name] for a in spec.MAGNITUDE_KEYWORDS}
        return reference.magnitude_attention_reference(q, k, v, **named, return_mu=return_mu)
    args = _op_arguments(spec.MAGNITUDE_FWD, dict(q=q, k=k, v=v), o, q)
    y, mu = torch.ops.ascender.magnitude_fwd(*args)
    return (y, mu) if return_mu else y


magnitude_attention.__signature__ = spec.signature(spec.MAGNITUDE_INPUTS, spec.MAGNITUDE_KEYWORDS,
                                                   dict(is_causal=False, return_mu=False))
magnitude_attention.__doc__ = magnitude_attention.__doc__.format(keywords=spec.keyword_doc(spec.MAGNITUDE_KEYWORDS))
