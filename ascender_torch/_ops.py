"""The registered ops `torch.ops.ascender.*`: loads the C++ library, adds fake (meta)
kernels for torch.compile and the autograd rule of the fused forward (its backward is the
`ascender_bwd` op; differentiating that again raises)."""

from __future__ import annotations

import torch

from . import _C  # noqa: F401  (registers the ascender ops)

CUDA_BUILT = bool(getattr(_C, "CUDA_BUILT", 0))  # the ops have CUDA kernels (setup.py, ASCENDER_CUDA=1)

NSTAT = 14  # columns of the saved per-row statistics, enum asc_stat in csrc/ascender.h


def _n_nbr(variant: str, k_neighbors: int, N) -> int:
    return min(k_neighbors, max(N - 1, 0)) if variant == "paper" else 0


@torch.library.register_fake("ascender::ascender_fwd")
def _ascender_fwd_fake(
    q, k, v, z, h,
    lambda_align, lambda_sep, lambda_coh, omega_align, omega_sep, omega_coh, score_temp, delta, kappa,
    key_padding_mask, attn_mask, variant, k_neighbors, tau_sep, tau_coh, alpha_align, alpha_coh, scale,
    is_causal, mask_stats, attn_bias=None, alibi_slopes=None,
):
    B, H, Nq, d = q.shape  # one output row per query; the keys have N = k.shape[2] rows
    N = k.shape[2]
    return (
        q.new_empty(B, H, Nq, v.shape[-1]),
        q.new_empty(B, H, Nq, NSTAT),
        q.new_empty(B, H, Nq, d),
        q.new_empty(B, H, Nq, z.shape[-1]),
        q.new_empty(B, H, Nq, _n_nbr(variant, k_neighbors, N), dtype=torch.long),
        q.new_empty(B, H, Nq, 2),
    )


@torch.library.register_fake("ascender::ascender_maps")
def _ascender_maps_fake(q, k, *_same_arguments_as_ascender_fwd):
    B, H, Nq, _ = q.shape
    return tuple(q.new_empty(B, H, Nq, k.shape[2]) for _ in range(5))


@torch.library.register_fake("ascender::ascender_bwd")
def _ascender_bwd_fake(grad_out, q, k, v, z, h, *same_arguments_as_ascender_fwd, attn_bias_grad=False,
                       grad_aux=None, grad_u=None, out=None, stats=None, u=None, c=None, nbr=None, aux=None):
    # the kernel returns contiguous gradients whatever the inputs' strides
    rest = same_arguments_as_ascender_fwd
    attn_bias = rest[20] if len(rest) > 20 else None
    B, H, Nq, _ = q.shape
    want = attn_bias is not None and attn_bias_grad
    dbias = q.new_empty(B, H, Nq, k.shape[2]) if want else q.new_empty(0)
    return (*(t.new_empty(t.shape) for t in (q, k, v, z, h)), q.new_empty(9, H), dbias)


N_TENSORS = 16  # q, k, v, z, h, nine scalars, key_padding_mask, attn_mask
N_OPTIONS = 9  # variant .. mask_stats; then attn_bias, alibi_slopes


SAVED_OUTPUTS = ("out", "stats", "u", "c", "nbr", "aux")  # what the backward reads (docs/tiling.md)


def _setup_context(ctx, inputs, output):
    _out, stats, _u, c, nbr, _aux = output
    ctx.mark_non_differentiable(stats, c, nbr)  # out, u and aux carry gradients
    attn_bias, alibi = (tuple(inputs[N_TENSORS + N_OPTIONS:]) + (None, None))[:2]
    ctx.save_for_backward(*inputs[:N_TENSORS], attn_bias, alibi, *output)
    ctx.options = inputs[N_TENSORS:N_TENSORS + N_OPTIONS]


def _backward(ctx, grad_out, _grad_stats, grad_u, _grad_c, _grad_nbr, grad_aux):
    *tensors, attn_bias, alibi = ctx.saved_tensors[:N_TENSORS + 2]
    saved = dict(zip(SAVED_OUTPUTS, ctx.saved_tensors[N_TENSORS + 2:]))
    bias_grad = attn_bias is not None and ctx.needs_input_grad[N_TENSORS + N_OPTIONS]
    dq, dk, dv, dz, dh, dscalars, dbias = torch.ops.ascender.ascender_bwd(
        grad_out, *tensors, *ctx.options, attn_bias, alibi, attn_bias_grad=bias_grad,
        grad_aux=grad_aux, grad_u=grad_u, **saved)
    scalars = tensors[5:14]
    # a 0-dim scalar acts on every head: its gradient is the sum over heads; likewise a
    # broadcast attn_bias gets dS summed over its broadcast dimensions
    d_scalars = tuple(g if s.dim() == 1 else g.sum() for g, s in zip(dscalars, scalars))
    d_bias = dbias.sum_to_size(attn_bias.shape) if bias_grad else None
    return (dq, dk, dv, dz, dh, *d_scalars, None, None) + (None,) * N_OPTIONS + (d_bias, None)


def _no_double_backward(ctx, *grads):
    raise NotImplementedError(
        "ascender: double backward (gradients of gradients) is not supported by the fused op; "
        "use ascender_torch.reference.ascender_attention_reference for higher-order derivatives."
    )


def _setup_nothing(ctx, inputs, output):
    pass


torch.library.register_autograd("ascender::ascender_fwd", _backward, setup_context=_setup_context)
torch.library.register_autograd("ascender::ascender_bwd", _no_double_backward, setup_context=_setup_nothing)


# ---------------------------------------------------------------- Magnitude Attention

@torch.library.register_fake("ascender::magnitude_fwd")
def _magnitude_fwd_fake(q, k, v, t_raw, beta, gamma, key_padding_mask, n_iter, eps, scale):
    B, H, N, _ = q.shape
    return q.new_empty(B, H, N, v.shape[-1]), q.new_empty(B, H, N)


@torch.library.register_fake("ascender::magnitude_bwd")
def _magnitude_bwd_fake(grad_out, q, k, v, *_same_arguments_as_magnitude_fwd, grad_mu=None):
    return (*(t.new_empty(t.shape) for t in (q, k, v)), q.new_empty(3, q.shape[1]))


def _magnitude_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:7])  # q, k, v, t_raw, beta, gamma, key_padding_mask
    ctx.options = inputs[7:]  # n_iter, eps, scale


def _magnitude_backward(ctx, grad_out, grad_mu):
    q, k, v, t_raw, beta, gamma, kpm = ctx.saved_tensors
    dq, dk, dv, dparams = torch.ops.ascender.magnitude_bwd(grad_out, q, k, v, t_raw, beta, gamma, kpm, *ctx.options,
                                                           grad_mu=grad_mu)
    # a 0-dim parameter acts on every head: its gradient is the sum over heads
    d_params = tuple(g if p.dim() == 1 else g.sum() for g, p in zip(dparams, (t_raw, beta, gamma)))
    return (dq, dk, dv, *d_params, None) + (None,) * len(ctx.options)


torch.library.register_autograd("ascender::magnitude_fwd", _magnitude_backward,
                                setup_context=_magnitude_setup_context)
torch.library.register_autograd("ascender::magnitude_bwd", _no_double_backward, setup_context=_setup_nothing)
