"""Attention sinks (shared/SPEC.md section 12): a learnable logit per head that joins the softmax's
denominator only. The twin against hand-computed cases; every backend (the grid's targets, the
decode kernel in test_decode.py) against the twin's autograd, gradcheck in float64; the statistics
never see the sink; a row without a visible key gives 0 and passes the sink no gradient."""

from __future__ import annotations

import pytest
import torch

from ascender_torch import ascender_attention
from ascender_torch._spec import SCALAR_NAMES, Stat
from ascender_torch.reference import ascender_attention_reference

from cases import (MASK_MODES, VARIANTS, fused_forward, full_scalars, make_masks, make_problem, on,
                   rel_err, resolvable_rows)

SINKS = torch.tensor([0.4, -1.1], dtype=torch.float64)  # one logit per head of make_problem's H = 2
OMEGA_ZERO = dict(omega_align=0.0, omega_sep=0.0, omega_coh=0.0, score_temp=1.0 - 1e-6)


def _by_hand(q, k, v, sinks, mask):
    """y_i = sum_j exp(x_ij) v_j / (exp(sink) + sum_{l visible} exp(x_il)), x = q.k / sqrt(d), written
    out with explicit exponentials (float64, small values: no max shift needed); 0 without a visible key."""
    x = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    e = torch.where(mask, x.exp(), torch.zeros_like(x))
    den = sinks.reshape(1, -1, 1, 1).exp() + e.sum(-1, keepdim=True)
    y = (e / den) @ v
    return torch.where(mask.any(-1, keepdim=True), y, torch.zeros_like(y))


@pytest.mark.parametrize("variant", VARIANTS)
def test_twin_with_omega_zero_is_the_hand_computed_sink_softmax(variant):
    """The twin with omega = 0 and score_temp + 1e-6 = 1 is GPT-OSS's attention: written out by hand,
    causal with token 0 padded (row 0 sees nothing: 0), per-head and 0-dim sinks; a sink of -1e4 is
    no sink at all."""
    (q, k, v, z, h), _, opts = make_problem(N=6, seed=1)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[:, 0] = True
    mask = (~kpm).reshape(2, 1, 1, 6) & torch.ones(6, 6, dtype=torch.bool).tril()
    for sinks in (SINKS, torch.tensor(0.7, dtype=torch.float64)):
        got = ascender_attention_reference(q, k, v, z, h, **OMEGA_ZERO, **opts, variant=variant, is_causal=True,
                                           key_padding_mask=kpm, sinks=sinks)
        want = _by_hand(q, k, v, sinks.expand(2), mask)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)  # (score_temp + 1e-6 = 1 to rounding)
        assert got[:, :, 0].abs().max() == 0
    plain = ascender_attention_reference(q, k, v, z, h, **opts, variant=variant)
    torch.testing.assert_close(ascender_attention_reference(q, k, v, z, h, **opts, variant=variant, sinks=-1e4), plain,
                               rtol=1e-13, atol=1e-15)  # (exp(x - lse) against softmax's rounding)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MASK_MODES)
def test_outputs_and_gradients_equal_the_twins(target, variant, mode):
    """float64, biases on: y, the aux terms and the gradients of q, k, v, z, h, every scalar and the
    sinks against the twin's autograd (1e-9 norm-wise; the scalars as one vector); float32 outputs."""
    tensors, scalars, opts = make_problem(N=13, seed=5)
    scalars = full_scalars(scalars, 2, torch.float64)
    masks = make_masks(mode, 2, 2, 13, seed=5)
    keep = resolvable_rows(tensors, scalars, opts, masks, variant).unsqueeze(-1)
    tensors, scalars, masks, keep = (on(target.device, x) for x in (tensors, scalars, masks, keep))
    up = torch.randn(2, 2, 13, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * keep.cpu()
    up = up.to(target.device)

    def run(fn, dtype=torch.float64):
        inputs = [t.to(dtype).clone().requires_grad_() for t in tensors]
        sc = {n: s.to(dtype).clone().requires_grad_() for n, s in scalars.items()}
        sinks = SINKS.to(target.device, dtype).clone().requires_grad_()
        y, aux = fn(*inputs, **sc, **opts, **masks, variant=variant, sinks=sinks, return_aux=True)
        loss = (y * up.to(dtype)).sum() + 0.3 * (aux["coh"] * keep[..., 0]).sum() + 0.5 * (aux["sep"] * keep[..., 0]).sum()
        grads = torch.autograd.grad(loss, inputs + [sc[n] for n in SCALAR_NAMES] + [sinks])
        return [y, aux["coh"], aux["sep"], *grads[:5]], torch.stack(grads[5:-1]), grads[-1]

    got, got_sc, got_sink = run(ascender_attention)
    want, want_sc, want_sink = run(ascender_attention_reference)
    for name, a, b in zip(("y", "coh", "sep", "dq", "dk", "dv", "dz", "dh"), got, want):
        assert rel_err(a, b) <= 1e-9, name
    assert rel_err(got_sc, want_sc) <= 1e-9
    assert rel_err(got_sink, want_sink) <= 1e-9 and want_sink.abs().min() > 0
    y32 = ascender_attention(*(t.float() for t in tensors), **{n: s.float() for n, s in scalars.items()}, **opts,
                             **masks, variant=variant, sinks=SINKS.float().to(target.device))
    rows = resolvable_rows(tensors, scalars, opts, masks, variant, rel=1e-3).unsqueeze(-1)
    assert rel_err(y32 * rows, want[0] * rows) <= target.tolerance(torch.float32)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["causal", "all"])
def test_gradcheck(target, variant, mode):
    """gradcheck in float64 with respect to q, k, v, z, h, two scalars and the sinks, on rows with and
    without a visible key (mode "all" has an empty row 0)."""
    tensors, scalars, opts = make_problem(B=1, N=5, d=4, dv=3, dz=3, da=3, seed=2)
    scalars = full_scalars(scalars, 2, torch.float64)
    masks = make_masks(mode, 1, 2, 5, seed=2)
    tensors, scalars, masks = (on(target.device, x) for x in (tensors, scalars, masks))
    keep = resolvable_rows(tensors, scalars, opts, masks, variant).unsqueeze(-1).double()
    fixed = {n: s for n, s in scalars.items() if n not in ("score_temp", "omega_coh")}
    inputs = [t.clone().requires_grad_() for t in tensors] + [
        scalars["score_temp"].clone().requires_grad_(), scalars["omega_coh"].clone().requires_grad_(),
        SINKS.to(target.device).clone().requires_grad_()]

    def f(q, k, v, z, h, temp, omega_coh, sinks):
        y = ascender_attention(q, k, v, z, h, **fixed, score_temp=temp, omega_coh=omega_coh, sinks=sinks, **opts,
                               **masks, variant=variant)
        return y * keep

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=target.backend != "fused",
                                    nondet_tol=target.nondet_tol)


def test_rows_without_a_visible_key_give_zero_and_no_sink_gradient(target):
    """Causal with token 0 padded: row 0 outputs 0 and, with an upstream gradient on it alone, the
    sink (and every input) gets exactly zero gradient; batch 1 fully padded likewise."""
    (q, k, v, z, h), scalars, opts = make_problem(N=5, seed=7)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[0, 0] = True
    kpm[1] = True
    tensors = on(target.device, (q, k, v, z, h))
    kpm = kpm.to(target.device)
    sinks = SINKS.to(target.device).clone().requires_grad_()
    inputs = [t.clone().requires_grad_() for t in tensors]
    y = ascender_attention(*inputs, **on(target.device, scalars), **opts, is_causal=True, key_padding_mask=kpm,
                           sinks=sinks)
    assert y[0, :, 0].abs().max() == 0 and y[1].abs().max() == 0
    up = torch.zeros_like(y)
    up[0, :, 0] = 1.0
    up[1] = 1.0
    grads = torch.autograd.grad(y, inputs + [sinks], up)
    assert all(g.abs().max() == 0 for g in grads)


def test_statistics_never_see_the_sink():
    """The fused forward's saved statistics with and without sinks: every column but the log-sum-exp
    is the same to the bit (moments, density, centroid's sum and spread, gates, count), as are u, c
    and the neighbours; LSE becomes log(exp(LSE) + exp(sink)); the maps' weights sum to
    1 - exp(sink - LSE) on each row that sees a key."""
    tensors, scalars, opts = make_problem(N=9, seed=3)
    masks = dict(is_causal=True, key_padding_mask=torch.tensor([[True] + [False] * 8, [False] * 9]))
    plain = fused_forward(tensors, scalars, opts, masks, "paper")
    sunk = fused_forward(tensors, scalars, opts, masks, "paper", sinks=SINKS)
    for name in ("u", "c", "nbr"):
        assert torch.equal(plain[name], sunk[name]), name
    other = [s for s in Stat if s != Stat.LSE]
    assert torch.equal(plain["stats"][..., other], sunk["stats"][..., other])
    seen = torch.isfinite(plain["stats"][..., Stat.LSE])
    lse = torch.logaddexp(plain["stats"][..., Stat.LSE], SINKS.reshape(1, 2, 1))
    torch.testing.assert_close(sunk["stats"][..., Stat.LSE][seen], lse[seen], rtol=1e-14, atol=0)
    assert torch.isinf(sunk["stats"][..., Stat.LSE][~seen]).all()
    _, maps = ascender_attention(*tensors, **scalars, **opts, **masks, variant="paper", sinks=SINKS,
                                 return_maps=True)
    mass = 1 - (SINKS.reshape(1, 2, 1) - sunk["stats"][..., Stat.LSE]).exp()
    torch.testing.assert_close(maps["A"].sum(-1)[seen], mass[seen], rtol=1e-12, atol=0)
    assert maps["A"].sum(-1)[~seen].abs().max() == 0


def test_sinks_are_checked_naming_the_argument():
    tensors, scalars, opts = make_problem(N=4)
    with pytest.raises(RuntimeError, match=r"sinks must be a 0-dim tensor or have shape \[H\] = \[2\], got shape \[3\]"):
        ascender_attention(*tensors, **scalars, **opts, sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="sinks must be a finite number"):
        ascender_attention(*tensors, **scalars, **opts, sinks=float("inf"))
    y0 = ascender_attention(*tensors, **scalars, **opts, sinks=0.25)  # a number is every head's sink
    torch.testing.assert_close(y0, ascender_attention(*tensors, **scalars, **opts, sinks=torch.full((2,), 0.25)))
