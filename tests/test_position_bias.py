"""beta^(other) (paper sections 1, 11): ALiBi inside the kernel, a dense additive bias with its
gradient, and RoPE applied to q and k before the op."""

from __future__ import annotations

import pytest
import torch

from ascender_torch import ASCenderAttention, alibi_slopes, ascender_attention
from ascender_torch import _spec
from ascender_torch._spec import SCALAR_NAMES
from ascender_torch.reference import ascender_attention_reference

from cases import VARIANTS, make_problem, on, op_arguments


def _distance(Nq, N):
    t = torch.arange(N - Nq, N).unsqueeze(1)
    return (t - torch.arange(N).unsqueeze(0)).abs().double()


def test_alibi_slopes_are_the_standard_ones():
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]))
    assert len(alibi_slopes(12)) == 12 and (alibi_slopes(12) > 0).all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq", [10, 3])
def test_alibi_matches_reference_and_the_dense_bias(target, variant, causal, Nq):
    (q, k, v, z, h), scalars, opts = on(target.device, make_problem(N=10, seed=11))
    q = q[:, :, -Nq:]
    m = torch.tensor([0.5, 0.125], dtype=torch.float64, device=target.device)
    kw = dict(**scalars, **opts, variant=variant, is_causal=causal)
    y = ascender_attention(q, k, v, z, h, **kw, alibi_slopes=m)
    torch.testing.assert_close(y, ascender_attention_reference(q, k, v, z, h, **kw, alibi_slopes=m),
                               rtol=1e-10, atol=1e-12)
    dense = -m.reshape(1, 2, 1, 1) * _distance(Nq, 10).to(target.device)
    torch.testing.assert_close(y, ascender_attention(q, k, v, z, h, **kw, attn_bias=dense), rtol=1e-12, atol=1e-14)
    assert not torch.allclose(y, ascender_attention(q, k, v, z, h, **kw))


@pytest.mark.parametrize("causal", [False, True])
def test_dense_bias_with_zero_omega_is_sdpa_with_a_float_mask(causal):
    (q, k, v, z, h), _, opts = make_problem(N=9, seed=12)
    bias = torch.randn(2, 2, 9, 9, dtype=torch.float64)
    zero = dict(omega_align=0.0, omega_sep=0.0, omega_coh=0.0, score_temp=0.8)
    y = ascender_attention(q, k, v, z, h, **zero, **opts, attn_bias=bias, is_causal=causal)
    T = 0.8 + 1e-6
    mask = bias / T
    if causal:
        mask = mask.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=8 ** -0.5 / T)
    torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(2, 2, 10, 10), (1, 2, 10, 10), (2, 1, 10, 10), (10, 10), (2, 2, 4, 10)])
def test_dense_bias_gradients_match_reference(variant, shape):
    (q, k, v, z, h), scalars, opts = make_problem(N=10, seed=13)
    Nq = shape[-2]
    q = q[:, :, -Nq:]
    bias = torch.randn(*shape, dtype=torch.float64)
    upstream = torch.randn(2, 2, Nq, 6, dtype=torch.float64)
    grads = []
    for fn in (ascender_attention, ascender_attention_reference):
        inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h, bias)]
        sc = [scalars[n].clone().requires_grad_() for n in SCALAR_NAMES]
        y = fn(*inputs[:5], **dict(zip(SCALAR_NAMES, sc)), **opts, variant=variant, is_causal=True,
               attn_bias=inputs[5], alibi_slopes=torch.tensor([0.3, 0.1], dtype=torch.float64))
        grads.append(torch.autograd.grad(y, inputs + sc, upstream))
    got, want = grads
    assert got[5].shape == shape
    for a, b in zip(got[:6], want[:6]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10 * b.abs().max().item())
    got_sc, want_sc = torch.stack(got[6:]), torch.stack(want[6:])
    torch.testing.assert_close(got_sc, want_sc, rtol=1e-9, atol=1e-10 * want_sc.abs().max().item())


def test_gradcheck_with_bias_and_alibi():
    (q, k, v, z, h), scalars, opts = make_problem(B=1, N=5, d=4, dv=3, dz=3, da=3, seed=14)
    inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h)]
    inputs.append(torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True))
    inputs += [scalars[n].clone().requires_grad_() for n in SCALAR_NAMES]

    def f(*args):
        return ascender_attention(*args[:5], attn_bias=args[5], **dict(zip(SCALAR_NAMES, args[6:])), **opts,
                                  variant="paper", alibi_slopes=[0.25, 0.5])

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=False)


def _rope(x, positions, base=10000.0):
    """Rotary position embedding on the last dim (pairs of features rotated by position)."""
    half = x.shape[-1] // 2
    freqs = base ** (-torch.arange(half, dtype=x.dtype) / half)
    angle = positions.to(x.dtype).unsqueeze(-1) * freqs
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rope_by_rotating_q_and_k_before_the_op(variant):
    (q, k, v, z, h), scalars, opts = make_problem(N=12, seed=15)
    q, k = q.clone().requires_grad_(), k.clone().requires_grad_()
    pos = torch.arange(12)
    g = torch.randn(2, 2, 12, 6, dtype=torch.float64)
    out = []
    for fn in (ascender_attention, ascender_attention_reference):
        y = fn(_rope(q, pos), _rope(k, pos), v, z, h, **scalars, **opts, variant=variant, is_causal=True)
        out.append((y, *torch.autograd.grad(y, [q, k], g)))
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    # the base scores are then relative: shifting every position leaves the omega = 0 output unchanged
    zero = dict(omega_align=0.0, omega_sep=0.0, omega_coh=0.0)
    with torch.no_grad():
        y0 = ascender_attention(_rope(q, pos), _rope(k, pos), v, z, h, **zero, **opts, is_causal=True)
        y7 = ascender_attention(_rope(q, pos + 7), _rope(k, pos + 7), v, z, h, **zero, **opts, is_causal=True)
    torch.testing.assert_close(y0, y7, rtol=1e-9, atol=1e-11)


def test_module_alibi_and_bias():
    torch.manual_seed(0)
    m = ASCenderAttention(16, 4, k=3, alibi=True).double()
    assert "alibi_slopes" not in m.state_dict()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    bias = torch.randn(1, 4, 7, 7, dtype=torch.float64, requires_grad=True)
    y, _ = m(x, is_causal=True, attn_bias=bias)
    y.sum().backward()
    assert bias.grad.shape == bias.shape and torch.isfinite(bias.grad).all()
    plain = ASCenderAttention(16, 4, k=3).double()
    plain.load_state_dict(m.state_dict())  # the same weights without ALiBi
    with torch.no_grad():
        assert not torch.allclose(plain(x, is_causal=True, attn_bias=bias)[0], y)


@pytest.mark.parametrize("bias,pattern", [
    (torch.zeros(2, 2, 7, 6, dtype=torch.float64), r"attn_bias must be broadcastable to \[B, H, Nq, N\] = \[2, 2, 7, 7\]"),
    (torch.zeros(7, 7, dtype=torch.bool), r"attn_bias must have the dtype of q \(Double\), got Bool"),
])
def test_bad_attn_bias(bias, pattern):
    (q, k, v, z, h), _, opts = make_problem(N=7)
    with pytest.raises(RuntimeError, match=pattern):  # the op itself: the functional would cast the bias
        torch.ops.ascender.ascender_fwd(**op_arguments((q, k, v, z, h), {}, opts, dict(attn_bias=bias), "paper"))
    with pytest.raises(RuntimeError, match=r"alibi_slopes must be a 0-dim tensor or have shape \[H\] = \[2\]"):
        ascender_attention(q, k, v, z, h, **opts, alibi_slopes=[0.1, 0.2, 0.3])


@pytest.mark.parametrize("grad", [True, False], ids=["autograd", "inference"])
def test_minus_inf_bias_entries_block_like_the_mask(grad):
    """Both calls of a pair on the same kernel: the tiled forward under autograd, the decode kernel
    (N = 8 query rows) without, whose values agree with the tiled forward's only to rounding."""
    (q, k, v, z, h), scalars, opts = make_problem(N=8, seed=16)
    allowed = torch.rand(2, 2, 8, 8, generator=torch.Generator().manual_seed(1)) > 0.3
    allowed[0, 0, 3] = False  # a row that sees nothing
    bias = torch.randn(2, 2, 8, 8, dtype=torch.float64).requires_grad_(grad)
    inf_bias = bias.detach().masked_fill(~allowed, float("-inf")).requires_grad_(grad)
    want = ascender_attention(q, k, v, z, h, **scalars, **opts, attn_mask=allowed, attn_bias=bias)
    got = ascender_attention(q, k, v, z, h, **scalars, **opts, attn_bias=inf_bias)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    if grad:
        got.sum().backward()
        assert torch.isfinite(inf_bias.grad).all()
        assert torch.equal(inf_bias.grad[~allowed], torch.zeros_like(inf_bias.grad[~allowed]))


def test_bias_gradient_only_when_asked_for():
    (q, k, v, z, h), scalars, opts = make_problem(N=6)
    args = op_arguments((q, k, v, z, h), {}, opts, dict(attn_bias=torch.zeros(6, 6, dtype=torch.float64)), "paper")
    g = torch.ones(2, 2, 6, 6, dtype=torch.float64)
    dbias = _spec.ASCENDER_BWD.returns.index("dattn_bias")
    assert torch.ops.ascender.ascender_bwd(g, **args)[dbias].numel() == 0  # no O(N^2) buffer by default
    assert torch.ops.ascender.ascender_bwd(g, **args, attn_bias_grad=True)[dbias].shape == (2, 2, 6, 6)


def test_alibi_slopes_needs_a_head():
    with pytest.raises(ValueError, match="n_heads must be >= 1, got 0"):
        alibi_slopes(0)


# ---------------------------------------------------------------- FlashAttention's conventions

def _flash_reference(q, k, v, softcap, slopes, bias, causal):
    """FlashAttention's attention with softcap and per-(batch, head) ALiBi, as its tests' reference
    computes it: scores = q.k / sqrt(d), capped (softcap tanh(scores / softcap)), then the bias and
    -slope_bh |t - j| added, masked, softmax, times v (queries are the last Nq tokens)."""
    B, H, Nq, d = q.shape
    N = k.shape[2]
    scores = softcap * torch.tanh((q @ k.transpose(-2, -1)) * d ** -0.5 / softcap)
    scores = scores + bias - slopes.reshape(B, H, 1, 1) * _distance(Nq, N)
    if causal:
        scores = scores.masked_fill(~torch.ones(Nq, N, dtype=torch.bool).tril(N - Nq), float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq", [9, 4])
def test_softcap_outside_is_flash_attentions_order(target, causal, Nq):
    """With omega = 0 and score_temp + 1e-6 = 1, softcap_bias="outside" is FlashAttention's softcap
    then ALiBi (and bias); "inside" caps the sum instead."""
    (q, k, v, z, h), _, opts = make_problem(N=9, seed=21)
    q = q[:, :, -Nq:] * 3  # scores of a few units: the cap bends them
    slopes = torch.tensor([[0.5, 0.125], [0.3, 0.05]], dtype=torch.float64)
    bias = torch.randn(2, 2, Nq, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    zero = dict(omega_align=0.0, omega_sep=0.0, omega_coh=0.0, score_temp=1.0 - 1e-6)
    kw = dict(**zero, **opts, is_causal=causal, softcap=1.5)
    got = ascender_attention(*on(target.device, (q, k, v, z, h)), **kw, softcap_bias="outside",
                             alibi_slopes=slopes.to(target.device), attn_bias=bias.to(target.device))
    want = _flash_reference(q, k, v, 1.5, slopes, bias, causal)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-10, atol=1e-12)
    inside = ascender_attention(*on(target.device, (q, k, v, z, h)), **kw, alibi_slopes=slopes.to(target.device),
                                attn_bias=bias.to(target.device))
    assert (inside.cpu() - want).abs().max() > 1e-3
    # without beta_other the two orders are one
    torch.testing.assert_close(ascender_attention(*on(target.device, (q, k, v, z, h)), **kw, softcap_bias="outside"),
                               ascender_attention(*on(target.device, (q, k, v, z, h)), **kw), rtol=0, atol=0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("softcap_bias", ["inside", "outside"])
def test_softcap_bias_gradients_match_reference(target, variant, softcap_bias):
    """Every input's, scalar's and attn_bias's gradient against the twin's autograd, with per-batch ALiBi."""
    (q, k, v, z, h), scalars, opts = on(target.device, make_problem(N=10, seed=22))
    bias = torch.randn(2, 1, 10, 10, dtype=torch.float64, device=target.device)
    slopes = torch.tensor([[0.4, 0.1], [0.2, 0.0]], dtype=torch.float64, device=target.device)
    upstream = torch.randn(2, 2, 10, 6, dtype=torch.float64, device=target.device)
    grads = []
    for fn in (ascender_attention, ascender_attention_reference):
        inputs = [t.clone().requires_grad_() for t in (q, k, v, z, h, bias)]
        sc = [scalars[n].clone().requires_grad_() for n in SCALAR_NAMES]
        y = fn(*inputs[:5], **dict(zip(SCALAR_NAMES, sc)), **opts, variant=variant, is_causal=True, softcap=2.0,
               softcap_bias=softcap_bias, attn_bias=inputs[5], alibi_slopes=slopes)
        grads.append((y, *torch.autograd.grad(y, inputs + sc, upstream)))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10 * max(b.abs().max().item(), 1.0))


def test_gradcheck_softcap_outside():
    (q, k, v, z, h), scalars, opts = make_problem(B=1, N=5, d=4, dv=3, dz=3, da=3, seed=23)
    inputs = [t.clone().requires_grad_() for t in (q * 2, k, v, z, h)]
    inputs.append(torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True))
    inputs += [scalars[n].clone().requires_grad_() for n in SCALAR_NAMES]

    def f(*args):
        return ascender_attention(*args[:5], attn_bias=args[5], **dict(zip(SCALAR_NAMES, args[6:])), **opts,
                                  variant="paper", softcap=1.2, softcap_bias="outside", alibi_slopes=[[0.25, 0.5]])

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)


@pytest.mark.parametrize("Nq", [10, 3])
def test_alibi_per_batch_and_head(target, Nq):
    """[B, H] slopes: the twin's, the dense bias -m_bh |t - j|'s, and [H] slopes' where every batch has them."""
    (q, k, v, z, h), scalars, opts = on(target.device, make_problem(N=10, seed=24))
    q = q[:, :, -Nq:]
    m = torch.tensor([[0.5, 0.125], [0.0, 0.75]], dtype=torch.float64, device=target.device)
    kw = dict(**scalars, **opts, variant="paper", is_causal=True)
    y = ascender_attention(q, k, v, z, h, **kw, alibi_slopes=m)
    torch.testing.assert_close(y, ascender_attention_reference(q, k, v, z, h, **kw, alibi_slopes=m),
                               rtol=1e-10, atol=1e-12)
    dense = -m.reshape(2, 2, 1, 1) * _distance(Nq, 10).to(target.device)
    torch.testing.assert_close(y, ascender_attention(q, k, v, z, h, **kw, attn_bias=dense), rtol=1e-12, atol=1e-14)
    per_head = ascender_attention(q, k, v, z, h, **kw, alibi_slopes=m[0])
    torch.testing.assert_close(per_head, ascender_attention(q, k, v, z, h, **kw, alibi_slopes=m[0].expand(2, 2)),
                               rtol=0, atol=0)
    assert not torch.allclose(y[1], per_head[1])


def test_bad_alibi_and_softcap_bias():
    (q, k, v, z, h), _, opts = make_problem(N=7)
    with pytest.raises(RuntimeError, match=r"alibi_slopes must be a 0-dim tensor or have shape \[H\] = \[2\] or "
                                           r"\[B, H\] = \[2, 2\], got shape \[3, 2\]"):
        ascender_attention(q, k, v, z, h, **opts, alibi_slopes=torch.ones(3, 2))
    with pytest.raises(RuntimeError, match="softcap_bias must be 'inside' or 'outside', got 'after'"):
        ascender_attention(q, k, v, z, h, **opts, softcap=2.0, softcap_bias="after")
